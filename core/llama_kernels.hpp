// The element-wise and row kernels of the LLaMA block (Touvron et al. 2023), as explicit
// forward/backward pairs in the conventions of core/kernels.hpp (parameter gradients accumulate,
// activation gradients assign unless said otherwise, column reductions in a fixed row order):
// - RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w, no mean, no bias;
// - rotary position embedding (RoPE, Su et al. 2021) in Hugging Face's "rotate half" form: within
//   each head of hs columns, column i < hs/2 pairs with column i + hs/2, and the pair turns by the
//   angle pos * theta^(-2i/hs);
// - SwiGLU (Shazeer 2020): out = silu(gate) * up;
// - grouped-query attention's key/value sharing (Ainslie et al. 2023): KV heads, each read by
//   H/KV query heads. The forward expands a (B,T,C+2*KV*hs) projection into the (B,T,3C) layout
//   the multi-head attention kernels take (core/layers.hpp); the backward sums each KV head's
//   gradient over its group of query heads. The expansion costs one (B,T,3C) buffer.
// One source for host and device: labelled Kokkos loops over raw arrays (kernels::for_each); on a
// device (team_kernels_v) each kernel takes its form in core/llama_kernels_team.hpp instead.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/kernels.hpp"
#include "core/llama_kernels_team.hpp"
#include "core/model_spec.hpp"

namespace colossal::core::kernels {

// out = inp * rstd * weight per row, rstd = 1 / sqrt(mean(inp^2) + eps), saved for backward.
// Out: float, or std::uint16_t for bf16 patterns (as layernorm_forward).
template <class ExecSpace = Exec, class Out = float>
void rmsnorm_forward(Out* out,             // (N,C)
                     float* rstd,          // (N)
                     const float* inp,     // (N,C)
                     const float* weight,  // (C)
                     int64_t N, int C, float eps) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::rmsnorm_forward<ExecSpace, Out>(out, rstd, inp, weight, N, C, eps);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::rmsnorm_forward", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* x = inp + n * C;
        const float ms = lane_sum(C, [&](int c) { return x[c] * x[c]; }) / C;
        const float s = 1.0f / kmath::sqrt(ms + eps);
        Out* o = out + n * C;
        for (int c = 0; c < C; ++c) store_output(o[c], x[c] * s * weight[c]);
        rstd[n] = s;
      });
}

// dinp += input gradient (the residual stream, as layernorm_backward); dweight += ...
// With g = dout * weight: dinp = rstd * g - inp * rstd^3 * mean(g * inp).
template <class ExecSpace = Exec>
void rmsnorm_backward(float* dinp,          // (N,C), accumulated
                      float* dweight,       // (C)
                      const float* dout,    // (N,C)
                      const float* inp,     // (N,C)
                      const float* weight,  // (C)
                      const float* rstd,    // (N)
                      int64_t N, int C) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::rmsnorm_backward<ExecSpace>(dinp, dweight, dout, inp, weight, rstd, N, C);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::rmsnorm_backward_input", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        const float s = rstd[n];
        const float gx_mean = lane_sum(C, [&](int c) { return d[c] * weight[c] * x[c]; }) / C;
        const float s3 = s * s * s;
        float* di = dinp + n * C;
        for (int c = 0; c < C; ++c) di[c] += s * d[c] * weight[c] - x[c] * s3 * gx_mean;
      });
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
  for_each<ExecSpace>(
      "colossal::core::rmsnorm_backward_weight", chunks, kChunkGrain, KOKKOS_LAMBDA(int chunk) {
        const int c0 = chunk * kColumnChunk;
        const int c1 = c0 + kColumnChunk < C ? c0 + kColumnChunk : C;
        float dw[kColumnChunk] = {};
        for (int64_t n = 0; n < N; ++n) {
          const float* x = inp + n * C;
          const float* d = dout + n * C;
          const float s = rstd[n];
          for (int c = c0; c < c1; ++c) dw[c - c0] += d[c] * x[c] * s;
        }
        for (int c = c0; c < c1; ++c) dweight[c] += dw[c - c0];
      });
}

