// 2D tensor parallelism's building blocks (core/tensor2d.hpp) on a q x q grid of MPI ranks (4 and
// 9), each against the dense single-rank result computed on every rank: SUMMA in its three
// transpose variants, the distributed layernorm forward and backward, and the vocabulary-parallel
// cross-entropy over the grid row; plus the floats each moves against the closed forms in the
// header. At 8 ranks, 2.5D (2 x 2 x 2): SUMMA per depth layer and the depth-summed weight
// gradient.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>

#include "core/gemm.hpp"
#include "core/kernels.hpp"
#include "core/tensor2d.hpp"
#include "grad_check.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/tensor_group.hpp"

using namespace colossal;
using colossal::test::dense_product;
using colossal::test::random_vector;

namespace {

// The world as a q x q grid, rank = i q + j; skips unless the world size is a square > 1.
struct GridFixture {
  parallel::MpiCommunicator world{MPI_COMM_WORLD};
  int q = 0, i = 0, j = 0;
  std::unique_ptr<parallel::Communicator> row_comm, col_comm;
  std::unique_ptr<parallel::CommunicatorGroup> row, col;
  std::unique_ptr<core::Grid2D> grid;
  bool init() {
    q = int(std::lround(std::sqrt(double(world.size()))));
    if (q < 2 || q * q != world.size()) return false;
    i = world.rank() / q;
    j = world.rank() % q;
    row_comm = world.split(/*color=*/i, /*key=*/j);
    col_comm = world.split(/*color=*/j, /*key=*/i);
    row = std::make_unique<parallel::CommunicatorGroup>(*row_comm);
    col = std::make_unique<parallel::CommunicatorGroup>(*col_comm);
    grid = std::make_unique<core::Grid2D>(core::Grid2D{*row, *col});
    return true;
  }
  void reset_stats() {
    row_comm->reset_stats();
    col_comm->reset_stats();
  }
};

// Block (bi, bj) of the q x q blocking of a row-major R x S matrix.
std::vector<float> block(const std::vector<float>& X, int64_t R, int64_t S, int q, int bi, int bj) {
  const int64_t r = R / q, s = S / q;
  std::vector<float> out(r * s);
  for (int64_t a = 0; a < r; ++a) {
    for (int64_t b = 0; b < s; ++b) out[a * s + b] = X[(bi * r + a) * S + bj * s + b];
  }
  return out;
}

void expect_block_near(const std::vector<float>& got, const std::vector<float>& dense, int64_t R,
                       int64_t S, int q, int bi, int bj, double tol, const char* what) {
  const std::vector<float> want = block(dense, R, S, q, bi, bj);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t e = 0; e < want.size(); ++e) {
    ASSERT_NEAR(got[e], want[e], tol) << what << " element " << e << " of block (" << bi << ", "
                                      << bj << ")";
  }
}

}  // namespace

TEST(Tensor2D, SummaProductsMatchTheDenseProductInEveryTransposeVariant) {
  GridFixture g;
  if (!g.init()) GTEST_SKIP() << "needs a square number of ranks > 1";
  auto gemm = core::make_host_gemm();
  const int q = g.q;
  const int64_t M = 6 * q, N = 4 * q, K = 5 * q;
  std::vector<float> work(core::summa_work_floats(M, N, K, q));
  const int64_t m = M / q, n = N / q, k = K / q;
  // C = A B: A (M x K), B (K x N).
  {
    const auto A = random_vector(M * K, 1), B = random_vector(K * N, 2);
    std::vector<float> C(m * n, 99.0f);
    g.reset_stats();
    core::summa_ab(*gemm, *g.grid, block(A, M, K, q, g.i, g.j).data(),
                   block(B, K, N, q, g.i, g.j).data(), C.data(), M, N, K, work.data());
    expect_block_near(C, dense_product(A, false, B, false, M, N, K), M, N, q, g.i, g.j, 1e-5, "AB");
    // q broadcasts of one block of A along the row and one block of B down the column.
    EXPECT_EQ(g.row_comm->stats().broadcast.payload_bytes, uint64_t(q * m * k * 4));
    EXPECT_EQ(g.col_comm->stats().broadcast.payload_bytes, uint64_t(q * k * n * 4));
    EXPECT_EQ(g.row_comm->stats().broadcast.calls + g.col_comm->stats().broadcast.calls,
              uint64_t(2 * q));
  }
  // C = A B^T: A (M x K), B (N x K) (the input gradient of a SUMMA product).
  {
    const auto A = random_vector(M * K, 3), B = random_vector(N * K, 4);
    std::vector<float> C(m * n, 99.0f);
    g.reset_stats();
    core::summa_abt(*gemm, *g.grid, block(A, M, K, q, g.i, g.j).data(),
                    block(B, N, K, q, g.i, g.j).data(), C.data(), M, N, K, work.data());
    expect_block_near(C, dense_product(A, false, B, true, M, N, K), M, N, q, g.i, g.j, 1e-5,
                      "AB^T");
    EXPECT_EQ(g.col_comm->stats().all_gather.payload_bytes, uint64_t(q * n * k * 4));
    EXPECT_EQ(g.row_comm->stats().reduce_scatter.payload_bytes, uint64_t(q * m * n * 4));
  }
  // C = A^T B: A (K x M), B (K x N) (the weight gradient).
  {
    const auto A = random_vector(K * M, 5), B = random_vector(K * N, 6);
    std::vector<float> C(m * n, 99.0f);
    g.reset_stats();
    core::summa_atb(*gemm, *g.grid, block(A, K, M, q, g.i, g.j).data(),
                    block(B, K, N, q, g.i, g.j).data(), C.data(), M, N, K, work.data());
    expect_block_near(C, dense_product(A, true, B, false, M, N, K), M, N, q, g.i, g.j, 1e-5,
                      "A^T B");
    EXPECT_EQ(g.row_comm->stats().all_gather.payload_bytes, uint64_t(q * k * m * 4));
    EXPECT_EQ(g.col_comm->stats().reduce_scatter.payload_bytes, uint64_t(q * m * n * 4));
  }
}

