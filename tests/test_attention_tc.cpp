// The tensor-core attention (core/attention_tc.hpp). Its kernels are written once against a block
// interface; here the host's block runs them (every build) against a dense causal attention in
// double precision over the same bf16 q/k/v, and, in a CUDA build on a GPU, the device's block
// against the host's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>
#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/attention_tc.hpp"
#include "core/bf16.hpp"
#include "core/gemm.hpp"
#include "core/layers.hpp"
#include "device_arrays.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;
using colossal::test::random_vector;

namespace {

struct Case {
  int B, T, C, H, tile;
};

// Dense causal attention in double over the bf16 values: y (B,T,C), lse (B,H,T), and, for the
// output gradient dy, dqkv (B,T,3C).
struct Reference {
  std::vector<double> y, lse, dqkv;
};

Reference dense_attention(const std::vector<std::uint16_t>& qkv16, const std::vector<float>& dy,
                          int B, int T, int C, int H) {
  const int hs = C / H;
  const double scale = 1.0 / std::sqrt(double(hs));
  auto q = [&](int b, int t, int col) { return double(bf16_value(qkv16[(int64_t(b) * T + t) * 3 * C + col])); };
  Reference r;
  r.y.assign(std::size_t(B) * T * C, 0.0);
  r.lse.assign(std::size_t(B) * H * T, 0.0);
  r.dqkv.assign(std::size_t(B) * T * 3 * C, 0.0);
  std::vector<double> p(T), dp(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int qc = h * hs, kc = C + h * hs, vc = 2 * C + h * hs;
      for (int i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int c = 0; c < hs; ++c) s += q(b, i, qc + c) * q(b, j, kc + c);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= i; ++j) p[j] /= sum;
        r.lse[(int64_t(b) * H + h) * T + i] = mx + std::log(sum);
        double* yi = &r.y[(int64_t(b) * T + i) * C + qc];
        for (int j = 0; j <= i; ++j) {
          for (int c = 0; c < hs; ++c) yi[c] += p[j] * q(b, j, vc + c);
        }
        // Backward of row i: dP = dy V^T, dS = P (dP - sum_j P dP), dq = scale dS K,
        // dk_j += scale dS_j q_i, dv_j += P_j dy_i.
        const float* dyi = &dy[(int64_t(b) * T + i) * C + qc];
        double D = 0;
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int c = 0; c < hs; ++c) s += double(dyi[c]) * q(b, j, vc + c);
          dp[j] = s;
          D += p[j] * s;
        }
        double* g = &r.dqkv[int64_t(b) * T * 3 * C];
        for (int j = 0; j <= i; ++j) {
          const double ds = scale * p[j] * (dp[j] - D);
          for (int c = 0; c < hs; ++c) {
            g[int64_t(i) * 3 * C + qc + c] += ds * q(b, j, kc + c);
            g[int64_t(j) * 3 * C + kc + c] += ds * q(b, i, qc + c);
            g[int64_t(j) * 3 * C + vc + c] += p[j] * dyi[c];
          }
        }
      }
    }
  }
  return r;
}

// max |a - b| <= tol * max |b|: the tensor cores' bf16 probabilities and dy round to 2^-9.
template <class Ref>
void expect_near_scaled(const char* what, const std::vector<float>& a, const std::vector<Ref>& b,
                        double tol) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 1e-30;
  std::size_t at = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(double(b[i])));
    const double d = std::abs(double(a[i]) - double(b[i]));
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  std::printf("  %-22s max |tc - reference| = %.3g (%.3g of the largest) at %zu\n", what, worst,
              worst / scale, at);
  EXPECT_LE(worst, tol * scale) << what << "[" << at << "]: " << a[at] << " vs " << b[at];
}

std::vector<std::uint16_t> bf16_vector(const std::vector<float>& x) {
  std::vector<std::uint16_t> out(x.size());
  to_bf16_bits(x.data(), out.data(), x.size());
  return out;
}

struct Result {
  std::vector<float> y, lse, dqkv;
};

