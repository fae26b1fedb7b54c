// Device forms of the row and column kernels of core/kernels.hpp, written once in Kokkos and
// templated on the execution space: a row is one team (Kokkos::TeamPolicy), its work spread over
// the team's threads with TeamThreadRange reductions, instead of one work item per row. The same
// arguments, shapes and accumulation rules as the host kernels (docs/device-kernels.md):
// parameter gradients accumulate, activation gradients assign, layernorm_backward's dinp
// accumulates (residual stream).
//
// Every kernel takes `team_size` (0: Kokkos::AUTO; the Serial backend runs teams of one; on CUDA
// Kokkos sizes the block by the kernel's registers for the best occupancy, often 64 to 256
// threads, so it may change with the compiler). Results do not depend on the team size except
// for the order of additions inside a team reduction (row sums of layernorm, softmax and
// cross-entropy, within float rounding); the column reductions and the embedding backward add
// in an order fixed by the shapes alone, the same on every backend and team size (up to the
// multiply-adds nvcc contracts into fmas, which the host's compiler does not).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/bf16.hpp"
#include "core/fast_math.hpp"
#include "core/kokkos_compat.hpp"
#include "core/residual_copy.hpp"

namespace colossal::core::team {

// The host's team size for a call that leaves it to Kokkos (team_size 0): COLOSSAL_TEAM_SIZE
// when set to a positive number (scripts/check_team_kernels.sh runs the host team forms with
// teams of 2, 4 and 8 OpenMP threads), else 0 (Kokkos::AUTO). Read once.
inline int host_team_size() {
  static const int size = [] {
    const char* v = std::getenv("COLOSSAL_TEAM_SIZE");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n > 0 ? n : 0;
  }();
  return size;
}

// A team policy over `league` teams; team_size 0 lets Kokkos choose (on the host, after
// COLOSSAL_TEAM_SIZE).
template <class ExecSpace>
Kokkos::TeamPolicy<ExecSpace> policy(int64_t league, int team_size, int vector_length = 1) {
  if (league < 0 || league > INT_MAX) {
    throw std::invalid_argument("colossal::core::team: " + std::to_string(league) +
                                " teams (Kokkos leagues hold at most 2^31 - 1); split the call");
  }
  if constexpr (!device_memory_v<ExecSpace>) {
    if (team_size <= 0) team_size = host_team_size();
  }
  if (team_size <= 0) {
    return Kokkos::TeamPolicy<ExecSpace>(int(league), Kokkos::AUTO, vector_length);
  }
  return Kokkos::TeamPolicy<ExecSpace>(int(league), team_size, vector_length);
}

template <class ExecSpace>
using Member = typename Kokkos::TeamPolicy<ExecSpace>::member_type;

template <class ExecSpace>
using ScratchFloats =
    Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

// Vector lanes per team thread: a warp's 32 lanes across columns on a device, 1 on the host
// (where ThreadVectorRange is a plain loop).
template <class ExecSpace>
constexpr int column_lanes() {
  return device_memory_v<ExecSpace> ? 32 : 1;
}

// ---------------------------------------------------------------------------------------------
// Row kernels: one team per row.

// out = (inp - mean) * rstd * weight + bias, per row; saves mean and rstd. Out is float, or
// std::uint16_t for the output's bf16 patterns (saved in bf16 under train.precision: bf16).
// With copy.out, also copy.out = inp (+ copy.bias) in the same pass (core/residual_copy.hpp).
template <class ExecSpace = Kokkos::DefaultExecutionSpace, class Out = float>
void layernorm_forward(Out* out,            // (N,C)
                       float* mean,         // (N)
                       float* rstd,         // (N)
                       const float* inp,    // (N,C)
                       const float* weight, // (C)
                       const float* bias,   // (C)
                       int64_t N, int C, float eps, int team_size = 0,
                       ResidualCopy copy = {}) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_forward", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* x = inp + n * C;
        float m = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C), [&](int c, float& acc) { acc += x[c]; }, m);
        m /= C;
        float v = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C),
            [&](int c, float& acc) { acc += (x[c] - m) * (x[c] - m); }, v);
        v /= C;
        const float s = 1.0f / kmath::sqrt(v + eps);
        Out* o = out + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int c) {
          store_output(o[c], (x[c] - m) * s * weight[c] + bias[c]);
          if (copy.out != nullptr) {
            copy.out[n * C + c] = copy.bias != nullptr ? x[c] + copy.bias[c] : x[c];
          }
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          mean[n] = m;
          rstd[n] = s;
        });
      });
}

