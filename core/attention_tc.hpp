// Fused causal attention on the tensor cores (bf16 operands, fp32 accumulation): the device form
// of FlashAttention (Dao et al. 2022) with FlashAttention-2's deterministic split of backward,
// for runs whose q/k/v are stored in bf16. Same layouts as fused_attention_forward/backward
// (core/layers.hpp): qkv (B,T,3C) with head h in columns [h*hs, (h+1)*hs) of each of the Q, K, V
// blocks, atty (B,T,C) in fp32, lse (B,H,T) the log-sum-exp of each row's scaled scores, dqkv
// (B,T,3C) assigned. Memory linear in T: only lse is saved.
//
// One CUDA block of kTcThreads threads per (batch, head, tile of `tile` positions). Every
// product is a block-level GEMM on shared memory: the 16 x 16 output tiles are dealt to the warps,
// each running WMMA's 16x16x16 bf16 products with fp32 accumulators (Blk::gemm). Everything else
// is element-wise or per-row work on shared memory in phases separated by block barriers
// (Blk::each, Blk::sync). The kernels are written once against that interface:
//   - the device block (core/attention_tc.cpp, CUDA builds) runs a phase's elements over the
//     block's threads and the products on WMMA;
//   - HostBlock below runs them one after another on the host, so the tests check the tiling,
//     the causal mask, the online softmax and the backward's algebra on any machine against an
//     independent reference (tests/test_attention_tc.cpp), and the device's results against it.
//
// Forward, per query tile: Q in shared memory; for each key tile up to the diagonal, K and V are
// loaded, S = Q K^T, the online softmax (running row maximum m and sum l; P = exp(scale S - m) in
// bf16; the output accumulator O rescaled by exp(m_old - m_new)), O += P V. At the end
// y = O / l and lse = m + log l.
// Backward, two kernels, each result written by one block (no atomics):
//   dK, dV: a block per key tile walks the query tiles from the diagonal on;
//   dQ: a block per query tile walks the key tiles up to the diagonal.
// Both recompute S = Q K^T and dP = dY V^T, then P = exp(scale S - lse), dS = scale P (dP - D)
// with D_i = dy_i . y_i (fp32), and accumulate dV += P^T dY, dK += dS^T Q, dQ += dS K in fp32.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "core/gemm.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::core::tc {

constexpr int kTcThreads = 256;  // 8 warps
constexpr float kNoMax = -3.0e38f;

// Row strides in shared memory: bf16 rows padded by 8 elements and fp32 rows by 4, which keeps
// WMMA's stride rules (multiples of 16 bytes) and every 16-row fragment 32-byte aligned, and
// moves consecutive rows off the same banks.
KOKKOS_INLINE_FUNCTION constexpr int ld_bf16(int n) { return n + 8; }
KOKKOS_INLINE_FUNCTION constexpr int ld_f32(int n) { return n + 4; }

enum class TcKernel { forward, dkv, dq };

// Byte offsets of one kernel's shared-memory arrays (each region starts 128-byte aligned).
struct TcLayout {
  // bf16 tiles x (hs + 8)
  std::size_t q = 0, k = 0, v = 0, dy = 0;
  // fp32 tiles x (hs + 4)
  std::size_t o = 0, dk = 0, dv = 0;
  // fp32 tiles x (tile + 4)
  std::size_t s = 0, dp = 0;
  // bf16 tiles x (tile + 8)
  std::size_t p = 0, ds = 0;
  // fp32: kTcThreads partial values; per row m, l, correction (forward) or lse, D (backward)
  std::size_t part = 0, row_a = 0, row_b = 0, row_c = 0;
  std::size_t bytes = 0;