// 2.5D on q x q x d = 2 x 2 x 2 ranks, world rank = (d q + i) q + j: each depth layer takes its
// slice of the rows and runs SUMMA on it with the same (replicated) weight blocks; the weight
// gradient is summed over the depth.
TEST(Tensor25D, LayersSplitTheRowsAndTheWeightGradientSumsOverTheDepth) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks (q = 2, d = 2)";
  const int q = 2, depth_size = 2;
  const int d = world.rank() / (q * q), i = world.rank() / q % q, j = world.rank() % q;
  auto row_comm = world.split(d * q + i, j), col_comm = world.split(d * q + j, i),
       depth_comm = world.split(i * q + j, d);
  parallel::CommunicatorGroup row(*row_comm), col(*col_comm), depth(*depth_comm);
  core::Grid2D layer{row, col};
  auto gemm = core::make_host_gemm();
  const int64_t M = 8 * q * depth_size, K = 3 * q, N = 5 * q, Ml = M / depth_size;
  const auto X = random_vector(M * K, 61), W = random_vector(K * N, 62),
             dY = random_vector(M * N, 63);
  // This layer's rows.
  const std::vector<float> Xl(X.begin() + d * Ml * K, X.begin() + (d + 1) * Ml * K),
      dYl(dY.begin() + d * Ml * N, dY.begin() + (d + 1) * Ml * N);
  std::vector<float> work(core::summa_work_floats(std::max(Ml, K), N, std::max(Ml, K), q));
  std::vector<float> Y(Ml / q * (N / q)), dW(K / q * (N / q));
  core::summa_ab(*gemm, layer, block(Xl, Ml, K, q, i, j).data(), block(W, K, N, q, i, j).data(),
                 Y.data(), Ml, N, K, work.data());
  expect_block_near(Y, dense_product(Xl, false, W, false, Ml, N, K), Ml, N, q, i, j, 1e-5, "Y");
  depth_comm->reset_stats();
  core::tesseract_weight_grad(*gemm, layer, depth, block(Xl, Ml, K, q, i, j).data(),
                              block(dYl, Ml, N, q, i, j).data(), dW.data(), Ml, K, N,
                              work.data());
  expect_block_near(dW, dense_product(X, true, dY, false, K, N, M), K, N, q, i, j, 1e-4, "dW");
  EXPECT_EQ(depth_comm->stats().all_reduce.payload_bytes, uint64_t(K / q * (N / q) * 4));
}

TEST(Tensor2D, SizesThatDoNotDivideTheGridAreRefused) {
  GridFixture g;
  if (!g.init()) GTEST_SKIP() << "needs a square number of ranks > 1";
  auto gemm = core::make_host_gemm();
  std::vector<float> buf(1024);
  try {
    core::summa_ab(*gemm, *g.grid, buf.data(), buf.data(), buf.data(), g.q + 1, g.q, g.q,
                   buf.data());
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("must be multiples of " + std::to_string(g.q)),
              std::string::npos)
        << e.what();
  }
}

