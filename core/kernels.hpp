// Element-wise and reduction kernels of the transformer, one source for host and device: each is a
// labelled Kokkos parallel_for/parallel_reduce over raw arrays in the execution space's memory.
//
// Conventions (llm.c style):
// - Shapes are in the comment of every argument; B = batch, T = time, C = channels, N = rows.
// - Parameter gradients ACCUMULATE (+=), so micro-batch accumulation is free.
// - Activation gradients ASSIGN, except layernorm_backward's dinp, which accumulates because it
//   feeds the residual stream.
// - Reductions over rows into one vector (bias and layernorm parameter gradients, position
//   embeddings) are done per column with a fixed row order, so results are deterministic and do
//   not depend on the backend's scheduling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/bf16.hpp"
#include "core/fast_math.hpp"
#include "core/host_threads.hpp"
#include "core/kernels_team.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::core::detail {
// n floats rounded to bf16 patterns on the CUDA device, in Kokkos' stream order (defined with
// cuBLAS's bf16 operands in core/gemm_cublas.cpp; throws in a build without device kernels).
void to_bf16_on_device(const float* in, std::uint16_t* out, std::size_t n);
}  // namespace colossal::core::detail

namespace colossal::core::kernels {

using Exec = Kokkos::DefaultExecutionSpace;
constexpr int kColumnChunk = 32;  // columns per work item in column reductions

// How a kernel's range splits over host threads: the items per thread below which it runs on one
// thread, and what part bounds are multiples of (single floats: 16, so no two threads write the
// same cache line; rows and column chunks: 1).
struct Grain {
  int64_t items;
  std::size_t align;
};
constexpr Grain kRowGrain{16, 1}, kChunkGrain{1, 1}, kElementGrain{16384, 16};

// f(i) for every i in [0, n): a labelled Kokkos parallel_for. On the Serial backend (Debian's
// Kokkos 3.4, one thread) the range is cut into contiguous parts run on the host threads
// (core/host_threads.hpp) instead; each index still runs once and alone, so results are bitwise
// the same for any thread count. Every kernel here writes disjoint outputs per index, as a
// threaded or GPU backend needs anyway.
template <class ExecSpace = Exec, class F>
void for_each(const char* label, int64_t n, Grain grain, const F& f) {
#ifdef KOKKOS_ENABLE_SERIAL
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Serial>) {
    HostThreads& pool = HostThreads::shared();
    if (pool.size() > 1 && n >= 2 * grain.items) {
      pool.run(
          std::size_t(n),
          [&](std::size_t, std::size_t begin, std::size_t end) {
            for (std::size_t i = begin; i < end; ++i) f(int64_t(i));
          },
          std::size_t(grain.items), grain.align);
      return;
    }
  }
#endif
  Kokkos::parallel_for(label, Kokkos::RangePolicy<ExecSpace>(0, n), f);
}

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t + pos_offset,:]
// Vocabulary-parallel form: wte holds rows [v0, v0 + rows) only; other tokens contribute zero, and
// wpe may be null (added on one rank of the tensor group before the sum over it).
template <class ExecSpace = Exec>
void embedding_forward(float* out,            // (B,T,C)
                       const int32_t* tokens, // (B,T)
                       const float* wte,      // (rows,C)
                       const float* wpe,      // (P,C) or null
                       int B, int T, int C, int pos_offset, int64_t v0 = 0,
                       int64_t rows = INT64_MAX) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::embedding_forward<ExecSpace>(out, tokens, wte, wpe, B, T, C, pos_offset, v0, rows);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::embedding_forward", int64_t(B) * T, kRowGrain,
      KOKKOS_LAMBDA(int64_t bt) {
        const int t = static_cast<int>(bt % T);
        const int64_t row = int64_t(tokens[bt]) - v0;
        float* o = out + bt * C;
        if (row >= 0 && row < rows) {
          const float* e = wte + row * C;
          if (wpe != nullptr) {
            const float* p = wpe + int64_t(t + pos_offset) * C;
            for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
          } else {
            for (int c = 0; c < C; ++c) o[c] = e[c];
          }
        } else if (wpe != nullptr) {
          const float* p = wpe + int64_t(t + pos_offset) * C;
          for (int c = 0; c < C; ++c) o[c] = p[c];
        } else {
          for (int c = 0; c < C; ++c) o[c] = 0.0f;
        }
      });
}

// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t + pos_offset,:] += sum_b dout[b,t,:]
// Vocabulary-parallel form: dwte holds rows [v0, v0 + rows) only.
template <class ExecSpace = Exec>
void embedding_backward(float* dwte,           // (rows,C)
                        float* dwpe,           // (P,C) or null (no learned positions)
                        const float* dout,     // (B,T,C)
                        const int32_t* tokens, // (B,T)
                        int B, int T, int C, int pos_offset, int64_t v0 = 0,
                        int64_t rows = INT64_MAX) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::embedding_backward<ExecSpace>(dwte, dwpe, dout, tokens, B, T, C, pos_offset, v0,
                                          rows);
    return;
  }
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
  // Tokens repeat within a batch, so rows of dwte are not disjoint: each work item owns a slice of
  // columns and walks all positions in order (no atomics, deterministic).
  for_each<ExecSpace>(
      "colossal::core::embedding_backward", chunks, kChunkGrain,
      KOKKOS_LAMBDA(int chunk) {
        const int c0 = chunk * kColumnChunk;
        const int c1 = c0 + kColumnChunk < C ? c0 + kColumnChunk : C;
        for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
          const int t = static_cast<int>(bt % T);
          const float* d = dout + bt * C;
          const int64_t row = int64_t(tokens[bt]) - v0;
          if (row >= 0 && row < rows) {
            float* e = dwte + row * C;
            for (int c = c0; c < c1; ++c) e[c] += d[c];
          }
          if (dwpe != nullptr) {
            float* p = dwpe + int64_t(t + pos_offset) * C;
            for (int c = c0; c < c1; ++c) p[c] += d[c];
          }
        }
      });
}


// out = (inp - mean) * rstd * weight + bias, per row; saves mean and rstd for backward. Out is
// float, or std::uint16_t for the output's bf16 patterns. With copy.out, the same pass also
// writes copy.out = inp (+ copy.bias) (ResidualCopy).
template <class ExecSpace = Exec, class Out = float>
void layernorm_forward(Out* out,            // (N,C)
                       float* mean,         // (N)
                       float* rstd,         // (N)
                       const float* inp,    // (N,C)
                       const float* weight, // (C)
                       const float* bias,   // (C)
                       int64_t N, int C, float eps, ResidualCopy copy = {}) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::layernorm_forward<ExecSpace, Out>(out, mean, rstd, inp, weight, bias, N, C, eps, 0,
                                            copy);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::layernorm_forward", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        const float* x = inp + n * C;
        float m = lane_sum(C, [&](int c) { return x[c]; });
        m /= C;
        float v = lane_sum(C, [&](int c) { return (x[c] - m) * (x[c] - m); });
        v /= C;
        const float s = 1.0f / kmath::sqrt(v + eps);
        Out* o = out + n * C;
        for (int c = 0; c < C; ++c) store_output(o[c], (x[c] - m) * s * weight[c] + bias[c]);
        if (copy.out != nullptr) {  // while the row is in cache
          float* r = copy.out + n * C;
          if (copy.bias != nullptr) {
            for (int c = 0; c < C; ++c) r[c] = x[c] + copy.bias[c];
          } else {
            for (int c = 0; c < C; ++c) r[c] = x[c];
          }
        }
        mean[n] = m;
        rstd[n] = s;
      });
}

