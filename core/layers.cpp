#include "core/layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "core/attention_tc.hpp"
#include "core/attention_team.hpp"
#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

void linear_forward(Gemm& gemm, WeightLayout layout, float* out, int ld_out, GemmOperand inp,
                    int ld_in, const float* weight, int in_features, int out_features, int64_t N,
                    bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (layout == WeightLayout::in_out) {
    gemm.gemm_mixed(Trans::N, Trans::N, N, out_features, in_features, 1.0f, inp, ld_in, weight,
                    out_features, beta, out, ld_out);
  } else {
    gemm.gemm_mixed(Trans::N, Trans::T, N, out_features, in_features, 1.0f, inp, ld_in, weight,
                    in_features, beta, out, ld_out);
  }
}

// in_out: dX = dY W^T, dW[in,out] += X^T dY.   out_in: dX = dY W, dW[out,in] += dY^T X.
void linear_backward(Gemm& gemm, WeightLayout layout, float* dinp, int ld_dinp, float* dweight,
                     float* dbias, const float* dout, int ld_dout, GemmOperand inp, int ld_in,
                     const float* weight, int in_features, int out_features, int64_t N,
                     bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (layout == WeightLayout::in_out) {
    gemm.gemm(Trans::N, Trans::T, N, in_features, out_features, 1.0f, dout, ld_dout, weight,
              out_features, beta, dinp, ld_dinp);
    gemm.gemm_mixed(Trans::T, Trans::N, in_features, out_features, N, 1.0f, inp, ld_in, dout,
                    ld_dout, 1.0f, dweight, out_features);
  } else {
    gemm.gemm(Trans::N, Trans::N, N, in_features, out_features, 1.0f, dout, ld_dout, weight,
              in_features, beta, dinp, ld_dinp);
    gemm.gemm_mixed(Trans::T, Trans::N, out_features, in_features, N, 1.0f, dout, ld_dout, inp,
                    ld_in, 1.0f, dweight, in_features);
  }
  if (dbias != nullptr) kernels::bias_backward(dbias, dout, N, out_features, ld_dout);
}

