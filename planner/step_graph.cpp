#include "planner/step_graph.hpp"

#include <algorithm>
#include <stdexcept>
#include <string_view>

namespace colossal::planner {

namespace {
// The probabilities' share of an attention op's saved bytes: (B, H/t, T/S, T) fp32.
double score_bytes(const core::ModelSpec& s, const Layout& l) {
  const double t = l.tensor;
  return (l.bf16 ? 2.0 : 4.0) * l.micro_batch * (s.heads / t) * (double(l.seq_len) / l.sequence) * l.seq_len;
}

double total(const std::vector<Op>& ops, double Op::*field) {
  double sum = 0.0;
  for (const Op& op : ops) sum += op.*field;
  return sum;
}

// Activation checkpointing, exactly as core::Model stores it: an op keeping `all` saves its input
// (the previous sub-layer's output) and its own set, `input` only its input, `none` nothing; every
// op of a dropped segment runs its forward again in backward, into one arena as large as the
// largest segment. Under selective recompute the probabilities of kept attention ops are
// recomputed too (unfused attention only).
void apply_checkpointing(StepGraph& g, const std::vector<std::size_t>& block_begin,
                         const core::ModelSpec& s, const Layout& l, int first, int last) {
  using core::Keep;
  constexpr int kOps = core::kOpsPerBlock;
  if (!l.keep.empty() && l.keep.size() != std::size_t(s.layers) * kOps) {
    throw std::invalid_argument("build_step_graph: the checkpoint schedule has " +
                                std::to_string(l.keep.size()) + " entries for " +
                                std::to_string(s.layers * kOps) + " ops");
  }
  const bool selective = l.selective && !s.fused_attention;
  double segment = 0.0;
  for (int layer = first; layer < last; ++layer) {
    const std::size_t b = block_begin[std::size_t(layer - first)];
    for (int part = 0; part < kOps; ++part) {
      const std::size_t op = std::size_t(layer) * kOps + std::size_t(part);
      Keep keep = l.keep.empty() ? Keep::all : l.keep[op];
      if (keep == Keep::none && layer == first && part == 0) keep = Keep::input;  // stage input
      // Sub-ops of this op, and the one whose output is its input.
      const std::size_t begin = b + std::size_t(part) * 4, end = begin + 4;
      Op& producer = g.ops[begin - 1];
      const double x = producer.saved_bytes;
      double a = 0.0;  // everything the op's sub-ops save but its output (the next op's input)
      for (std::size_t i = begin; i + 1 < end; ++i) a += g.ops[i].saved_bytes;
      if (keep == Keep::all) {
        if (selective && part == 0) {
          Op& core = g.ops[begin + 2];
          const double scores = score_bytes(s, l);
          core.saved_bytes -= scores;
          core.recompute_flops = core.forward_flops;
          g.selective_bytes = scores;
        }
        continue;
      }
      if (keep == Keep::none) producer.saved_bytes = 0.0;
      for (std::size_t i = begin; i < end; ++i) {
        Op& o = g.ops[i];
        o.recompute_flops = o.forward_flops;
        o.recomputed = true;
        if (i + 1 < end) o.saved_bytes = 0.0;
        o.name += keep == Keep::input ? " (ckpt)" : " (dropped)";
      }
      segment = keep == Keep::input ? a : segment + x + a;
      g.arena_bytes = std::max(g.arena_bytes, segment);
    }
  }
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
  const double rows = l.sequence_split && l.tensor > 1 ? N / t : N;  // residual-stream rows
  const bool tp = l.tensor > 1, split = tp && l.sequence_split, ring = l.sequence > 1;
  const int first = l.stage.layer_begin, last = l.stage.layer_end < 0 ? s.layers : l.stage.layer_end;
  // A tensor-parallel boundary: all-reduce of (N, C), or reduce-scatter + all-gather under split.
  const char* boundary = split ? "reduce_scatter+all_gather(tp)" : tp ? "all_reduce(tp)" : "";
  const double boundary_bytes = tp ? N * C * f : 0.0;
  StepGraph g;
  auto add = [&g](Op op) { g.ops.push_back(std::move(op)); };
  // A GEMM of (M, K) x (K, Nout): 2MKN forward; backward computes both input and weight grads.
  auto gemm = [&](std::string name, double M, double K, double Nout, double saved,
                  const char* collective = "", double collective_bytes = 0.0) {
    add(Op{std::move(name), "gemm", 2 * M * K * Nout, 4 * M * K * Nout,
           f * (M * K + K * Nout + M * Nout), saved, collective, collective_bytes});
  };
  if (l.stage.embeds) {
    add(Op{"embedding", "embedding", 0.0, 0.0, f * (N * C + N * C), f * rows * C, boundary,
           boundary_bytes});
  } else {
    add(Op{"stage input", "embedding", 0.0, 0.0, 0.0, f * rows * C, "recv(pp)", f * rows * C});
  }
  // Where each block's ops begin in g.ops: ln_1, qkv, core, out (attention), then ln_2, fc, act,
  // out (MLP). Each sub-layer's output is saved by the op that produced it.
  std::vector<std::size_t> block_begin;
  for (int layer = first; layer < last; ++layer) {
    const std::string h = "h." + std::to_string(layer) + ".";
    block_begin.push_back(g.ops.size());
    add(Op{h + "ln_1", "layernorm", 0.0, 0.0, f * 2 * rows * C, f * (rows * C + 2 * rows),
           split ? "all_gather(tp)" : "", split ? N * C * f : 0.0});
    gemm(h + "attn.qkv", N, C, 3 * Cl, f * 3 * N * Cl, split ? "" : tp ? "all_reduce(tp)" : "",
         split ? 0.0 : boundary_bytes);
    // Dense causal attention computes every (query, key) pair: QK^T and PV, 2 x 2BHT(keys)hd.
    const double pairs = B * H * T * keys, hd = C / s.heads;
    const double scores = s.fused_attention ? B * H * T : pairs;
    add(Op{h + "attn.core", "attention", 4 * pairs * hd, 8 * pairs * hd,
           f * (3 * N * Cl + 2 * pairs + N * Cl), f * (scores + N * Cl),
           ring ? "send_recv+reduce_scatter(sp)" : "",
           ring ? f * (4 * (l.sequence - 1) * N * Cl + 2 * l.sequence * N * Cl) : 0.0});
    gemm(h + "attn.out", N, Cl, C, f * rows * C, boundary, boundary_bytes);
    add(Op{h + "ln_2", "layernorm", 0.0, 0.0, f * 2 * rows * C, f * (rows * C + 2 * rows),
           split ? "all_gather(tp)" : "", split ? N * C * f : 0.0});
    gemm(h + "mlp.fc", N, C, F, f * N * F, split ? "" : tp ? "all_reduce(tp)" : "",
         split ? 0.0 : boundary_bytes);
    add(Op{h + "mlp.act", "activation", 0.0, 0.0, f * 2 * N * F, 0.0});  // recomputed in backward
    gemm(h + "mlp.out", N, F, C, f * rows * C, boundary, boundary_bytes);
  }
  for (Op& op : g.ops) {
    if (op.collective_bytes <= 0) continue;
    const std::string_view c = op.collective;
    const bool output = op.name == "embedding" || op.name.ends_with(".out");
    if (c.starts_with("reduce_scatter+all_gather")) {
      op.forward_collective = 0.5;
    } else if (output || c.starts_with("all_gather")) {
      op.forward_collective = 1.0;
    }
  }
  apply_checkpointing(g, block_begin, s, l, first, last);
  if (l.stage.head) {
    add(Op{"ln_f", "layernorm", 0.0, 0.0, f * 2 * rows * C, f * (N * C + 2 * rows),
           split ? "all_gather(tp)" : "", split ? N * C * f : 0.0});
    gemm("lm_head", N, C, V, f * N * V, tp ? (split ? "reduce_scatter(tp)" : "all_reduce(tp)") : "",
         boundary_bytes);
    add(Op{"cross_entropy", "loss", 0.0, 0.0, f * 2 * N * V, f * N, tp ? "all_reduce(tp)" : "",
           tp ? 3 * N * f : 0.0});
  }
  return g;
}


}  // namespace colossal::planner
