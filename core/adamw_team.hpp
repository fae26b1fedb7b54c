// Fused AdamW for device-resident state: one kernel per update over every tensor of the window
// (moments, bias correction, decoupled weight decay and the parameter update together), the same
// float arithmetic as AdamW::update in core/optimizer.cpp, instead of one launch per tensor.
//
// The window's tensors (AdamW's segments: state range, flat offset, decay by role) are cut once
// into blocks of at most kAdamWBlock elements that never straddle two tensors; the block table
// lives in the execution space's memory (AdamWBlockTable), and the kernel runs one team per
// block, threads over its elements.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/kernels_team.hpp"
#include "core/model_spec.hpp"
#include "core/optimizer.hpp"

namespace colossal::core::team {

constexpr int64_t kAdamWBlock = 4096;

struct AdamWBlock {
  int64_t begin, end;        // state positions [begin, end)
  int64_t param_shift;       // buffer index of params = state position + shift
  int64_t grad_shift;        // the same for grads
  int decay;                 // 1: weight decay applies (matrices, embeddings)
};

// The per-update scalars, computed on the host exactly as AdamW::update does.
struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay, correction1, correction2, grad_scale;
};

inline AdamWScalars adamw_scalars(const AdamWParams& hp, int64_t step, float grad_scale) {
  return {static_cast<float>(hp.lr),
          static_cast<float>(hp.beta1),
          static_cast<float>(hp.beta2),
          static_cast<float>(hp.eps),
          static_cast<float>(hp.weight_decay),
          static_cast<float>(1.0 - std::pow(hp.beta1, double(step))),
          static_cast<float>(1.0 - std::pow(hp.beta2, double(step))),
          grad_scale};
}

// The blocks of the flat ranges `pieces` (state order, as AdamW's pieces constructor), with
// params and grads indexed by state position (flat == false) or by flat offset (true).
inline std::vector<AdamWBlock> adamw_blocks(
    const std::vector<ParamSpec>& table,
    const std::vector<std::pair<std::size_t, std::size_t>>& pieces, bool params_flat,
    bool grads_flat, int64_t block = kAdamWBlock) {
  std::vector<AdamWBlock> blocks;
  std::size_t state = 0;
  for (const auto& [begin, end] : pieces) {
    for (const auto& p : table) {
      const std::size_t lo = std::max(p.offset, begin), hi = std::min(p.offset + p.count, end);
      if (lo >= hi) continue;
      const int64_t s0 = int64_t(state + lo - begin), count = int64_t(hi - lo);
      const int64_t shift = int64_t(lo) - s0;
      for (int64_t b = 0; b < count; b += block) {
        blocks.push_back({s0 + b, s0 + std::min(count, b + block), params_flat ? shift : 0,
                          grads_flat ? shift : 0, p.decay() ? 1 : 0});
      }
    }
    state += end - begin;
  }
  return blocks;
}

// A block table copied once into ExecSpace's memory.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
class AdamWBlockTable {
 public:
  explicit AdamWBlockTable(const std::vector<AdamWBlock>& blocks)
      : view_("colossal::core::adamw_blocks", blocks.size()) {
    auto host = Kokkos::create_mirror_view(view_);
    for (std::size_t i = 0; i < blocks.size(); ++i) host(i) = blocks[i];
    // On the kernels' stream: deep_copy without an instance fences the whole device in Kokkos
    // 3.4, the copy and NCCL streams too (built on the first update, mid-step).
    const ExecSpace exec;
    Kokkos::deep_copy(exec, view_, host);
    exec.fence();
  }
  const AdamWBlock* data() const { return view_.data(); }
  int size() const { return static_cast<int>(view_.extent(0)); }

 private:
  Kokkos::View<AdamWBlock*, typename ExecSpace::memory_space> view_;
};

// params[i] -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * params[i]) for every element of every
// block, m and v (state order) updated first from grad * grad_scale. `blocks` must be readable
// by ExecSpace (an AdamWBlockTable's data(), or host memory on a host backend).
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
void adamw_update(float* params, const float* grads, float* m, float* v,
                  const AdamWBlock* blocks, int nblocks, const AdamWScalars& s,
                  int team_size = 0) {
  const AdamWScalars k = s;
  Kokkos::parallel_for(
      "colossal::core::team_adamw", policy<ExecSpace>(nblocks, team_size),
      KOKKOS_LAMBDA(const Member<ExecSpace>& team) {
        const AdamWBlock blk = blocks[team.league_rank()];
        const float wd = blk.decay ? k.weight_decay : 0.0f;
        Kokkos::parallel_for(
            Kokkos::TeamThreadRange(team, blk.begin, blk.end), [&](int64_t i) {
              const float grad = grads[i + blk.grad_shift] * k.grad_scale;
              const float mi = k.beta1 * m[i] + (1.0f - k.beta1) * grad;
              const float vi = k.beta2 * v[i] + (1.0f - k.beta2) * grad * grad;
              m[i] = mi;
              v[i] = vi;
              const float m_hat = mi / k.correction1;
              const float v_hat = vi / k.correction2;
              float& w = params[i + blk.param_shift];
              w -= k.lr * (m_hat / (kmath::sqrt(v_hat) + k.eps) + wd * w);
            });
      });
}

// The CUDA instances of the kernels above live in one translation unit, core/device_kernels.cpp
// (see COLOSSAL_DEVICE_INSTANCE in core/kokkos_compat.hpp).
#ifdef KOKKOS_ENABLE_CUDA
COLOSSAL_DEVICE_INSTANCE void adamw_update<Kokkos::Cuda>(float* params, const float* grads,
                                                         float* m, float* v,
                                                         const AdamWBlock* blocks, int nblocks,
                                                         const AdamWScalars& s, int team_size);
#endif

}  // namespace colossal::core::team
