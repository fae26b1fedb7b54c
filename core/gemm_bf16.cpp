// bf16 matrix products on the host: both operands rounded to bfloat16, products summed in fp32.
// A bf16 value times a bf16 value is exact in fp32 (8 + 8 significand bits fit in 24), so an fp32
// GEMM over rounded copies computes what a bf16 tensor core computes, up to summation order.
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

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

inline std::uint32_t rounded_bits(std::uint32_t bits) {
  // NaN: keep it a NaN after truncation by setting the quiet bit (rounding could carry a NaN
  // whose payload sits in the low half into infinity).
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (bits | 0x00400000u) & 0xFFFF0000u;
  // Round to nearest, ties to even: add half an ulp of bf16, less one when the kept part is even.
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
}

void round_copy(const float* in, float* out, std::size_t n) {
  HostThreads::shared().run(
      n,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          out[i] = std::bit_cast<float>(rounded_bits(std::bit_cast<std::uint32_t>(in[i])));
        }
      },
      /*grain=*/1 << 15);
}

class Bf16Gemm final : public Gemm {
 public:
  Bf16Gemm(std::unique_ptr<Gemm> inner, std::string why)
      : inner_(std::move(inner)), why_(std::move(why)) {}
  std::string name() const override {
    return inner_->name() + " (bf16 operands, emulated" + (why_.empty() ? "" : ": " + why_) + ")";
  }

  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    const float* a = rounded(a_, A, operand_span(ta, M, K, lda, 0, 1));
    const float* b = rounded(b_, B, operand_span(tb, K, N, ldb, 0, 1));
    inner_->gemm(ta, tb, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc);
  }

  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    if (stride_a < 0 || stride_b < 0) {
      throw std::invalid_argument("bf16 GEMM: negative batch strides are not supported");
    }
    const float* a = rounded(a_, A, operand_span(ta, M, K, lda, stride_a, batch));
    const float* b = rounded(b_, B, operand_span(tb, K, N, ldb, stride_b, batch));
    inner_->gemm_strided_batched(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                                 C, ldc, stride_c, batch);
  }

 private:
  // A rounded copy of `n` floats from `from`, in `buffer` (grown once to the largest operand).
  static const float* rounded(std::vector<float>& buffer, const float* from, std::size_t n) {
    if (buffer.size() < n) buffer.resize(n);
    round_copy(from, buffer.data(), n);
    return buffer.data();
  }
  std::unique_ptr<Gemm> inner_;
  std::string why_;
  std::vector<float> a_, b_;
};

}  // namespace

float round_to_bf16(float x) {
  return std::bit_cast<float>(rounded_bits(std::bit_cast<std::uint32_t>(x)));
}

void round_to_bf16(float* values, std::size_t n) { round_copy(values, values, n); }

void to_bf16_bits(const float* values, std::uint16_t* bits, std::size_t n) {
  HostThreads::shared().run(
      n,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          bits[i] = std::uint16_t(rounded_bits(std::bit_cast<std::uint32_t>(values[i])) >> 16);
        }
      },
      /*grain=*/1 << 15);
}

std::unique_ptr<Gemm> make_bf16_gemm(std::unique_ptr<Gemm> fp32_backend, std::string why) {
  return std::make_unique<Bf16Gemm>(std::move(fp32_backend), std::move(why));
}

}  // namespace colossal::core
