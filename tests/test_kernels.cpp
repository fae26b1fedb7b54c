// Every layer's backward against central finite differences, and the GEMM interface against a
// naive reference. The scalar probed is f = sum(out * g) for a fixed random g, so df/dout = g.
#include <gtest/gtest.h>

#ifdef __NVCC__
// LaneReductions hands host lambdas to lane_sum, a __host__ __device__ template, and calls it on
// the host only: nvcc warns that the device side could not call them.
#pragma nv_diag_suppress 20013
#pragma nv_diag_suppress 20015
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "core/dnnl_matmul.hpp"
#include "core/gemm.hpp"
#include "core/gemm_stable.hpp"
#include "core/host_threads.hpp"
#include "core/kernels.hpp"
#include "core/layers.hpp"
#include "core/llama_kernels.hpp"
#include "core/memory.hpp"
#include "core/shared_library.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;
using colossal::test::check_gradient;
using colossal::test::dot;
using colossal::test::random_vector;

void check_gemm(Gemm& gemm, int M, int N, int K, float beta = 2.0f);
void check_fused_attention(Gemm& gemm, int tile);

class Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::host_memory()) GTEST_SKIP() << "kernel tests pass host pointers";
  }
  std::unique_ptr<Gemm> gemm = make_host_gemm();
};

// Every host backend that loads here (setup.sh installs BLIS and oneDNN), and the per-shape
// auto-tuner, whose trial runs must leave C untouched (beta != 0 below). One-row products
// (incremental decoding's; OpenBLAS runs them as matrix-vector products) also with beta = 0
// over a C of NaNs, which must not survive.
TEST_F(Kernels, GemmMatchesNaiveForEveryTransposeAndBackend) {
  std::vector<std::string> backends = host_gemm_backends();
  backends.push_back("auto");
  std::printf("host GEMM backends: ");
  for (const auto& b : backends) std::printf("%s ", b.c_str());
  std::printf("\n");
  for (const std::string& backend : backends) {
    auto g = make_host_gemm(backend);
    for (auto [M, N, K] : {std::tuple{5, 7, 4}, std::tuple{67, 45, 130}, std::tuple{1, 45, 130},
                           std::tuple{1, 1, 9}}) {
      SCOPED_TRACE(backend + " " + std::to_string(M) + "x" + std::to_string(N) + "x" +
                   std::to_string(K));
      for (int repeat = 0; repeat < 2; ++repeat) {  // auto: tuned, then the chosen backend
        check_gemm(*g, M, N, K);
        if (M == 1) check_gemm(*g, M, N, K, 0.0f);
      }
    }
  }
}

// Small products of a batch run one per host thread, each single-threaded: the result must equal
// the products one by one, for every backend, with beta != 0 and strides between the items.
TEST_F(Kernels, BatchedGemmOverHostThreadsMatchesOneByOne) {
  const int previous = HostThreads::shared().size();
  HostThreads::resize_shared(3);
  std::vector<std::string> backends = host_gemm_backends();
  backends.push_back("auto");
  const int M = 9, N = 11, K = 5, batch = 7;
  const int64_t sa = M * K + 3, sb = K * N + 1, sc = M * N + 2;
  const auto A = random_vector(sa * batch, 31), B = random_vector(sb * batch, 32),
             C0 = random_vector(sc * batch, 33);
  std::vector<HostTeam> teams{HostTeam::own};
  if (HostThreads::openmp_available()) teams.push_back(HostTeam::openmp);
  for (const HostTeam team : teams) {  // whichever team the batch is spread over
    HostThreads::set_team(team);
    for (const std::string& backend : backends) {
      SCOPED_TRACE(backend + (team == HostTeam::openmp ? " on OpenMP's team" : " on own threads"));
      auto g = make_host_gemm(backend);
      std::vector<float> batched = C0, single = C0;
      g->gemm_strided_batched(Trans::N, Trans::T, M, N, K, 0.7f, A.data(), K, sa, B.data(), K,
                              sb, 1.5f, batched.data(), N, sc, batch);
      for (int i = 0; i < batch; ++i) {
        g->gemm(Trans::N, Trans::T, M, N, K, 0.7f, A.data() + i * sa, K, B.data() + i * sb, K,
                1.5f, single.data() + i * sc, N);
      }
      for (std::size_t i = 0; i < single.size(); ++i) ASSERT_FLOAT_EQ(batched[i], single[i]) << i;
    }
  }
  HostThreads::set_team(HostTeam::own);
  HostThreads::resize_shared(previous);
  set_blas_threads(previous);
}

// The host kernels run on the GEMM's kind of threads: OpenMP's team with oneDNN and BLIS, the
// pool's own with OpenBLAS; auto tunes among the OpenMP backends alone when one loads.
TEST_F(Kernels, HostTeamFollowsTheGemmBackend) {
  const std::vector<std::string> loaded = host_gemm_backends();
  const bool openmp_backend = loaded.size() > 1;
  auto openblas = make_default_gemm("openblas");
  EXPECT_FALSE(openblas->runs_on_openmp());
  EXPECT_EQ(HostThreads::team(), HostTeam::own);
  auto automatic = make_default_gemm("auto");
  EXPECT_EQ(automatic->runs_on_openmp(), openmp_backend);
  if (openmp_backend) {
    EXPECT_EQ(automatic->name().find("openblas"), std::string::npos) << automatic->name();
    EXPECT_EQ(HostThreads::team(),
              HostThreads::openmp_available() ? HostTeam::openmp : HostTeam::own);
  }
  for (const std::string& name : loaded) {
    if (name == "openblas") continue;
    auto g = make_default_gemm(name);
    EXPECT_TRUE(g->runs_on_openmp()) << name;
    auto bf16 = make_default_gemm(name, GemmPrecision::bf16);  // native or emulated over it
    EXPECT_TRUE(bf16->runs_on_openmp()) << bf16->name();
  }
  make_default_gemm("openblas", GemmPrecision::bf16);  // the emulation over OpenBLAS
  EXPECT_EQ(HostThreads::team(), HostTeam::own);
}

