// The one interface every matrix product goes through: OpenBLAS (cblas) on the host, cuBLAS on
// CUDA. Row-major, as the rest of the code: C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace colossal::core {

enum class Trans { N, T };

class Gemm {
 public:
  virtual ~Gemm() = default;
  virtual std::string name() const = 0;
  virtual void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc) = 0;
  // `batch` independent products; matrix i starts at A + i*stride_a (likewise B, C).
  virtual void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha,
                                    const float* A, int lda, int64_t stride_a, const float* B,
                                    int ldb, int64_t stride_b, float beta, float* C, int ldc,
                                    int64_t stride_c, int batch) = 0;
};

// OpenBLAS through cblas; operates on host memory.
std::unique_ptr<Gemm> make_host_gemm();
#ifdef COLOSSAL_HAVE_CUDA
// cuBLAS on the current CUDA device; operates on device memory. Creates its own handle.
std::unique_ptr<Gemm> make_cublas_gemm();
#endif
// Threads OpenBLAS uses for each host GEMM.
void set_blas_threads(int threads);

// The backend that matches the default Kokkos execution space's memory.
std::unique_ptr<Gemm> make_default_gemm();

}  // namespace colossal::core