// out_k[c] += sum_n value(n, c)_k for k < K and c < M: the column reductions. A team owns
// kColumnWidth columns (a device's 32 vector lanes, so each row is read coalesced) of one slab
// of rows; its threads take kRowGroups fixed row groups of the slab (group g: rows begin + g,
// begin + g + kRowGroups, ...), each summed in row order into team scratch, and the groups are
// added in group order. With one slab that total is added to out; with several (column_slabs:
// enough teams to fill a GPU, 24 column chunks alone leave most of an H100's 132
// multiprocessors idle at d_model 768) each slab's total goes to a small workspace and a second
// kernel adds the slabs in slab order. The order of additions is fixed by N and M alone, the same
// on every backend and team size (nvcc may contract a term's multiply and add into one fma,
// which the host does not: the device's values are the host team form's to rounding).
constexpr int kColumnWidth = 32;
constexpr int kRowGroups = 16;

// Slabs of rows for a column reduction of `chunks` column chunks over N rows: about 256 teams in
// all, each slab at least 256 rows (16 per row group); 1 for small reductions.
inline int column_slabs(int64_t N, int chunks) {
  constexpr int64_t kTeams = 256, kMinRows = 256;
  const int64_t by_teams = std::max<int64_t>(1, kTeams / std::max(chunks, 1));
  return int(std::min<int64_t>(by_teams, std::max<int64_t>(1, N / kMinRows)));
}

namespace detail {
// column_sums' per-slab totals in `MemorySpace`: grown to the largest call's slabs x K x M floats
// (at most about 64 KiB: column_slabs keeps slabs x chunks near 256) and kept until
// Kokkos::finalize, as EmbeddingWorkspace below, so steps after the first allocate nothing.
// One per memory space: the calls must be ordered (one execution space instance, one stream, as
// every kernel of the step), never two at once, or one call's totals overwrite another's.
template <class MemorySpace>
struct ColumnSumsWorkspace {
  float* totals = nullptr;
  std::size_t capacity = 0;

  static float* at_least(std::size_t floats) {
    static ColumnSumsWorkspace workspace;
    ColumnSumsWorkspace& w = workspace;
    if (floats <= w.capacity) return w.totals;
    if (w.totals == nullptr) {
      Kokkos::push_finalize_hook([] {
        ColumnSumsWorkspace& v = workspace;
        if (v.totals != nullptr) Kokkos::kokkos_free<MemorySpace>(v.totals);
        v = ColumnSumsWorkspace{};
      });
    } else {
      Kokkos::kokkos_free<MemorySpace>(w.totals);
    }
    w.totals = static_cast<float*>(
        Kokkos::kokkos_malloc<MemorySpace>("colossal::column_sums_totals", sizeof(float) * floats));
    w.capacity = floats;
    return w.totals;
  }
};
}  // namespace detail

// The terms column_sums adds, as functors: a KOKKOS_LAMBDA (nvcc's __host__ __device__ lambda
// wrapper) captured by column_sums' own kernel lambda compiled, but jumped to address 0 on the
// host in colossal_train on an H200 (the same kernel's unit test ran: the wrapper's host side
// was left unset where the instantiation came from the static library).
struct LayernormParamTerms {  // v = (dout * xhat, dout) of element (n, c)
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  int C;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t n, int c, float* v) const {
    const float d = dout[n * C + c];
    v[0] = d * (inp[n * C + c] - mean[n]) * rstd[n];
    v[1] = d;
  }
};
struct BiasTerms {  // v = dout[n, j], rows ld apart
  const float* dout;
  int ld;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t n, int j, float* v) const {
    v[0] = dout[n * ld + j];
  }
};