  KOKKOS_INLINE_FUNCTION TcLayout(TcKernel kernel, int tile, int hs) {
    const std::size_t t = std::size_t(tile);
    const std::size_t half_hs = t * std::size_t(ld_bf16(hs)) * 2;
    const std::size_t float_hs = t * std::size_t(ld_f32(hs)) * 4;
    const std::size_t float_tt = t * std::size_t(ld_f32(tile)) * 4;
    const std::size_t half_tt = t * std::size_t(ld_bf16(tile)) * 2;
    std::size_t at = 0;
    auto take = [&at](std::size_t n) {
      const std::size_t here = at;
      at += (n + 127) / 128 * 128;
      return here;
    };
    q = take(half_hs);
    k = take(half_hs);
    v = take(half_hs);
    if (kernel != TcKernel::forward) dy = take(half_hs);
    if (kernel == TcKernel::forward) o = take(float_hs);
    if (kernel == TcKernel::dkv) {
      dk = take(float_hs);
      dv = take(float_hs);
    }
    if (kernel == TcKernel::dq) dk = take(float_hs);  // dQ's accumulator
    s = take(float_tt);
    if (kernel != TcKernel::forward) dp = take(float_tt);
    p = take(half_tt);
    if (kernel == TcKernel::dkv) ds = take(half_tt);
    if (kernel == TcKernel::dq) ds = p;  // dQ needs dS only
    part = take(std::size_t(kTcThreads) * 4);
    row_a = take(t * 4);
    row_b = take(t * 4);
    row_c = take(t * 4);
    bytes = at;
  }
};

// The head sizes the kernels take: whole 16-wide WMMA steps, at most 256.
constexpr bool tc_head_supported(int hs) { return hs > 0 && hs % 16 == 0 && hs <= 256; }
// The tiles: whole WMMA steps, and rows a whole number of lanes of kTcThreads threads wide.
constexpr bool tc_tile_supported(int tile) { return tile == 16 || tile == 32 || tile == 64; }

struct TcArgs {
  const std::uint16_t* qkv = nullptr;  // (B,T,3C) bf16
  float* atty = nullptr;               // forward out; backward in (fp32, y)
  float* lse = nullptr;                // forward out; backward in
  const float* datty = nullptr;        // backward in
  float* dqkv = nullptr;               // backward out (assigned)
  int B = 0, T = 0, C = 0, H = 0, tile = 64;
  // Whether q/k/v rows may be read 16 bytes at a time: qkv 16-byte aligned, 3C a multiple of 8
  // (tc_vector_loads).
  bool vector_loads = false;
  KOKKOS_INLINE_FUNCTION int tiles() const { return (T + tile - 1) / tile; }
  KOKKOS_INLINE_FUNCTION int blocks() const { return B * H * tiles(); }
};

// A phase's lambdas capture by value (pointers and indices), so a test may run them after the
// function that queued them has returned, in any order the device could (tests/
// test_attention_tc.cpp's schedule check).
//
inline bool tc_vector_loads(const std::uint16_t* qkv, int C) {
  return reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && (3 * C) % 8 == 0;
}

// The host's stand-in for a CUDA block: a phase's elements one after another, products as
// loops in fp32 over the exact values of the bf16 operands. (Marked for the device too only so
// that a CUDA build's host code may instantiate the kernels' bodies with it.)
struct HostBlock {
  template <class F>
  KOKKOS_INLINE_FUNCTION void each(int n, F&& f) const {
    for (int e = 0; e < n; ++e) f(e);
  }
  KOKKOS_INLINE_FUNCTION void sync() const {}
  // C (M x N, row-major, ldc) = or += op(A) op(B), op(A) M x K: A[i*lda + k] or, transposed,
  // A[k*lda + i]; op(B) K x N: B[k*ldb + j] or, transposed, B[j*ldb + k]. M, N, K multiples of 16.
  template <bool TransA, bool TransB>
  KOKKOS_INLINE_FUNCTION void gemm(int M, int N, int K, const std::uint16_t* A, int lda,
                                   const std::uint16_t* B, int ldb, float* C, int ldc,
                                   bool accumulate) const {
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        float sum = accumulate ? C[i * ldc + j] : 0.0f;
        for (int k = 0; k < K; ++k) {
          const float a = bf16_value(TransA ? A[k * lda + i] : A[i * lda + k]);
          const float b = bf16_value(TransB ? B[j * ldb + k] : B[k * ldb + j]);
          sum += a * b;
        }
        C[i * ldc + j] = sum;
      }
    }
  }
};