TEST_F(Kernels, UnknownGemmBackendIsRefusedByName) {
  try {
    make_host_gemm("mkl");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'mkl' (allowed: openblas, blis, onednn, auto)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(-0.0f), -0.0f);
  EXPECT_TRUE(std::signbit(round_to_bf16(-0.0f)));
  // bf16 has 8 significand bits: near 1 its spacing is 2^-7.
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f), 1.0f);                   // tie: to even (1.0)
  EXPECT_EQ(round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);     // tie: to even (2 ulps)
  EXPECT_EQ(round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_EQ(round_to_bf16(-(1.0f + 0x1p-7f + 0x1p-9f)), -(1.0f + 0x1p-7f));
  EXPECT_EQ(round_to_bf16(3.14159265f), 3.140625f);
  EXPECT_TRUE(std::isinf(round_to_bf16(3.4e38f)));  // above bf16's largest finite, 3.3895e38
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_to_bf16(std::bit_cast<float>(0x7F800001u))));  // low-payload NaN
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  // Every float that is already bf16 is a fixed point; the array form equals the scalar one.
  std::vector<float> v = random_vector(100000, 7, 1000.0f), w = v;
  round_to_bf16(w.data(), w.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(w[i], round_to_bf16(v[i])) << i;
    ASSERT_EQ(round_to_bf16(w[i]), w[i]) << i;
    ASSERT_LE(std::abs(w[i] - v[i]), std::abs(v[i]) * 0x1p-8f) << i;  // half an ulp at most
  }
}

// A bf16 product is the fp32 product of the rounded operands: the same backend on rounded copies
// gives bitwise the same result, and plain fp32 does not. The caller's operands stay unrounded.
TEST(Bf16, GemmMultipliesRoundedOperandsInFp32) {
  auto fp32 = make_host_gemm();
  auto bf16 = make_bf16_gemm(make_host_gemm());
  EXPECT_NE(bf16->name().find("bf16"), std::string::npos);
  const int M = 37, N = 29, K = 53, batch = 3;
  for (Trans ta : {Trans::N, Trans::T}) {
    for (Trans tb : {Trans::N, Trans::T}) {
      const int lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 2, ldc = N + 1;
      const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K) + 5,
                    sb = int64_t(ldb) * (tb == Trans::N ? K : N) + 1, sc = int64_t(ldc) * M + 4;
      const auto A = random_vector(sa * batch, 11), B = random_vector(sb * batch, 12),
                 C0 = random_vector(sc * batch, 13);
      auto rA = A, rB = B;
      round_to_bf16(rA.data(), rA.size());
      round_to_bf16(rB.data(), rB.size());
      auto got = C0, want = C0, plain = C0;
      auto a_copy = A, b_copy = B;
      bf16->gemm_strided_batched(ta, tb, M, N, K, 0.7f, a_copy.data(), lda, sa, b_copy.data(), ldb,
                                 sb, 0.3f, got.data(), ldc, sc, batch);
      fp32->gemm_strided_batched(ta, tb, M, N, K, 0.7f, rA.data(), lda, sa, rB.data(), ldb, sb,
                                 0.3f, want.data(), ldc, sc, batch);
      fp32->gemm_strided_batched(ta, tb, M, N, K, 0.7f, A.data(), lda, sa, B.data(), ldb, sb, 0.3f,
                                 plain.data(), ldc, sc, batch);
      double differs = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << i;
        differs = std::max(differs, double(std::abs(got[i] - plain[i])));
      }
      EXPECT_GT(differs, 1e-4) << "bf16 rounding had no effect";
      EXPECT_EQ(a_copy, A);
      EXPECT_EQ(b_copy, B);
      // The single product agrees with the batch's first item.
      auto one = C0;
      bf16->gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, one.data(), ldc);
      for (int i = 0; i < sc; ++i) ASSERT_EQ(one[i], got[i]) << i;
    }
  }
}

// Backends that copy their operands into contiguous buffers (the bf16 emulation, oneDNN's bf16
// GEMM where it loads) refuse negative batch strides by name, and an empty C computes nothing.
TEST(Bf16, CopyingBackendsRefuseNegativeStridesAndSkipEmptyProducts) {
  std::vector<std::unique_ptr<Gemm>> backends;
  backends.push_back(make_bf16_gemm(make_host_gemm()));
  try {
    backends.push_back(make_native_bf16_gemm());
  } catch (const std::exception&) {
  }
  const std::vector<float> A(64, 1.0f), B(64, 1.0f);
  for (auto& g : backends) {
    SCOPED_TRACE(g->name());
    std::vector<float> C(64, 5.0f);
    try {
      g->gemm_strided_batched(Trans::N, Trans::N, 2, 2, 2, 1.0f, A.data() + 32, 2, -4, B.data(),
                              2, 4, 0.0f, C.data(), 2, 4, 2);
      ADD_FAILURE() << "a negative stride was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("bf16 GEMM: negative batch strides"),
                std::string::npos)
          << e.what();
    }
    g->gemm_strided_batched(Trans::N, Trans::N, 0, 2, 2, 1.0f, A.data(), 2, 4, B.data(), 2, 4,
                            0.0f, C.data(), 2, 4, 2);
    g->gemm_strided_batched(Trans::N, Trans::N, 2, 2, 2, 1.0f, A.data(), 2, 4, B.data(), 2, 4,
                            0.0f, C.data(), 2, 4, 0);
    EXPECT_EQ(C, std::vector<float>(64, 5.0f));
  }
}