template <class ExecSpace, int K, class Value>
void column_sums(const char* label, float* out0, float* out1, int64_t N, int M, int team_size,
                 const Value& value) {
  static_assert(K == 1 || K == 2, "column_sums reduces one or two outputs");
  const int chunks = (M + kColumnWidth - 1) / kColumnWidth;
  const int slabs = column_slabs(N, chunks);
  const int64_t slab_rows = (N + slabs - 1) / slabs;
  float* totals = slabs == 1 ? nullptr
                             : detail::ColumnSumsWorkspace<typename ExecSpace::memory_space>::
                                   at_least(std::size_t(slabs) * K * std::size_t(M));
  constexpr int lanes = column_lanes<ExecSpace>();
  // A device team is always kRowGroups threads of 32 lanes (a hand-given size would only idle
  // threads, or pass CUDA's 1024 threads a block); the host's takes team_size.
  const int threads = device_memory_v<ExecSpace> ? kRowGroups : team_size;
  const int floats = K * kRowGroups * kColumnWidth;
  auto pol = policy<ExecSpace>(int64_t(chunks) * slabs, threads, lanes);
  pol.set_scratch_size(0, Kokkos::PerTeam(ScratchFloats<ExecSpace>::shmem_size(floats)));
  Kokkos::parallel_for(
      label, pol, KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        ScratchFloats<ExecSpace> partial(team.team_scratch(0), floats);
        const int chunk = team.league_rank() % chunks, slab = team.league_rank() / chunks;
        const int c0 = chunk * kColumnWidth;
        const int width = c0 + kColumnWidth < M ? kColumnWidth : M - c0;
        const int64_t begin = slab * slab_rows;
        const int64_t end = begin + slab_rows < N ? begin + slab_rows : N;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kRowGroups), [&](int g) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, width), [&](int w) {
            float acc[K] = {};
            float v[K];
            for (int64_t n = begin + g; n < end; n += kRowGroups) {
              value(n, c0 + w, v);
              for (int k = 0; k < K; ++k) acc[k] += v[k];
            }
            for (int k = 0; k < K; ++k) partial((k * kRowGroups + g) * kColumnWidth + w) = acc[k];
          });
        });
        team.team_barrier();
        // One lane of each team thread adds a column's total: outside a ThreadVectorRange every
        // vector lane (on CUDA, the 32 lanes along threadIdx.x) runs the body, and 32 lanes
        // reading and adding to one address are right only while they run in lockstep, which
        // neither Kokkos nor Volta's independent thread scheduling promises.
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, width), [&](int w) {
          Kokkos::single(Kokkos::PerThread(team), [&] {
            for (int k = 0; k < K; ++k) {
              float total = 0.0f;
              for (int g = 0; g < kRowGroups; ++g) {
                total += partial((k * kRowGroups + g) * kColumnWidth + w);
              }
              if (totals == nullptr) {
                float* out = k == 0 ? out0 : out1;
                out[c0 + w] += total;
              } else {
                totals[(int64_t(slab) * K + k) * M + c0 + w] = total;
              }
            }
          });
        });
      });
  if (totals == nullptr) return;
  // The slabs' totals, added in slab order (the same stream: after the kernel above).
  Kokkos::parallel_for(
      "colossal::core::team_column_sums_slabs", Kokkos::RangePolicy<ExecSpace>(0, M),
      KOKKOS_LAMBDA(const int c) {
        for (int k = 0; k < K; ++k) {
          float total = 0.0f;
          for (int s = 0; s < slabs; ++s) total += totals[(int64_t(s) * K + k) * M + c];
          float* out = k == 0 ? out0 : out1;
          out[c] += total;
        }
      });
}

// dinp += layernorm input gradient (residual stream); dweight += ..., dbias += ...
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void layernorm_backward(float* dinp,         // (N,C), accumulated
                        float* dweight,      // (C)
                        float* dbias,        // (C)
                        const float* dout,   // (N,C)
                        const float* inp,    // (N,C)
                        const float* weight, // (C)
                        const float* mean,   // (N)
                        const float* rstd,   // (N)
                        int64_t N, int C, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_layernorm_backward_input", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* x = inp + n * C;
        const float* d = dout + n * C;
        const float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C),
            [&](int c, float& acc) { acc += d[c] * weight[c]; }, dnorm_mean);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, C),
            [&](int c, float& acc) { acc += d[c] * weight[c] * (x[c] - m) * s; },
            dnorm_xhat_mean);
        dnorm_mean /= C;
        dnorm_xhat_mean /= C;
        float* di = dinp + n * C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int c) {
          const float xhat = (x[c] - m) * s;
          di[c] += s * (d[c] * weight[c] - dnorm_mean - xhat * dnorm_xhat_mean);
        });
      });
  column_sums<ExecSpace, 2>("colossal::core::team_layernorm_backward_params", dweight, dbias, N,
                            C, team_size, LayernormParamTerms{dout, inp, mean, rstd, C});
}

