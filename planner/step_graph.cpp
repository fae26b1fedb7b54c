#include "planner/step_graph.hpp"

#include <stdexcept>
#include <string_view>

#include "core/activation_sizes.hpp"

namespace colossal::planner {

namespace {
double total(const std::vector<Op>& ops, double Op::*field) {
  double sum = 0.0;
  for (const Op& op : ops) sum += op.*field;
  return sum;
}

// Activation checkpointing, as the activation table (core::stage_activations) says core::Model
// stores it: an op whose input is dropped leaves its producer nothing to save, an op whose saved
// set is dropped saves nothing and runs its forward again in backward (its output, the next op's
// input, stays with it); under selective recompute the attention core of kept blocks runs again
// and keeps its probabilities out of the slot. The arena and selective buffer are the table's.
void apply_checkpointing(StepGraph& g, const std::vector<std::size_t>& block_begin,
                         const core::StageActivations& acts, double f) {
  constexpr std::size_t kOps = core::kOpsPerBlock;
  for (std::size_t op = 0; op < acts.keep.size(); ++op) {
    const std::size_t part = op % kOps;
    // Sub-ops of this op, and the one whose output is its input.
    const std::size_t begin = block_begin[op / kOps] + part * 4, end = begin + 4;
    if (acts.keeps_saved(op)) {
      if (acts.selective_at(op)) {
        Op& core = g.ops[begin + 2];
        core.saved_bytes -= f * double(acts.sizes.att);
        core.recompute_flops = core.forward_flops;
      }
      continue;
    }
    if (!acts.keeps_input(op)) g.ops[begin - 1].saved_bytes = 0.0;
    for (std::size_t i = begin; i < end; ++i) {
      Op& o = g.ops[i];
      o.recompute_flops = o.forward_flops;
      o.recomputed = true;
      if (i + 1 < end) o.saved_bytes = 0.0;
      o.name += acts.keeps_input(op) ? " (ckpt)" : " (dropped)";
    }
  }
  g.arena_bytes = f * double(acts.arena);
  g.selective_bytes = f * double(acts.selective_att);
}

}  // namespace

double StepGraph::forward_flops() const { return total(ops, &Op::forward_flops); }
double StepGraph::backward_flops() const { return total(ops, &Op::backward_flops); }
double StepGraph::saved_bytes() const { return total(ops, &Op::saved_bytes); }
double StepGraph::collective_bytes() const { return total(ops, &Op::collective_bytes); }
double StepGraph::recompute_flops() const { return total(ops, &Op::recompute_flops); }

StepGraph build_step_graph(const core::ModelSpec& s, const Layout& l) {
  if (l.tensor < 1 || l.sequence < 1 || l.seq_len % l.sequence != 0 ||
      s.heads % l.tensor != 0 || s.ffn_hidden % l.tensor != 0) {
    throw std::invalid_argument("build_step_graph: the layout does not divide the model");
  }
  const double f = l.bf16 ? 2.0 : 4.0;  // bytes per activation value
  const double t = l.tensor, B = l.micro_batch, T = l.seq_len / l.sequence, keys = l.seq_len;
  const double C = s.hidden, Cl = C / t, H = s.heads / t, F = s.ffn_hidden / t;
  const double V = double(core::padded_vocab(s, l.tensor)) / t;
  const double N = B * T;                                  // tokens of this micro-batch here
  // llama: q with k and v of kv_heads heads (grouped-query), and SwiGLU's gate and up side by
  // side; gpt2/opt: q, k, v of every head and one MLP projection.
  const double kv_cols = s.llama() ? double(s.key_value_heads()) / t * (C / s.heads) : Cl;
  const double qkv_cols = Cl + 2 * kv_cols, fc_cols = s.llama() ? 2 * F : F;
  const double rows = l.sequence_split && l.tensor > 1 ? N / t : N;  // residual-stream rows
  const bool tp = l.tensor > 1, split = tp && l.sequence_split, ring = l.sequence > 1;
  const int first = l.stage.layer_begin, last = l.stage.layer_end < 0 ? s.layers : l.stage.layer_end;
  // What each op saves, the recompute arena and the temporaries: the model's activation table.
  const bool host_bf16 = l.bf16_operands && !l.bf16;  // colossal_train's bf16 storage
  const core::StageActivations acts = core::stage_activations(
      s, core::ActivationShape{l.micro_batch, l.seq_len / l.sequence, l.tensor, l.sequence_split,
                               l.sequence, host_bf16, host_bf16,
                               l.device ? core::kDeviceLogitsChunkFloats : core::kLogitsChunkFloats},
      l.stage, l.keep, l.selective);
  const core::ActivationSizes& a = acts.sizes;
  auto saved = [f](std::size_t floats) { return f * double(floats); };
  // A tensor-parallel boundary: all-reduce of (N, C), or reduce-scatter + all-gather under split.
  // A column-parallel product's input gradient is summed over the group in backward: all-reduced,
  // or under split reduce-scattered back to the rank's rows (the backward of the layernorm
  // output's all-gather before it).
  const char* boundary = split ? "reduce_scatter+all_gather(tp)" : tp ? "all_reduce(tp)" : "";
  const double boundary_bytes = tp ? N * C * f : 0.0;
  StepGraph g;
  g.keep = acts.keep;
  auto add = [&g](Op op) { g.ops.push_back(std::move(op)); };
  // A GEMM of (M, K) x (K, Nout): 2MKN forward; backward computes both input and weight grads.
  auto gemm = [&](std::string name, double M, double K, double Nout, double saved,
                  const char* collective = "", double collective_bytes = 0.0) {
    add(Op{std::move(name), "gemm", 2 * M * K * Nout, 4 * M * K * Nout,
           f * (M * K + K * Nout + M * Nout), saved, collective, collective_bytes});
  };
  if (l.stage.embeds) {
    add(Op{"embedding", "embedding", 0.0, 0.0, f * (N * C + N * C), saved(a.residual), boundary,
           boundary_bytes});
  } else {
    add(Op{"stage input", "embedding", 0.0, 0.0, 0.0, saved(a.residual), "recv(pp)",
           saved(a.residual)});
  }
  // Where each block's ops begin in g.ops: ln_1, qkv, core, out (attention), then ln_2, fc, act,
  // out (MLP). Each sub-layer's output is saved by the op that produced it.
  std::vector<std::size_t> block_begin;
  for (int layer = first; layer < last; ++layer) {
    const std::string h = "h." + std::to_string(layer) + ".";
    block_begin.push_back(g.ops.size());
    // Under split a block's layernorm outputs are all-gathered for the column-parallel product
    // and, kept as this rank's rows only, gathered again in backward for its weight gradient.
    add(Op{h + "ln_1", "layernorm", 0.0, 0.0, f * 2 * rows * C,
           saved(a.ln1 + a.ln1_mean + a.ln1_rstd), split ? "all_gather+all_gather(tp)" : "",
           split ? N * C * f : 0.0});
    gemm(h + "attn.qkv", N, C, qkv_cols, saved(a.qkv),
         split ? "reduce_scatter(tp)" : tp ? "all_reduce(tp)" : "", boundary_bytes);
    // Dense causal attention computes every (query, key) pair: QK^T and PV, 2 x 2BHT(keys)hd.
    const double pairs = B * H * T * keys, hd = C / s.heads;
    add(Op{h + "attn.core", "attention", 4 * pairs * hd, 8 * pairs * hd,
           f * (3 * N * Cl + 2 * pairs + N * Cl), saved(a.att + a.atty),
           ring ? "send_recv+reduce_scatter(sp)" : "",
           ring ? f * (4 * (l.sequence - 1) * N * Cl + 2 * l.sequence * N * Cl) : 0.0});
    g.ops.back().seq = T;
    g.ops.back().head_dim = hd;
    gemm(h + "attn.out", N, Cl, C, saved(a.residual), boundary, boundary_bytes);
    add(Op{h + "ln_2", "layernorm", 0.0, 0.0, f * 2 * rows * C,
           saved(a.ln2 + a.ln2_mean + a.ln2_rstd), split ? "all_gather+all_gather(tp)" : "",
           split ? N * C * f : 0.0});
    gemm(h + "mlp.fc", N, C, fc_cols, saved(a.fch),
         split ? "reduce_scatter(tp)" : tp ? "all_reduce(tp)" : "", boundary_bytes);
    // Recomputed in backward; SwiGLU reads gate and up.
    add(Op{h + "mlp.act", "activation", 0.0, 0.0, f * (fc_cols + F) * N, 0.0});
    gemm(h + "mlp.out", N, F, C, saved(a.residual), boundary, boundary_bytes);
  }
  for (Op& op : g.ops) {
    if (op.collective_bytes <= 0) continue;
    const std::string_view c = op.collective;
    const bool output = op.name == "embedding" || op.name.ends_with(".out");
    if (c.starts_with("reduce_scatter+all_gather") || c.starts_with("all_gather+all_gather")) {
      op.forward_collective = 0.5;
    } else if (output || c.starts_with("all_gather")) {
      op.forward_collective = 1.0;
    }
  }
  apply_checkpointing(g, block_begin, acts, f);
  g.scratch_bytes = saved(acts.scratch);
  if (l.stage.head) {
    add(Op{"ln_f", "layernorm", 0.0, 0.0, f * 2 * rows * C,
           saved(a.lnf + a.lnf_mean + a.lnf_rstd), split ? "all_gather(tp)" : "",
           split ? N * C * f : 0.0});
    gemm("lm_head", N, C, V, saved(a.logits),
         tp ? (split ? "reduce_scatter(tp)" : "all_reduce(tp)") : "", boundary_bytes);
    add(Op{"cross_entropy", "loss", 0.0, 0.0, f * 2 * N * V, saved(a.losses),
           tp ? "all_reduce(tp)" : "", tp ? 3 * N * f : 0.0});
  }
  return g;
}


}  // namespace colossal::planner