// oneDNN's bf16 GEMM on the CPU's bf16 units computes the emulation's products (the same
// rounded operands, fp32 sums) up to the order of the sums: within a few fp32 ulps of the sum
// of magnitudes, for every transpose, batched with strides, alpha and beta. Without the units or
// libdnnl2, `auto` falls back to the emulation and says why.
TEST(Bf16, NativeGemmEqualsTheEmulationUpToSummationOrder) {
  std::unique_ptr<Gemm> native;
  try {
    native = make_native_bf16_gemm();
  } catch (const std::exception& e) {
    auto fallback = make_host_bf16_gemm("auto");
    EXPECT_NE(fallback->name().find("emulated: "), std::string::npos) << fallback->name();
    GTEST_SKIP() << "no native bf16 GEMM here: " << e.what();
  }
  EXPECT_EQ(make_host_bf16_gemm("auto")->name(), native->name());
  EXPECT_EQ(make_host_bf16_gemm("onednn")->name(), native->name());
  std::printf("native bf16 GEMM: %s\n", native->name().c_str());
  auto emulated = make_bf16_gemm(make_host_gemm());
  for (auto [M, N, K, batch] : {std::tuple{37, 29, 53, 3}, std::tuple{130, 70, 300, 1},
                                std::tuple{16, 16, 8, 9}}) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        SCOPED_TRACE(std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                     (ta == Trans::N ? " N" : " T") + (tb == Trans::N ? "N" : "T"));
        const int lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 2,
                  ldc = N + 1;
        const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K) + 5,
                      sb = int64_t(ldb) * (tb == Trans::N ? K : N) + 1, sc = int64_t(ldc) * M + 4;
        const auto A = random_vector(sa * batch, 21), B = random_vector(sb * batch, 22),
                   C0 = random_vector(sc * batch, 23);
        auto got = C0, want = C0;
        native->gemm_strided_batched(ta, tb, M, N, K, 0.7f, A.data(), lda, sa, B.data(), ldb, sb,
                                     0.3f, got.data(), ldc, sc, batch);
        emulated->gemm_strided_batched(ta, tb, M, N, K, 0.7f, A.data(), lda, sa, B.data(), ldb,
                                       sb, 0.3f, want.data(), ldc, sc, batch);
        // |operands| < 1, so each sum's magnitude is at most K: fp32 reordering moves it by
        // a few K * 2^-24; a wrong rounding, transpose or stride moves it by ~1e-2 or more.
        const double tol = 8.0 * K * 0x1p-24;
        for (int64_t i = 0; i < sc * batch; ++i) ASSERT_NEAR(got[i], want[i], tol) << i;
        auto one = C0;  // the single product is the batch's first item
        native->gemm(ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, one.data(), ldc);
        for (int64_t i = 0; i < sc; ++i) ASSERT_EQ(one[i], got[i]) << i;
      }
    }
  }
}

// oneDNN's matmul primitive (core/dnnl_matmul.hpp) against the naive product, in every layout
// the GEMM interface allows: transposes, leading dimensions and batch strides with gaps, a
// broadcast operand (stride 0), alpha with beta 0 (C scaled afterwards), alpha with beta (output
// scale and sum post-op). f32 operands, so the tolerance is fp32 reordering's; one primitive per
// shape and layout, reused.
TEST(DnnlMatmul, MatchesTheNaiveProductInEveryLayout) {
  SharedLibrary lib({"libdnnl.so.2", "libdnnl.so.3", "libdnnl.so"});
  auto matmul = DnnlMatmul::create(lib, DnnlMatmul::Operands::f32);
  if (matmul == nullptr) GTEST_SKIP() << "no oneDNN matmul here (libdnnl2, libdnnl-dev headers)";
  const int M = 19, N = 23, K = 37;
  for (auto [batch, broadcast_b, alpha, beta] :
       {std::tuple{1, false, 1.0f, 0.0f}, std::tuple{3, false, 0.35f, 0.0f},
        std::tuple{4, true, 1.0f, 1.0f}, std::tuple{2, false, 0.7f, 0.3f}}) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        SCOPED_TRACE(std::to_string(batch) + (broadcast_b ? " broadcast" : "") + " alpha " +
                     std::to_string(alpha) + " beta " + std::to_string(beta) +
                     (ta == Trans::N ? " N" : " T") + (tb == Trans::N ? "N" : "T"));
        const int lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 2,
                  ldc = N + 1;
        const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K) + 5,
                      sb = broadcast_b ? 0 : int64_t(ldb) * (tb == Trans::N ? K : N) + 1,
                      sc = int64_t(ldc) * M + 4;
        const auto A = random_vector(sa * batch, 41), B = random_vector(sb * batch + ldb * K + N, 42);
        auto C = random_vector(sc * batch, 43);
        auto want = C;
        for (int i = 0; i < batch; ++i) {
          for (int r = 0; r < M; ++r) {
            for (int c = 0; c < N; ++c) {
              double sum = 0;
              for (int k = 0; k < K; ++k) {
                const float a = A[i * sa + (ta == Trans::N ? r * lda + k : k * lda + r)];
                const float b = B[i * sb + (tb == Trans::N ? k * ldb + c : c * ldb + k)];
                sum += double(a) * b;
              }
              float& w = want[i * sc + r * ldc + c];
              w = float(alpha * sum + beta * double(w));
            }
          }
        }
        ASSERT_TRUE(matmul->run(ta, tb, M, N, K, alpha, A.data(), lda, sa, B.data(), ldb, sb,
                                beta, C.data(), ldc, sc, batch));
        for (std::size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(C[i], want[i], 2e-5) << i;
      }
    }
  }
  const std::size_t made = matmul->primitives();
  EXPECT_EQ(made, 16u);  // 4 cases x 4 transposes; alpha with beta 0 needs no output scale
  // The first case's layout again (batch 1: strides as there), with other arrays.
  std::vector<float> A(M * (K + 3), 1.0f), B(K * (N + 2), 1.0f), C(M * (N + 1));
  matmul->run(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K + 3, int64_t(K + 3) * M + 5,
              B.data(), N + 2, int64_t(N + 2) * K + 1, 0.0f, C.data(), N + 1,
              int64_t(N + 1) * M + 4, 1);
  EXPECT_EQ(C[0], float(K));
  EXPECT_EQ(matmul->primitives(), made) << "the first case's primitive is reused";
  setenv("COLOSSAL_DNNL_MATMUL", "0", 1);
  EXPECT_EQ(DnnlMatmul::create(lib, DnnlMatmul::Operands::f32), nullptr);
  unsetenv("COLOSSAL_DNNL_MATMUL");
}

