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

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table,
                           std::vector<core::ParamUnit> units, std::size_t flat_size, int stage,
                           double bucket_mb, parallel::Communicator& dp,
                           core::MemoryTracker& tracker, bool offload_optimizer,
                           bool offload_params, parallel::Communicator* tensor,
                           bool sequence_split, PipelineLinks pipeline)
    : pipeline_(pipeline),
      stage_(stage),
      padded_(flat_size),
      dp_(dp),
      tp_(tensor != nullptr && tensor->size() > 1 ? tensor : nullptr),
      offload_(offload_optimizer) {
  if (pipeline_.stages != nullptr && pipeline_.stages->size() == 1) pipeline_ = {};
  if (stage < 0 || stage > 3) {
    throw std::invalid_argument("parallel.zero.stage " + std::to_string(stage) +
                                " is not a ZeRO stage (0, 1, 2 or 3)");
  }
  if (offload_ && stage == 0) {
    throw std::invalid_argument("optimizer offload needs ZeRO stage 1, 2 or 3");
  }
  if (offload_params && (stage != 3 || !offload_)) {
    throw std::invalid_argument("parameter offload needs ZeRO stage 3 with optimizer offload");
  }
  if (flat_size % (std::size_t(dp.size()) * 16) != 0) {
    throw std::invalid_argument("flat buffer of " + std::to_string(flat_size) +
                                " floats is not padded to a multiple of dp*16");
  }
  shard_size_ = flat_size / dp.size();
  if (stage < 2) {
    full_ = std::make_unique<core::FullParameterStore>(std::move(units), flat_size, tracker);
    full_->set_gradients_ready_hook([this](std::size_t offset) { gradients_ready(offset); });
    store_ = full_.get();
    const auto bucket_floats = static_cast<std::size_t>(bucket_mb * 1024 * 1024 / sizeof(float));
    buckets_ = bucket_ranges(flat_size, bucket_floats);
    if (stage == 0) {
      adamw_ = std::make_unique<core::AdamW>(table, 0, flat_size, tracker);
    } else {
      shard_begin_ = shard_size_ * dp.rank();
      adamw_ = std::make_unique<core::AdamW>(table, shard_begin_, shard_begin_ + shard_size_,
                                             tracker, offload_);
    }
  } else {
    sharded_ = std::make_unique<ShardedParameterStore>(std::move(units), flat_size, stage, dp,
                                                       tracker, offload_params);
    store_ = sharded_.get();
    adamw_ = std::make_unique<core::AdamW>(table, sharded_->owned_ranges(), tracker, offload_);
  }
  if (tp_ != nullptr || pipeline_.stages != nullptr) {
    // The norm reads the whole flat buffer (stages 0-1) or the packed slices (stages 2-3).
    std::vector<std::pair<std::size_t, std::size_t>> pieces{{0, flat_size}};
    if (sharded_) pieces = sharded_->owned_ranges();
    std::size_t state = 0;
    for (const auto& [begin, end] : pieces) {
      for (const auto& p : table) {
        const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.count, end);
        if (lo >= hi) continue;
        const bool embedding = p.role == core::ParamRole::token_embedding ||
                               p.role == core::ParamRole::position_embedding;
        norm_runs_.push_back({state + lo - begin, hi - lo, p.shard.replicated(),
                              embedding && !pipeline_.count_embedding});
        const bool layernorm = p.role == core::ParamRole::layernorm_weight ||
                               p.role == core::ParamRole::layernorm_bias;
        if (sequence_split && layernorm) partial_runs_.push_back(norm_runs_.back());
      }
      state += end - begin;
    }
    std::size_t packed = 0;
    for (const NormRun& run : partial_runs_) packed += run.count;
    partial_pack_ = core::DeviceArray<float>(tracker, core::MemCategory::temporaries, packed);
  }
  if (offload_) {
    host_grads_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
    if (!offload_params) {
      host_params_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
    }
  }
}

ShardedAdamW::OffloadStats ShardedAdamW::offload_stats() const {
  OffloadStats stats = offload_stats_;
  if (sharded_) stats.to_device_bytes += sharded_->uploaded_bytes();
  return stats;
}