namespace detail {

template <class T>
KOKKOS_INLINE_FUNCTION T* at(unsigned char* smem, std::size_t offset) {
  return reinterpret_cast<T*>(smem + offset);
}
KOKKOS_INLINE_FUNCTION int min_int(int a, int b) { return a < b ? a : b; }
KOKKOS_INLINE_FUNCTION float max_float(float a, float b) { return a > b ? a : b; }

// 8 bf16 values (16 bytes, both addresses 16-byte aligned), or zeros when src is null: one
// 128-bit load and store on the device.
struct alignas(16) Bits128 {
  std::uint32_t w[4];
};
KOKKOS_INLINE_FUNCTION void copy8(std::uint16_t* dst, const std::uint16_t* src) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<Bits128*>(dst) =
      src != nullptr ? *reinterpret_cast<const Bits128*>(src) : Bits128{{0u, 0u, 0u, 0u}};
#else
  for (int k = 0; k < 8; ++k) dst[k] = src != nullptr ? src[k] : std::uint16_t(0);
#endif
}

// Rows [row0, row0 + n) of one head's Q, K or V block into a bf16 tile, zero rows past n. With
// `vector` (the source's rows 16-byte aligned: TcArgs::vector_loads) 8 values per element.
template <class Blk>
KOKKOS_INLINE_FUNCTION void load_rows(const Blk& blk, std::uint16_t* dst, const std::uint16_t* src,
                                      int64_t ld, int row0, int n, int tile, int hs, bool vector) {
  const int ldh = ld_bf16(hs);
  if (vector) {
    const int groups = hs / 8;
    blk.each(tile * groups, [=](int e) {
      const int i = e / groups, c = (e % groups) * 8;
      copy8(dst + i * ldh + c, i < n ? src + int64_t(row0 + i) * ld + c : nullptr);
    });
    return;
  }
  blk.each(tile * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    dst[i * ldh + c] = i < n ? src[int64_t(row0 + i) * ld + c] : std::uint16_t(0);
  });
}

// dY's rows in bf16, and the lane-partial sums of D_i = dy_i . y_i in fp32 over the bf16 dy
// (part[i*lanes + p]).
template <class Blk>
KOKKOS_INLINE_FUNCTION void load_dy(const Blk& blk, std::uint16_t* dy16, float* part,
                                    const float* dy, const float* y, int64_t ld, int row0, int n,
                                    int tile, int hs) {
  const int ldh = ld_bf16(hs);
  blk.each(tile * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    dy16[i * ldh + c] = i < n ? bf16_bits(dy[int64_t(row0 + i) * ld + c]) : std::uint16_t(0);
  });
  const int lanes = kTcThreads / tile, width = hs / lanes;
  blk.each(tile * lanes, [=](int e) {
    const int i = e / lanes, lane = e % lanes;
    float sum = 0.0f;
    if (i < n) {
      const float* dyi = dy + int64_t(row0 + i) * ld;
      const float* yi = y + int64_t(row0 + i) * ld;
      // dY as the products see it (bf16), so that sum_j P_ij (dP_ij - D_i) is 0 as it should.
      for (int c = lane * width; c < (lane + 1) * width; ++c) {
        sum += bf16_value(bf16_bits(dyi[c])) * yi[c];
      }
    }
    part[e] = sum;
  });
}