// StableOperands (Gemm::hold_stable's copy): operands inside the held range come from one
// conversion of the whole range; one reaching past its end, or outside it, is converted on its
// own; holding again converts the range's new values; holding nothing converts every operand.
TEST(Bf16, HeldOperandsAreConvertedOnceAndFollowNewValuesWhenHeldAgain) {
  std::vector<float> held(300);
  for (int i = 0; i < 300; ++i) held[i] = float(i);
  int converted = 0;  // floats converted
  auto negate = [&](const float* in, float* out, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = -in[i];
    converted += int(n);
  };
  StableOperands<float> stable;
  std::vector<float> scratch;
  stable.hold(held.data(), 200, false);
  const float* a = stable.get(scratch, held.data() + 50, 99, negate);
  EXPECT_EQ(converted, 200);  // the whole range, once
  EXPECT_EQ(a[0], -50.0f);
  EXPECT_EQ(a[98], -148.0f);
  EXPECT_EQ(stable.get(scratch, held.data() + 101, 99, negate)[98], -199.0f);  // ends at 200
  EXPECT_EQ(converted, 200);
  const float* past = stable.get(scratch, held.data() + 150, 99, negate);  // to 249: past the end
  EXPECT_EQ(past, scratch.data());
  EXPECT_EQ(past[98], -248.0f);
  EXPECT_EQ(converted, 299);
  held[60] = 7.0f;
  stable.hold(held.data(), 200, false);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate)[10], -7.0f);
  EXPECT_EQ(stable.conversions(), 2u);
  // Held again, unchanged (the caller's promise): the copy stays, nothing is converted.
  stable.hold(held.data(), 200, true);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate)[10], -7.0f);
  EXPECT_EQ(stable.conversions(), 2u);
  EXPECT_EQ(converted, 499);
  // "Unchanged" with another range (a shorter one, or another start) converts it anew.
  held[60] = 8.0f;
  stable.hold(held.data(), 100, true);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate)[10], -8.0f);
  EXPECT_EQ(stable.conversions(), 3u);
  held[60] = 9.0f;
  stable.hold(held.data() + 1, 100, true);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate)[10], -9.0f);
  EXPECT_EQ(stable.conversions(), 4u);
  stable.hold(nullptr, 0, false);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate), scratch.data());
  EXPECT_EQ(stable.conversions(), 4u);
  // Nothing held in between: the range is converted again although the call says unchanged.
  held[60] = 10.0f;
  stable.hold(held.data() + 1, 100, true);
  EXPECT_EQ(stable.get(scratch, held.data() + 50, 11, negate)[10], -10.0f);
  EXPECT_EQ(stable.conversions(), 5u);
}

// The same through oneDNN's bf16 backend (where the CPU has it): products of held weights are
// bitwise those of converting every product, and held again after a change they follow it.
TEST(Bf16, NativeGemmOfHeldWeightsEqualsConvertingEachProduct) {
  std::unique_ptr<Gemm> gemm;
  try {
    gemm = make_native_bf16_gemm();
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no native bf16 GEMM here: " << e.what();
  }
  const int M = 9, N = 7, K = 11;
  auto weights = random_vector(200, 31);
  const auto act = random_vector(K * N, 32);
  auto product = [&] {
    std::vector<float> C(M * N, 0.0f);
    gemm->gemm(Trans::N, Trans::N, M, N, K, 1.0f, weights.data() + 50, K, act.data(), N, 0.0f,
               C.data(), N);
    return C;
  };
  const auto want = product();
  gemm->hold_stable(weights.data(), weights.size(), false);
  EXPECT_EQ(product(), want);
  EXPECT_EQ(product(), want);
  EXPECT_EQ(gemm->stable_conversions(), 1u);
  for (float& x : weights) x *= -0.5f;
  gemm->hold_stable(nullptr, 0, false);
  const auto fresh = product();
  gemm->hold_stable(weights.data(), weights.size(), false);
  EXPECT_EQ(product(), fresh);
  EXPECT_NE(fresh, want);
  EXPECT_EQ(gemm->stable_conversions(), 2u);
}

// Gemm::gemm_mixed: an operand stored as bf16 patterns multiplies as the floats it represents,
// in either position and transpose: bitwise the product of those floats on an fp32 backend (the
// default widens), on the emulation (which widens instead of rounding) and on oneDNN (which
// takes the patterns as they are), where it runs.
TEST(Bf16, MixedOperandsMultiplyAsTheFloatsTheyRepresent) {
  if (!test::host_memory()) GTEST_SKIP() << "host arrays";
  std::vector<std::pair<std::string, std::unique_ptr<Gemm>>> backends;
  backends.emplace_back("openblas", make_host_gemm());
  backends.emplace_back("emulated", make_bf16_gemm(make_host_gemm()));
  try {
    backends.emplace_back("native", make_native_bf16_gemm());
  } catch (const std::exception& e) {
    std::printf("no native bf16 GEMM here (%s)\n", e.what());
  }
  const int M = 13, N = 6, K = 9;
  const auto a = random_vector(M * K, 41), b = random_vector(K * N, 42);
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  to_bf16_bits(a.data(), a16.data(), a.size());
  to_bf16_bits(b.data(), b16.data(), b.size());
  std::vector<float> ar(a16.size()), br(b16.size());
  from_bf16_bits(a16.data(), ar.data(), ar.size());
  from_bf16_bits(b16.data(), br.data(), br.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(ar[i], round_to_bf16(a[i])) << i;
  for (auto& [name, gemm] : backends) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        SCOPED_TRACE(name + (ta == Trans::T ? " A^T" : " A") + (tb == Trans::T ? " B^T" : " B"));
        const int lda = ta == Trans::N ? K : M, ldb = tb == Trans::N ? N : K;
        const auto c0 = random_vector(M * N, 43);
        auto want = c0;
        gemm->gemm(ta, tb, M, N, K, 0.5f, ar.data(), lda, br.data(), ldb, 1.0f, want.data(), N);
        auto c_a = c0, c_b = c0, c_ab = c0;
        gemm->gemm_mixed(ta, tb, M, N, K, 0.5f, a16.data(), lda, br.data(), ldb, 1.0f,
                         c_a.data(), N);
        gemm->gemm_mixed(ta, tb, M, N, K, 0.5f, ar.data(), lda, b16.data(), ldb, 1.0f,
                         c_b.data(), N);
        gemm->gemm_mixed(ta, tb, M, N, K, 0.5f, a16.data(), lda, b16.data(), ldb, 1.0f,
                         c_ab.data(), N);
        EXPECT_EQ(c_a, want);
        EXPECT_EQ(c_b, want);
        EXPECT_EQ(c_ab, want);
        EXPECT_NE(want, c0);
      }
    }
  }
}

