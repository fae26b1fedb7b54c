// cuBLAS behind the Gemm interface against OpenBLAS, for every transpose and strided batches.
// Compiled in every CUDA build so the backend always links; skipped where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/trainer.hpp"
#include "core/bf16.hpp"
#include "core/gemm.hpp"
#include "io/config.hpp"
#include "grad_check.hpp"

using namespace colossal::core;
using colossal::test::random_vector;

namespace {

struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<float>& host) : count(host.size()) {
    if (cudaMalloc(&ptr, count * sizeof(float)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemcpy(ptr, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<float> read() const {
    std::vector<float> host(count);
    cudaMemcpy(host.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost);
    return host;
  }
  float* ptr = nullptr;
  std::size_t count;
};

bool have_gpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

[[maybe_unused]] bool maps_contain(const std::string& name) {  // unused in Kokkos CUDA builds
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

// A host build opens libcublas only when a cuBLAS backend is made (linked, its libcublasLt kept
// 146 MB resident in every CPU run); a Kokkos CUDA build links it. Without a GPU the backend
// still loads the library, then says no device is visible.
TEST(CublasGemm, HostBuildsLoadCublasOnlyWhenAsked) {
#ifdef KOKKOS_ENABLE_CUDA
  GTEST_SKIP() << "a Kokkos CUDA build links cuBLAS";
#else
  EXPECT_FALSE(maps_contain("libcublas")) << "libcublas is mapped before any cuBLAS backend";
  auto fp32 = make_host_gemm();  // a host backend loads nothing of CUDA's
  EXPECT_FALSE(maps_contain("libcublas"));
  try {
    auto device = make_cublas_host_gemm();
    EXPECT_TRUE(have_gpu());
  } catch (const std::runtime_error& e) {
    EXPECT_FALSE(have_gpu()) << e.what();
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(maps_contain("libcublas.so")) << "the backend opened libcublas";
  EXPECT_TRUE(maps_contain("libcublasLt.so"));
#endif
}

TEST(CublasGemm, MatchesOpenBlasForEveryTransposeAndBatch) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  auto host = make_host_gemm();
  auto device = make_cublas_gemm();
  const int M = 33, N = 17, K = 45, batch = 3;
  for (Trans ta : {Trans::N, Trans::T}) {
    for (Trans tb : {Trans::N, Trans::T}) {
      const int lda = (ta == Trans::N ? K : M) + 2, ldb = (tb == Trans::N ? N : K) + 1, ldc = N + 3;
      const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K), sb = int64_t(ldb) * (tb == Trans::N ? K : N),
                    sc = int64_t(ldc) * M;
      auto A = random_vector(sa * batch, 1), B = random_vector(sb * batch, 2);
      auto C = random_vector(sc * batch, 3);
      DeviceBuffer dA(A), dB(B), dC(C);
      host->gemm_strided_batched(ta, tb, M, N, K, 0.7f, A.data(), lda, sa, B.data(), ldb, sb, 0.3f,
                                 C.data(), ldc, sc, batch);
      device->gemm_strided_batched(ta, tb, M, N, K, 0.7f, dA.ptr, lda, sa, dB.ptr, ldb, sb, 0.3f,
                                   dC.ptr, ldc, sc, batch);
      cudaDeviceSynchronize();
      const auto got = dC.read();
      for (std::size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(got[i], C[i], 1e-4) << i;
    }
  }
}

// hardware.gemm: cublas with bf16 (bf16 x bf16 on the tensor cores, fp32 sums) computes what the
// host's bf16 emulation computes, up to summation order, and visibly differs from fp32.
TEST(CublasGemm, Bf16TensorCoresMatchTheHostBf16Emulation) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  auto host = make_bf16_gemm(make_host_gemm());
  auto fp32 = make_host_gemm();
  auto device = make_cublas_host_gemm(GemmPrecision::bf16);
  const int M = 64, N = 48, K = 256, batch = 2;
  for (Trans ta : {Trans::N, Trans::T}) {
    for (Trans tb : {Trans::N, Trans::T}) {
      const int lda = ta == Trans::N ? K : M, ldb = tb == Trans::N ? N : K, ldc = N;
      const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K),
                    sb = int64_t(ldb) * (tb == Trans::N ? K : N), sc = int64_t(ldc) * M;
      auto A = random_vector(sa * batch, 4), B = random_vector(sb * batch, 5);
      std::vector<float> C(sc * batch, 0.0f), plain = C;
      std::vector<float> got = C;
      host->gemm_strided_batched(ta, tb, M, N, K, 1.0f, A.data(), lda, sa, B.data(), ldb, sb, 0.0f,
                                 C.data(), ldc, sc, batch);
      fp32->gemm_strided_batched(ta, tb, M, N, K, 1.0f, A.data(), lda, sa, B.data(), ldb, sb, 0.0f,
                                 plain.data(), ldc, sc, batch);
      device->gemm_strided_batched(ta, tb, M, N, K, 1.0f, A.data(), lda, sa, B.data(), ldb, sb,
                                   0.0f, got.data(), ldc, sc, batch);
      double worst = 0, from_fp32 = 0;
      for (std::size_t i = 0; i < C.size(); ++i) {
        worst = std::max(worst, double(std::abs(got[i] - C[i])));
        from_fp32 = std::max(from_fp32, double(std::abs(got[i] - plain[i])));
      }
      std::printf("bf16: |cuBLAS - host emulation| <= %.2e, |cuBLAS - fp32| up to %.2e\n", worst,
                  from_fp32);
      EXPECT_GT(from_fp32, 1e-3) << "cuBLAS bf16 computed fp32";
      EXPECT_LT(worst, 0.05 * from_fp32) << "cuBLAS bf16 is not bf16-rounded operands in fp32";
    }
  }
}

// bf16 on device arrays, bounded by bf16 rounding's error: in a host-Kokkos build cuBLAS's own
// CUBLAS_COMPUTE_32F_FAST_16BF (it chooses the reduced-precision kernel, so the result is only
// bounded, not equal); in a Kokkos CUDA build the operands rounded on the device
// (DeviceBf16RoundsExactlyHoldsOnceAndTakesBf16AsIs below holds that path to the emulation).
TEST(CublasGemm, DeviceArraysBf16StaysWithinBf16Error) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  auto host = make_bf16_gemm(make_host_gemm());
  auto fp32 = make_host_gemm();
  auto device = make_cublas_gemm(GemmPrecision::bf16);
  const int M = 64, N = 48, K = 256;
  const auto A = random_vector(std::size_t(M) * K, 4);
  const auto B = random_vector(std::size_t(K) * N, 5);
  std::vector<float> bf(std::size_t(M) * N), plain = bf;
  host->gemm(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, bf.data(), N);
  fp32->gemm(Trans::N, Trans::N, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, plain.data(), N);
  DeviceBuffer dA(A), dB(B), dC(plain);
  device->gemm(Trans::N, Trans::N, M, N, K, 1.0f, dA.ptr, K, dB.ptr, N, 0.0f, dC.ptr, N);
  cudaDeviceSynchronize();
  const auto got = dC.read();
  double bf16_error = 0, error = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bf16_error = std::max(bf16_error, double(std::abs(bf[i] - plain[i])));
    error = std::max(error, double(std::abs(got[i] - plain[i])));
  }
  std::printf("FAST_16BF: |cuBLAS - fp32| up to %.2e; bf16 rounding's %.2e\n", error, bf16_error);
  EXPECT_LE(error, 1.5 * bf16_error);
}

