#include "apps/memory_fit.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <Kokkos_Core.hpp>

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "apps/layout.hpp"
#include "apps/trainer.hpp"
#include "core/layers.hpp"
#include "core/memory.hpp"
#include "parallel/local_device.hpp"
#include "parallel/mesh.hpp"
#include "planner/search.hpp"

namespace colossal::apps {

planner::MemoryPrediction rank_memory(const io::Config& config, int rank, bool inference,
                                      bool decode) {
  const auto& p = config.parallel;
  const parallel::DeviceMesh mesh(parallel::MeshShape{
      .data = p.data, .pipeline = p.pipeline, .tensor = p.tensor, .sequence = p.sequence});
  const int stage = mesh.coord_of(rank).pipeline;
  if (inference) {
    const io::Config c = inference_config(config);
    const ActivationPlan plan = inference_activation_plan(c);
    return planner::predict_memory(c.model,
                                   rank_layout(c, stage, plan.keep, false, true, decode));
  }
  // As the trainer derives it: the schedule from the hardware spec as written.
  const ActivationPlan plan = activation_plan(config, stage, hardware_spec(config, 0));
  return planner::predict_memory(config.model,
                                 rank_layout(config, stage, plan.keep, plan.selective));
}

double host_available_bytes(std::string* source) {
  if (const char* env = std::getenv("COLOSSAL_HOST_MEMORY_BYTES"); env != nullptr && *env) {
    char* end = nullptr;
    const double bytes = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(bytes > 0)) {
      throw std::invalid_argument(std::string("memory: COLOSSAL_HOST_MEMORY_BYTES='") + env +
                                  "' is not a positive number of bytes (it caps the memory a "
                                  "node may use); unset it, or set e.g. 8e9");
    }
    if (source) *source = "COLOSSAL_HOST_MEMORY_BYTES";
    return bytes;
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      if (source) *source = "MemAvailable in /proc/meminfo";
      return kib * 1024.0;
    }
  }
  return 0.0;
}

bool device_resident_build() {
  return !Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                     Kokkos::DefaultExecutionSpace::memory_space>::accessible;
}

double pool_bytes(const planner::MemoryPrediction& m, MemoryPool pool, bool device_build) {
  if (!device_build) return pool == MemoryPool::host ? m.total() : 0.0;
  return pool == MemoryPool::device ? m.device() : m[core::MemCategory::offloaded];
}

double whole_model_bytes(const io::Config& config, MemoryPool pool, bool device_build,
                         const MemoryUse& use) {
  if (config.parallel.tensor_mode == core::TensorMode::d1) return 0.0;
  double bytes = 0.0;
  if (use.inference ? use.samples : config.sample.tokens > 0) {
    bytes = pool_bytes(rank_memory(one_rank_config(config, 1), 0, true, use.decode), pool,
                       device_build);
  }
  if (use.inference ? use.scores : !config.eval.choices.empty()) {
    const io::Config scorer = one_rank_config(config, config.train.micro_batch);
    bytes = std::max(bytes, pool_bytes(rank_memory(scorer, 0, true, false), pool, device_build));
  }
  return bytes;
}

