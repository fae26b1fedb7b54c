// Data-parallel gradient synchronisation and the (optionally ZeRO-sharded) AdamW step. The
// optimizer owns the parameter store the model runs on (core/parameter_store.hpp), chosen by stage.
//
// Parameters form units (embeddings, each block, final layernorm), each padded to a multiple of
// dp*16 floats. Per optimizer step:
//   stage 0: a FullParameterStore; gradients all-reduced bucket by bucket, global norm from the
//            full gradient, AdamW on every element (moments replicated).
//   stage 1: the same all-reduce; the flat buffer is split into dp equal contiguous shards and
//            AdamW runs on this rank's shard only (moments are shard-sized); then the parameters
//            are all-gathered.
//   stage 2: a ShardedParameterStore (zero/sharded_store.hpp): parameters whole, gradients
//            reduce-scattered unit by unit during every micro-batch's backward into this rank's
//            slice of every unit (the full gradient buffer never exists); the norm is an
//            all-reduce of per-shard sums of squares; AdamW on the slices; units all-gathered.
//   stage 3: the same with the parameters sharded too: each unit is all-gathered just before its
//            forward and again before its backward, and released right after.
// Offload (stages 1-3): the moments live in host memory and the update runs on host threads; each
// step copies the gradient shard and the parameter shard to the host and the updated parameter
// shard back (offload_stats counts those bytes). With parameter offload (stage 3) the parameter
// shard itself lives in host memory: the update writes it in place and every gather uploads this
// rank's slice. On a host-only build both sides are host memory.
//
// Stages 0-1: buckets of about `bucket_mb` are contiguous ranges of the flat buffer issued from its
// end (the last layers' gradients, final first in backward). On the step's last micro-batch each
// bucket's non-blocking all-reduce starts as soon as backward has finished the units it covers,
// and reduce_gradients() waits for all of them. Gradients are summed, not averaged: the trainer
// scales the loss by 1/(global tokens).
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

// [begin, end) ranges covering [0, length) in issue order (from the end), each a multiple of 16
// floats and of about `bucket_floats` floats.
std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges(std::size_t length,
                                                               std::size_t bucket_floats);

// A pipeline stage's optimizer also sums its norm over the stages, and the first and last stage,
// which both hold the tied token embedding, sum its gradients.
struct PipelineLinks {
  parallel::Communicator* stages = nullptr;  // one rank per stage (null: no pipeline)
  parallel::Communicator* tied = nullptr;    // the first and last stage (null elsewhere)
  bool count_embedding = true;               // false on the last stage: the first counts it
  bool sum_over_stages = true;  // false: the caller sums the squared norm over stages (chunks)
};

class ShardedAdamW {
 public:
  // `units` from core::parameter_units(table, dp*16); `flat_size` is their end.
  ShardedAdamW(const std::vector<core::ParamSpec>& table, std::vector<core::ParamUnit> units,
               std::size_t flat_size, int stage, double bucket_mb, parallel::Communicator& dp,
               core::MemoryTracker& tracker, bool offload_optimizer = false,
               bool offload_params = false, parallel::Communicator* tensor = nullptr,
               bool sequence_split = false, PipelineLinks pipeline = {});

  // Where the model's parameters and gradients live (pass it to core::Model).
  core::ParameterStore& store() { return *store_; }
  const core::ParameterStore& store() const { return *store_; }

  struct OffloadStats {
    uint64_t to_host_bytes = 0, to_device_bytes = 0;
  };
  OffloadStats offload_stats() const;

  // Stages 0-1: whether buckets start reducing as soon as backward finishes them (set for the
  // step's last micro-batch; earlier micro-batches only accumulate).
  void set_overlap(bool on) { overlap_ = on; }
  // Sums the gradients over the data-parallel group (stages 0-1: buckets not started yet start
  // now, then all are waited for; stages 2-3: already reduced during backward) and returns the
  // global gradient norm, identical on every rank.
  double reduce_gradients();
  // Buckets whose all-reduce started during backward, over the optimizer's life (for tests).
  std::size_t buckets_started_early() const { return started_early_; }
  // Clipped AdamW on this rank's part, then (stages 1, 2) all-gather of the parameters.
  void step(const core::AdamWParams& hp, int64_t step, float grad_scale);

  int stage() const { return stage_; }
  std::size_t shard_size() const { return shard_size_; }
  // Stages 0-1: flat ranges, in issue order (stages 2-3 reduce per unit: empty).
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets() const { return buckets_; }
  const core::AdamW& adamw() const { return *adamw_; }
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

 private:
  // Stages 0-1: starts the non-blocking all-reduce of every bucket lying in [offset, end) that
  // has not started yet, and lets the ones in flight progress.
  void gradients_ready(std::size_t offset);
  // Offload: AdamW on host copies of the shard (stages 1-3).
  void offloaded_update(const core::AdamWParams& hp, int64_t step, float grad_scale);

  // Tensor parallelism: the global norm counts every rank's part of split tensors and replicated
  // tensors once. Runs of the buffer the norm reads (flat or shard), split or replicated.
  struct NormRun {
    std::size_t begin, count;
    bool replicated;
    bool skip;  // counted on another stage (the tied embedding on the last)
  };
  double distributed_norm(const float* grads, bool reduce_over_data);
  // Sums the tied embedding's gradients over the first and last stage.
  void tie_embedding(float* grads);
  PipelineLinks pipeline_;
  // sequence_split: layernorm gradients are partial sums over the tensor group (each rank saw its
  // rows); they are summed, packed into one all-reduce, before the norm.
  void sum_sequence_partial_gradients(float* grads);
  std::vector<NormRun> partial_runs_;
  core::DeviceArray<float> partial_pack_;

  int stage_;
  std::size_t padded_, shard_begin_ = 0, shard_size_;
  parallel::Communicator& dp_;
  parallel::Communicator* tp_;
  std::vector<NormRun> norm_runs_;
  std::unique_ptr<core::FullParameterStore> full_;       // stages 0-1
  std::unique_ptr<ShardedParameterStore> sharded_;       // stages 2-3
  core::ParameterStore* store_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;
  std::unique_ptr<core::AdamW> adamw_;
  bool offload_;
  core::DeviceArray<float> host_grads_, host_params_;  // offload: the shard on the host
  OffloadStats offload_stats_;
  bool overlap_ = false;
  std::vector<std::unique_ptr<parallel::PendingCollective>> in_flight_;  // stages 0-1
  std::size_t next_bucket_ = 0;   // first bucket (in issue order) not started this step
  std::size_t started_early_ = 0;
};

}  // namespace colossal::zero
