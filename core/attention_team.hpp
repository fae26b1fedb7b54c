// Fused causal attention for the device, written in Kokkos teams (FlashAttention's algorithm,
// Dao et al. 2022, with FlashAttention-2's split of the backward pass). Same inputs, outputs and
// layouts as fused_attention_forward/backward in core/layers.hpp, so a model can call either:
// qkv (B,T,3C) with head h in columns [h*hs, (h+1)*hs) of each of the Q, K, V blocks, atty
// (B,T,C), lse (B,H,T) the log-sum-exp of each row's scaled scores, dqkv (B,T,3C) assigned.
//
// Forward: one team per (batch, head, query tile of `tile` rows). The query tile, each key and
// value tile in turn and the output accumulator live in team scratch memory; for each key tile at
// or before the diagonal the team computes the score block, folds it in by an online softmax
// (running row maximum and sum, the accumulator rescaled when the maximum grows) and adds P V.
// Only lse is saved: memory linear in T.
//
// Backward, two kernels, each result owned by one team (no atomics, deterministic):
// dK, dV: one team per (batch, head, key tile), walking the query tiles from the diagonal on;
// dQ: one team per (batch, head, query tile), walking the key tiles up to the diagonal.
// Both recompute P = exp(S - lse) and dS = scale P (dY V^T - D), D_i = dy_i . y_i; the scores are
// computed twice, the price of needing no atomics for dQ. Every element of dQ, dK, dV is a sum
// taken by one thread in a fixed order, so the result does not depend on the team size.
//
// Scratch (floats, hs = C/H, K and V rows padded to hs + 1 so that threads reading consecutive
// keys hit different banks): forward 4 tile hs + tile + tile^2 + 3 tile; dK/dV 4 tile hs +
// 2 tile + 2 tile^2 + 2 tile; dQ the same minus one tile^2. The tile is the largest of 64, 32,
// 16, 8 whose scratch fits the backend's level-0 (shared) memory, else 32 in level-1 scratch.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/kernels_team.hpp"

