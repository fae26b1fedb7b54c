// Device forms of the grid modes' own kernels (2D, 2.5D and 3D tensor parallelism): the layernorm
// over split columns of core/tensor2d.cpp and the embedding blocks of core/model2d.cpp and
// core/model3d.cpp. Templated on the execution space like core/kernels_team.hpp, whose policies,
// column_sums and token-embedding backward they reuse; the host forms stay where they are and
// call these where the kernels take their device forms (team_kernels_v).
//
// Shapes: a rank holds r rows of c columns (leading dimension c) of a layout whose rows have
// `cols` columns in all; the row statistics are partial sums over this rank's columns, summed
// across the ranks that split the columns between the passes, exactly where the host form sums
// them. Results: the row passes are one team per row (TeamThreadRange reductions: the host's
// values within float rounding, bitwise with a team of one); the parameter gradients go through
// column_sums (an order fixed by r alone); the embedding kernels add in the host's order
// (bitwise the host's results).
#pragma once

#include <cstdint>

#include "core/kernels_team.hpp"

namespace colossal::core::team {

// ---------------------------------------------------------------------------------------------
// Layernorm over split columns: forward in three passes, backward in two (an all-reduce of the
// row sums over the column-splitting group after each but the last).

// sums[n] = sum_e x[n, e] over this rank's c columns.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_split_row_sums(float* sums,     // (r)
                              const float* x,  // (r, c)
                              int64_t r, int c, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_split_row_sums", policy<ExecSpace>(r, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* xr = x + n * c;
        float s = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, c), [&](int e, float& acc) { acc += xr[e]; }, s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { sums[n] = s; });
      });
}

// mean[n] = sums[n] / cols (the all-reduced row sum); then, in place, sums[n] = this rank's part
// of sum_e (x[n, e] - mean[n])^2.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_split_row_squares(float* sums,     // (r), in place
                                 float* mean,     // (r)
                                 const float* x,  // (r, c)
                                 int64_t r, int c, float inv_cols, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_split_row_squares", policy<ExecSpace>(r, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* xr = x + n * c;
        const float m = sums[n] * inv_cols;
        float v = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, c),
            [&](int e, float& acc) { acc += (xr[e] - m) * (xr[e] - m); }, v);
        team.team_barrier();  // every thread has read sums[n] before it is overwritten
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean[n] = m;
          sums[n] = v;
        });
      });
}

// rstd[n] = 1 / sqrt(sums[n] / cols + eps) (sums: the all-reduced squares); out = (x - mean)
// rstd weight + bias over this rank's columns.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_split_normalize(float* out,          // (r, c)
                               float* rstd,         // (r)
                               const float* x,      // (r, c)
                               const float* mean,   // (r)
                               const float* sums,   // (r)
                               const float* weight, // (c)
                               const float* bias,   // (c)
                               int64_t r, int c, float inv_cols, float eps, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_split_normalize", policy<ExecSpace>(r, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float s = 1.0f / kmath::sqrt(sums[n] * inv_cols + eps);
        const float m = mean[n];
        const float* xr = x + n * c;
        float* o = out + n * c;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c), [&](int e) {
          o[e] = (xr[e] - m) * s * weight[e] + bias[e];
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd[n] = s; });
      });
}

// sums[n] = sum_e dnorm[n, e] and sums[r + n] = sum_e dnorm[n, e] xhat[n, e] over this rank's
// columns, dnorm = dout * weight.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_split_backward_sums(float* sums,         // (2 r)
                                   const float* dout,   // (r, c)
                                   const float* x,      // (r, c)
                                   const float* weight, // (c)
                                   const float* mean,   // (r)
                                   const float* rstd,   // (r)
                                   int64_t r, int c, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_split_backward_sums", policy<ExecSpace>(r, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* xr = x + n * c;
        const float* d = dout + n * c;
        const float m = mean[n], s = rstd[n];
        float a = 0.0f, b = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, c), [&](int e, float& acc) { acc += d[e] * weight[e]; },
            a);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, c),
            [&](int e, float& acc) { acc += d[e] * weight[e] * (xr[e] - m) * s; }, b);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          sums[n] = a;
          sums[r + n] = b;
        });
      });
}

// dx += the input gradient from the all-reduced sums (one team per row); dweight += sum_n dout
// xhat and dbias += sum_n dout over this rank's rows (column_sums: a team per 32 columns and
// slab of rows, 16 fixed row groups).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_split_backward_finish(float* dx,           // (r, c), accumulated
                                     float* dweight,      // (c), accumulated
                                     float* dbias,        // (c), accumulated
                                     const float* sums,   // (2 r), all-reduced
                                     const float* dout,   // (r, c)
                                     const float* x,      // (r, c)
                                     const float* weight, // (c)
                                     const float* mean,   // (r)
                                     const float* rstd,   // (r)
                                     int64_t r, int c, float inv_cols, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_split_backward_input", policy<ExecSpace>(r, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float s = rstd[n], m = mean[n], a = sums[n] * inv_cols, b = sums[r + n] * inv_cols;
        const float* xr = x + n * c;
        const float* d = dout + n * c;
        float* di = dx + n * c;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c), [&](int e) {
          const float xhat = (xr[e] - m) * s;
          di[e] += s * (d[e] * weight[e] - a - xhat * b);
        });
      });
  column_sums<ExecSpace, 2>("colossal::core::team_layernorm_split_backward_params", dweight, dbias,
                            r, c, team_size, LayernormParamTerms{dout, x, mean, rstd, c});
}