void ShardedAdamW::gradients_ready(std::size_t offset) {
  if (!overlap_ || dp_.size() == 1) return;
  float* grads = full_->full_grads();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= offset) {
    const auto [begin, end] = buckets_[next_bucket_++];
    in_flight_.push_back(dp_.start_all_reduce_sum({grads + begin, end - begin}));
    ++started_early_;
  }
  for (auto& pending : in_flight_) pending->test();  // MPI progresses inside MPI calls
}

double ShardedAdamW::reduce_gradients() {
  if (stage_ < 2) {
    float* grads = full_->full_grads();
    if (dp_.size() > 1) {
      for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
        const auto [begin, end] = buckets_[next_bucket_];
        in_flight_.push_back(dp_.start_all_reduce_sum({grads + begin, end - begin}));
      }
      for (auto& pending : in_flight_) pending->wait();
      in_flight_.clear();
      next_bucket_ = 0;
    }
    tie_embedding(grads);
    if (!norm_runs_.empty()) {
      if (tp_ != nullptr) sum_sequence_partial_gradients(grads);
      return distributed_norm(grads, false);
    }
    return std::sqrt(core::sum_of_squares(grads, padded_));
  }
  // Stages 2-3: every unit was reduce-scattered into the shard during backward.
  tie_embedding(sharded_->grad_shard());
  if (!norm_runs_.empty()) {
    if (tp_ != nullptr) sum_sequence_partial_gradients(sharded_->grad_shard());
    return distributed_norm(sharded_->grad_shard(), true);
  }
  const double local = core::sum_of_squares(sharded_->grad_shard(), shard_size_);
  return std::sqrt(dp_.all_reduce_sum_value(local));
}

void ShardedAdamW::sum_sequence_partial_gradients(float* grads) {
  if (partial_pack_.size() == 0) return;
  std::size_t at = 0;
  for (const NormRun& run : partial_runs_) {
    core::kernels::copy(partial_pack_.data() + at, grads + run.begin, int64_t(run.count));
    at += run.count;
  }
  Kokkos::fence();
  tp_->all_reduce_sum({partial_pack_.data(), partial_pack_.size()});
  at = 0;
  for (const NormRun& run : partial_runs_) {
    core::kernels::copy(grads + run.begin, partial_pack_.data() + at, int64_t(run.count));
    at += run.count;
  }
  Kokkos::fence();
}

std::vector<ShardedAdamW::StateRange> ShardedAdamW::state_ranges() const {
  if (stage_ == 0) return {{0, padded_, 0}};
  if (stage_ == 1) return {{shard_begin_, shard_size_, 0}};
  std::vector<StateRange> ranges;
  std::size_t at = 0;
  for (const auto& [begin, end] : sharded_->owned_ranges()) {
    ranges.push_back({begin, end - begin, at});
    at += end - begin;
  }
  return ranges;
}

std::vector<float> ShardedAdamW::state(int which) const {
  const core::AdamW& adamw = *adamw_;
  std::vector<float> host(stage_ == 0 ? padded_ : shard_size_);
  core::copy_to_host(host.data(), which == 0 ? adamw.m() : adamw.v(), host.size() * sizeof(float));
  return host;
}

void ShardedAdamW::set_state(int which, const std::vector<float>& values) {
  if (values.size() != (stage_ == 0 ? padded_ : shard_size_)) {
    throw std::invalid_argument("optimizer state of the wrong size");
  }
  core::AdamW& adamw = *adamw_;
  core::copy_to_device(which == 0 ? adamw.m() : adamw.v(), values.data(),
                       values.size() * sizeof(float));
}

std::vector<float> ShardedAdamW::owned_parameters() {
  std::vector<float> host(stage_ == 0 ? padded_ : shard_size_);
  if (stage_ == 3) {
    core::copy_to_host(host.data(), sharded_->param_shard(), host.size() * sizeof(float));
    return host;
  }
  // Stages 0-2 hold the whole flat buffer.
  const float* whole = store_->full_params();
  for (const StateRange& range : state_ranges()) {
    core::copy_to_host(host.data() + range.at, whole + range.begin, range.length * sizeof(float));
  }
  return host;
}

void ShardedAdamW::tie_embedding(float* grads) {
  if (pipeline_.tied == nullptr) return;
  // The embedding is unit 0 of both the first and the last stage: the same range of the whole
  // buffer (stages 0-1) or of the shard (stages 2-3; slice 0 starts the shard).
  const core::ParamUnit& unit = store_->units().front();
  const std::size_t begin = sharded_ ? 0 : unit.begin;
  const std::size_t count = sharded_ ? unit.size() / dp_.size() : unit.size();
  Kokkos::fence();
  pipeline_.tied->all_reduce_sum({grads + begin, count});
}