// A Kokkos CUDA build's bf16 on device arrays rounds each fp32 operand on the device (ties to
// even, the host emulation's rounding) and multiplies bf16 x bf16 with fp32 sums: the host
// emulation's result up to summation order, through each branch of that path: an fp32 operand
// at an unaligned offset with padded rows (the rounding kernel's one-value form), a weight inside
// a held range of odd length (converted once for two products, again after the values change),
// a bf16 operand taken as it is, beta = 1 into a column block of a wider C (its other columns
// left alone).
TEST(CublasGemm, DeviceBf16RoundsExactlyHoldsOnceAndTakesBf16AsIs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  if (colossal::test::host_memory()) {
    GTEST_SKIP() << "a host-Kokkos build leaves bf16 on device arrays to cuBLAS (FAST_16BF)";
  }
  auto emulation = make_bf16_gemm(make_host_gemm());
  auto fp32 = make_host_gemm();
  auto device = make_cublas_gemm(GemmPrecision::bf16);
  const int M = 40, N = 56, K = 72, lda = K + 3, ldc = N + 5;
  const std::size_t x_at = 1, w_at = 7;  // X 4 bytes, the weight 28 bytes past aligned starts
  auto params = random_vector(w_at + std::size_t(K) * N + 10, 11);  // 4049 floats: a tail of 1
  const auto xs = random_vector(x_at + std::size_t(M) * lda, 12);
  const auto c0 = random_vector(std::size_t(M) * ldc, 13);
  DeviceBuffer dP(params), dX(xs), dC(c0);
  // The device's C = X W + C0 (fp32 X, or X's bf16 patterns) against the emulation's and fp32's.
  auto check = [&](const char* what, GemmOperand x) {
    cudaMemcpy(dC.ptr, c0.data(), c0.size() * sizeof(float), cudaMemcpyHostToDevice);
    device->gemm_mixed(Trans::N, Trans::N, M, N, K, 1.0f, x, lda, GemmOperand(dP.ptr + w_at), N,
                       1.0f, dC.ptr, ldc);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    std::vector<float> want = c0, plain = c0;
    emulation->gemm(Trans::N, Trans::N, M, N, K, 1.0f, xs.data() + x_at, lda,
                    params.data() + w_at, N, 1.0f, want.data(), ldc);
    fp32->gemm(Trans::N, Trans::N, M, N, K, 1.0f, xs.data() + x_at, lda, params.data() + w_at, N,
               1.0f, plain.data(), ldc);
    const auto got = dC.read();
    double worst = 0, from_fp32 = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, double(std::abs(got[i] - want[i])));
      from_fp32 = std::max(from_fp32, double(std::abs(got[i] - plain[i])));
      if (int(i % ldc) >= N) {
        ASSERT_EQ(got[i], c0[i]) << what << ": C's column " << i % ldc;
      }
    }
    std::printf("%s: |device - emulation| <= %.2e, |device - fp32| up to %.2e\n", what, worst,
                from_fp32);
    EXPECT_GT(from_fp32, 1e-3) << what << ": the device computed fp32";
    EXPECT_LT(worst, 0.05 * from_fp32) << what << ": not bf16-rounded operands summed in fp32";
  };
  device->hold_stable(dP.ptr, params.size(), false);
  check("fp32 X, held W", GemmOperand(dX.ptr + x_at));
  EXPECT_EQ(device->stable_conversions(), 1u);
  device->hold_stable(dP.ptr, params.size(), true);  // the same values: the copy serves
  std::vector<std::uint16_t> bits(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) bits[i] = bf16_bits(xs[i]);
  std::uint16_t* dbits = nullptr;
  ASSERT_EQ(cudaMalloc(&dbits, bits.size() * sizeof(std::uint16_t)), cudaSuccess);
  cudaMemcpy(dbits, bits.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyHostToDevice);
  check("bf16 X as it is, held W", GemmOperand(dbits + x_at));
  EXPECT_EQ(device->stable_conversions(), 1u) << "a promised-unchanged hold converted again";
  for (float& p : params) p = -p;  // the optimizer's step, say: converted anew on the next use
  cudaMemcpy(dP.ptr, params.data(), params.size() * sizeof(float), cudaMemcpyHostToDevice);
  device->hold_stable(dP.ptr, params.size(), false);
  check("fp32 X, changed W", GemmOperand(dX.ptr + x_at));
  EXPECT_EQ(device->stable_conversions(), 2u);
  device->hold_stable(nullptr, 0, false);
  cudaFree(dbits);
}

