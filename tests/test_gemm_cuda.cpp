// cuBLAS behind the Gemm interface against OpenBLAS, for every transpose and strided batches.
// Compiled in every CUDA build so the backend always links; skipped where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "core/gemm.hpp"
#include "grad_check.hpp"

using namespace colossal::core;

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
      auto A = colossal::test::random_vector(sa * batch, 1), B = colossal::test::random_vector(sb * batch, 2);
      auto C = colossal::test::random_vector(sc * batch, 3);
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

}  // namespace
