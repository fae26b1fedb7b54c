// cuBLAS backends. Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// i.e. by swapping the operands; no transposes are materialised.
//
// Two of them: CublasGemm works on device arrays (a Kokkos CUDA build); CublasHostGemm takes host
// arrays (the Serial/OpenMP build with hardware.gemm: cublas), copies the operands to the
// device, multiplies there and copies the result back.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/gemm.hpp"

namespace colossal::core {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS ") + what + " failed with status " +
                             std::to_string(static_cast<int>(status)));
  }
}

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA ") + what + " failed: " + cudaGetErrorName(error) +
                             ": " + cudaGetErrorString(error));
  }
}

cublasOperation_t to_cublas(Trans t) { return t == Trans::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

class CublasGemm : public Gemm {
 public:
  explicit CublasGemm(GemmPrecision precision) : precision_(precision) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      throw std::runtime_error(
          "cuBLAS GEMM: no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES "
          "and the job's --gpus-per-task), or choose a host hardware.gemm: openblas, blis, "
          "onednn, auto");
    }
    check(cublasCreate(&handle_), "cublasCreate");
    // fp32 products use plain fp32 arithmetic (no TF32): results match the host within fp32
    // tolerance. bf16 products ask for the tensor cores through the compute type.
    if (cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
      cublasDestroy(handle_);  // the destructor does not run for a throwing constructor
      throw std::runtime_error("cuBLAS cublasSetMathMode failed");
    }
  }
  ~CublasGemm() override { cublasDestroy(handle_); }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  std::string name() const override {
    return precision_ == GemmPrecision::bf16 ? "cublas (bf16 tensor cores)" : "cublas";
  }

  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    device_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }

  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    device_batched(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                   stride_c, batch);
  }

 protected:
  void device_gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
    if (precision_ == GemmPrecision::fp32) {
      check(cublasSgemm(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, ldb, A, lda,
                        &beta, C, ldc),
            "cublasSgemm");
      return;
    }
    check(cublasGemmEx(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, CUDA_R_32F, ldb,
                       A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                       CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
  }

  void device_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                      int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                      float beta, float* C, int ldc, int64_t stride_c, int batch) {
    if (precision_ == GemmPrecision::fp32) {
      check(cublasSgemmStridedBatched(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B,
                                      ldb, stride_b, A, lda, stride_a, &beta, C, ldc, stride_c,
                                      batch),
            "cublasSgemmStridedBatched");
      return;
    }
    check(cublasGemmStridedBatchedEx(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B,
                                     CUDA_R_32F, ldb, stride_b, A, CUDA_R_32F, lda, stride_a,
                                     &beta, C, CUDA_R_32F, ldc, stride_c, batch,
                                     CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx (bf16)");
  }

  GemmPrecision precision_;
  cublasHandle_t handle_ = nullptr;
};

// A device buffer that only grows.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  ~DeviceBytes() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* reserve(std::size_t bytes) {
    if (bytes > capacity_) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = nullptr;
      capacity_ = 0;  // a failed allocation below must not leave a stale capacity
      check(cudaMalloc(&data_, bytes), "cudaMalloc (GEMM operand)");
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

class CublasHostGemm final : public CublasGemm {
 public:
  using CublasGemm::CublasGemm;
  std::string name() const override {
    return precision_ == GemmPrecision::bf16 ? "cublas (bf16 x bf16, fp32 sums), host arrays staged"
                                             : "cublas, host arrays staged";
  }

  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    gemm_strided_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }

  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    if (M <= 0 || N <= 0 || batch <= 0) return;
    if (stride_a < 0 || stride_b < 0 || stride_c < 0) {
      throw std::invalid_argument("cuBLAS host GEMM: negative batch strides are not supported");
    }
    const std::size_t na = operand_span(ta, M, K, lda, stride_a, batch);
    const std::size_t nb = operand_span(tb, K, N, ldb, stride_b, batch);
    const std::size_t nc = operand_span(Trans::N, M, N, ldc, stride_c, batch);
    const bool bf16 = precision_ == GemmPrecision::bf16;
    const void* a = upload(a_, host_a_, A, na, bf16);
    const void* b = upload(b_, host_b_, B, nb, bf16);
    float* c = static_cast<float*>(c_.reserve(nc * sizeof(float)));
    // C moves as M rows of N columns per matrix: the columns between them (C may be a column
    // block of a wider array) belong to the caller and are neither read nor written.
    if (beta != 0.0f) copy_c(C, c, M, N, ldc, stride_c, batch, cudaMemcpyHostToDevice);
    if (!bf16 && batch == 1) {
      device_gemm(ta, tb, M, N, K, alpha, static_cast<const float*>(a), lda,
                  static_cast<const float*>(b), ldb, beta, c, ldc);
    } else if (!bf16) {
      device_batched(ta, tb, M, N, K, alpha, static_cast<const float*>(a), lda, stride_a,
                     static_cast<const float*>(b), ldb, stride_b, beta, c, ldc, stride_c, batch);
    } else {
      check(cublasGemmStridedBatchedEx(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, b,
                                       CUDA_R_16BF, ldb, stride_b, a, CUDA_R_16BF, lda, stride_a,
                                       &beta, c, CUDA_R_32F, ldc, stride_c, batch,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx (bf16 operands)");
    }
    copy_c(c, C, M, N, ldc, stride_c, batch, cudaMemcpyDeviceToHost);
  }

 private:
  // The operand on the device: fp32 as is, or its bf16 bit patterns (rounded on the host).
  static const void* upload(DeviceBytes& device, std::vector<std::uint16_t>& staging,
                            const float* host, std::size_t n, bool bf16) {
    if (!bf16) {
      void* d = device.reserve(n * sizeof(float));
      check(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy (operand)");
      return d;
    }
    if (staging.size() < n) staging.resize(n);
    to_bf16_bits(host, staging.data(), n);
    void* d = device.reserve(n * sizeof(std::uint16_t));
    check(cudaMemcpy(d, staging.data(), n * sizeof(std::uint16_t), cudaMemcpyHostToDevice),
          "cudaMemcpy (bf16 operand)");
    return d;
  }

  static void copy_c(const float* from, float* to, int M, int N, int ldc, int64_t stride_c,
                     int batch, cudaMemcpyKind kind) {
    const std::size_t pitch = std::size_t(ldc) * sizeof(float);
    if (ldc == N && (batch == 1 || stride_c == int64_t(M) * N)) {
      check(cudaMemcpy(to, from, std::size_t(batch) * M * N * sizeof(float), kind),
            "cudaMemcpy (C)");
      return;
    }
    for (int i = 0; i < batch; ++i) {
      check(cudaMemcpy2D(to + i * stride_c, pitch, from + i * stride_c, pitch, N * sizeof(float),
                         M, kind),
            "cudaMemcpy2D (C)");
    }
  }
  DeviceBytes a_, b_, c_;
  std::vector<std::uint16_t> host_a_, host_b_;
};

}  // namespace

std::unique_ptr<Gemm> make_cublas_gemm(GemmPrecision precision) {
  return std::make_unique<CublasGemm>(precision);
}

std::unique_ptr<Gemm> make_cublas_host_gemm(GemmPrecision precision) {
  return std::make_unique<CublasHostGemm>(precision);
}

}  // namespace colossal::core