// Per sequence b, batched over heads: S = scale Q K^T, P = causal_softmax(S), Y = P V.
void attention_forward(Gemm& gemm, float* att, float* atty, GemmOperand qkv, int B, int T, int C,
                       int H, std::uint16_t* att_bf16) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  if (att_bf16 != nullptr) {  // one sequence at a time through `att` (H,T,T), saved as bf16
    for (int b = 0; b < B; ++b) {
      attention_forward(gemm, att, atty + int64_t(b) * T * C, qkv + int64_t(b) * T * 3 * C, 1, T,
                        C, H);
      kernels::to_bf16(att_bf16 + int64_t(b) * H * TT, att, int64_t(H) * TT);
    }
    return;
  }
  for (int b = 0; b < B; ++b) {
    const GemmOperand q = qkv + int64_t(b) * T * 3 * C;
    gemm.gemm_mixed_batched(Trans::N, Trans::T, T, T, hs, scale, q, 3 * C, hs, q + C, 3 * C, hs,
                            0.0f, att + int64_t(b) * H * TT, T, TT, H);
  }
  kernels::causal_softmax_forward(att, int64_t(B) * H * T, T);
  for (int b = 0; b < B; ++b) {
    const GemmOperand v = qkv + (int64_t(b) * T * 3 * C + 2 * C);
    gemm.gemm_mixed_batched(Trans::N, Trans::N, T, hs, T, 1.0f, att + int64_t(b) * H * TT, T, TT,
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
  fence_kernels();
  for (int step = 0; step < ring.size; ++step) {
    visit(static_cast<const float*>(cur), ring.source(step));
    if (step + 1 < ring.size) {
      fence_kernels();
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
  fence_kernels();
  group.reduce_scatter(dkv_all, std::size_t(block) * ring.size, ring_block);
  kernels::copy_columns(dqkv + C, 3 * C, ring_block, 2 * C, rows, 2 * C);
  fence_kernels();
}

// dP = dY V^T, dV = P^T dY, dS = softmax_backward(dP) (scale folded in), dQ = dS K, dK = dS^T Q.
void attention_backward(Gemm& gemm, float* dqkv, float* datt, const float* datty,
                        GemmOperand qkv, GemmOperand att, int B, int T, int C, int H) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t TT = int64_t(T) * T;
  for (int b = 0; b < B; ++b) {
    const GemmOperand q = qkv + int64_t(b) * T * 3 * C;
    const GemmOperand k = q + C;
    const GemmOperand v = q + 2 * C;
    const GemmOperand p = att + int64_t(b) * H * TT;
    const float* dy = datty + int64_t(b) * T * C;
    float* dq = dqkv + int64_t(b) * T * 3 * C;
    gemm.gemm_mixed_batched(Trans::N, Trans::T, T, T, hs, 1.0f, dy, C, hs, v, 3 * C, hs, 0.0f,
                            datt, T, TT, H);
    gemm.gemm_mixed_batched(Trans::T, Trans::N, T, hs, T, 1.0f, p, T, TT, dy, C, hs, 0.0f,
                            dq + 2 * C, 3 * C, hs, H);
    if (p.bf16 != nullptr) {  // probabilities saved in bf16
      kernels::causal_softmax_backward(datt, p.bf16, int64_t(H) * T, T, scale);
    } else {
      kernels::causal_softmax_backward(datt, p.f32, int64_t(H) * T, T, scale);
    }
    gemm.gemm_mixed_batched(Trans::N, Trans::N, T, hs, T, 1.0f, datt, T, TT, k, 3 * C, hs, 0.0f,
                            dq, 3 * C, hs, H);
    gemm.gemm_mixed_batched(Trans::T, Trans::N, T, hs, T, 1.0f, datt, T, TT, q, 3 * C, hs, 0.0f,
                            dq + C, 3 * C, hs, H);
  }
}

}  // namespace colossal::core

namespace colossal::core {

// Notation for one head of one sequence: Q, K, V, Y, dY are T x hs column blocks of qkv / atty
// (leading dimension 3C or C); a query tile holds rows [r0, r0 + nr), a key tile columns
// [c0, c0 + nc); with equal, aligned tiles only the diagonal block (c0 = r0) needs the causal
// mask, and there row i sees columns j <= i.
namespace {

// Per row of the score block S (ld `ld`): the causal mask, the online-softmax update of the row's
// maximum m and sum l, S replaced by exp(S - m_new), and the row of the output accumulator
// (y, ld ldy, hs wide) rescaled by exp(m_old - m_new) unless this is the first key tile.
void online_softmax_block(float* S, int ld, float* m, float* l, float* y, int ldy, int hs, int nr,
                          int nc, bool diagonal, bool first) {
  Kokkos::parallel_for(
      "colossal::core::fused_attention_online_softmax", Kokkos::RangePolicy<>(0, nr),
      KOKKOS_LAMBDA(int i) {
        float* s = S + int64_t(i) * ld;
        const int valid = diagonal ? i + 1 : nc;
        const float block_max = kernels::lane_max(s, valid);
        const float mx = first || block_max > m[i] ? block_max : m[i];
        const float sum = kernels::lane_sum(valid, [&](int j) {
          const float e = kernels::fast_exp(s[j] - mx);
          s[j] = e;
          return e;
        });
        for (int j = valid; j < nc; ++j) s[j] = 0.0f;
        if (first) {
          l[i] = sum;
        } else {
          const float correction = kernels::fast_exp(m[i] - mx);
          l[i] = l[i] * correction + sum;
          float* yi = y + int64_t(i) * ldy;
          for (int d = 0; d < hs; ++d) yi[d] *= correction;
        }
        m[i] = mx;
      });
}

}  // namespace

void fused_attention_forward(Gemm& gemm, float* lse, float* atty, GemmOperand qkv, float* work,
                             int B, int T, int C, int H, int tile) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* S = work;
  float* m = S + int64_t(tile) * tile;
  float* l = m + tile;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const GemmOperand q = qkv + (int64_t(b) * T * 3 * C + h * hs);
      const GemmOperand k = q + C;
      const GemmOperand v = q + 2 * C;
      float* y = atty + int64_t(b) * T * C + h * hs;
      float* row_lse = lse + (int64_t(b) * H + h) * T;
      for (int r0 = 0; r0 < T; r0 += tile) {
        const int nr = std::min(tile, T - r0);
        float* yI = y + int64_t(r0) * C;
        for (int c0 = 0; c0 <= r0; c0 += tile) {
          const int nc = std::min(tile, T - c0);
          gemm.gemm_mixed(Trans::N, Trans::T, nr, nc, hs, scale, q + int64_t(r0) * 3 * C, 3 * C,
                          k + int64_t(c0) * 3 * C, 3 * C, 0.0f, S, tile);
          online_softmax_block(S, tile, m, l, yI, C, hs, nr, nc, c0 == r0, c0 == 0);
          gemm.gemm_mixed(Trans::N, Trans::N, nr, hs, nc, 1.0f, S, tile, v + int64_t(c0) * 3 * C,
                          3 * C, c0 == 0 ? 0.0f : 1.0f, yI, C);
        }
        float* lseI = row_lse + r0;
        Kokkos::parallel_for(
            "colossal::core::fused_attention_normalize", Kokkos::RangePolicy<>(0, nr),
            KOKKOS_LAMBDA(int i) {
              const float inv = 1.0f / l[i];
              float* yi = yI + int64_t(i) * C;
              for (int d = 0; d < hs; ++d) yi[d] *= inv;
              lseI[i] = m[i] + kmath::log(l[i]);
            });
      }
    }
  }
  fence_kernels();
}