// dinp += layernorm input gradient (residual stream); dweight += ..., dbias += ...
template <class ExecSpace = Exec>
void layernorm_backward(float* dinp,         // (N,C), accumulated
                        float* dweight,      // (C)
                        float* dbias,        // (C)
                        const float* dout,   // (N,C)
                        const float* inp,    // (N,C)
                        const float* weight, // (C)
                        const float* mean,   // (N)
                        const float* rstd,   // (N)
                        int64_t N, int C) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::layernorm_backward<ExecSpace>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                                          C);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::layernorm_backward_input", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        const float m = mean[n], s = rstd[n];
        float dnorm_mean = lane_sum(C, [&](int c) { return d[c] * weight[c]; });
        float dnorm_xhat_mean =
            lane_sum(C, [&](int c) { return d[c] * weight[c] * (x[c] - m) * s; });
        dnorm_mean /= C;
        dnorm_xhat_mean /= C;
        float* di = dinp + n * C;
        for (int c = 0; c < C; ++c) {
          const float xhat = (x[c] - m) * s;
          di[c] += s * (d[c] * weight[c] - dnorm_mean - xhat * dnorm_xhat_mean);
        }
      });
  const int chunks = (C + kColumnChunk - 1) / kColumnChunk;
  for_each<ExecSpace>(
      "colossal::core::layernorm_backward_params", chunks, kChunkGrain,
      KOKKOS_LAMBDA(int chunk) {
        const int c0 = chunk * kColumnChunk;
        const int c1 = c0 + kColumnChunk < C ? c0 + kColumnChunk : C;
        float dw[kColumnChunk] = {}, db[kColumnChunk] = {};
        for (int64_t n = 0; n < N; ++n) {
          const float* x = inp + n * C;
          const float* d = dout + n * C;
          const float m = mean[n], s = rstd[n];
          for (int c = c0; c < c1; ++c) {
            dw[c - c0] += d[c] * (x[c] - m) * s;
            db[c - c0] += d[c];
          }
        }
        for (int c = c0; c < c1; ++c) {
          dweight[c] += dw[c - c0];
          dbias[c] += db[c - c0];
        }
      });
}

// out[n, j] = bias[j]: prepares the output of a GEMM that accumulates (beta = 1) onto the bias.
template <class ExecSpace = Exec>
void broadcast_rows(float* out,        // (N, ld), columns [0, M) written
                    const float* bias, // (M)
                    int64_t N, int M, int ld) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::broadcast_rows<ExecSpace>(out, bias, N, M, ld);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::broadcast_rows", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        float* o = out + n * ld;
        for (int j = 0; j < M; ++j) o[j] = bias[j];
      });
}

// dbias[j] += sum_n dout[n, j]
template <class ExecSpace = Exec>
void bias_backward(float* dbias,      // (M)
                   const float* dout, // (N, ld), columns [0, M) read
                   int64_t N, int M, int ld) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::bias_backward<ExecSpace>(dbias, dout, N, M, ld);
    return;
  }
  const int chunks = (M + kColumnChunk - 1) / kColumnChunk;
  for_each<ExecSpace>(
      "colossal::core::bias_backward", chunks, kChunkGrain,
      KOKKOS_LAMBDA(int chunk) {
        const int j0 = chunk * kColumnChunk;
        const int j1 = j0 + kColumnChunk < M ? j0 + kColumnChunk : M;
        float acc[kColumnChunk] = {};
        for (int64_t n = 0; n < N; ++n) {
          const float* d = dout + n * ld;
          for (int j = j0; j < j1; ++j) acc[j - j0] += d[j];
        }
        for (int j = j0; j < j1; ++j) dbias[j] += acc[j - j0];
      });
}

KOKKOS_INLINE_FUNCTION float gelu_tanh(float x) {
  constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + fast_tanh(kS * (x + 0.044715f * x * x * x)));
}

// out = gelu(inp), tanh approximation (GPT-2's "gelu_new")
// Out is float, or std::uint16_t for the bf16 patterns of an output only products read.
template <class ExecSpace = Exec, class Out = float>
void gelu_forward(Out* out, const float* inp, int64_t n) {  // (n), (n)
  for_each<ExecSpace>(
      "colossal::core::gelu_forward", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) { store_output(out[i], gelu_tanh(inp[i])); });
}

