#include "planner/cost_model.hpp"

#include "core/activation_sizes.hpp"
#include "core/grid_model.hpp"
#include "core/model2d.hpp"
#include "core/model3d.hpp"
#include "core/optimizer.hpp"
#include "core/sharded_detail.hpp"
#include "parallel/communicator.hpp"
#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>

namespace colossal::planner {

Layout RankLayout::graph_layout(const Chunk& chunk) const {
  return Layout{micro_batch, seq_len,   tensor, sequence_split, sequence,
                chunk.stage, keep,      selective, bf16,         bf16_operands && !bf16,
                device};
}

double MemoryPrediction::total() const {
  double sum = 0.0;
  for (double b : bytes) sum += b;
  return sum;
}

double MemoryPrediction::device() const {
  return total() - (*this)[core::MemCategory::offloaded];
}

double MemoryPrediction::against(const HardwareSpec& hw) const {
  return hw.host_link_bandwidth > 0 ? device() : total();
}

std::string MemoryPrediction::format() const {
  std::string out;
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    if (bytes[std::size_t(c)] == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(core::category_name(core::MemCategory(c))) +
           " " + core::format_bytes(bytes[std::size_t(c)]);
  }
  return out + " (total " + core::format_bytes(total()) + ")";
}

namespace {
constexpr double kF = 4.0;  // bytes per fp32 value

// One chunk's flat parameter buffer as the trainer pads and shards it.
struct ChunkParams {
  double flat = 0, first = 0, second = 0, widest = 0, last = 0, units = 0;
  double layernorm_owned = 0;  // layernorm floats in the pieces this rank's optimizer updates
};

ChunkParams chunk_params(const core::ModelSpec& spec, const RankLayout& l,
                         const RankLayout::Chunk& chunk) {
  // Every block's unit has the same size, so the table of a one-block stage with the chunk's
  // embeddings and head gives each kind of unit once (building the whole model's table for every
  // candidate of a search would dominate its time).
  const std::size_t ranks = std::size_t(l.data) * std::size_t(l.sequence);
  const std::size_t multiple = ranks * 16;
  core::ModelSpec one = spec;
  one.layers = 1;
  const core::StageRange stage{0, 1, chunk.stage.embeds, chunk.stage.head};
  const auto table = core::parameter_table(one, multiple, core::TensorSplit{l.tensor, 0}, stage);
  const auto units = core::parameter_units(table, multiple);
  // Layernorm floats this rank's optimizer updates, per unit: all of them (stages 0-1) or those
  // in slice 0 of the unit (stages 2-3).
  std::vector<double> layernorm(units.size(), 0.0);
  for (const auto& param : table) {
    if (param.role != core::ParamRole::layernorm_weight &&
        param.role != core::ParamRole::layernorm_bias) {
      continue;
    }
    const auto& unit = units[std::size_t(param.unit)];
    std::size_t lo = param.offset, hi = param.offset + param.count;
    if (l.zero_stage >= 2) hi = std::min(hi, unit.begin + unit.size() / ranks);
    if (hi > lo) layernorm[std::size_t(param.unit)] += double(hi - lo);
  }
  // The block's unit index: 1 after the embeddings' unit 0, which a stage holds for its tokens or
  // for a tied LM head (core::parameter_table).
  const std::size_t block = chunk.stage.embeds || (chunk.stage.head && spec.tied()) ? 1 : 0;
  const int end = chunk.stage.layer_end < 0 ? spec.layers : chunk.stage.layer_end;
  const int blocks = end - chunk.stage.layer_begin;
  std::vector<double> sizes;
  ChunkParams p;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const int copies = u == block ? blocks : 1;
    for (int c = 0; c < copies; ++c) sizes.push_back(double(units[u].size()));
    p.layernorm_owned += copies * layernorm[u];
  }
  for (double size : sizes) p.flat += size;
  p.first = sizes.front();
  p.second = sizes.size() > 1 ? sizes[1] : 0.0;
  p.last = sizes.back();
  p.units = double(sizes.size());
  for (std::size_t u = 1; u < sizes.size(); ++u) p.widest = std::max(p.widest, sizes[u]);
  return p;
}

// Ring collectives over p ranks of a link: all-reduce moves 2(p-1)/p of the payload in 2(p-1)
// steps, all-gather and reduce-scatter (p-1)/p in p-1 steps, a send n bytes in one.
double all_reduce_time(double bytes, int p, const LinkSpec& link) {
  if (p <= 1 || bytes <= 0) return 0.0;
  return 2.0 * (p - 1) * (link.latency_s + bytes / p / link.bandwidth_Bps);
}
// ZeRO's AdamW on `states` elements, the share `offloaded` of them on the host
// (offload.optimizer_fraction, Colossal-AI's offload_optim_frac), whose parameters are
// `param_bytes` each, as zero::ShardedAdamW::step runs it: the device's update starts, and beside
// it the host share's gradients and parameters come down on a copy stream of their own (the
// parameters not where they live on the host: the share `params_on_host` of the parameter shard,
// offload.params_fraction), are updated on the host and go back up. `grads_hidden` seconds of the
// gradients' copies ran beside backward (ZeRO 2-3: they start as their units' reductions
// complete).
double optimizer_time(const HardwareSpec& hw, double states, double offloaded, double param_bytes,
                      double params_on_host = 0.0, double grads_hidden = 0.0) {
  // AdamW reads parameter, gradient, m and v and writes three of them: 28 bytes per parameter.
  const double host = std::clamp(offloaded, 0.0, 1.0) * states;
  const double device = (states - host) * 28.0 / hw.optimizer_bandwidth;
  if (host <= 0.0) return device;
  const double rate = hw.host_optimizer_bandwidth > 0 ? hw.host_optimizer_bandwidth
                                                       : hw.optimizer_bandwidth;
  const double on_host = host * 28.0 / rate;
  if (hw.host_link_bandwidth <= 0) return device + on_host;  // one memory, one set of threads
  // With parameter offload only the device's part of the parameter shard travels.
  const double moved =
      (host - double(core::offloaded_states(std::size_t(host), params_on_host))) * param_bytes;
  const double down =
      std::max(0.0, host * kF / hw.host_link_bandwidth - grads_hidden) +
      moved / hw.host_link_bandwidth;
  const double up = moved / hw.host_link_bandwidth;
  return std::max(device, down + on_host + up);
}

// The step's gradient housekeeping on the device, beside AdamW: the norm reads and the zeroing
// writes each of the `floats` gradients the rank holds (the whole buffer at ZeRO 0-1, the shard
// at 2-3), 8 bytes each at the optimizer's rate.
double gradient_housekeeping(const HardwareSpec& hw, double floats) {
  return 2.0 * kF * floats / hw.optimizer_bandwidth;
}

// Overlap (planner/README.md): of a gradient reduction taking `reduction` seconds, started in
// `pieces` as backward produces them, all but the last piece run beside `window` seconds of
// compute, less `after` (the all-gather after the update, which waits for AdamW), in the share
// the transport moves by itself (HardwareSpec::comm_overlap).
double hidden_reduction(const HardwareSpec& hw, double reduction, double after, double pieces,
                        double window) {
  if (hw.comm_overlap <= 0 || pieces <= 1) return 0.0;
  return hw.comm_overlap * std::min((reduction - after) * (pieces - 1) / pieces, window);
}
double gather_time(double bytes, int p, const LinkSpec& link) {
  if (p <= 1 || bytes <= 0) return 0.0;
  return (p - 1) * (link.latency_s + bytes / p / link.bandwidth_Bps);
}
double send_time(double bytes, const LinkSpec& link) {
  return bytes <= 0 ? 0.0 : link.latency_s + bytes / link.bandwidth_Bps;
}
// A pipeline message between stages: a send on the link, and where the transport stages it
// (hw.pipeline_staged, on a GPU node with a host link) two crossings of the host link, down to
// pinned host memory and up on the peer, around the MPI send.
double stage_send_time(double bytes, const LinkSpec& link, const HardwareSpec& hw) {
  if (bytes <= 0) return 0.0;
  const double staging = hw.pipeline_staged && hw.host_link_bandwidth > 0
                             ? 2.0 * bytes / hw.host_link_bandwidth
                             : 0.0;
  return send_time(bytes, link) + staging;
}

bool starts_with(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

// The mesh is tensor innermost, then sequence, data, pipeline: a group stays inside a node while
// the ranks up to its axis fit in one.
const LinkSpec& link_for(int ranks_inside, const HardwareSpec& hw) {
  return ranks_inside <= hw.devices_per_node ? hw.intra_node : hw.inter_node;
}
}  // namespace

namespace {

// Tensor modes 2d, 2.5d and 3d: the closed forms of core::Model2D / Model3D (see RankLayout).
// One model chunk's allocation (its store, activation slots, scratch and link buffers).
MemoryPrediction grid_chunk_memory(const core::ModelSpec& spec, const RankLayout& l,
                                   const RankLayout::Chunk& chunk) {
  const int q = l.grid_side();
  using core::MemCategory;
  MemoryPrediction m;
  const bool cube = l.tensor_mode == core::TensorMode::d3;
  // ZeRO 1-2 pad every unit to data x 16 floats and keep the moments of one shard; ZeRO 2 also
  // keeps only the shard of the gradients, plus (data > 1) the work buffers of unit 0 and two of
  // the widest block unit, which backward fills before their reduce-scatter (one reducing while
  // the next fills).
  // A pipeline stage holds its blocks in `slots` activation sets.
  const core::StageRange stage = chunk.stage;
  const int slots = chunk.slots;
  const std::size_t unit = l.zero_stage >= 1 ? std::size_t(16) * std::size_t(l.data) : 16;
  const std::size_t floor =
      core::grid_first_unit_floats(spec, l.tensor_mode, q, unit, stage, l.zero_stage);
  const std::vector<std::size_t> units =
      cube ? core::Model3D::unit_floats(spec, q, unit, stage, floor)
           : core::Model2D::unit_floats(spec, q, unit, stage, floor);
  double padded = 0.0, widest = 0.0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    padded += double(units[u]);
    if (u > 0) widest = std::max(widest, double(units[u]));
  }
  m[MemCategory::parameters] = padded * kF;
  const double shard = l.zero_stage >= 1 ? padded / l.data : padded;
  // Reduced in bf16 (several data ranks): a bf16 copy of the whole buffer (stages 0-1), or of
  // unit 0's and one block's work buffers, which need no spare then (stage 2).
  const bool wire = l.bf16_reduce && l.data > 1;
  if (l.zero_stage == 2) {
    m[MemCategory::gradients] =
        shard * kF + (l.data == 1 ? 0.0
                      : wire      ? (double(units[0]) + widest) * (kF + 2.0)
                                  : (double(units[0]) + 2 * widest) * kF);
  } else {
    m[MemCategory::gradients] = padded * (kF + (wire ? 2.0 : 0.0));
  }
  // AdamW's m and v; offloaded (the last `host` states: offload.optimizer_fraction), also the
  // host copies of those states' gradients and parameters.
  const double host =
      l.offload_optimizer ? double(core::offloaded_states(std::size_t(shard), l.offload_fraction))
                          : 0.0;
  m[MemCategory::optimizer] = 2 * (shard - host) * kF;
  m[MemCategory::offloaded] = 4 * host * kF;
  const double one_slot =
      double(cube ? core::Model3D::activation_floats(spec, l.micro_batch, l.seq_len, q, stage)
                  : core::Model2D::activation_floats(spec, l.micro_batch, l.seq_len, q, stage));
  m[MemCategory::temporaries] =
      kF * double(cube ? core::Model3D::temporary_floats(spec, l.micro_batch, l.seq_len, q)
                       : core::Model2D::temporary_floats(spec, l.micro_batch, l.seq_len, q));
  // The blocks as the checkpoint schedule leaves them (core::grid_activation_floats, what the
  // models allocate): activation_floats counts every block's whole set.
  const core::GridBlockFloats block =
      core::grid_block_floats(spec, l.tensor_mode, l.micro_batch, l.seq_len, q);
  const core::GridActivationFloats blocks = core::grid_activation_floats(
      core::sharded::stage_recompute(l.keep, spec, stage, l.selective), block);
  const double stage_blocks = core::sharded::stage_blocks(spec, stage);
  m[MemCategory::activations] =
      kF * slots * (one_slot - (stage_blocks * double(block.set) - double(blocks.kept)));
  m[MemCategory::temporaries] += kF * double(blocks.arena + blocks.selective);
  // A stage after the first: the stage link's input-gradient send buffers, one per slot.
  if (l.pipeline > 1 && !stage.embeds)
    m[MemCategory::temporaries] += kF * slots * double(block.input);
  m[MemCategory::data] = 2.0 * slots * l.micro_batch * l.seq_len * 4;  // token ids and targets
  return m;
}

// Every chunk of the rank (one, or several interleaved: each a model of its own).
MemoryPrediction grid_memory(const core::ModelSpec& spec, const RankLayout& l) {
  MemoryPrediction m;
  // No bf16 copy of the weights (bf16_weight_copy): the grid models hold nothing
  // (core::GridModel::held_floats).
  for (const auto& chunk : l.chunks) {
    const MemoryPrediction c = grid_chunk_memory(spec, l, chunk);
    for (std::size_t k = 0; k < m.bytes.size(); ++k) m.bytes[k] += c.bytes[k];
  }
  if (l.inference) {  // a store without gradients, no AdamW
    m[core::MemCategory::gradients] = 0.0;
    m[core::MemCategory::optimizer] = 0.0;
    m[core::MemCategory::offloaded] = 0.0;  // only the optimizer's under the grid models
  }
  return m;
}

// One model chunk's share of the step, without the pipeline bubble.
TimePrediction grid_chunk_time(const core::ModelSpec& spec, const RankLayout& l,
                               const RankLayout::Chunk& chunk, const HardwareSpec& hw) {
  TimePrediction t;
  const bool cube = l.tensor_mode == core::TensorMode::d3;
  const int q = l.grid_side(), ranks = cube ? q * q * q : q * q;  // one copy of the model
  const double m = l.micro_batches, tokens = double(l.micro_batch) * l.seq_len;
  // A pipeline stage: its blocks, and the head on the last.
  const core::StageRange stage = chunk.stage;
  const double C = spec.hidden, F = spec.ffn_hidden, T = l.seq_len;
  const double L = core::sharded::stage_blocks(spec, stage), head = stage.head ? 1.0 : 0.0;
  // Compute: the matmuls (6 N per token: a block's and the head's, as the pipeline partition
  // counts them, core::block_forward_flops and head_forward_flops) at the rate of one local MLP
  // product, attention (12 L T C per token) at the attention rate, both over the grid's ranks.
  const double block_n = (core::block_forward_flops(spec, l.seq_len) - 4.0 * T * C) / 2.0;
  const double n = L * block_n + head * core::head_forward_flops(spec) / 2.0;
  const double matmul = 6.0 * n * tokens / ranks, attention = 12.0 * L * T * C * tokens / ranks;
  const double local_mlp = cube ? 2.0 * (tokens / q) * (C / q) * (F / (q * q))
                                : 2.0 * (tokens / q) * (C / q) * (F / q);
  const double rows = tokens / (cube ? q * q : q), c = C / q, f = F / q;
  // Memory-bound kernels per layer and micro-batch, forward and backward: layernorms, residual
  // adds, bias adds and the activation, about 24 passes over R x c and 6 over R x f floats.
  const double elementwise = L * kF * (24.0 * rows * c + 6.0 * rows * f);
  // model.fused_attention: q/k/v stay fp32 in the grid models, so the fp32 fused rate (a GPU
  // runs its team kernels, not the tensor-core ones).
  const double attention_rate = hw.attention_rate(
      spec.fused_attention ? AttentionForm::fused : AttentionForm::dense, T, C / spec.heads);
  t.compute = m * (matmul / hw.gemm_rate(local_mlp, l.bf16_gemm()) + attention / attention_rate +
                   elementwise / hw.memory_bandwidth);
  t.flops = m * (matmul + attention);
  // Collectives: the closed forms of one forward + backward, each group a ring on the link that
  // spans the tensor group; about six collectives per linear and three per layernorm for latency.
  const LinkSpec& link = link_for(l.tensor, hw);
  const double collectives = (4 * L + head) * (cube ? 9.0 : 2.0 * q + 4.0) + (2 * L + head) * 3;
  // Wire bytes of a payload (floats) as the communicators count them (parallel::ring_wire_bytes).
  using parallel::CollectiveKind;
  auto wire = [](CollectiveKind kind, double floats, int ranks) {
    return parallel::ring_wire_bytes(kind, kF * floats, ranks);
  };
  double bytes = 0.0;
  if (cube) {
    const auto c3 = core::Model3D::step_communication(spec, l.micro_batch, l.seq_len, q, stage);
    bytes = wire(CollectiveKind::all_gather,
                 c3.input_all_gather + c3.weight_all_gather + c3.output_all_gather, q) +
            wire(CollectiveKind::reduce_scatter,
                 c3.input_reduce_scatter + c3.weight_reduce_scatter + c3.output_reduce_scatter, q) +
            wire(CollectiveKind::all_reduce,
                 c3.input_all_reduce + c3.weight_all_reduce + c3.output_all_reduce, q) +
            // The embedding's reduce-scatter and all-gather over the q^2 plane.
            wire(CollectiveKind::all_gather, c3.plane_all_gather, q * q) +
            wire(CollectiveKind::reduce_scatter, c3.plane_reduce_scatter, q * q);
  } else {
    const auto c2 = core::Model2D::step_communication(spec, l.micro_batch, l.seq_len, q, stage);
    bytes = wire(CollectiveKind::all_gather, c2.row_all_gather + c2.col_all_gather, q) +
            wire(CollectiveKind::reduce_scatter, c2.row_reduce_scatter + c2.col_reduce_scatter, q) +
            wire(CollectiveKind::broadcast, c2.row_broadcast + c2.col_broadcast, q) +
            wire(CollectiveKind::all_reduce, c2.row_all_reduce + c2.col_all_reduce, q);
  }
  t.tensor_comm = m * (bytes / link.bandwidth_Bps + collectives * link.latency_s);
  const bool selective = l.selective && !spec.fused_attention;  // core::sharded::stage_recompute
  if (!l.keep.empty() || selective) {
    // Each dropped block's forward runs again in backward: a third of a block's products,
    // attention and elementwise passes, and of its share of the tensor group's traffic; under
    // selective each kept block's attention forward (a third of its attention work).
    const int dropped = core::sharded::stage_recompute(l.keep, spec, stage).dropped_blocks();
    const double block_matmul = 6.0 * (4.0 * C * C + 2.0 * C * F) * tokens / ranks;
    const double block_attention = 12.0 * T * C * tokens / ranks / attention_rate;
    const double block_elementwise = kF * (24.0 * rows * c + 6.0 * rows * f);
    const double block_forward = (block_matmul / hw.gemm_rate(local_mlp, l.bf16_gemm()) +
                                  block_attention + block_elementwise / hw.memory_bandwidth) /
                                 3.0;
    const double probabilities = selective ? (L - dropped) * block_attention / 3.0 : 0.0;
    const double again = t.tensor_comm * dropped / (3.0 * L);
    t.recompute = m * (dropped * block_forward + probabilities) + again;
    t.compute += m * (dropped * block_forward + probabilities);
    t.tensor_comm += again;
  }
  // Gradients: every element over the data ranks (and the 2.5D depth), replicated vectors down
  // their column or plane (small, counted with the rest): the units as the models pad them.
  const std::size_t unit = l.zero_stage >= 1 ? std::size_t(16) * std::size_t(l.data) : 16;
  const std::size_t floor =
      core::grid_first_unit_floats(spec, l.tensor_mode, q, unit, stage, l.zero_stage);
  double params = 0.0, unit_count = 0.0;
  for (std::size_t u : cube ? core::Model3D::unit_floats(spec, q, unit, stage, floor)
                            : core::Model2D::unit_floats(spec, q, unit, stage, floor)) {
    params += double(u);
    unit_count += 1.0;
  }
  const int replicas = l.data * (cube ? 1 : l.depth);
  const LinkSpec& data_link = link_for(l.tensor * l.data, hw);
  if (l.zero_stage == 2) {
    // Every micro-batch's gradients reduce-scattered over the data ranks, the shard summed over
    // the 2.5D depth, the updated parameters all-gathered.
    // Under parallel.grad_reduce: bf16 the data ranks' sums move 2 bytes an element.
    const double gb = l.bf16_reduce ? 2.0 : kF;
    t.data_comm = m * gather_time(params * gb, l.data, data_link) +
                  all_reduce_time(params / l.data * kF, cube ? 1 : l.depth, data_link) +
                  gather_time(params * kF, l.data, data_link);
  } else if (l.bf16_reduce) {  // the data ranks' sum in bf16, the model's sum over depth in fp32
    t.data_comm = all_reduce_time(params * 2.0, l.data, data_link) +
                  all_reduce_time(params * kF, replicas / l.data, data_link);
  } else {
    t.data_comm = all_reduce_time(params * kF, replicas, data_link);
  }
  // ZeRO 1: the parameters all-gathered over the data ranks after the update of a 1/data shard.
  const double updated = l.zero_stage >= 1 ? params / l.data : params;
  if (l.zero_stage == 1 && l.data > 1) t.data_comm += gather_time(params * kF, l.data, data_link);
  // Overlap, as in 1d (predict_time): the reduction but its last piece (bucket, or each
  // micro-batch's last unit) beside backward (the last micro-batch's at stages 0-1, every one's
  // at 2), where the transport moves it on its own; the all-gather after the update never hides.
  // Backward: two thirds of the products' time, plus what is recomputed.
  if (replicas > 1) {
    const double after = l.zero_stage >= 1 ? gather_time(params * kF, l.data, data_link) : 0.0;
    const double pieces = l.zero_stage < 2 ? std::ceil(params * kF / (l.bucket_mb * 1024 * 1024))
                                           : unit_count;
    const double backward = 2.0 / 3.0 * (t.compute - t.recompute) + t.recompute;
    t.hidden_comm = hidden_reduction(hw, t.data_comm, after, pieces,
                                     l.zero_stage < 2 ? backward / m : backward);
  }
  const double housekeeping = gradient_housekeeping(hw, l.zero_stage <= 1 ? params : updated);
  t.optimizer = housekeeping +
                optimizer_time(hw, updated, l.offload_optimizer ? l.offload_fraction : 0.0, kF);
  t.gradient_norm = housekeeping / 2;
  if (l.pipeline > 1) {
    // Stages: each micro-batch's R x c boundary sent forward and its gradient back on the link
    // between stages; the tied embedding summed over the first and the last stage.
    const LinkSpec& stage_link = link_for(l.tensor * l.data * l.pipeline, hw);
    const double boundary = kF * tokens / (cube ? q * q : q) * (C / q);
    const int sends = int(!stage.embeds) + int(!stage.head);
    t.pipeline_comm = m * sends * stage_send_time(boundary, stage_link, hw);
    if (stage.embeds != stage.head) {  // this rank's token embedding block
      const int rows = cube ? q * q : q;
      const double vb = double((spec.vocab + rows - 1) / rows);
      t.data_comm += all_reduce_time(vb * (C / q) * kF, 2, stage_link);
    }
  }
  return t;
}

// Every chunk of the rank; fill and drain idle (P - 1) micro-batches of this rank's work over
// its v chunks (GPipe and 1F1B: v = 1; interleaved: the bubble shrinks v-fold), equal stages.
TimePrediction grid_time(const core::ModelSpec& spec, const RankLayout& l,
                         const HardwareSpec& hw) {
  TimePrediction t;
  for (const auto& chunk : l.chunks) {
    const TimePrediction c = grid_chunk_time(spec, l, chunk, hw);
    t.compute += c.compute;
    t.recompute += c.recompute;
    t.tensor_comm += c.tensor_comm;
    t.pipeline_comm += c.pipeline_comm;
    t.data_comm += c.data_comm;
    t.hidden_comm += c.hidden_comm;
    t.optimizer += c.optimizer;
    t.gradient_norm += c.gradient_norm;
    t.flops += c.flops;
  }
  if (l.pipeline > 1) {
    t.bubble = (l.pipeline - 1) * (t.compute + t.tensor_comm + t.pipeline_comm) /
               (double(l.micro_batches) * double(l.chunks.size()));
  }
  t.step = t.compute + t.tensor_comm + t.pipeline_comm + t.bubble + t.data_comm - t.hidden_comm +
           t.optimizer;
  return t;
}

}  // namespace

