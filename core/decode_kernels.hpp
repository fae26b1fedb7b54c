// The two kernels of incremental decoding (core::Model::decode, colossal_generate): keys and
// values of new positions appended to a block's cache, and causal attention of new query rows
// over every cached position. In the conventions of core/kernels.hpp: one source for host and
// device, labelled Kokkos loops over raw arrays; the attention's device (team) form is
// team::cached_attention.
//
// The cache of one block holds `kvw` = (key/value heads on this rank) x hs floats per position,
// keys and values in two arrays of (window, kvw). Query head h reads key/value head
// h / (H / KV) (grouped-query attention; KV = H for GPT-2 and OPT).
#pragma once

#include <cstdint>

#include "core/kernels.hpp"
#include "core/kernels_team.hpp"

namespace colossal::core::team {

// cached_attention's device form: one team per (row, head). Its threads score a tile of
// kDecodeKeyTile cached keys at a time into team scratch (one key each), reduce the tile's
// maximum and sum, and accumulate the output over the tile (one column each), the running
// maximum and sum carried between tiles as in the host form. Scratch: a tile's scores and the
// head's output row.
constexpr int kDecodeKeyTile = 256;

template <class ExecSpace>
void cached_attention(float* out, const float* q, int ldq, const float* cache_k,
                      const float* cache_v, int64_t n, int p0, int H, int KV, int hs,
                      int team_size = 0) {
  const float scale = 1.0f / kmath::sqrt(static_cast<float>(hs));
  const int group = H / KV, kvw = KV * hs;
  auto pol = policy<ExecSpace>(n * H, team_size);
  pol.set_scratch_size(
      0, Kokkos::PerTeam(ScratchFloats<ExecSpace>::shmem_size(kDecodeKeyTile + hs)));
  Kokkos::parallel_for(
      "colossal::core::team_cached_attention", pol,
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t r = team.league_rank() / H;
        const int h = int(team.league_rank() % H);
        const float* qh = q + r * ldq + h * hs;
        const int64_t kv = h / group;
        ScratchFloats<ExecSpace> s(team.team_scratch(0), kDecodeKeyTile);
        ScratchFloats<ExecSpace> o(team.team_scratch(0), hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hs), [&](int d) { o(d) = 0.0f; });
        float mx = -3.0e38f, sum = 0.0f;
        const int64_t keys = p0 + r + 1;
        for (int64_t j0 = 0; j0 < keys; j0 += kDecodeKeyTile) {
          const int J = int(keys - j0 < kDecodeKeyTile ? keys - j0 : kDecodeKeyTile);
          team.team_barrier();  // the last tile's scores are read by every thread
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, J), [&](int j) {
            const float* kj = cache_k + (j0 + j) * kvw + kv * hs;
            float acc = 0.0f;
            for (int d = 0; d < hs; ++d) acc += qh[d] * kj[d];
            s(j) = acc * scale;
          });
          team.team_barrier();
          float tile_max = -3.0e38f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, J),
              [&](int j, float& m) { m = s(j) > m ? s(j) : m; }, Kokkos::Max<float>(tile_max));
          const float m_new = tile_max > mx ? tile_max : mx;
          const float correction = kernels::fast_exp(mx - m_new);
          team.team_barrier();  // every thread has read the scores it rescales next
          float tile_sum = 0.0f;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, J),
              [&](int j, float& acc) {
                const float e = kernels::fast_exp(s(j) - m_new);
                s(j) = e;
                acc += e;
              },
              tile_sum);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hs), [&](int d) {
            const float* v = cache_v + j0 * kvw + kv * hs + d;
            float acc = 0.0f;
            for (int j = 0; j < J; ++j) acc += s(j) * v[int64_t(j) * kvw];
            o(d) = o(d) * correction + acc;
          });
          sum = sum * correction + tile_sum;
          mx = m_new;
        }
        team.team_barrier();
        const float inv = 1.0f / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hs),
                             [&](int d) { out[r * int64_t(H) * hs + h * hs + d] = o(d) * inv; });
      });
}

