#include "core/layers.hpp"

#include <cmath>
#include <utility>

#include "core/kernels.hpp"
#include "core/tensor_group.hpp"

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

namespace {
// The ring neighbours, and the rank whose block this rank holds after `step` shifts.
struct Ring {
  int size, rank, next, prev;
  explicit Ring(const TensorGroup& g)
      : size(g.size()), rank(g.rank()), next((g.rank() + 1) % g.size()),
        prev((g.rank() + g.size() - 1) % g.size()) {}
  int source(int step) const { return (rank - step + size) % size; }
};

// Visits every rank's (B,Tl,C) block of columns [column, column + C) of qkv: this rank's first,
// then each one received from the previous rank. visit(block, source_rank).
template <class Visit>
void around_the_ring(TensorGroup& group, const float* qkv, int column, float* ring_block,
                     int64_t rows, int C, Visit&& visit) {
  const Ring ring(group);
  float* cur = ring_block;
  float* spare = ring_block + rows * C;
  kernels::copy_columns(cur, C, qkv + column, 3 * C, rows, C);
  Kokkos::fence();
  for (int step = 0; step < ring.size; ++step) {
    visit(static_cast<const float*>(cur), ring.source(step));
    if (step + 1 < ring.size) {
      Kokkos::fence();
      group.send_recv(cur, std::size_t(rows) * C, ring.next, spare, ring.prev);
      std::swap(cur, spare);
    }
  }
}
}  // namespace

void ring_attention_forward(Gemm& gemm, TensorGroup& group, float* att, float* atty,
                            const float* qkv, float* ring_block, int B, int Tl, int C, int H) {
  const Ring ring(group);
  const int hs = C / H, T = Tl * ring.size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t rows = int64_t(B) * Tl, TlT = int64_t(Tl) * T;
  // Scores of this rank's queries against each key block up to its own.
  around_the_ring(group, qkv, C, ring_block, rows, C, [&](const float* k, int src) {
    if (src > ring.rank) return;
    for (int b = 0; b < B; ++b) {
      gemm.gemm_strided_batched(Trans::N, Trans::T, Tl, Tl, hs, scale,
                                qkv + int64_t(b) * Tl * 3 * C, 3 * C, hs, k + int64_t(b) * Tl * C,
                                C, hs, 0.0f, att + int64_t(b) * H * TlT + int64_t(src) * Tl, T, TlT,
                                H);
    }
  });
  kernels::causal_softmax_forward(att, int64_t(B) * H * Tl, Tl, T, ring.rank * Tl);
  // Output: the probabilities of each value block times the block, summed.
  around_the_ring(group, qkv, 2 * C, ring_block, rows, C, [&](const float* v, int src) {
    if (src > ring.rank) return;
    for (int b = 0; b < B; ++b) {
      gemm.gemm_strided_batched(Trans::N, Trans::N, Tl, hs, Tl, 1.0f,
                                att + int64_t(b) * H * TlT + int64_t(src) * Tl, T, TlT,
                                v + int64_t(b) * Tl * C, C, hs, src == ring.rank ? 0.0f : 1.0f,
                                atty + int64_t(b) * Tl * C, C, hs, H);
    }
  });
}