// The MLP's first linear layer's epilogue, one pass: pre[n, j] += bias[j] (the pre-activation,
// kept for backward) and out[n, j] = act(pre[n, j]) for j < M, act GELU (tanh) or ReLU. Out as
// gelu_forward. Replaces broadcasting the bias into the product's output first and reading the
// output again for the activation. One work item per row on the host (the inner loop
// vectorises), per element on a device (coalesced).
template <class ExecSpace = Exec, class Out = float>
void bias_activation_forward(Out* out,          // (N,M)
                             float* pre,        // (N,M), in place
                             const float* bias, // (M)
                             int64_t N, int M, bool gelu) {
  if constexpr (team_kernels_v<ExecSpace>) {
    Kokkos::parallel_for(
        "colossal::core::bias_activation_forward", Kokkos::RangePolicy<ExecSpace>(0, N * M),
        KOKKOS_LAMBDA(int64_t i) {
          const float x = pre[i] + bias[i % M];
          pre[i] = x;
          store_output(out[i], gelu ? gelu_tanh(x) : (x > 0.0f ? x : 0.0f));
        });
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::bias_activation_forward", N, kRowGrain, KOKKOS_LAMBDA(int64_t n) {
        float* x = pre + n * M;
        Out* o = out + n * M;
        if (gelu) {
          for (int j = 0; j < M; ++j) {
            x[j] += bias[j];
            store_output(o[j], gelu_tanh(x[j]));
          }
        } else {
          for (int j = 0; j < M; ++j) {
            x[j] += bias[j];
            store_output(o[j], x[j] > 0.0f ? x[j] : 0.0f);
          }
        }
      });
}

// dinp = gelu'(inp) * dout; dinp may alias dout.
template <class ExecSpace = Exec>
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for_each<ExecSpace>(
      "colossal::core::gelu_backward", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) {
        constexpr float kS = 0.7978845608028654f;
        const float x = inp[i];
        const float u = kS * (x + 0.044715f * x * x * x);
        const float th = fast_tanh(u);
        const float sech2 = 1.0f - th * th;
        const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kS * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
      });
}

template <class ExecSpace = Exec, class Out = float>
void relu_forward(Out* out, const float* inp, int64_t n) {
  for_each<ExecSpace>(
      "colossal::core::relu_forward", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) { store_output(out[i], inp[i] > 0.0f ? inp[i] : 0.0f); });
}

// dinp = (inp > 0) * dout; dinp may alias dout. dout is loaded whatever the sign, so the select
// vectorises into a compare and a blend: loaded only for positive inputs it compiled to a branch
// per element, mispredicted on half of them (3.3 ms against GELU's 0.47 for 2048 x 1024 floats
// on a 2-core EPYC: 9% of an OPT quickstart step).
template <class ExecSpace = Exec>
void relu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for_each<ExecSpace>(
      "colossal::core::relu_backward", n, kElementGrain, KOKKOS_LAMBDA(int64_t i) {
        const float g = dout[i];
        dinp[i] = inp[i] > 0.0f ? g : 0.0f;
      });
}

template <class ExecSpace = Exec>
void copy(float* dst, const float* src, int64_t n) {
  for_each<ExecSpace>(
      "colossal::core::copy", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) { dst[i] = src[i]; });
}

// dst[i] += src[i]
template <class ExecSpace = Exec>
void add(float* dst, const float* src, int64_t n) {
  for_each<ExecSpace>(
      "colossal::core::add", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) { dst[i] += src[i]; });
}

// In place over rows of scores (after the scale was applied by the GEMM). Row r is query
// position i = q_offset + r % Tq of a sequence whose keys are the Tk columns: softmax over keys
// j <= i, zero for j > i (causal). Square attention has Tq = Tk and q_offset 0; a ring rank holds
// Tq of the Tk positions, from q_offset on.
template <class ExecSpace = Exec>
void causal_softmax_forward(float* att,  // (B*H, Tq, Tk)
                            int64_t rows, int Tq, int Tk, int q_offset) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::causal_softmax_forward<ExecSpace>(att, rows, Tq, Tk, q_offset);
    return;
  }
  const int T = Tk;
  for_each<ExecSpace>(
      "colossal::core::causal_softmax_forward", rows, kRowGrain,
      KOKKOS_LAMBDA(int64_t r) {
        const int i = q_offset + static_cast<int>(r % Tq);
        float* a = att + r * T;
        const float mx = lane_max(a, i + 1);
        const float sum = lane_sum(i + 1, [&](int j) {
          const float e = fast_exp(a[j] - mx);
          a[j] = e;
          return e;
        });
        const float inv = 1.0f / sum;
        for (int j = 0; j <= i; ++j) a[j] *= inv;
        for (int j = i + 1; j < T; ++j) a[j] = 0.0f;
      });
}