namespace colossal::core::team {

struct AttentionShape {
  int tile = 0;       // query/key positions per tile; 0: chosen by scratch size
  int team_size = 0;  // 0: Kokkos::AUTO
};

enum class AttentionKernel { forward, dkv, dq };

constexpr std::size_t attention_scratch_floats(AttentionKernel kernel, int tile, int hs) {
  const std::size_t t = std::size_t(tile), h = std::size_t(hs);
  switch (kernel) {
    case AttentionKernel::forward:  // Q, K(padded), V, O; S; m, l, correction
      return t * h + t * (h + 1) + t * h + t * h + t * t + 3 * t;
    case AttentionKernel::dkv:  // K, V (padded), Q, dY; P, dS; lse, D
      return 2 * t * (h + 1) + 2 * t * h + 2 * t * t + 2 * t;
    case AttentionKernel::dq:  // Q, dY, K, V (padded); dS; lse, D
      return 2 * t * h + 2 * t * (h + 1) + t * t + 2 * t;
  }
  return 0;
}

struct AttentionLaunch {
  int tile;
  int level;  // scratch level
  std::size_t bytes;
};

template <class ExecSpace>
AttentionLaunch attention_launch(AttentionKernel kernel, int hs, int tile_request) {
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  auto bytes = [&](int tile) {
    return ScratchFloats<ExecSpace>::shmem_size(attention_scratch_floats(kernel, tile, hs));
  };
  if (tile_request > 0) {
    const std::size_t b = bytes(tile_request);
    return {tile_request, b <= std::size_t(Policy::scratch_size_max(0)) ? 0 : 1, b};
  }
  for (int tile : {64, 32, 16, 8}) {
    const std::size_t b = bytes(tile);
    if (b <= std::size_t(Policy::scratch_size_max(0))) return {tile, 0, b};
  }
  const std::size_t b = bytes(32);
  if (b > std::size_t(Policy::scratch_size_max(1))) {
    throw std::invalid_argument("team attention: head size " + std::to_string(hs) +
                                " needs " + std::to_string(b) +
                                " bytes of team scratch for 32-position tiles, more than the "
                                "backend offers; use fewer channels per head");
  }
  return {32, 1, b};
}

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void attention_forward(float* lse,        // (B,H,T) out
                       float* atty,       // (B,T,C) out
                       const float* qkv,  // (B,T,3C)
                       int B, int T, int C, int H, AttentionShape shape = {}) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const AttentionLaunch launch = attention_launch<ExecSpace>(AttentionKernel::forward, hs,
                                                             shape.tile);
  const int tile = launch.tile, level = launch.level;
  const int tiles = (T + tile - 1) / tile;
  const std::size_t floats = attention_scratch_floats(AttentionKernel::forward, tile, hs);
  auto pol = policy<ExecSpace>(int64_t(B) * H * tiles, shape.team_size);
  pol.set_scratch_size(level, Kokkos::PerTeam(launch.bytes));
  const int64_t ld = 3 * int64_t(C);
  Kokkos::parallel_for(
      "colossal::core::team_attention_forward", pol,
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int qt = team.league_rank() % tiles;
        const int bh = team.league_rank() / tiles;
        const int h = bh % H, b = bh / H;
        const int r0 = qt * tile;
        const int nr = tile < T - r0 ? tile : T - r0;
        const int hp = hs + 1;
        ScratchFloats<ExecSpace> buf(team.team_scratch(level), floats);
        float* Q = buf.data();
        float* K = Q + tile * hs;
        float* V = K + tile * hp;
        float* O = V + tile * hs;
        float* S = O + tile * hs;
        float* m = S + tile * tile;
        float* l = m + tile;
        float* corr = l + tile;
        const float* base = qkv + int64_t(b) * T * ld + h * hs;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](int e) {
          const int i = e / hs, d = e % hs;
          Q[e] = base[(r0 + i) * ld + d];
          O[e] = 0.0f;
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int i) {
          m[i] = -3.0e38f;
          l[i] = 0.0f;
        });
        for (int c0 = 0; c0 < r0 + nr; c0 += tile) {
          const int nc = tile < T - c0 ? tile : T - c0;
          team.team_barrier();  // the previous block's K, V, S are no longer read
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](int e) {
            const int j = e / hs, d = e % hs;
            K[j * hp + d] = base[(c0 + j) * ld + C + d];
            V[e] = base[(c0 + j) * ld + 2 * C + d];
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * nc), [&](int e) {
            const int i = e / nc, j = e % nc;
            float s = 0.0f;
            for (int d = 0; d < hs; ++d) s += Q[i * hs + d] * K[j * hp + d];
            S[i * tile + j] = scale * s;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int i) {
            float* s = S + i * tile;
            const int reach = r0 + i - c0 + 1;  // keys c0 + j <= r0 + i are visible
            const int valid = reach < nc ? (reach > 0 ? reach : 0) : nc;
            float mx = m[i];
            for (int j = 0; j < valid; ++j) mx = s[j] > mx ? s[j] : mx;
            float sum = 0.0f;
            for (int j = 0; j < valid; ++j) {
              s[j] = kernels::fast_exp(s[j] - mx);
              sum += s[j];
            }
            for (int j = valid; j < nc; ++j) s[j] = 0.0f;
            const float c = kernels::fast_exp(m[i] - mx);
            corr[i] = c;
            l[i] = l[i] * c + sum;
            m[i] = mx;
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](int e) {
            const int i = e / hs, d = e % hs;
            float acc = O[e] * corr[i];
            for (int j = 0; j < nc; ++j) acc += S[i * tile + j] * V[j * hs + d];
            O[e] = acc;
          });
        }
        team.team_barrier();
        float* y = atty + int64_t(b) * T * C + h * hs;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](int e) {
          const int i = e / hs, d = e % hs;
          y[int64_t(r0 + i) * C + d] = O[e] * (1.0f / l[i]);
        });
        float* row_lse = lse + (int64_t(b) * H + h) * T + r0;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr),
                             [&](int i) { row_lse[i] = m[i] + kmath::log(l[i]); });
      });
}

