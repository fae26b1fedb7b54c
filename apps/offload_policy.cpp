#include "apps/offload_policy.hpp"

#include <mpi.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "apps/memory_fit.hpp"
#include "core/memory.hpp"
#include "parallel/comm_choice.hpp"

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace colossal::apps {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The device's bytes of the worst rank under `config` (everything but the offloaded category),
// and world rank 0's whole inference model (2d / 2.5d / 3d, while it samples or scores:
// whole_model_bytes; nothing of it offloads), which its GPU holds once beside the ranks' plans.
struct Need {
  double bytes = 0.0;
  planner::MemoryPrediction plan;
  double whole = 0.0;
  // What the GPU of `share` ranks holding world rank 0 holds at most.
  double on_device(int share) const { return bytes * share + whole; }
};

Need device_need(const io::Config& config) {
  Need need;
  for (int r = 0; r < config.parallel.world_size(); ++r) {
    const planner::MemoryPrediction m = rank_memory(config, r);
    if (m.device() > need.bytes || r == 0) need = {m.device(), m};
  }
  need.whole = whole_model_bytes(config, MemoryPool::device, /*device_build=*/true);
  return need;
}

std::string device_categories(const planner::MemoryPrediction& m) {
  std::string out;
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    const auto cat = core::MemCategory(c);
    if (cat == core::MemCategory::offloaded || m[cat] == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(core::category_name(cat)) + " " +
           core::format_bytes(m[cat]);
  }
  return out;
}

}  // namespace

std::string OffloadDecision::describe() const {
  if (capacity <= 0) {
    return "nothing (no device limit: a CPU build keeps everything in host memory)";
  }
  const int chunks = core::offload_chunks(fraction);
  const int param_chunks = core::offload_chunks(params_fraction);
  const std::string what =
      params && param_chunks == kOffloadChunks ? "optimizer states and parameters"
      : params ? "optimizer states and " + std::to_string(param_chunks) + " of " +
                     std::to_string(kOffloadChunks) +
                     " chunks of each rank's parameter shard "
                     "(parallel.zero.offload.params_fraction " +
                     core::format_number(params_fraction) + ")"
      : !optimizer          ? "nothing"
      : chunks == kOffloadChunks ? "optimizer states"
                            : std::to_string(chunks) + " of " + std::to_string(kOffloadChunks) +
                                  " chunks of each rank's optimizer states "
                                  "(parallel.zero.offload.optimizer_fraction " +
                                  core::format_number(fraction) + ")";
  return what + " to the host: the device holds " + core::format_bytes(device_bytes) + " of " +
         core::format_bytes(capacity);
}

void OffloadDecision::apply(io::Config& config) const {
  config.parallel.offload_optimizer = optimizer;
  config.parallel.offload_params = params;
  config.parallel.offload_fraction = fraction;
  config.parallel.offload_params_fraction = params_fraction;
}