template <class ExecSpace = Exec>
void causal_softmax_forward(float* att, int64_t rows, int T) {  // (B*H, T, T)
  causal_softmax_forward<ExecSpace>(att, rows, T, T, 0);
}


// In place: datt <- scale * att * (datt - sum_j att*datt), the gradient with respect to the
// unscaled scores q.k, zero above the diagonal (rows as in causal_softmax_forward). In: float,
// or std::uint16_t for probabilities saved as bf16 patterns.
template <class ExecSpace = Exec, class In = float>
void causal_softmax_backward(float* datt,      // (B*H, Tq, Tk)
                             const In* att,    // (B*H, Tq, Tk)
                             int64_t rows, int Tq, int Tk, int q_offset, float scale) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::causal_softmax_backward<ExecSpace, In>(datt, att, rows, Tq, Tk, q_offset, scale);
    return;
  }
  const int T = Tk;
  for_each<ExecSpace>(
      "colossal::core::causal_softmax_backward", rows, kRowGrain,
      KOKKOS_LAMBDA(int64_t r) {
        const int i = q_offset + static_cast<int>(r % Tq);
        const In* a = att + r * T;
        float* d = datt + r * T;
        const float dot = lane_sum(i + 1, [&](int j) { return load_value(a[j]) * d[j]; });
        for (int j = 0; j <= i; ++j) d[j] = scale * load_value(a[j]) * (d[j] - dot);
        for (int j = i + 1; j < T; ++j) d[j] = 0.0f;
      });
}

template <class ExecSpace = Exec, class In = float>
void causal_softmax_backward(float* datt, const In* att, int64_t rows, int T, float scale) {
  causal_softmax_backward<ExecSpace, In>(datt, att, rows, T, T, 0, scale);
}

// dst(rows, ld_dst)[:, :cols] = src(rows, ld_src)[:, :cols]
template <class ExecSpace = Exec>
void copy_columns(float* dst, int ld_dst, const float* src, int ld_src, int64_t rows, int cols) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::copy_columns<ExecSpace>(dst, ld_dst, src, ld_src, rows, cols);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::copy_columns", rows, kRowGrain,
      KOKKOS_LAMBDA(int64_t r) {
        for (int c = 0; c < cols; ++c) dst[r * ld_dst + c] = src[r * ld_src + c];
      });
}

// Per row: losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]. With grad_scale != 0 the
// logits are overwritten by grad_scale * (softmax - onehot), the gradient of grad_scale * loss,
// so the (N, V) buffer is reused for backward. Rows are `ld` >= V floats apart; the columns past
// V are neither read nor written.
template <class ExecSpace = Exec>
void cross_entropy_forward_backward(float* logits,           // (N, ld), in place
                                    float* losses,           // (N)
                                    const int32_t* targets,  // (N)
                                    int64_t N, int V, int ld, float grad_scale) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::cross_entropy_forward_backward<ExecSpace>(logits, losses, targets, N, V, ld,
                                                    grad_scale);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::cross_entropy", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        float* l = logits + n * ld;
        const float mx = lane_max(l, V);
        const int target = targets[n];
        const float target_logit = l[target];
        float sum;
        if (grad_scale != 0.0f) {
          // Keep exp(l - max) in place so the gradient pass needs no second exp.
          sum = lane_sum(V, [&](int j) {
            const float e = fast_exp(l[j] - mx);
            l[j] = e;
            return e;
          });
          const float factor = grad_scale / sum;
          for (int j = 0; j < V; ++j) l[j] *= factor;
          l[target] -= grad_scale;
        } else {
          sum = lane_sum(V, [&](int j) { return fast_exp(l[j] - mx); });
        }
        losses[n] = kmath::log(sum) + mx - target_logit;
      });
}

// Vocabulary-parallel cross-entropy (Megatron): each rank of the tensor group holds the logits of
// vocabulary columns [v0, v0 + valid) in rows of `ld` (columns past `valid` are padding). The
// caller sums over the group between the passes: the row maxima (max), then the sums of
// exp(logit - max) and the target logits (sum). The full logits never meet on one rank.
template <class ExecSpace = Exec>
void vocab_parallel_row_max(float* mx, const float* logits, int64_t N, int ld, int valid) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::vocab_parallel_row_max<ExecSpace>(mx, logits, N, ld, valid);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::vp_row_max", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        const float* l = logits + n * ld;
        mx[n] = valid > 0 ? lane_max(l, valid) : -3.0e38f;
      });
}