// Squared norm = (sum over tensor ranks of their split tensors) + (replicated tensors, identical
// on every tensor rank, once); each first summed over the data group when the buffer is a shard,
// and the total over pipeline stages (the tied embedding counted on the first stage only).
double ShardedAdamW::distributed_norm(const float* grads, bool reduce_over_data) {
  double split = 0.0, replicated = 0.0;
  for (const NormRun& run : norm_runs_) {
    if (run.skip) continue;
    (run.replicated ? replicated : split) += core::sum_of_squares(grads + run.begin, run.count);
  }
  if (reduce_over_data) {
    split = dp_.all_reduce_sum_value(split);
    replicated = dp_.all_reduce_sum_value(replicated);
  }
  double total = (tp_ != nullptr ? tp_->all_reduce_sum_value(split) : split) + replicated;
  if (pipeline_.stages != nullptr && pipeline_.sum_over_stages) {
    total = pipeline_.stages->all_reduce_sum_value(total);
  }
  return std::sqrt(total);
}

void ShardedAdamW::offloaded_update(const core::AdamWParams& hp, int64_t step,
                                    float grad_scale) {
  const std::size_t bytes = shard_size_ * sizeof(float);
  const float* grads =
      stage_ == 1 ? full_->full_grads() + shard_begin_ : sharded_->grad_shard();
  core::copy_to_host(host_grads_.data(), grads, bytes);
  offload_stats_.to_host_bytes += bytes;
  if (stage_ == 3 && sharded_->params_offloaded()) {
    // The parameter shard already lives on the host: update it in place.
    adamw_->update(sharded_->param_shard(), host_grads_.data(), hp, step, grad_scale);
    return;
  }
  // The parameter shard's pieces: one contiguous range (stages 1, 3) or this rank's slice of
  // every unit inside the whole buffer (stage 2).
  std::vector<std::pair<float*, std::size_t>> pieces;
  if (stage_ == 1) {
    pieces.emplace_back(full_->full_params() + shard_begin_, shard_size_);
  } else if (stage_ == 3) {
    pieces.emplace_back(sharded_->param_shard(), shard_size_);
  } else {
    for (const auto& [begin, end] : sharded_->owned_ranges()) {
      pieces.emplace_back(sharded_->full_params() + begin, end - begin);
    }
  }
  std::size_t at = 0;
  for (const auto& [ptr, n] : pieces) {
    core::copy_to_host(host_params_.data() + at, ptr, n * sizeof(float));
    at += n;
  }
  adamw_->update(host_params_.data(), host_grads_.data(), hp, step, grad_scale);
  at = 0;
  for (const auto& [ptr, n] : pieces) {
    core::copy_to_device(ptr, host_params_.data() + at, n * sizeof(float));
    at += n;
  }
  offload_stats_.to_host_bytes += bytes;
  offload_stats_.to_device_bytes += bytes;
}

void ShardedAdamW::step(const core::AdamWParams& hp, int64_t step, float grad_scale) {
  using Indexing = core::AdamW::Indexing;
  const int p = dp_.size();
  if (stage_ == 0) {
    adamw_->update(full_->full_params(), full_->full_grads(), hp, step, grad_scale);
    return;
  }
  if (offload_) {
    offloaded_update(hp, step, grad_scale);
  } else if (stage_ == 1) {
    adamw_->update(full_->full_params() + shard_begin_, full_->full_grads() + shard_begin_, hp,
                   step, grad_scale);
  } else if (stage_ == 2) {
    adamw_->update(sharded_->full_params(), sharded_->grad_shard(), hp, step, grad_scale,
                   Indexing::flat, Indexing::state);
  } else {
    adamw_->update(sharded_->param_shard(), sharded_->grad_shard(), hp, step, grad_scale);
  }
  if (stage_ == 1 && p > 1) {
    float* params = full_->full_params();
    dp_.all_gather({params + shard_begin_, shard_size_}, {params, padded_});
  }
  if (stage_ == 2) sharded_->all_gather_params();
}

}  // namespace colossal::zero
