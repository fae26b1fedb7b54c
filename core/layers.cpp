#include "core/layers.hpp"

#include <cmath>

#include "core/kernels.hpp"

namespace colossal::core {

void linear_forward(Gemm& gemm, WeightLayout layout, float* out, int ld_out, const float* inp,
                    int ld_in, const float* weight, int in_features, int out_features, int64_t N) {
  if (layout == WeightLayout::in_out) {
    gemm.gemm(Trans::N, Trans::N, N, out_features, in_features, 1.0f, inp, ld_in, weight,
              out_features, 1.0f, out, ld_out);
  } else {
    gemm.gemm(Trans::N, Trans::T, N, out_features, in_features, 1.0f, inp, ld_in, weight,
              in_features, 1.0f, out, ld_out);
  }
}

// in_out: dX = dY W^T, dW[in,out] += X^T dY.   out_in: dX = dY W, dW[out,in] += dY^T X.
void linear_backward(Gemm& gemm, WeightLayout layout, float* dinp, int ld_dinp, float* dweight,
                     float* dbias, const float* dout, int ld_dout, const float* inp, int ld_in,
                     const float* weight, int in_features, int out_features, int64_t N,
                     bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (layout == WeightLayout::in_out) {
    gemm.gemm(Trans::N, Trans::T, N, in_features, out_features, 1.0f, dout, ld_dout, weight,
              out_features, beta, dinp, ld_dinp);
    gemm.gemm(Trans::T, Trans::N, in_features, out_features, N, 1.0f, inp, ld_in, dout, ld_dout,
              1.0f, dweight, out_features);
  } else {
    gemm.gemm(Trans::N, Trans::N, N, in_features, out_features, 1.0f, dout, ld_dout, weight,
              in_features, beta, dinp, ld_dinp);
    gemm.gemm(Trans::T, Trans::N, out_features, in_features, N, 1.0f, dout, ld_dout, inp, ld_in,
              1.0f, dweight, in_features);
  }
  kernels::bias_backward(dbias, dout, N, out_features, ld_dout);
}

// Per sequence b, batched over heads: S = scale Q K^T, P = causal_softmax(S), Y = P V.
void attention_forward(Gemm& gemm, float* att, float* atty, const float* qkv, int B, int T, int C,
                       int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t(b) * T * 3 * C;
    gemm.gemm_strided_batched(Trans::N, Trans::T, T, T, hs, scale, q, 3 * C, hs, q + C, 3 * C, hs,
                              0.0f, att + int64_t(b) * H * TT, T, TT, H);
  }
  kernels::causal_softmax_forward(att, int64_t(B) * H * T, T);
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + int64_t(b) * T * 3 * C + 2 * C;
    gemm.gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.0f, att + int64_t(b) * H * TT, T, TT,
                              v, 3 * C, hs, 0.0f, atty + int64_t(b) * T * C, C, hs, H);
  }
}

// dP = dY V^T, dV = P^T dY, dS = softmax_backward(dP) (scale folded in), dQ = dS K, dK = dS^T Q.
void attention_backward(Gemm& gemm, float* dqkv, float* datt, const float* datty,
                        const float* qkv, const float* att, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + int64_t(b) * T * 3 * C;
    const float* k = q + C;
    const float* v = q + 2 * C;
    const float* p = att + int64_t(b) * H * TT;
    const float* dy = datty + int64_t(b) * T * C;
    float* dq = dqkv + int64_t(b) * T * 3 * C;
    gemm.gemm_strided_batched(Trans::N, Trans::T, T, T, hs, 1.0f, dy, C, hs, v, 3 * C, hs, 0.0f,
                              datt, T, TT, H);
    gemm.gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.0f, p, T, TT, dy, C, hs, 0.0f,
                              dq + 2 * C, 3 * C, hs, H);
    kernels::causal_softmax_backward(datt, p, int64_t(H) * T, T, scale);
    gemm.gemm_strided_batched(Trans::N, Trans::N, T, hs, T, 1.0f, datt, T, TT, k, 3 * C, hs, 0.0f,
                              dq, 3 * C, hs, H);
    gemm.gemm_strided_batched(Trans::T, Trans::N, T, hs, T, 1.0f, datt, T, TT, q, 3 * C, hs, 0.0f,
                              dq + C, 3 * C, hs, H);
  }
}

}  // namespace colossal::core
