#include "core/optimizer.hpp"

#include <algorithm>
#include <vector>
#include <cmath>

#include "core/adamw_team.hpp"
#include "core/host_threads.hpp"
#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::core {

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return max_lr * static_cast<double>(step + 1) / warmup;
  const int64_t decay_steps = total - warmup;
  if (decay_steps <= 0) return max_lr;
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

double sum_of_squares(const float* x, std::size_t n) {
  if constexpr (!kSerialHost) {
    return kernels::sum_squares(x, static_cast<int64_t>(n));
  } else {
    // Plain loops on the host threads (Kokkos's Serial backend is not meant to be entered from
    // several threads: its reductions share scratch memory). Partial sums are added in part
    // order, so the norm does not depend on which thread finishes first.
    HostThreads& pool = HostThreads::shared();
    std::vector<double> partial(pool.size(), 0.0);
    pool.run(n, [&](std::size_t part, std::size_t begin, std::size_t end) {
      for (std::size_t b = begin; b < end; b += kernels::kSumBlock) {
        partial[part] += kernels::block_sum_squares(
            x, int64_t(b), int64_t(std::min<std::size_t>(end, b + kernels::kSumBlock)));
      }
    });
    double total = 0.0;
    for (double p : partial) total += p;
    return total;
  }
}

void zero(float* x, std::size_t n) {
  if constexpr (!kSerialHost) {
    kernels::fill(x, static_cast<int64_t>(n), 0.0f);
    fence_kernels();
  } else {
    HostThreads::shared().run(n, [&](std::size_t, std::size_t begin, std::size_t end) {
      std::fill(x + begin, x + end, 0.0f);
    });
  }
}

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !(grad_norm > max_norm)) return 1.0;
  return max_norm / (grad_norm + 1e-6);
}

std::size_t offloaded_states(std::size_t states, double fraction) {
  if (!(fraction > 0.0)) return 0;
  if (fraction >= 1.0) return states;
  const auto chunks = std::size_t(std::ceil(fraction * double(states) / 16.0));
  return std::min(states, chunks * 16);
}

double offload_fraction(int chunks) {
  return chunks > 0 ? double(chunks) / kOffloadChunks : 1.0;
}

int offload_chunks(double fraction) { return int(std::lround(fraction * kOffloadChunks)); }

int fewest_offload_chunks(const std::function<bool(int)>& fits) {
  int lo = 1, hi = kOffloadChunks;  // hi fits
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  return hi;
}

AdamW::AdamW(const std::vector<ParamSpec>& table, std::size_t begin, std::size_t end,
             MemoryTracker& tracker, bool on_host)
    : begin_(begin),
      end_(end),
      on_host_(on_host),
      m_(tracker, on_host ? MemCategory::offloaded : MemCategory::optimizer, end - begin),
      v_(tracker, on_host ? MemCategory::offloaded : MemCategory::optimizer, end - begin) {
  add_segments(table, begin, end, 0);
}

namespace {
std::size_t total_size(const std::vector<std::pair<std::size_t, std::size_t>>& pieces) {
  std::size_t n = 0;
  for (const auto& [begin, end] : pieces) n += end - begin;
  return n;
}
}  // namespace

AdamW::AdamW(const std::vector<ParamSpec>& table,
             const std::vector<std::pair<std::size_t, std::size_t>>& pieces,
             MemoryTracker& tracker, bool on_host)
    : begin_(pieces.empty() ? 0 : pieces.front().first),
      end_(pieces.empty() ? 0 : pieces.back().second),
      on_host_(on_host),
      m_(tracker, on_host ? MemCategory::offloaded : MemCategory::optimizer, total_size(pieces)),
      v_(tracker, on_host ? MemCategory::offloaded : MemCategory::optimizer, total_size(pieces)) {
  std::size_t state = 0;
  for (const auto& [begin, end] : pieces) {
    add_segments(table, begin, end, state);
    state += end - begin;
  }
}

