// Data-parallel gradient synchronisation: everything that turns this rank's accumulated gradients
// into the summed gradients of the whole run, and their global norm, before the optimizer step.
//
//   stages 0-1 (a core::FullParameterStore): buckets of about `bucket_mb` are contiguous ranges of
//            the flat buffer issued from its end (the last layers' gradients, final first in
//            backward). With overlap on (the step's last micro-batch) each bucket's non-blocking
//            all-reduce starts as soon as backward has finished the units it covers (the store's
//            hook); reduce() starts the rest and waits for all of them.
//   stages 2-3 (a zero::ShardedParameterStore): the store reduce-scattered every unit during
//            backward; reduce() only finishes the shard (tied embedding, partial sums, norm).
// Then, on either: the tied token embedding's gradients are summed over the first and last
// pipeline stage; under sequence_split the layernorm gradients (partial sums over the tensor
// group, each rank saw its rows) are summed in one packed all-reduce; and the global norm counts
// split tensors over the tensor group, replicated ones once, and sums over pipeline stages.
// Gradients are summed, not averaged: the trainer scales the loss by 1/(global tokens).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/parameter_store.hpp"
#include "parallel/communicator.hpp"
#include "zero/sharded_store.hpp"

namespace colossal::zero {

// [begin, end) ranges covering [0, length) in issue order (from the end), each a multiple of 16
// floats and of about `bucket_floats` floats.
std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges(std::size_t length,
                                                               std::size_t bucket_floats);

// A pipeline stage's gradients also sum their norm over the stages, and the first and last stage,
// which both hold the tied token embedding, sum its gradients.
struct PipelineLinks {
  parallel::Communicator* stages = nullptr;  // one rank per stage (null: no pipeline)
  parallel::Communicator* tied = nullptr;    // the first and last stage (null elsewhere)
  bool count_embedding = true;               // false on the last stage: the first counts it
  bool sum_over_stages = true;  // false: the caller sums the squared norm over stages (chunks)
  // The floats at the start of unit 0 that hold the tied embedding (0: the whole unit, as
  // core::Model lays it out; core::GridModel::tied_floats for the 2d models, whose unit 0 also
  // holds the stage's replicated vectors; under ZeRO 2 unit 0 has one size on both stages, so
  // each data rank sums its pieces of these floats).
  std::size_t tied_floats = 0;
};

struct GradientSyncOptions {
  double bucket_mb = 25.0;                    // stages 0-1: all-reduce bucket size
  // Stages 0-1: each bucket travels as bf16 (parallel.grad_reduce: bf16): rounded into a bf16
  // copy of the flat buffer (2 bytes per parameter, counted under gradients), summed in bf16,
  // widened back. Stages 2-3: the store's option (zero::OptimizerOptions::bf16_reduce).
  bool bf16_reduce = false;
  parallel::Communicator* tensor = nullptr;   // the tensor group (null or size 1: none)
  bool sequence_split = false;                // layernorm gradients are partial sums over it
  PipelineLinks pipeline{};
  // A model that says which gradients this rank counts in the global norm
  // (core::GridModel::norm_ranges: every element once over the tensor group): their squares are
  // summed over it (and, in a stage 2 shard, over the data ranks, each counting its slices).
  // Unset: derived from `table` (1D: split tensors summed over the tensor group, replicated
  // ones counted once).
  std::optional<std::vector<std::pair<std::size_t, std::size_t>>> counted_ranges{};
};

class GradientSync {
 public:
  // Synchronises the gradients of `store` (the optimizer's: a FullParameterStore for ZeRO stages
  // 0-1, a ShardedParameterStore for 2-3) over `dp`; `table` is the parameters' layout in it.
  GradientSync(const std::vector<core::ParamSpec>& table, core::ParameterStore& store,
               parallel::Communicator& dp, core::MemoryTracker& tracker,
               GradientSyncOptions options);
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Stages 0-1: whether buckets start reducing as soon as backward finishes them (set for the
  // step's last micro-batch; earlier micro-batches only accumulate). Stages 2-3: the store's final
  // pass (ShardedParameterStore::set_final_pass): units whose gradients reduce() leaves as they
  // are (all but the tied embedding's unit 0 on a pipeline, none under sequence_split) are final
  // as their reductions complete, so the optimizer's offload copies can start during backward.
  void set_overlap(bool on) {
    overlap_ = on;
    if (sharded_ != nullptr) sharded_->set_final_pass(on);
  }
  // Sums the gradients over the data-parallel group (stages 0-1: buckets not started yet start
  // now, then all are waited for; stages 2-3: already reduced during backward), sums the tied
  // embedding and the sequence partial sums, and returns the global gradient norm, identical on
  // every rank.
  double reduce();
  // Buckets whose all-reduce started during backward, over the object's life (for tests).
  std::size_t buckets_started_early() const { return started_early_; }
  // Stages 0-1: flat ranges, in issue order (stages 2-3 reduce per unit: empty).
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets() const { return buckets_; }

 private:
  // Stages 0-1: starts the non-blocking all-reduce of every bucket lying in [offset, end) that
  // has not started yet, and lets the ones in flight progress.
  void gradients_ready(std::size_t offset);
  // Runs of the buffer the norm reads (flat or shard), split or replicated over the tensor group.
  struct NormRun {
    std::size_t begin, count;
    bool replicated;
    bool skip;  // counted on another stage (the tied embedding on the last)
  };
  double distributed_norm(const float* grads, bool reduce_over_data);
  void tie_embedding();
  void sum_sequence_partial_gradients(float* grads);

  core::ParameterStore& store_;
  core::FullParameterStore* full_ = nullptr;  // stages 0-1
  ShardedParameterStore* sharded_ = nullptr;  // stages 2-3
  parallel::Communicator& dp_;
  parallel::Communicator* tp_;
  PipelineLinks pipeline_;
  std::vector<NormRun> norm_runs_, partial_runs_;
  core::DeviceArray<float> partial_pack_;
  bool distributed_ = false;  // the norm sums over the tensor group or the stages
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;
  bool overlap_ = false;
  // Stages 0-1: a bucket started and not yet waited for (its range, for the way back from bf16).
  struct InFlight {
    std::size_t begin, end;
    std::unique_ptr<parallel::PendingCollective> op;
  };
  // Starts bucket [begin, end)'s all-reduce (fp32, or its bf16 copy in wire_).
  void start_bucket(std::size_t begin, std::size_t end);
  // Declared before in_flight_, so destroyed after it: an unfinished bucket waits for its sum
  // (into wire_) in its destructor.
  core::DeviceArray<std::uint16_t> wire_;  // bf16_reduce, stages 0-1, several data ranks
  std::vector<InFlight> in_flight_;
  std::size_t next_bucket_ = 0;  // first bucket (in issue order) not started this step
  std::size_t started_early_ = 0;
};

}  // namespace colossal::zero
