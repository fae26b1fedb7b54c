// cuBLAS backends. Row-major C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T,
// i.e. by swapping the operands; no transposes are materialised.
//
// Two of them: CublasGemm works on device arrays (a Kokkos CUDA build); CublasHostGemm takes host
// arrays (the Serial/OpenMP build with hardware.gemm: cublas), copies the operands to the
// device, multiplies there and copies the result back.
//
// bf16 on device arrays: in a Kokkos CUDA build each fp32 operand is rounded to bf16 on the device
// (round to nearest even, core/bf16.hpp, the host emulation's rounding) and multiplied bf16 x bf16
// with fp32 sums (CUBLAS_COMPUTE_32F): the host's bf16 numerics up to summation order, at the
// tensor cores' bf16 rate. The held parameters (Gemm::hold_stable) are rounded once per step;
// operands stored in bf16 go in as they are. A host-Kokkos build has no device kernels: there
// cuBLAS rounds fp32 device arrays itself (CUBLAS_COMPUTE_32F_FAST_16BF, test arrays only).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/gemm.hpp"
#include "core/gemm_stable.hpp"
#include "core/kernels.hpp"  // detail::to_bf16_on_device's declaration
#include "core/memory.hpp"
#include "core/shared_library.hpp"

#define COLOSSAL_STRINGIFY_(x) #x
#define COLOSSAL_STRINGIFY(x) COLOSSAL_STRINGIFY_(x)

namespace colossal::core {
// The device kernels of the bf16 path (external linkage: nvcc's extended lambdas need it);
// to_bf16_on_device also serves kernels::to_bf16 on a device (activations saved in bf16).
namespace detail {
#ifdef KOKKOS_ENABLE_CUDA
// out[i] = in[i] rounded to bf16 (its pattern), on the device, in stream order with cuBLAS (the
// Kokkos stream). Eight values per thread through 16-byte loads and stores where both arrays
// allow it, else one value per thread. (A plain Kokkos range, one value per thread, moved about
// 0.65 TB/s on an H200 and halved a bf16 gpt2-124m step's speed: 51,782 against 98,493 tokens/s.)
__global__ void round_to_bf16_by_8(const float4* in, uint4* out, std::size_t groups) {
  for (std::size_t g = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; g < groups;
       g += std::size_t(gridDim.x) * blockDim.x) {
    const float4 a = in[2 * g], b = in[2 * g + 1];
    auto pack = [](float lo, float hi) {
      return std::uint32_t(bf16_bits(lo)) | (std::uint32_t(bf16_bits(hi)) << 16);
    };
    out[g] = make_uint4(pack(a.x, a.y), pack(a.z, a.w), pack(b.x, b.y), pack(b.z, b.w));
  }
}
__global__ void round_to_bf16_by_1(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    out[i] = bf16_bits(in[i]);
  }
}
void to_bf16_on_device(const float* in, std::uint16_t* out, std::size_t n) {
  if (n == 0) return;
  const cudaStream_t stream = Kokkos::Cuda().cuda_stream();
  const auto blocks = [](std::size_t items) {  // grid-stride loops: at most 8 blocks per SM of
    return unsigned(std::min<std::size_t>((items + 255) / 256, 132 * 8));  // an H100 / H200
  };
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  const std::size_t groups = aligned ? n / 8 : 0;
  if (groups > 0) {
    round_to_bf16_by_8<<<blocks(groups), 256, 0, stream>>>(reinterpret_cast<const float4*>(in),
                                                           reinterpret_cast<uint4*>(out), groups);
  }
  if (n > groups * 8) {
    const std::size_t rest = n - groups * 8;
    round_to_bf16_by_1<<<blocks(rest), 256, 0, stream>>>(in + groups * 8, out + groups * 8, rest);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("CUDA bf16 rounding kernel: ") +
                             cudaGetErrorString(error));
  }
}
// out[i] = the float bf16 pattern in[i] represents.
void from_bf16_on_device(const std::uint16_t* in, float* out, std::size_t n) {
  Kokkos::parallel_for(
      "colossal::core::gemm_operand_from_bf16", Kokkos::RangePolicy<Kokkos::Cuda>(0, n),
      KOKKOS_LAMBDA(std::size_t i) { out[i] = bf16_value(in[i]); });
}
#else
void to_bf16_on_device(const float*, std::uint16_t*, std::size_t) {
  throw std::logic_error("bf16 rounding on the device needs a Kokkos CUDA build");
}
void from_bf16_on_device(const std::uint16_t*, float*, std::size_t) {
  throw std::logic_error("bf16 operands on the device need a Kokkos CUDA build");
}
#endif
}  // namespace detail

