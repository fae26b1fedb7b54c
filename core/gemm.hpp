// The one interface every matrix product goes through: OpenBLAS (cblas) on the host, cuBLAS on
// CUDA. Row-major, as the rest of the code: C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::core {

enum class Trans { N, T };

// Floats a row-major operand op(X) of rows x cols spans in memory (stored transposed when t is
// T), rows `ld` apart, `batch` matrices `stride` apart: what a backend that copies it must copy.
inline std::size_t operand_span(Trans t, int rows, int cols, int ld, int64_t stride, int batch) {
  const int r = t == Trans::N ? rows : cols, c = t == Trans::N ? cols : rows;
  if (r <= 0 || c <= 0 || batch <= 0) return 0;
  const std::size_t one = std::size_t(r - 1) * std::size_t(ld) + std::size_t(c);
  return std::size_t(batch - 1) * std::size_t(stride > 0 ? stride : 0) + one;
}

// The spans of A and B in a batched product C = op(A) op(B) (M x K by K x N), for a backend that
// copies or converts its operands into contiguous buffers first; nullopt when C is empty (nothing
// to compute). Throws, naming `backend`, on a negative batch stride, which such a copy cannot
// follow.
struct OperandSpans {
  std::size_t a, b;
};
inline std::optional<OperandSpans> copied_operand_spans(const char* backend, Trans ta, Trans tb,
                                                        int M, int N, int K, int lda,
                                                        int64_t stride_a, int ldb,
                                                        int64_t stride_b, int batch) {
  if (batch < 1 || M <= 0 || N <= 0) return std::nullopt;
  if (stride_a < 0 || stride_b < 0) {
    throw std::invalid_argument(std::string(backend) +
                                ": negative batch strides are not supported");
  }
  return OperandSpans{operand_span(ta, M, K, lda, stride_a, batch),
                      operand_span(tb, K, N, ldb, stride_b, batch)};
}

// An operand of Gemm::gemm_mixed: fp32 values, or the bfloat16 patterns (core/bf16.hpp) of
// values stored in bf16. Implicit from either pointer.
struct GemmOperand {
  const float* f32 = nullptr;
  const std::uint16_t* bf16 = nullptr;
  GemmOperand(const float* values) : f32(values) {}        // NOLINT(google-explicit-constructor)
  GemmOperand(const std::uint16_t* bits) : bf16(bits) {}   // NOLINT(google-explicit-constructor)
  // The operand from element i on.
  GemmOperand operator+(std::ptrdiff_t i) const {
    return f32 != nullptr ? GemmOperand(f32 + i) : GemmOperand(bf16 + i);
  }
};

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
  // gemm_strided_batched() with either operand possibly in bf16 (host memory). A bf16 operand
  // is multiplied as the exact floats it represents. The default widens it to fp32 (a buffer per
  // operand, grown to the largest, outside the tracker) and calls gemm() (batch 1) or
  // gemm_strided_batched(); the bf16 backends take it as it is (oneDNN's multiplies the
  // patterns, the emulation widens instead of rounding), so under train.precision: bf16 a
  // product of a bf16-stored activation equals the product of the fp32 one bit for bit.
  virtual void gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha,
                                  GemmOperand A, int lda, int64_t stride_a, GemmOperand B, int ldb,
                                  int64_t stride_b, float beta, float* C, int ldc,
                                  int64_t stride_c, int batch);
  // One product of gemm_mixed_batched.
  void gemm_mixed(Trans ta, Trans tb, int M, int N, int K, float alpha, GemmOperand A, int lda,
                  GemmOperand B, int ldb, float beta, float* C, int ldc) {
    gemm_mixed_batched(ta, tb, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
  }
  // [begin, begin + n) does not change until the next hold_stable call (n = 0: nothing held).
  // oneDNN's and cuBLAS's bf16 backends convert that range to bf16 once, on its first use, and
  // serve every operand lying inside it from the copy (2 bytes per float, outside the tracker:
  // the bf16 weight copy of mixed precision) instead of converting each weight again in every
  // product. The others ignore it (the emulation would need 4 bytes per float for its copy).
  // `unchanged`: nor has the range changed since the hold before this one, which held the same
  // range, so the copy made then still serves (the caller's promise: the micro-batches of one
  // optimizer step); otherwise it is converted again on first use.
  // The model holds its parameters at the start of each forward (between a forward and the
  // backward after it they do not change) and lets go (n = 0) when it is destroyed, before its
  // parameters are freed; under ZeRO-3 it holds the gathered LM head for the logits' chunks.
  virtual void hold_stable(const float* begin, std::size_t n, bool unchanged) {
    (void)begin;
    (void)n;
    (void)unchanged;
  }
  // Whether this backend keeps a bf16 copy of the held range (2 bytes per float). The trainer
  // then gives it tracked memory for the copy (set_stable_storage), which the memory plan
  // predicts (planner::RankLayout::bf16_weight_copy); without it the backend grows a copy of
  // its own, outside the tracker (tests, benchmarks).
  virtual bool keeps_stable_copy() const { return false; }
  // Where the copy goes: `capacity` bf16 values in the backend's memory space, enough for every
  // range held from now on (a larger one is a std::logic_error); nullptr: a copy of its own.
  virtual void set_stable_storage(std::uint16_t* storage, std::size_t capacity) {
    (void)storage;
    (void)capacity;
  }
  // How many times a held range has been converted (tests; 0 for backends that do not convert).
  virtual std::size_t stable_conversions() const { return 0; }
  // Whether fp32 products run on TF32 tensor cores (cuBLAS with train.tf32).
  virtual bool uses_tf32() const { return false; }
  // Whether the products' threads are OpenMP's (oneDNN, Debian's BLIS) rather than threads of
  // their own (OpenBLAS): the host kernels then run on the same team (HostTeam, in
  // core/host_threads.hpp).
  virtual bool runs_on_openmp() const { return false; }

 private:
  std::vector<float> widened_a_, widened_b_;  // gemm_mixed's default: bf16 operands as fp32
};