// Recomputed probabilities and score gradients of one (query tile, key tile) block:
// P = exp(scale S - lse_i), dS = scale P (dP - D_i), both in bf16, zero where masked (causal,
// or past the last row n_q / key n_k).
template <class Blk>
KOKKOS_INLINE_FUNCTION void block_gradients(const Blk& blk, std::uint16_t* P, std::uint16_t* dS,
                                            const float* S, const float* dP, const float* lse,
                                            const float* D, int tile, int n_q, int n_k,
                                            bool diagonal, float scale) {
  const int lds = ld_f32(tile), ldp = ld_bf16(tile);
  blk.each(tile * tile, [=](int e) {
    const int i = e / tile, j = e % tile;
    const bool valid = i < n_q && j < n_k && (!diagonal || j <= i);
    float p = 0.0f, ds = 0.0f;
    if (valid) {
      p = kmath::exp(scale * S[i * lds + j] - lse[i]);
      ds = scale * p * (dP[i * lds + j] - D[i]);
    }
    if (P != nullptr) P[i * ldp + j] = bf16_bits(p);
    dS[i * ldp + j] = bf16_bits(ds);
  });
}

}  // namespace detail

// One forward block: query tile and (batch, head) from `index`, the heaviest tiles first.
template <class Blk>
KOKKOS_INLINE_FUNCTION void forward_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                          int index) {
  using detail::at;
  const int t = a.tile, hs = a.C / a.H, BH = a.B * a.H, T = a.T, C = a.C;
  const int qt = a.tiles() - 1 - index / BH, bh = index % BH, h = bh % a.H, b = bh / a.H;
  const int r0 = qt * t, nr = detail::min_int(t, T - r0);
  const float scale = 1.0f / kmath::sqrt(float(hs));
  const TcLayout L(TcKernel::forward, t, hs);
  std::uint16_t* Q = at<std::uint16_t>(smem, L.q);
  std::uint16_t* K = at<std::uint16_t>(smem, L.k);
  std::uint16_t* V = at<std::uint16_t>(smem, L.v);
  std::uint16_t* P = at<std::uint16_t>(smem, L.p);
  float* O = at<float>(smem, L.o);
  float* S = at<float>(smem, L.s);
  float* part = at<float>(smem, L.part);
  float* m = at<float>(smem, L.row_a);
  float* l = at<float>(smem, L.row_b);
  float* corr = at<float>(smem, L.row_c);
  const int ldh = ld_bf16(hs), ldo = ld_f32(hs), lds = ld_f32(t), ldp = ld_bf16(t);
  const int lanes = kTcThreads / t;
  const int64_t ld = 3 * int64_t(C);
  const std::uint16_t* base = a.qkv + int64_t(b) * T * ld + int64_t(h) * hs;

  detail::load_rows(blk, Q, base, ld, r0, nr, t, hs, a.vector_loads);
  blk.each(t * hs, [=](int e) { O[(e / hs) * ldo + e % hs] = 0.0f; });
  blk.each(t, [=](int i) {
    m[i] = kNoMax;
    l[i] = 0.0f;
  });
  for (int kt = 0; kt <= qt; ++kt) {
    const int c0 = kt * t, nc = detail::min_int(t, T - c0);
    const bool diagonal = kt == qt;
    blk.sync();  // the last tile's P V has read K, V and P
    detail::load_rows(blk, K, base + C, ld, c0, nc, t, hs, a.vector_loads);
    detail::load_rows(blk, V, base + 2 * C, ld, c0, nc, t, hs, a.vector_loads);
    blk.sync();
    blk.template gemm<false, true>(t, t, hs, Q, ldh, K, ldh, S, lds, false);
    blk.sync();
    // Each row's new maximum from `lanes` partial maxima, lane p over columns p, p + lanes, ...
    // (interleaved: neighbouring lanes read neighbouring words).
    blk.each(t * lanes, [=](int e) {
      const int i = e / lanes, lane = e % lanes;
      const int valid = diagonal ? detail::min_int(i + 1, nc) : nc;
      float mx = kNoMax;
      for (int j = lane; j < valid; j += lanes) mx = detail::max_float(mx, scale * S[i * lds + j]);
      part[e] = mx;
    });
    blk.sync();
    blk.each(t, [=](int i) {
      float mx = m[i];
      for (int lane = 0; lane < lanes; ++lane) mx = detail::max_float(mx, part[i * lanes + lane]);
      corr[i] = kmath::exp(m[i] - mx);
      m[i] = mx;
    });
    blk.sync();
    blk.each(t * lanes, [=](int e) {
      const int i = e / lanes, lane = e % lanes;
      const int valid = diagonal ? detail::min_int(i + 1, nc) : nc;
      float sum = 0.0f;
      for (int j = lane; j < t; j += lanes) {
        const float p = j < valid ? kmath::exp(scale * S[i * lds + j] - m[i]) : 0.0f;
        P[i * ldp + j] = bf16_bits(p);
        sum += p;
      }
      part[e] = sum;
    });
    blk.each(t * hs, [=](int e) { O[(e / hs) * ldo + e % hs] *= corr[e / hs]; });
    blk.sync();
    blk.each(t, [=](int i) {
      float sum = 0.0f;
      for (int lane = 0; lane < lanes; ++lane) sum += part[i * lanes + lane];
      l[i] = l[i] * corr[i] + sum;
    });
    blk.template gemm<false, false>(t, hs, t, P, ldp, V, ldh, O, ldo, true);
  }
  blk.sync();
  float* y = a.atty + int64_t(b) * T * C + int64_t(h) * hs;
  blk.each(nr * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    y[int64_t(r0 + i) * C + c] = O[i * ldo + c] / l[i];
  });
  float* lse = a.lse + int64_t(bh) * T + r0;
  blk.each(nr, [=](int i) { lse[i] = m[i] + kmath::log(l[i]); });
}

