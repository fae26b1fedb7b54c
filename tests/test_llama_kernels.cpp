// The LLaMA block's kernels (core/llama_kernels.hpp): forwards against naive double references,
// backwards against central finite differences, RoPE's relative-position property, and
// grouped-query sharing through the real attention kernels. As in test_kernels, the scalar probed
// is f = sum(out * g) for a fixed random g, so df/dout = g.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/gemm.hpp"
#include "core/layers.hpp"
#include "core/llama_kernels.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;
using colossal::test::check_gradient;
using colossal::test::dot;
using colossal::test::random_vector;

class LlamaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::host_memory()) GTEST_SKIP() << "kernel tests pass host pointers";
  }
};

TEST_F(LlamaKernels, RmsnormForwardMatchesNaive) {
  const int N = 5, C = 37;  // more columns than one reduction chunk, ragged
  auto x = random_vector(N * C, 1, 3.0f), w = random_vector(C, 2);
  std::vector<float> out(N * C), rstd(N);
  kernels::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += double(x[n * C + c]) * x[n * C + c];
    const double s = 1.0 / std::sqrt(ms / C + 1e-6);
    EXPECT_NEAR(rstd[n], s, 1e-5 * s);
    for (int c = 0; c < C; ++c) EXPECT_NEAR(out[n * C + c], x[n * C + c] * s * w[c], 1e-5);
  }
}

TEST_F(LlamaKernels, RmsnormBackwardMatchesFiniteDifferences) {
  const int N = 4, C = 35;
  auto x = random_vector(N * C, 3, 2.0f), w = random_vector(C, 4), g = random_vector(N * C, 5);
  std::vector<float> out(N * C), rstd(N);
  auto f = [&] {
    kernels::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return dot(out, g);
  };
  f();
  // dinp accumulates (residual stream): start from a known value and subtract it.
  std::vector<float> dx(N * C, 0.25f), dw(C, 0.0f);
  kernels::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  for (auto& v : dx) v -= 0.25f;
  EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
  EXPECT_EQ(check_gradient("dw", f, w, dw), 0);
}

// Hugging Face's rotate-half form, written independently in double: for head dimension d,
// out = x cos + rotate_half(x) sin with rotate_half(x) = (-x[d/2:], x[:d/2]) and both halves
// using frequency index i mod d/2.
static double rope_reference(const std::vector<float>& x, int64_t base, int c, int hs, int pos,
                             double theta) {
  const int half = hs / 2, i = c % half;
  const double angle = pos * std::pow(theta, -2.0 * i / hs);
  const double rotated = c < half ? -double(x[base + c + half]) : double(x[base + c - half]);
  return x[base + c] * std::cos(angle) + rotated * std::sin(angle);
}

TEST_F(LlamaKernels, RopeMatchesReferenceAndItsInverseUndoesIt) {
  const int B = 2, T = 7, hs = 8, heads = 3, ld = 40, col0 = 5;  // columns outside untouched
  const double theta = 10000.0;
  std::vector<float> cs(T * hs / 2), sn(T * hs / 2);
  kernels::rope_table(cs.data(), sn.data(), T, hs, theta);
  const auto x0 = random_vector(B * T * ld, 7, 2.0f);
  auto x = x0;
  kernels::rope_rotate(x.data(), B, T, ld, col0, heads, hs, 0, cs.data(), sn.data(), false);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = (int64_t(b) * T + t) * ld;
      for (int c = 0; c < ld; ++c) {
        const int rel = c - col0;
        if (rel < 0 || rel >= heads * hs) {
          EXPECT_EQ(x[row + c], x0[row + c]);
          continue;
        }
        const int64_t head = row + col0 + (rel / hs) * hs;
        EXPECT_NEAR(x[row + c], rope_reference(x0, head, rel % hs, hs, t, theta), 2e-6);
      }
    }
  }
  kernels::rope_rotate(x.data(), B, T, ld, col0, heads, hs, 0, cs.data(), sn.data(), true);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], x0[i], 1e-5);
}

