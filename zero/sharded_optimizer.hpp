// The (optionally ZeRO-sharded) AdamW step over this rank's part of the parameters, and the
// parameter store the model runs on (core/parameter_store.hpp), chosen by stage. Summing the
// gradients and their norm before the step is zero::GradientSync's (zero/gradient_sync.hpp).
//
// Parameters form units (embeddings, each block, final layernorm), each padded to a multiple of
// dp*16 floats. Per optimizer step:
//   stage 0: a FullParameterStore; AdamW on every element (moments replicated).
//   stage 1: the same store; the flat buffer is split into dp equal contiguous shards and AdamW
//            runs on this rank's shard only (moments are shard-sized); then the parameters are
//            all-gathered.
//   stage 2: a ShardedParameterStore (zero/sharded_store.hpp): parameters whole, gradients
//            reduce-scattered unit by unit during every micro-batch's backward into this rank's
//            slice of every unit (the full gradient buffer never exists); AdamW on the slices;
//            units all-gathered.
//   stage 3: the same with the parameters sharded too: each unit is all-gathered just before its
//            forward and again before its backward, and released right after.
// Offload (stages 1-3): the moments live in host memory and the update runs on host threads; each
// step copies the gradient shard and the parameter shard to the host and the updated parameter
// shard back (offload_stats counts those bytes). With offload_fraction < 1 only the last
// core::offloaded_states(shard, fraction) states do (Colossal-AI's offload_optim_frac): the first
// ones keep their moments on the device, whose update is started first; the offloaded states'
// copies run on a queue of their own (core::CopyQueue: a CUDA stream beside Kokkos') and the
// host's update between them, so all of that runs beside the device's update. At stages 2-3 the
// gradients do not wait for the step: each unit's offloaded gradients start down as soon as its
// last micro-batch's reduce-scatter has completed (ShardedParameterStore's final listener), beside
// the rest of backward, as ZeRO-Offload overlaps them; only the units the gradient sync still
// changes after backward (zero::GradientSync::set_overlap) wait for the step. With parameter
// offload (stage 3, all of the optimizer state on the host) the parameter shard's last
// offload_params_fraction of states live in host memory: the update writes them in place (and
// the device part goes down and back up as above), and every gather uploads this rank's slice's
// host part. On a host-only build both sides are host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/optimizer.hpp"
#include "core/parameter_store.hpp"
#include "parallel/communicator.hpp"
#include "zero/sharded_store.hpp"

namespace colossal::zero {

struct OptimizerOptions {
  int stage = 0;                   // ZeRO stage: 0, 1, 2 or 3
  bool offload_optimizer = false;  // moments and update on the host (stages 1-3)
  bool offload_params = false;     // the parameter shard on the host (stage 3, with the above)
  double offload_fraction = 1.0;   // with offload_optimizer: the share of the shard's states
                                   // (its last ones) on the host; 1 with offload_params
  double offload_params_fraction = 1.0;  // with offload_params: the share of the parameter shard
                                         // (its last states) in host memory
  bool bf16_reduce = false;        // stages 2-3: gradients reduce-scattered as bf16
                                   // (parallel.grad_reduce: bf16)
  // Inference (colossal_eval, colossal_generate): the parameters alone, in a store without
  // gradients (stage 3: sharded, the rest of the stages whole, as stage 0; with offload_params
  // the stage-3 shard's host part as in training, no optimizer offload needed); no moments, no
  // offload buffers; step() throws std::logic_error.
  bool inference = false;
};

class ShardedAdamW {
 public:
  // `units` from core::parameter_units(table, dp*16); `flat_size` is their end.
  // `dp` is the group the shards split over (the gradient group).
  ShardedAdamW(const std::vector<core::ParamSpec>& table, std::vector<core::ParamUnit> units,
               std::size_t flat_size, parallel::Communicator& dp, core::MemoryTracker& tracker,
               OptimizerOptions options);
  // Over a store the model owns (core::GridModel: 2D, 2.5D, 3D), its units padded to a multiple
  // of dp*16 floats: stages 0-1 a core::FullParameterStore, stage 2 a ShardedParameterStore of
  // stage 2 over `dp`. Throws std::invalid_argument naming parallel.zero.stage for stage 3 (the
  // grid models never gather parameters) or a store of the wrong kind.
  ShardedAdamW(const std::vector<core::ParamSpec>& table, core::ParameterStore& store,
               parallel::Communicator& dp, core::MemoryTracker& tracker, OptimizerOptions options);
  ShardedAdamW(const ShardedAdamW&) = delete;
  ShardedAdamW& operator=(const ShardedAdamW&) = delete;

  // Where the model's parameters and gradients live (pass it to core::Model).
  core::ParameterStore& store() { return *store_; }
  const core::ParameterStore& store() const { return *store_; }