// sums[n] = sum_j exp(l[n,j] - mx[n]); sums[N + n] = l[n, target - v0] when this rank holds it.
template <class ExecSpace = Exec>
void vocab_parallel_sums(float* sums, const float* logits, const float* mx,
                         const int32_t* targets, int64_t N, int ld, int valid, int64_t v0) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::vocab_parallel_sums<ExecSpace>(sums, logits, mx, targets, N, ld, valid, v0);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::vp_sums", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        const float* l = logits + n * ld;
        const float m = mx[n];
        sums[n] = lane_sum(valid, [&](int j) { return fast_exp(l[j] - m); });
        const int64_t t = int64_t(targets[n]) - v0;
        sums[N + n] = t >= 0 && t < valid ? l[t] : 0.0f;
      });
}

// losses[n] = log(sum) + max - target logit; with grad_scale != 0 the local logits become
// grad_scale * (softmax - onehot), padding columns zero.
template <class ExecSpace = Exec>
void vocab_parallel_finish(float* logits, float* losses, const float* mx, const float* sums,
                           const int32_t* targets, int64_t N, int ld, int valid, int64_t v0,
                           float grad_scale) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::vocab_parallel_finish<ExecSpace>(logits, losses, mx, sums, targets, N, ld, valid, v0,
                                             grad_scale);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::vp_finish", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        float* l = logits + n * ld;
        losses[n] = kmath::log(sums[n]) + mx[n] - sums[N + n];
        if (grad_scale == 0.0f) return;
        const float factor = grad_scale / sums[n];
        for (int j = 0; j < valid; ++j) l[j] = fast_exp(l[j] - mx[n]) * factor;
        for (int j = valid; j < ld; ++j) l[j] = 0.0f;
        const int64_t t = int64_t(targets[n]) - v0;
        if (t >= 0 && t < valid) l[t] -= grad_scale;
      });
}

// sum_i x[i], accumulated in double.
template <class ExecSpace = Exec>
double sum(const float* x, int64_t n) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      "colossal::core::sum", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(int64_t i, double& acc) { acc += x[i]; }, total);
  return total;
}

// sum of x[i]^2 over [begin, end) in 16 float lanes (so the compiler vectorises without
// reordering a single accumulator), lanes added in double. Shared by sum_squares and the host
// threads' loop over all gradients.
KOKKOS_INLINE_FUNCTION double block_sum_squares(const float* x, int64_t begin, int64_t end) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * x[i + l];
  }
  for (; i < end; ++i) lanes[0] += x[i] * x[i];
  double s = 0.0;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  return s;
}

constexpr int64_t kSumBlock = 4096;  // floats per block of block_sum_squares

// sum_i x[i]^2: blocks of kSumBlock, blocks added in double.
template <class ExecSpace = Exec>
double sum_squares(const float* x, int64_t n) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      "colossal::core::sum_squares",
      Kokkos::RangePolicy<ExecSpace>(0, (n + kSumBlock - 1) / kSumBlock),
      KOKKOS_LAMBDA(int64_t block, double& acc) {
        const int64_t begin = block * kSumBlock;
        acc += block_sum_squares(x, begin, begin + kSumBlock < n ? begin + kSumBlock : n);
      },
      total);
  return total;
}

}  // namespace colossal::core::kernels