namespace {
#ifdef KOKKOS_ENABLE_CUDA
constexpr bool kDeviceKernels = true;
#else
constexpr bool kDeviceKernels = false;
#endif
using detail::from_bf16_on_device;
using detail::to_bf16_on_device;

// The cuBLAS functions the backends call. A Kokkos CUDA build links cuBLAS and takes them as
// they are; a host build opens libcublas at run time, when a cuBLAS backend is first made
// (hardware.gemm: cublas): linked, its libcublasLt was mapped and 146 MB of it resident in every
// CPU-only run.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  // The C functions (C++ also sees overloads taking a cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*,
                            cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*,
                                            cudaDataType, int, long long int, const void*,
                                            cudaDataType, int, long long int, const void*, void*,
                                            cudaDataType, int, long long int, int,
                                            cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

#ifdef KOKKOS_ENABLE_CUDA
const CublasApi& cublas_api() {
  static const CublasApi api{&cublasCreate_v2,    &cublasDestroy_v2, &cublasSetMathMode,
                             &cublasSetStream_v2, &cublasSgemm_v2,   &cublasSgemmStridedBatched,
                             &cublasGemmEx,       &cublasGemmStridedBatchedEx};
  return api;
}
#else
// The libcublas of the toolkit this was built with (CUBLAS_VER_MAJOR: on the search path, else
// in the toolkit's lib directory), else any; loaded once, kept for the process.
const CublasApi& cublas_api() {
  static const SharedLibrary library({"libcublas.so." COLOSSAL_STRINGIFY(CUBLAS_VER_MAJOR),
#ifdef COLOSSAL_CUBLAS_DIR
                                      COLOSSAL_CUBLAS_DIR "/libcublas.so." COLOSSAL_STRINGIFY(
                                          CUBLAS_VER_MAJOR),
#endif
                                      "libcublas.so"});
  static const CublasApi api = [] {
    if (!library.loaded()) {
      throw std::runtime_error(
          "hardware.gemm: cublas: libcublas.so." COLOSSAL_STRINGIFY(
              CUBLAS_VER_MAJOR) " did not load; add the CUDA toolkit's lib directory to "
                                "LD_LIBRARY_PATH, or choose a host backend: openblas, blis, "
                                "onednn, auto");
    }
    CublasApi a;
    a.create = library.symbol<decltype(a.create)>("cublasCreate_v2");
    a.destroy = library.symbol<decltype(a.destroy)>("cublasDestroy_v2");
    a.set_math_mode = library.symbol<decltype(a.set_math_mode)>("cublasSetMathMode");
    a.set_stream = library.symbol<decltype(a.set_stream)>("cublasSetStream_v2");
    a.sgemm = library.symbol<decltype(a.sgemm)>("cublasSgemm_v2");
    a.sgemm_strided_batched =
        library.symbol<decltype(a.sgemm_strided_batched)>("cublasSgemmStridedBatched");
    a.gemm_ex = library.symbol<decltype(a.gemm_ex)>("cublasGemmEx");
    a.gemm_strided_batched_ex =
        library.symbol<decltype(a.gemm_strided_batched_ex)>("cublasGemmStridedBatchedEx");
    return a;
  }();
  return api;
}
#endif

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
      if (const cudaError_t error = cudaMalloc(&data_, bytes); error != cudaSuccess) {
        cudaGetLastError();
        data_ = nullptr;
        if (error != cudaErrorMemoryAllocation) check(error, "cudaMalloc (GEMM operand)");
        throw OutOfMemory(
            "device out of memory: a matrix product's operand buffer (cuBLAS's rounded or "
            "widened operands, outside the memory tracker) could not grow to " +
            format_bytes(double(bytes)) +
            ". The start-up check keeps some room a rank for such buffers (its message says "
            "how much); this step needs more. Lower train.micro_batch, set "
            "checkpointing.policy, or shard further (parallel.tensor.size, "
            "parallel.pipeline.size)");
      }
      capacity_ = bytes;
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// n values of T in device memory, grown on demand (old values are not kept): the buffer the
// rounded operands live in (StableOperands' Buffer).
template <class T>
class DeviceVector {
 public:
  std::size_t size() const { return size_; }
  void resize(std::size_t n) {
    bytes_.reserve(n * sizeof(T));
    size_ = n;
  }
  T* data() { return static_cast<T*>(bytes_.reserve(size_ * sizeof(T))); }