MemoryPrediction predict_memory(const core::ModelSpec& spec, const RankLayout& l) {
  if (l.tensor_mode != core::TensorMode::d1) return grid_memory(spec, l);
  using core::MemCategory;
  MemoryPrediction m;
  const double D = double(l.data) * l.sequence;  // ZeRO shards over data x sequence
  const int chunk_len = l.seq_len / l.sequence;
  const double rows = double(l.micro_batch) * chunk_len /
                      (l.sequence_split && l.tensor > 1 ? l.tensor : 1);
  double held = 0.0;  // the most floats a chunk holds in the GEMM (bf16_weight_copy)
  for (const RankLayout::Chunk& chunk : l.chunks) {
    const ChunkParams p = chunk_params(spec, l, chunk);
    // core::Model::held_floats: ZeRO-3 holds the LM head alone (in the chunked head, tensor 1).
    held = std::max(held, l.zero_stage < 3 ? p.flat
                          : chunk.stage.head && core::head_in_forward(l.tensor)
                              ? double(core::padded_vocab(spec, 1)) * spec.hidden
                              : 0.0);
    // fp32 training keeps parameters, gradients, m and v in 4 bytes each. bf16 (mixed precision,
    // as Megatron-LM): 2-byte parameters, 4-byte gradients, and an fp32 master copy with m and v
    // (12 bytes) in the optimizer states.
    const double pb = l.bf16 ? 2.0 : kF, ob = l.bf16 ? 6.0 : kF;  // per parameter; 2 states
    const double P = p.flat * pb, S = P / D, work = (p.first + p.widest) * pb;
    // Gradient work buffers (D > 1): unit 0's and two block units' (one reducing, one filling);
    // reduced in bf16, unit 0's and one block's, and a bf16 copy of each in flight instead.
    const double G = p.flat * kF, GS = G / D;
    const double gwork = l.bf16_reduce ? (p.first + p.widest) * (kF + 2.0)
                                       : (p.first + 2 * p.widest) * kF;
    // Stages 0-1 reduced in bf16 (D > 1): a bf16 copy of the flat buffer.
    const double wire = l.bf16_reduce && D > 1 ? p.flat * 2.0 : 0.0;
    const double O = p.flat * ob, OS = O / D;
    // Offloaded (stages 1-3): the last `host` of the shard's states (offload.optimizer_fraction)
    // keep their moments, gradients and (unless the parameter shard is there already) parameters
    // in host memory; the rest of the moments stay on the device.
    const double shard_states = l.zero_stage == 0 ? p.flat : p.flat / D;
    const double host =
        l.offload_optimizer && l.zero_stage > 0
            ? double(core::offloaded_states(std::size_t(shard_states), l.offload_fraction))
            : 0.0;
    const double OH = host * ob;
    switch (l.zero_stage) {
      case 0:
        m[MemCategory::parameters] += P;
        m[MemCategory::gradients] += G + wire;
        m[MemCategory::optimizer] += 2 * O;
        break;
      case 1:
      case 2:
        m[MemCategory::parameters] += P;
        m[MemCategory::gradients] += l.zero_stage == 1 ? G + wire : GS + (D > 1 ? gwork : 0.0);
        m[MemCategory::optimizer] += 2 * (OS - OH);
        m[MemCategory::offloaded] += 2 * OH;
        break;
      default:  // 3: the shard, plus two gather buffers unless one rank holds everything, and
                // on several ranks or with parameter offload a third for the block unit
                // gathered (or uploaded) ahead (prefetch). With
                // parameter offload the shard's last states (offload.params_fraction) live on
                // the host, which holds a whole shard (the rest: the optimizer's copy).
        m[MemCategory::parameters] +=
            S - (l.offload_params ? double(core::offloaded_states(std::size_t(shard_states),
                                                                  l.offload_params_fraction)) *
                                        pb
                                  : 0.0);
        if (l.offload_params) m[MemCategory::offloaded] += S;
        if (D > 1 || l.offload_params) m[MemCategory::parameters] += work;
        if (D > 1 || l.offload_params) m[MemCategory::parameters] += p.widest * pb;
        m[MemCategory::gradients] += GS + (D > 1 ? gwork : 0.0);
        m[MemCategory::optimizer] += 2 * (OS - OH);
        m[MemCategory::offloaded] += 2 * OH;
        break;
    }
    // The offloaded states' gradients and (unless offloaded already) parameters on the host.
    m[MemCategory::offloaded] += host * kF + (l.offload_params ? 0.0 : host * pb);
    if (l.sequence_split && (l.tensor > 1 || l.pipeline > 1) && !l.inference) {
      m[MemCategory::temporaries] += p.layernorm_owned * kF;  // packed partial layernorm grads
    }
    const StepGraph graph = build_step_graph(spec, l.graph_layout(chunk));
    m[MemCategory::activations] += graph.saved_bytes() * chunk.slots;
    m[MemCategory::temporaries] += graph.scratch_bytes + graph.arena_bytes + graph.selective_bytes;
    // Trainer: token ids and targets per slot; gradient sends to the previous stage per slot.
    m[MemCategory::data] += 2.0 * l.micro_batch * chunk_len * chunk.slots * 4;
    if (chunk.virtual_stage > 0) m[MemCategory::temporaries] += rows * spec.hidden * kF * chunk.slots;
    if (l.decode) {  // core::Model::enable_decode
      core::ActivationShape shape;
      shape.batch = l.micro_batch;
      shape.seq_len = chunk_len;
      shape.tensor = l.tensor;
      shape.sequence_split = l.sequence_split;
      shape.ring = l.sequence;
      const core::DecodeSizes d = core::decode_sizes(spec, shape, chunk.stage);
      m[MemCategory::activations] += double(d.cache) * kF;
      m[MemCategory::temporaries] += double(d.buffers()) * kF;
    }
  }
  if (l.bf16_weight_copy) m[MemCategory::temporaries] += 2.0 * held;
  if (l.inference) {  // a store without gradients, no AdamW (the offloaded: the stage-3 host shard)
    m[MemCategory::gradients] = 0.0;
    m[MemCategory::optimizer] = 0.0;
  }
  return m;
}