void AdamW::add_segments(const std::vector<ParamSpec>& table, std::size_t begin, std::size_t end,
                         std::size_t state_offset) {
  for (const auto& p : table) {
    const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.count, end);
    if (lo < hi) segments_.push_back({state_offset + lo - begin, hi - lo, lo, p.decay()});
  }
}

namespace detail {
// One element of the update (moments, bias correction, decoupled decay). A functor rather than a
// KOKKOS_FUNCTION lambda captured by the kernel's lambda: nvcc's wrapper of such a lambda jumped
// to address 0 on the host in another kernel of ours (core/kernels_team.hpp, column_sums).
struct AdamWElement {
  float* params;
  const float* grads;
  float* m;
  float* v;
  float grad_scale, lr, b1, b2, eps, correction1, correction2;
  KOKKOS_INLINE_FUNCTION void operator()(std::size_t i, std::ptrdiff_t p, std::ptrdiff_t g,
                                         float wd) const {
    const float grad = grads[i + g] * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * grad;
    const float vi = b2 * v[i] + (1.0f - b2) * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    float& w = params[i + p];
    w -= lr * (m_hat / (kmath::sqrt(v_hat) + eps) + wd * w);
  }
};
}  // namespace detail

struct AdamW::DeviceBlocks {
  team::AdamWBlockTable<kernels::Exec> table;
};

void AdamW::update(float* params, const float* grads, const AdamWParams& hp, int64_t step,
                   float grad_scale, Indexing params_at, Indexing grads_at) {
  start_update(params, grads, hp, step, grad_scale, params_at, grads_at);
  fence_kernels();
}

void AdamW::start_update(float* params, const float* grads, const AdamWParams& hp, int64_t step,
                         float grad_scale, Indexing params_at, Indexing grads_at) {
  const team::AdamWScalars k = team::adamw_scalars(hp, step, grad_scale);
  float* m = m_.data();
  float* v = v_.data();
  if (kSerialHost || on_host_) {
    // Element i in state order; p and g are the segment's shifts from state to buffer index.
    const detail::AdamWElement element{params,  grads,   m,         v,
                                       k.grad_scale, k.lr, k.beta1, k.beta2,
                                       k.eps,   k.correction1, k.correction2};
    // Elements [lo, hi) of the state on each host thread, tensor by tensor (decay by role).
    HostThreads::shared().run(m_.size(), [&](std::size_t, std::size_t lo, std::size_t hi) {
      for (const Segment& s : segments_) {
        const std::size_t a = std::max(lo, s.begin), b = std::min(hi, s.begin + s.count);
        const float wd = s.decay ? k.weight_decay : 0.0f;
        const std::ptrdiff_t p = s.shift(params_at), g = s.shift(grads_at);
        for (std::size_t i = a; i < b; ++i) element(i, p, g, wd);
      }
    });
  } else {
    // One launch for every tensor of the window (team::adamw_update: the same float
    // expression as detail::AdamWElement), not one per tensor.
    const DeviceBlocks& blocks = device_blocks(params_at, grads_at);
    team::adamw_update<kernels::Exec>(params, grads, m, v, blocks.table.data(),
                                      blocks.table.size(), k);
  }
}

AdamW::~AdamW() = default;

const AdamW::DeviceBlocks& AdamW::device_blocks(Indexing params_at, Indexing grads_at) {
  std::unique_ptr<DeviceBlocks>& slot =
      device_blocks_[2 * int(params_at == Indexing::flat) + int(grads_at == Indexing::flat)];
  if (!slot) {
    std::vector<team::AdamWBlock> blocks;
    for (const Segment& s : segments_) {
      for (std::size_t b = 0; b < s.count; b += std::size_t(team::kAdamWBlock)) {
        const std::size_t end = std::min(s.count, b + std::size_t(team::kAdamWBlock));
        blocks.push_back({int64_t(s.begin + b), int64_t(s.begin + end), s.shift(params_at),
                          s.shift(grads_at), s.decay ? 1 : 0});
      }
    }
    slot = std::make_unique<DeviceBlocks>(DeviceBlocks{team::AdamWBlockTable<kernels::Exec>(blocks)});
  }
  return *slot;
}

}  // namespace colossal::core