// vector: q/k/v read 8 values at a time (TcArgs::vector_loads), as a GPU does where aligned.
Result emulate(const std::vector<std::uint16_t>& qkv16, const std::vector<float>& dy,
               const Case& c, bool vector = false) {
  Result r;
  r.y.assign(std::size_t(c.B) * c.T * c.C, -7.0f);
  r.lse.assign(std::size_t(c.B) * c.H * c.T, -7.0f);
  r.dqkv.assign(std::size_t(c.B) * c.T * 3 * c.C, -7.0f);  // assigned: the sentinel must go
  tc::TcArgs a{.qkv = qkv16.data(), .atty = r.y.data(), .lse = r.lse.data(), .datty = dy.data(),
               .dqkv = r.dqkv.data(), .B = c.B, .T = c.T, .C = c.C, .H = c.H, .tile = c.tile};
  a.vector_loads = vector && tc::tc_vector_loads(qkv16.data(), c.C);
  EXPECT_EQ(a.vector_loads, vector) << "std::vector's data is 16-byte aligned";
  tc::emulate_forward(a);
  tc::emulate_backward(a);
  return r;
}

}  // namespace

TEST(TensorCoreAttention, HostBlockMatchesDenseReference) {
  // Head sizes 16, 32, 64 and 128; tiles 16, 32 and 64; T below, at and past a tile, one position.
  const Case cases[] = {{2, 37, 32, 2, 16}, {1, 64, 64, 1, 64}, {2, 100, 128, 2, 32},
                        {1, 130, 128, 1, 64}, {1, 1, 64, 2, 16}, {1, 50, 96, 3, 32}};
  for (const Case& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                 " C=" + std::to_string(c.C) + " H=" + std::to_string(c.H) +
                 " tile=" + std::to_string(c.tile));
    const auto qkv16 = bf16_vector(random_vector(int64_t(c.B) * c.T * 3 * c.C, 11, 2.0f));
    const auto dy = random_vector(int64_t(c.B) * c.T * c.C, 12);
    const Result got = emulate(qkv16, dy, c);
    const Reference ref = dense_attention(qkv16, dy, c.B, c.T, c.C, c.H);
    expect_near_scaled("y", got.y, ref.y, 1e-2);
    expect_near_scaled("lse", got.lse, ref.lse, 1e-3);
    expect_near_scaled("dqkv", got.dqkv, ref.dqkv, 2e-2);
    // Loading q/k/v 8 values at a time changes nothing.
    const Result vec = emulate(qkv16, dy, c, true);
    EXPECT_EQ(vec.y, got.y);
    EXPECT_EQ(vec.lse, got.lse);
    EXPECT_EQ(vec.dqkv, got.dqkv);
  }
}

TEST(TensorCoreAttention, TilesAgree) {
  // The same head cut into tiles of 16, 32 and 64 positions: the masks and the online softmax's
  // rescaling differ, the result may not (beyond the bf16 rounding of the probabilities).
  const Case base{2, 90, 128, 2, 16};
  const auto qkv16 = bf16_vector(random_vector(int64_t(base.B) * base.T * 3 * base.C, 3, 3.0f));
  const auto dy = random_vector(int64_t(base.B) * base.T * base.C, 4);
  const Result r16 = emulate(qkv16, dy, base);
  for (int tile : {32, 64}) {
    Case c = base;
    c.tile = tile;
    const Result r = emulate(qkv16, dy, c);
    expect_near_scaled("y vs tile 16", r.y, r16.y, 1e-2);
    expect_near_scaled("dqkv vs tile 16", r.dqkv,
                       r16.dqkv, 2e-2);
  }
}

