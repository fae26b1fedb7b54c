#include "planner/layout_plan.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "checkpoint_sched/solvers.hpp"
#include "core/grid_model.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace colossal::planner {

using checkpoint_sched::Keep;

RankLayout rank_layout(const RunLayout& run, int rank, const std::vector<Keep>& keep,
                       bool selective) {
  RankLayout l;
  l.micro_batch = run.micro_batch;
  l.seq_len = run.seq_len;
  l.micro_batches = run.micro_batches();
  l.bf16 = run.bf16;
  l.bf16_operands = run.bf16_operands;
  l.bf16_weight_copy = run.bf16_weight_copy;
  l.bf16_products = run.bf16_products;
  l.device = run.device;
  l.data = run.data;
  l.tensor = run.tensor;
  l.sequence_split = run.sequence_split;
  l.sequence = run.sequence;
  l.pipeline = run.pipeline;
  l.zero_stage = run.zero_stage;
  l.offload_optimizer = run.offload_optimizer;
  l.offload_params = run.offload_params;
  l.offload_fraction = run.offload_fraction;
  l.offload_params_fraction = run.offload_params_fraction;
  l.bucket_mb = run.bucket_mb;
  l.bf16_reduce = run.bf16_reduce;
  l.keep = keep;
  l.selective = selective;
  l.inference = run.inference;
  l.decode = run.decode;
  l.tensor_mode = run.tensor_mode;
  l.depth = core::tensor_depth(run.tensor_mode, run.depth);
  const int stages = run.pipeline, chunks = run.chunks, virtual_stages = stages * chunks;
  if (int(run.layers.size()) != virtual_stages) {
    throw std::invalid_argument("rank_layout: " + std::to_string(run.layers.size()) +
                                " stage sizes for " + std::to_string(virtual_stages) +
                                " virtual stages");
  }
  const auto schedule =
      parallel::pipeline_schedule(run.schedule, stages, rank, l.micro_batches, chunks);
  l.chunks.clear();
  for (int c = 0; c < chunks; ++c) {
    RankLayout::Chunk chunk;
    chunk.virtual_stage = c * stages + rank;
    const int v = chunk.virtual_stage;
    chunk.stage = core::StageRange{0, 0, v == 0, v == virtual_stages - 1};
    for (int s = 0; s < v; ++s) chunk.stage.layer_begin += run.layers[std::size_t(s)];
    chunk.stage.layer_end = chunk.stage.layer_begin + run.layers[std::size_t(v)];
    std::vector<parallel::PipelineAction> mine;
    for (const auto& a : schedule) {
      if (a.chunk == c) mine.push_back(a);
    }
    // Inference runs one forward at a time through the stages (apps::Trainer::pipeline_forward).
    chunk.slots = run.inference ? 1 : parallel::peak_in_flight(mine);
    chunk.forward_turns = chunk.backward_turns = 0;
    for (std::size_t i = 1; i < mine.size(); ++i) {
      if (mine[i - 1].forward && !mine[i].forward) ++chunk.forward_turns;
      if (!mine[i - 1].forward && mine[i].forward) ++chunk.backward_turns;
    }
    l.chunks.push_back(chunk);
  }
  return l;
}

namespace {
// The chain of one chunk for the solvers: per block its attention op (ln_1, qkv, core, out) and
// its MLP op (ln_2, fc, act, out). x is the op's input (saved by the sub-op before it), a what its
// sub-ops save besides its output; times from the roofline of each sub-op.
checkpoint_sched::Chain chunk_chain(const core::ModelSpec& spec, const RankLayout& l,
                                    const RankLayout::Chunk& chunk, const HardwareSpec& hw) {
  RankLayout all = l;
  all.keep.clear();
  all.selective = false;
  const StepGraph g = build_step_graph(spec, all.graph_layout(chunk));
  checkpoint_sched::Chain chain;
  chain.ops_per_block = checkpoint_sched::kOpsPerBlock;
  const std::size_t first = 1;  // ops[0] is the embedding or the stage input
  const int blocks = chunk.stage.layer_end - chunk.stage.layer_begin;
  for (int op = 0; op < blocks * checkpoint_sched::kOpsPerBlock; ++op) {
    const std::size_t begin = first + std::size_t(op) * 4;
    checkpoint_sched::ChainOp c;
    c.input_bytes = std::size_t(g.ops[begin - 1].saved_bytes);
    for (std::size_t i = begin; i < begin + 4; ++i) {
      if (i + 1 < begin + 4) c.saved_bytes += std::size_t(g.ops[i].saved_bytes);
      const OpTime t = op_time(g.ops[i], all, hw, spec.fused_attention);
      c.forward_time += t.forward;
      c.backward_time += t.backward + t.communication;
    }
    chain.ops.push_back(c);
  }
  chain.stored_multiplier = chunk.slots;
  return chain;
}
// The policies that need no solver: none, selective (kept blocks drop their probabilities) and
// manual (the listed blocks whole); nullopt for the others.
std::optional<CheckpointPlan> unsolved_plan(int layers, core::CheckpointPolicy policy,
                                            const std::vector<int>& blocks) {
  using core::CheckpointPolicy;
  CheckpointPlan plan;
  plan.description = core::checkpoint_policy_name(policy);
  switch (policy) {
    case CheckpointPolicy::none:
      return plan;
    case CheckpointPolicy::selective:
      plan.selective = true;
      return plan;
    case CheckpointPolicy::manual:
      plan.keep = checkpoint_sched::keep_blocks(layers, blocks);
      plan.description +=
          ": " + checkpoint_sched::describe(plan.keep, checkpoint_sched::kOpsPerBlock);
      return plan;
    default:
      return std::nullopt;
  }
}
}  // namespace


