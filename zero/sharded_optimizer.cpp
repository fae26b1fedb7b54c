#include "zero/sharded_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "core/kernels.hpp"

namespace colossal::zero {

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table,
                           std::vector<core::ParamUnit> units, std::size_t flat_size,
                           parallel::Communicator& dp, core::MemoryTracker& tracker,
                           OptimizerOptions options)
    : stage_(options.stage),
      padded_(flat_size),
      dp_(dp),
      offload_(options.offload_optimizer) {
  check_options(options, flat_size, /*sharded=*/true);
  if (stage_ < 2) {
    own_full_ = std::make_unique<core::FullParameterStore>(std::move(units), flat_size, tracker);
    full_ = own_full_.get();
    store_ = full_;
  } else {
    own_sharded_ = std::make_unique<ShardedParameterStore>(std::move(units), flat_size, stage_, dp,
                                                           tracker, options.offload_params,
                                                           options.bf16_reduce);
    sharded_ = own_sharded_.get();
    store_ = sharded_;
  }
  make_adamw(table, tracker, options);
}

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table, core::ParameterStore& store,
                           parallel::Communicator& dp, core::MemoryTracker& tracker,
                           OptimizerOptions options)
    : stage_(options.stage),
      padded_(store.flat_size()),
      dp_(dp),
      full_(dynamic_cast<core::FullParameterStore*>(&store)),
      sharded_(dynamic_cast<ShardedParameterStore*>(&store)),
      store_(&store),
      offload_(options.offload_optimizer) {
  if (options.stage > 2) {
    throw std::invalid_argument("parallel.zero.stage " + std::to_string(options.stage) +
                                " gathers parameters unit by unit, which the 2d / 2.5d / 3d "
                                "models do not run; use stage 0, 1 or 2");
  }
  const bool fits = options.stage < 2 ? full_ != nullptr
                                      : sharded_ != nullptr && sharded_->stage() == 2;
  if (!fits) {
    throw std::invalid_argument("parallel.zero.stage " + std::to_string(options.stage) +
                                " needs the model's store " +
                                (options.stage < 2 ? "whole (core::FullParameterStore)"
                                                   : "sharded for stage 2 over the data ranks"));
  }
  check_options(options, padded_, /*sharded=*/options.stage >= 1);
  make_adamw(table, tracker, options);
}

void ShardedAdamW::check_options(const OptimizerOptions& options, std::size_t flat_size,
                                 bool sharded) const {
  const int stage = options.stage;
  if (stage < 0 || stage > 3) {
    throw std::invalid_argument("parallel.zero.stage " + std::to_string(stage) +
                                " is not a ZeRO stage (0, 1, 2 or 3)");
  }
  if (options.offload_optimizer && stage == 0) {
    throw std::invalid_argument("optimizer offload needs ZeRO stage 1, 2 or 3");
  }
  if (options.offload_params && (stage != 3 || !options.offload_optimizer)) {
    throw std::invalid_argument("parameter offload needs ZeRO stage 3 with optimizer offload");
  }
  if (sharded && flat_size % (std::size_t(dp_.size()) * 16) != 0) {
    throw std::invalid_argument("flat buffer of " + std::to_string(flat_size) +
                                " floats is not padded to a multiple of dp*16");
  }
}

void ShardedAdamW::make_adamw(const std::vector<core::ParamSpec>& table,
                              core::MemoryTracker& tracker, const OptimizerOptions& options) {
  shard_size_ = padded_ / dp_.size();
  if (stage_ == 0) {
    adamw_ = std::make_unique<core::AdamW>(table, 0, padded_, tracker);
  } else if (stage_ == 1) {
    shard_begin_ = shard_size_ * dp_.rank();
    adamw_ = std::make_unique<core::AdamW>(table, shard_begin_, shard_begin_ + shard_size_,
                                           tracker, offload_);
  } else {
    adamw_ = std::make_unique<core::AdamW>(table, sharded_->owned_ranges(), tracker, offload_);
  }
  if (offload_) {
    host_grads_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
    if (!options.offload_params) {
      host_params_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, shard_size_);
    }
  }
}

ShardedAdamW::OffloadStats ShardedAdamW::offload_stats() const {
  OffloadStats stats = offload_stats_;
  if (sharded_) stats.to_device_bytes += sharded_->uploaded_bytes();
  return stats;
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