// Llama 3's scaled frequencies against transformers 5.25's (its rope_type "llama3" initialiser,
// in float32) for theta 500000, a head of 32 columns, factor 8, low and high frequency factors
// 1 and 4 and an original context of 64: pairs 0-1 kept (wavelengths below 16), 2-3 in the
// interpolated band, the rest divided by 8. Unscaled (factor 1) they are theta^(-2i/hs).
TEST_F(LlamaKernels, RopeFrequenciesOfLlama3ScalingMatchTransformers) {
  const std::vector<double> transformers = {
      1.0,          0.44036662578582764,   0.07940301299095154,   0.010674637742340565,
      0.004700753837823868,  0.0020700551103800535, 0.0009115831344388425,
      0.00040143076330423355, 0.00017677668074611574, 7.784655463183299e-05,
      3.428102354519069e-05,  1.5096217794052791e-05, 6.647869668086059e-06,
      2.927499735960737e-06,  1.289173155782919e-06,  5.677088097399974e-07};
  const core::RopeScaling llama3{8.0, 1.0, 4.0, 64};
  for (int i = 0; i < 16; ++i) {
    EXPECT_NEAR(core::rope_frequency(i, 32, 500000.0, llama3), transformers[i],
                1e-6 * transformers[i])
        << "pair " << i;
    EXPECT_DOUBLE_EQ(core::rope_frequency(i, 32, 500000.0, core::RopeScaling{}),
                     std::pow(500000.0, -2.0 * i / 32));
  }
  // The table rotates by those frequencies.
  const int T = 40;
  std::vector<float> cs(T * 16), sn(T * 16);
  kernels::rope_table(cs.data(), sn.data(), T, 32, 500000.0, llama3);
  for (int t : {1, 17, 39}) {
    for (int i : {0, 2, 3, 9}) {
      EXPECT_NEAR(cs[t * 16 + i], std::cos(t * transformers[i]), 2e-6) << t << " " << i;
      EXPECT_NEAR(sn[t * 16 + i], std::sin(t * transformers[i]), 2e-6) << t << " " << i;
    }
  }
}

// The property RoPE exists for: <rope(q, m), rope(k, n)> depends on m - n only.
TEST_F(LlamaKernels, RopeScoresDependOnRelativePositionOnly) {
  const int T = 12, hs = 16;
  std::vector<float> cs(T * hs / 2), sn(T * hs / 2);
  kernels::rope_table(cs.data(), sn.data(), T, hs, 500000.0);
  const auto q = random_vector(hs, 8), k = random_vector(hs, 9);
  auto score = [&](int m, int n) {
    std::vector<float> a = q, b = k;
    kernels::rope_rotate(a.data(), 1, 1, hs, 0, 1, hs, m, cs.data(), sn.data(), false);
    kernels::rope_rotate(b.data(), 1, 1, hs, 0, 1, hs, n, cs.data(), sn.data(), false);
    return dot(a, b);
  };
  for (int d = 0; d < 4; ++d) {
    const double first = score(d, 0);
    for (int n = 1; n + d < T; ++n) EXPECT_NEAR(score(n + d, n), first, 1e-5) << d << " " << n;
  }
  EXPECT_GT(std::abs(score(3, 0) - score(0, 0)), 1e-3);  // and it does depend on it
}

// Ring attention gives each rank a chunk of positions: rotating a chunk from its global offset
// must equal the chunk's rows of the whole sequence's rotation.
TEST_F(LlamaKernels, RopeChunkFromItsOffsetEqualsTheWholeSequence) {
  const int B = 2, T = 8, S = 4, Tl = T / S, hs = 6, heads = 2, ld = hs * heads;
  std::vector<float> cs(T * hs / 2), sn(T * hs / 2);
  kernels::rope_table(cs.data(), sn.data(), T, hs, 10000.0);
  const auto x0 = random_vector(B * T * ld, 10);
  auto whole = x0;
  kernels::rope_rotate(whole.data(), B, T, ld, 0, heads, hs, 0, cs.data(), sn.data(), false);
  for (int s = 0; s < S; ++s) {
    std::vector<float> chunk(B * Tl * ld);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        for (int c = 0; c < ld; ++c) {
          chunk[(b * Tl + t) * ld + c] = x0[(b * T + s * Tl + t) * ld + c];
        }
      }
    }
    kernels::rope_rotate(chunk.data(), B, Tl, ld, 0, heads, hs, s * Tl, cs.data(), sn.data(),
                         false);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        for (int c = 0; c < ld; ++c) {
          EXPECT_EQ(chunk[(b * Tl + t) * ld + c], whole[(b * T + s * Tl + t) * ld + c]);
        }
      }
    }
  }
}

TEST_F(LlamaKernels, RopeBackwardMatchesFiniteDifferences) {
  const int B = 1, T = 5, hs = 4, heads = 2, ld = 10, col0 = 1;
  std::vector<float> cs(T * hs / 2), sn(T * hs / 2);
  kernels::rope_table(cs.data(), sn.data(), T, hs, 10000.0);
  auto x = random_vector(B * T * ld, 11), g = random_vector(B * T * ld, 12);
  auto f = [&] {
    auto y = x;
    kernels::rope_rotate(y.data(), B, T, ld, col0, heads, hs, 0, cs.data(), sn.data(), false);
    return dot(y, g);
  };
  auto dx = g;  // the backward: the inverse rotation of dout, in place
  kernels::rope_rotate(dx.data(), B, T, ld, col0, heads, hs, 0, cs.data(), sn.data(), true);
  EXPECT_EQ(check_gradient("dx", f, x, dx), 0);
}