TEST(Tensor2D, LayernormMatchesTheDenseLayernormForwardAndBackward) {
  GridFixture g;
  if (!g.init()) GTEST_SKIP() << "needs a square number of ranks > 1";
  const int q = g.q;
  const int64_t R = 3 * q, S = 4 * q, r = R / q, s = S / q;
  auto x = random_vector(R * S, 11, 2.0f);
  for (auto& v : x) v += 0.7f;  // a mean away from zero, as on the residual stream
  const auto w = random_vector(S, 12), b = random_vector(S, 13), dy = random_vector(R * S, 14);
  // Dense reference on the whole matrix.
  std::vector<float> y(R * S), mean(R), rstd(R), dx(R * S, 0.5f), dw(S, 0.25f), db(S, 0.125f);
  core::kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                   b.data(), R, int(S), 1e-5f);
  core::kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), R, int(S));
  Kokkos::fence();
  // This rank's blocks; the parameters are the block's columns.
  const auto xb = block(x, R, S, q, g.i, g.j), dyb = block(dy, R, S, q, g.i, g.j);
  const std::vector<float> wb(w.begin() + g.j * s, w.begin() + (g.j + 1) * s),
      bb(b.begin() + g.j * s, b.begin() + (g.j + 1) * s);
  std::vector<float> yb(r * s), mb(r), rb(r), dxb(r * s, 0.5f), dwb(s, 0.0f), dbb(s, 0.0f),
      work(2 * r);
  g.reset_stats();
  core::layernorm2d_forward(*g.grid, yb.data(), mb.data(), rb.data(), xb.data(), wb.data(),
                            bb.data(), R, S, 1e-5f, work.data());
  expect_block_near(yb, y, R, S, q, g.i, g.j, 1e-5, "layernorm output");
  for (int64_t n = 0; n < r; ++n) {
    EXPECT_NEAR(mb[n], mean[g.i * r + n], 1e-6);
    EXPECT_NEAR(rb[n], rstd[g.i * r + n], 1e-5 * rstd[g.i * r + n]);
  }
  EXPECT_EQ(g.row_comm->stats().all_reduce.payload_bytes, uint64_t(2 * r * 4));
  g.reset_stats();
  core::layernorm2d_backward(*g.grid, dxb.data(), dwb.data(), dbb.data(), dyb.data(), xb.data(),
                             wb.data(), mb.data(), rb.data(), R, S, work.data());
  EXPECT_EQ(g.row_comm->stats().all_reduce.payload_bytes, uint64_t(2 * r * 4));
  expect_block_near(dxb, dx, R, S, q, g.i, g.j, 1e-5, "layernorm input gradient");
  // Parameter gradients: the blocks' parts summed down the grid column, plus the dense run's
  // starting values.
  g.col->all_reduce_sum(dwb.data(), dwb.size());
  g.col->all_reduce_sum(dbb.data(), dbb.size());
  for (int64_t e = 0; e < s; ++e) {
    EXPECT_NEAR(dwb[e] + 0.25f, dw[g.j * s + e], 1e-5) << e;
    EXPECT_NEAR(dbb[e] + 0.125f, db[g.j * s + e], 1e-5) << e;
  }
}

TEST(Tensor2D, CrossEntropyOverTheGridRowMatchesTheDenseLoss) {
  GridFixture g;
  if (!g.init()) GTEST_SKIP() << "needs a square number of ranks > 1";
  const int q = g.q;
  const int64_t R = 2 * q, V = 7 * q - 2;  // the last column block holds 2 padding columns
  const int64_t vl = (V + q - 1) / q, v0 = g.j * vl;
  const int valid = int(std::min<int64_t>(vl, V - v0));
  const auto logits = random_vector(R * V, 21, 4.0f);
  std::vector<int32_t> targets(R);
  for (int64_t n = 0; n < R; ++n) targets[n] = int32_t((n * 5 + 3) % V);
  std::vector<float> dense = logits, losses(R);
  const float scale = 1.0f / float(R);
  core::kernels::cross_entropy_forward_backward(dense.data(), losses.data(), targets.data(), R,
                                                int(V), int(V), scale);
  Kokkos::fence();
  // This rank: rows of grid row i, vocabulary columns [v0, v0 + valid) with leading dimension vl.
  const int64_t r = R / q;
  std::vector<float> local(r * vl, 123.0f), local_losses(r), work(3 * r);
  for (int64_t n = 0; n < r; ++n) {
    for (int e = 0; e < valid; ++e) local[n * vl + e] = logits[(g.i * r + n) * V + v0 + e];
  }
  core::vocab_parallel_cross_entropy(*g.row, local.data(), local_losses.data(),
                                     targets.data() + g.i * r, r, int(vl), valid, v0, scale,
                                     work.data());
  for (int64_t n = 0; n < r; ++n) {
    EXPECT_NEAR(local_losses[n], losses[g.i * r + n], 1e-5);
    for (int e = 0; e < valid; ++e) {
      EXPECT_NEAR(local[n * vl + e], dense[(g.i * r + n) * V + v0 + e], 1e-6);
    }
    for (int64_t e = valid; e < vl; ++e) EXPECT_EQ(local[n * vl + e], 0.0f) << "padding";
  }
}
