#include "core/tensor3d.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/gemm.hpp"
#include "core/kokkos_compat.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

int Cube3D::q() const { return input.size(); }

namespace {

void check_cube(const Cube3D& cube, int64_t M, int64_t N, int64_t K) {
  const int q = cube.q();
  if (cube.weight.size() != q || cube.output.size() != q) {
    throw std::invalid_argument("3D cube: groups of " + std::to_string(cube.input.size()) + ", " +
                                std::to_string(cube.weight.size()) + " and " +
                                std::to_string(cube.output.size()) + " ranks must be equal");
  }
  const int64_t q2 = int64_t(q) * q;
  if (M % q2 != 0 || N % q2 != 0 || K % q != 0) {
    throw std::invalid_argument("3D cube of " + std::to_string(q) + "^3: M = " + std::to_string(M) +
                                " and N = " + std::to_string(N) + " must be multiples of " +
                                std::to_string(q2) + ", K = " + std::to_string(K) + " of " +
                                std::to_string(q));
  }
}

}  // namespace

std::size_t linear3d_work_floats(int64_t M, int64_t N, int64_t K, int q) {
  const std::size_t m = M / q, n = N / q, k = K / q;
  // X_il and A_lj gathered, then the partial product (forward), or dY_ij and one partial at a
  // time (backward: dX_il, then dA_lj).
  return m * k + k * n + m * n + std::max(m * k, k * n);
}

void linear3d_forward(Gemm& gemm, Cube3D& cube, const float* X, const float* A, float* Y,
                      int64_t M, int64_t N, int64_t K, float* work) {
  check_cube(cube, M, N, K);
  const int q = cube.q();
  const int64_t m = M / q, n = N / q, k = K / q, nq = n / q;
  float* x = work;           // X_il: M/q x K/q
  float* a = x + m * k;      // A_lj: q column blocks A_lji', each K/q x N/q^2
  float* p = a + k * n;      // X_il A_lj: M/q x N/q
  cube.input.all_gather(X, std::size_t(m / q * k), x);
  cube.weight.all_gather(A, std::size_t(k * nq), a);
  for (int c = 0; c < q; ++c) {
    gemm.gemm(Trans::N, Trans::N, m, nq, k, 1.0f, x, k, a + c * k * nq, nq, 0.0f, p + c * nq, n);
  }
  fence_kernels();
  cube.output.reduce_scatter(p, std::size_t(m * n), Y);
}

void linear3d_backward(Gemm& gemm, Cube3D& cube, const float* dY, const float* X, const float* A,
                       float* dX, float* dA, int64_t M, int64_t N, int64_t K, float* work) {
  check_cube(cube, M, N, K);
  const int q = cube.q();
  const int64_t m = M / q, n = N / q, k = K / q, nq = n / q;
  float* x = work;
  float* a = x + m * k;
  float* dy = a + k * n;     // dY_ij: M/q x N/q
  float* part = dy + m * n;  // dX_il partial (M/q x K/q), then dA_lj as q blocks K/q x N/q^2
  cube.input.all_gather(X, std::size_t(m / q * k), x);
  cube.weight.all_gather(A, std::size_t(k * nq), a);
  cube.output.all_gather(dY, std::size_t(m / q * n), dy);
  for (int c = 0; c < q; ++c) {  // dX_il = sum_c dY_ij[:, block c] A_ljc^T
    gemm.gemm(Trans::N, Trans::T, m, k, nq, 1.0f, dy + c * nq, n, a + c * k * nq, nq,
              c == 0 ? 0.0f : 1.0f, part, k);
  }
  fence_kernels();
  cube.input.reduce_scatter(part, std::size_t(m * k), dX);
  for (int c = 0; c < q; ++c) {  // dA_ljc = X_il^T dY_ij[:, block c]
    gemm.gemm(Trans::T, Trans::N, k, nq, m, 1.0f, x, k, dy + c * nq, n, 0.0f,
              part + c * k * nq, nq);
  }
  fence_kernels();
  cube.weight.reduce_scatter(part, std::size_t(k * n), dA);
}

}  // namespace colossal::core