// The rotation table of RoPE: cos and sin of pos * f_i for pos in [0, T) and i in [0, hs/2),
// f_i = theta^(-2i/hs) scaled by `scaling` (core::rope_frequency), row-major (T, hs/2). Computed
// in double, so every layout (and every rank of a ring, which reads rows from its own global
// offset) uses the same values.
inline void rope_table(float* cos_table, float* sin_table, int T, int hs, double theta,
                       const RopeScaling& scaling = {}) {
  const int half = hs / 2;
  std::vector<double> frequency(half);
  for (int i = 0; i < half; ++i) frequency[i] = rope_frequency(i, hs, theta, scaling);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < half; ++i) {
      const double angle = t * frequency[i];
      cos_table[t * half + i] = float(std::cos(angle));
      sin_table[t * half + i] = float(std::sin(angle));
    }
  }
}

// Turns `heads` heads of hs columns in every row of x (B, Tl, ld), starting at column `col0`, by
// the angles of global positions pos0 + t (t in [0, Tl)); tables as rope_table with at least
// pos0 + Tl rows. inverse = true turns back (the backward: the rotation's transpose is its
// inverse), so rope(inverse) applied to dout gives dinp. In place.
template <class ExecSpace = Exec>
void rope_rotate(float* x, int64_t B, int Tl, int ld, int col0, int heads, int hs, int pos0,
                 const float* cos_table, const float* sin_table, bool inverse) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::rope_rotate<ExecSpace>(x, B, Tl, ld, col0, heads, hs, pos0, cos_table, sin_table,
                                 inverse);
    return;
  }
  const int half = hs / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  for_each<ExecSpace>(
      "colossal::core::rope_rotate", B * Tl, kRowGrain, KOKKOS_LAMBDA(int64_t row) {
        const int pos = pos0 + int(row % Tl);
        const float* cr = cos_table + int64_t(pos) * half;
        const float* sr = sin_table + int64_t(pos) * half;
        float* r = x + row * ld + col0;
        for (int h = 0; h < heads; ++h) {
          float* v = r + h * hs;
          for (int i = 0; i < half; ++i) {
            const float a = v[i], b = v[i + half];
            const float c = cr[i], s = sign * sr[i];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
          }
        }
      });
}

// out = silu(gate) * up, silu(g) = g * sigmoid(g). gate and up are column blocks of rows of width
// ld_in (the fused gate/up projection's output); out (N, F) dense.
template <class ExecSpace = Exec>
void swiglu_forward(float* out, const float* gate, const float* up, int ld_in, int64_t N, int F) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::swiglu_forward<ExecSpace>(out, gate, up, ld_in, N, F);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::swiglu_forward", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* g = gate + n * ld_in;
        const float* u = up + n * ld_in;
        float* o = out + n * F;
        for (int j = 0; j < F; ++j) o[j] = g[j] * sigmoid(g[j]) * u[j];
      });
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate); silu'(g) = s (1 + g (1 - s)),
// s = sigmoid(g). dgate and dup are column blocks of rows of width ld_in, like gate and up.
template <class ExecSpace = Exec>
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int ld_in, int64_t N, int F) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::swiglu_backward<ExecSpace>(dgate, dup, dout, gate, up, ld_in, N, F);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::swiglu_backward", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* g = gate + n * ld_in;
        const float* u = up + n * ld_in;
        const float* d = dout + n * F;
        float* dg = dgate + n * ld_in;
        float* du = dup + n * ld_in;
        for (int j = 0; j < F; ++j) {
          const float s = sigmoid(g[j]);
          const float silu = g[j] * s;
          dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
          du[j] = d[j] * silu;
        }
      });
}