// One dK/dV block: key tile and (batch, head) from `index`, the key tiles with the most query
// tiles first.
template <class Blk>
KOKKOS_INLINE_FUNCTION void dkv_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                      int index) {
  using detail::at;
  const int t = a.tile, hs = a.C / a.H, BH = a.B * a.H, T = a.T, C = a.C;
  const int kt = index / BH, bh = index % BH, h = bh % a.H, b = bh / a.H;
  const int c0 = kt * t, nc = detail::min_int(t, T - c0);
  const float scale = 1.0f / kmath::sqrt(float(hs));
  const TcLayout L(TcKernel::dkv, t, hs);
  std::uint16_t* Q = at<std::uint16_t>(smem, L.q);
  std::uint16_t* K = at<std::uint16_t>(smem, L.k);
  std::uint16_t* V = at<std::uint16_t>(smem, L.v);
  std::uint16_t* dY = at<std::uint16_t>(smem, L.dy);
  std::uint16_t* P = at<std::uint16_t>(smem, L.p);
  std::uint16_t* dS = at<std::uint16_t>(smem, L.ds);
  float* dK = at<float>(smem, L.dk);
  float* dV = at<float>(smem, L.dv);
  float* S = at<float>(smem, L.s);
  float* dP = at<float>(smem, L.dp);
  float* part = at<float>(smem, L.part);
  float* lse = at<float>(smem, L.row_a);
  float* D = at<float>(smem, L.row_b);
  const int ldh = ld_bf16(hs), ldo = ld_f32(hs), lds = ld_f32(t), ldp = ld_bf16(t);
  const int lanes = kTcThreads / t;
  const int64_t ld = 3 * int64_t(C);
  const std::uint16_t* base = a.qkv + int64_t(b) * T * ld + int64_t(h) * hs;
  const int64_t head = int64_t(b) * T * C + int64_t(h) * hs;

  detail::load_rows(blk, K, base + C, ld, c0, nc, t, hs, a.vector_loads);
  detail::load_rows(blk, V, base + 2 * C, ld, c0, nc, t, hs, a.vector_loads);
  blk.each(t * hs, [=](int e) {
    dK[(e / hs) * ldo + e % hs] = 0.0f;
    dV[(e / hs) * ldo + e % hs] = 0.0f;
  });
  for (int qt = kt; qt < a.tiles(); ++qt) {
    const int r0 = qt * t, nr = detail::min_int(t, T - r0);
    blk.sync();  // the last tile's products have read Q, dY, P and dS
    detail::load_rows(blk, Q, base, ld, r0, nr, t, hs, a.vector_loads);
    detail::load_dy(blk, dY, part, a.datty + head, a.atty + head, C, r0, nr, t, hs);
    const float* row_lse = a.lse + int64_t(bh) * T + r0;
    blk.each(t, [=](int i) { lse[i] = i < nr ? row_lse[i] : 0.0f; });
    blk.sync();
    blk.each(t, [=](int i) {
      float sum = 0.0f;
      for (int lane = 0; lane < lanes; ++lane) sum += part[i * lanes + lane];
      D[i] = sum;
    });
    blk.template gemm<false, true>(t, t, hs, Q, ldh, K, ldh, S, lds, false);
    blk.template gemm<false, true>(t, t, hs, dY, ldh, V, ldh, dP, lds, false);
    blk.sync();
    detail::block_gradients(blk, P, dS, S, dP, lse, D, t, nr, nc, qt == kt, scale);
    blk.sync();
    blk.template gemm<true, false>(t, hs, t, P, ldp, dY, ldh, dV, ldo, true);
    blk.template gemm<true, false>(t, hs, t, dS, ldp, Q, ldh, dK, ldo, true);
  }
  blk.sync();
  float* dk = a.dqkv + int64_t(b) * T * ld + C + int64_t(h) * hs;
  float* dv = dk + C;
  blk.each(nc * hs, [=](int e) {
    const int j = e / hs, c = e % hs;
    dk[int64_t(c0 + j) * ld + c] = dK[j * ldo + c];
    dv[int64_t(c0 + j) * ld + c] = dV[j * ldo + c];
  });
}

