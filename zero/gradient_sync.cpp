#include "zero/gradient_sync.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/optimizer.hpp"

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

GradientSync::GradientSync(const std::vector<core::ParamSpec>& table, core::ParameterStore& store,
                           parallel::Communicator& dp, core::MemoryTracker& tracker,
                           GradientSyncOptions options)
    : store_(store),
      full_(dynamic_cast<core::FullParameterStore*>(&store)),
      sharded_(dynamic_cast<ShardedParameterStore*>(&store)),
      dp_(dp),
      tp_(options.tensor != nullptr && options.tensor->size() > 1 ? options.tensor : nullptr),
      pipeline_(options.pipeline) {
  if (full_ == nullptr && sharded_ == nullptr) {
    throw std::invalid_argument(
        "gradient sync needs the optimizer's store (whole for ZeRO stages 0-1, sharded for 2-3)");
  }
  if (pipeline_.stages != nullptr && pipeline_.stages->size() == 1) pipeline_ = {};
  const std::size_t flat_size = store.flat_size();
  if (sharded_ != nullptr && !options.counted_ranges) {
    // The units backward leaves final (set_overlap): reduce() still sums the tied embedding over
    // the first and last stage, and the layernorms' partial sums under sequence_split.
    std::vector<bool> final(store.units().size(), !(options.sequence_split && tp_ != nullptr));
    if (pipeline_.tied != nullptr) final[0] = false;
    sharded_->set_final_units(std::move(final));
  }
  if (full_ != nullptr) {
    full_->set_gradients_ready_hook([this](std::size_t offset) { gradients_ready(offset); });
    const auto bucket_floats =
        static_cast<std::size_t>(options.bucket_mb * 1024 * 1024 / sizeof(float));
    buckets_ = bucket_ranges(flat_size, bucket_floats);
    if (options.bf16_reduce && dp.size() > 1) {
      wire_ = core::DeviceArray<std::uint16_t>(tracker, core::MemCategory::gradients, flat_size);
    }
  }
  if (options.counted_ranges) {
    // The model's ranges of the flat buffer; in a shard (ZeRO 2), their intersections with this
    // rank's slices, at the slices' places in the shard (the norm then sums over the data ranks).
    std::vector<std::pair<std::size_t, std::size_t>> pieces{{0, flat_size}};
    if (sharded_ != nullptr) pieces = sharded_->owned_ranges();
    std::size_t at = 0;
    for (const auto& [lo, hi] : pieces) {
      for (const auto& [begin, end] : *options.counted_ranges) {
        const std::size_t b = std::max(lo, begin), e = std::min(hi, end);
        if (b < e) norm_runs_.push_back({at + (b - lo), e - b, false, false});
      }
      at += hi - lo;
    }
    distributed_ = true;
    return;
  }
  if (tp_ == nullptr && pipeline_.stages == nullptr) return;
  distributed_ = true;
  // The norm reads the whole flat buffer (stages 0-1) or the packed slices (stages 2-3).
  std::vector<std::pair<std::size_t, std::size_t>> pieces{{0, flat_size}};
  if (sharded_ != nullptr) pieces = sharded_->owned_ranges();
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
      if (options.sequence_split && layernorm) partial_runs_.push_back(norm_runs_.back());
    }
    state += end - begin;
  }
  std::size_t packed = 0;
  for (const NormRun& run : partial_runs_) packed += run.count;
  partial_pack_ = core::DeviceArray<float>(tracker, core::MemCategory::temporaries, packed);
}

void GradientSync::gradients_ready(std::size_t offset) {
  if (!overlap_ || dp_.size() == 1) return;
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= offset) {
    const auto [begin, end] = buckets_[next_bucket_++];
    start_bucket(begin, end);
    ++started_early_;
  }
  for (auto& bucket : in_flight_) bucket.op->test();  // MPI progresses inside MPI calls
}

void GradientSync::start_bucket(std::size_t begin, std::size_t end) {
  float* grads = full_->full_grads() + begin;
  const std::size_t n = end - begin;
  if (wire_.size() == 0) {
    in_flight_.push_back({begin, end, dp_.start_all_reduce_sum({grads, n})});
    return;
  }
  std::uint16_t* wire = wire_.data() + begin;
  core::kernels::to_bf16(wire, grads, int64_t(n));  // the collective is ordered after it
  in_flight_.push_back({begin, end, dp_.start_all_reduce_sum_bf16({wire, n})});
}

double GradientSync::reduce() {
  if (full_ != nullptr) {
    float* grads = full_->full_grads();
    if (dp_.size() > 1) {
      for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
        const auto [begin, end] = buckets_[next_bucket_];
        start_bucket(begin, end);
      }
      for (InFlight& bucket : in_flight_) {
        bucket.op->wait();
        if (wire_.size() > 0) {  // the bf16 sum, widened back into the fp32 gradients
          core::kernels::from_bf16(grads + bucket.begin, wire_.data() + bucket.begin,
                                   int64_t(bucket.end - bucket.begin), /*accumulate=*/false);
        }
      }
      if (wire_.size() > 0) core::fence_kernels();
      in_flight_.clear();
      next_bucket_ = 0;
    }
    tie_embedding();
    if (distributed_) {
      if (tp_ != nullptr) sum_sequence_partial_gradients(grads);
      return distributed_norm(grads, false);
    }
    return std::sqrt(core::sum_of_squares(grads, store_.flat_size()));
  }
  // Stages 2-3: every unit was reduce-scattered into the shard during backward.
  float* shard = sharded_->grad_shard();
  tie_embedding();
  if (distributed_) {
    if (tp_ != nullptr) sum_sequence_partial_gradients(shard);
    return distributed_norm(shard, true);
  }
  const double local = core::sum_of_squares(shard, sharded_->shard_size());
  return std::sqrt(dp_.all_reduce_sum_value(local));
}

void GradientSync::sum_sequence_partial_gradients(float* grads) {
  if (partial_pack_.size() == 0) return;
  std::size_t at = 0;
  for (const NormRun& run : partial_runs_) {
    core::kernels::copy(partial_pack_.data() + at, grads + run.begin, int64_t(run.count));
    at += run.count;
  }
  core::fence_kernels();
  tp_->all_reduce_sum({partial_pack_.data(), partial_pack_.size()});
  at = 0;
  for (const NormRun& run : partial_runs_) {
    core::kernels::copy(grads + run.begin, partial_pack_.data() + at, int64_t(run.count));
    at += run.count;
  }
  core::fence_kernels();
}

void GradientSync::tie_embedding() {
  if (pipeline_.tied == nullptr) return;
  // The embedding is the first floats of unit 0 on both the first and the last stage (the whole
  // unit in 1d, tied_floats of it in 2d / 3d, whose unit 0 has one size on both under ZeRO 2):
  // this rank's pieces of them (the range itself in whole buffers, its slices' part in a shard)
  // are the same floats on the two stages.
  const core::ParamUnit& unit = store_.units().front();
  const std::size_t count = pipeline_.tied_floats > 0 ? pipeline_.tied_floats : unit.size();
  core::fence_kernels();
  for (const auto& [piece, n] : store_.gradient_pieces(unit.begin, unit.begin + count)) {
    pipeline_.tied->all_reduce_sum({piece, n});
  }
}

// Squared norm = (sum over tensor ranks of their split tensors) + (replicated tensors, identical
// on every tensor rank, once); each first summed over the data group when the buffer is a shard,
// and the total over pipeline stages (the tied embedding counted on the first stage only).
double GradientSync::distributed_norm(const float* grads, bool reduce_over_data) {
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

}  // namespace colossal::zero
