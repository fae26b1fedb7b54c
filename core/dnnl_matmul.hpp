// oneDNN's matmul primitive through its C API, for the oneDNN GEMM backends (core/gemm_host.cpp).
// One primitive per product shape and layout, created on that shape's first product and kept: a
// batch of products (attention's heads) is one call on OpenMP's team instead of one dnnl_*gemm*
// call each, and oneDNN picks its AMX / AVX-512 brgemm kernels where the layout allows. Measured
// on a 2-core AMX-BF16 Xeon (bf16 operands, fp32 sums): gpt2-124m's linear layers 990-1440
// GFLOP/s against 770-1180 for dnnl_gemm_bf16bf16f32; the quickstart's attention scores (8
// heads of 128x128x32 per sequence) 248 against 58.
// Compiled where libdnnl-dev's headers are found (COLOSSAL_HAVE_DNNL_MATMUL); the library itself
// is loaded at run time, as the rest of the oneDNN backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/gemm.hpp"

namespace colossal::core {

class SharedLibrary;

class DnnlMatmul {
 public:
  enum class Operands { f32, bf16 };  // A and B: fp32 values, or bf16 patterns (C is fp32)
  // Null when this build has no oneDNN headers, `lib` lacks the matmul API, or the environment
  // says COLOSSAL_DNNL_MATMUL=0 (A/B runs; a oneDNN whose primitives misbehave). `lib` must
  // outlive the result. The oneDNN bf16 backend uses bf16 operands; f32 ones (not faster than
  // dnnl_sgemm for the fp32 backend: 0.83x on gpt2-124m's step) serve the tests of the layouts.
  static std::unique_ptr<DnnlMatmul> create(const SharedLibrary& lib, Operands operands);
  virtual ~DnnlMatmul() = default;
  // C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, row-major with Gemm's conventions
  // (A_i = A + i * stride_a elements, likewise B and C). Returns false, writing nothing, when
  // oneDNN has no implementation for this layout (the caller multiplies another way). M, N, K
  // and batch are at least 1. One caller at a time, as every Gemm (the primitives' memory
  // objects are reused).
  virtual bool run(Trans ta, Trans tb, int M, int N, int K, float alpha, const void* A, int lda,
                   int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta,
                   float* C, int ldc, int64_t stride_c, int batch) = 0;
  // Primitives created so far (one per shape and layout; tests).
  virtual std::size_t primitives() const = 0;
};

}  // namespace colossal::core