// dbias[j] += sum_n dout[n, j]
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void bias_backward(float* dbias,      // (M)
                   const float* dout, // (N, ld), columns [0, M) read
                   int64_t N, int M, int ld, int team_size = 0) {
  column_sums<ExecSpace, 1>("colossal::core::team_bias_backward", dbias, nullptr, N, M, team_size,
                            BiasTerms{dout, ld});
}

// Causal softmax in place over rows of scores, as kernels::causal_softmax_forward: row r is
// query position i = q_offset + r % Tq over Tk keys; zero above the diagonal.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void causal_softmax_forward(float* att,  // (B*H, Tq, Tk)
                            int64_t rows, int Tq, int Tk, int q_offset, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_causal_softmax_forward", policy<ExecSpace>(rows, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t r = team.league_rank();
        const int i = q_offset + static_cast<int>(r % Tq);
        const int valid = i + 1 < Tk ? i + 1 : Tk;
        float* a = att + r * Tk;
        float mx = -3.0e38f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, valid),
            [&](int j, float& m) { m = a[j] > m ? a[j] : m; }, Kokkos::Max<float>(mx));
        float sum = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, valid),
            [&](int j, float& acc) { acc += kernels::fast_exp(a[j] - mx); }, sum);
        const float inv = 1.0f / sum;
        // Every thread has read its scores inside the reductions; now overwrite them.
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Tk), [&](int j) {
          a[j] = j < valid ? kernels::fast_exp(a[j] - mx) * inv : 0.0f;
        });
      });
}

// In place: datt <- scale * att * (datt - sum_j att*datt), zero above the diagonal. In: float,
// or std::uint16_t for probabilities saved as bf16 patterns.
template <class ExecSpace = Kokkos::DefaultExecutionSpace, class In = float>
void causal_softmax_backward(float* datt,      // (B*H, Tq, Tk)
                             const In* att,    // (B*H, Tq, Tk)
                             int64_t rows, int Tq, int Tk, int q_offset, float scale,
                             int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_causal_softmax_backward", policy<ExecSpace>(rows, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t r = team.league_rank();
        const int i = q_offset + static_cast<int>(r % Tq);
        const int valid = i + 1 < Tk ? i + 1 : Tk;
        const In* a = att + r * Tk;
        float* d = datt + r * Tk;
        float dot = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, valid),
            [&](int j, float& acc) { acc += load_value(a[j]) * d[j]; }, dot);
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, Tk), [&](int j) {
          d[j] = j < valid ? scale * load_value(a[j]) * (d[j] - dot) : 0.0f;
        });
      });
}

// Per row: losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]; with grad_scale != 0 the
// logits become grad_scale * (softmax - onehot) in place (kernels::cross_entropy_forward_backward).
// Three passes over the row (max, sum of exp, gradient), the exp recomputed in the last one
// rather than stored and reloaded.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void cross_entropy_forward_backward(float* logits,          // (N, ld), in place
                                    float* losses,          // (N)
                                    const int32_t* targets, // (N)
                                    int64_t N, int V, int ld, float grad_scale,
                                    int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_cross_entropy", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        float* l = logits + n * ld;
        const int target = targets[n];
        const float target_logit = l[target];
        float mx = -3.0e38f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, V), [&](int j, float& m) { m = l[j] > m ? l[j] : m; },
            Kokkos::Max<float>(mx));
        float sum = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, V),
            [&](int j, float& acc) { acc += kernels::fast_exp(l[j] - mx); }, sum);
        Kokkos::single(Kokkos::PerTeam(team),
                       [&]() { losses[n] = kmath::log(sum) + mx - target_logit; });
        if (grad_scale == 0.0f) return;
        team.team_barrier();  // the target logit is read by every thread before it is written
        const float factor = grad_scale / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](int j) {
          const float g = kernels::fast_exp(l[j] - mx) * factor;
          l[j] = j == target ? g - grad_scale : g;
        });
      });
}

