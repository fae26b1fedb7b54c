// Memory up front: before colossal_train allocates anything, the cost model's bytes for every rank
// of a node (planner::predict_memory, which equals what the tracker will count) are compared with
// the memory that node has, so a layout that cannot fit stops at once with its memory plan and
// the nearest one-key changes that would fit, instead of a bare std::bad_alloc or the kernel's
// out-of-memory killer minutes into the run.
#pragma once

#include <string>
#include <vector>

#include "io/config.hpp"
#include "planner/cost_model.hpp"

namespace colossal::apps {

// Bytes a run's process needs beyond what the tracker counts (code, MPI and HDF5 buffers, the
// allocator's slack): measured peak RSS minus tracked peak is 45 MiB for the quickstart.
constexpr double kRuntimeBytesPerRank = 64.0 * 1024 * 1024;
// Device memory a rank of a device build needs beyond what the tracker counts, kept free when a
// plan is checked against a GPU (check_memory_fits) or filled by a policy (device_capacity):
// cuBLAS's handle and workspace, NCCL's communicators (a few buffers per channel and peer), the
// products' rounded or widened operands (train.precision: bf16; about 200 MiB for gpt2-124m at
// B = 16, T = 1024) and the kernels' grow-only workspaces. The run's closing "device memory"
// line reports what was outside the tracker, to check this against.
constexpr double kDeviceRuntimeBytesPerRank = 512.0 * 1024 * 1024;

// What the tracker will count for world rank `rank` of the config's layout (its pipeline stage's
// chunks, its activation-checkpoint schedule, its ZeRO and tensor shards).
// `inference`: an inference trainer's (colossal_eval, colossal_generate: inference_config and
// inference_activation_plan, apps/layout.hpp).
// `decode`: with colossal_generate's incremental-decoding state (1d; apps::TrainerOptions::decode).
planner::MemoryPrediction rank_memory(const io::Config& config, int rank, bool inference = false,
                                      bool decode = false);

// The memory this node has for a run: COLOSSAL_HOST_MEMORY_BYTES when set (to leave room for other
// processes, or in tests), else MemAvailable from /proc/meminfo; 0 when neither can be read.
// A value that is not a positive number throws std::invalid_argument naming it.
double host_available_bytes(std::string* source = nullptr);

// Where a run's bytes live. A host build keeps everything in host memory; a build whose Kokkos
// memory space is a device's (CUDA) keeps all but the offloaded category on the device.
enum class MemoryPool { host, device };
bool device_resident_build();
double pool_bytes(const planner::MemoryPrediction& m, MemoryPool pool, bool device_build);

// What a run holds besides its config's plan, for the memory check. `inference`: the ranks of
// an inference trainer (colossal_eval, colossal_generate, --eval-only: rank_memory), `decode`
// with colossal_generate's decoding state; `samples` and `scores`: the inference program
// samples text or scores multiple-choice examples (a training run's own sampling and scoring
// follow its config: sample.tokens, eval.choices).
struct MemoryUse {
  bool inference = false;
  bool decode = false;
  bool samples = false;
  bool scores = false;
};

// 2d / 2.5d / 3d: world rank 0 builds the whole model in a one-rank 1d inference trainer
// (apps::one_rank_config) to sample and to score multiple-choice examples (MemoryUse), one
// such trainer at a time: the larger one's bytes in `pool`, beside its grid rank's. 0 under 1d,
// which samples and scores in place.
double whole_model_bytes(const io::Config& config, MemoryPool pool, bool device_build,
                         const MemoryUse& use = {});

// The pure check for one node holding world ranks `ranks`: empty when their predicted bytes plus
// kRuntimeBytesPerRank each (MemoryPool::device on a device build: kDeviceRuntimeBytesPerRank)
// fit in `available` bytes (or `available` is 0: unknown), else the
// error: what the ranks need (the plan of the largest, by category), what the node has, and the
// changes of one key (checkpointing.policy, parallel.zero.stage, train.micro_batch) that would fit,
// each with its predicted bytes, or the planner command to search every layout when none does.
// `use.inference`: the ranks of an inference trainer (rank_memory), whose changes are
// model.fused_attention, parallel.zero.stage 3 and train.micro_batch.
// Under 2d / 2.5d / 3d world rank 0, when among `ranks`, also needs whole_model_bytes.
std::string memory_shortfall(const io::Config& config, const std::vector<int>& ranks,
                             double available, const std::string& node,
                             const std::string& available_source = "available memory",
                             MemoryPool pool = MemoryPool::host,
                             bool device_build = device_resident_build(),
                             const MemoryUse& use = {});

// Collective over every rank of MPI_COMM_WORLD (colossal_train's world): each node's ranks are
// checked on the node by memory_shortfall (host memory; on a device build also each GPU's free
// memory against the ranks that share it), and when one node cannot hold its ranks every rank
// throws the same CollectiveError (the first such node's message), before anything is allocated.
void check_memory_fits(const io::Config& config, const MemoryUse& use = {});

}  // namespace colossal::apps
