// Device forms of the LLaMA kernels of core/llama_kernels.hpp, in the shapes of
// core/kernels_team.hpp: RMSNorm's rows are one team each (TeamThreadRange reductions), its weight
// gradient a column reduction (team::column_sums), and the element-wise kernels (RoPE, SwiGLU,
// GQA's expand and reduce) one work item per element (per rotated pair for RoPE) instead of one
// per row, so that consecutive threads touch consecutive addresses. The same arguments, shapes
// and accumulation rules as the host kernels (docs/device-kernels.md): rmsnorm_backward's dinp
// and dweight accumulate, everything else assigns.
//
// Results do not depend on the team size except for the order of additions inside RMSNorm's row
// reductions (within float rounding); the weight gradient adds in an order fixed by N alone, and
// gqa_reduce adds each group in head order, as the host does (bitwise the host's result).
#pragma once

#include <cstdint>

#include "core/bf16.hpp"
#include "core/fast_math.hpp"
#include "core/kernels_team.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::core::team {

// out = inp * rstd * weight per row, rstd = 1 / sqrt(mean(inp^2) + eps), saved for backward. Out
// is float, or std::uint16_t for the output's bf16 patterns.
template <class ExecSpace = Kokkos::DefaultExecutionSpace, class Out = float>
void rmsnorm_forward(Out* out,            // (N,C)
                     float* rstd,         // (N)
                     const float* inp,    // (N,C)
                     const float* weight, // (C)
                     int64_t N, int C, float eps, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_rmsnorm_forward", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* x = inp + n * C;
        float ms = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C), [&](int c, float& acc) { acc += x[c] * x[c]; }, ms);
        ms /= C;
        const float s = 1.0f / kmath::sqrt(ms + eps);
        Out* o = out + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                             [&](int c) { store_output(o[c], x[c] * s * weight[c]); });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd[n] = s; });
      });
}

// The term column_sums adds for the RMSNorm weight gradient: dout * inp * rstd at (n, c). A
// functor, not a lambda, for the reason given at LayernormParamTerms.
struct RmsnormWeightTerms {
  const float* dout;
  const float* inp;
  const float* rstd;
  int C;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t n, int c, float* v) const {
    v[0] = dout[n * C + c] * inp[n * C + c] * rstd[n];
  }
};

// dinp += RMSNorm input gradient (residual stream); dweight += sum_n dout * inp * rstd.
// With g = dout * weight: dinp = rstd * g - inp * rstd^3 * mean(g * inp).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void rmsnorm_backward(float* dinp,         // (N,C), accumulated
                      float* dweight,      // (C)
                      const float* dout,   // (N,C)
                      const float* inp,    // (N,C)
                      const float* weight, // (C)
                      const float* rstd,   // (N)
                      int64_t N, int C, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_rmsnorm_backward_input", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        const float s = rstd[n];
        float gx_mean = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C),
            [&](int c, float& acc) { acc += d[c] * weight[c] * x[c]; }, gx_mean);
        gx_mean /= C;
        const float s3 = s * s * s;
        float* di = dinp + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int c) {
          di[c] += s * d[c] * weight[c] - x[c] * s3 * gx_mean;
        });
      });
  column_sums<ExecSpace, 1>("colossal::core::team_rmsnorm_backward_weight", dweight, nullptr, N, C,
                            team_size, RmsnormWeightTerms{dout, inp, rstd, C});
}

// RoPE in place, as kernels::rope_rotate: one work item per rotated pair (row, head, i), so
// consecutive items read and write consecutive columns of a head's two halves and of the tables.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void rope_rotate(float* x, int64_t B, int Tl, int ld, int col0, int heads, int hs, int pos0,
                 const float* cos_table, const float* sin_table, bool inverse) {
  const int half = hs / 2;
  const int pairs = heads * half;  // per row
  const float sign = inverse ? -1.0f : 1.0f;
  Kokkos::parallel_for(
      "colossal::core::team_rope_rotate", Kokkos::RangePolicy<ExecSpace>(0, B * Tl * pairs),
      KOKKOS_LAMBDA(int64_t e) {
        const int64_t row = e / pairs;
        const int p = static_cast<int>(e % pairs);
        const int h = p / half, i = p % half;
        const int64_t t = int64_t(pos0 + int(row % Tl)) * half + i;
        float* v = x + row * ld + col0 + h * hs;
        const float a = v[i], b = v[i + half];
        const float c = cos_table[t], s = sign * sin_table[t];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      });
}