OpTime op_time(const Op& op, const RankLayout& l, const HardwareSpec& hw, bool fused_attention) {
  OpTime t;
  const double bw = hw.memory_bandwidth;
  const double memory = op.bytes / bw;
  const std::string_view kind = op.kind;
  if (kind == "gemm") {
    // Backward is two GEMMs of the forward's size (input and weight gradients).
    const double f = op.forward_flops;
    t.forward = std::max(f / hw.gemm_rate(f, l.bf16_gemm()), memory);
    t.backward = std::max(op.backward_flops / hw.gemm_rate(op.backward_flops / 2, l.bf16_gemm()),
                          2 * memory);
    if (op.recomputed) t.recompute = t.forward;
  } else if (kind == "attention") {
    // The dense core at one rate (the GPU presets' half the TF32 peak stands for its
    // memory-bound softmax and masking, in bf16 as in fp32); the fused core at its precision's:
    // with q/k/v in bf16 a GPU runs it on the tensor cores.
    // Calibrated hardware has each form's rate by block length and head width.
    const AttentionForm form = !fused_attention         ? AttentionForm::dense
                               : l.bf16 || l.bf16_operands ? AttentionForm::fused_bf16
                                                         : AttentionForm::fused;
    const double rate = hw.attention_rate(form, op.seq, op.head_dim);
    t.forward = std::max(op.forward_flops / rate, memory);
    t.backward = std::max(op.backward_flops / rate, 2 * memory);
    if (op.recomputed) t.recompute = t.forward;
    // Selective recompute runs the attention core again in backward.
    if (op.recompute_flops > 0 && !op.recomputed) t.recompute = t.forward;
  } else {
    // Memory-bound: backward reads and writes about twice the forward's bytes; the MLP activation
    // is also recomputed there (it is never saved).
    t.forward = memory;
    t.backward = (kind == "activation" ? 2.5 : 2.0) * memory;
    if (op.recomputed) t.recompute = t.forward;
  }
  if (op.collective_bytes > 0) {
    const char* c = op.collective;
    const int inside_tp = l.tensor, inside_sp = l.tensor * l.sequence;
    if (std::strstr(c, "(tp)") != nullptr) {
      const LinkSpec& link = link_for(inside_tp, hw);
      if (starts_with(c, "all_reduce")) {
        t.communication = all_reduce_time(op.collective_bytes, l.tensor, link);
      } else if (starts_with(c, "reduce_scatter+all_gather") ||
                 starts_with(c, "all_gather+all_gather")) {
        t.communication = 2 * gather_time(op.collective_bytes, l.tensor, link);
      } else {
        t.communication = gather_time(op.collective_bytes, l.tensor, link);
      }
    } else if (std::strstr(c, "(sp)") != nullptr) {
      // Ring attention: S-1 key/value block exchanges forward and backward plus the dK/dV
      // reduce-scatter, about 3(S-1) messages.
      const LinkSpec& link = link_for(inside_sp, hw);
      t.communication = 3.0 * (l.sequence - 1) * link.latency_s +
                        op.collective_bytes / link.bandwidth_Bps;
    }  // (pp): the stage-boundary transfers are counted per step by predict_time
    // Recomputation runs the forward's collectives again.
    if (op.recomputed) t.recompute += op.forward_collective * t.communication;
  }
  return t;
}

