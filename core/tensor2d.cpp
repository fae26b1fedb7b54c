#include "core/tensor2d.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/gemm.hpp"
#include "core/grid_kernels_team.hpp"
#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/profiler.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

int Grid2D::q() const { return row.size(); }
int Grid2D::i() const { return col.rank(); }
int Grid2D::j() const { return row.rank(); }

namespace {

void check_blocks(const Grid2D& grid, int64_t M, int64_t N, int64_t K) {
  const int q = grid.q();
  if (grid.col.size() != q) {
    throw std::invalid_argument("2D grid: row group of " + std::to_string(q) +
                                " ranks but column group of " + std::to_string(grid.col.size()));
  }
  if (M % q != 0 || N % q != 0 || K % q != 0) {
    throw std::invalid_argument("2D grid of " + std::to_string(q) + " x " + std::to_string(q) +
                                ": sizes " + std::to_string(M) + ", " + std::to_string(N) + ", " +
                                std::to_string(K) + " must be multiples of " + std::to_string(q));
  }
}

}  // namespace

std::size_t summa_work_floats(int64_t M, int64_t N, int64_t K, int q) {
  const std::size_t m = M / q, n = N / q, k = K / q, Q = q;
  const std::size_t ab = m * k + k * n;
  const std::size_t abt = Q * n * k + Q * m * n;
  const std::size_t atb = Q * k * m + Q * m * n;
  return std::max({ab, abt, atb});
}

void summa_ab(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
              int64_t N, int64_t K, float* work) {
  check_blocks(grid, M, N, K);
  const int q = grid.q();
  const int64_t m = M / q, n = N / q, k = K / q;
  float* a = work;
  float* b = work + m * k;
  for (int t = 0; t < q; ++t) {
    if (grid.j() == t) kernels::copy(a, A, m * k);
    if (grid.i() == t) kernels::copy(b, B, k * n);
    fence_kernels();
    grid.row.broadcast(a, std::size_t(m * k), t);
    grid.col.broadcast(b, std::size_t(k * n), t);
    gemm.gemm(Trans::N, Trans::N, m, n, k, 1.0f, a, k, b, n, t == 0 ? 0.0f : 1.0f, C, n);
  }
}

void summa_abt(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
               int64_t N, int64_t K, float* work) {
  check_blocks(grid, M, N, K);
  const int q = grid.q();
  const int64_t m = M / q, n = N / q, k = K / q;
  float* column_of_b = work;            // q blocks n x k: B_0j .. B_(q-1)j
  float* partials = work + q * n * k;   // q blocks m x n: A_ij B_tj^T
  grid.col.all_gather(B, std::size_t(n * k), column_of_b);
  for (int t = 0; t < q; ++t) {
    gemm.gemm(Trans::N, Trans::T, m, n, k, 1.0f, A, k, column_of_b + t * n * k, k, 0.0f,
              partials + t * m * n, n);
  }
  fence_kernels();
  grid.row.reduce_scatter(partials, std::size_t(q * m * n), C);
}

void summa_atb(Gemm& gemm, Grid2D& grid, const float* A, const float* B, float* C, int64_t M,
               int64_t N, int64_t K, float* work) {
  check_blocks(grid, M, N, K);
  const int q = grid.q();
  const int64_t m = M / q, n = N / q, k = K / q;
  float* row_of_a = work;               // q blocks k x m: A_k0 .. A_k(q-1)
  float* partials = work + q * k * m;   // q blocks m x n: A_km^T B_kl
  grid.row.all_gather(A, std::size_t(k * m), row_of_a);
  for (int t = 0; t < q; ++t) {
    gemm.gemm(Trans::T, Trans::N, m, n, k, 1.0f, row_of_a + t * k * m, m, B, n, 0.0f,
              partials + t * m * n, n);
  }
  fence_kernels();
  grid.col.reduce_scatter(partials, std::size_t(q * m * n), C);
}

void tesseract_weight_grad(Gemm& gemm, Grid2D& layer, TensorGroup& depth, const float* X,
                           const float* dY, float* dW, int64_t rows, int64_t in, int64_t out,
                           float* work) {
  summa_atb(gemm, layer, X, dY, dW, /*M=*/in, /*N=*/out, /*K=*/rows, work);
  const int q = layer.q();
  depth.all_reduce_sum(dW, std::size_t(in / q * (out / q)));
}