// p_ij = exp(s_ij - lse_i) (masked: 0), D_i = dy_i.y_i, ds_ij = scale p_ij (dp_ij - D_i) with
// dP = dY V^T; dV += P^T dY, dQ = dS K, dK += dS^T Q, block by block.
void fused_attention_backward(Gemm& gemm, float* dqkv, const float* datty, const float* atty,
                              GemmOperand qkv, const float* lse, float* work, int B, int T,
                              int C, int H, int tile) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  float* P = work;
  float* dP = P + int64_t(tile) * tile;
  float* D = dP + int64_t(tile) * tile;
  for (int b = 0; b < B; ++b) {
    // dK and dV accumulate over query tiles: start them at zero (dQ is assigned per tile).
    float* dkv = dqkv + int64_t(b) * T * 3 * C + C;
    Kokkos::parallel_for(
        "colossal::core::fused_attention_zero_dkv", Kokkos::RangePolicy<>(0, T),
        KOKKOS_LAMBDA(int t) {
          float* row = dkv + int64_t(t) * 3 * C;
          for (int e = 0; e < 2 * C; ++e) row[e] = 0.0f;
        });
    for (int h = 0; h < H; ++h) {
      const GemmOperand q = qkv + (int64_t(b) * T * 3 * C + h * hs);
      const GemmOperand k = q + C;
      const GemmOperand v = q + 2 * C;
      const float* y = atty + int64_t(b) * T * C + h * hs;
      const float* dy = datty + int64_t(b) * T * C + h * hs;
      float* dq = dqkv + int64_t(b) * T * 3 * C + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* row_lse = lse + (int64_t(b) * H + h) * T;
      for (int r0 = 0; r0 < T; r0 += tile) {
        const int nr = std::min(tile, T - r0);
        const float* dyI = dy + int64_t(r0) * C;
        const float* yI = y + int64_t(r0) * C;
        Kokkos::parallel_for(
            "colossal::core::fused_attention_row_dot", Kokkos::RangePolicy<>(0, nr),
            KOKKOS_LAMBDA(int i) {
              const float* dyi = dyI + int64_t(i) * C;
              const float* yi = yI + int64_t(i) * C;
              D[i] = kernels::lane_sum(hs, [&](int e) { return dyi[e] * yi[e]; });
            });
        for (int c0 = 0; c0 <= r0; c0 += tile) {
          const int nc = std::min(tile, T - c0);
          const bool diagonal = c0 == r0;
          gemm.gemm_mixed(Trans::N, Trans::T, nr, nc, hs, scale, q + int64_t(r0) * 3 * C, 3 * C,
                          k + int64_t(c0) * 3 * C, 3 * C, 0.0f, P, tile);
          gemm.gemm_mixed(Trans::N, Trans::T, nr, nc, hs, 1.0f, dyI, C, v + int64_t(c0) * 3 * C,
                          3 * C, 0.0f, dP, tile);
          const float* lseI = row_lse + r0;
          Kokkos::parallel_for(
              "colossal::core::fused_attention_block_grad", Kokkos::RangePolicy<>(0, nr),
              KOKKOS_LAMBDA(int i) {
                float* p = P + int64_t(i) * tile;
                float* ds = dP + int64_t(i) * tile;
                const int valid = diagonal ? i + 1 : nc;
                for (int j = 0; j < valid; ++j) {
                  p[j] = kernels::fast_exp(p[j] - lseI[i]);
                  ds[j] = scale * p[j] * (ds[j] - D[i]);
                }
                for (int j = valid; j < nc; ++j) p[j] = ds[j] = 0.0f;
              });
          gemm.gemm(Trans::T, Trans::N, nc, hs, nr, 1.0f, P, tile, dyI, C, 1.0f,
                    dv + int64_t(c0) * 3 * C, 3 * C);
          gemm.gemm_mixed(Trans::N, Trans::N, nr, hs, nc, 1.0f, dP, tile, k + int64_t(c0) * 3 * C,
                          3 * C, c0 == 0 ? 0.0f : 1.0f, dq + int64_t(r0) * 3 * C, 3 * C);
          gemm.gemm_mixed(Trans::T, Trans::N, nc, hs, nr, 1.0f, dP, tile, q + int64_t(r0) * 3 * C,
                          3 * C, 1.0f, dk + int64_t(c0) * 3 * C, 3 * C);
        }
      }
    }
  }
  fence_kernels();
}

}  // namespace colossal::core