#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void cached_attention<Kokkos::Cuda>(float* out, const float* q, int ldq,
                                                             const float* cache_k,
                                                             const float* cache_v, int64_t n,
                                                             int p0, int H, int KV, int hs,
                                                             int team_size);
#endif

}  // namespace colossal::core::team

namespace colossal::core::kernels {

// cache_k[p0 + r, :] = src[r, k_col : k_col + kvw], cache_v likewise from v_col, for r < n:
// one element of each per index (a decoded row is one row: its width is the parallelism).
template <class ExecSpace = Exec>
void kv_append(float* cache_k, float* cache_v,  // (window, kvw)
               const float* src,                // (n, ld)
               int64_t n, int ld, int k_col, int v_col, int kvw, int p0) {
  for_each<ExecSpace>(
      "colossal::core::kv_append", n * kvw, kElementGrain, KOKKOS_LAMBDA(int64_t i) {
        const int64_t r = i / kvw;
        const int c = int(i % kvw);
        cache_k[(p0 + r) * kvw + c] = src[r * ld + k_col + c];
        cache_v[(p0 + r) * kvw + c] = src[r * ld + v_col + c];
      });
}

// out[r, h*hs : (h+1)*hs] = softmax_j(q_r,h . k_j,g / sqrt(hs)) v_j,g over the cached positions
// j <= p0 + r (causal: row r is position p0 + r), g = h / (H / KV). One pass per (row, head)
// with the running maximum and sum (online softmax), so no score row is stored.
template <class ExecSpace = Exec>
void cached_attention(float* out,            // (n, H*hs)
                      const float* q, int ldq,  // (n, ldq), heads side by side from column 0
                      const float* cache_k, const float* cache_v,  // (window, KV*hs)
                      int64_t n, int p0, int H, int KV, int hs) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (above)
    team::cached_attention<ExecSpace>(out, q, ldq, cache_k, cache_v, n, p0, H, KV, hs);
    return;
  }
  const float scale = 1.0f / kmath::sqrt(static_cast<float>(hs));
  const int group = H / KV, kvw = KV * hs;
  for_each<ExecSpace>(
      "colossal::core::cached_attention", n * H, kChunkGrain, KOKKOS_LAMBDA(int64_t item) {
        const int64_t r = item / H;
        const int h = int(item % H);
        const float* qh = q + r * ldq + h * hs;
        const int kv = h / group;
        float* o = out + r * int64_t(H) * hs + h * hs;
        for (int d = 0; d < hs; ++d) o[d] = 0.0f;
        float mx = -3.0e38f, sum = 0.0f;
        const int64_t keys = p0 + r + 1;
        for (int64_t j = 0; j < keys; ++j) {
          const float* kj = cache_k + j * kvw + kv * hs;
          float s = 0.0f;
          for (int d = 0; d < hs; ++d) s += qh[d] * kj[d];
          s *= scale;
          const float* vj = cache_v + j * kvw + kv * hs;
          if (s > mx) {  // rescale what is summed so far to the new maximum
            const float c = fast_exp(mx - s);
            sum *= c;
            for (int d = 0; d < hs; ++d) o[d] *= c;
            mx = s;
          }
          const float e = fast_exp(s - mx);
          sum += e;
          for (int d = 0; d < hs; ++d) o[d] += e * vj[d];
        }
        const float inv = 1.0f / sum;
        for (int d = 0; d < hs; ++d) o[d] *= inv;
      });
}

#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void kv_append<Kokkos::Cuda>(float* cache_k, float* cache_v,
                                                      const float* src, int64_t n, int ld,
                                                      int k_col, int v_col, int kvw, int p0);
COLOSSAL_DEVICE_INSTANCE void cached_attention<Kokkos::Cuda>(float* out, const float* q, int ldq,
                                                             const float* cache_k,
                                                             const float* cache_v, int64_t n,
                                                             int p0, int H, int KV, int hs);
#endif

}  // namespace colossal::core::kernels
