// AdamW with decoupled weight decay, global-norm gradient clipping, and the learning-rate schedule
// (linear warm-up, then cosine decay to min_lr).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/model_spec.hpp"

namespace colossal::core {

struct AdamWParams {
  double lr = 3.0e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;
};

struct LrSchedule {
  double max_lr = 3.0e-4;
  double min_lr = 3.0e-5;
  int64_t warmup = 100;
  int64_t total = 1000;
  // Learning rate of optimizer step `step` (0-based): max_lr*(step+1)/warmup while step < warmup,
  // then min_lr + (max_lr-min_lr)*(1+cos(pi*progress))/2 with progress = (step-warmup)/(total-warmup)
  // clamped to [0, 1].
  double at(int64_t step) const;
};

// sum_i x[i]^2 and x[i] = 0 over a whole flat buffer, on every host thread when Kokkos is Serial.
double sum_of_squares(const float* x, std::size_t n);
void zero(float* x, std::size_t n);

// Multiplier that brings the global gradient norm down to max_norm (1 when it is already below,
// or when max_norm <= 0).
double clip_coefficient(double grad_norm, double max_norm);

// ZeRO offload of a share of the optimizer state (parallel.zero.offload.optimizer_fraction): of a
// rank's `states` moment elements, how many live on the host. The last ones in state order, a
// multiple of 16 floats (the shards' alignment) rounded up from fraction * states, at most all;
// fraction >= 1 is all of them, fraction <= 0 none. The executor (zero::ShardedAdamW) and the
// planner's memory closed forms (planner/cost_model.cpp) both split by it.
std::size_t offloaded_states(std::size_t states, double fraction);
// offload.policy: auto and the planner's search move each rank's optimizer state in 64ths (for
// gpt2-124m on one rank, chunks of 1.9 M states, 7.8 MB a moment).
inline constexpr int kOffloadChunks = 64;
// The optimizer_fraction of `chunks` 64ths (0 chunks: 1, the key's default), and back.
double offload_fraction(int chunks);
int offload_chunks(double fraction);
// The fewest chunks in [1, kOffloadChunks] for which fits(chunks) holds, given that it holds at
// kOffloadChunks and keeps holding as chunks are added (each moved chunk only frees device
// memory): a bisection of 6 calls.
int fewest_offload_chunks(const std::function<bool(int)>& fits);

// The optimizer state for the window [begin, end) of one flat parameter buffer described by a
// parameter table: the whole buffer on one rank, a ZeRO shard otherwise. Weight decay is applied by
// rule (ParamSpec::decay: matrices and embeddings, not biases or layernorm), never by position.
// Elements of the window outside every tensor (alignment padding) are never touched.
class AdamW {
 public:
  AdamW(const std::vector<ParamSpec>& table, std::size_t flat_size, MemoryTracker& tracker)
      : AdamW(table, 0, flat_size, tracker) {}
  // on_host: moments in host memory (category `offloaded`) and the update on host threads, for
  // ZeRO offload; params and grads given to update() must then be host memory too.
  AdamW(const std::vector<ParamSpec>& table, std::size_t begin, std::size_t end,
        MemoryTracker& tracker, bool on_host = false);
  // The state for several flat ranges [begin, end) (ZeRO-2/3: this rank's slice of every unit),
  // stored one after the other in the given order ("state order").
  AdamW(const std::vector<ParamSpec>& table,
        const std::vector<std::pair<std::size_t, std::size_t>>& pieces, MemoryTracker& tracker,
        bool on_host = false);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // How update() indexes a buffer: by state position (the window's or pieces' elements packed in
  // order, as m and v are) or by flat offset (a whole flat buffer).
  enum class Indexing { state, flat };

  // One update of the window: params[i] -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * params[i]),
  // with the gradient multiplied by grad_scale first (clipping). Both pointers address the
  // window's first element. `step` counts updates from 1 (bias correction).
  void update(float* params, const float* grads, const AdamWParams& hp, int64_t step,
              float grad_scale, Indexing params_at = Indexing::state,
              Indexing grads_at = Indexing::state);
  // The same update, returning without waiting for a device's kernels (the caller fences before
  // it reads the parameters); in host memory it is update(). ZeRO's partial offload runs the
  // host's share while the device's runs (zero::ShardedAdamW::step).
  void start_update(float* params, const float* grads, const AdamWParams& hp, int64_t step,
                    float grad_scale, Indexing params_at = Indexing::state,
                    Indexing grads_at = Indexing::state);

  // The window (begin()/end() span the pieces' range), and the number of state elements.
  std::size_t begin() const { return begin_; }
  std::size_t end() const { return end_; }
  std::size_t size() const { return m_.size(); }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }

 private:
  struct Segment {
    std::size_t begin, count;  // in state order
    std::size_t flat;          // flat offset of the first element
    bool decay;
    // From a state position to the index of a buffer indexed `at`.
    std::ptrdiff_t shift(Indexing at) const {
      return at == Indexing::flat ? std::ptrdiff_t(flat) - std::ptrdiff_t(begin) : 0;
    }
  };
  void add_segments(const std::vector<ParamSpec>& table, std::size_t begin, std::size_t end,
                    std::size_t state_offset);
  std::vector<Segment> segments_;
  std::size_t begin_, end_;
  bool on_host_;
  DeviceArray<float> m_, v_;
  // Where the update runs on a device's threads (not the host's): the segments cut into blocks of
  // team::kAdamWBlock states in the execution space's memory, one table per (params, grads)
  // indexing, made on its first update (core/adamw_team.hpp's fused kernel: one launch per update
  // instead of one per tensor).
  struct DeviceBlocks;
  std::unique_ptr<DeviceBlocks> device_blocks_[4];
  const DeviceBlocks& device_blocks(Indexing params_at, Indexing grads_at);
};

}  // namespace colossal::core