// Grouped-query attention's sharing: qkv_gqa rows hold Q (H heads), K (KV heads), V (KV heads),
// each head hs columns, so a row is (H + 2 KV) hs wide; qkv rows (B*T, 3 H hs) get Q as is and
// query head h's K and V from KV head h / (H / KV). H % KV == 0.
template <class ExecSpace = Exec>
void gqa_expand(float* qkv, const float* qkv_gqa, int64_t N, int H, int KV, int hs) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::gqa_expand<ExecSpace>(qkv, qkv_gqa, N, H, KV, hs);
    return;
  }
  const int group = H / KV, C = H * hs, row_in = (H + 2 * KV) * hs;
  for_each<ExecSpace>(
      "colossal::core::gqa_expand", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* src = qkv_gqa + n * row_in;
        float* dst = qkv + n * 3 * C;
        for (int c = 0; c < C; ++c) dst[c] = src[c];
        for (int h = 0; h < H; ++h) {
          const float* k = src + C + (h / group) * hs;
          const float* v = src + C + KV * hs + (h / group) * hs;
          for (int i = 0; i < hs; ++i) {
            dst[C + h * hs + i] = k[i];
            dst[2 * C + h * hs + i] = v[i];
          }
        }
      });
}

// The transpose of gqa_expand: dqkv_gqa (assigned) gets dQ as is and, for each KV head, the sum
// of dK and dV over its group of query heads, in head order.
template <class ExecSpace = Exec>
void gqa_reduce(float* dqkv_gqa, const float* dqkv, int64_t N, int H, int KV, int hs) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/llama_kernels_team.hpp)
    team::gqa_reduce<ExecSpace>(dqkv_gqa, dqkv, N, H, KV, hs);
    return;
  }
  const int group = H / KV, C = H * hs, row_out = (H + 2 * KV) * hs;
  for_each<ExecSpace>(
      "colossal::core::gqa_reduce", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        const float* src = dqkv + n * 3 * C;
        float* dst = dqkv_gqa + n * row_out;
        for (int c = 0; c < C; ++c) dst[c] = src[c];
        for (int kv = 0; kv < KV; ++kv) {
          float* dk = dst + C + kv * hs;
          float* dv = dst + C + KV * hs + kv * hs;
          for (int i = 0; i < hs; ++i) {
            float sk = 0.0f, sv = 0.0f;
            for (int g = 0; g < group; ++g) {
              const int h = kv * group + g;
              sk += src[C + h * hs + i];
              sv += src[2 * C + h * hs + i];
            }
            dk[i] = sk;
            dv[i] = sv;
          }
        }
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void rmsnorm_forward<Kokkos::Cuda, float>(float* out, float* rstd,
                                                                   const float* inp,
                                                                   const float* weight, int64_t N,
                                                                   int C, float eps);
COLOSSAL_DEVICE_INSTANCE void rmsnorm_forward<Kokkos::Cuda, std::uint16_t>(std::uint16_t* out,
                                                                           float* rstd,
                                                                           const float* inp,
                                                                           const float* weight,
                                                                           int64_t N, int C,
                                                                           float eps);
COLOSSAL_DEVICE_INSTANCE void rmsnorm_backward<Kokkos::Cuda>(float* dinp, float* dweight,
                                                             const float* dout, const float* inp,
                                                             const float* weight, const float* rstd,
                                                             int64_t N, int C);
COLOSSAL_DEVICE_INSTANCE void rope_rotate<Kokkos::Cuda>(float* x, int64_t B, int Tl, int ld,
                                                        int col0, int heads, int hs, int pos0,
                                                        const float* cos_table,
                                                        const float* sin_table, bool inverse);
COLOSSAL_DEVICE_INSTANCE void swiglu_forward<Kokkos::Cuda>(float* out, const float* gate,
                                                           const float* up, int ld_in, int64_t N,
                                                           int F);
COLOSSAL_DEVICE_INSTANCE void swiglu_backward<Kokkos::Cuda>(float* dgate, float* dup,
                                                            const float* dout, const float* gate,
                                                            const float* up, int ld_in, int64_t N,
                                                            int F);
COLOSSAL_DEVICE_INSTANCE void gqa_expand<Kokkos::Cuda>(float* qkv, const float* qkv_gqa, int64_t N,
                                                       int H, int KV, int hs);
COLOSSAL_DEVICE_INSTANCE void gqa_reduce<Kokkos::Cuda>(float* dqkv_gqa, const float* dqkv,
                                                       int64_t N, int H, int KV, int hs);
#endif

}  // namespace colossal::core::kernels