double busy_seconds(const TimePrediction& t) { return t.step - t.shared_cores; }

void stretch_step(TimePrediction& t, double shared_step) {
  const double own = busy_seconds(t);
  t.shared_cores = std::max(0.0, shared_step - own);
  t.step = own + t.shared_cores;
}

void share_cores(TimePrediction& t, double node_thread_seconds, int cores) {
  if (cores > 0) stretch_step(t, node_thread_seconds / cores);
}

void share_node_cores(TimePrediction& t, const SharedCoresLayout& l,
                      const std::vector<TimePrediction>& stages) {
  if (l.pinned) {
    stretch_step(t, pinned_step(l, stages));
    return;
  }
  const int replicas = l.data * l.tensor * l.sequence;
  const int nodes = l.ranks_per_node > 0 ? replicas * l.pipeline / l.ranks_per_node : 1;
  double thread_seconds = 0.0;
  for (const TimePrediction& s : stages) thread_seconds += busy_seconds(s) * replicas * l.threads;
  share_cores(t, thread_seconds / std::max(1, nodes), l.cores);
}

double pinned_step(const SharedCoresLayout& l, const std::vector<TimePrediction>& stages) {
  if (int(stages.size()) != l.pipeline || l.cores < 1) {
    throw std::invalid_argument("pinned_step: " + std::to_string(stages.size()) +
                                " stage predictions for " + std::to_string(l.pipeline) +
                                " stages on " + std::to_string(l.cores) + " cores");
  }
  const int group = l.tensor * l.sequence, stages_n = l.pipeline, chunks = l.chunks;
  const int virtual_stages = stages_n * chunks, m = l.micro_batches;
  const int world = group * l.data * stages_n;
  const int per_node = l.ranks_per_node > 0 ? l.ranks_per_node : world;
  const int nodes = (world + per_node - 1) / per_node, cores = nodes * l.cores;
  const auto core_of = [&](int rank) {
    return rank / per_node * l.cores + rank % per_node % l.cores;
  };
  // A stage replica: its pipeline rank, the cores its tensor x sequence ranks are pinned to, and
  // how many of them share the busiest of those cores (they run one after another there).
  struct Replica {
    int stage = 0;
    std::vector<int> cores;
    int crowd = 1;
    std::vector<parallel::PipelineAction> actions;
    std::size_t next = 0;
    double free_at = 0.0;  // when its previous piece ended
  };
  std::vector<Replica> replicas;
  for (int p = 0; p < stages_n; ++p) {
    const auto actions = parallel::pipeline_schedule(l.schedule, stages_n, p, m, chunks);
    for (int d = 0; d < l.data; ++d) {
      Replica r;
      r.stage = p;
      r.actions = actions;
      std::vector<int> count(std::size_t(cores), 0);
      for (int g = 0; g < group; ++g) {
        const int rank = g + group * (d + l.data * p);  // mesh order tp-sp-dp-pp
        ++count[std::size_t(core_of(rank))];
      }
      for (int c = 0; c < cores; ++c) {
        if (count[std::size_t(c)] > 0) r.cores.push_back(c);
        r.crowd = std::max(r.crowd, count[std::size_t(c)]);
      }
      replicas.push_back(std::move(r));
    }
  }
  for (const TimePrediction& t : stages) {
    if (int(t.micro_forward.size()) != chunks || int(t.micro_backward.size()) != chunks) {
      throw std::invalid_argument("pinned_step: a stage prediction holds " +
                                  std::to_string(t.micro_forward.size()) + " forward and " +
                                  std::to_string(t.micro_backward.size()) + " backward times for " +
                                  std::to_string(chunks) + " chunks");
    }
  }
  const auto piece_seconds = [&](const Replica& r, const parallel::PipelineAction& a) {
    const TimePrediction& t = stages[std::size_t(r.stage)];
    return r.crowd * (a.forward ? t.micro_forward : t.micro_backward)[std::size_t(a.chunk)];
  };
  // When (data replica d, virtual stage, micro-batch) finished its forward / backward.
  const auto key = [&](int d, int v, int micro) {
    return (std::size_t(d) * virtual_stages + std::size_t(v)) * std::size_t(m) + std::size_t(micro);
  };
  const double never = std::numeric_limits<double>::infinity();
  std::vector<double> forward_done(std::size_t(l.data) * virtual_stages * m, never);
  std::vector<double> backward_done(forward_done.size(), never);
  std::vector<double> core_free(std::size_t(cores), 0.0);
  // The time a replica's next piece may start (inputs arrived, previous piece ended); never if
  // its inputs are not yet computed.
  const auto ready_at = [&](const Replica& r, int d) {
    const parallel::PipelineAction& a = r.actions[r.next];
    const int v = a.chunk * stages_n + r.stage;
    double input = 0.0;
    if (a.forward) {
      if (v > 0) input = forward_done[key(d, v - 1, a.micro)];
    } else {
      input = v < virtual_stages - 1 ? backward_done[key(d, v + 1, a.micro)]
                                     : forward_done[key(d, v, a.micro)];
    }
    return std::max(input, r.free_at);
  };
  // Event simulation: repeatedly start, among the pieces whose inputs are ready, the one that
  // became ready first (ties: the lower replica) at the moment all its cores are free.
  std::size_t remaining = 0;
  for (const Replica& r : replicas) remaining += r.actions.size();
  while (remaining > 0) {
    int best = -1;
    double best_ready = never, best_start = never;
    for (std::size_t i = 0; i < replicas.size(); ++i) {
      const Replica& r = replicas[i];
      if (r.next >= r.actions.size()) continue;
      const double ready = ready_at(r, int(i) % l.data);
      if (ready == never) continue;
      double start = ready;
      for (int c : r.cores) start = std::max(start, core_free[std::size_t(c)]);
      // Earliest start first; among pieces that could start at once, the longest waiting.
      if (start < best_start - 1e-15 || (start <= best_start + 1e-15 && ready < best_ready)) {
        best = int(i);
        best_start = start;
        best_ready = ready;
      }
    }
    if (best < 0) throw std::logic_error("pinned_step: the pipeline schedule cannot proceed");
    Replica& r = replicas[std::size_t(best)];
    const parallel::PipelineAction& a = r.actions[r.next];
    const double end = best_start + piece_seconds(r, a);
    for (int c : r.cores) core_free[std::size_t(c)] = end;
    const int v = a.chunk * stages_n + r.stage;
    (a.forward ? forward_done : backward_done)[key(best % l.data, v, a.micro)] = end;
    r.free_at = end;
    ++r.next;
    --remaining;
  }
  // Each replica's gradient reduction and optimizer step once its last piece is done and its
  // cores are free, the replicas that finished first going first.
  std::vector<const Replica*> finished;
  for (const Replica& r : replicas) finished.push_back(&r);
  std::stable_sort(finished.begin(), finished.end(),
                   [](const Replica* a, const Replica* b) { return a->free_at < b->free_at; });
  for (const Replica* r : finished) {
    const TimePrediction& t = stages[std::size_t(r->stage)];
    double start = r->free_at;
    for (int c : r->cores) start = std::max(start, core_free[std::size_t(c)]);
    for (int c : r->cores) {
      core_free[std::size_t(c)] = start + r->crowd * (t.data_comm - t.hidden_comm + t.optimizer);
    }
  }
  return *std::max_element(core_free.begin(), core_free.end());
}