  struct OffloadStats {
    uint64_t to_host_bytes = 0, to_device_bytes = 0;
    // Of to_host_bytes: gradients whose copies started during the last micro-batch's backward
    // (stages 2-3), as their units became final; the rest start in step().
    uint64_t early_to_host_bytes = 0;
  };
  OffloadStats offload_stats() const;

  // Clipped AdamW on this rank's part, then (stages 1, 2) all-gather of the parameters.
  void step(const core::AdamWParams& hp, int64_t step, float grad_scale);
  // Instead of step() when the step's update is skipped (non-finite gradients): with offload,
  // waits for the gradient copies that backward started.
  void skip_step();

  // The ZeRO stage the store runs (under inference 3, or 0 for the stages that keep the
  // parameters whole).
  int stage() const { return stage_; }
  bool inference() const { return inference_; }
  std::size_t shard_size() const { return shard_size_; }
  // Of the shard's states, how many live on the host (offload; the last ones in state order).
  std::size_t offloaded_states() const { return host_states_; }
  // Checkpoints without a gather: the ranges of the flat buffer that this rank's moments hold, in
  // the order the moment arrays hold them (stage 0: the whole buffer; 1: its shard; 2-3: its
  // slice of every unit). `at` is the range's first element in the moment arrays.
  struct StateRange {
    std::size_t begin, length, at;
  };
  std::vector<StateRange> state_ranges() const;
  // A host copy of this rank's first (which = 0) or second (1) moment array, and its inverse.
  std::vector<float> state(int which) const;
  void set_state(int which, const std::vector<float>& values);
  // The parameters at state_ranges(), in the same order, in host memory (stage 3: the parameter
  // shard itself; nothing is gathered).
  std::vector<float> owned_parameters();
  // Stage 3: its inverse, shard_size() values in state order into the parameter shard, each
  // where it lives (device, or host under parameter offload); nothing is communicated. Throws
  // std::logic_error at the other stages (their parameters are whole: write the store).
  void set_owned_parameters(const float* values);

 private:
  // Offload: the offloaded states' gradients (queued before the device's update starts, not
  // waited for) and then their parameters (after; this waits for all of the copies) to the host
  // on the copy queue; then (offloaded_update) AdamW on them on the host and the parameters
  // back (stages 1-3).
  void fetch_offloaded_gradients();
  void fetch_offloaded_parameters();
  // Stages 2-3: starts copying unit `unit`'s offloaded gradients (its slice `slice` in the
  // gradient shard) to the host on the copy queue, without waiting; `early`: during backward
  // (the store's final listener in its final pass).
  void fetch_unit_gradients(int unit, const float* slice, bool early);
  void offloaded_update(const core::AdamWParams& hp, int64_t step, float grad_scale);
  // The offloaded states' parameters that live on the device, in state order from the first
  // offloaded state: one range (stages 1, 3; stage 3 with parameter offload: the device part of
  // the shard, maybe empty) or one slice of several units (stage 2).
  std::vector<std::pair<float*, std::size_t>> offloaded_pieces();
  // The host's copy of the offloaded states' parameters, in state order: host_params_, or with
  // parameter offload the store's host shard (where the host part lives).
  float* host_params();

  int stage_;
  bool inference_ = false;
  std::size_t padded_, shard_begin_ = 0, shard_size_;
  parallel::Communicator& dp_;
  // The checks and the shard, AdamW and offload buffers both constructors share (`sharded`:
  // the buffer must split into equal dp shards of 16-float multiples).
  void check_options(const OptimizerOptions& options, std::size_t flat_size, bool sharded) const;
  void make_adamw(const std::vector<core::ParamSpec>& table, core::MemoryTracker& tracker,
                  const OptimizerOptions& options);

  std::unique_ptr<core::FullParameterStore> own_full_;   // stages 0-1 (unless the model's)
  core::FullParameterStore* full_ = nullptr;
  std::unique_ptr<ShardedParameterStore> own_sharded_;   // stages 2-3 (unless the model's)
  ShardedParameterStore* sharded_ = nullptr;
  core::ParameterStore* store_;
  std::unique_ptr<core::AdamW> adamw_;       // the states on the device (all without offload)
  std::unique_ptr<core::AdamW> host_adamw_;  // the offloaded states (null without offload)
  bool offload_;
  std::size_t host_states_ = 0;              // the offloaded states: the shard's last ones
  // Stage 2: this rank's unit slices split at the first offloaded state.
  std::vector<std::pair<std::size_t, std::size_t>> device_ranges_, host_ranges_;
  core::DeviceArray<float> host_grads_, host_params_;  // offload: the offloaded states' copies
  std::unique_ptr<core::CopyQueue> copies_;  // offload: their transfers, beside the kernels
  // Stages 2-3: the units whose offloaded gradients went down this step, and the store's gradient
  // generation they belong to (zero_gradients starts a new one: the marks no longer hold).
  std::vector<bool> fetched_;
  uint64_t fetched_generation_ = 0;
  OffloadStats offload_stats_;
};

}  // namespace colossal::zero