 private:
  DeviceBytes bytes_;
  std::size_t size_ = 0;
};

class CublasGemm : public MixedOperandGemm {
 public:
  explicit CublasGemm(GemmPrecision precision, bool tf32 = false)
      : precision_(precision), tf32_(tf32 && precision == GemmPrecision::fp32) {
    int devices = 0;  // api_ is loaded by now: a missing library says so, device or not
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      throw std::runtime_error(
          "cuBLAS GEMM: no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES "
          "and the job's --gpus-per-task), or choose a host hardware.gemm: openblas, blis, "
          "onednn, auto");
    }
    check(api_.create(&handle_), "cublasCreate");
    // fp32 products use plain fp32 arithmetic (no TF32) unless train.tf32 asks for it: results
    // match the host within fp32 tolerance. bf16 products ask for the tensor cores through the
    // compute type.
    if (api_.set_math_mode(handle_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) !=
        CUBLAS_STATUS_SUCCESS) {
      api_.destroy(handle_);  // the destructor does not run for a throwing constructor
      throw std::runtime_error("cuBLAS cublasSetMathMode failed");
    }
#ifdef KOKKOS_ENABLE_CUDA
    // Kokkos' stream: products and kernels stay in one order, with no device-wide fence between.
    if (api_.set_stream(handle_, Kokkos::Cuda().cuda_stream()) != CUBLAS_STATUS_SUCCESS) {
      api_.destroy(handle_);
      throw std::runtime_error("cuBLAS cublasSetStream failed");
    }
#endif
  }
  ~CublasGemm() override { api_.destroy(handle_); }
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  std::string name() const override {
    return precision_ == GemmPrecision::bf16 ? "cublas (bf16 tensor cores)"
           : tf32_                           ? "cublas (fp32 on TF32 tensor cores, train.tf32)"
                                             : "cublas";
  }