TimePrediction predict_time(const core::ModelSpec& spec, const RankLayout& l,
                            const HardwareSpec& hw) {
  if (l.tensor_mode != core::TensorMode::d1) return grid_time(spec, l, hw);
  TimePrediction t;
  const double m = l.micro_batches;
  const int chunk_len = l.seq_len / l.sequence;
  const double rows = double(l.micro_batch) * chunk_len /
                      (l.sequence_split && l.tensor > 1 ? l.tensor : 1);
  const int world = l.data * l.tensor * l.sequence * l.pipeline;
  double per_micro = 0.0, flat = 0.0, units = 0.0;
  double late_units = 0.0;  // the first chunk's unit 0 and (several data ranks) first block
  double unskipped = 0.0;   // the first chunk's unit 0 where backward does not gather it
  double first_unit = 0.0, first_block = 0.0, last_unit = 0.0;  // the first chunk's, the last's
  // Stage 3 under recomputed segments: the block units a micro-batch's backward gathers beyond
  // one each (a segment recomputed upward, then its backward downward: core::
  // backward_block_transfers), their floats and their count.
  double regathered_floats = 0.0, regathers = 0.0;
  // Stage 3: the floats of units still in their buffer when gathered, per step, and the turns
  // that keep them, F B and B F, every chunk's (a gather saved at each).
  double reused_floats = 0.0;
  double turns_to_backward = 0.0, turns_to_forward = 0.0;
  for (const RankLayout::Chunk& chunk : l.chunks) {
    const StepGraph graph = build_step_graph(spec, l.graph_layout(chunk));
    double forward = 0.0, backward = 0.0;
    for (const Op& op : graph.ops) {
      const OpTime o = op_time(op, l, hw, spec.fused_attention);
      const double seconds = m * (o.forward + o.backward + o.recompute);
      t.compute += seconds;
      t.kind_compute[op.kind] += seconds;
      t.recompute += m * o.recompute;
      t.tensor_comm += m * o.communication;
      per_micro += o.total();
      forward += o.forward + op.forward_collective * o.communication;
      backward += o.backward + o.recompute + (1.0 - op.forward_collective) * o.communication;
    }
    t.flops += m * (graph.forward_flops() + graph.backward_flops());
    if (l.pipeline > 1) {
      // The activation out (unless last) and its gradient back (unless first), per micro-batch.
      const double bytes = rows * spec.hidden * (l.bf16 ? 2.0 : kF);
      const LinkSpec& link = link_for(world, hw);
      const int virtual_stages = l.pipeline * int(l.chunks.size());
      const int transfers = (chunk.virtual_stage > 0) + (chunk.virtual_stage < virtual_stages - 1);
      const double send = stage_send_time(bytes, link, hw);
      t.pipeline_comm += m * transfers * send;
      per_micro += transfers * send;
      // The activation leaves after the forward, its gradient after the backward.
      if (chunk.virtual_stage < virtual_stages - 1) forward += send;
      if (chunk.virtual_stage > 0) backward += send;
    }
    t.micro_forward.push_back(forward);
    t.micro_backward.push_back(backward);
    const ChunkParams p = chunk_params(spec, l, chunk);
    if (&chunk == &l.chunks.front()) {
      late_units = p.first + (l.data * l.sequence > 1 ? p.widest : 0.0);
      // Backward gathers the embeddings only for a tied LM head that runs its backward there
      // (tensor > 1: ActivationSizes::head_in_forward is false); unit 0 of a stage without them
      // is a block.
      const bool gathered = !chunk.stage.embeds ||
                            (chunk.stage.head && spec.tied() && l.tensor > 1);
      unskipped = gathered ? 0.0 : p.first;
      first_unit = p.first;
      first_block = p.second;
    }
    last_unit = p.last;
    flat += p.flat;
    units += p.units;
    if (l.zero_stage == 3 && !graph.keep.empty()) {
      // Backward starts with the final unit in the block buffer on the head's chunk, else with
      // the chunk's last block (its forward ended on it).
      // A stage without the embeddings' unit 0 (no tokens to embed, no tied LM head) has its
      // first block as unit 0, in a buffer of its own.
      const int blocks = int(graph.keep.size()) / core::kOpsPerBlock;
      const int held = chunk.stage.head ? -1 : blocks - 1;
      const bool apart = !(chunk.stage.embeds || (chunk.stage.head && spec.tied()));
      const std::vector<core::Keep> kept(graph.keep.size(), core::Keep::all);
      const double extra = core::backward_block_transfers(graph.keep, held, apart) -
                           core::backward_block_transfers(kept, held, apart);
      regathers += extra;
      regathered_floats += extra * p.widest;
    }
    if (l.zero_stage == 3 && p.units > 1) {
      // The last unit other than 0 gathered stays in the block buffer
      // (zero::ShardedParameterStore; unit 0 has a buffer of its own): at F B the backward
      // starts on the unit its forward ended on (the chunk's last), at B F the forward's first
      // such unit (the chunk's second) is the one the backward ended on; neither is gathered or
      // uploaded again.
      const double forward_turns = chunk.forward_turns >= 0 ? chunk.forward_turns : m;
      const double backward_turns = chunk.backward_turns >= 0 ? chunk.backward_turns : m - 1;
      reused_floats += forward_turns * p.last + backward_turns * p.second;
      turns_to_backward += forward_turns;
      turns_to_forward += backward_turns;
    }
  }
  // Fill and drain: (p - 1) / v micro-batch times (v model chunks per rank, Narayanan et al.).
  if (l.pipeline > 1) t.bubble = double(l.pipeline - 1) / double(l.chunks.size()) * per_micro;
  // Gradient reduction over data x sequence (zero/README.md): stage 0 all-reduces, 1 adds the
  // parameter all-gather, 2 reduce-scatters every micro-batch, 3 also gathers twice per micro-batch.
  // Gradients move in fp32 (2 bytes under parallel.grad_reduce: bf16; the buckets are still cut
  // in fp32 floats); parameters in their storage type (2 bytes under bf16, as predict_memory
  // keeps them).
  const int D = l.data * l.sequence;
  const double P = flat * (l.bf16_reduce ? 2.0 : kF), W = flat * (l.bf16 ? 2.0 : kF);
  // Stage 3 keeps the unit it gathered last in its buffer: the gathers it saves are counted with
  // the chunks (reused_floats, turns_to_*), from their schedules' turns (on one pipeline stage
  // each micro-batch's backward starts on the last unit, and each micro-batch after the first on
  // the first block); so are recomputed segments' extra gathers (regathers), and parameter
  // offload's uploads below follow the same turns.
  const LinkSpec& dp_link = link_for(l.tensor * l.sequence * l.data, hw);
  // One micro-batch's compute, forward and backward (every chunk), which started collectives and
  // uploads may run beside.
  double forward = 0.0, backward = 0.0;
  for (double f : t.micro_forward) forward += f;
  for (double b : t.micro_backward) backward += b;
  if (D > 1) {
    // Each bucket's all-reduce pays the ring's latency again; the bytes are the buffer's.
    const double buckets = std::max(1.0, std::ceil(flat * kF / (l.bucket_mb * 1024 * 1024)));
    switch (l.zero_stage) {
      case 0:
        t.data_comm = all_reduce_time(P, D, dp_link) + (buckets - 1) * 2 * (D - 1) * dp_link.latency_s;
        break;
      case 1:
        t.data_comm = all_reduce_time(P, D, dp_link) + gather_time(W, D, dp_link) +
                      (buckets - 1) * 2 * (D - 1) * dp_link.latency_s;
        break;
      case 2:
        t.data_comm = m * gather_time(P, D, dp_link) + gather_time(W, D, dp_link) +
                      (m * units - m) * (D - 1) * dp_link.latency_s;
        break;
      default:
        t.data_comm = m * (gather_time(P, D, dp_link) + 2 * gather_time(W, D, dp_link)) +
                      3 * (m * units - m) * (D - 1) * dp_link.latency_s -
                      (D - 1) * ((turns_to_backward + turns_to_forward) * dp_link.latency_s +
                                 reused_floats * (l.bf16 ? 2.0 : kF) / D / dp_link.bandwidth_Bps) +
                      m * (D - 1) *
                          (regathers * dp_link.latency_s +
                           regathered_floats * (l.bf16 ? 2.0 : kF) / D / dp_link.bandwidth_Bps);
        break;
    }
    // Overlap: what the executor starts early runs beside compute where the transport moves it
    // on its own (HardwareSpec::comm_overlap). Stages 0-1: every bucket but the one backward
    // finishes last, beside the last micro-batch's backward. Stage 2: each unit's reduce-scatter
    // but each micro-batch's last, beside the next unit's backward. Stage 3: the gathers too,
    // prefetched a unit ahead in forward and backward. The all-gather after the update
    // (stages 1-2) never hides.
    const double after = l.zero_stage == 1 || l.zero_stage == 2 ? gather_time(W, D, dp_link) : 0.0;
    t.hidden_comm = hidden_reduction(hw, t.data_comm, after, l.zero_stage < 2 ? buckets : units,
                                     l.zero_stage < 2    ? backward
                                     : l.zero_stage == 2 ? m * backward
                                                         : m * (forward + backward));
  }
  const double updated = l.zero_stage == 0 ? flat : flat / D;
  // Parameter offload (ZeRO 3): every gather uploads this rank's slice's host part. A
  // micro-batch gathers each unit before its forward and again before its backward, but for the
  // embeddings' unit 0 where backward needs no parameters (first in the shard, so on the host only
  // where the offloaded share reaches it) and the units kept in their buffer (above).
  //
  // The store uploads the block unit expected next while the kernels of the one in use run
  // (zero::ShardedParameterStore's prefetch), so those uploads hide behind the micro-batches'
  // compute, as far as the gathers (several data ranks) have not taken it (they overlap on
  // NCCL's stream; over MPI, which the host drives, the host waits for each upload: priced as
  // NCCL, like every GPU run). Not the gathers that start a pass, with no unit before them to
  // hide behind: unit 0 (again in backward where backward gathers it), the first block in
  // forward and the last unit in backward (on one stage: only the first micro-batch's first
  // block; the rest are kept in their buffer, above), each model chunk's. The offloaded states
  // are the shard's last: a unit uploads its part at or past updated - uploaded.
  if (l.offload_params && hw.host_link_bandwidth > 0) {
    const double uploaded =
        double(core::offloaded_states(std::size_t(updated), l.offload_params_fraction));
    const double embeddings = std::max(0.0, unskipped / D - (updated - uploaded));
    const double byte_s = (l.bf16 ? 2.0 : kF) / hw.host_link_bandwidth;
    const double host_from = updated - uploaded;  // the first offloaded state
    auto on_host = [&](double begin, double size) {  // states of [begin, begin + size) there
      return std::max(0.0, begin + size - std::max(begin, host_from));
    };
    const double unit0 = on_host(0.0, first_unit / D);
    const double block1 = on_host(first_unit / D, first_block / D);
    const double last = std::min(last_unit / D, uploaded);
    const double chunks = double(l.chunks.size());
    double total = m * (2.0 * uploaded - embeddings);
    double starts = chunks * m * unit0 * (unskipped > 0.0 ? 1.0 : 2.0);
    // The units kept at the schedule's turns upload nothing (F B: the last unit; B F: the first
    // block); every other pass starts cold on its first block unit (a forward on the first
    // block, a backward on the last unit), with nothing before it to hide behind. One stage:
    // only the step's first forward.
    total -= turns_to_backward * last + turns_to_forward * block1;
    starts += (chunks * m - turns_to_forward) * block1 + (chunks * m - turns_to_backward) * last;
    // The blocks recomputed segments gather again upload their host parts again (at the
    // shard's offloaded share: which blocks they are decides how much of each is on the host).
    total += m * regathered_floats / D * (updated > 0.0 ? uploaded / updated : 0.0);
    t.data_comm += total * byte_s;
    const double window = std::max(0.0, m * (forward + backward) - t.hidden_comm);
    t.hidden_comm += std::min(window, std::max(0.0, total - starts) * byte_s);
  }
  // Stages 2-3: the offloaded gradients go down during the last micro-batch's backward, each
  // unit's as its reduction completes (zero::ShardedAdamW), hidden as far as that backward lasts;
  // not the units whose reductions are still in flight when backward ends (unit 0, the
  // embeddings, last; and on several data ranks the first block), which come down in the step,
  // nor anything under sequence_split, whose partial sums reduce() still changes. The offloaded
  // states are the shard's last, so those units (first in the shard) count only when the share
  // reaches them.
  double grads_hidden = 0.0;
  if (l.offload_optimizer && l.zero_stage >= 2 && !(l.sequence_split && l.tensor > 1) &&
      hw.host_link_bandwidth > 0) {
    const double host = double(core::offloaded_states(std::size_t(updated), l.offload_fraction));
    const double late = std::max(0.0, late_units / D - (updated - host));
    grads_hidden = std::min(backward, std::max(0.0, host - late) * kF / hw.host_link_bandwidth);
  }
  t.optimizer = optimizer_time(hw, updated, l.offload_optimizer ? l.offload_fraction : 0.0,
                               l.bf16 ? 2.0 : kF,
                               l.offload_params ? l.offload_params_fraction : 0.0, grads_hidden);
  const double housekeeping = gradient_housekeeping(hw, l.zero_stage <= 1 ? flat : updated);
  t.optimizer += housekeeping;
  t.gradient_norm = housekeeping / 2;
  t.step = t.compute + t.tensor_comm + t.pipeline_comm + t.bubble + t.data_comm - t.hidden_comm +
           t.optimizer;
  return t;
}