CheckpointPlan plan_checkpointing(const core::ModelSpec& spec, const RankLayout& rank,
                                  const HardwareSpec& hw, core::CheckpointPolicy policy,
                                  double budget_bytes, int every, const std::vector<int>& blocks,
                                  int memory_slots) {
  if (rank.tensor_mode != core::TensorMode::d1) {
    return plan_grid_checkpointing(spec, rank, hw, policy, budget_bytes, every, blocks,
                                   memory_slots);
  }
  const int layers = spec.layers;
  if (auto fixed = unsolved_plan(layers, policy, blocks)) return *fixed;
  CheckpointPlan plan;
  plan.description = core::checkpoint_policy_name(policy);
  // The other policies solve each chunk of this pipeline rank on its own chain.
  plan.keep.assign(std::size_t(layers) * checkpoint_sched::kOpsPerBlock, Keep::all);
  RankLayout l = rank;
  l.keep.clear();
  l.selective = false;
  // What the rank needs besides the chains' kept activations (with everything kept).
  // Offloaded bytes count only where the device is the host (MemoryPrediction::against).
  const double everything = predict_memory(spec, l).against(hw);
  std::vector<checkpoint_sched::Chain> chains;
  double kept = 0.0;
  for (const auto& chunk : l.chunks) {
    chains.push_back(chunk_chain(spec, l, chunk, hw));
    kept += double(checkpoint_sched::solve_none(chains.back()).cost.memory);
  }
  plan.rest_bytes = everything - kept;
  for (std::size_t i = 0; i < l.chunks.size(); ++i) {
    const auto& chain = chains[i];
    const double none = double(checkpoint_sched::solve_none(chain).cost.memory);
    // Several chunks (interleaved) share what is left in proportion to their needs.
    const double share = kept > 0 ? none / kept : 1.0;
    const double chain_budget = std::max(0.0, (budget_bytes - plan.rest_bytes) * share);
    const checkpoint_sched::Schedule s =
        checkpoint_sched::solve(policy, chain, std::size_t(chain_budget), every, memory_slots);
    if (!s.feasible) {
      plan.feasible = false;
      plan.minimum_bytes = std::max(plan.minimum_bytes, plan.rest_bytes + double(s.cost.memory) / share);
    }
    const auto& stage = l.chunks[i].stage;
    std::copy(s.keep.begin(), s.keep.end(),
              plan.keep.begin() + std::ptrdiff_t(stage.layer_begin) * checkpoint_sched::kOpsPerBlock);
    plan.description += (i ? "; " : ": ") + checkpoint_sched::describe(s.keep, chain.ops_per_block);
  }
  return plan;
}