namespace colossal::core::kernels {

// out[i] = the bf16 pattern of in[i] (round to nearest even: the rounding of every bf16 path),
// how an activation computed in fp32 is saved in bf16. On a device this is cuBLAS's operand
// rounding (detail::to_bf16_on_device: eight values per thread through 16-byte accesses; a plain
// range of one value per thread moved 0.65 TB/s on an H200 and halved a bf16 step).
template <class ExecSpace = Exec>
void to_bf16(std::uint16_t* out, const float* in, int64_t n) {  // (n), (n)
  if constexpr (device_memory_v<ExecSpace>) {
    detail::to_bf16_on_device(in, out, std::size_t(n));
  } else {
    for_each<ExecSpace>(
        "colossal::core::to_bf16", n, kElementGrain,
        KOKKOS_LAMBDA(int64_t i) { out[i] = bf16_bits(in[i]); });
  }
}

// out[i] = in[i] widened from bf16 (exact), or out[i] += it when `accumulate`: the way back from a
// gradient reduced in bf16 (parallel.grad_reduce: bf16).
template <class ExecSpace = Exec>
void from_bf16(float* out, const std::uint16_t* in, int64_t n, bool accumulate) {  // (n), (n)
  if (accumulate) {
    for_each<ExecSpace>(
        "colossal::core::add_from_bf16", n, kElementGrain,
        KOKKOS_LAMBDA(int64_t i) { out[i] += bf16_value(in[i]); });
  } else {
    for_each<ExecSpace>(
        "colossal::core::from_bf16", n, kElementGrain,
        KOKKOS_LAMBDA(int64_t i) { out[i] = bf16_value(in[i]); });
  }
}

template <class ExecSpace = Exec>
void fill(float* dst, int64_t n, float value) {
  for_each<ExecSpace>(
      "colossal::core::fill", n, kElementGrain,
      KOKKOS_LAMBDA(int64_t i) { dst[i] = value; });
}

// out[n,c] = residual[n,c] + bias[c]: the residual stream plus a projection's bias, ready for the
// projection's GEMM to accumulate onto (beta = 1).
template <class ExecSpace = Exec>
void residual_plus_bias(float* out,            // (N,C)
                        const float* residual, // (N,C)
                        const float* bias,     // (C)
                        int64_t N, int C) {
  if constexpr (team_kernels_v<ExecSpace>) {  // team form (core/kernels_team.hpp)
    team::residual_plus_bias<ExecSpace>(out, residual, bias, N, C);
    return;
  }
  for_each<ExecSpace>(
      "colossal::core::residual_plus_bias", N, kRowGrain,
      KOKKOS_LAMBDA(int64_t n) {
        const float* r = residual + n * C;
        float* o = out + n * C;
        for (int c = 0; c < C; ++c) o[c] = r[c] + bias[c];
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void embedding_forward<Kokkos::Cuda>(float* out, const int32_t* tokens,
                                                              const float* wte, const float* wpe,
                                                              int B, int T, int C, int pos_offset,
                                                              int64_t v0, int64_t rows);
COLOSSAL_DEVICE_INSTANCE void embedding_backward<Kokkos::Cuda>(float* dwte, float* dwpe,
                                                               const float* dout,
                                                               const int32_t* tokens, int B, int T,
                                                               int C, int pos_offset, int64_t v0,
                                                               int64_t rows);
COLOSSAL_DEVICE_INSTANCE void layernorm_forward<Kokkos::Cuda, float>(float* out, float* mean,
                                                                     float* rstd, const float* inp,
                                                                     const float* weight,
                                                                     const float* bias, int64_t N,
                                                                     int C, float eps,
                                                                     ResidualCopy copy);
COLOSSAL_DEVICE_INSTANCE void layernorm_forward<Kokkos::Cuda, std::uint16_t>(
    std::uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
    const float* bias, int64_t N, int C, float eps, ResidualCopy copy);
COLOSSAL_DEVICE_INSTANCE void layernorm_backward<Kokkos::Cuda>(float* dinp, float* dweight,
                                                               float* dbias, const float* dout,
                                                               const float* inp,
                                                               const float* weight,
                                                               const float* mean, const float* rstd,
                                                               int64_t N, int C);
COLOSSAL_DEVICE_INSTANCE void broadcast_rows<Kokkos::Cuda>(float* out, const float* bias, int64_t N,
                                                           int M, int ld);
COLOSSAL_DEVICE_INSTANCE void bias_backward<Kokkos::Cuda>(float* dbias, const float* dout,
                                                          int64_t N, int M, int ld);
COLOSSAL_DEVICE_INSTANCE void gelu_forward<Kokkos::Cuda, float>(float* out, const float* inp,
                                                                int64_t n);
COLOSSAL_DEVICE_INSTANCE void gelu_forward<Kokkos::Cuda, std::uint16_t>(std::uint16_t* out,
                                                                        const float* inp,
                                                                        int64_t n);
COLOSSAL_DEVICE_INSTANCE void bias_activation_forward<Kokkos::Cuda, float>(
    float* out, float* pre, const float* bias, int64_t N, int M, bool gelu);
COLOSSAL_DEVICE_INSTANCE void bias_activation_forward<Kokkos::Cuda, std::uint16_t>(
    std::uint16_t* out, float* pre, const float* bias, int64_t N, int M, bool gelu);
COLOSSAL_DEVICE_INSTANCE void gelu_backward<Kokkos::Cuda>(float* dinp, const float* inp,
                                                          const float* dout, int64_t n);
COLOSSAL_DEVICE_INSTANCE void relu_forward<Kokkos::Cuda, float>(float* out, const float* inp,
                                                                int64_t n);
COLOSSAL_DEVICE_INSTANCE void relu_forward<Kokkos::Cuda, std::uint16_t>(std::uint16_t* out,
                                                                        const float* inp,
                                                                        int64_t n);
COLOSSAL_DEVICE_INSTANCE void relu_backward<Kokkos::Cuda>(float* dinp, const float* inp,
                                                          const float* dout, int64_t n);
COLOSSAL_DEVICE_INSTANCE void copy<Kokkos::Cuda>(float* dst, const float* src, int64_t n);
COLOSSAL_DEVICE_INSTANCE void add<Kokkos::Cuda>(float* dst, const float* src, int64_t n);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_forward<Kokkos::Cuda>(float* att, int64_t rows, int Tq,
                                                                   int Tk, int q_offset);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_forward<Kokkos::Cuda>(float* att, int64_t rows, int T);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, float>(float* datt,
                                                                           const float* att,
                                                                           int64_t rows, int Tq,
                                                                           int Tk, int q_offset,
                                                                           float scale);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, float>(float* datt,
                                                                           const float* att,
                                                                           int64_t rows, int T,
                                                                           float scale);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, std::uint16_t>(
    float* datt, const std::uint16_t* att, int64_t rows, int Tq, int Tk, int q_offset,
    float scale);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, std::uint16_t>(
    float* datt, const std::uint16_t* att, int64_t rows, int T, float scale);
COLOSSAL_DEVICE_INSTANCE void copy_columns<Kokkos::Cuda>(float* dst, int ld_dst, const float* src,
                                                         int ld_src, int64_t rows, int cols);
COLOSSAL_DEVICE_INSTANCE void cross_entropy_forward_backward<Kokkos::Cuda>(float* logits,
                                                                           float* losses,
                                                                           const int32_t* targets,
                                                                           int64_t N, int V, int ld,
                                                                           float grad_scale);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_row_max<Kokkos::Cuda>(float* mx, const float* logits,
                                                                   int64_t N, int ld, int valid);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_sums<Kokkos::Cuda>(float* sums, const float* logits,
                                                                const float* mx,
                                                                const int32_t* targets, int64_t N,
                                                                int ld, int valid, int64_t v0);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_finish<Kokkos::Cuda>(float* logits, float* losses,
                                                                  const float* mx,
                                                                  const float* sums,
                                                                  const int32_t* targets, int64_t N,
                                                                  int ld, int valid, int64_t v0,
                                                                  float grad_scale);
COLOSSAL_DEVICE_INSTANCE double sum<Kokkos::Cuda>(const float* x, int64_t n);
COLOSSAL_DEVICE_INSTANCE double sum_squares<Kokkos::Cuda>(const float* x, int64_t n);
COLOSSAL_DEVICE_INSTANCE void fill<Kokkos::Cuda>(float* dst, int64_t n, float value);
COLOSSAL_DEVICE_INSTANCE void from_bf16<Kokkos::Cuda>(float* out, const std::uint16_t* in,
                                                      int64_t n, bool accumulate);
COLOSSAL_DEVICE_INSTANCE void residual_plus_bias<Kokkos::Cuda>(float* out, const float* residual,
                                                               const float* bias, int64_t N, int C);
#endif

}  // namespace colossal::core::kernels