// A backend whose products all go through gemm_mixed_batched (its operands may be fp32 or
// bf16): the fp32 entry points forward there.
class MixedOperandGemm : public Gemm {
 public:
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    gemm_mixed(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    gemm_mixed_batched(ta, tb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                       stride_c, batch);
  }
};

// A host GEMM backend (host memory): "openblas" (linked), "blis" or "onednn" (loaded at run time
// when their Debian libraries libblis4-openmp / libdnnl2 are installed), or "auto" (per shape
// the fastest, measured on the shape's first product, of the backends that share one kind of
// threads: oneDNN and BLIS, both on OpenMP, when either loads, else OpenBLAS alone; a run that
// mixes OpenBLAS's spinning threads with OpenMP's on the same cores loses more than any shape
// gains). Throws naming what is missing.
std::unique_ptr<Gemm> make_host_gemm(const std::string& backend = "openblas");
// The host backends that load here, "openblas" first.
std::vector<std::string> host_gemm_backends();

// What a matrix product computes with. fp32: IEEE single precision throughout. bf16 (mixed
// precision, train.precision: bf16): each operand element is rounded to bfloat16 (8-bit
// significand, round to nearest even) and the exact products are summed in fp32, which is what
// bf16 tensor cores do; weights, gradients and optimizer states stay fp32, and so do activations
// but those only products read, which the host model may save in bf16 (gemm_mixed,
// ModelOptions::bf16_operands).
enum class GemmPrecision { fp32, bf16 };
GemmPrecision gemm_precision(const std::string& name);  // "fp32" | "bf16", else throws
const char* to_string(GemmPrecision precision);