namespace detail {

// Loads rows [r0, r0 + nr) of a query tile: Q (nr x hs), dY (nr x hs), lse and D = dY . Y.
template <class Member>
KOKKOS_INLINE_FUNCTION void load_query_tile(const Member& team, float* Q, float* dY, float* L,
                                            float* D, const float* q, const float* dy,
                                            const float* y, const float* lse, int r0, int nr,
                                            int hs, int64_t ld, int C) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](int e) {
    const int i = e / hs, d = e % hs;
    Q[e] = q[(r0 + i) * ld + d];
    dY[e] = dy[int64_t(r0 + i) * C + d];
  });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](int i) {
    L[i] = lse[r0 + i];
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += dy[int64_t(r0 + i) * C + d] * y[int64_t(r0 + i) * C + d];
    D[i] = s;
  });
}

// K and V rows [c0, c0 + nc), padded to hs + 1.
template <class Member>
KOKKOS_INLINE_FUNCTION void load_key_tile(const Member& team, float* K, float* V,
                                          const float* k, const float* v, int c0, int nc, int hs,
                                          int64_t ld) {
  const int hp = hs + 1;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](int e) {
    const int j = e / hs, d = e % hs;
    K[j * hp + d] = k[(c0 + j) * ld + d];
    V[j * hp + d] = v[(c0 + j) * ld + d];
  });
}

// P and dS of the block (rows r0.., keys c0..): p = exp(scale q.k - lse) where visible, else 0;
// ds = scale p (dy.v - D). P may be null (the dQ kernel needs only dS).
template <class Member>
KOKKOS_INLINE_FUNCTION void block_gradients(const Member& team, float* P, float* dS,
                                            const float* Q, const float* dY, const float* K,
                                            const float* V, const float* L, const float* D,
                                            int r0, int nr, int c0, int nc, int hs, int tile,
                                            float scale) {
  const int hp = hs + 1;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * nc), [&](int e) {
    const int i = e / nc, j = e % nc;
    float p = 0.0f, ds = 0.0f;
    if (c0 + j <= r0 + i) {
      float s = 0.0f, dp = 0.0f;
      for (int d = 0; d < hs; ++d) {
        s += Q[i * hs + d] * K[j * hp + d];
        dp += dY[i * hs + d] * V[j * hp + d];
      }
      p = kernels::fast_exp(scale * s - L[i]);
      ds = scale * p * (dp - D[i]);
    }
    if (P != nullptr) P[i * tile + j] = p;
    dS[i * tile + j] = ds;
  });
}

}  // namespace detail

