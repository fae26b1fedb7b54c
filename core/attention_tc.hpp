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

inline bool tc_vector_loads(const std::uint16_t* qkv, int C) {
  return reinterpret_cast<std::uintptr_t>(qkv) % 16 == 0 && (3 * C) % 8 == 0;
}

// The head size and tile a launch may take (std::invalid_argument otherwise).
inline void check_tile(const TcArgs& a) {
  if (!tc_tile_supported(a.tile) || !tc_head_supported(a.C / a.H) || a.C % a.H != 0) {
    throw std::invalid_argument("tensor-core attention: tile " + std::to_string(a.tile) +
                                " and head size " + std::to_string(a.C / a.H) +
                                " (tiles: 16, 32, 64; heads: multiples of 16 up to 256)");
  }
}

// The host's stand-in for a CUDA block: a phase's elements one after another, products as
// loops in fp32 over the exact values of the bf16 operands. (Marked for the device too only so
// that a CUDA build's host code may instantiate the kernels' bodies with it.) A phase's lambdas
// capture by value (pointers and indices), so a test may also run them after the function that
// queued them has returned, in any order the device could (tests/test_attention_tc.cpp's
// schedule check).
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

// What a block derives from its index: its tile (`tile`: first position `first`, `n` of them
// real), its (batch, head), its scale, the strides of the shared arrays and where its head starts
// in q/k/v (`base`, rows `ld` apart) and in atty/datty (`head`, rows C apart). Query tiles run
// heaviest (last) first, key tiles (dK/dV) the one with the most query tiles first.
struct Frame {
  int t, hs, T, C, tile, first, n, bh, h, b, ldh, ldo, lds, ldp, lanes;
  float scale;
  int64_t ld, head;
  const std::uint16_t* base;
  KOKKOS_INLINE_FUNCTION Frame(const TcArgs& a, int index, bool heaviest_last) {
    t = a.tile;
    hs = a.C / a.H;
    T = a.T;
    C = a.C;
    const int BH = a.B * a.H;
    tile = heaviest_last ? a.tiles() - 1 - index / BH : index / BH;
    bh = index % BH;
    h = bh % a.H;
    b = bh / a.H;
    first = tile * t;
    n = positions(tile);
    scale = 1.0f / kmath::sqrt(float(hs));
    ldh = ld_bf16(hs);
    ldo = ld_f32(hs);
    lds = ld_f32(t);
    ldp = ld_bf16(t);
    lanes = kTcThreads / t;
    ld = 3 * int64_t(C);
    base = a.qkv + int64_t(b) * T * ld + int64_t(h) * hs;
    head = int64_t(b) * T * C + int64_t(h) * hs;
  }
  // The real positions of tile k (the last may be short).
  KOKKOS_INLINE_FUNCTION int positions(int k) const { return min_int(t, T - k * t); }
};

// One kernel's shared arrays (TcLayout's regions; dQ's accumulator is dK's region).
struct Shared {
  std::uint16_t *Q, *K, *V, *dY, *P, *dS;
  float *O, *dK, *dV, *S, *dP, *part, *row_a, *row_b, *row_c;
  KOKKOS_INLINE_FUNCTION Shared(TcKernel kernel, const Frame& f, unsigned char* smem) {
    const TcLayout L(kernel, f.t, f.hs);
    Q = at<std::uint16_t>(smem, L.q);
    K = at<std::uint16_t>(smem, L.k);
    V = at<std::uint16_t>(smem, L.v);
    dY = at<std::uint16_t>(smem, L.dy);
    P = at<std::uint16_t>(smem, L.p);
    dS = at<std::uint16_t>(smem, L.ds);
    O = at<float>(smem, L.o);
    dK = at<float>(smem, L.dk);
    dV = at<float>(smem, L.dv);
    S = at<float>(smem, L.s);
    dP = at<float>(smem, L.dp);
    part = at<float>(smem, L.part);
    row_a = at<float>(smem, L.row_a);
    row_b = at<float>(smem, L.row_b);
    row_c = at<float>(smem, L.row_c);
  }
};

