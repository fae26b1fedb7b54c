// cuBLAS backend. Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// i.e. by swapping the operands; no transposes are materialised.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/gemm.hpp"

namespace colossal::core {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS ") + what + " failed with status " +
                             std::to_string(static_cast<int>(status)));
  }
}

cublasOperation_t to_cublas(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

class CublasGemm final : public Gemm {
 public:
  CublasGemm() {
    check(cublasCreate(&handle_), "cublasCreate");
    // TF32 tensor cores only when asked: fp32 results must match the host within fp32 tolerance.
    check(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~CublasGemm() override { cublasDestroy(handle_); }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  std::string name() const override { return "cublas"; }

  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    check(cublasSgemm(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, ldb, A, lda, &beta,
                      C, ldc),
          "cublasSgemm");
  }

  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    check(cublasSgemmStridedBatched(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, ldb,
                                    stride_b, A, lda, stride_a, &beta, C, ldc, stride_c, batch),
          "cublasSgemmStridedBatched");
  }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<Gemm> make_cublas_gemm() { return std::make_unique<CublasGemm>(); }

}  // namespace colossal::core