// hardware.gemm: cublas takes host arrays. C may be a column block of a wider array: the columns
// outside it are the caller's and must survive, with beta = 0 (C not read) and beta != 0.
TEST(CublasGemm, HostArraysMatchOpenBlasAndLeaveTheRestOfCAlone) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  auto host = make_host_gemm();
  // hardware.gemm: cublas of a host-Kokkos build; a Kokkos CUDA build's arrays are on the device
  // and make_default_gemm gives the device backend, but the staged one exists in both.
  auto staged = colossal::test::host_memory() ? make_default_gemm("cublas")
                                              : make_cublas_host_gemm();
  EXPECT_NE(staged->name().find("cublas"), std::string::npos);
  const int M = 21, N = 13, K = 37, batch = 4;
  for (float beta : {0.0f, 0.5f}) {
    for (Trans ta : {Trans::N, Trans::T}) {
      for (Trans tb : {Trans::N, Trans::T}) {
        const int lda = (ta == Trans::N ? K : M) + 1, ldb = (tb == Trans::N ? N : K) + 2,
                  ldc = N + 5;
        const int64_t sa = int64_t(lda) * (ta == Trans::N ? M : K) + 3,
                      sb = int64_t(ldb) * (tb == Trans::N ? K : N), sc = int64_t(ldc) * M + 7;
        auto A = random_vector(sa * batch, 6), B = random_vector(sb * batch, 7);
        auto want = random_vector(sc * batch, 8), got = want, one = want;
        host->gemm_strided_batched(ta, tb, M, N, K, 0.9f, A.data(), lda, sa, B.data(), ldb, sb,
                                   beta, want.data(), ldc, sc, batch);
        staged->gemm_strided_batched(ta, tb, M, N, K, 0.9f, A.data(), lda, sa, B.data(), ldb, sb,
                                     beta, got.data(), ldc, sc, batch);
        staged->gemm(ta, tb, M, N, K, 0.9f, A.data(), lda, B.data(), ldb, beta, one.data(), ldc);
        for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << i;
        for (int64_t i = 0; i < sc; ++i) ASSERT_NEAR(one[i], want[i], 1e-4) << i;
      }
    }
  }
}