// layernorm_forward and rmsnorm_forward with a bf16 output write exactly the rounded fp32
// outputs, and the same row statistics, on the host's execution space (bf16 outputs are
// host-only), in CUDA builds too.
TEST(Bf16, NormOutputsInBf16AreTheRoundedFp32Outputs) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int64_t N = 7;
  const int C = 37;
  const auto x = random_vector(N * C, 51), w = random_vector(C, 52), bias = random_vector(C, 53);
  std::vector<float> out(N * C), mean(N), rstd(N), mean16(N), rstd16(N);
  std::vector<std::uint16_t> out16(N * C), want(N * C);
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "rmsnorm" : "layernorm");
    if (rms) {
      kernels::rmsnorm_forward<Host>(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
      kernels::rmsnorm_forward<Host>(out16.data(), rstd16.data(), x.data(), w.data(), N, C, 1e-5f);
    } else {
      kernels::layernorm_forward<Host>(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                       bias.data(), N, C, 1e-5f);
      kernels::layernorm_forward<Host>(out16.data(), mean16.data(), rstd16.data(), x.data(),
                                       w.data(), bias.data(), N, C, 1e-5f);
      EXPECT_EQ(mean16, mean);
    }
    EXPECT_EQ(rstd16, rstd);
    to_bf16_bits(out.data(), want.data(), out.size());
    EXPECT_EQ(out16, want);
  }
}

// Attention with its probabilities saved as bf16 patterns: forward saves exactly the rounded
// fp32 probabilities (one sequence at a time through an (H,T,T) buffer) with the same output,
// and backward from them equals backward from those rounded values in fp32, bitwise.
TEST_F(Kernels, AttentionWithBf16ProbabilitiesIsAttentionOfTheRoundedOnes) {
  const int B = 3, T = 7, C = 8, H = 2;
  const int64_t TT = int64_t(T) * T;
  const auto qkv = random_vector(B * T * 3 * C, 61), dy = random_vector(B * T * C, 62);
  std::vector<float> att(B * H * TT), y(B * T * C), work(H * TT), y16(B * T * C);
  std::vector<std::uint16_t> att16(att.size()), want16(att.size());
  attention_forward(*gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
  attention_forward(*gemm, work.data(), y16.data(), qkv.data(), B, T, C, H, att16.data());
  to_bf16_bits(att.data(), want16.data(), att.size());
  EXPECT_EQ(att16, want16);
  EXPECT_EQ(y16, y);
  std::vector<float> rounded(att.size());
  from_bf16_bits(att16.data(), rounded.data(), rounded.size());
  std::vector<float> dqkv(qkv.size()), dqkv16(qkv.size()), datt(H * TT);
  attention_backward(*gemm, dqkv.data(), datt.data(), dy.data(), qkv.data(), rounded.data(), B, T,
                     C, H);
  attention_backward(*gemm, dqkv16.data(), datt.data(), dy.data(), qkv.data(), att16.data(), B, T,
                     C, H);
  EXPECT_EQ(dqkv16, dqkv);
  EXPECT_NE(rounded, att) << "the probabilities were rounded";
}

TEST(Bf16, PrecisionNamesAreCheckedAndCublasNeedsACudaBuild) {
  EXPECT_EQ(gemm_precision("bf16"), GemmPrecision::bf16);
  EXPECT_STREQ(to_string(gemm_precision("fp32")), "fp32");
  EXPECT_THROW(gemm_precision("fp16"), std::runtime_error);
  // An explicit fp32 backend is emulated in bf16, and its name says why (what to set instead
  // on a CPU with bf16 units).
  auto wrapped = make_default_gemm("openblas", GemmPrecision::bf16);
  if (!test::host_memory()) {  // a Kokkos CUDA build multiplies its device arrays on cuBLAS, whatever
    EXPECT_EQ(wrapped->name(), "cublas (bf16 tensor cores)");  // the host backend's name
    return;
  }
  const std::string why = host_bf16_hardware().empty()
                              ? "this CPU has neither AVX512-BF16 nor AMX-BF16"
                              : "hardware.gemm: openblas; auto or onednn runs bf16 on this CPU's " +
                                    host_bf16_hardware();
  EXPECT_EQ(wrapped->name(), "openblas (bf16 operands, emulated: " + why + ")");
#ifndef COLOSSAL_HAVE_CUDA
  try {
    make_default_gemm("cublas");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("-DCOLOSSAL_ENABLE_CUDA=ON"), std::string::npos)
        << e.what();
  }
#endif
}

void check_gemm(Gemm& gemm, int M, int N, int K, float beta) {
  for (Trans ta : {Trans::N, Trans::T}) {
    for (Trans tb : {Trans::N, Trans::T}) {
      // Leading dimensions larger than the matrices, as the strided q/k/v blocks use them.
      const int lda = (ta == Trans::N ? K : M) + 3, ldb = (tb == Trans::N ? N : K) + 2, ldc = N + 1;
      auto A = random_vector(std::size_t(lda) * (ta == Trans::N ? M : K), 1);
      auto B = random_vector(std::size_t(ldb) * (tb == Trans::N ? K : N), 2);
      auto C = random_vector(std::size_t(ldc) * M, 3);
      if (beta == 0.0f) std::fill(C.begin(), C.end(), std::nanf(""));
      auto expected = C;
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k) {
            const float a = ta == Trans::N ? A[i * lda + k] : A[k * lda + i];
            const float b = tb == Trans::N ? B[k * ldb + j] : B[j * ldb + k];
            s += double(a) * b;
          }
          expected[i * ldc + j] = float(0.5 * s + (beta == 0.0f ? 0.0 : beta * C[i * ldc + j]));
        }
      }
      gemm.gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
      for (std::size_t i = 0; i < C.size(); ++i) {  // the padding past N untouched (NaN or not)
        if (std::isnan(expected[i])) {
          ASSERT_TRUE(std::isnan(C[i])) << i;
        } else {
          ASSERT_NEAR(C[i], expected[i], 1e-4) << i;
        }
      }
    }
  }
}

