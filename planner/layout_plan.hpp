// A whole run's layout (what the parallel: block of a config fixes) and, from it, one pipeline
// rank's RankLayout and its activation-checkpoint schedule. Shared by colossal_train (through
// apps/layout.hpp), colossal_plan and the joint search, so all three derive the same answer.
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint_policy.hpp"
#include "core/keep.hpp"
#include "core/model_spec.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "planner/cost_model.hpp"
#include "planner/hardware.hpp"

namespace colossal::planner {

struct RunLayout {
  int global_batch = 8;          // sequences per optimizer step
  int micro_batch = 1;
  int seq_len = 1024;
  bool bf16 = false;
  // colossal_train's train.precision: bf16 on the host: the activations it saves in bf16
  // (core::ActivationShape::bf16_operands and bf16_probabilities); ignored under bf16, whose
  // activations are all 2 bytes.
  bool bf16_operands = false;
  bool bf16_weight_copy = false;  // RankLayout::bf16_weight_copy
  bool bf16_products = false;     // RankLayout::bf16_products
  // The ranks are GPUs: the LM head's logits chunk is the device's (Layout::device). Set from
  // where colossal_train's arrays live (apps::run_layout), or by a plan for a GPU's hardware.
  bool device = false;
  int data = 1, tensor = 1, sequence = 1, pipeline = 1;
  bool sequence_split = false;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::one_f_one_b;
  int chunks = 1;                 // model chunks per rank (interleaved)
  std::vector<int> layers;        // blocks per virtual stage (pipeline * chunks entries)
  int zero_stage = 0;
  bool offload_optimizer = false, offload_params = false;
  double offload_fraction = 1.0;  // with offload_optimizer: the share of each shard's
                                  // states on the host (core::offloaded_states)
  double offload_params_fraction = 1.0;  // with offload_params: the share of each stage-3
                                         // parameter shard in host memory
  // Stages 0-1: the gradient all-reduce's bucket size, MiB (parallel.bucket_mb); infinity: the
  // whole buffer in one call after backward, as Megatron-LM (2021) did.
  double bucket_mb = 25.0;
  bool bf16_reduce = false;  // parallel.grad_reduce: bf16
  bool inference = false;    // RankLayout::inference
  bool decode = false;       // RankLayout::decode
  // 1d | 2d | 2.5d | 3d (the last three: the grid closed forms of predict_*, RankLayout)
  core::TensorMode tensor_mode = core::TensorMode::d1;
  int depth = 1;  // 2.5d layers (tensor = q^2 x depth)
  int world() const { return data * tensor * sequence * pipeline; }
  int micro_batches() const {  // per rank (per 2.5d layer)
    return global_batch / (micro_batch * data * core::tensor_depth(tensor_mode, depth));
  }
};

// Pipeline rank `rank`'s chunks, their stages and the micro-batches each keeps in flight under the
// schedule, with the given checkpoint schedule.
RankLayout rank_layout(const RunLayout& run, int rank,
                       const std::vector<core::Keep>& keep = {},
                       bool selective = false);

struct CheckpointPlan {
  std::vector<core::Keep> keep;  // per op of the whole model; empty keeps all
  bool selective = false;
  std::string description;                    // the policy and, per chunk, the schedule
  bool feasible = true;                       // rotor: the budget can be met
  double minimum_bytes = 0.0;                 // rotor: the least this rank can need
  double rest_bytes = 0.0;                    // rotor: what the rank needs besides activations
};

// The schedule of `policy` (any core::CheckpointPolicy) for the
// rank whose layout is `rank` (its keep is ignored): rotor solves each chunk's chain (two ops per
// block, costs from the step graph and `hw`, k = the chunk's micro-batches in flight) under
// budget_bytes minus everything else the rank allocates; chunks share the rest in proportion to
// what they would keep. feasible = false (and minimum_bytes) when even the least-memory schedule
// does not fit. A 2d / 2.5d / 3d rank (rank.tensor_mode) goes to plan_grid_checkpointing.
CheckpointPlan plan_checkpointing(const core::ModelSpec& spec, const RankLayout& rank,
                                  const HardwareSpec& hw, core::CheckpointPolicy policy,
                                  double budget_bytes, int every, const std::vector<int>& blocks,
                                  int memory_slots = 500);

// The same for a 2d / 2.5d / 3d layout, whose models recompute whole blocks: the chain has one
// op per block (x its input, a the rest of its set: core::grid_block_floats; forward time the
// block's recompute in predict_time, backward twice it), and the schedule is read back two ops a
// block. none, full, every_k, sqrt and manual give the schedules they give in 1d; rotor the
// fewest recomputed blocks under budget_bytes minus everything else the rank allocates
// (predict_memory of `layout` with all kept, less the blocks), where the models' arena also
// holds its first block's unused input slot. selective: every block kept but its attention
// probabilities (CheckpointPlan::selective).
CheckpointPlan plan_grid_checkpointing(const core::ModelSpec& spec, const RankLayout& layout,
                                       const HardwareSpec& hw, core::CheckpointPolicy policy,
                                       double budget_bytes, int every,
                                       const std::vector<int>& blocks, int memory_slots = 500);

}  // namespace colossal::planner