// out = silu(gate) * up, one work item per element; gate and up rows ld_in apart, out (N, F).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void swiglu_forward(float* out, const float* gate, const float* up, int ld_in, int64_t N, int F) {
  Kokkos::parallel_for(
      "colossal::core::team_swiglu_forward", Kokkos::RangePolicy<ExecSpace>(0, N * F),
      KOKKOS_LAMBDA(int64_t e) {
        const int64_t k = (e / F) * ld_in + e % F;
        const float g = gate[k];
        out[e] = g * kernels::sigmoid(g) * up[k];
      });
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate), one work item per element.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int ld_in, int64_t N, int F) {
  Kokkos::parallel_for(
      "colossal::core::team_swiglu_backward", Kokkos::RangePolicy<ExecSpace>(0, N * F),
      KOKKOS_LAMBDA(int64_t e) {
        const int64_t k = (e / F) * ld_in + e % F;
        const float g = gate[k], u = up[k], d = dout[e];
        const float s = kernels::sigmoid(g);
        const float silu = g * s;
        dgate[k] = d * u * s * (1.0f + g * (1.0f - s));
        dup[k] = d * silu;
      });
}

// qkv (N, 3C) from qkv_gqa (N, (H + 2 KV) hs), one work item per element of qkv: Q as is, query
// head h's K and V from KV head h / (H / KV).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void gqa_expand(float* qkv, const float* qkv_gqa, int64_t N, int H, int KV, int hs) {
  const int group = H / KV, C = H * hs, row_in = (H + 2 * KV) * hs;
  Kokkos::parallel_for(
      "colossal::core::team_gqa_expand", Kokkos::RangePolicy<ExecSpace>(0, N * 3 * C),
      KOKKOS_LAMBDA(int64_t e) {
        const int64_t n = e / (3 * C);
        const int c = static_cast<int>(e % (3 * C));
        int from = c;  // Q
        if (c >= C) {
          const int part = c / C;  // 1: K, 2: V
          const int h = (c - part * C) / hs, i = (c - part * C) % hs;
          from = C + (part - 1) * KV * hs + (h / group) * hs + i;
        }
        qkv[e] = qkv_gqa[n * row_in + from];
      });
}

// The transpose of gqa_expand, one work item per element of dqkv_gqa (assigned): dQ as is, each
// KV head's dK and dV summed over its group of query heads in head order, as the host does.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void gqa_reduce(float* dqkv_gqa, const float* dqkv, int64_t N, int H, int KV, int hs) {
  const int group = H / KV, C = H * hs, row_out = (H + 2 * KV) * hs;
  Kokkos::parallel_for(
      "colossal::core::team_gqa_reduce", Kokkos::RangePolicy<ExecSpace>(0, N * row_out),
      KOKKOS_LAMBDA(int64_t e) {
        const int64_t n = e / row_out;
        const int c = static_cast<int>(e % row_out);
        const float* src = dqkv + n * 3 * C;
        if (c < C) {
          dqkv_gqa[e] = src[c];
          return;
        }
        const int part = (c - C) / (KV * hs);  // 0: K, 1: V
        const int r = (c - C) % (KV * hs);
        const float* heads = src + (1 + part) * C + (r / hs) * group * hs + r % hs;
        float sum = 0.0f;
        for (int g = 0; g < group; ++g) sum += heads[g * hs];
        dqkv_gqa[e] = sum;
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void rmsnorm_forward<Kokkos::Cuda, float>(float* out, float* rstd,
                                                                   const float* inp,
                                                                   const float* weight, int64_t N,
                                                                   int C, float eps,
                                                                   int team_size);
COLOSSAL_DEVICE_INSTANCE void rmsnorm_forward<Kokkos::Cuda, std::uint16_t>(
    std::uint16_t* out, float* rstd, const float* inp, const float* weight, int64_t N, int C,
    float eps, int team_size);
COLOSSAL_DEVICE_INSTANCE void rmsnorm_backward<Kokkos::Cuda>(float* dinp, float* dweight,
                                                             const float* dout, const float* inp,
                                                             const float* weight, const float* rstd,
                                                             int64_t N, int C, int team_size);
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

}  // namespace colossal::core::team
