// The one interface every matrix product goes through: OpenBLAS (cblas) on the host, cuBLAS on
// CUDA. Row-major, as the rest of the code: C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// A host GEMM backend (host memory): "openblas" (linked), "blis" or "onednn" (loaded at run time
// when their Debian libraries libblis4-* / libdnnl2 are installed), or "auto" (per shape the
// fastest of those available, measured on the shape's first product). Throws naming what is
// missing.
std::unique_ptr<Gemm> make_host_gemm(const std::string& backend = "openblas");
// The host backends that load here, "openblas" first.
std::vector<std::string> host_gemm_backends();
#ifdef COLOSSAL_HAVE_CUDA
// cuBLAS on the current CUDA device; operates on device memory. Creates its own handle.
std::unique_ptr<Gemm> make_cublas_gemm();
#endif
// Threads each host GEMM uses (OpenBLAS now; BLIS and oneDNN when they are created).
void set_blas_threads(int threads);

// The backend that matches the default Kokkos execution space's memory: cuBLAS on a device,
// otherwise the named host backend.
std::unique_ptr<Gemm> make_default_gemm(const std::string& host_backend = "openblas");

}  // namespace colossal::core