// Training with the products on the GPU: fp32 follows the host run step by step; bf16 on the
// tensor cores follows the host's bf16 emulation.
TEST(CublasGemm, TrainingOnTheGpuMatchesTheHost) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  if (!colossal::test::host_memory()) {
    GTEST_SKIP() << "a Kokkos CUDA build trains on the GPU whatever hardware.gemm says; "
                    "scripts/gpu_check.sh compares its losses with the host build's";
  }
  const auto dir = std::filesystem::temp_directory_path() / "colossal_cuda_train";
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 6000; ++i) text.push_back("the colossal model learns this line. "[i % 37]);
  std::ofstream(dir / "data.txt") << text;
  auto config = [&](const std::string& gemm, const std::string& precision) {
    return colossal::io::parse_config(
        "model: {arch: gpt2, layers: 2, hidden: 128, heads: 4, vocab: 256, max_seq: 64}\n"
        "data: {path: " + (dir / "data.txt").string() + "}\n"
        "train: {steps: 10, seq_len: 64, global_batch: 8, micro_batch: 4, precision: " +
            precision + ", optimizer: {lr: 3.0e-3, warmup: 2}}\n"
        "hardware: {gemm: " + gemm + "}\n"
        "eval: {every: 0}\nlog: {every: 1000, dir: " + (dir / "run").string() + "}\n",
        "test");
  };
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    colossal::apps::Trainer cpu(config("openblas", precision), nullptr);
    colossal::apps::Trainer gpu(config("cublas", precision), nullptr);
    const auto a = cpu.train(), b = gpu.train();
    ASSERT_EQ(a.losses.size(), b.losses.size());
    for (std::size_t i = 0; i < a.losses.size(); ++i) {
      std::printf("%s step %zu: host %.6f  gpu %.6f\n", precision.c_str(), i + 1, a.losses[i],
                  b.losses[i]);
      // bf16: a summation-order difference can flip an operand's rounding (2^-9 relative), so
      // the runs drift apart faster than fp32's.
      const double tolerance = precision == "fp32" ? 1e-4 : 1e-2;
      EXPECT_NEAR(b.losses[i], a.losses[i], tolerance * a.losses[i]) << "step " << i + 1;
    }
  }
}

}  // namespace
