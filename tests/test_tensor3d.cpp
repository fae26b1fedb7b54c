// 3D tensor parallelism's linear layer (core/tensor3d.hpp) on a 2 x 2 x 2 cube of MPI ranks:
// forward and backward blocks against the dense products, the bytes each group moves against the
// closed forms in the header, and two linears in a row with the input and output groups swapped
// (the second consumes the first's output in place).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>

#include "core/gemm.hpp"
#include "core/tensor3d.hpp"
#include "grad_check.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/tensor_group.hpp"

using namespace colossal;
using colossal::test::dense_product;
using colossal::test::random_vector;

namespace {

// World rank = (i q + j) q + l; skips unless the world size is a cube > 1.
struct CubeFixture {
  parallel::MpiCommunicator world{MPI_COMM_WORLD};
  int q = 0, i = 0, j = 0, l = 0;
  std::unique_ptr<parallel::Communicator> input_comm, weight_comm, output_comm;
  std::unique_ptr<parallel::CommunicatorGroup> input, weight, output;
  bool init() {
    q = int(std::lround(std::cbrt(double(world.size()))));
    if (q < 2 || q * q * q != world.size()) return false;
    i = world.rank() / (q * q);
    j = world.rank() / q % q;
    l = world.rank() % q;
    input_comm = world.split(i * q + l, j);
    weight_comm = world.split(j * q + l, i);
    output_comm = world.split(i * q + j, l);
    input = std::make_unique<parallel::CommunicatorGroup>(*input_comm);
    weight = std::make_unique<parallel::CommunicatorGroup>(*weight_comm);
    output = std::make_unique<parallel::CommunicatorGroup>(*output_comm);
    return true;
  }
  void reset() {
    input_comm->reset_stats();
    weight_comm->reset_stats();
    output_comm->reset_stats();
  }
};

// Rows [r0, r0 + nr), columns [c0, c0 + nc) of a row-major matrix with `cols` columns.
std::vector<float> sub(const std::vector<float>& X, int64_t cols, int64_t r0, int64_t nr,
                       int64_t c0, int64_t nc) {
  std::vector<float> out(nr * nc);
  for (int64_t a = 0; a < nr; ++a) {
    for (int64_t b = 0; b < nc; ++b) out[a * nc + b] = X[(r0 + a) * cols + c0 + b];
  }
  return out;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t e = 0; e < want.size(); ++e) {
    ASSERT_NEAR(got[e], want[e], 1e-5) << what << " " << e;
  }
}

}  // namespace

TEST(Tensor3D, LinearForwardAndBackwardMatchTheDenseProducts) {
  CubeFixture c;
  if (!c.init()) GTEST_SKIP() << "needs a cube number of ranks > 1";
  const int q = c.q;
  const int64_t q2 = q * q, M = 3 * q2, K = 2 * q2, N = 5 * q2;
  auto gemm = core::make_host_gemm();
  const auto X = random_vector(M * K, 41), A = random_vector(K * N, 42),
             dY = random_vector(M * N, 43);
  // This rank's blocks in the header's layouts.
  const auto Xb = sub(X, K, (c.i * q + c.j) * (M / q2), M / q2, c.l * (K / q), K / q);
  const auto Ab = sub(A, N, c.l * (K / q), K / q, (c.j * q + c.i) * (N / q2), N / q2);
  const auto dYb = sub(dY, N, (c.i * q + c.l) * (M / q2), M / q2, c.j * (N / q), N / q);
  std::vector<float> work(core::linear3d_work_floats(M, N, K, q)), Y(M / q2 * (N / q)),
      dX(Xb.size()), dA(Ab.size());
  core::Cube3D cube{*c.input, *c.weight, *c.output};
  c.reset();
  core::linear3d_forward(*gemm, cube, Xb.data(), Ab.data(), Y.data(), M, N, K, work.data());
  expect_near(Y,
              sub(dense_product(X, false, A, false, M, N, K), N, (c.i * q + c.l) * (M / q2),
                  M / q2, c.j * (N / q), N / q),
              "Y");
  EXPECT_EQ(c.input_comm->stats().all_gather.payload_bytes, uint64_t(M * K / q2 * 4));
  EXPECT_EQ(c.weight_comm->stats().all_gather.payload_bytes, uint64_t(K * N / q2 * 4));
  EXPECT_EQ(c.output_comm->stats().reduce_scatter.payload_bytes, uint64_t(M * N / q2 * 4));
  c.reset();
  core::linear3d_backward(*gemm, cube, dYb.data(), Xb.data(), Ab.data(), dX.data(), dA.data(), M,
                          N, K, work.data());
  expect_near(dX,
              sub(dense_product(dY, false, A, true, M, K, N), K, (c.i * q + c.j) * (M / q2),
                  M / q2, c.l * (K / q), K / q),
              "dX");
  expect_near(dA, sub(dense_product(X, true, dY, false, K, N, M), N, c.l * (K / q), K / q,
                      (c.j * q + c.i) * (N / q2), N / q2),
              "dA");
  EXPECT_EQ(c.output_comm->stats().all_gather.payload_bytes, uint64_t(M * N / q2 * 4));
  EXPECT_EQ(c.input_comm->stats().reduce_scatter.payload_bytes, uint64_t(M * K / q2 * 4));
  EXPECT_EQ(c.weight_comm->stats().reduce_scatter.payload_bytes, uint64_t(K * N / q2 * 4));
}

// Y = X A then Z = Y B: Y comes out with rows by (i, l) and columns by j, which is the input
// layout of a cube whose input and output groups are exchanged, so B is laid out with l and j
// exchanged too and Y needs no redistribution.
TEST(Tensor3D, ConsecutiveLinearsAlternateTheInputAndOutputGroups) {
  CubeFixture c;
  if (!c.init()) GTEST_SKIP() << "needs a cube number of ranks > 1";
  const int q = c.q;
  const int64_t q2 = q * q, M = 2 * q2, K = q2, N = 3 * q2, P = q2;
  auto gemm = core::make_host_gemm();
  const auto X = random_vector(M * K, 51), A = random_vector(K * N, 52),
             B = random_vector(N * P, 53);
  const auto Xb = sub(X, K, (c.i * q + c.j) * (M / q2), M / q2, c.l * (K / q), K / q);
  const auto Ab = sub(A, N, c.l * (K / q), K / q, (c.j * q + c.i) * (N / q2), N / q2);
  // Second linear in the swapped cube: its "l" is our j, its "j" our l.
  const auto Bb = sub(B, P, c.j * (N / q), N / q, (c.l * q + c.i) * (P / q2), P / q2);
  std::vector<float> work(std::max(core::linear3d_work_floats(M, N, K, q),
                                   core::linear3d_work_floats(M, P, N, q))),
      Y(M / q2 * (N / q)), Z(M / q2 * (P / q));
  core::Cube3D first{*c.input, *c.weight, *c.output}, second{*c.output, *c.weight, *c.input};
  core::linear3d_forward(*gemm, first, Xb.data(), Ab.data(), Y.data(), M, N, K, work.data());
  core::linear3d_forward(*gemm, second, Y.data(), Bb.data(), Z.data(), M, P, N, work.data());
  const auto dense =
      dense_product(dense_product(X, false, A, false, M, N, K), false, B, false, M, P, N);
  expect_near(Z, sub(dense, P, (c.i * q + c.j) * (M / q2), M / q2, c.l * (P / q), P / q), "Z");
}