// The lane reductions of the host row kernels: every element counted once, for lengths around
// the lane count and V = 50257; the maximum found wherever it lies; f's writes happen.
TEST(LaneReductions, SumEveryElementOnceAndFindTheMaximum) {
  for (int n : {0, 1, 7, 15, 16, 17, 33, 50257}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(kernels::lane_sum(n, [](int) { return 1.0f; }), float(n));
    double want = 0;
    for (int j = 0; j < n; ++j) want += j % 7;
    EXPECT_EQ(kernels::lane_sum(n, [](int j) { return float(j % 7); }), float(want));
    if (n == 0) continue;
    for (int at : {0, n / 2, n - 1}) {
      std::vector<float> x(n);
      for (int j = 0; j < n; ++j) x[j] = -1000.0f - float(j % 13);
      x[at] = -3.5f;
      EXPECT_EQ(kernels::lane_max(x.data(), n), -3.5f) << at;
    }
    std::vector<float> written(n, 0.0f);
    kernels::lane_sum(n, [&](int j) { return written[j] = 2.0f; });
    EXPECT_EQ(std::count(written.begin(), written.end(), 2.0f), n);
  }
  // Lane order: 1e8 and -1e8 in one lane cancel before the small values are added.
  std::vector<float> x(32, 1.0f);
  x[0] = 1e8f;
  x[16] = -1e8f;
  EXPECT_EQ(kernels::lane_sum(32, [&](int j) { return x[j]; }), 30.0f);
}

TEST_F(Kernels, EmbeddingBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 5, V = 4, P = 6, offset = 2;
  std::vector<int32_t> tokens = {1, 3, 1, 0, 1, 3};  // repeated tokens accumulate
  auto wte = random_vector(V * C, 1), wpe = random_vector(P * C, 2), g = random_vector(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto f = [&] {
    kernels::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, offset);
    return dot(out, g);
  };
  std::vector<float> dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  kernels::embedding_backward(dwte.data(), dwpe.data(), g.data(), tokens.data(), B, T, C, offset);
  EXPECT_EQ(check_gradient("dwte", f, wte, dwte), 0);
  EXPECT_EQ(check_gradient("dwpe", f, wpe, dwpe), 0);
  // Position rows below the offset are never used (OPT's first two rows).
  for (int c = 0; c < 2 * C; ++c) EXPECT_EQ(dwpe[c], 0.0f);
}

TEST_F(Kernels, LayernormBackwardMatchesFiniteDifferences) {
  const int N = 4, C = 9;
  auto x = random_vector(N * C, 1, 2.0f), w = random_vector(C, 2), b = random_vector(C, 3);
  auto g = random_vector(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto f = [&] {
    kernels::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                               N, C, 1e-5f);
    return dot(out, g);
  };
  f();
  // dinp accumulates (residual stream): start from a known value and subtract it.
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.0f), db(C, 0.0f);
  kernels::layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), N, C);
  for (auto& v : dx) v -= 0.5f;
  EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
  EXPECT_EQ(check_gradient("dw", f, w, dw), 0);
  EXPECT_EQ(check_gradient("db", f, b, db), 0);
}

TEST_F(Kernels, GeluBackwardMatchesFiniteDifferences) {
  const int n = 50;
  auto x = random_vector(n, 1, 4.0f), g = random_vector(n, 2);
  std::vector<float> out(n), dx(n);
  auto f = [&] {
    kernels::gelu_forward(out.data(), x.data(), n);
    return dot(out, g);
  };
  kernels::gelu_backward(dx.data(), x.data(), g.data(), n);
  EXPECT_EQ(check_gradient("gelu", f, x, dx, 1, 1e-3), 0);
  // The tanh approximation at known points (Hendrycks & Gimpel).
  std::vector<float> p = {-1.0f, 0.0f, 1.0f, 2.0f}, q(4);
  kernels::gelu_forward(q.data(), p.data(), 4);
  EXPECT_NEAR(q[0], -0.158808f, 1e-5);
  EXPECT_NEAR(q[1], 0.0f, 1e-7);
  EXPECT_NEAR(q[2], 0.841192f, 1e-5);
  EXPECT_NEAR(q[3], 1.954598f, 1e-5);
}

TEST_F(Kernels, ReluBackwardMatchesFiniteDifferences) {
  const int n = 40;
  auto x = random_vector(n, 5, 3.0f), g = random_vector(n, 6);
  for (auto& v : x) v += (v >= 0 ? 0.05f : -0.05f);  // stay clear of the kink
  std::vector<float> out(n), dx(n);
  auto f = [&] {
    kernels::relu_forward(out.data(), x.data(), n);
    return dot(out, g);
  };
  kernels::relu_backward(dx.data(), x.data(), g.data(), n);
  EXPECT_EQ(check_gradient("relu", f, x, dx, 1, 1e-3), 0);
  // In place, as the model runs it (dinp aliases dout): the same values.
  std::vector<float> inplace = g;
  kernels::relu_backward(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_EQ(inplace, dx);
}

// The MLP epilogue: pre += bias, out = act(pre) in one pass equals the bias added first and the
// activation after (bitwise: the same float operations), for GELU and ReLU, with the output in
// fp32 and as bf16 patterns (the rounded fp32 output); rows wider than one vector and odd.
TEST_F(Kernels, BiasActivationIsBiasThenActivation) {
  const int N = 7, M = 45;
  const auto x = random_vector(N * M, 11, 3.0f), bias = random_vector(M, 12);
  for (bool gelu : {true, false}) {
    SCOPED_TRACE(gelu ? "gelu" : "relu");
    std::vector<float> want_pre(N * M), want(N * M);
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < M; ++j) want_pre[n * M + j] = x[n * M + j] + bias[j];
    }
    if (gelu) {
      kernels::gelu_forward(want.data(), want_pre.data(), N * M);
    } else {
      kernels::relu_forward(want.data(), want_pre.data(), N * M);
    }
    auto pre = x;
    std::vector<float> out(N * M);
    kernels::bias_activation_forward(out.data(), pre.data(), bias.data(), N, M, gelu);
    EXPECT_EQ(pre, want_pre);
    EXPECT_EQ(out, want);
    auto pre16 = x;
    std::vector<std::uint16_t> out16(N * M), want16(N * M);
    kernels::bias_activation_forward(out16.data(), pre16.data(), bias.data(), N, M, gelu);
    to_bf16_bits(want.data(), want16.data(), want.size());
    EXPECT_EQ(pre16, want_pre);
    EXPECT_EQ(out16, want16);
  }
}