void layernorm2d_forward(Grid2D& grid, float* out, float* mean, float* rstd, const float* x,
                         const float* weight, const float* bias, int64_t rows, int64_t cols,
                         float eps, float* work) {
  check_blocks(grid, rows, cols, grid.q());
  layernorm_split_forward(grid.row, out, mean, rstd, x, weight, bias, rows / grid.q(),
                          cols / grid.q(), cols, eps, work);
}

namespace {

// The split layernorm's passes, each in the team form (core/grid_kernels_team.hpp) where the
// kernels run in teams, else one work item per row; the callers put the collectives between.
// sums[n] <- the sum of row n's c elements.
void split_row_sums(float* sums, const float* x, int64_t r, int64_t c) {
  if constexpr (team_kernels_v<kernels::Exec>) {
    team::layernorm_split_row_sums<kernels::Exec>(sums, x, r, int(c));
  } else {
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_row_sums", Kokkos::RangePolicy<>(0, r),
        KOKKOS_LAMBDA(int64_t n) {
          float s = 0.0f;
          for (int64_t e = 0; e < c; ++e) s += x[n * c + e];
          sums[n] = s;
        });
  }
}

// mean[n] <- sums[n] / cols; sums[n] <- the sum of row n's squared deviations from it.
void split_row_squares(float* sums, float* mean, const float* x, int64_t r, int64_t c,
                       float inv_cols) {
  if constexpr (team_kernels_v<kernels::Exec>) {
    team::layernorm_split_row_squares<kernels::Exec>(sums, mean, x, r, int(c), inv_cols);
  } else {
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_row_squares", Kokkos::RangePolicy<>(0, r),
        KOKKOS_LAMBDA(int64_t n) {
          const float m = sums[n] * inv_cols;
          mean[n] = m;
          float v = 0.0f;
          for (int64_t e = 0; e < c; ++e) v += (x[n * c + e] - m) * (x[n * c + e] - m);
          sums[n] = v;
        });
  }
}

void split_normalize(float* out, float* rstd, const float* x, const float* mean,
                     const float* sums, const float* weight, const float* bias, int64_t r,
                     int64_t c, float inv_cols, float eps) {
  if constexpr (team_kernels_v<kernels::Exec>) {
    team::layernorm_split_normalize<kernels::Exec>(out, rstd, x, mean, sums, weight, bias, r,
                                                   int(c), inv_cols, eps);
  } else {
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_normalize", Kokkos::RangePolicy<>(0, r),
        KOKKOS_LAMBDA(int64_t n) {
          const float s = 1.0f / kmath::sqrt(sums[n] * inv_cols + eps);
          rstd[n] = s;
          for (int64_t e = 0; e < c; ++e) {
            out[n * c + e] = (x[n * c + e] - mean[n]) * s * weight[e] + bias[e];
          }
        });
  }
}

// sums[n] <- the sum of row n's dnorm (dout * weight), sums[r + n] <- of dnorm * xhat.
void split_backward_sums(float* sums, const float* dout, const float* x, const float* weight,
                         const float* mean, const float* rstd, int64_t r, int64_t c) {
  if constexpr (team_kernels_v<kernels::Exec>) {
    team::layernorm_split_backward_sums<kernels::Exec>(sums, dout, x, weight, mean, rstd, r,
                                                       int(c));
  } else {
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_backward_sums", Kokkos::RangePolicy<>(0, r),
        KOKKOS_LAMBDA(int64_t n) {
          float a = 0.0f, b = 0.0f;
          for (int64_t e = 0; e < c; ++e) {
            const float dnorm = dout[n * c + e] * weight[e];
            a += dnorm;
            b += dnorm * (x[n * c + e] - mean[n]) * rstd[n];
          }
          sums[n] = a;
          sums[r + n] = b;
        });
  }
}