// The contract the model relies on when a GPU build swaps it in for the host's tiled fused
// attention: the same outputs from the same bf16 q/k/v (the host multiplies the probabilities
// in fp32, so bf16 rounding apart), and a backward that takes the forward's y and lse as they are.
TEST(TensorCoreAttention, HostBlockMatchesHostFusedPath) {
  if (!test::host_memory()) GTEST_SKIP() << "the host fused path takes host pointers here";
  const int B = 2, T = 75, C = 128, H = 2;
  const auto qkv16 = bf16_vector(random_vector(int64_t(B) * T * 3 * C, 31, 2.0f));
  const auto dy = random_vector(int64_t(B) * T * C, 32);
  auto gemm = make_host_gemm();
  std::vector<float> work(fused_attention_work_floats(16)), lse(B * H * T), y(B * T * C),
      dqkv(B * T * 3 * C);
  fused_attention_forward(*gemm, lse.data(), y.data(), qkv16.data(), work.data(), B, T, C, H, 16);
  fused_attention_backward(*gemm, dqkv.data(), dy.data(), y.data(), qkv16.data(), lse.data(),
                           work.data(), B, T, C, H, 16);
  const Result tc = emulate(qkv16, dy, Case{B, T, C, H, 32});
  expect_near_scaled("y vs host fused", tc.y, y, 1e-2);
  expect_near_scaled("lse vs host fused", tc.lse, lse,
                     1e-4);
  expect_near_scaled("dqkv vs host fused", tc.dqkv, dqkv,
                     2e-2);
}

namespace {

// A block run as the device may run it: each() hands element e to thread e % kTcThreads and
// gemm() a 16 x 16 output tile to warp (tile index % 8); nothing runs until the next barrier
// (or the end), when every thread's and warp's queue runs in an order of `order`'s choosing:
// threads ascending, descending, the warps' products first, or a random interleaving that keeps
// each queue's own order. A read that a missing barrier leaves racing with a write sees another
// value in some order (shared memory starts as NaN).
class ScheduledBlock {
 public:
  ScheduledBlock(int order, unsigned seed) : order_(order), rng_(seed), queues_(kQueues) {}
  // Marked for the device only because the kernels' bodies are; a CUDA build's device pass
  // compiles them empty (never called there).
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(int n, F&& f) const {
#ifndef __CUDA_ARCH__
    for (int e = 0; e < n; ++e) queues_[e % tc::kTcThreads].push_back([f, e] { f(e); });
#endif
  }
  KOKKOS_INLINE_FUNCTION void sync() const {
#ifndef __CUDA_ARCH__
    run();
#endif
  }
  template <bool TransA, bool TransB>
  KOKKOS_INLINE_FUNCTION void gemm(int M, int N, int K, const std::uint16_t* A, int lda,
                                   const std::uint16_t* B, int ldb, float* C, int ldc,
                                   bool accumulate) const {
#ifndef __CUDA_ARCH__
    const int tiles_n = N / 16;
    for (int tile = 0; tile < (M / 16) * tiles_n; ++tile) {
      const int i0 = (tile / tiles_n) * 16, j0 = (tile % tiles_n) * 16;
      queues_[tc::kTcThreads + tile % 8].push_back([=] {
        tc::HostBlock{}.gemm<TransA, TransB>(16, 16, K, TransA ? A + i0 : A + int64_t(i0) * lda,
                                             lda, TransB ? B + int64_t(j0) * ldb : B + j0, ldb,
                                             C + int64_t(i0) * ldc + j0, ldc, accumulate);
      });
    }
#endif
  }
  void run() const {
    const int n = kQueues;
    if (order_ == 0 || order_ == 1) {
      for (int k = 0; k < n; ++k) drain(order_ == 0 ? k : n - 1 - k);
    } else if (order_ == 2) {
      for (int k = tc::kTcThreads; k < n; ++k) drain(k);
      for (int k = tc::kTcThreads - 1; k >= 0; --k) drain(k);
    } else {
      std::vector<std::size_t> next(n, 0);
      std::size_t left = 0;
      for (const auto& q : queues_) left += q.size();
      while (left > 0) {
        const int k = int(rng_() % unsigned(n));
        if (next[k] < queues_[k].size()) {
          queues_[k][next[k]++]();
          --left;
        }
      }
      for (auto& q : queues_) q.clear();
    }
  }

 private:
  static constexpr int kQueues = tc::kTcThreads + 8;
  void drain(int k) const {
    for (auto& f : queues_[k]) f();
    queues_[k].clear();
  }
  int order_;
  mutable std::mt19937 rng_;
  mutable std::vector<std::vector<std::function<void()>>> queues_;
};

}  // namespace