CheckpointPlan plan_grid_checkpointing(const core::ModelSpec& spec, const RankLayout& layout,
                                       const HardwareSpec& hw, core::CheckpointPolicy policy,
                                       double budget_bytes, int every,
                                       const std::vector<int>& blocks, int memory_slots) {
  using core::CheckpointPolicy;
  const int layers = spec.layers;
  if (auto fixed = unsolved_plan(layers, policy, blocks)) return *fixed;
  CheckpointPlan plan;
  plan.description = core::checkpoint_policy_name(policy);
  RankLayout all = layout;
  all.keep.clear();
  all.selective = false;
  const core::GridBlockFloats block =
      core::grid_block_floats(spec, layout.tensor_mode, layout.micro_batch, layout.seq_len,
                              layout.grid_side());
  // A block's forward: what recomputing every block adds to the step, per block and micro-batch.
  RankLayout every_block = all;
  std::vector<int> each(static_cast<std::size_t>(layers));
  std::iota(each.begin(), each.end(), 0);
  every_block.keep = checkpoint_sched::keep_blocks(layers, each);
  int rank_blocks = 0;
  for (const auto& chunk : layout.chunks) {
    rank_blocks += core::sharded::stage_blocks(spec, chunk.stage);
  }
  const double forward = predict_time(spec, every_block, hw).recompute /
                         (double(rank_blocks) * std::max(1, layout.micro_batches));
  // Each chunk of this pipeline rank (one, or several interleaved) is a chain of one op a block
  // of its own (its model, its arena), each block kept in the chunk's `slots` sets.
  std::vector<checkpoint_sched::Chain> chains;
  double kept_all = 0.0;
  for (const auto& chunk : layout.chunks) {
    checkpoint_sched::Chain chain;
    chain.ops_per_block = 1;
    chain.stored_multiplier = chunk.slots;
    for (int b = 0; b < core::sharded::stage_blocks(spec, chunk.stage); ++b) {
      checkpoint_sched::ChainOp op;
      op.input_bytes = std::size_t(block.input) * sizeof(float);
      op.saved_bytes = std::size_t(block.set - block.input) * sizeof(float);
      op.forward_time = forward;
      op.backward_time = 2.0 * forward;
      chain.ops.push_back(op);
    }
    kept_all += double(chunk.slots) * double(chain.ops.size()) * double(block.set) * sizeof(float);
    chains.push_back(std::move(chain));
  }
  plan.rest_bytes = predict_memory(spec, all).against(hw) - kept_all;
  plan.keep.assign(std::size_t(layers) * checkpoint_sched::kOpsPerBlock, Keep::all);
  // The arena of a segment of n blocks is n whole sets (the first block's x slot unused), one
  // input more than the chain's cost counts: leave it out of each chunk's budget.
  const double slack = double(block.input) * sizeof(float);
  const bool keep_all = plan.rest_bytes + kept_all <= budget_bytes;
  // rotor: every chunk gets the least its chain can run in (and its arena's slack), then a share
  // of what is left in proportion to what it keeps with everything.
  double least = plan.rest_bytes;
  std::vector<double> minimum(chains.size(), 0.0);
  for (std::size_t c = 0; c < chains.size(); ++c) {
    if (policy != CheckpointPolicy::rotor || keep_all) break;
    minimum[c] = double(checkpoint_sched::solve_min_memory(chains[c]).cost.memory);
    least += minimum[c] + slack;
  }
  if (policy == CheckpointPolicy::rotor && !keep_all && least > budget_bytes) {
    plan.feasible = false;
    plan.minimum_bytes = least;
  }
  for (std::size_t c = 0; c < chains.size(); ++c) {
    const checkpoint_sched::Chain& chain = chains[c];
    checkpoint_sched::Schedule s;
    if (policy == CheckpointPolicy::rotor) {
      if (keep_all) {
        s = checkpoint_sched::solve_none(chain);
      } else {
        const double none = double(checkpoint_sched::solve_none(chain).cost.memory);
        const double share = kept_all > 0 ? none / kept_all : 1.0;
        const double chain_budget =
            minimum[c] + std::max(0.0, budget_bytes - least) * share;
        s = checkpoint_sched::solve_rotor(chain, std::size_t(chain_budget), memory_slots);
        if (!s.feasible && plan.feasible) {  // the discretised memory rounds up past it
          plan.feasible = false;
          plan.minimum_bytes = least + double(s.cost.memory) - minimum[c];
        }
      }
    } else {
      s = checkpoint_sched::solve(policy, chain, 0, every, memory_slots);
    }
    std::vector<Keep> mine;  // the chunk's ops, for the description
    const int first = layout.chunks[c].stage.layer_begin;
    for (std::size_t b = 0; b < chain.ops.size(); ++b) {
      const Keep k = s.keep[b];
      const std::size_t at = (std::size_t(first) + b) * checkpoint_sched::kOpsPerBlock;
      plan.keep[at] = k;
      for (int op = 1; op < checkpoint_sched::kOpsPerBlock; ++op) {
        plan.keep[at + op] = k == Keep::all ? Keep::all : Keep::none;
      }
      mine.insert(mine.end(), plan.keep.begin() + std::ptrdiff_t(at),
                  plan.keep.begin() + std::ptrdiff_t(at + checkpoint_sched::kOpsPerBlock));
    }
    plan.description += (c ? "; " : ": ") +
                        checkpoint_sched::describe(mine, checkpoint_sched::kOpsPerBlock);
  }
  return plan;
}

}  // namespace colossal::planner