namespace {

// What a rank needs beyond its plan in `pool` (kRuntimeBytesPerRank, kDeviceRuntimeBytesPerRank).
double runtime_bytes(MemoryPool pool, bool device_build) {
  if (pool == MemoryPool::host) return kRuntimeBytesPerRank;
  return device_build ? kDeviceRuntimeBytesPerRank : 0.0;
}

// The categories of `m` that `pool` holds, with their total ("params 1.2 GiB, ...").
std::string pool_format(const planner::MemoryPrediction& m, MemoryPool pool, bool device_build) {
  if (!device_build) return m.format();
  planner::MemoryPrediction only = m;
  for (int k = 0; k < int(core::MemCategory::count); ++k) {
    const bool offloaded = core::MemCategory(k) == core::MemCategory::offloaded;
    if (offloaded != (pool == MemoryPool::host)) only.bytes[std::size_t(k)] = 0.0;
  }
  return only.format();
}

// What the node's ranks need under `config`, and the plan of the rank that needs the most.
struct NodeNeed {
  double bytes = 0.0;
  planner::MemoryPrediction largest;
  int largest_rank = 0;
  double whole_model = 0.0;  // world rank 0's one-rank trainer (whole_model_bytes), when here
};

NodeNeed node_need(const io::Config& config, const std::vector<int>& ranks, MemoryPool pool,
                   bool device_build, const MemoryUse& use) {
  NodeNeed need;
  if (std::find(ranks.begin(), ranks.end(), 0) != ranks.end()) {
    need.whole_model = whole_model_bytes(config, pool, device_build, use);
    need.bytes += need.whole_model;
  }
  // Ranks of one pipeline stage hold the same bytes: cost each stage once.
  std::vector<std::pair<int, planner::MemoryPrediction>> by_stage;
  const auto& p = config.parallel;
  const int per_stage = p.data * p.tensor * p.sequence;
  for (int rank : ranks) {
    const int stage = rank / std::max(per_stage, 1);
    auto it = std::find_if(by_stage.begin(), by_stage.end(),
                           [&](const auto& s) { return s.first == stage; });
    if (it == by_stage.end()) {
      by_stage.emplace_back(stage, rank_memory(config, rank, use.inference, use.decode));
      it = by_stage.end() - 1;
    }
    const double bytes = pool_bytes(it->second, pool, device_build);
    need.bytes += bytes + runtime_bytes(pool, device_build);
    if (bytes > pool_bytes(need.largest, pool, device_build)) {
      need.largest = it->second;
      need.largest_rank = rank;
    }
  }
  return need;
}

// The config with one --set override, validated as the command line would be; nullopt when the
// schema refuses it (e.g. a micro-batch that does not divide the global batch).
std::optional<io::Config> with_override(const io::Config& config, const std::string& set) {
  try {
    return io::parse_config(config.text, config.source, {set});
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string memory_shortfall(const io::Config& config, const std::vector<int>& ranks,
                             double available, const std::string& node,
                             const std::string& available_source, MemoryPool pool,
                             bool device_build, const MemoryUse& use) {
  if (available <= 0.0 || ranks.empty()) return "";
  const bool inference = use.inference;
  const NodeNeed need = node_need(config, ranks, pool, device_build, use);
  if (need.bytes <= available) return "";

  // One-key changes that would fit, nearest first within each key.
  std::vector<std::string> fits;
  const auto try_set = [&](const std::string& set) {
    const std::optional<io::Config> variant = with_override(config, set);
    if (!variant) return false;
    double bytes = 0.0;
    try {
      bytes = node_need(*variant, ranks, pool, device_build, use).bytes;
    } catch (const std::exception&) {
      return false;  // e.g. a rotor budget the variant cannot meet
    }
    if (bytes > available) return false;
    fits.push_back("--set " + set + " (" + core::format_bytes(bytes) + ")");
    return true;
  };
  const auto& cp = config.checkpointing;
  using core::CheckpointPolicy;
  if (cp.policy != CheckpointPolicy::full && !inference) {  // inference keeps one block
    if (cp.policy == CheckpointPolicy::none || cp.policy == CheckpointPolicy::selective) {
      if (!try_set("checkpointing.policy=sqrt")) try_set("checkpointing.policy=full");
    } else {
      try_set("checkpointing.policy=full");
    }
  }
  // The fused attention keeps one value per row of the (B,H,T,T) probabilities (not with ring
  // attention, which the schema refuses, nor where this build cannot run the head size).
  if (!config.model.fused_attention &&
      core::fused_attention_unsupported(config.model.hidden / config.model.heads,
                                        bf16_operands(config))
          .empty()) {
    try_set("model.fused_attention=true");
  }
  // Inference holds no gradients or moments: only stage 3's sharded parameters save memory.
  for (int stage = inference ? 3 : config.parallel.zero_stage + 1; stage <= 3; ++stage) {
    if (stage == config.parallel.zero_stage) break;
    if (try_set("parallel.zero.stage=" + std::to_string(stage))) break;
  }
  for (int mb = config.train.micro_batch / 2; mb >= 1; mb /= 2) {
    if (try_set("train.micro_batch=" + std::to_string(mb))) break;
  }
  // 2d / 2.5d / 3d: no end-of-run sample, no whole model on world rank 0 for it.
  if (need.whole_model > 0.0 && !inference && config.sample.tokens > 0) try_set("sample.tokens=0");

  std::ostringstream out;
  out << "memory: the " << ranks.size() << " rank" << (ranks.size() == 1 ? "" : "s") << " of this "
      << "layout on node " << node << " need " << core::format_bytes(need.bytes)
      << " but it has " << core::format_bytes(available) << " (" << available_source
      << "); nothing was allocated. The memory plan of rank " << need.largest_rank
      << ", the largest: " << pool_format(need.largest, pool, device_build);
  if (pool == MemoryPool::host) {
    out << " (plus " << core::format_bytes(kRuntimeBytesPerRank) << " a rank for the runtime)";
  } else if (device_build) {
    out << " (plus " << core::format_bytes(kDeviceRuntimeBytesPerRank)
        << " a rank kept free for cuBLAS, NCCL and the products' operand buffers)";
  }
  if (need.whole_model > 0.0) {
    out << "; and world rank 0 builds the whole model in a one-rank trainer to sample or score "
           "eval.choices ("
        << core::format_bytes(need.whole_model) << ", counted above)";
  }
  out << ". ";
  if (!fits.empty()) {
    out << "What would fit: ";
    for (std::size_t i = 0; i < fits.size(); ++i) out << (i ? ", " : "") << fits[i];
    if (!inference) {
      out << "; or search every layout and checkpoint schedule with 'colossal_plan "
          << config.source << " --gpus " << config.parallel.world_size() << "'";
    }
  } else if (inference) {
    out << "No change of model.fused_attention, parallel.zero.stage or train.micro_batch alone "
           "fits: shard the parameters over more ranks ("
        << (config.parallel.tensor_mode == core::TensorMode::d1
                ? "parallel.tensor, parallel.pipeline, or parallel.data with parallel.zero.stage: 3"
                : "a larger tensor grid, or parallel.pipeline")
        << "), or use a smaller model";
  } else {
    out << "No change of checkpointing.policy, model.fused_attention, parallel.zero.stage or "
           "train.micro_batch alone fits: search every layout with 'colossal_plan "
        << config.source << " --gpus N' for more ranks, or use a smaller model";
  }
  return out.str();
}

void check_memory_fits(const io::Config& config, const MemoryUse& use) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local = 0, locals = 1;
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &locals);
  std::vector<int> ranks(std::size_t(locals), 0);
  MPI_Gather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, 0, node);
  // On a device build: each rank's current GPU (parallel::select_local_device chose it) and its
  // free memory, so the ranks sharing a GPU are summed against it. GPUs are told apart by UUID:
  // ordinals differ per process under --gpus-per-task=1 (parallel/local_device.hpp).
  parallel::GpuIdentity gpu;
  double free_bytes = 0.0;
#ifdef COLOSSAL_HAVE_CUDA
  if (device_resident_build()) {
    gpu = parallel::current_gpu_identity();
    std::size_t free_now = 0, total_bytes = 0;
    if (gpu.uuid.empty() || cudaMemGetInfo(&free_now, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      gpu = {};
    }
    free_bytes = double(free_now);
  }
#endif
  const std::vector<parallel::GpuIdentity> gpus = parallel::all_gather_gpu_identities(node, gpu);
  std::vector<double> frees(std::size_t(locals), 0.0);
  MPI_Gather(&free_bytes, 1, MPI_DOUBLE, frees.data(), 1, MPI_DOUBLE, 0, node);
  MPI_Comm_free(&node);

  std::string message;
  if (local == 0) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    std::string source;
    try {
      const double available = host_available_bytes(&source);
      message = memory_shortfall(config, ranks, available, host, source, MemoryPool::host,
                                 device_resident_build(), use);
      std::vector<std::string> uuids;
      for (const parallel::GpuIdentity& id : gpus) uuids.push_back(id.uuid);
      for (const std::vector<int>& group : parallel::group_by_gpu(uuids)) {
        if (!message.empty()) break;
        std::vector<int> sharing;
        double least_free = frees[std::size_t(group.front())];
        for (int l : group) {
          sharing.push_back(ranks[std::size_t(l)]);
          least_free = std::min(least_free, frees[std::size_t(l)]);
        }
        const parallel::GpuIdentity& id = gpus[std::size_t(group.front())];
        message = memory_shortfall(config, sharing, least_free,
                                   std::string(host) + " GPU " + std::to_string(id.ordinal) +
                                       " (" + id.bus_id + ")",
                                   "free device memory, cudaMemGetInfo", MemoryPool::device,
                                   device_resident_build(), use);
      }
    } catch (const std::invalid_argument& e) {
      message = e.what();
    } catch (const std::exception&) {
      // A layout the cost model cannot price (an infeasible rotor budget, say) is reported by
      // the trainer itself, with its own message, on every rank.
      message.clear();
    }
  }
  // The first node that cannot hold its ranks speaks for all, so every rank fails alike.
  const int mine = message.empty() ? size : rank;
  int first = size;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == size) return;
  int length = int(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first, MPI_COMM_WORLD);
  message.resize(std::size_t(length));
  MPI_Bcast(message.data(), length, MPI_CHAR, first, MPI_COMM_WORLD);
  throw CollectiveError(message);
}

}  // namespace colossal::apps