// dqkv (B,T,3C) assigned.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void attention_backward(float* dqkv,         // (B,T,3C) out
                        const float* datty,  // (B,T,C)
                        const float* atty,   // (B,T,C)
                        const float* qkv,    // (B,T,3C)
                        const float* lse,    // (B,H,T)
                        int B, int T, int C, int H, AttentionShape shape = {}) {
  const int hs = C / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t ld = 3 * int64_t(C);
  {
    const AttentionLaunch launch =
        attention_launch<ExecSpace>(AttentionKernel::dkv, hs, shape.tile);
    const int tile = launch.tile, level = launch.level;
    const int tiles = (T + tile - 1) / tile;
    const std::size_t floats = attention_scratch_floats(AttentionKernel::dkv, tile, hs);
    auto pol = policy<ExecSpace>(int64_t(B) * H * tiles, shape.team_size);
    pol.set_scratch_size(level, Kokkos::PerTeam(launch.bytes));
    Kokkos::parallel_for(
        "colossal::core::team_attention_backward_dkv", pol,
        KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
          const int kt = team.league_rank() % tiles;
          const int bh = team.league_rank() / tiles;
          const int h = bh % H, b = bh / H;
          const int c0 = kt * tile;
          const int nc = tile < T - c0 ? tile : T - c0;
          const int hp = hs + 1;
          ScratchFloats<ExecSpace> buf(team.team_scratch(level), floats);
          float* K = buf.data();
          float* V = K + tile * hp;
          float* Q = V + tile * hp;
          float* dY = Q + tile * hs;
          float* P = dY + tile * hs;
          float* dS = P + tile * tile;
          float* L = dS + tile * tile;
          float* D = L + tile;
          const float* q = qkv + int64_t(b) * T * ld + h * hs;
          const float* y = atty + int64_t(b) * T * C + h * hs;
          const float* dy = datty + int64_t(b) * T * C + h * hs;
          const float* row_lse = lse + (int64_t(b) * H + h) * T;
          float* dk = dqkv + int64_t(b) * T * ld + C + h * hs;
          float* dv = dk + C;
          detail::load_key_tile(team, K, V, q + C, q + 2 * C, c0, nc, hs, ld);
          for (int r0 = c0; r0 < T; r0 += tile) {
            const int nr = tile < T - r0 ? tile : T - r0;
            team.team_barrier();  // the previous query tile is no longer read
            detail::load_query_tile(team, Q, dY, L, D, q, dy, y, row_lse, r0, nr, hs, ld, C);
            team.team_barrier();
            detail::block_gradients(team, P, dS, Q, dY, K, V, L, D, r0, nr, c0, nc, hs, tile,
                                    scale);
            team.team_barrier();
            const bool first = r0 == c0;
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](int e) {
              const int j = e / hs, d = e % hs;
              float sv = 0.0f, sk = 0.0f;
              for (int i = 0; i < nr; ++i) {
                sv += P[i * tile + j] * dY[i * hs + d];
                sk += dS[i * tile + j] * Q[i * hs + d];
              }
              const int64_t at = (c0 + j) * ld + d;
              dv[at] = first ? sv : dv[at] + sv;
              dk[at] = first ? sk : dk[at] + sk;
            });
          }
        });
  }
  {
    const AttentionLaunch launch =
        attention_launch<ExecSpace>(AttentionKernel::dq, hs, shape.tile);
    const int tile = launch.tile, level = launch.level;
    const int tiles = (T + tile - 1) / tile;
    const std::size_t floats = attention_scratch_floats(AttentionKernel::dq, tile, hs);
    auto pol = policy<ExecSpace>(int64_t(B) * H * tiles, shape.team_size);
    pol.set_scratch_size(level, Kokkos::PerTeam(launch.bytes));
    Kokkos::parallel_for(
        "colossal::core::team_attention_backward_dq", pol,
        KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
          const int qt = team.league_rank() % tiles;
          const int bh = team.league_rank() / tiles;
          const int h = bh % H, b = bh / H;
          const int r0 = qt * tile;
          const int nr = tile < T - r0 ? tile : T - r0;
          const int hp = hs + 1;
          ScratchFloats<ExecSpace> buf(team.team_scratch(level), floats);
          float* Q = buf.data();
          float* dY = Q + tile * hs;
          float* K = dY + tile * hs;
          float* V = K + tile * hp;
          float* dS = V + tile * hp;
          float* L = dS + tile * tile;
          float* D = L + tile;
          const float* q = qkv + int64_t(b) * T * ld + h * hs;
          const float* y = atty + int64_t(b) * T * C + h * hs;
          const float* dy = datty + int64_t(b) * T * C + h * hs;
          const float* row_lse = lse + (int64_t(b) * H + h) * T;
          float* dq = dqkv + int64_t(b) * T * ld + h * hs;
          detail::load_query_tile(team, Q, dY, L, D, q, dy, y, row_lse, r0, nr, hs, ld, C);
          for (int c0 = 0; c0 < r0 + nr; c0 += tile) {
            const int nc = tile < T - c0 ? tile : T - c0;
            team.team_barrier();  // the previous key tile and dS are no longer read
            detail::load_key_tile(team, K, V, q + C, q + 2 * C, c0, nc, hs, ld);
            team.team_barrier();
            detail::block_gradients(team, static_cast<float*>(nullptr), dS, Q, dY, K, V, L, D,
                                    r0, nr, c0, nc, hs, tile, scale);
            team.team_barrier();
            const bool first = c0 == 0;
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](int e) {
              const int i = e / hs, d = e % hs;
              float s = 0.0f;
              for (int j = 0; j < nc; ++j) s += dS[i * tile + j] * K[j * hp + d];
              const int64_t at = (r0 + i) * ld + d;
              dq[at] = first ? s : dq[at] + s;
            });
          }
        });
  }
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void attention_forward<Kokkos::Cuda>(float* lse, float* atty,
                                                              const float* qkv, int B, int T, int C,
                                                              int H, AttentionShape shape);
COLOSSAL_DEVICE_INSTANCE void attention_backward<Kokkos::Cuda>(float* dqkv, const float* datty,
                                                               const float* atty, const float* qkv,
                                                               const float* lse, int B, int T,
                                                               int C, int H, AttentionShape shape);
#endif

}  // namespace colossal::core::team
