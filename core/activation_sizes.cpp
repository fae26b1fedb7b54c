#include "core/activation_sizes.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/layers.hpp"

namespace colossal::core {

namespace {
void require_positive(int value, const char* what) {
  if (value < 1) {
    throw std::invalid_argument(std::string("activation sizes: ") + what + " is " +
                                std::to_string(value) + " (it must be at least 1)");
  }
}

void require_divisible(int value, const char* what, int tensor, const char* why) {
  if (value % tensor != 0) {
    throw std::invalid_argument(std::string("activation sizes: ") + what + " " +
                                std::to_string(value) + " is not divisible by the tensor size " +
                                std::to_string(tensor) + " (" + why + ")");
  }
}
}  // namespace

std::size_t ActivationSizes::scratch() const {
  return dresidual + dhidden + dmlp + mlp_act + dqkv + datt + cross_entropy + ring_blocks +
         ring_dkv + split_sums + split_gather + split_dgather + split_rows + split_lnf + qkv_gqa +
         rope_tables;
}

ActivationSizes activation_sizes(const ModelSpec& spec, const ActivationShape& shape) {
  require_positive(shape.batch, "the micro-batch");
  require_positive(shape.seq_len, "the local sequence length");
  require_positive(shape.tensor, "the tensor size");
  require_positive(shape.ring, "the ring size");
  const int tensor = shape.tensor;
  require_divisible(spec.heads, "model.heads", tensor, "each tensor rank holds whole heads");
  require_divisible(spec.hidden, "model.hidden", tensor, "each tensor rank holds whole heads");
  require_divisible(spec.ffn_hidden, "model.ffn_hidden", tensor,
                    "each tensor rank holds an equal part of the MLP");
  const bool split = shape.sequence_split && tensor > 1;
  if (split) {
    require_divisible(shape.seq_len, "the local sequence length", tensor,
                      "sequence_split gives every tensor rank an equal part of the rows");
  }
  const bool ring = shape.ring > 1;
  const std::size_t t = std::size_t(tensor), B = std::size_t(shape.batch);
  const std::size_t T = std::size_t(shape.seq_len), C = std::size_t(spec.hidden);
  const std::size_t Cl = C / t, H = std::size_t(spec.heads) / t;
  const std::size_t F = std::size_t(spec.ffn_hidden) / t;
  const std::size_t V = std::size_t(padded_vocab(spec, tensor)) / t;
  const std::size_t keys = T * std::size_t(shape.ring);
  const std::size_t BT = B * T, BTC = BT * C, BTCl = BT * Cl;
  const std::size_t r = split ? t : 1, BTr = BT / r, BTCr = BTC / r;

  ActivationSizes s;
  s.bf16_norms = shape.bf16_operands && !split;
  s.bf16_qkv = shape.bf16_operands && !ring;
  s.bf16_atty = s.bf16_qkv && !spec.fused_attention;
  // Floats that hold n values: n, or n bf16 patterns two to a float.
  auto floats = [](bool bf16, std::size_t n) { return bf16 ? (n + 1) / 2 : n; };
  s.residual = BTCr;
  s.ln1 = s.ln2 = floats(s.bf16_norms, BTCr);
  s.ln1_mean = s.ln1_rstd = s.ln2_mean = s.ln2_rstd = BTr;
  s.qkv = floats(s.bf16_qkv, 3 * BTCl);
  s.bf16_att = shape.bf16_probabilities && !ring && !spec.fused_attention;
  s.att = spec.fused_attention ? B * H * T : floats(s.bf16_att, B * H * T * keys);
  s.atty = floats(s.bf16_atty, BTCl);
  s.fch = BT * F;
  s.lnf = floats(s.bf16_norms, BTC);
  s.lnf_mean = s.lnf_rstd = BTr;
  s.losses = BT;
  s.head_in_forward = head_in_forward(tensor);
  s.logits = s.head_in_forward ? BTC : BT * V;
  if (s.head_in_forward) {
    s.logits_ld = (V + kLogitsRowAlign - 1) / kLogitsRowAlign * kLogitsRowAlign;
    const std::size_t rows = shape.logits_chunk_rows > 0
                                 ? shape.logits_chunk_rows
                                 : std::max<std::size_t>(1, shape.logits_chunk_floats / s.logits_ld);
    s.logits_chunk = std::min(BT, rows) * s.logits_ld;
    s.logits_chunk_bf16 = shape.bf16_operands ? floats(true, s.logits_chunk) : 0;
  }

  s.dresidual = s.dhidden = BTC;
  s.dmlp = s.mlp_act = BT * F;
  s.dqkv = 3 * BTCl;
  s.datt = spec.fused_attention ? fused_attention_work_floats()
           : ring                 ? B * H * T * keys
                                  : H * T * T;
  s.cross_entropy = tensor > 1 ? 3 * BT : 0;
  if (ring) {
    s.ring_blocks = 2 * BTCl;
    s.ring_dkv = 2 * BTCl * std::size_t(shape.ring);
  }
  if (split) {
    s.split_sums = s.split_gather = s.split_dgather = BTC;
    s.split_rows = s.split_lnf = BTCr;
  }
  if (spec.llama()) {
    require_divisible(spec.key_value_heads(), "model.kv_heads", tensor,
                      "each tensor rank keeps whole groups of query heads");
    const std::size_t hs = std::size_t(spec.head_dim());
    const std::size_t KVl = std::size_t(spec.key_value_heads()) / t;
    s.ln1_mean = s.ln2_mean = s.lnf_mean = 0;
    s.fch = 2 * BT * F;
    s.mlp_act = 2 * BT * F;  // silu(gate) * up, then in backward the gate | up gradients
    s.qkv_gqa = BT * (H + 2 * KVl) * hs;
    s.rope_tables = keys * hs;  // cos and sin, hs/2 each per position
  }
  return s;
}

StageActivations stage_activations(const ModelSpec& spec, const ActivationShape& shape,
                                   const StageRange& stage, const std::vector<Keep>& keep,
                                   bool selective) {
  constexpr std::size_t kOps = kOpsPerBlock;
  const std::size_t ops = std::size_t(spec.layers) * kOps;
  if (!keep.empty() && keep.size() != ops) {
    throw std::invalid_argument("activation checkpointing: the schedule has " +
                                std::to_string(keep.size()) + " entries; the model has " +
                                std::to_string(ops) + " ops (" + std::to_string(kOps) +
                                " per block)");
  }
  const int end = stage.layer_end < 0 ? spec.layers : stage.layer_end;
  if (stage.layer_begin < 0 || end < stage.layer_begin || end > spec.layers) {
    throw std::invalid_argument("activation sizes: stage layers [" +
                                std::to_string(stage.layer_begin) + ", " + std::to_string(end) +
                                ") are not inside the model's " + std::to_string(spec.layers));
  }
  StageActivations a;
  a.sizes = activation_sizes(spec, shape);
  const ActivationSizes& s = a.sizes;
  a.keep.assign(std::size_t(end - stage.layer_begin) * kOps, Keep::all);
  if (!keep.empty()) {
    std::copy(keep.begin() + std::ptrdiff_t(stage.layer_begin) * kOps,
              keep.begin() + std::ptrdiff_t(end) * kOps, a.keep.begin());
  }
  if (!a.keep.empty() && a.keep.front() == Keep::none) a.keep.front() = Keep::input;  // stage input
  bool kept_attention = false;
  for (std::size_t op = 0; op < a.keep.size(); op += kOps) {
    kept_attention |= a.keep[op] == Keep::all;
  }
  a.selective = selective && !spec.fused_attention && kept_attention;

  std::size_t kept = s.residual, segment = 0;  // kept: the stage output
  for (std::size_t op = 0; op < a.keep.size(); ++op) {
    const std::size_t saved = a.op_saved(op);
    switch (a.keep[op]) {
      case Keep::all: kept += s.residual + saved; break;
      case Keep::input: kept += s.residual; segment = saved; break;
      case Keep::none: segment += s.residual + saved; break;
    }
    if (a.keep[op] != Keep::all) a.arena = std::max(a.arena, segment);
  }
  a.saved = kept + (stage.head ? s.head_saved() : 0);
  a.logits = stage.head ? s.logits : 0;
  a.selective_att = a.selective ? s.att : 0;
  a.scratch = s.scratch() + (stage.head ? s.logits_chunk + s.logits_chunk_bf16 : 0);
  return a;
}

DecodeSizes decode_sizes(const ModelSpec& spec, const ActivationShape& shape,
                         const StageRange& stage) {
  (void)activation_sizes(spec, shape);  // its checks: whole heads and MLP parts per rank
  const std::size_t t = std::size_t(shape.tensor), C = std::size_t(spec.hidden);
  const std::size_t hs = std::size_t(spec.head_dim());
  const std::size_t H = std::size_t(spec.heads) / t;
  const std::size_t KV = std::size_t(spec.key_value_heads()) / t;
  const std::size_t F = std::size_t(spec.ffn_hidden) / t;
  DecodeSizes d;
  d.window = shape.seq_len * shape.ring;
  d.rows = std::min(d.window, shape.batch * shape.seq_len);
  d.kv_width = int(KV * hs);
  const std::size_t R = std::size_t(d.rows);
  const int end = stage.layer_end < 0 ? spec.layers : stage.layer_end;  // -1: the last layer
  const std::size_t blocks = std::size_t(end - stage.layer_begin);
  d.cache = 2 * blocks * std::size_t(d.window) * KV * hs;
  d.x = d.mid = d.norm = R * C;
  d.stats = 2 * R;
  d.qkv = R * (H + 2 * KV) * hs;
  d.atty = R * H * hs;
  d.fch = R * (spec.llama() ? 2 * F : F);
  if (stage.head) {
    d.logits = std::size_t(padded_vocab(spec, shape.tensor)) / t;
    d.logits_gather = t > 1 ? d.logits * t : 0;
  }
  return d;
}

}  // namespace colossal::core