TEST_F(LlamaKernels, SwigluMatchesNaiveAndFiniteDifferences) {
  const int N = 6, F = 9, ld = 2 * F;  // gate and up as the two halves of one fused output
  auto gu = random_vector(N * ld, 13, 4.0f), g = random_vector(N * F, 14);
  std::vector<float> out(N * F);
  kernels::swiglu_forward(out.data(), gu.data(), gu.data() + F, ld, N, F);
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < F; ++j) {
      const double a = gu[n * ld + j], u = gu[n * ld + F + j];
      EXPECT_NEAR(out[n * F + j], a / (1.0 + std::exp(-a)) * u, 2e-6 * (1 + std::abs(a * u)));
    }
  }
  auto f = [&] {
    kernels::swiglu_forward(out.data(), gu.data(), gu.data() + F, ld, N, F);
    return dot(out, g);
  };
  std::vector<float> dgu(N * ld);
  kernels::swiglu_backward(dgu.data(), dgu.data() + F, g.data(), gu.data(), gu.data() + F, ld, N,
                           F);
  EXPECT_EQ(check_gradient("dgate_up", f, gu, dgu), 0);
}

// gqa_reduce is gqa_expand's transpose: <expand(x), y> = <x, reduce(y)> for any x, y; with as
// many KV heads as query heads the expansion is the identity.
TEST_F(LlamaKernels, GqaReduceIsTheTransposeOfExpand) {
  const int N = 3, H = 6, hs = 4, C = H * hs;
  for (int KV : {1, 2, 3, 6}) {
    SCOPED_TRACE(KV);
    const int width = (H + 2 * KV) * hs;
    const auto x = random_vector(N * width, 15 + KV), y = random_vector(N * 3 * C, 16 + KV);
    std::vector<float> ex(N * 3 * C), ry(N * width);
    kernels::gqa_expand(ex.data(), x.data(), N, H, KV, hs);
    kernels::gqa_reduce(ry.data(), y.data(), N, H, KV, hs);
    EXPECT_NEAR(dot(ex, y), dot(x, ry), 1e-4);
    if (KV == H) {
      for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(ex[i], x[i]);
    }
    // Query head h reads KV head h / (H / KV).
    const int group = H / KV;
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(ex[C + h * hs], x[C + (h / group) * hs]);
      EXPECT_EQ(ex[2 * C + h * hs + 1], x[C + KV * hs + (h / group) * hs + 1]);
    }
  }
}

// Grouped-query attention end to end: expand + the causal attention kernels, with RoPE on q and k,
// differentiated through rope, attention_backward and gqa_reduce, against finite differences of
// the grouped projection's output.
TEST_F(LlamaKernels, GroupedQueryAttentionWithRopeMatchesFiniteDifferences) {
  auto gemm = make_host_gemm();
  const int B = 2, T = 4, H = 4, KV = 2, hs = 4, C = H * hs, width = (H + 2 * KV) * hs;
  std::vector<float> cs(T * hs / 2), sn(T * hs / 2);
  kernels::rope_table(cs.data(), sn.data(), T, hs, 10000.0);
  auto x = random_vector(B * T * width, 17, 1.5f), g = random_vector(B * T * C, 18);
  std::vector<float> qkv(B * T * 3 * C), att(B * H * T * T), y(B * T * C);
  auto forward = [&] {
    auto r = x;  // q and k turned before the expansion (H + KV heads from column 0)
    kernels::rope_rotate(r.data(), B, T, width, 0, H + KV, hs, 0, cs.data(), sn.data(), false);
    kernels::gqa_expand(qkv.data(), r.data(), B * T, H, KV, hs);
    attention_forward(*gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
    return dot(y, g);
  };
  forward();
  std::vector<float> dqkv(B * T * 3 * C), scratch(H * T * T), dx(B * T * width);
  attention_backward(*gemm, dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(), B, T, C,
                     H);
  kernels::gqa_reduce(dx.data(), dqkv.data(), B * T, H, KV, hs);
  kernels::rope_rotate(dx.data(), B, T, width, 0, H + KV, hs, 0, cs.data(), sn.data(), true);
  EXPECT_EQ(check_gradient("dqkv_gqa", forward, x, dx, 1, 1e-2, 1e-3), 0);
}