TEST_F(Kernels, CrossEntropyMatchesReferenceAndFiniteDifferences) {
  const int N = 3, V = 7;
  auto logits = random_vector(N * V, 1, 3.0f);
  std::vector<int32_t> targets = {0, 6, 3};
  std::vector<float> losses(N), work(N * V);
  // Reference loss in double.
  for (int n = 0; n < N; ++n) {
    double mx = -1e30, s = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, double(logits[n * V + j]));
    for (int j = 0; j < V; ++j) s += std::exp(logits[n * V + j] - mx);
    const double ref = std::log(s) + mx - logits[n * V + targets[n]];
    work = logits;
    kernels::cross_entropy_forward_backward(work.data(), losses.data(), targets.data(), N, V, V, 0.0f);
    EXPECT_NEAR(losses[n], ref, 1e-5);
  }
  EXPECT_EQ(work, logits) << "grad_scale 0 must leave the logits untouched";
  const float scale = 0.5f;
  auto f = [&] {
    work = logits;
    kernels::cross_entropy_forward_backward(work.data(), losses.data(), targets.data(), N, V, V, 0.0f);
    return scale * (double(losses[0]) + losses[1] + losses[2]);
  };
  std::vector<float> grad = logits;
  kernels::cross_entropy_forward_backward(grad.data(), losses.data(), targets.data(), N, V, V, scale);
  EXPECT_EQ(check_gradient("dlogits", f, logits, grad, 1, 1e-3), 0);
}

// The LM head's chunk has rows of an aligned stride (ActivationSizes::logits_ld): the loss and
// gradient of each row are those of the compact row, and the padding is never touched.
TEST_F(Kernels, CrossEntropyOverPaddedRowsMatchesCompactRows) {
  const int N = 4, V = 7, ld = 16;
  const auto compact = random_vector(N * V, 9, 3.0f);
  std::vector<int32_t> targets = {6, 0, 3, 5};
  for (float scale : {0.0f, 0.5f}) {
    std::vector<float> packed = compact, strided(std::size_t(N) * ld, 1e30f);
    for (int n = 0; n < N; ++n) {
      std::copy_n(compact.begin() + n * V, V, strided.begin() + std::ptrdiff_t(n) * ld);
    }
    std::vector<float> loss(N), strided_loss(N);
    kernels::cross_entropy_forward_backward(packed.data(), loss.data(), targets.data(), N, V, V,
                                            scale);
    kernels::cross_entropy_forward_backward(strided.data(), strided_loss.data(), targets.data(), N,
                                            V, ld, scale);
    EXPECT_EQ(strided_loss, loss) << "scale " << scale;
    for (int n = 0; n < N; ++n) {
      for (int j = 0; j < ld; ++j) {
        const float want = j < V ? packed[std::size_t(n) * V + j] : 1e30f;
        ASSERT_EQ(strided[std::size_t(n) * ld + j], want) << "row " << n << " column " << j;
      }
    }
  }
}

TEST_F(Kernels, LinearBackwardMatchesFiniteDifferencesInBothLayouts) {
  const int N = 6, in = 5, out = 4, ld_in = 7, ld_out = 9;  // strided rows, as q/k/v blocks
  for (WeightLayout layout : {WeightLayout::in_out, WeightLayout::out_in}) {
    auto x = random_vector(N * ld_in, 1), w = random_vector(in * out, 2), b = random_vector(out, 3);
    auto g = random_vector(N * ld_out, 4);
    for (int n = 0; n < N; ++n) {
      for (int j = out; j < ld_out; ++j) g[n * ld_out + j] = 0.0f;  // outside the block
    }
    std::vector<float> y(N * ld_out);
    auto f = [&] {
      std::fill(y.begin(), y.end(), 0.0f);
      kernels::broadcast_rows(y.data(), b.data(), N, out, ld_out);
      linear_forward(*gemm, layout, y.data(), ld_out, x.data(), ld_in, w.data(), in, out, N);
      return dot(y, g);
    };
    std::vector<float> dx(N * ld_in, 0.0f), dw(in * out, 0.0f), db(out, 0.0f);
    linear_backward(*gemm, layout, dx.data(), ld_in, dw.data(), db.data(), g.data(), ld_out,
                    x.data(), ld_in, w.data(), in, out, N, false);
    for (int n = 0; n < N; ++n) {
      for (int j = in; j < ld_in; ++j) EXPECT_EQ(dx[n * ld_in + j], 0.0f);
    }
    EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
    EXPECT_EQ(check_gradient("dw", f, w, dw), 0);
    EXPECT_EQ(check_gradient("db", f, b, db), 0);
  }
}