// Vocabulary-parallel cross-entropy, as kernels::vocab_parallel_*: the caller reduces over the
// tensor group between the passes.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void vocab_parallel_row_max(float* mx, const float* logits, int64_t N, int ld, int valid,
                            int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_vp_row_max", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* l = logits + n * ld;
        float m = -3.0e38f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, valid),
            [&](int j, float& acc) { acc = l[j] > acc ? l[j] : acc; }, Kokkos::Max<float>(m));
        Kokkos::single(Kokkos::PerTeam(team), [&]() { mx[n] = m > -3.0e38f ? m : -3.0e38f; });
      });
}

// sums[n] = sum_j exp(l[n,j] - mx[n]); sums[N + n] = l[n, target - v0] when this rank holds it.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void vocab_parallel_sums(float* sums, const float* logits, const float* mx,
                         const int32_t* targets, int64_t N, int ld, int valid, int64_t v0,
                         int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_vp_sums", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        const float* l = logits + n * ld;
        const float m = mx[n];
        float s = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, valid),
            [&](int j, float& acc) { acc += kernels::fast_exp(l[j] - m); }, s);
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          sums[n] = s;
          const int64_t t = int64_t(targets[n]) - v0;
          sums[N + n] = t >= 0 && t < valid ? l[t] : 0.0f;
        });
      });
}

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void vocab_parallel_finish(float* logits, float* losses, const float* mx, const float* sums,
                           const int32_t* targets, int64_t N, int ld, int valid, int64_t v0,
                           float grad_scale, int team_size = 0) {
  Kokkos::parallel_for(
      "colossal::core::team_vp_finish", policy<ExecSpace>(N, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int64_t n = team.league_rank();
        float* l = logits + n * ld;
        Kokkos::single(Kokkos::PerTeam(team),
                       [&]() { losses[n] = kmath::log(sums[n]) + mx[n] - sums[N + n]; });
        if (grad_scale == 0.0f) return;
        const float factor = grad_scale / sums[n];
        const float m = mx[n];
        const int64_t t = int64_t(targets[n]) - v0;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, ld), [&](int j) {
          if (j >= valid) {
            l[j] = 0.0f;
            return;
          }
          const float g = kernels::fast_exp(l[j] - m) * factor;
          l[j] = j == t ? g - grad_scale : g;
        });
      });
}

// ---------------------------------------------------------------------------------------------
// Embeddings.

namespace detail {
// The embedding backward's workspace in `MemorySpace`: bucket counts and fill cursors, and the
// (row, position) keys of a batch. Allocated at the first call and grown only for a larger batch,
// then kept until Kokkos::finalize (a finalize hook frees it), outside the memory tracker as
// cuBLAS's staging buffers are: 8 bytes a position and 512 KiB. A step therefore allocates and
// frees nothing: a cudaFree would synchronise the whole device.
template <class MemorySpace>
struct EmbeddingWorkspace {
  static constexpr int kBuckets = 1 << 16;  // rows r and r + 2^16 share a bucket (sorted apart)
  int* counts = nullptr;                    // kBuckets + 1: after the scan, bucket b's start
  int* fill = nullptr;                      // kBuckets: the scatter's cursors
  int64_t* keys = nullptr;                  // `capacity` positions
  int64_t capacity = 0;

  static EmbeddingWorkspace& at_least(int64_t positions) {
    static EmbeddingWorkspace workspace;
    EmbeddingWorkspace& w = workspace;
    if (w.counts == nullptr) {
      w.counts = static_cast<int*>(Kokkos::kokkos_malloc<MemorySpace>(
          "colossal::embedding_counts", sizeof(int) * (kBuckets + 1)));
      w.fill = static_cast<int*>(
          Kokkos::kokkos_malloc<MemorySpace>("colossal::embedding_fill", sizeof(int) * kBuckets));
      Kokkos::push_finalize_hook([] {
        EmbeddingWorkspace& v = workspace;
        Kokkos::kokkos_free<MemorySpace>(v.counts);
        Kokkos::kokkos_free<MemorySpace>(v.fill);
        if (v.keys != nullptr) Kokkos::kokkos_free<MemorySpace>(v.keys);
        v = EmbeddingWorkspace{};
      });
    }
    if (positions > w.capacity) {
      if (w.keys != nullptr) Kokkos::kokkos_free<MemorySpace>(w.keys);
      w.keys = static_cast<int64_t*>(Kokkos::kokkos_malloc<MemorySpace>(
          "colossal::embedding_keys", sizeof(int64_t) * std::size_t(positions)));
      w.capacity = positions;
    }
    return w;
  }
};

// Sorts k[0, n) ascending in place with the whole team (every thread calls it): a bitonic network
// padded to a power of two m >= n, every comparison ascending (the smaller key to the lower
// index) with the partner i ^ mask: the first of each merge the mirrored position in its block
// (mask = size - 1), the rest halving; a partner past n is +infinity, never swapped. log2(m)
// (log2(m) + 1) / 2 rounds, a team barrier after each.
template <class Team>
KOKKOS_INLINE_FUNCTION void team_sort(const Team& team, int64_t* k, int n) {
  int m = 1;
  while (m < n) m <<= 1;
  auto compare = [&](int mask) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m), [&](int i) {
      const int l = i ^ mask;
      if (l > i && l < n && k[i] > k[l]) {
        const int64_t t = k[i];
        k[i] = k[l];
        k[l] = t;
      }
    });
    team.team_barrier();
  };
  for (int size = 2; size <= m; size <<= 1) {
    compare(size - 1);
    for (int j = size >> 2; j > 0; j >>= 1) compare(j);
  }
}
}  // namespace detail