// Every barrier the kernels need is there: run as the device schedules them, in several orders,
// each kernel gives the host block's results bit for bit. (Removing any one of the barriers
// fails this.)
TEST(TensorCoreAttention, BarriersHoldUnderTheDeviceSchedule) {
  const Case cases[] = {{1, 100, 128, 2, 64}, {1, 70, 64, 4, 32}, {1, 33, 32, 2, 16},
                        {1, 130, 256, 1, 32}};
  for (const Case& c : cases) {
    const auto qkv16 = bf16_vector(random_vector(int64_t(c.B) * c.T * 3 * c.C, 41, 3.0f));
    const auto dy = random_vector(int64_t(c.B) * c.T * c.C, 42);
    const Result host = emulate(qkv16, dy, c);
    for (int order = 0; order < 5; ++order) {
      SCOPED_TRACE("T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) +
                   " tile=" + std::to_string(c.tile) + " order=" + std::to_string(order));
      Result got;
      got.y.assign(host.y.size(), -7.0f);
      got.lse.assign(host.lse.size(), -7.0f);
      got.dqkv.assign(host.dqkv.size(), -7.0f);
      tc::TcArgs a{.qkv = qkv16.data(), .datty = dy.data(), .B = c.B, .T = c.T, .C = c.C,
                   .H = c.H, .tile = c.tile};
      a.vector_loads = order % 2 == 1;  // both ways of loading q/k/v
      const ScheduledBlock blk(order, unsigned(order + 1));
      std::vector<unsigned char> smem(tc::TcLayout(tc::TcKernel::dkv, c.tile, c.C / c.H).bytes);
      auto poison = [&smem] { std::memset(smem.data(), 0xFF, smem.size()); };  // NaN floats
      a.atty = got.y.data();
      a.lse = got.lse.data();
      for (int i = 0; i < a.blocks(); ++i) {
        poison();
        tc::forward_block(blk, a, smem.data(), i);
        blk.run();
      }
      // Backward from the host's forward, so that only backward's schedule is under test.
      a.atty = const_cast<float*>(host.y.data());
      a.lse = const_cast<float*>(host.lse.data());
      a.dqkv = got.dqkv.data();
      for (int i = 0; i < a.blocks(); ++i) {
        poison();
        tc::dkv_block(blk, a, smem.data(), i);
        blk.run();
      }
      for (int i = 0; i < a.blocks(); ++i) {
        poison();
        tc::dq_block(blk, a, smem.data(), i);
        blk.run();
      }
      EXPECT_EQ(0, std::memcmp(got.y.data(), host.y.data(), host.y.size() * 4)) << "y";
      EXPECT_EQ(0, std::memcmp(got.lse.data(), host.lse.data(), host.lse.size() * 4)) << "lse";
      EXPECT_EQ(0, std::memcmp(got.dqkv.data(), host.dqkv.data(), host.dqkv.size() * 4))
          << "dqkv";
    }
  }
}

TEST(TensorCoreAttention, SharedMemoryLayout) {
  // gpt2's head (64) in 64-position tiles: every region 128-byte aligned and within the total;
  // the forward kernel fits the 99 KiB every sm_80+ GPU offers a block, dK/dV the H100's 227 KiB.
  for (auto kernel : {tc::TcKernel::forward, tc::TcKernel::dkv, tc::TcKernel::dq}) {
    const tc::TcLayout L(kernel, 64, 64);
    for (std::size_t offset : {L.q, L.k, L.v, L.dy, L.o, L.dk, L.dv, L.s, L.dp, L.p, L.ds, L.part,
                               L.row_a, L.row_b, L.row_c}) {
      EXPECT_EQ(offset % 128, 0u);
      EXPECT_LT(offset, L.bytes);
    }
  }
  EXPECT_LE(tc::TcLayout(tc::TcKernel::forward, 64, 64).bytes, 99u * 1024);
  EXPECT_LE(tc::TcLayout(tc::TcKernel::dkv, 64, 128).bytes, 227u * 1024);
  EXPECT_TRUE(tc::tc_head_supported(64));
  EXPECT_FALSE(tc::tc_head_supported(72));
  EXPECT_FALSE(tc::tc_head_supported(512));
  // 256 threads' lanes do not divide a tile of 48 positions' rows.
  const tc::TcArgs odd{.B = 1, .T = 1, .C = 64, .H = 1, .tile = 48};
  EXPECT_THROW(tc::emulate_forward(odd), std::invalid_argument);
  if (!tc::device_available()) {
    EXPECT_THROW(tc::device_tile(64), std::logic_error);
  }
}

