// parallel.zero.offload.policy: auto. At start-up, from the memory plan (the planner's bytes per
// rank, which equal what the tracker counts: apps/memory_fit.hpp's rank_memory) and the device's
// capacity, decide what ZeRO moves to pinned host memory: nothing when the plan fits, else the
// optimizer states chunk by chunk (offload.optimizer with offload.optimizer_fraction: the fewest
// of kOffloadChunks equal chunks of every rank's optimizer state, the last ones in state order,
// as Colossal-AI's Gemini places chunks), then, with all of them moved, the parameter shards'
// chunks the same way (ZeRO 3: offload.params with offload.params_fraction): the smallest step
// that fits.
#pragma once

#include <cstdio>
#include <string>

#include "core/optimizer.hpp"
#include "io/config.hpp"

namespace colossal::apps {

using core::kOffloadChunks;  // each rank's optimizer state moves in 64ths

struct OffloadDecision {
  bool optimizer = false;     // parallel.zero.offload.optimizer
  double fraction = 1.0;      // parallel.zero.offload.optimizer_fraction (chunks / kOffloadChunks)
  bool params = false;        // parallel.zero.offload.params
  double params_fraction = 1.0;  // parallel.zero.offload.params_fraction
  double device_bytes = 0.0;  // what the worst rank then keeps on the device, times sharing
  double capacity = 0.0;      // the device's bytes it was compared with (0: no limit)
  std::string describe() const;  // one line for the start-up log
  void apply(io::Config& config) const;  // the four parallel.zero.offload keys it decided
};

// The pure decision for a device of `capacity` bytes shared by `ranks_per_device` ranks
// (capacity 0: no device limit, nothing offloaded). Throws std::invalid_argument when even the
// largest offload the config allows does not fit: the device's categories of the worst rank, the
// capacity, and which key would allow more (parallel.zero.stage).
OffloadDecision decide_offload(const io::Config& config, double capacity, int ranks_per_device = 1);

// The capacity offload.policy: auto plans for. On a device build (collective over
// MPI_COMM_WORLD): hardware.device_memory_gib when set, else the smallest free memory of any
// rank's GPU, less kDeviceRuntimeBytesPerRank for each rank sharing the GPU
// (`ranks_per_device`). On a CPU build hardware.device_memory_gib as it is, else 0 (the device
// is the host: no limit).
double device_capacity(const io::Config& config, int* ranks_per_device);

// Start-up, on every rank alike (collective): with policy auto, the config with the offload
// flags and fractions decided, the decision printed to `log` (rank 0's; null elsewhere); with static, unchanged.
io::Config apply_offload_policy(const io::Config& config, std::FILE* log);

}  // namespace colossal::apps