// dwte[tokens[b,t],:] += dout[b,t,:];  dwpe[t + pos_offset,:] += sum_b dout[b,t,:] (dwpe may be
// null). Vocabulary-parallel form: dwte holds rows [v0, v0 + rows) only.
//
// Deterministic without a library sort, and bitwise the host kernel's: the positions of this
// rank's rows are counted into 2^16 buckets by row (atomics), the counts scanned into bucket
// starts, and each position's key row * BT + p scattered into its bucket (atomic cursors, so in
// any order). Then one team per bucket sorts its keys (a bitonic network in place, padded to a
// power of two, with team barriers: O(n log^2 n) for a bucket of n) and adds the dout rows of
// its positions into dwte in key order, threads over columns (a thread keeps its columns from
// one position to the next, so no barrier): every row of dwte receives its positions in
// increasing order, as the host kernel adds them. The workspace persists between calls
// (detail::EmbeddingWorkspace), so nothing is allocated and nothing waits for the device; it
// replaces Kokkos::sort, whose bins were allocated (and freed, synchronising the device) on
// every call, and before that an owner scan comparing O((BT)^2) tokens (13.4 ms of an H200's
// bf16 step at BT = 16384). Calls on one execution space instance share the workspace in
// stream order. The position gradient is one work item per (t, c), adding over b in order.
//
// The token part alone is embedding_backward_tokens, which also takes the gradient's element
// (row, c) at dwte[row * row_stride + c * col_stride]: (C, 1) here, (1, ld) for a table stored
// transposed (the 3D layout's hidden x vocabulary block, core/model3d.cpp).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void embedding_backward_tokens(float* dwte,           // (rows,C) at the strides above
                               int64_t row_stride, int64_t col_stride,
                               const float* dout,     // (BT,C)
                               const int32_t* tokens, // (BT)
                               int BT, int C, int64_t v0, int64_t rows, int team_size) {
  if (BT == 0) return;
  using Workspace = detail::EmbeddingWorkspace<typename ExecSpace::memory_space>;
  constexpr int kBuckets = Workspace::kBuckets;
  Workspace& w = Workspace::at_least(BT);
  int* counts = w.counts;
  int* fill = w.fill;
  int64_t* keys = w.keys;
  Kokkos::parallel_for(
      "colossal::core::team_embedding_backward_clear", Kokkos::RangePolicy<ExecSpace>(0, kBuckets + 1),
      KOKKOS_LAMBDA(int b) {
        counts[b] = 0;
        if (b < kBuckets) fill[b] = 0;
      });
  Kokkos::parallel_for(
      "colossal::core::team_embedding_backward_count", Kokkos::RangePolicy<ExecSpace>(0, BT),
      KOKKOS_LAMBDA(int p) {
        const int64_t row = int64_t(tokens[p]) - v0;
        if (row >= 0 && row < rows) Kokkos::atomic_add(&counts[(row & (kBuckets - 1)) + 1], 1);
      });
  Kokkos::parallel_scan(
      "colossal::core::team_embedding_backward_starts",
      Kokkos::RangePolicy<ExecSpace>(0, kBuckets + 1),
      KOKKOS_LAMBDA(int b, int& sum, const bool last) {
        sum += counts[b];
        if (last) counts[b] = sum;  // inclusive of counts[0] = 0: bucket b starts at counts[b]
      });
  Kokkos::parallel_for(
      "colossal::core::team_embedding_backward_scatter", Kokkos::RangePolicy<ExecSpace>(0, BT),
      KOKKOS_LAMBDA(int p) {
        const int64_t row = int64_t(tokens[p]) - v0;
        if (row < 0 || row >= rows) return;
        const int b = int(row & (kBuckets - 1));
        keys[counts[b] + Kokkos::atomic_fetch_add(&fill[b], 1)] = row * BT + p;
      });
  Kokkos::parallel_for(
      "colossal::core::team_embedding_backward_tokens", policy<ExecSpace>(kBuckets, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const int b = team.league_rank();
        const int begin = counts[b], n = counts[b + 1] - begin;
        if (n == 0) return;
        int64_t* k = keys + begin;
        detail::team_sort(team, k, n);
        for (int j = 0; j < n; ++j) {
          float* e = dwte + (k[j] / BT) * row_stride;
          const float* d = dout + (k[j] % BT) * C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                               [&](int c) { e[c * col_stride] += d[c]; });
        }
      });
}

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void embedding_backward(float* dwte,           // (rows,C)
                        float* dwpe,           // (P,C) or null
                        const float* dout,     // (B,T,C)
                        const int32_t* tokens, // (B,T)
                        int B, int T, int C, int pos_offset, int64_t v0 = 0,
                        int64_t rows = INT64_MAX, int team_size = 0) {
  if (dwpe != nullptr) {
    Kokkos::parallel_for(
        "colossal::core::team_embedding_backward_positions",
        Kokkos::RangePolicy<ExecSpace>(0, int64_t(T) * C), KOKKOS_LAMBDA(int64_t tc) {
          const int64_t t = tc / C;
          const int c = static_cast<int>(tc % C);
          float* p = dwpe + (t + pos_offset) * C + c;
          for (int b = 0; b < B; ++b) *p += dout[(int64_t(b) * T + t) * C + c];
        });
  }
  embedding_backward_tokens<ExecSpace>(dwte, C, 1, dout, tokens, B * T, C, v0, rows, team_size);
}

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t + pos_offset,:], one work item per element (the host
// form's one item per row is too coarse for a GPU). Same vocabulary-parallel rules.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int B, int T, int C, int pos_offset, int64_t v0 = 0,
                       int64_t rows = INT64_MAX) {
  Kokkos::parallel_for(
      "colossal::core::team_embedding_forward",
      Kokkos::RangePolicy<ExecSpace>(0, int64_t(B) * T * C), KOKKOS_LAMBDA(int64_t i) {
        const int64_t bt = i / C;
        const int c = static_cast<int>(i % C);
        const int t = static_cast<int>(bt % T);
        const int64_t row = int64_t(tokens[bt]) - v0;
        const bool held = row >= 0 && row < rows;
        if (wpe != nullptr) {
          const float p = wpe[int64_t(t + pos_offset) * C + c];
          out[i] = held ? wte[row * C + c] + p : p;
        } else {
          out[i] = held ? wte[row * C + c] : 0.0f;
        }
      });
}