#if defined(KOKKOS_ENABLE_CUDA)
using colossal::test::Dev;
using colossal::test::to_device;
using colossal::test::to_host;

// On a GPU: the WMMA kernels against the host block on the same bf16 inputs (the sums' order
// differs, and a probability may round to the neighbouring bf16), and against the dense
// reference; gpt2's head at T = 1024 too. Head widths 64, 128 and 256 with the device's own
// tile (256: the widest shared memory, over 48 KiB), 16, and the 16-row tile at width 64.
TEST(TensorCoreAttention, DeviceMatchesHostBlock) {
  const Case cases[] = {{2, 100, 128, 2, 0}, {1, 130, 256, 2, 0}, {1, 1024, 128, 2, 0},
                        {1, 130, 512, 2, 0}, {2, 70, 64, 4, 32}, {1, 100, 128, 2, 16}};
  for (Case c : cases) {
    if (c.tile == 0) c.tile = tc::device_tile(c.C / c.H);
    SCOPED_TRACE("T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) +
                 " tile=" + std::to_string(c.tile));
    const auto qkv16 = bf16_vector(random_vector(int64_t(c.B) * c.T * 3 * c.C, 21, 2.0f));
    const auto dy = random_vector(int64_t(c.B) * c.T * c.C, 22);
    const Result host = emulate(qkv16, dy, c);
    auto dqkv16 = to_device(qkv16);
    auto ddy = to_device(dy);
    auto dlse = to_device(std::vector<float>(host.lse.size(), -7.0f));
    auto dyo = to_device(std::vector<float>(host.y.size(), -7.0f));
    auto dgrad = to_device(std::vector<float>(host.dqkv.size(), -7.0f));
    tc::device_forward(dlse.data(), dyo.data(), dqkv16.data(), c.B, c.T, c.C, c.H, c.tile);
    tc::device_backward(dgrad.data(), ddy.data(), dyo.data(), dqkv16.data(), dlse.data(), c.B,
                        c.T, c.C, c.H, c.tile);
    Kokkos::fence();
    const auto y = to_host(dyo), lse = to_host(dlse), grad = to_host(dgrad);
    expect_near_scaled("gpu y vs host block", y, host.y,
                       2e-3);
    expect_near_scaled("gpu lse vs host block", lse,
                       host.lse, 1e-4);
    expect_near_scaled("gpu dqkv vs host block", grad,
                       host.dqkv, 5e-3);
    if (c.T <= 200) {
      const Reference ref = dense_attention(qkv16, dy, c.B, c.T, c.C, c.H);
      expect_near_scaled("gpu y vs dense", y, ref.y, 1e-2);
      expect_near_scaled("gpu dqkv vs dense", grad, ref.dqkv, 2e-2);
    }
  }
}

// A tile given by hand whose block needs more shared memory than the device's opt-in (head 256
// at tile 64: the dK/dV kernel's 322 KiB against the H100's and H200's 227 KiB) is refused by
// name before the launch, not left to a CUDA "invalid argument".
TEST(TensorCoreAttention, DeviceRefusesATileItsSharedMemoryCannotHold) {
  const Case c{1, 64, 512, 2, 64};
  auto dqkv16 = to_device(bf16_vector(random_vector(int64_t(c.T) * 3 * c.C, 23, 2.0f)));
  auto dlse = to_device(std::vector<float>(std::size_t(c.H) * c.T));
  auto dyo = to_device(std::vector<float>(std::size_t(c.T) * c.C));
  auto ddy = to_device(std::vector<float>(std::size_t(c.T) * c.C));
  auto dgrad = to_device(std::vector<float>(std::size_t(c.T) * 3 * c.C));
  try {
    tc::device_backward(dgrad.data(), ddy.data(), dyo.data(), dqkv16.data(), dlse.data(), c.B,
                        c.T, c.C, c.H, c.tile);
    ADD_FAILURE() << "tile 64 at head size 256 was launched";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("leave the tile to the device"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
#endif  // KOKKOS_ENABLE_CUDA