void ring_attention_backward(Gemm& gemm, TensorGroup& group, float* dqkv, float* datt,
                             const float* datty, const float* qkv, const float* att,
                             float* ring_block, float* dkv_all, int B, int Tl, int C, int H) {
  const Ring ring(group);
  const int hs = C / H, T = Tl * ring.size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t rows = int64_t(B) * Tl, TlT = int64_t(Tl) * T;
  // dkv_all: for every rank's block, this rank's part of its dK (columns [0, C)) and dV ([C, 2C)).
  const int64_t block = rows * 2 * C;
  kernels::fill(dkv_all, block * ring.size, 0.0f);
  around_the_ring(group, qkv, 2 * C, ring_block, rows, C, [&](const float* v, int src) {
    if (src > ring.rank) return;
    for (int b = 0; b < B; ++b) {
      const float* dy = datty + int64_t(b) * Tl * C;
      const float* p = att + int64_t(b) * H * TlT + int64_t(src) * Tl;
      float* dp = datt + int64_t(b) * H * TlT + int64_t(src) * Tl;
      gemm.gemm_strided_batched(Trans::N, Trans::T, Tl, Tl, hs, 1.0f, dy, C, hs,
                                v + int64_t(b) * Tl * C, C, hs, 0.0f, dp, T, TlT, H);
      gemm.gemm_strided_batched(Trans::T, Trans::N, Tl, hs, Tl, 1.0f, p, T, TlT, dy, C, hs, 0.0f,
                                dkv_all + src * block + int64_t(b) * Tl * 2 * C + C, 2 * C, hs, H);
    }
  });
  kernels::causal_softmax_backward(datt, att, int64_t(B) * H * Tl, Tl, T, ring.rank * Tl, scale);
  around_the_ring(group, qkv, C, ring_block, rows, C, [&](const float* k, int src) {
    if (src > ring.rank) return;
    for (int b = 0; b < B; ++b) {
      const float* ds = datt + int64_t(b) * H * TlT + int64_t(src) * Tl;
      const float* q = qkv + int64_t(b) * Tl * 3 * C;
      gemm.gemm_strided_batched(Trans::N, Trans::N, Tl, hs, Tl, 1.0f, ds, T, TlT,
                                k + int64_t(b) * Tl * C, C, hs, src == ring.rank ? 0.0f : 1.0f,
                                dqkv + int64_t(b) * Tl * 3 * C, 3 * C, hs, H);
      gemm.gemm_strided_batched(Trans::T, Trans::N, Tl, hs, Tl, 1.0f, ds, T, TlT, q, 3 * C, hs,
                                0.0f, dkv_all + src * block + int64_t(b) * Tl * 2 * C, 2 * C, hs,
                                H);
    }
  });
  // Every rank's parts of this rank's dK and dV, summed; K and V are adjacent columns of qkv.
  Kokkos::fence();
  group.reduce_scatter(dkv_all, std::size_t(block) * ring.size, ring_block);
  kernels::copy_columns(dqkv + C, 3 * C, ring_block, 2 * C, rows, 2 * C);
  Kokkos::fence();
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

namespace colossal::core {

// Row (b, h, i): s_j = scale q_i.k_j for j <= i; m, l track the running max and sum of exp(s - m);
// acc the running sum of exp(s_j - m) v_j, rescaled whenever m grows. y_i = acc / l,
// lse_i = m + log l.
void fused_attention_forward(float* lse, float* atty, const float* qkv, int B, int T, int C,
                             int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t rows = int64_t(B) * H * T;
  Kokkos::parallel_for(
      "colossal::core::fused_attention_forward", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(int64_t r) {
        const int i = static_cast<int>(r % T);
        const int h = static_cast<int>((r / T) % H);
        const int64_t b = r / (int64_t(T) * H);
        const float* q = qkv + (b * T + i) * 3 * C + h * hs;
        float* y = atty + (b * T + i) * C + h * hs;
        for (int d = 0; d < hs; ++d) y[d] = 0.0f;
        float m = -3.0e38f, l = 0.0f;
        for (int j = 0; j <= i; ++j) {
          const float* k = qkv + (b * T + j) * 3 * C + C + h * hs;
          const float* v = k + C;
          float s = 0.0f;
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          s *= scale;
          if (s > m) {
            const float correction = kernels::fast_exp(m - s);
            l *= correction;
            for (int d = 0; d < hs; ++d) y[d] *= correction;
            m = s;
          }
          const float p = kernels::fast_exp(s - m);
          l += p;
          for (int d = 0; d < hs; ++d) y[d] += p * v[d];
        }
        const float inv = 1.0f / l;
        for (int d = 0; d < hs; ++d) y[d] *= inv;
        lse[r] = m + kmath::log(l);
      });
}

// Per (b, h), rows in order (dK and dV of a head gather from every later row, so one work item
// owns a head: no atomics, deterministic). p_ij = exp(s_ij - lse_i), D_i = dy_i.y_i,
// ds_ij = p_ij (dy_i.v_j - D_i); dq_i = scale sum_j ds_ij k_j, dk_j += scale ds_ij q_i,
// dv_j += p_ij dy_i.
void fused_attention_backward(float* dqkv, const float* datty, const float* atty,
                              const float* qkv, const float* lse, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Kokkos::parallel_for(
      "colossal::core::fused_attention_backward", Kokkos::RangePolicy<>(0, int64_t(B) * H),
      KOKKOS_LAMBDA(int64_t bh) {
        const int h = static_cast<int>(bh % H);
        const int64_t b = bh / H;
        for (int t = 0; t < T; ++t) {
          float* d = dqkv + (b * T + t) * 3 * C + h * hs;
          for (int e = 0; e < hs; ++e) d[e] = d[C + e] = d[2 * C + e] = 0.0f;
        }
        for (int i = 0; i < T; ++i) {
          const float* q = qkv + (b * T + i) * 3 * C + h * hs;
          const float* dy = datty + (b * T + i) * C + h * hs;
          const float* y = atty + (b * T + i) * C + h * hs;
          float* dq = dqkv + (b * T + i) * 3 * C + h * hs;
          float D = 0.0f;
          for (int e = 0; e < hs; ++e) D += dy[e] * y[e];
          const float row_lse = lse[(b * H + h) * T + i];
          for (int j = 0; j <= i; ++j) {
            const float* k = qkv + (b * T + j) * 3 * C + C + h * hs;
            const float* v = k + C;
            float* dk = dqkv + (b * T + j) * 3 * C + C + h * hs;
            float* dv = dk + C;
            float s = 0.0f, dp = 0.0f;
            for (int e = 0; e < hs; ++e) {
              s += q[e] * k[e];
              dp += dy[e] * v[e];
            }
            const float p = kernels::fast_exp(s * scale - row_lse);
            const float ds = scale * p * (dp - D);
            for (int e = 0; e < hs; ++e) {
              dq[e] += ds * k[e];
              dk[e] += ds * q[e];
              dv[e] += p * dy[e];
            }
          }
        }
      });
}

}  // namespace colossal::core