// ---------------------------------------------------------------------------------------------
// Embedding blocks. A rank holds the token rows [v0, v0 + vb) and position rows [p0, p0 + pb)
// of the tables, c of their columns; element (row, s) of the token block sits at
// wte[row * row_stride + s * col_stride]: (c, 1) for 2D's row-major block (vb x c), (1, vb) for
// 3D's transposed one (c x vb). The position block is row-major (pb x c) in both.

// out[n, s] = the token row's and the position row's element s where this rank holds them, 0
// otherwise; one work item per element (consecutive items: consecutive columns of a row).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void grid_embedding_forward(float* out,             // (BT, c)
                            const int32_t* tokens,  // (BT)
                            const float* wte,       // the token block, strides as above
                            int64_t row_stride, int64_t col_stride,
                            const float* wpe,       // (pb, c)
                            int64_t BT, int T, int c, int64_t v0, int64_t vb, int64_t offset,
                            int64_t p0, int64_t pb) {
  Kokkos::parallel_for(
      "colossal::core::team_grid_embedding_forward", Kokkos::RangePolicy<ExecSpace>(0, BT * c),
      KOKKOS_LAMBDA(int64_t i) {
        const int64_t n = i / c, s = i % c;
        const int64_t tok = int64_t(tokens[n]) - v0, p = int64_t(n % T) + offset - p0;
        float v = 0.0f;  // the host's order: 0, + token, + position
        if (tok >= 0 && tok < vb) v += wte[tok * row_stride + s * col_stride];
        if (p >= 0 && p < pb) v += wpe[p * c + s];
        out[i] = v;
      });
}

// dwpe[p, s] += dout[b T + t, s] for every b, where t + offset - p0 = p: one work item per
// element of this rank's position block, adding over b in order (the host's order).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void grid_position_backward(float* dwpe,        // (pb, c), accumulated
                            const float* dout,  // (B T, c)
                            int B, int T, int c, int64_t offset, int64_t p0, int64_t pb) {
  Kokkos::parallel_for(
      "colossal::core::team_grid_position_backward", Kokkos::RangePolicy<ExecSpace>(0, pb * c),
      KOKKOS_LAMBDA(int64_t i) {
        const int64_t p = i / c, s = i % c;
        const int64_t t = p + p0 - offset;
        if (t < 0 || t >= T) return;
        float acc = dwpe[i];
        for (int b = 0; b < B; ++b) acc += dout[(int64_t(b) * T + t) * c + s];
        dwpe[i] = acc;
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void layernorm_split_row_sums<Kokkos::Cuda>(float* sums, const float* x,
                                                                     int64_t r, int c,
                                                                     int team_size);
COLOSSAL_DEVICE_INSTANCE void layernorm_split_row_squares<Kokkos::Cuda>(float* sums, float* mean,
                                                                        const float* x, int64_t r,
                                                                        int c, float inv_cols,
                                                                        int team_size);
COLOSSAL_DEVICE_INSTANCE void layernorm_split_normalize<Kokkos::Cuda>(
    float* out, float* rstd, const float* x, const float* mean, const float* sums,
    const float* weight, const float* bias, int64_t r, int c, float inv_cols, float eps,
    int team_size);
COLOSSAL_DEVICE_INSTANCE void layernorm_split_backward_sums<Kokkos::Cuda>(
    float* sums, const float* dout, const float* x, const float* weight, const float* mean,
    const float* rstd, int64_t r, int c, int team_size);
COLOSSAL_DEVICE_INSTANCE void layernorm_split_backward_finish<Kokkos::Cuda>(
    float* dx, float* dweight, float* dbias, const float* sums, const float* dout, const float* x,
    const float* weight, const float* mean, const float* rstd, int64_t r, int c, float inv_cols,
    int team_size);
COLOSSAL_DEVICE_INSTANCE void grid_embedding_forward<Kokkos::Cuda>(
    float* out, const int32_t* tokens, const float* wte, int64_t row_stride, int64_t col_stride,
    const float* wpe, int64_t BT, int T, int c, int64_t v0, int64_t vb, int64_t offset, int64_t p0,
    int64_t pb);
COLOSSAL_DEVICE_INSTANCE void grid_position_backward<Kokkos::Cuda>(float* dwpe, const float* dout,
                                                                   int B, int T, int c,
                                                                   int64_t offset, int64_t p0,
                                                                   int64_t pb);
#endif

}  // namespace colossal::core::team
