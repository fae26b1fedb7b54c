#include "zero/sharded_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::zero {

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table,
                           std::vector<core::ParamUnit> units, std::size_t flat_size,
                           parallel::Communicator& dp, core::MemoryTracker& tracker,
                           OptimizerOptions options)
    : stage_(options.inference && options.stage < 3 ? 0 : options.stage),
      inference_(options.inference),
      padded_(flat_size),
      dp_(dp),
      offload_(options.offload_optimizer && !options.inference) {
  check_options(options, flat_size, /*sharded=*/true);
  if (stage_ < 2) {
    own_full_ = std::make_unique<core::FullParameterStore>(std::move(units), flat_size, tracker,
                                                           /*gradients=*/!inference_);
    full_ = own_full_.get();
    store_ = full_;
  } else {
    own_sharded_ = std::make_unique<ShardedParameterStore>(std::move(units), flat_size, stage_, dp,
                                                           tracker,
                                                           options.offload_params
                                                               ? options.offload_params_fraction
                                                               : 0.0,
                                                           options.bf16_reduce,
                                                           /*gradients=*/!inference_);
    sharded_ = own_sharded_.get();
    store_ = sharded_;
  }
  make_adamw(table, tracker, options);
}

ShardedAdamW::ShardedAdamW(const std::vector<core::ParamSpec>& table, core::ParameterStore& store,
                           parallel::Communicator& dp, core::MemoryTracker& tracker,
                           OptimizerOptions options)
    : stage_(options.stage),
      inference_(options.inference),
      padded_(store.flat_size()),
      dp_(dp),
      full_(dynamic_cast<core::FullParameterStore*>(&store)),
      sharded_(dynamic_cast<ShardedParameterStore*>(&store)),
      store_(&store),
      offload_(options.offload_optimizer && !options.inference) {
  if (inference_ && (options.stage != 0 || full_ == nullptr)) {
    throw std::invalid_argument("an inference optimizer over a grid model's store needs stage 0 "
                                "and the store whole (core::FullParameterStore)");
  }
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
  // (Inference has no optimizer state: its stage-3 shard may live on the host alone.)
  if (options.offload_params &&
      (stage != 3 || (!options.offload_optimizer && !options.inference))) {
    throw std::invalid_argument("parameter offload needs ZeRO stage 3 with optimizer offload");
  }
  if (!(options.offload_fraction > 0.0 && options.offload_fraction <= 1.0)) {
    throw std::invalid_argument("parallel.zero.offload.optimizer_fraction " +
                                std::to_string(options.offload_fraction) +
                                " is not in (0, 1]");
  }
  if (!(options.offload_params_fraction > 0.0 && options.offload_params_fraction <= 1.0)) {
    throw std::invalid_argument("parallel.zero.offload.params_fraction " +
                                std::to_string(options.offload_params_fraction) +
                                " is not in (0, 1]");
  }
  if (options.offload_params && options.offload_fraction < 1.0) {
    throw std::invalid_argument("parameter offload needs all of the optimizer state on the host "
                                "(parallel.zero.offload.optimizer_fraction: 1)");
  }
  if (sharded && flat_size % (std::size_t(dp_.size()) * 16) != 0) {
    throw std::invalid_argument("flat buffer of " + std::to_string(flat_size) +
                                " floats is not padded to a multiple of dp*16");
  }
}

namespace {
// `pieces` (flat ranges in state order) split at state index `at`: the ranges before and after.
using Ranges = std::vector<std::pair<std::size_t, std::size_t>>;
std::pair<Ranges, Ranges> split_ranges(const Ranges& pieces, std::size_t at) {
  Ranges before, after;
  std::size_t state = 0;
  for (const auto& [begin, end] : pieces) {
    const std::size_t cut = begin + std::min(end - begin, at > state ? at - state : 0);
    if (cut > begin) before.emplace_back(begin, cut);
    if (end > cut) after.emplace_back(cut, end);
    state += end - begin;
  }
  return {before, after};
}
}  // namespace