// Backward's per-row inputs of the query tile starting at `first` (n real rows): dY in bf16, the
// saved lse, and D_i = dy_i . y_i, whose lane-partial sums the caller reduces (reduce_d) after
// the next barrier.
template <class Blk>
KOKKOS_INLINE_FUNCTION void load_query_rows(const Blk& blk, const TcArgs& a, const Frame& f,
                                            const Shared& s, int first, int n) {
  load_dy(blk, s.dY, s.part, a.datty + f.head, a.atty + f.head, f.C, first, n, f.t, f.hs);
  const float* saved = a.lse + int64_t(f.bh) * f.T + first;
  float* lse = s.row_a;
  blk.each(f.t, [=](int i) { lse[i] = i < n ? saved[i] : 0.0f; });
}
template <class Blk>
KOKKOS_INLINE_FUNCTION void reduce_d(const Blk& blk, const Frame& f, const Shared& s) {
  const float* part = s.part;
  float* D = s.row_b;
  const int lanes = f.lanes;
  blk.each(f.t, [=](int i) {
    float sum = 0.0f;
    for (int lane = 0; lane < lanes; ++lane) sum += part[i * lanes + lane];
    D[i] = sum;
  });
}

// Key tile `k` (n_k real keys) into K and V.
template <class Blk>
KOKKOS_INLINE_FUNCTION void load_keys(const Blk& blk, const TcArgs& a, const Frame& f,
                                      const Shared& s, int k) {
  const int n_k = f.positions(k);
  load_rows(blk, s.K, f.base + f.C, f.ld, k * f.t, n_k, f.t, f.hs, a.vector_loads);
  load_rows(blk, s.V, f.base + 2 * f.C, f.ld, k * f.t, n_k, f.t, f.hs, a.vector_loads);
}

// S = Q K^T and dP = dY V^T, then P and dS of the block (query tile q, key tile k).
template <class Blk>
KOKKOS_INLINE_FUNCTION void block_scores_and_gradients(const Blk& blk, const Frame& f,
                                                       const Shared& s, std::uint16_t* P, int q,
                                                       int k) {
  blk.template gemm<false, true>(f.t, f.t, f.hs, s.Q, f.ldh, s.K, f.ldh, s.S, f.lds, false);
  blk.template gemm<false, true>(f.t, f.t, f.hs, s.dY, f.ldh, s.V, f.ldh, s.dP, f.lds, false);
  blk.sync();
  block_gradients(blk, P, s.dS, s.S, s.dP, s.row_a, s.row_b, f.t, f.positions(q),
                  f.positions(k), q == k, f.scale);
}

// Rows [first, first + n) of a fp32 tile (stride ldo) into columns `col` of dqkv's rows.
template <class Blk>
KOKKOS_INLINE_FUNCTION void store_rows(const Blk& blk, const TcArgs& a, const Frame& f,
                                       const float* tile, int col, int first, int n) {
  float* out = a.dqkv + int64_t(f.b) * f.T * f.ld + col + int64_t(f.h) * f.hs;
  const int hs = f.hs, ldo = f.ldo;
  const int64_t ld = f.ld;
  blk.each(n * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    out[int64_t(first + i) * ld + c] = tile[i * ldo + c];
  });
}

}  // namespace detail

// One forward block (query tile `f.tile`).
template <class Blk>
KOKKOS_INLINE_FUNCTION void forward_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                          int index) {
  const detail::Frame f(a, index, true);
  const detail::Shared s(TcKernel::forward, f, smem);
  const int t = f.t, hs = f.hs, qt = f.tile, lanes = f.lanes, lds = f.lds, ldp = f.ldp,
            ldo = f.ldo;
  const float scale = f.scale;
  float* O = s.O;
  const float* S = s.S;
  std::uint16_t* P = s.P;
  float *part = s.part, *m = s.row_a, *l = s.row_b, *corr = s.row_c;

  detail::load_rows(blk, s.Q, f.base, f.ld, f.first, f.n, t, hs, a.vector_loads);
  blk.each(t * hs, [=](int e) { O[(e / hs) * ldo + e % hs] = 0.0f; });
  blk.each(t, [=](int i) {
    m[i] = kNoMax;
    l[i] = 0.0f;
  });
  for (int kt = 0; kt <= qt; ++kt) {
    const int nc = f.positions(kt);
    const bool diagonal = kt == qt;
    blk.sync();  // the last tile's P V has read K, V and P
    detail::load_keys(blk, a, f, s, kt);
    blk.sync();
    blk.template gemm<false, true>(t, t, hs, s.Q, f.ldh, s.K, f.ldh, s.S, lds, false);
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
    blk.template gemm<false, false>(t, hs, t, P, ldp, s.V, f.ldh, O, ldo, true);
  }
  blk.sync();
  float* y = a.atty + f.head + int64_t(f.first) * f.C;
  const int C = f.C;
  blk.each(f.n * hs, [=](int e) {
    const int i = e / hs, c = e % hs;
    y[int64_t(i) * C + c] = O[i * ldo + c] / l[i];
  });
  float* lse = a.lse + int64_t(f.bh) * f.T + f.first;
  blk.each(f.n, [=](int i) { lse[i] = m[i] + kmath::log(l[i]); });
}

