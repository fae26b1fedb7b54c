#include "zero/sharded_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "core/kernels.hpp"

namespace colossal::zero {

std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges(std::size_t length,
                                                               std::size_t bucket_floats) {
  if (length % 16 != 0) throw std::invalid_argument("bucketed buffer not padded to 16 floats");
  const std::size_t per_bucket = std::max<std::size_t>(16, bucket_floats / 16 * 16);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t end = length; end > 0;) {
    const std::size_t begin = end > per_bucket ? end - per_bucket : 0;
    ranges.emplace_back(begin, end);
    end = begin;
  }
  return ranges;
}

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table, std::size_t padded,
                           int stage, double bucket_mb, parallel::Communicator& dp,
                           core::MemoryTracker& tracker, bool offload_optimizer)
    : stage_(stage), padded_(padded), dp_(dp), offload_(offload_optimizer) {
  if (stage < 0 || stage > 2) {
    throw std::invalid_argument("parallel.zero.stage " + std::to_string(stage) +
                                " is not implemented (0, 1 and 2 are)");
  }
  if (offload_ && stage == 0) {
    throw std::invalid_argument("optimizer offload needs ZeRO stage 1 or 2");
  }
  if (padded % (std::size_t(dp.size()) * 16) != 0) {
    throw std::invalid_argument("flat buffer of " + std::to_string(padded) +
                                " floats is not padded to a multiple of dp*16");
  }
  shard_size_ = padded / dp.size();
  shard_begin_ = shard_size_ * dp.rank();
  const auto bucket_floats = static_cast<std::size_t>(bucket_mb * 1024 * 1024 / sizeof(float));
  // A stage-2 bucket spans dp shards, so each shard contributes 1/dp of the bucket size.
  buckets_ = stage == 2 ? bucket_ranges(shard_size_, bucket_floats / dp.size())
                        : bucket_ranges(padded, bucket_floats);
  if (stage == 0) {
    adamw_ = std::make_unique<core::AdamW>(table, 0, padded, tracker);
  } else {
    adamw_ = std::make_unique<core::AdamW>(table, shard_begin_, shard_begin_ + shard_size_,
                                           tracker, offload_);
  }
  if (offload_) {
    host_grads_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
    host_params_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
  }
  if (stage == 2) {
    grad_shard_ = core::DeviceArray<float>(tracker, core::MemCategory::gradients, shard_size_);
    std::size_t widest = 0;
    for (const auto& [begin, end] : buckets_) widest = std::max(widest, end - begin);
    staging_ = core::DeviceArray<float>(tracker, core::MemCategory::temporaries,
                                        dp.size() > 1 ? widest * dp.size() : 0);
  }
}

void ShardedAdamW::gradients_ready(float* grads, std::size_t offset) {
  if (stage_ == 2 || dp_.size() == 1) return;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= offset) {
    const auto [begin, end] = buckets_[next_bucket_++];
    in_flight_.push_back(dp_.start_all_reduce_sum({grads + begin, end - begin}));
    ++started_early_;
  }
  for (auto& pending : in_flight_) pending->test();  // MPI progresses inside MPI calls
}

double ShardedAdamW::reduce_gradients(float* grads) {
  const int p = dp_.size();
  if (stage_ < 2) {
    if (p > 1) {
      for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
        const auto [begin, end] = buckets_[next_bucket_];
        in_flight_.push_back(dp_.start_all_reduce_sum({grads + begin, end - begin}));
      }
      for (auto& pending : in_flight_) pending->wait();
      in_flight_.clear();
      next_bucket_ = 0;
    }
    return std::sqrt(core::sum_of_squares(grads, padded_));
  }
  // Stage 2: bucket [a, b) of every shard, packed rank by rank, reduce-scatters into [a, b) of
  // this rank's shard.
  for (const auto& [begin, end] : buckets_) {
    const std::size_t width = end - begin;
    if (p == 1) {
      core::kernels::copy(grad_shard_.data() + begin, grads + begin, int64_t(width));
      continue;
    }
    for (int r = 0; r < p; ++r) {
      core::kernels::copy(staging_.data() + r * width, grads + r * shard_size_ + begin,
                          int64_t(width));
    }
    Kokkos::fence();  // the collective reads what the kernels wrote
    dp_.reduce_scatter_sum({staging_.data(), width * p}, {grad_shard_.data() + begin, width});
  }
  const double local = core::sum_of_squares(grad_shard_.data(), shard_size_);
  return std::sqrt(dp_.all_reduce_sum_value(local));
}

void ShardedAdamW::step(float* params, float* grads, const core::AdamWParams& hp, int64_t step,
                        float grad_scale) {
  const int p = dp_.size();
  if (stage_ == 0) {
    adamw_->update(params, grads, hp, step, grad_scale);
    return;
  }
  const float* shard_grads = stage_ == 1 ? grads + shard_begin_ : grad_shard_.data();
  if (offload_) {
    const std::size_t bytes = shard_size_ * sizeof(float);
    core::copy_to_host(host_grads_.data(), shard_grads, bytes);
    core::copy_to_host(host_params_.data(), params + shard_begin_, bytes);
    adamw_->update(host_params_.data(), host_grads_.data(), hp, step, grad_scale);
    core::copy_to_device(params + shard_begin_, host_params_.data(), bytes);
    offload_stats_.to_host_bytes += 2 * bytes;
    offload_stats_.to_device_bytes += bytes;
  } else {
    adamw_->update(params + shard_begin_, shard_grads, hp, step, grad_scale);
  }
  if (p > 1) dp_.all_gather({params + shard_begin_, shard_size_}, {params, padded_});
}

}  // namespace colossal::zero
