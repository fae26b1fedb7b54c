// The joint planner (Colossal-Auto's idea, carried through): for a model, a training shape and a
// cluster, search the parallel layout (data x pipeline x tensor x sequence, pipeline partition
// and schedule, micro-batch size, ZeRO stage and offload) together with each pipeline rank's
// activation-checkpoint schedule, and keep the layouts with the least predicted step time that
// fit in device memory (ties: less memory).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint_policy.hpp"
#include "core/model_spec.hpp"
#include "planner/cost_model.hpp"
#include "planner/hardware.hpp"
#include "planner/layout_plan.hpp"

namespace colossal::planner {

struct Cluster {
  HardwareSpec hw;  // per device; devices_per_node and links set the topology
  int devices = 1;  // devices (ranks) of the run
  // A host's cores that its ranks (hw.threads threads each) share; 0: every device has its own
  // (GPUs). Where devices x threads exceeds it, the step is at least the ranks' work over the
  // cores (share_cores).
  int cores = 0;
  // Its ranks pinned round-robin to those cores (colossal_train pins ranks that outnumber them:
  // core::pins_ranks_to_cores): the step is then simulated (pinned_step), not bounded.
  bool pinned = false;
  int nodes = 1;  // of the host: its ranks and cores split evenly over them, in rank order
  int threads() const { return std::max(1, hw.threads); }  // per device (rank)
  bool oversubscribed() const { return cores > 0 && double(devices) * threads() > cores; }
};

// A layout and its prediction.
struct Plan {
  RunLayout run;
  core::CheckpointPolicy policy = core::CheckpointPolicy::none;  // none, or rotor under memory
  double budget_bytes = 0.0;       // rotor's checkpointing.memory_budget
  bool fused_attention = false;     // costed with the fused attention (model.fused_attention)
  std::vector<std::string> schedules;  // per pipeline rank, the checkpoint schedule
  bool fits = false;                // device_fits, and the node's host memory holds host_bytes
  bool device_fits = false;         // every rank fits in its device's memory
  double host_bytes = 0.0;          // offloaded bytes of one node's ranks (GPU nodes; 0: none)
  double step_time = 0.0;          // the slowest pipeline rank's
  double tokens_per_s = 0.0;
  double tflops_per_device = 0.0;  // model FLOPs (6N + 12LTd per token; recompute excluded)
  double mfu = 0.0;
  MemoryPrediction memory;         // the pipeline rank needing the most
  TimePrediction time;             // the slowest pipeline rank's
  std::string why;                 // why it lost, or did not fit
};

// Predicts a fixed layout. Where the device has a host link (a GPU), the offloaded bytes of the
// ranks of one node (the largest rank's times min(devices, devices_per_node)) must also fit in
// hw.host_memory_bytes, when that is known. `policy` is a checkpointing policy, or nullopt (auto): none when
// everything fits, else rotor under the device memory (2d / 2.5d / 3d: over whole blocks,
// plan_grid_checkpointing). run.layers empty: parallel::balanced_stage_layers (the trainer's
// default).
// budget_bytes: rotor's budget (0: the device memory).
Plan evaluate_plan(const core::ModelSpec& spec, RunLayout run, const Cluster& cluster,
                   std::optional<core::CheckpointPolicy> policy = std::nullopt, int every = 0,
                   const std::vector<int>& blocks = {}, double budget_bytes = 0.0,
                   int memory_slots = 500);

struct SearchOptions {
  int top = 5;                           // plans to keep
  std::vector<int> micro_batches{1, 2, 4, 8, 16};
  int max_sequence = 8;                  // ring sizes tried: 1, 2, 4, ... up to this
  int max_chunks = 4;                    // interleaved model chunks tried: 2 .. this
  bool zero = true;                      // try ZeRO stages 1-3
  bool offload = true;                   // try optimizer offload with ZeRO
  int memory_slots = 100;                // rotor's memory discretisation while searching
  bool prune = true;                     // skip shapes whose lower bound cannot win (tests: off)
  bool tensor_modes = true;              // also 2d, 2.5d and 3d grids (data, pipeline on top)
  double bucket_mb = 25.0;               // the executor's gradient buckets (parallel.bucket_mb)
  bool bf16_reduce = false;              // parallel.grad_reduce: bf16
  bool bf16_weight_copy = false;         // every layout: RankLayout::bf16_weight_copy
  // colossal_train's train.precision: bf16: every layout's RankLayout::bf16_products, and the
  // 1d layouts' bf16_operands (the grid models store fp32), as apps::run_layout sets them.
  bool bf16_products = false;
  bool device = false;                   // every layout: RunLayout::device (GPU ranks)
  // model.fused_attention: auto: each shape without ring attention is also costed with the
  // fused attention (where the spec has it off), which trades recomputation for the (B,H,T,T)
  // probabilities' memory: the 2d / 2.5d / 3d ones always (their q/k/v stay fp32, which every
  // head size runs), the 1d ones where `fused_attention_1d` says the build runs the head size
  // at the run's precision (the caller knows: core::fused_attention_unsupported).
  bool try_fused_attention = false;
  bool fused_attention_1d = true;
  // Only enumerate: SearchResult::candidates is the number of layout shapes, nothing is costed
  // (why_no_layout's test of other device counts).
  bool count_only = false;
};

struct SearchResult {
  std::vector<Plan> best;      // fitting plans, fastest first
  Plan closest;                // when nothing fits: the plan needing the least memory
  std::size_t candidates = 0;  // layouts enumerated
  std::size_t evaluated = 0;   // of which costed (the rest pruned by bounds)
  std::size_t evaluations = 0; // predictions made for them (the offload shares tried each one)
  std::size_t pruned = 0;
  std::size_t infeasible = 0;  // costed but over device memory under every schedule
  double seconds = 0.0;
};

SearchResult search_plans(const core::ModelSpec& spec, int global_batch, int seq_len, bool bf16,
                          const Cluster& cluster, const SearchOptions& options = {});

// Why search_plans enumerated no layout at all (candidates == 0) for cluster.devices: the rules a
// layout's sizes follow, with this model's numbers, and the nearest device counts that have one.
std::string why_no_layout(const core::ModelSpec& spec, int global_batch, int seq_len, bool bf16,
                          const Cluster& cluster, const SearchOptions& options = {});

// model.fused_attention: auto's rule between a layout costed with the dense attention and with
// the fused one (step_time 0: not costed): the one that fits with the shorter step (a tie: less
// memory); when neither fits, the one needing less memory; the dense one when the fused one was
// not costed.
const Plan& pick_attention(const Plan& dense, const Plan& fused, const HardwareSpec& hw);

// model.fused_attention: auto for a fixed layout: `run` costed as evaluate_plan does with the
// dense attention and, unless `dense_only`, with the fused one; the plan that fits with the
// shorter step (a tie: less memory); when neither fits, the one needing less memory. `other`
// (when not null) receives the plan not chosen (step_time 0: not costed or not valid).
Plan evaluate_attention_choice(core::ModelSpec spec, const RunLayout& run, const Cluster& cluster,
                               bool dense_only, Plan* other = nullptr,
                               std::optional<core::CheckpointPolicy> policy = std::nullopt,
                               int every = 0, const std::vector<int>& blocks = {},
                               double budget_bytes = 0.0, int memory_slots = 500);
// The same where the layout depends on the attention (`run_for(fused)`: e.g. the offload
// parallel.zero.offload.policy: auto would choose for each, apps::decide_attention).
Plan evaluate_attention_choice(core::ModelSpec spec,
                               const std::function<RunLayout(bool fused)>& run_for,
                               const Cluster& cluster, bool dense_only, Plan* other = nullptr,
                               std::optional<core::CheckpointPolicy> policy = std::nullopt,
                               int every = 0, const std::vector<int>& blocks = {},
                               double budget_bytes = 0.0, int memory_slots = 500);

// Text: one plan per line (layout, schedule, checkpointing, step time, TFLOP/s per device, MFU,
// memory per device by category) and, for the runner-ups, why they lost.
std::string format_plan(const Plan& plan);
std::string format_search(const SearchResult& result, const Cluster& cluster);
// The parallel: and checkpointing: blocks of a config (they round-trip through colossal_train).
std::string plan_yaml(const Plan& plan);
// The same as --set overrides ("parallel.data=4", ...), train.micro_batch included.
std::vector<std::string> plan_overrides(const Plan& plan);
// Machine-readable: the layout and the prediction.
std::string plan_json(const Plan& plan);

}  // namespace colossal::planner
