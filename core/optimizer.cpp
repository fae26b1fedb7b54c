#include "core/optimizer.hpp"

#include <algorithm>
#include <cmath>

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

double clip_coefficient(double grad_norm, double max_norm) {
  if (max_norm <= 0.0 || !(grad_norm > max_norm)) return 1.0;
  return max_norm / (grad_norm + 1e-6);
}

AdamW::AdamW(const std::vector<ParamSpec>& table, std::size_t begin, std::size_t end,
             MemoryTracker& tracker)
    : begin_(begin),
      end_(end),
      m_(tracker, MemCategory::optimizer, end - begin),
      v_(tracker, MemCategory::optimizer, end - begin) {
  for (const auto& p : table) {
    const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.count, end);
    if (lo < hi) segments_.push_back({lo - begin, hi - lo, p.decay()});
  }
}

void AdamW::update(float* params, const float* grads, const AdamWParams& hp, int64_t step,
                   float grad_scale) {
  const float lr = static_cast<float>(hp.lr);
  const float b1 = static_cast<float>(hp.beta1), b2 = static_cast<float>(hp.beta2);
  const float eps = static_cast<float>(hp.eps);
  const float correction1 = static_cast<float>(1.0 - std::pow(hp.beta1, double(step)));
  const float correction2 = static_cast<float>(1.0 - std::pow(hp.beta2, double(step)));
  float* m = m_.data();
  float* v = v_.data();
  for (const Segment& s : segments_) {
    const float wd = s.decay ? static_cast<float>(hp.weight_decay) : 0.0f;
    Kokkos::parallel_for(
        "colossal::core::adamw", Kokkos::RangePolicy<>(s.begin, s.begin + s.count),
        KOKKOS_LAMBDA(std::size_t i) {
          const float g = grads[i] * grad_scale;
          const float mi = b1 * m[i] + (1.0f - b1) * g;
          const float vi = b2 * v[i] + (1.0f - b2) * g * g;
          m[i] = mi;
          v[i] = vi;
          const float m_hat = mi / correction1;
          const float v_hat = vi / correction2;
          params[i] -= lr * (m_hat / (kmath::sqrt(v_hat) + eps) + wd * params[i]);
        });
  }
  Kokkos::fence();
}

}  // namespace colossal::core
