// The two kernels of incremental decoding (core::Model::decode, colossal_generate): keys and
// values of new positions appended to a block's cache, and causal attention of new query rows
// over every cached position. In the conventions of core/kernels.hpp: one source for host and
// device, labelled Kokkos loops over raw arrays.
//
// The cache of one block holds `kvw` = (key/value heads on this rank) x hs floats per position,
// keys and values in two arrays of (window, kvw). Query head h reads key/value head
// h / (H / KV) (grouped-query attention; KV = H for GPT-2 and OPT).
#pragma once

#include <cstdint>

#include "core/kernels.hpp"

namespace colossal::core::kernels {

// cache_k[p0 + r, :] = src[r, k_col : k_col + kvw], cache_v likewise from v_col, for r < n.
template <class ExecSpace = Exec>
void kv_append(float* cache_k, float* cache_v,  // (window, kvw)
               const float* src,                // (n, ld)
               int64_t n, int ld, int k_col, int v_col, int kvw, int p0) {
  for_each<ExecSpace>(
      "colossal::core::kv_append", n, kRowGrain, KOKKOS_LAMBDA(int64_t r) {
        const float* s = src + r * ld;
        float* k = cache_k + (p0 + r) * kvw;
        float* v = cache_v + (p0 + r) * kvw;
        for (int c = 0; c < kvw; ++c) {
          k[c] = s[k_col + c];
          v[c] = s[v_col + c];
        }
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