// dx += the input gradient from the summed rows; dweight, dbias += this block's columns'.
void split_backward_finish(float* dx, float* dweight, float* dbias, const float* sums,
                           const float* dout, const float* x, const float* weight,
                           const float* mean, const float* rstd, int64_t r, int64_t c,
                           float inv_cols) {
  if constexpr (team_kernels_v<kernels::Exec>) {
    team::layernorm_split_backward_finish<kernels::Exec>(dx, dweight, dbias, sums, dout, x, weight,
                                                         mean, rstd, r, int(c), inv_cols);
  } else {
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_backward_input", Kokkos::RangePolicy<>(0, r),
        KOKKOS_LAMBDA(int64_t n) {
          const float s = rstd[n], a = sums[n] * inv_cols, b = sums[r + n] * inv_cols;
          for (int64_t e = 0; e < c; ++e) {
            const float xhat = (x[n * c + e] - mean[n]) * s;
            dx[n * c + e] += s * (dout[n * c + e] * weight[e] - a - xhat * b);
          }
        });
    // One work item per column: no two write the same parameter gradient.
    Kokkos::parallel_for(
        "colossal::core::layernorm2d_backward_params", Kokkos::RangePolicy<>(0, c),
        KOKKOS_LAMBDA(int64_t e) {
          float dw = 0.0f, db = 0.0f;
          for (int64_t n = 0; n < r; ++n) {
            const float d = dout[n * c + e];
            dw += d * (x[n * c + e] - mean[n]) * rstd[n];
            db += d;
          }
          dweight[e] += dw;
          dbias[e] += db;
        });
  }
}

}  // namespace

void layernorm_split_forward(TensorGroup& across, float* out, float* mean, float* rstd,
                             const float* x, const float* weight, const float* bias, int64_t r,
                             int64_t c, int64_t cols, float eps, float* work) {
  const float inv_cols = 1.0f / float(cols);
  float* sums = work;
  split_row_sums(sums, x, r, c);
  fence_kernels();
  across.all_reduce_sum(sums, std::size_t(r));
  split_row_squares(sums, mean, x, r, c, inv_cols);
  fence_kernels();
  across.all_reduce_sum(sums, std::size_t(r));
  split_normalize(out, rstd, x, mean, sums, weight, bias, r, c, inv_cols, eps);
  fence_kernels();
}

void layernorm2d_backward(Grid2D& grid, float* dx, float* dweight, float* dbias, const float* dout,
                          const float* x, const float* weight, const float* mean,
                          const float* rstd, int64_t rows, int64_t cols, float* work) {
  check_blocks(grid, rows, cols, grid.q());
  layernorm_split_backward(grid.row, dx, dweight, dbias, dout, x, weight, mean, rstd,
                           rows / grid.q(), cols / grid.q(), cols, work);
}

void layernorm_split_backward(TensorGroup& across, float* dx, float* dweight, float* dbias,
                              const float* dout, const float* x, const float* weight,
                              const float* mean, const float* rstd, int64_t r, int64_t c,
                              int64_t cols, float* work) {
  const float inv_cols = 1.0f / float(cols);
  float* sums = work;  // r sums of dnorm, then r sums of dnorm * xhat (dnorm = dout * weight)
  split_backward_sums(sums, dout, x, weight, mean, rstd, r, c);
  fence_kernels();
  across.all_reduce_sum(sums, std::size_t(2 * r));
  split_backward_finish(dx, dweight, dbias, sums, dout, x, weight, mean, rstd, r, c, inv_cols);
  fence_kernels();
}

void vocab_parallel_cross_entropy(TensorGroup& group, float* logits, float* losses,
                                  const int32_t* targets, int64_t n, int ld, int valid, int64_t v0,
                                  float grad_scale, float* work, Profiler* profiler) {
  float* mx = work;
  float* sums = work + n;  // n sums of exponentials, then n target logits
  {
    Profiler::Scope scope(profiler, WorkKind::loss);
    kernels::vocab_parallel_row_max(mx, logits, n, ld, valid);
  }
  {
    Profiler::Scope scope(profiler, WorkKind::communication);
    fence_kernels();  // the collective reads what the kernel wrote
    group.all_reduce_max(mx, std::size_t(n));
  }
  {
    Profiler::Scope scope(profiler, WorkKind::loss);
    kernels::vocab_parallel_sums(sums, logits, mx, targets, n, ld, valid, v0);
  }
  {
    Profiler::Scope scope(profiler, WorkKind::communication);
    fence_kernels();
    group.all_reduce_sum(sums, std::size_t(2 * n));
  }
  Profiler::Scope scope(profiler, WorkKind::loss);
  kernels::vocab_parallel_finish(logits, losses, mx, sums, targets, n, ld, valid, v0, grad_scale);
  fence_kernels();
}

}  // namespace colossal::core
