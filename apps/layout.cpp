#include "apps/layout.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "apps/trainer.hpp"
#include "checkpoint_sched/solvers.hpp"
#include "core/memory.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace colossal::apps {

using checkpoint_sched::Keep;

planner::RankLayout rank_layout(const io::Config& config, int pipeline_rank,
                                const std::vector<Keep>& keep, bool selective) {
  const auto& p = config.parallel;
  planner::RankLayout l;
  l.micro_batch = config.train.micro_batch;
  l.seq_len = config.train.seq_len;
  l.micro_batches = config.accumulation_steps();
  l.bf16 = config.train.precision == "bf16";
  l.data = p.data;
  l.tensor = p.tensor;
  l.sequence_split = p.sequence_split;
  l.sequence = p.sequence;
  l.pipeline = p.pipeline;
  l.zero_stage = p.zero_stage;
  l.offload_optimizer = p.offload_optimizer;
  l.offload_params = p.offload_params;
  l.keep = keep;
  l.selective = selective;
  // The same partition and schedule the trainer runs (virtual stage c * stages + rank).
  const std::vector<int> layers = pipeline_layers(config);
  const int stages = p.pipeline, chunks = p.pipeline_chunks, virtual_stages = stages * chunks;
  const auto schedule = parallel::pipeline_schedule(p.pipeline_schedule, stages, pipeline_rank,
                                                    l.micro_batches, chunks);
  l.chunks.clear();
  for (int c = 0; c < chunks; ++c) {
    planner::RankLayout::Chunk chunk;
    chunk.virtual_stage = c * stages + pipeline_rank;
    const int v = chunk.virtual_stage;
    chunk.stage = core::StageRange{0, 0, v == 0, v == virtual_stages - 1};
    for (int s = 0; s < v; ++s) chunk.stage.layer_begin += layers[std::size_t(s)];
    chunk.stage.layer_end = chunk.stage.layer_begin + layers[std::size_t(v)];
    std::vector<parallel::PipelineAction> mine;
    for (const auto& a : schedule) {
      if (a.chunk == c) mine.push_back(a);
    }
    chunk.slots = parallel::peak_in_flight(mine);
    l.chunks.push_back(chunk);
  }
  return l;
}

planner::HardwareSpec hardware_spec(const io::Config& config, int threads) {
  const planner::HardwareSpec hw = config.hardware.file.empty()
                                       ? planner::hardware_preset(config.hardware.preset)
                                       : planner::read_hardware(config.hardware.file);
  return planner::scaled_to_threads(hw, threads);
}

namespace {
// The chain of one chunk for the solvers: per block its attention op (ln_1, qkv, core, out) and
// its MLP op (ln_2, fc, act, out). x is the op's input (saved by the sub-op before it), a what its
// sub-ops save besides its output; times from the roofline of each sub-op.
checkpoint_sched::Chain chunk_chain(const core::ModelSpec& spec, const planner::RankLayout& l,
                                    const planner::RankLayout::Chunk& chunk,
                                    const planner::HardwareSpec& hw) {
  planner::RankLayout all = l;
  all.keep.clear();
  all.selective = false;
  const planner::StepGraph g = planner::build_step_graph(spec, all.graph_layout(chunk));
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
      const planner::OpTime t = planner::op_time(g.ops[i], all, hw, spec.fused_attention);
      c.forward_time += t.forward;
      c.backward_time += t.backward + t.communication;
    }
    chain.ops.push_back(c);
  }
  chain.stored_multiplier = chunk.slots;
  return chain;
}
}  // namespace

ActivationPlan activation_plan(const io::Config& config, int pipeline_rank,
                               const planner::HardwareSpec& hw) {
  const auto& c = config.checkpointing;
  const core::ModelSpec& spec = config.model;
  const int layers = spec.layers;
  ActivationPlan plan;
  plan.description = c.policy;
  if (c.policy == "none") return plan;
  if (c.policy == "selective") {
    plan.selective = true;
    return plan;
  }
  if (c.policy == "manual") {
    plan.keep = checkpoint_sched::keep_blocks(layers, c.blocks);
    plan.description += ": " + checkpoint_sched::describe(plan.keep, checkpoint_sched::kOpsPerBlock);
    return plan;
  }
  // The other policies solve each chunk of this pipeline rank on its own chain.
  plan.keep.assign(std::size_t(layers) * checkpoint_sched::kOpsPerBlock, Keep::all);
  const planner::RankLayout l = rank_layout(config, pipeline_rank);
  const double budget = c.memory_budget * 1024.0 * 1024.0 * 1024.0;
  // What the rank needs besides the chains' kept activations (with everything kept).
  const double everything = planner::predict_memory(spec, l).total();
  std::vector<checkpoint_sched::Chain> chains;
  double kept = 0.0;
  for (const auto& chunk : l.chunks) {
    chains.push_back(chunk_chain(spec, l, chunk, hw));
    kept += double(checkpoint_sched::solve_none(chains.back()).cost.memory);
  }
  const double rest = everything - kept;
  for (std::size_t i = 0; i < l.chunks.size(); ++i) {
    const auto& chain = chains[i];
    const double none = double(checkpoint_sched::solve_none(chain).cost.memory);
    // Several chunks (interleaved) share what is left in proportion to their needs.
    const double share = kept > 0 ? none / kept : 1.0;
    const double chain_budget = std::max(0.0, (budget - rest) * share);
    checkpoint_sched::Schedule s =
        checkpoint_sched::solve(c.policy, chain, std::size_t(chain_budget), c.every);
    if (!s.feasible) {
      const double minimum = rest + double(s.cost.memory) / share;
      throw std::runtime_error(
          "checkpointing.memory_budget " + core::format_bytes(budget) + " is below the " +
          core::format_bytes(minimum) + " that pipeline stage " + std::to_string(pipeline_rank) +
          " needs with the least memory any schedule can use (" + core::format_bytes(rest) +
          " without activations); raise checkpointing.memory_budget, or shard more (ZeRO, tensor "
          "or pipeline parallelism)");
    }
    const auto& stage = l.chunks[i].stage;
    std::copy(s.keep.begin(), s.keep.end(),
              plan.keep.begin() + std::ptrdiff_t(stage.layer_begin) * checkpoint_sched::kOpsPerBlock);
    plan.description += (i ? "; " : ": ") + checkpoint_sched::describe(s.keep, chain.ops_per_block);
  }
  return plan;
}

}  // namespace colossal::apps