void ShardedAdamW::make_adamw(const std::vector<core::ParamSpec>& table,
                              core::MemoryTracker& tracker, const OptimizerOptions& options) {
  shard_size_ = padded_ / dp_.size();
  if (inference_) return;  // parameters only: no moments, no offload buffers
  if (stage_ == 0) {
    adamw_ = std::make_unique<core::AdamW>(table, 0, padded_, tracker);
    return;
  }
  // The shard's last host_states_ states live on the host, the others on the device.
  host_states_ = offload_ ? core::offloaded_states(shard_size_, options.offload_fraction) : 0;
  const std::size_t split = shard_size_ - host_states_;
  if (stage_ == 1) {
    shard_begin_ = shard_size_ * dp_.rank();
    adamw_ = std::make_unique<core::AdamW>(table, shard_begin_, shard_begin_ + split, tracker);
    if (offload_) {
      host_adamw_ = std::make_unique<core::AdamW>(table, shard_begin_ + split,
                                                  shard_begin_ + shard_size_, tracker, true);
    }
  } else {
    std::tie(device_ranges_, host_ranges_) = split_ranges(sharded_->owned_ranges(), split);
    adamw_ = std::make_unique<core::AdamW>(table, device_ranges_, tracker);
    if (offload_) {
      host_adamw_ = std::make_unique<core::AdamW>(table, host_ranges_, tracker, true);
    }
  }
  if (offload_) {
    copies_ = std::make_unique<core::CopyQueue>();
    if (stage_ >= 2) {
      sharded_->set_final_listener([this](int unit, const float* slice, bool during_backward) {
        fetch_unit_gradients(unit, slice, during_backward);
      });
    }
    host_grads_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, host_states_);
    if (!options.offload_params) {
      host_params_ = core::DeviceArray<float>(tracker, core::MemCategory::offloaded, host_states_);
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
  // The device's states, then the host's: state order.
  std::vector<float> host(stage_ == 0 ? padded_ : shard_size_);
  std::size_t at = 0;
  for (const core::AdamW* part : {adamw_.get(), host_adamw_.get()}) {
    if (part == nullptr) continue;
    core::copy_to_host(host.data() + at, which == 0 ? part->m() : part->v(),
                       part->size() * sizeof(float));
    at += part->size();
  }
  return host;
}

void ShardedAdamW::set_state(int which, const std::vector<float>& values) {
  if (values.size() != (stage_ == 0 ? padded_ : shard_size_)) {
    throw std::invalid_argument("optimizer state of the wrong size");
  }
  std::size_t at = 0;
  for (core::AdamW* part : {adamw_.get(), host_adamw_.get()}) {
    if (part == nullptr) continue;
    core::copy_to_device(which == 0 ? part->m() : part->v(), values.data() + at,
                         part->size() * sizeof(float));
    at += part->size();
  }
}

std::vector<float> ShardedAdamW::owned_parameters() {
  std::vector<float> host(stage_ == 0 ? padded_ : shard_size_);
  if (stage_ == 3) {  // the device part, then the host part (parameter offload)
    const std::size_t on_host = sharded_->host_param_states(), split = host.size() - on_host;
    if (split > 0) {
      core::copy_to_host(host.data(), sharded_->param_shard(), split * sizeof(float));
    }
    if (on_host > 0) {
      std::copy_n(sharded_->host_param_shard() + split, on_host, host.data() + split);
    }
    return host;
  }
  // Stages 0-2 hold the whole flat buffer.
  const float* whole = store_->full_params();
  for (const StateRange& range : state_ranges()) {
    core::copy_to_host(host.data() + range.at, whole + range.begin, range.length * sizeof(float));
  }
  return host;
}

void ShardedAdamW::set_owned_parameters(const float* values) {
  if (stage_ != 3) {
    throw std::logic_error("set_owned_parameters at ZeRO stage " + std::to_string(stage_) +
                           ": only stage 3 holds its parameters as a shard");
  }
  const std::size_t on_host = sharded_->host_param_states(), split = shard_size_ - on_host;
  if (split > 0) core::copy_to_device(sharded_->param_shard(), values, split * sizeof(float));
  if (on_host > 0) std::copy_n(values + split, on_host, sharded_->host_param_shard() + split);
}

std::vector<std::pair<float*, std::size_t>> ShardedAdamW::offloaded_pieces() {
  const std::size_t split = shard_size_ - host_states_;
  std::vector<std::pair<float*, std::size_t>> pieces;
  if (stage_ == 1) {
    pieces.emplace_back(full_->full_params() + shard_begin_ + split, host_states_);
  } else if (stage_ == 3) {
    // With parameter offload every state is offloaded (split 0) and only the device part moves.
    const std::size_t n = host_states_ - sharded_->host_param_states();
    if (n > 0) pieces.emplace_back(sharded_->param_shard() + split, n);
  } else {
    for (const auto& [begin, end] : host_ranges_) {
      pieces.emplace_back(sharded_->full_params() + begin, end - begin);
    }
  }
  return pieces;
}

float* ShardedAdamW::host_params() {
  return stage_ == 3 && sharded_->params_offloaded() ? sharded_->host_param_shard()
                                                     : host_params_.data();
}

void ShardedAdamW::fetch_unit_gradients(int unit, const float* slice, bool early) {
  const uint64_t generation = sharded_->gradient_generation();
  if (fetched_.empty() || fetched_generation_ != generation) {  // a new step's gradients
    fetched_.assign(sharded_->units().size(), false);
    fetched_generation_ = generation;
  }
  if (fetched_[std::size_t(unit)]) return;
  fetched_[std::size_t(unit)] = true;
  // The unit's slice is states [at, at + n) of the shard; the offloaded ones are [split, S).
  const std::size_t split = shard_size_ - host_states_;
  const std::size_t at = sharded_->slice_offset(unit), n = sharded_->slice_size(unit);
  const std::size_t from = std::max(at, split);
  if (from >= at + n) return;
  const std::size_t bytes = (at + n - from) * sizeof(float);
  copies_->follow_kernels();  // after the kernels that summed the slice, without the host waiting
  copies_->to_host(host_grads_.data() + (from - split), slice + (from - at), bytes);
  offload_stats_.to_host_bytes += bytes;
  if (early) offload_stats_.early_to_host_bytes += bytes;
}

void ShardedAdamW::fetch_offloaded_gradients() {
  if (stage_ == 1) {
    const std::size_t split = shard_size_ - host_states_;
    const std::size_t bytes = host_states_ * sizeof(float);
    copies_->to_host(host_grads_.data(), full_->full_grads() + shard_begin_ + split, bytes);
    offload_stats_.to_host_bytes += bytes;
  } else {
    // Completing the reductions in flight may finish units (the listener fetches them); the
    // units not fetched during backward come down now.
    const float* shard = sharded_->grad_shard();
    for (std::size_t u = 0; u < sharded_->units().size(); ++u) {
      fetch_unit_gradients(int(u), shard + sharded_->slice_offset(int(u)), false);
    }
  }
}

void ShardedAdamW::fetch_offloaded_parameters() {
  // The parameters that live on the device (with parameter offload, the rest are on the host).
  float* host = host_params();
  std::size_t at = 0;
  for (const auto& [ptr, n] : offloaded_pieces()) {
    copies_->to_host(host + at, ptr, n * sizeof(float));
    at += n;
  }
  offload_stats_.to_host_bytes += at * sizeof(float);
  copies_->wait();
}

void ShardedAdamW::offloaded_update(const core::AdamWParams& hp, int64_t step,
                                    float grad_scale) {
  // In place where the parameters live on the host; the device's part goes back up.
  float* host = host_params();
  host_adamw_->update(host, host_grads_.data(), hp, step, grad_scale);
  std::size_t at = 0;
  for (const auto& [ptr, n] : offloaded_pieces()) {
    copies_->to_device(ptr, host + at, n * sizeof(float));
    at += n;
  }
  copies_->wait();
  offload_stats_.to_device_bytes += at * sizeof(float);
}

void ShardedAdamW::skip_step() {
  // The gradient copies that started during backward read the gradient shard, which the next
  // step's zero_gradients clears on Kokkos' stream without waiting for the copy queue.
  if (copies_) copies_->wait();
}

void ShardedAdamW::step(const core::AdamWParams& hp, int64_t step, float grad_scale) {
  if (inference_) throw std::logic_error("an inference optimizer holds no state to step");
  using Indexing = core::AdamW::Indexing;
  const int p = dp_.size();
  if (stage_ == 0) {
    adamw_->update(full_->full_params(), full_->full_grads(), hp, step, grad_scale);
    return;
  }
  // Offload: the host's share comes down on the copy queue, is updated on the host threads and
  // goes back up, all while the device's update runs (the two shares are disjoint). The kernels
  // that wrote the gradients are waited for first. The gradients not copied during backward are
  // queued before the device's update starts: each such copy follows Kokkos' stream
  // (fetch_unit_gradients), and queued after the update it would wait for all of it.
  if (offload_) {
    core::fence_kernels();
    fetch_offloaded_gradients();
  }
  if (stage_ == 1) {
    adamw_->start_update(full_->full_params() + shard_begin_, full_->full_grads() + shard_begin_,
                         hp, step, grad_scale);
  } else if (stage_ == 2) {
    adamw_->start_update(sharded_->full_params(), sharded_->grad_shard(), hp, step, grad_scale,
                         Indexing::flat, Indexing::state);
  } else if (!sharded_->params_offloaded()) {
    adamw_->start_update(sharded_->param_shard(), sharded_->grad_shard(), hp, step, grad_scale);
  }
  if (offload_) {
    fetch_offloaded_parameters();
    offloaded_update(hp, step, grad_scale);
  }
  core::fence_kernels();
  if (stage_ == 1 && p > 1) {
    float* params = full_->full_params();
    dp_.all_gather({params + shard_begin_, shard_size_}, {params, padded_});
  }
  if (stage_ == 2) sharded_->all_gather_params();
}

}  // namespace colossal::zero