std::string format_profile(const StepGraph& g, const RankLayout& l, const HardwareSpec& hw,
                           bool fused_attention) {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line, "%-24s %-10s %9s %9s %9s %9s %9s %9s  %s\n", "op", "kind",
                "fwd GFLOP", "bwd GFLOP", "moved MB", "saved MiB", "fwd ms", "bwd ms",
                "collective (bytes)");
  out += line;
  OpTime sum;
  for (const Op& op : g.ops) {
    const OpTime o = op_time(op, l, hw, fused_attention);
    sum.forward += o.forward;
    sum.backward += o.backward;
    sum.recompute += o.recompute;
    sum.communication += o.communication;
    std::snprintf(line, sizeof line, "%-24s %-10s %9.3f %9.3f %9.2f %9.2f %9.3f %9.3f  %s%s\n",
                  op.name.c_str(), op.kind, op.forward_flops / 1e9,
                  (op.backward_flops + op.recompute_flops) / 1e9, op.bytes / 1e6,
                  op.saved_bytes / 1048576.0, o.forward * 1e3,
                  (o.backward + o.recompute + o.communication) * 1e3, op.collective,
                  op.collective_bytes > 0
                      ? (" (" + std::to_string(int64_t(op.collective_bytes)) + ")").c_str()
                      : "");
    out += line;
  }
  std::snprintf(line, sizeof line, "%-24s %-10s %9.3f %9.3f %9s %9.2f %9.3f %9.3f  %.0f bytes\n",
                "total", "", g.forward_flops() / 1e9, (g.backward_flops() + g.recompute_flops()) / 1e9,
                "", g.saved_bytes() / 1048576.0, sum.forward * 1e3,
                (sum.backward + sum.recompute + sum.communication) * 1e3, g.collective_bytes());
  out += line;
  std::snprintf(line, sizeof line,
                "(bwd includes recomputation: %.3f ms; collectives inside layers: %.3f ms; "
                "recompute arena %.2f MiB)\n",
                sum.recompute * 1e3, sum.communication * 1e3,
                (g.arena_bytes + g.selective_bytes) / 1048576.0);
  out += line;
  return out;
}

}  // namespace colossal::planner

namespace colossal::planner {

int grid_side(core::TensorMode mode, int tensor, int depth) {
  const core::TensorGrid g = core::tensor_grid(mode, tensor, depth);
  return g.exact ? g.q : 0;
}

int RankLayout::grid_side() const {
  return tensor_mode == core::TensorMode::d1 ? 1 : planner::grid_side(tensor_mode, tensor, depth);
}

}  // namespace colossal::planner