// The row-wise copies of core/kernels.hpp, one work item per element.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void broadcast_rows(float* out, const float* bias, int64_t N, int M, int ld) {
  Kokkos::parallel_for(
      "colossal::core::team_broadcast_rows", Kokkos::RangePolicy<ExecSpace>(0, N * M),
      KOKKOS_LAMBDA(int64_t i) { out[(i / M) * ld + i % M] = bias[i % M]; });
}

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void residual_plus_bias(float* out, const float* residual, const float* bias, int64_t N, int C) {
  Kokkos::parallel_for(
      "colossal::core::team_residual_plus_bias", Kokkos::RangePolicy<ExecSpace>(0, N * C),
      KOKKOS_LAMBDA(int64_t i) { out[i] = residual[i] + bias[i % C]; });
}

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void copy_columns(float* dst, int ld_dst, const float* src, int ld_src, int64_t rows, int cols) {
  Kokkos::parallel_for(
      "colossal::core::team_copy_columns", Kokkos::RangePolicy<ExecSpace>(0, rows * cols),
      KOKKOS_LAMBDA(int64_t i) {
        const int64_t r = i / cols;
        const int64_t c = i % cols;
        dst[r * ld_dst + c] = src[r * ld_src + c];
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void layernorm_forward<Kokkos::Cuda, float>(float* out, float* mean,
                                                                     float* rstd, const float* inp,
                                                                     const float* weight,
                                                                     const float* bias, int64_t N,
                                                                     int C, float eps,
                                                                     int team_size,
                                                                     ResidualCopy copy);
COLOSSAL_DEVICE_INSTANCE void layernorm_forward<Kokkos::Cuda, std::uint16_t>(
    std::uint16_t* out, float* mean, float* rstd, const float* inp, const float* weight,
    const float* bias, int64_t N, int C, float eps, int team_size, ResidualCopy copy);
COLOSSAL_DEVICE_INSTANCE void layernorm_backward<Kokkos::Cuda>(float* dinp, float* dweight,
                                                               float* dbias, const float* dout,
                                                               const float* inp,
                                                               const float* weight,
                                                               const float* mean, const float* rstd,
                                                               int64_t N, int C, int team_size);
COLOSSAL_DEVICE_INSTANCE void bias_backward<Kokkos::Cuda>(float* dbias, const float* dout,
                                                          int64_t N, int M, int ld, int team_size);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_forward<Kokkos::Cuda>(float* att, int64_t rows, int Tq,
                                                                   int Tk, int q_offset,
                                                                   int team_size);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, float>(
    float* datt, const float* att, int64_t rows, int Tq, int Tk, int q_offset, float scale,
    int team_size);
COLOSSAL_DEVICE_INSTANCE void causal_softmax_backward<Kokkos::Cuda, std::uint16_t>(
    float* datt, const std::uint16_t* att, int64_t rows, int Tq, int Tk, int q_offset, float scale,
    int team_size);
COLOSSAL_DEVICE_INSTANCE void cross_entropy_forward_backward<Kokkos::Cuda>(float* logits,
                                                                           float* losses,
                                                                           const int32_t* targets,
                                                                           int64_t N, int V, int ld,
                                                                           float grad_scale,
                                                                           int team_size);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_row_max<Kokkos::Cuda>(float* mx, const float* logits,
                                                                   int64_t N, int ld, int valid,
                                                                   int team_size);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_sums<Kokkos::Cuda>(float* sums, const float* logits,
                                                                const float* mx,
                                                                const int32_t* targets, int64_t N,
                                                                int ld, int valid, int64_t v0,
                                                                int team_size);
COLOSSAL_DEVICE_INSTANCE void vocab_parallel_finish<Kokkos::Cuda>(float* logits, float* losses,
                                                                  const float* mx,
                                                                  const float* sums,
                                                                  const int32_t* targets, int64_t N,
                                                                  int ld, int valid, int64_t v0,
                                                                  float grad_scale, int team_size);
COLOSSAL_DEVICE_INSTANCE void embedding_backward_tokens<Kokkos::Cuda>(
    float* dwte, int64_t row_stride, int64_t col_stride, const float* dout, const int32_t* tokens,
    int BT, int C, int64_t v0, int64_t rows, int team_size);
COLOSSAL_DEVICE_INSTANCE void embedding_backward<Kokkos::Cuda>(float* dwte, float* dwpe,
                                                               const float* dout,
                                                               const int32_t* tokens, int B, int T,
                                                               int C, int pos_offset, int64_t v0,
                                                               int64_t rows, int team_size);
COLOSSAL_DEVICE_INSTANCE void embedding_forward<Kokkos::Cuda>(float* out, const int32_t* tokens,
                                                              const float* wte, const float* wpe,
                                                              int B, int T, int C, int pos_offset,
                                                              int64_t v0, int64_t rows);
COLOSSAL_DEVICE_INSTANCE void broadcast_rows<Kokkos::Cuda>(float* out, const float* bias, int64_t N,
                                                           int M, int ld);
COLOSSAL_DEVICE_INSTANCE void residual_plus_bias<Kokkos::Cuda>(float* out, const float* residual,
                                                               const float* bias, int64_t N, int C);
COLOSSAL_DEVICE_INSTANCE void copy_columns<Kokkos::Cuda>(float* dst, int ld_dst, const float* src,
                                                         int ld_src, int64_t rows, int cols);
#endif

}  // namespace colossal::core::team