// One dQ block: query tile and (batch, head) from `index`, the heaviest tiles first.
template <class Blk>
KOKKOS_INLINE_FUNCTION void dq_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                     int index) {
  using detail::at;
  const int t = a.tile, hs = a.C / a.H, BH = a.B * a.H, T = a.T, C = a.C;
  const int qt = a.tiles() - 1 - index / BH, bh = index % BH, h = bh % a.H, b = bh / a.H;
  const int r0 = qt * t, nr = detail::min_int(t, T - r0);
  const float scale = 1.0f / kmath::sqrt(float(hs));
  const TcLayout L(TcKernel::dq, t, hs);
  std::uint16_t* Q = at<std::uint16_t>(smem, L.q);
  std::uint16_t* K = at<std::uint16_t>(smem, L.k);
  std::uint16_t* V = at<std::uint16_t>(smem, L.v);
  std::uint16_t* dY = at<std::uint16_t>(smem, L.dy);
  std::uint16_t* dS = at<std::uint16_t>(smem, L.ds);
  float* dQ = at<float>(smem, L.dk);
  float* S = at<float>(smem, L.s);
  float* dP = at<float>(smem, L.dp);
  float* part = at<float>(smem, L.part);
  float* lse = at<float>(smem, L.row_a);
  float* D = at<float>(smem, L.row_b);
  const int ldh = ld_bf16(hs), ldo = ld_f32(hs), lds = ld_f32(t), ldp = ld_bf16(t);
  const int lanes = kTcThreads / t;
  const int64_t ld = 3 * int64_t(C);
  const std::uint16_t* base = a.qkv + int64_t(b) * T * ld + int64_t(h) * hs;
  const int64_t head = int64_t(b) * T * C + int64_t(h) * hs;

  detail::load_rows(blk, Q, base, ld, r0, nr, t, hs, a.vector_loads);
  detail::load_dy(blk, dY, part, a.datty + head, a.atty + head, C, r0, nr, t, hs);
  const float* row_lse = a.lse + int64_t(bh) * T + r0;
  blk.each(t, [=](int i) { lse[i] = i < nr ? row_lse[i] : 0.0f; });
  blk.each(t * hs, [=](int e) { dQ[(e / hs) * ldo + e % hs] = 0.0f; });
  blk.sync();
  blk.each(t, [=](int i) {
    float sum = 0.0f;
    for (int lane = 0; lane < lanes; ++lane) sum += part[i * lanes + lane];
    D[i] = sum;
  });
  for (int kt = 0; kt <= qt; ++kt) {
    const int c0 = kt * t, nc = detail::min_int(t, T - c0);
    blk.sync();  // the last tile's dS K has read K and dS
    detail::load_rows(blk, K, base + C, ld, c0, nc, t, hs, a.vector_loads);
    detail::load_rows(blk, V, base + 2 * C, ld, c0, nc, t, hs, a.vector_loads);
    blk.sync();
    blk.template gemm<false, true>(t, t, hs, Q, ldh, K, ldh, S, lds, false);
    blk.template gemm<false, true>(t, t, hs, dY, ldh, V, ldh, dP, lds, false);
    blk.sync();
    detail::block_gradients(blk, static_cast<std::uint16_t*>(nullptr), dS, S, dP, lse, D, t, nr,
                            nc, kt == qt, scale);
    blk.sync();
    blk.template gemm<false, false>(t, hs, t, dS, ldp, K, ldh, dQ, ldo, true);
  }
  blk.sync();
  float* dq = a.dqkv + int64_t(b) * T * ld + int64_t(h) * hs;
  blk.each(nr * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    dq[int64_t(r0 + i) * ld + c] = dQ[i * ldo + c];
  });
}