TEST_F(Kernels, CausalAttentionMatchesNaiveAndFiniteDifferences) {
  const int B = 2, T = 4, C = 6, H = 2, hs = C / H;
  auto qkv = random_vector(B * T * 3 * C, 1, 1.5f), g = random_vector(B * T * C, 2);
  std::vector<float> att(B * H * T * T), y(B * T * C);
  attention_forward(*gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
  // Naive reference of the forward pass.
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < T; ++i) {
        std::vector<double> p(T, 0.0);
        double mx = -1e30, s = 0;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int k = 0; k < hs; ++k) {
            d += double(qkv[(b * T + i) * 3 * C + h * hs + k]) * qkv[(b * T + j) * 3 * C + C + h * hs + k];
          }
          p[j] = d / std::sqrt(double(hs));
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j <= i; ++j) s += (p[j] = std::exp(p[j] - mx));
        for (int k = 0; k < hs; ++k) {
          double o = 0;
          for (int j = 0; j <= i; ++j) o += p[j] / s * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + k];
          EXPECT_NEAR(y[(b * T + i) * C + h * hs + k], o, 1e-5);
        }
        for (int j = i + 1; j < T; ++j) EXPECT_EQ(att[((b * H + h) * T + i) * T + j], 0.0f);
      }
    }
  }
  auto f = [&] {
    attention_forward(*gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
    return dot(y, g);
  };
  f();
  std::vector<float> dqkv(B * T * 3 * C), scratch(H * T * T);
  attention_backward(*gemm, dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(), B, T, C, H);
  EXPECT_EQ(check_gradient("dqkv", f, qkv, dqkv, 1, 1e-2, 1e-3), 0);
}

TEST_F(Kernels, BiasBackwardAccumulatesColumnSums) {
  const int N = 70, M = 37, ld = 40;  // more columns than one chunk, ragged last chunk
  auto d = random_vector(N * ld, 9);
  std::vector<float> db(M, 1.0f);
  kernels::bias_backward(db.data(), d.data(), N, M, ld);
  for (int j = 0; j < M; ++j) {
    double s = 1.0;
    for (int n = 0; n < N; ++n) s += d[n * ld + j];
    EXPECT_NEAR(db[j], s, 1e-4);
  }
}

TEST(FastMath, ExpAndTanhMatchTheLibraryToFloatPrecision) {
  double worst_exp = 0, worst_tanh = 0;
  for (int i = -870000; i <= 880000; i += 7) {
    const float x = i * 1e-4f;
    const double ref = std::exp(double(x));
    worst_exp = std::max(worst_exp, std::abs(kernels::fast_exp(x) - ref) / ref);
  }
  for (int i = -200000; i <= 200000; i += 3) {
    const float u = i * 1e-4f;
    worst_tanh = std::max(worst_tanh, std::abs(kernels::fast_tanh(u) - std::tanh(double(u))));
  }
  EXPECT_LT(worst_exp, 4e-7);
  EXPECT_LT(worst_tanh, 4e-7);
  EXPECT_EQ(kernels::fast_exp(-1000.0f) < 1e-37f, true);  // clamped, no garbage
  EXPECT_TRUE(std::isfinite(kernels::fast_exp(1000.0f)));
}

TEST(Reductions, SumSquaresMatchesDoubleReferenceForRaggedLengths) {
  MemoryTracker tracker;
  for (int64_t n : {1, 15, 17, 4095, 4097, 20000}) {
    auto x = random_vector(n, 11, 3.0f);
    double ref = 0;
    for (float v : x) ref += double(v) * v;
    // In the default execution space's memory: on the device in a Kokkos CUDA build.
    DeviceArray<float> d(tracker, MemCategory::temporaries, std::size_t(n));
    copy_to_device(d.data(), x.data(), x.size() * sizeof(float));
    EXPECT_NEAR(kernels::sum_squares(d.data(), n), ref, 1e-6 * ref) << n;
    double plain = 0;
    for (float v : x) plain += v;
    EXPECT_NEAR(kernels::sum(d.data(), n), plain, 1e-4) << n;
  }
}

// Tiles of 4 positions: T = 9 has three query tiles (the last ragged), off-diagonal and masked
// diagonal blocks, and the online softmax's rescaling across key tiles; tile 16 is one block.
TEST_F(Kernels, FusedAttentionMatchesDenseForwardAndBackward) {
  for (int tile : {4, 16}) {
    SCOPED_TRACE("tile " + std::to_string(tile));
    check_fused_attention(*gemm, tile);
  }
}

void check_fused_attention(Gemm& gemm_ref, int tile) {
  Gemm* gemm = &gemm_ref;
  const int B = 2, T = 9, C = 12, H = 3;
  std::vector<float> work(fused_attention_work_floats(tile));
  auto qkv = random_vector(B * T * 3 * C, 21, 2.0f), g = random_vector(B * T * C, 22);
  std::vector<float> att(B * H * T * T), dense_y(B * T * C), dense_dqkv(B * T * 3 * C),
      scratch(H * T * T);
  attention_forward(*gemm, att.data(), dense_y.data(), qkv.data(), B, T, C, H);
  attention_backward(*gemm, dense_dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(), B,
                     T, C, H);
  std::vector<float> lse(B * H * T), y(B * T * C), dqkv(B * T * 3 * C, 7.0f);
  fused_attention_forward(*gemm, lse.data(), y.data(), qkv.data(), work.data(), B, T, C, H,
                            tile);
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], dense_y[i], 1e-5) << i;
  // The saved log-sum-exp reproduces the dense probabilities.
  const int hs = C / H;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int i = 0; i < T; ++i) {
        for (int j = 0; j <= i; ++j) {
          double s = 0;
          for (int e = 0; e < hs; ++e) {
            s += double(qkv[(b * T + i) * 3 * C + h * hs + e]) * qkv[(b * T + j) * 3 * C + C + h * hs + e];
          }
          const double p = std::exp(s / std::sqrt(double(hs)) - lse[(b * H + h) * T + i]);
          ASSERT_NEAR(p, att[((b * H + h) * T + i) * T + j], 1e-5);
        }
      }
    }
  }
  fused_attention_backward(*gemm, dqkv.data(), g.data(), y.data(), qkv.data(), lse.data(),
                           work.data(), B, T, C, H, tile);
  for (std::size_t i = 0; i < dqkv.size(); ++i) ASSERT_NEAR(dqkv[i], dense_dqkv[i], 1e-4) << i;
  auto f = [&] {
    fused_attention_forward(*gemm, lse.data(), y.data(), qkv.data(), work.data(), B, T, C, H,
                            tile);
    return dot(y, g);
  };
  f();
  fused_attention_backward(*gemm, dqkv.data(), g.data(), y.data(), qkv.data(), lse.data(),
                           work.data(), B, T, C, H, tile);
  EXPECT_EQ(check_gradient("fused dqkv", f, qkv, dqkv, 1, 1e-2, 1e-3), 0);
}
