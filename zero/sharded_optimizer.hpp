// Data-parallel gradient synchronisation and the (optionally ZeRO-sharded) AdamW step.
//
// The flat parameter/gradient buffers (padded by the model to a multiple of dp*16 floats) are split
// into `dp` equal, contiguous shards; rank r owns [r*S, (r+1)*S). Per optimizer step:
//   stage 0: all-reduce the gradients (bucket by bucket), global norm from the full gradient,
//            AdamW on every element (moments replicated).
//   stage 1: the same all-reduce; AdamW only on the own shard (moments are shard-sized); then the
//            parameters are all-gathered.
//   stage 2: gradients are reduce-scattered (bucket by bucket) into a shard-sized buffer instead
//            of all-reduced (half the traffic); the norm is an all-reduce of per-shard sums of
//            squares; AdamW on the shard; parameters all-gathered. The model still accumulates
//            micro-batch gradients in a full-size buffer, so gradient memory is not yet divided
//            by dp (that needs per-bucket reduction during backward).
// Offload (stages 1-2): the moments live in host memory and the update runs on host threads; each
// step copies the gradient shard and the parameter shard to the host and the updated parameter
// shard back (offload_stats counts those bytes). On a host-only build both sides are host memory.
//
// Buckets of about `bucket_mb` are issued from the end of the buffer (the last layers' gradients,
// final first in backward). For the all-reduce they are contiguous ranges of the flat buffer; for
// the reduce-scatter a bucket is the same range [a, b) of every rank's shard, packed into one
// staging buffer so that rank r receives exactly its own shard's slice. Stages 0-1 start each
// bucket's all-reduce (non-blocking) as soon as backward has finished the blocks it covers, on the
// step's last micro-batch, and wait for all of them in reduce_gradients(); stage 2's
// reduce-scatters are issued there, blocking. Gradients are summed, not averaged: the trainer
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
#include "parallel/communicator.hpp"

namespace colossal::zero {

// [begin, end) ranges covering [0, length) in issue order (from the end), each a multiple of 16
// floats and of about `bucket_floats` floats.
std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges(std::size_t length,
                                                               std::size_t bucket_floats);

class ShardedAdamW {
 public:
  ShardedAdamW(const std::vector<core::ParamSpec>& table, std::size_t padded, int stage,
               double bucket_mb, parallel::Communicator& dp, core::MemoryTracker& tracker,
               bool offload_optimizer = false);

  struct OffloadStats {
    uint64_t to_host_bytes = 0, to_device_bytes = 0;
  };
  const OffloadStats& offload_stats() const { return offload_stats_; }

  // Stages 0-1: starts the non-blocking all-reduce of every bucket lying in [offset, end) that
  // has not started yet, and lets the ones in flight progress. Called from the model's backward
  // (Model::set_gradients_ready_hook) on the step's last micro-batch, so the reductions overlap the
  // rest of backward. Stage 2 reduces at reduce_gradients().
  void gradients_ready(float* grads, std::size_t offset);
  // Sums the gradients over the data-parallel group (as the stage says; buckets not started yet
  // start now, then all are waited for) and returns the global gradient norm, identical on every
  // rank.
  double reduce_gradients(float* grads);
  // Buckets whose all-reduce started during backward, over the optimizer's life (for tests).
  std::size_t buckets_started_early() const { return started_early_; }
  // Clipped AdamW on this rank's part, then (stages 1, 2) all-gather of the parameters.
  void step(float* params, float* grads, const core::AdamWParams& hp, int64_t step,
            float grad_scale);

  int stage() const { return stage_; }
  std::size_t shard_begin() const { return shard_begin_; }
  std::size_t shard_size() const { return shard_size_; }
  // Flat ranges (stages 0, 1) or shard-relative ranges (stage 2), in issue order.
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets() const { return buckets_; }
  const core::AdamW& adamw() const { return *adamw_; }

 private:
  int stage_;
  std::size_t padded_, shard_begin_, shard_size_;
  parallel::Communicator& dp_;
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;
  std::unique_ptr<core::AdamW> adamw_;
  core::DeviceArray<float> grad_shard_;  // stage 2: this rank's reduced gradients
  core::DeviceArray<float> staging_;     // stage 2: one bucket of every rank's shard, packed
  bool offload_;
  core::DeviceArray<float> host_grads_, host_params_;  // offload: the shard on the host
  OffloadStats offload_stats_;
  std::vector<std::unique_ptr<parallel::PendingCollective>> in_flight_;  // stages 0-1
  std::size_t next_bucket_ = 0;   // first bucket (in issue order) not started this step
  std::size_t started_early_ = 0;
};

}  // namespace colossal::zero