namespace colossal::core {

void model_fused_attention_forward(Gemm& gemm, float* lse, float* atty, GemmOperand qkv,
                                   float* work, int B, int T, int C, int H) {
  if constexpr (device_memory_v<kernels::Exec>) {
    if (qkv.bf16 != nullptr) {
      tc::device_forward(lse, atty, qkv.bf16, B, T, C, H);
    } else {
      team::attention_forward<kernels::Exec>(lse, atty, qkv.f32, B, T, C, H);
    }
  } else {
    fused_attention_forward(gemm, lse, atty, qkv, work, B, T, C, H);
  }
}

void model_fused_attention_backward(Gemm& gemm, float* dqkv, const float* datty,
                                    const float* atty, GemmOperand qkv, const float* lse,
                                    float* work, int B, int T, int C, int H) {
  if constexpr (device_memory_v<kernels::Exec>) {
    if (qkv.bf16 != nullptr) {
      tc::device_backward(dqkv, datty, atty, qkv.bf16, lse, B, T, C, H);
    } else {
      team::attention_backward<kernels::Exec>(dqkv, datty, atty, qkv.f32, lse, B, T, C, H);
    }
  } else {
    fused_attention_backward(gemm, dqkv, datty, atty, qkv, lse, work, B, T, C, H);
  }
}

std::string fused_attention_unsupported(int head_size, bool bf16_qkv) {
  if (!device_memory_v<kernels::Exec> || !bf16_qkv || tc::tc_head_supported(head_size)) return {};
  return "model.fused_attention with train.precision: bf16 on a GPU runs the tensor-core "
         "attention, which needs a head size (model.hidden / model.heads) that is a multiple of "
         "16 up to 256, not " +
         std::to_string(head_size) +
         "; set model.fused_attention: false, or train.precision: fp32 (its fused attention runs "
         "any head size)";
}

std::string fused_attention_description(int head_size, bool bf16_qkv) {
  if (!device_memory_v<kernels::Exec>) {
    return "fused (FlashAttention's tiles of " + std::to_string(kAttentionTile) +
           " positions on the host, one log-sum-exp per row kept)";
  }
  if (!bf16_qkv) return "fused (Kokkos team kernels in fp32, one log-sum-exp per row kept)";
  return "fused (tensor cores: bf16 WMMA products, fp32 sums, tiles of " +
         std::to_string(tc::device_tile(head_size)) + " positions; one log-sum-exp per row kept)";
}

}  // namespace colossal::core