// One dK/dV block (key tile `f.tile`), walking the query tiles from the diagonal on.
template <class Blk>
KOKKOS_INLINE_FUNCTION void dkv_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                      int index) {
  const detail::Frame f(a, index, false);
  const detail::Shared s(TcKernel::dkv, f, smem);
  const int t = f.t, hs = f.hs, kt = f.tile, ldo = f.ldo;
  float *dK = s.dK, *dV = s.dV;

  detail::load_keys(blk, a, f, s, kt);
  blk.each(t * hs, [=](int e) {
    dK[(e / hs) * ldo + e % hs] = 0.0f;
    dV[(e / hs) * ldo + e % hs] = 0.0f;
  });
  for (int qt = kt; qt < a.tiles(); ++qt) {
    const int r0 = qt * t, nr = f.positions(qt);
    blk.sync();  // the last tile's products have read Q, dY, P and dS
    detail::load_rows(blk, s.Q, f.base, f.ld, r0, nr, t, hs, a.vector_loads);
    detail::load_query_rows(blk, a, f, s, r0, nr);
    blk.sync();
    detail::reduce_d(blk, f, s);
    detail::block_scores_and_gradients(blk, f, s, s.P, qt, kt);
    blk.sync();
    blk.template gemm<true, false>(t, hs, t, s.P, f.ldp, s.dY, f.ldh, dV, ldo, true);
    blk.template gemm<true, false>(t, hs, t, s.dS, f.ldp, s.Q, f.ldh, dK, ldo, true);
  }
  blk.sync();
  detail::store_rows(blk, a, f, dK, f.C, f.first, f.n);
  detail::store_rows(blk, a, f, dV, 2 * f.C, f.first, f.n);
}

// One dQ block (query tile `f.tile`), walking the key tiles up to the diagonal.
template <class Blk>
KOKKOS_INLINE_FUNCTION void dq_block(const Blk& blk, const TcArgs& a, unsigned char* smem,
                                     int index) {
  const detail::Frame f(a, index, true);
  const detail::Shared s(TcKernel::dq, f, smem);
  const int t = f.t, hs = f.hs, qt = f.tile, ldo = f.ldo;
  float* dQ = s.dK;

  detail::load_rows(blk, s.Q, f.base, f.ld, f.first, f.n, t, hs, a.vector_loads);
  detail::load_query_rows(blk, a, f, s, f.first, f.n);
  blk.each(t * hs, [=](int e) { dQ[(e / hs) * ldo + e % hs] = 0.0f; });
  blk.sync();
  detail::reduce_d(blk, f, s);
  for (int kt = 0; kt <= qt; ++kt) {
    blk.sync();  // the last tile's dS K has read K and dS
    detail::load_keys(blk, a, f, s, kt);
    blk.sync();
    detail::block_scores_and_gradients(blk, f, s, nullptr, qt, kt);
    blk.sync();
    blk.template gemm<false, false>(t, hs, t, s.dS, f.ldp, s.K, f.ldh, dQ, ldo, true);
  }
  blk.sync();
  detail::store_rows(blk, a, f, dQ, 0, f.first, f.n);
}

// The kernels run by HostBlock over host memory, one block after another: what the device
// computes, up to the order of the products' sums (tests).
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
