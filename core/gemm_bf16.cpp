// bf16 matrix products on the host: both operands rounded to bfloat16, products summed in fp32.
// A bf16 value times a bf16 value is exact in fp32 (8 + 8 significand bits fit in 24), so an fp32
// GEMM over rounded copies computes what a bf16 tensor core computes, up to summation order.
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/bf16.hpp"
#include "core/gemm.hpp"
#include "core/host_threads.hpp"

namespace colossal::core {

GemmPrecision gemm_precision(const std::string& name) {
  if (name == "fp32") return GemmPrecision::fp32;
  if (name == "bf16") return GemmPrecision::bf16;
  throw std::runtime_error("unknown precision '" + name + "' (allowed: fp32, bf16)");
}

const char* to_string(GemmPrecision precision) {
  return precision == GemmPrecision::bf16 ? "bf16" : "fp32";
}

namespace {

void round_copy(const float* in, float* out, std::size_t n) {
  HostThreads::shared().run(
      n,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          out[i] = std::bit_cast<float>(bf16_rounded_bits(std::bit_cast<std::uint32_t>(in[i])));
        }
      },
      /*grain=*/1 << 15);
}

// The floats of `n` bf16 patterns in `buffer` (grown once to the largest operand).
const float* widened(std::vector<float>& buffer, const std::uint16_t* bits, std::size_t n) {
  if (buffer.size() < n) buffer.resize(n);
  from_bf16_bits(bits, buffer.data(), n);
  return buffer.data();
}

class Bf16Gemm final : public MixedOperandGemm {
 public:
  Bf16Gemm(std::unique_ptr<Gemm> inner, std::string why)
      : inner_(std::move(inner)), why_(std::move(why)) {}
  std::string name() const override {
    return inner_->name() + " (bf16 operands, emulated" + (why_.empty() ? "" : ": " + why_) + ")";
  }
  bool runs_on_openmp() const override { return inner_->runs_on_openmp(); }

  // fp32 operands rounded, bf16 ones widened: either way one pass into the buffer.
  void gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, GemmOperand A,
                          int lda, int64_t stride_a, GemmOperand B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    const auto spans =
        copied_operand_spans("bf16 GEMM", ta, tb, M, N, K, lda, stride_a, ldb, stride_b, batch);
    if (!spans) return;
    const float* a = as_rounded(a_, A, spans->a);
    const float* b = as_rounded(b_, B, spans->b);
    if (batch == 1) {
      inner_->gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
    } else {
      inner_->gemm_strided_batched(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b,
                                   beta, C, ldc, stride_c, batch);
    }
  }

 private:
  // A rounded copy of `n` floats from `from`, in `buffer` (grown once to the largest operand).
  static const float* rounded(std::vector<float>& buffer, const float* from, std::size_t n) {
    if (buffer.size() < n) buffer.resize(n);
    round_copy(from, buffer.data(), n);
    return buffer.data();
  }
  static const float* as_rounded(std::vector<float>& buffer, GemmOperand from, std::size_t n) {
    return from.f32 != nullptr ? rounded(buffer, from.f32, n) : widened(buffer, from.bf16, n);
  }
  std::unique_ptr<Gemm> inner_;
  std::string why_;
  std::vector<float> a_, b_;
};

}  // namespace

float round_to_bf16(float x) {
  return std::bit_cast<float>(bf16_rounded_bits(std::bit_cast<std::uint32_t>(x)));
}

void round_to_bf16(float* values, std::size_t n) { round_copy(values, values, n); }

void to_bf16_bits(const float* values, std::uint16_t* bits, std::size_t n) {
  HostThreads::shared().run(
      n,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          bits[i] = bf16_bits(values[i]);
        }
      },
      /*grain=*/1 << 15);
}

void from_bf16_bits(const std::uint16_t* bits, float* values, std::size_t n) {
  HostThreads::shared().run(
      n,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) values[i] = bf16_value(bits[i]);
      },
      /*grain=*/1 << 15);
}

void Gemm::gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha,
                              GemmOperand A, int lda, int64_t stride_a, GemmOperand B, int ldb,
                              int64_t stride_b, float beta, float* C, int ldc, int64_t stride_c,
                              int batch) {
  if ((A.bf16 != nullptr || B.bf16 != nullptr) && (stride_a < 0 || stride_b < 0)) {
    throw std::invalid_argument("GEMM of bf16 operands: negative batch strides are not supported");
  }
  const float* a = A.f32 != nullptr
                       ? A.f32
                       : widened(widened_a_, A.bf16, operand_span(ta, M, K, lda, stride_a, batch));
  const float* b = B.f32 != nullptr
                       ? B.f32
                       : widened(widened_b_, B.bf16, operand_span(tb, K, N, ldb, stride_b, batch));
  if (batch == 1) {
    gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
  } else {
    gemm_strided_batched(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta, C, ldc,
                         stride_c, batch);
  }
}

std::unique_ptr<Gemm> make_bf16_gemm(std::unique_ptr<Gemm> fp32_backend, std::string why) {
  return std::make_unique<Bf16Gemm>(std::move(fp32_backend), std::move(why));
}

}  // namespace colossal::core