  // Operands on the device, fp32 or bf16. bf16 precision: each fp32 operand rounded to bf16 on
  // the device (the held parameters once per step), then bf16 x bf16 with fp32 sums. fp32: a
  // bf16 operand widened to the floats it represents, then the fp32 product.
  void gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, GemmOperand A,
                          int lda, int64_t stride_a, GemmOperand B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    const auto spans =
        copied_operand_spans("cuBLAS GEMM", ta, tb, M, N, K, lda, stride_a, ldb, stride_b, batch);
    if (!spans) return;
    const std::size_t span_a = spans->a, span_b = spans->b;
    if (!rounds_on_device()) {
      const float* a = A.f32 != nullptr ? A.f32 : widen(wide_a_, A.bf16, span_a);
      const float* b = B.f32 != nullptr ? B.f32 : widen(wide_b_, B.bf16, span_b);
      device_product(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta, C, ldc,
                     stride_c, batch);
      return;
    }
    const std::uint16_t* a =
        A.bf16 != nullptr ? A.bf16 : stable_.get(bits_a_, A.f32, span_a, to_bf16_on_device);
    const std::uint16_t* b =
        B.bf16 != nullptr ? B.bf16 : stable_.get(bits_b_, B.f32, span_b, to_bf16_on_device);
    bf16_product(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta, C, ldc,
                 stride_c, batch);
  }

  void hold_stable(const float* begin, std::size_t n, bool unchanged) override {
    stable_.hold(begin, n, unchanged);
  }
  bool keeps_stable_copy() const override { return rounds_on_device(); }
  void set_stable_storage(std::uint16_t* storage, std::size_t capacity) override {
    stable_.use_storage(storage, capacity);
  }
  std::size_t stable_conversions() const override { return stable_.conversions(); }
  bool uses_tf32() const override { return tf32_; }

 protected:
  // bf16 rounded exactly on the device (a Kokkos CUDA build), rather than by cuBLAS.
  bool rounds_on_device() const { return kDeviceKernels && precision_ == GemmPrecision::bf16; }

  const float* widen(DeviceVector<float>& to, const std::uint16_t* bits, std::size_t n) {
    to.resize(n);
    from_bf16_on_device(bits, to.data(), n);
    return to.data();
  }

  // `batch` products of fp32 device operands: plain fp32 (TF32 with train.tf32), or with bf16
  // precision where nothing rounds on the device, cuBLAS's own reduced precision (FAST_16BF).
  void device_product(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                      int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                      float beta, float* C, int ldc, int64_t stride_c, int batch) {
    if (precision_ == GemmPrecision::bf16) {
      product_ex(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                 stride_c, batch, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF);
    } else if (batch == 1) {
      check(api_.sgemm(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, ldb, A, lda,
                       &beta, C, ldc),
            "cublasSgemm");
    } else {
      check(api_.sgemm_strided_batched(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha,
                                       B, ldb, stride_b, A, lda, stride_a, &beta, C, ldc,
                                       stride_c, batch),
            "cublasSgemmStridedBatched");
    }
  }

  // `batch` products of bf16 device operands (their bit patterns), fp32 sums into fp32 C.
  void bf16_product(Trans ta, Trans tb, int M, int N, int K, float alpha, const void* A, int lda,
                    int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta,
                    float* C, int ldc, int64_t stride_c, int batch) {
    product_ex(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
               batch, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
  }

 private:
  // Row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T, operands of `type`.
  void product_ex(Trans ta, Trans tb, int M, int N, int K, float alpha, const void* A, int lda,
                  int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta,
                  float* C, int ldc, int64_t stride_c, int batch, cudaDataType type,
                  cublasComputeType_t compute) {
    if (batch == 1) {
      check(api_.gemm_ex(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha, B, type, ldb,
                         A, type, lda, &beta, C, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      return;
    }
    check(api_.gemm_strided_batched_ex(handle_, to_cublas(tb), to_cublas(ta), N, M, K, &alpha,
                                       B, type, ldb, stride_b, A, type, lda, stride_a, &beta, C,
                                       CUDA_R_32F, ldc, stride_c, batch, compute,
                                       CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx");
  }

 protected:
  const CublasApi& api_ = cublas_api();  // loaded first (declared before the handle)
  GemmPrecision precision_;
  bool tf32_;
  cublasHandle_t handle_ = nullptr;

 private:
  // Rounded operands (grown to the two largest, outside the memory tracker), the held
  // parameters' rounded copy, and widened bf16 operands of fp32 products.
  DeviceVector<std::uint16_t> bits_a_, bits_b_;
  StableOperands<std::uint16_t, DeviceVector<std::uint16_t>> stable_;
  DeviceVector<float> wide_a_, wide_b_;
};

class CublasHostGemm final : public CublasGemm {
 public:
  using CublasGemm::CublasGemm;
  // Host operands: a bf16 one is widened on the host (Gemm's default), then staged as fp32 is.
  void gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, GemmOperand A,
                          int lda, int64_t stride_a, GemmOperand B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    Gemm::gemm_mixed_batched(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C,
                             ldc, stride_c, batch);
  }
  void hold_stable(const float*, std::size_t, bool) override {}
  bool keeps_stable_copy() const override { return false; }
  void set_stable_storage(std::uint16_t*, std::size_t) override {}
  std::size_t stable_conversions() const override { return 0; }
  std::string name() const override {
    return precision_ == GemmPrecision::bf16 ? "cublas (bf16 x bf16, fp32 sums), host arrays staged"
           : tf32_ ? "cublas (fp32 on TF32 tensor cores, train.tf32), host arrays staged"
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
    if (bf16) {
      bf16_product(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                   stride_c, batch);
    } else {
      device_product(ta, tb, M, N, K, alpha, static_cast<const float*>(a), lda, stride_a,
                     static_cast<const float*>(b), ldb, stride_b, beta, c, ldc, stride_c, batch);
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

std::unique_ptr<Gemm> make_cublas_gemm(GemmPrecision precision, bool tf32) {
  return std::make_unique<CublasGemm>(precision, tf32);
}

std::unique_ptr<Gemm> make_cublas_host_gemm(GemmPrecision precision, bool tf32) {
  return std::make_unique<CublasHostGemm>(precision, tf32);
}

}  // namespace colossal::core