// x rounded to the nearest bfloat16 (ties to even; NaN stays NaN, overflow goes to infinity),
// as the float it represents.
float round_to_bf16(float x);
// Rounds n floats in place, over the host threads.
void round_to_bf16(float* values, std::size_t n);
// The bfloat16 bit patterns of n floats (the upper halves of their rounded values), over the
// host threads.
void to_bf16_bits(const float* values, std::uint16_t* bits, std::size_t n);
// The n floats that n bfloat16 patterns represent (exact), over the host threads.
void from_bf16_bits(const std::uint16_t* bits, float* values, std::size_t n);
// A host backend whose products round both operands to bf16 first (into its own two buffers,
// which grow to the largest operands and are not in the memory tracker; the caller's arrays are
// untouched), then multiply in fp32: bf16 numerics at fp32 speed or less (the emulation). `why`
// (why bf16 is emulated) goes into its name, which the trainer prints at start-up.
std::unique_ptr<Gemm> make_bf16_gemm(std::unique_ptr<Gemm> fp32_backend, std::string why = "");
// The CPU's bf16 units ("AMX-BF16, AVX512-BF16", "AVX512-BF16", ...; empty when it has none).
std::string host_bf16_hardware();
// oneDNN's bf16 GEMM on those units (operands converted to bf16 in its own buffers, as above,
// fp32 sums). Throws, saying why, without libdnnl2 or without the hardware.
std::unique_ptr<Gemm> make_native_bf16_gemm();
// The products of train.precision: bf16 on the host: native (make_native_bf16_gemm) when
// hardware.gemm is auto or onednn and it is available, else emulated over `backend`, its name
// saying why (no hardware, no libdnnl2, or a backend without bf16 kernels).
std::unique_ptr<Gemm> make_host_bf16_gemm(const std::string& backend);
// Whether make_default_gemm(backend, precision) gives a backend that keeps a bf16 copy of the
// weights (Gemm::keeps_stable_copy), without making one: for the memory plan.
bool default_gemm_keeps_copy(const std::string& backend, GemmPrecision precision);

#ifdef COLOSSAL_HAVE_CUDA
// cuBLAS on the current CUDA device; operates on device memory. Creates its own handle, on
// Kokkos' stream in a Kokkos CUDA build. bf16 there: each fp32 operand rounded to bf16 on the
// device (ties to even, as the host emulation rounds; the parameters held by hold_stable once per
// optimizer step, in a device copy of 2 bytes per parameter), bf16 operands taken as they are, then
// bf16 x bf16 with fp32 sums (CUBLAS_COMPUTE_32F): the host's bf16 results up to summation
// order. The rounded copies of other operands grow to the two largest (outside the memory
// tracker). In a host-Kokkos build (device arrays only in tests) cuBLAS rounds the fp32 arrays
// itself (CUBLAS_COMPUTE_32F_FAST_16BF: measured at a tenth of bf16 rounding's error on an H200,
// so bounded by bf16's error but not equal to it).
// tf32 (train.tf32): fp32 products on the TF32 tensor cores (operands rounded to 10-bit
// significands, fp32 sums); without it fp32 products are plain fp32.
std::unique_ptr<Gemm> make_cublas_gemm(GemmPrecision precision = GemmPrecision::fp32,
                                       bool tf32 = false);
// cuBLAS for host arrays (hardware.gemm: cublas): each product copies its operands to the
// current device, multiplies there and copies the result back. The model's other kernels stay on
// the host; this moves the products, most of a step's FLOPs, onto the GPU. bf16 rounds the
// operands on the host (half the bytes to copy) and multiplies bf16 x bf16 with fp32 sums
// (cublasGemmStridedBatchedEx, CUDA_R_16BF, CUBLAS_COMPUTE_32F): the host's bf16 emulation, on
// tensor cores. The staging buffers (device, and host for bf16) grow to the largest operands and
// are not in the memory tracker.
// Every product is staged, attention's small per-head ones too: on an H200 node, sending those
// to the host's OpenBLAS instead measured twice as slow (270 against 139 ms of attention per
// quickstart step).
std::unique_ptr<Gemm> make_cublas_host_gemm(GemmPrecision precision = GemmPrecision::fp32,
                                            bool tf32 = false);
#endif
// Threads each host GEMM uses (OpenBLAS now; BLIS and oneDNN when they are created).
void set_blas_threads(int threads);

// The backend hardware.gemm names, at the given precision, for the default Kokkos execution
// space's memory: cuBLAS on a device; otherwise a host backend (openblas, blis, onednn, auto), or
// "cublas" for host arrays multiplied on the GPU. Sets the host threads' team to the backend's
// (HostThreads::set_team: OpenMP's for oneDNN and BLIS, the pool's own otherwise). Throws naming what is missing (no CUDA build,
// no device visible). tf32 (train.tf32) lets cuBLAS's fp32 products use TF32; the host backends
// have no TF32 and ignore it (Gemm::uses_tf32 says which).
std::unique_ptr<Gemm> make_default_gemm(const std::string& backend = "openblas",
                                        GemmPrecision precision = GemmPrecision::fp32,
                                        bool tf32 = false);

}  // namespace colossal::core
