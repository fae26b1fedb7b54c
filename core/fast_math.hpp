// Vectorisable float exp, tanh and sigmoid, shared by the host kernels (core/kernels.hpp,
// core/llama_kernels.hpp) and the team kernels (core/kernels_team.hpp,
// core/llama_kernels_team.hpp), so both paths compute the same values. Device-legal.
#pragma once

#include <cstdint>

#include <Kokkos_Core.hpp>

namespace colossal::core::kernels {

// exp without a library call, so that loops over it vectorise (glibc's expf does not, and a
// scalar call per element dominated GELU and softmax). exp(x) = 2^n * p(r), n = round(x / ln 2),
// r = x - n ln 2 in two parts (Cody-Waite), p a degree-6 Taylor polynomial on |r| <= ln2/2:
// relative error below 2e-7 over the clamped range [-87.3, 88].
KOKKOS_INLINE_FUNCTION float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  // Round to nearest by the 1.5 * 2^23 trick: no floorf call, so the loop still vectorises.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union {
    int32_t i;
    float f;
  } scale;
  scale.i = (static_cast<int32_t>(n) + 127) << 23;
  return p * scale.f;
}

// tanh through one exp: glibc's tanhf (via expm1f) cost a third of a small model's step.
// tanh(|u|) = (1 - e^{-2|u|}) / (1 + e^{-2|u|}); absolute error ~2e-7, no overflow for any u.
KOKKOS_INLINE_FUNCTION float fast_tanh(float u) {
  const float t = fast_exp(-2.0f * (u < 0.0f ? -u : u));
  const float r = (1.0f - t) / (1.0f + t);
  return u < 0.0f ? -r : r;
}

// The logistic function through fast_exp (SwiGLU's silu, core/llama_kernels.hpp).
KOKKOS_INLINE_FUNCTION float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// Row reductions of the host kernels: f(j) for j in [0, n) folded into kLanes interleaved
// partials (lane k takes j = k mod kLanes), which are then combined pairwise. One fixed order
// whatever the vector width, and a loop GCC vectorises: a single running float sum is a
// dependency chain it may not reorder, which kept the cross-entropy over V = 50257 and the
// softmax rows scalar (exp included). f may write (the softmax stores each exp as it sums it).
constexpr int kLanes = 16;

template <class F>
KOKKOS_INLINE_FUNCTION float lane_sum(int n, const F& f) {
  float acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] += f(j + k);
  }
  for (int k = 0; j < n; ++j, ++k) acc[k] += f(j);
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  }
  return acc[0];
}

// The largest x[j], j in [0, n) (n >= 1), in lanes as lane_sum (the maximum is the same in any
// order).
KOKKOS_INLINE_FUNCTION float lane_max(const float* x, int n) {
  float acc[kLanes];
  for (int k = 0; k < kLanes; ++k) acc[k] = x[0];
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int k = 0; k < kLanes; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  }
  for (int k = 0; j < n; ++j, ++k) acc[k] = x[j] > acc[k] ? x[j] : acc[k];
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int k = 0; k < w; ++k) acc[k] = acc[k + w] > acc[k] ? acc[k + w] : acc[k];
  }
  return acc[0];
}

}  // namespace colossal::core::kernels