// The kernels run by HostBlock over host memory, one block after another: what the device
// computes, up to the order of the products' sums (tests).
inline void check_tile(const TcArgs& a) {
  if (!tc_tile_supported(a.tile) || !tc_head_supported(a.C / a.H) || a.C % a.H != 0) {
    throw std::invalid_argument("tensor-core attention: tile " + std::to_string(a.tile) +
                                " and head size " + std::to_string(a.C / a.H) +
                                " (tiles: 16, 32, 64; heads: multiples of 16 up to 256)");
  }
}
inline void emulate_forward(const TcArgs& a) {
  check_tile(a);
  std::vector<unsigned char> smem(TcLayout(TcKernel::forward, a.tile, a.C / a.H).bytes);
  for (int i = 0; i < a.blocks(); ++i) forward_block(HostBlock{}, a, smem.data(), i);
}
inline void emulate_backward(const TcArgs& a) {
  check_tile(a);
  std::vector<unsigned char> smem(TcLayout(TcKernel::dkv, a.tile, a.C / a.H).bytes);
  for (int i = 0; i < a.blocks(); ++i) dkv_block(HostBlock{}, a, smem.data(), i);
  for (int i = 0; i < a.blocks(); ++i) dq_block(HostBlock{}, a, smem.data(), i);
}

// The device kernels (CUDA builds; elsewhere they throw). `tile` 0 picks 64 when its shared
// memory fits the device, else 32. Ordered on Kokkos' stream; nothing waits.
bool device_available();
int device_tile(int hs);
void device_forward(float* lse, float* atty, const std::uint16_t* qkv, int B, int T, int C, int H,
                    int tile = 0);
void device_backward(float* dqkv, const float* datty, const float* atty,
                     const std::uint16_t* qkv, const float* lse, int B, int T, int C, int H,
                     int tile = 0);

}  // namespace colossal::core::tc
