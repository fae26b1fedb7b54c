// From a config to the cost model's view of one rank, and to the activation-checkpoint schedule
// its policy chooses. Pure functions of the config (every rank derives the same answer; the
// trainer's plan check compares them), usable without MPI by colossal_plan.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "core/keep.hpp"
#include "io/config.hpp"
#include "parallel/communicator.hpp"
#include "planner/cost_model.hpp"
#include "planner/hardware.hpp"
#include "planner/layout_plan.hpp"
#include "planner/search.hpp"

namespace colossal::apps {

// Blocks per (virtual) pipeline stage: parallel.pipeline.layers, or balanced by predicted FLOPs
// (parallel::balanced_stage_layers, the planner's partition) over size x chunks stages.
std::vector<int> pipeline_layers(const io::Config& config);

// Whether colossal_train saves activations in bf16 (core::ModelOptions::bf16_operands and
// bf16_probabilities): train.precision: bf16 in 1d tensor mode, in host and device builds.
bool bf16_operands(const io::Config& config);

// The run's layout as the config fixes it (the trainer's pipeline partition included).
planner::RunLayout run_layout(const io::Config& config);

// The layout of the ranks of pipeline stage `pipeline_rank`: their chunks (one, or `chunks` under
// the interleaved schedule), the micro-batches each keeps in flight, the checkpoint schedule.
// `inference`: an inference trainer's (planner::RankLayout::inference) of inference_config(config);
// `decode`: with colossal_generate's incremental-decoding state (planner::RankLayout::decode).
planner::RankLayout rank_layout(const io::Config& config, int pipeline_rank,
                                const std::vector<core::Keep>& keep = {},
                                bool selective = false, bool inference = false,
                                bool decode = false);

// Inference (colossal_eval, colossal_generate: apps::Trainer's inference mode) holds the
// parameters and nothing of training: the config it runs keeps the mesh, the model, the
// micro-batch and parallel.zero.stage 3's sharded parameters (with offload.params, their host
// part), while stages 0-2 keep them whole (stage 0) and the optimizer's offload and the gradient
// reduction's settings go.
io::Config inference_config(const io::Config& config);

// hardware.file when set, else hardware.preset, with host rates scaled to `threads` per rank
// (0: as written).
planner::HardwareSpec hardware_spec(const io::Config& config, int threads);
// hardware.host_memory_gib, when set, as the spec's host memory per node.
void with_host_memory(planner::HardwareSpec& hw, const io::Config& config);

struct ActivationPlan {
  std::vector<core::Keep> keep;  // per op of the whole model; empty keeps all
  bool selective = false;
  std::string description;                    // the policy and, per stage, the schedule
};

// An inference trainer's activations (inference_config): every block as a recomputed segment
// (nothing is recomputed: no backward runs), so a forward keeps each block's input and one
// block's working set (the arena).
ActivationPlan inference_activation_plan(const io::Config& config);

// checkpointing.policy for the ranks of `pipeline_rank`. rotor solves each chunk's chain (two ops
// per block, costs from the step graph and `hw`) under checkpointing.memory_budget minus what the
// rest of the rank needs; a budget below the minimum throws std::runtime_error with the numbers.
// 2d / 2.5d / 3d: whole blocks with the grid's sizes (planner::plan_checkpointing dispatches).
ActivationPlan activation_plan(const io::Config& config, int pipeline_rank,
                               const planner::HardwareSpec& hw);
// The same for `run`, the layout to plan (colossal_plan's for another device: its weight copy and
// logits chunk), in place of run_layout(config).
ActivationPlan activation_plan(const io::Config& config, const planner::RunLayout& run,
                               int pipeline_rank, const planner::HardwareSpec& hw);

// What the cost model predicts for the ranks of `pipeline_rank` under `plan`: the per-op step
// graph of rank_layout in 1d, the grid closed forms of planner::predict_* in 2d / 2.5d / 3d
// (equal to the tracker's bytes, the plan's dropped blocks included; no per-micro-batch times).
void predict_rank(const io::Config& config, int pipeline_rank, const ActivationPlan& plan,
                  const planner::HardwareSpec& hw, planner::MemoryPrediction& memory,
                  planner::TimePrediction& time, bool inference = false,
                  bool decode = false);

// The cluster of `devices` ranks: GPU presets as they are; a host spec (calibrated threads > 0)
// makes one device of each rank, sharing this node's memory, and `cores` (all nodes' together),
// `pinned` when the ranks are pinned round-robin to them (core::pins_ranks_to_cores) on each of
// the `nodes`.
planner::Cluster make_cluster(planner::HardwareSpec hw, int devices, int cores, bool pinned,
                              int nodes = 1);

// parallel.mode: auto. Rank 0 searches the layouts of `world`'s ranks on the config's hardware
// (host rates scaled to `threads` per rank, its memory shared by the ranks), broadcasts the chosen
// plan's overrides, and every rank returns the config re-read with them (parallel.mode: manual).
// `report` (rank 0) receives the search's summary. No layout fits: a clear error on every rank.
io::Config plan_automatically(const io::Config& config, parallel::Communicator& world, int threads,
                              std::string* report);
// Why the config's fixed layout cannot run the fused attention (ring attention; 1d, a head size
// this build's bf16 kernels do not step through); empty when it can.
std::string fused_attention_unavailable(const io::Config& config);
// model.fused_attention: auto's decision for the config's fixed layout on `cluster` (its
// memory_bytes what a rank may hold): each attention costed with the config's checkpointing and,
// under parallel.zero.offload.policy: auto, the offload the policy would choose for it on a
// device of `device` bytes shared by `share` ranks (apps/offload_policy.hpp); the fused one only
// where the layout and the build run it (`unavailable` says why not). planner::pick_attention
// chooses.
struct AttentionDecision {
  bool fused = false;
  planner::Plan dense_plan, fused_plan;  // fused_plan.step_time 0: not costed
  std::string unavailable;
};
AttentionDecision decide_attention(const io::Config& config, const planner::Cluster& cluster,
                                   double device, int share = 1);
// model.fused_attention: auto with a fixed layout (parallel.mode: manual; under auto,
// plan_automatically's search decides it). Collective: every rank's memory (the GPU's free
// memory over the ranks sharing it, hardware.device_memory_gib, or on a host build the node's
// available memory over its ranks) gives the least capacity; rank 0 costs the layout with both
// attentions (the config's checkpointing; under parallel.zero.offload.policy: auto each with the
// offload the policy would choose for it) and broadcasts the choice (planner::pick_attention:
// the faster one that fits, else the smaller). Prints it to `log` (rank 0's) and returns the
// config re-read with it. Without auto the config is returned as it is.
io::Config plan_attention(const io::Config& config, parallel::Communicator& world, int threads,
                          std::FILE* log);

}  // namespace colossal::apps