OffloadDecision decide_offload(const io::Config& config, double capacity, int ranks_per_device) {
  OffloadDecision d;
  d.capacity = capacity;
  io::Config c = config;
  c.parallel.offload_optimizer = c.parallel.offload_params = false;
  c.parallel.offload_fraction = c.parallel.offload_params_fraction = 1.0;
  if (capacity <= 0) return d;
  const int share = std::max(1, ranks_per_device);
  const bool d1 = config.parallel.tensor_mode == core::TensorMode::d1;
  const int stage = config.parallel.zero_stage;
  Need need;
  std::string budget_error;  // rotor's memory_budget unmet by the last candidate tried
  // Whether the device holds the worst rank's plan with `chunks` of kOffloadChunks of every
  // shard's optimizer state on the host (and `params` of its parameter shard's). A
  // checkpointing.memory_budget that no schedule meets (apps::activation_plan throws) is a
  // candidate that does not fit: on a GPU the offloaded bytes leave the budget, so more offload
  // may meet it.
  auto fits = [&](int chunks, int params) {
    c.parallel.offload_optimizer = chunks > 0;
    c.parallel.offload_fraction = core::offload_fraction(chunks);
    c.parallel.offload_params = params > 0;
    c.parallel.offload_params_fraction = core::offload_fraction(params);
    try {
      need = device_need(c);
    } catch (const std::runtime_error& e) {
      budget_error = e.what();
      return false;
    }
    budget_error.clear();
    return need.on_device(share) <= capacity;
  };
  auto decided = [&](int chunks, int params) {
    fits(chunks, params);  // the need of the decision itself
    d.optimizer = chunks > 0;
    d.fraction = core::offload_fraction(chunks);
    d.params = params > 0;
    d.params_fraction = core::offload_fraction(params);
    d.device_bytes = need.on_device(share);
    return d;
  };
  // In order: nothing; the fewest chunks of the optimizer states (ZeRO >= 1, the device's need
  // falls as chunks move, so a bisection finds them); with all of them, the fewest chunks of the
  // parameter shards (ZeRO 3, 1d).
  if (fits(0, 0)) return decided(0, 0);
  int tried = 0;  // 0 none, 1 every optimizer chunk, 2 also the parameters
  if (stage >= 1) {  // 2d / 2.5d / 3d too (ZeRO 1-2)
    tried = 1;
    if (fits(kOffloadChunks, 0)) {
      return decided(core::fewest_offload_chunks([&](int k) { return fits(k, 0); }), 0);
    }
  }
  if (d1 && stage == 3) {
    tried = 2;
    if (fits(kOffloadChunks, kOffloadChunks)) {
      return decided(kOffloadChunks, core::fewest_offload_chunks(
                                         [&](int k) { return fits(kOffloadChunks, k); }));
    }
  }
  // Not even the largest offload met the schedule's budget: that is the error to fix.
  if (!budget_error.empty()) {
    throw std::invalid_argument("parallel.zero.offload.policy: auto: " + budget_error);
  }
  std::string more;
  if (stage == 0) {
    more = d1 ? "; parallel.zero.stage >= 1 would let the optimizer states move, 3 the "
                "parameters too"
              : "; parallel.zero.stage >= 1 would let the optimizer states move";
  } else if (!d1) {
    more = "; parallel.tensor.mode " +
           std::string(core::tensor_mode_name(config.parallel.tensor_mode)) +
           " cannot offload parameters (ZeRO 3 runs in 1d only)";
  } else if (stage < 3) {
    more = "; parallel.zero.stage: 3 would let the parameters move too";
  }
  const std::string offloaded = tried == 0   ? "without offload"
                                : tried == 1 ? "with the optimizer states offloaded"
                                             : "with optimizer states and parameters offloaded";
  throw std::invalid_argument(
      "parallel.zero.offload.policy: auto: the model does not fit on the device even " + offloaded +
      ": the worst rank keeps " + device_categories(need.plan) + " (" +
      core::format_bytes(need.bytes) + (share > 1 ? " x " + std::to_string(share) + " ranks" : "") +
      ")" +
      (need.whole > 0 ? " and world rank 0 the whole model it samples or scores eval.choices "
                        "with (" + core::format_bytes(need.whole) + "; sample.tokens: 0 and no "
                        "eval.choices leave it out)"
                      : std::string()) +
      " on a device of " + core::format_bytes(capacity) +
      " (hardware.device_memory_gib or the GPU's free memory" +
      (device_resident_build() ? ", less " + core::format_bytes(kDeviceRuntimeBytesPerRank) +
                                     " a rank for cuBLAS and NCCL"
                               : std::string()) +
      ")" + more +
      "; or shard further (parallel.data, parallel.tensor.size, parallel.pipeline.size) or set "
      "checkpointing.policy");
}

double device_capacity(const io::Config& config, int* ranks_per_device) {
  if (ranks_per_device != nullptr) *ranks_per_device = 1;
  const double given = config.hardware.device_memory_gib * kGiB;
#ifdef COLOSSAL_HAVE_CUDA
  if (device_resident_build()) {
    // The ranks sharing each GPU (collective: every rank asks, whatever the key says), so that
    // hardware.device_memory_gib, a GPU's memory, is divided among them too.
    const int share = parallel::gather_comm_facts().ranks_per_gpu;
    if (ranks_per_device != nullptr) *ranks_per_device = share;
    double least = given;
    if (given <= 0) {
      double free_bytes = 0.0;
      std::size_t f = 0, total = 0;
      if (cudaMemGetInfo(&f, &total) == cudaSuccess) free_bytes = double(f);
      else cudaGetLastError();
      MPI_Allreduce(&free_bytes, &least, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    }
    // What the ranks' plans may fill: the GPU's memory (the key's, or the least free) less what
    // each sharing rank needs beside its plan (cuBLAS, NCCL, operand buffers), as
    // check_memory_fits keeps it. (A byte, not 0, when nothing is left: 0 means no limit.)
    return least > 0 ? std::max(1.0, least - share * kDeviceRuntimeBytesPerRank) : 0.0;
  }
#endif
  return std::max(given, 0.0);
}

io::Config apply_offload_policy(const io::Config& config, std::FILE* log) {
  if (config.parallel.offload_policy != "auto") return config;
  int share = 1;
  const double capacity = device_capacity(config, &share);
  const OffloadDecision d = decide_offload(config, capacity, share);
  io::Config out = config;
  d.apply(out);
  if (log != nullptr) {
    std::fprintf(log, "offload (parallel.zero.offload.policy: auto): %s\n", d.describe().c_str());
  }
  return out;
}

}  // namespace colossal::apps
