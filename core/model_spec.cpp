#include "core/model_spec.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace colossal::core {

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::gpt2: return "gpt2";
    case Arch::opt: return "opt";
    case Arch::llama: return "llama";
  }
  return "?";
}

ModelSpec model_spec(Arch arch, int layers, int hidden, int heads, int ffn_hidden, int vocab,
                     int max_seq) {
  ModelSpec s;
  s.arch = arch;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.ffn_hidden = ffn_hidden;
  s.vocab = vocab;
  s.max_seq = max_seq;
  return s;
}

double rope_frequency(int i, int hs, double theta, const RopeScaling& scaling) {
  const double f = std::pow(theta, -2.0 * i / hs);
  if (!scaling.scaled()) return f;
  constexpr double kTwoPi = 6.283185307179586;
  const double wavelength = kTwoPi / f, original = scaling.original_max_seq;
  if (wavelength < original / scaling.high_freq_factor) return f;  // high frequencies: kept
  if (wavelength > original / scaling.low_freq_factor) return f / scaling.factor;  // low: scaled
  const double smooth = (original / wavelength - scaling.low_freq_factor) /
                        (scaling.high_freq_factor - scaling.low_freq_factor);
  return (1.0 - smooth) * f / scaling.factor + smooth * f;
}

ModelSpec llama_spec(int layers, int hidden, int heads, int kv_heads, int ffn_hidden, int vocab,
                     int max_seq, double rope_theta, double rms_eps, bool tie) {
  ModelSpec s = model_spec(Arch::llama, layers, hidden, heads, ffn_hidden, vocab, max_seq);
  s.kv_heads = kv_heads;
  s.rope_theta = rope_theta;
  s.rms_eps = rms_eps;
  s.tie_embeddings = tie;
  return s;
}

namespace {

const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> table = {
      {"gpt2-124m", model_spec(Arch::gpt2, 12, 768, 12, 3072, 50257, 1024)},
      {"gpt2-355m", model_spec(Arch::gpt2, 24, 1024, 16, 4096, 50257, 1024)},
      {"gpt2-774m", model_spec(Arch::gpt2, 36, 1280, 20, 5120, 50257, 1024)},
      {"gpt2-1.5b", model_spec(Arch::gpt2, 48, 1600, 25, 6400, 50257, 1024)},
      {"opt-125m", model_spec(Arch::opt, 12, 768, 12, 3072, 50272, 2048)},
      {"opt-1.3b", model_spec(Arch::opt, 24, 2048, 32, 8192, 50272, 2048)},
      {"opt-2.7b", model_spec(Arch::opt, 32, 2560, 32, 10240, 50272, 2048)},
      {"opt-6.7b", model_spec(Arch::opt, 32, 4096, 32, 16384, 50272, 2048)},
      {"opt-13b", model_spec(Arch::opt, 40, 5120, 40, 20480, 50272, 2048)},
      {"opt-30b", model_spec(Arch::opt, 48, 7168, 56, 28672, 50272, 2048)},
      {"opt-66b", model_spec(Arch::opt, 64, 9216, 72, 36864, 50272, 2048)},
      {"opt-175b", model_spec(Arch::opt, 96, 12288, 96, 49152, 50272, 2048)},
      // LLaMA-2 (Touvron et al. 2023, Hugging Face meta-llama/Llama-2-*-hf configs).
      {"llama2-7b", llama_spec(32, 4096, 32, 32, 11008, 32000, 4096)},
      {"llama2-13b", llama_spec(40, 5120, 40, 40, 13824, 32000, 4096)},
      {"llama2-70b", llama_spec(80, 8192, 64, 8, 28672, 32000, 4096)},
      // Byte vocabulary, grouped-query (2 kv heads for 4 query heads): the quickstart's machine.
      {"llama-tiny", llama_spec(4, 128, 4, 2, 352, 256, 256)},
  };
  return table;
}
}  // namespace

std::optional<ModelSpec> find_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, spec] : presets()) names.push_back(name);
  return names;
}

float ParamSpec::init_std(int layers) const {
  switch (role) {
    case ParamRole::token_embedding:
    case ParamRole::position_embedding:
    case ParamRole::weight:
    case ParamRole::lm_head: return 0.02f;
    case ParamRole::residual_out_weight: return 0.02f / std::sqrt(2.0f * static_cast<float>(layers));
    default: return 0.0f;
  }
}

int64_t padded_vocab(const ModelSpec& spec, int tensor_size) {
  if (tensor_size <= 1) return spec.vocab;
  const int64_t m = int64_t(tensor_size) * std::max(1, spec.vocab_multiple);
  return (spec.vocab + m - 1) / m * m;
}

std::vector<ShardRun> shard_runs(const ParamSpec& p, int tensor_rank) {
  if (p.shard.replicated()) return {{0, 0, p.count}};
  const int d = p.shard.dim;
  std::size_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= std::size_t(p.shape[i]);
  for (std::size_t i = d + 1; i < p.shape.size(); ++i) inner *= std::size_t(p.shape[i]);
  const int64_t extent = p.shape[d], local = p.local_shape[d];
  const int64_t block = p.shard.padded / p.shard.parts, local_block = local / p.shard.parts;
  std::vector<ShardRun> runs;
  for (std::size_t o = 0; o < outer; ++o) {
    for (int part = 0; part < p.shard.parts; ++part) {
      const int64_t x_local = part * local_block;
      const int64_t x_logical = part * block + tensor_rank * local_block;
      const int64_t rows = std::clamp<int64_t>(extent - x_logical, 0, local_block);
      if (rows == 0) continue;
      runs.push_back({(o * local + x_local) * inner, (o * extent + x_logical) * inner,
                      std::size_t(rows) * inner});
    }
  }
  return runs;
}

std::vector<LogicalRun> logical_runs(const std::vector<ParamSpec>& table,
                                     const std::vector<ParamSpec>& logical, int tensor_rank,
                                     bool embeds) {
  std::unordered_map<std::string, int> index;
  for (std::size_t t = 0; t < logical.size(); ++t) index.emplace(logical[t].name, int(t));
  std::vector<LogicalRun> runs;
  for (const ParamSpec& p : table) {
    const auto found = index.find(p.name);
    if (found == index.end()) {
      throw std::invalid_argument("'" + p.name + "' is not a tensor of the logical table");
    }
    const bool embedding =
        p.role == ParamRole::token_embedding || p.role == ParamRole::position_embedding;
    const bool owned = !(p.shard.replicated() && tensor_rank > 0) && !(embedding && !embeds);
    for (const ShardRun& run : shard_runs(p, tensor_rank)) {
      runs.push_back({p.offset + run.local, found->second, run.logical, run.length, owned});
    }
  }
  return runs;
}

namespace {
std::vector<ParamSpec> whole_table(const ModelSpec& s, std::size_t unit_multiple, TensorSplit tp);
}  // namespace

std::vector<ParamSpec> parameter_table(const ModelSpec& s, std::size_t unit_multiple,
                                       TensorSplit tp, StageRange stage) {
  std::vector<ParamSpec> table = whole_table(s, unit_multiple, tp);
  if (stage.whole()) return table;
  const int end = stage.layer_end < 0 ? s.layers : stage.layer_end;
  if (stage.layer_begin < 0 || stage.layer_begin > end || end > s.layers) {
    throw std::invalid_argument("pipeline stage layers [" + std::to_string(stage.layer_begin) +
                                ", " + std::to_string(end) + ") outside the model's " +
                                std::to_string(s.layers));
  }
  // Keep the stage's units and lay them out again from offset 0, units renumbered in order.
  std::vector<ParamSpec> kept;
  std::size_t offset = 0;
  int previous = -1, unit = -1;
  for (ParamSpec& p : table) {
    const bool keep = p.unit == 0 ? (stage.embeds || (stage.head && s.tied()))
                      : p.unit == s.layers + 1 ? stage.head
                                               : (p.unit - 1 >= stage.layer_begin && p.unit - 1 < end);
    if (!keep) continue;
    if (p.unit != previous) {
      offset = (offset + unit_multiple - 1) / unit_multiple * unit_multiple;
      previous = p.unit;
      ++unit;
    }
    p.unit = unit;
    p.offset = offset;
    offset += (p.count + 15) / 16 * 16;
    kept.push_back(std::move(p));
  }
  return kept;
}

namespace {
std::vector<ParamSpec> whole_table(const ModelSpec& s, std::size_t unit_multiple, TensorSplit tp) {
  if (unit_multiple == 0 || unit_multiple % 16 != 0) {
    throw std::invalid_argument("parameter unit multiple " + std::to_string(unit_multiple) +
                                " is not a positive multiple of 16");
  }
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    throw std::invalid_argument("tensor rank " + std::to_string(tp.rank) + " of " +
                                std::to_string(tp.size));
  }
  if (s.heads % tp.size != 0 || s.ffn_hidden % tp.size != 0) {
    throw std::invalid_argument("model.heads = " + std::to_string(s.heads) +
                                " and model.ffn_hidden = " + std::to_string(s.ffn_hidden) +
                                " must both be divisible by the tensor size " +
                                std::to_string(tp.size));
  }
  if (s.arch == Arch::llama) {
    const int kv = s.key_value_heads();
    if (kv < 1 || s.heads % kv != 0) {
      throw std::invalid_argument("model.kv_heads = " + std::to_string(kv) +
                                  " must divide model.heads = " + std::to_string(s.heads));
    }
    if (kv % tp.size != 0) {
      throw std::invalid_argument(
          "model.kv_heads = " + std::to_string(kv) + " is not divisible by parallel.tensor = " +
          std::to_string(tp.size) +
          ": each tensor rank keeps whole groups of query heads with their key/value head");
    }
  }
  std::vector<ParamSpec> table;
  std::size_t offset = 0;
  int unit = 0;
  // The next tensors belong to a new unit: pad the previous one.
  auto next_unit = [&] {
    offset = (offset + unit_multiple - 1) / unit_multiple * unit_multiple;
    ++unit;
  };
  // split_dim: the Hugging Face dimension split over the tensor group (-1: replicated); parts:
  // equal blocks of that dimension split separately (GPT-2's fused q|k|v).
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamRole role, int split_dim = -1,
                 int parts = 1) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    p.role = role;
    p.unit = unit;
    p.local_shape = p.shape;
    if (split_dim >= 0 && tp.size > 1) {
      p.shard.dim = split_dim;
      p.shard.parts = parts;
      const bool vocab_rows = role == ParamRole::token_embedding || role == ParamRole::lm_head;
      p.shard.padded = vocab_rows ? padded_vocab(s, tp.size) : p.shape[split_dim];
      p.local_shape[split_dim] = p.shard.padded / tp.size;
    }
    p.count = 1;
    for (auto d : p.local_shape) p.count *= static_cast<std::size_t>(d);
    p.offset = offset;
    // Keep every tensor 16-float aligned (64 bytes) so kernels and BLAS see aligned rows.
    offset += (p.count + 15) / 16 * 16;
    table.push_back(std::move(p));
  };
  const int64_t C = s.hidden, F = s.ffn_hidden, V = s.vocab;
  if (s.arch == Arch::gpt2) {
    add("transformer.wte.weight", {V, C}, ParamRole::token_embedding, 0);
    add("transformer.wpe.weight", {s.position_rows(), C}, ParamRole::position_embedding);
    for (int l = 0; l < s.layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      next_unit();
      add(h + "ln_1.weight", {C}, ParamRole::layernorm_weight);
      add(h + "ln_1.bias", {C}, ParamRole::layernorm_bias);
      add(h + "attn.c_attn.weight", {C, 3 * C}, ParamRole::weight, 1, 3);
      add(h + "attn.c_attn.bias", {3 * C}, ParamRole::bias, 0, 3);
      add(h + "attn.c_proj.weight", {C, C}, ParamRole::residual_out_weight, 0);
      add(h + "attn.c_proj.bias", {C}, ParamRole::bias);
      add(h + "ln_2.weight", {C}, ParamRole::layernorm_weight);
      add(h + "ln_2.bias", {C}, ParamRole::layernorm_bias);
      add(h + "mlp.c_fc.weight", {C, F}, ParamRole::weight, 1);
      add(h + "mlp.c_fc.bias", {F}, ParamRole::bias, 0);
      add(h + "mlp.c_proj.weight", {F, C}, ParamRole::residual_out_weight, 0);
      add(h + "mlp.c_proj.bias", {C}, ParamRole::bias);
    }
    next_unit();
    add("transformer.ln_f.weight", {C}, ParamRole::layernorm_weight);
    add("transformer.ln_f.bias", {C}, ParamRole::layernorm_bias);
  } else if (s.arch == Arch::llama) {
    const int64_t Q = int64_t(s.heads) * s.head_dim();
    const int64_t KV = int64_t(s.key_value_heads()) * s.head_dim();
    add("model.embed_tokens.weight", {V, C}, ParamRole::token_embedding, 0);
    for (int l = 0; l < s.layers; ++l) {
      const std::string h = "model.layers." + std::to_string(l) + ".";
      next_unit();
      add(h + "input_layernorm.weight", {C}, ParamRole::layernorm_weight);
      add(h + "self_attn.q_proj.weight", {Q, C}, ParamRole::weight, 0);
      add(h + "self_attn.k_proj.weight", {KV, C}, ParamRole::weight, 0);
      add(h + "self_attn.v_proj.weight", {KV, C}, ParamRole::weight, 0);
      add(h + "self_attn.o_proj.weight", {C, Q}, ParamRole::residual_out_weight, 1);
      add(h + "post_attention_layernorm.weight", {C}, ParamRole::layernorm_weight);
      add(h + "mlp.gate_proj.weight", {F, C}, ParamRole::weight, 0);
      add(h + "mlp.up_proj.weight", {F, C}, ParamRole::weight, 0);
      add(h + "mlp.down_proj.weight", {C, F}, ParamRole::residual_out_weight, 1);
    }
    next_unit();
    add("model.norm.weight", {C}, ParamRole::layernorm_weight);
    if (!s.tied()) add("lm_head.weight", {V, C}, ParamRole::lm_head, 0);
  } else {
    add("model.decoder.embed_tokens.weight", {V, C}, ParamRole::token_embedding, 0);
    add("model.decoder.embed_positions.weight", {s.position_rows(), C},
        ParamRole::position_embedding);
    for (int l = 0; l < s.layers; ++l) {
      const std::string h = "model.decoder.layers." + std::to_string(l) + ".";
      next_unit();
      add(h + "self_attn_layer_norm.weight", {C}, ParamRole::layernorm_weight);
      add(h + "self_attn_layer_norm.bias", {C}, ParamRole::layernorm_bias);
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        add(h + "self_attn." + proj + ".weight", {C, C}, ParamRole::weight, 0);
        add(h + "self_attn." + proj + ".bias", {C}, ParamRole::bias, 0);
      }
      add(h + "self_attn.out_proj.weight", {C, C}, ParamRole::residual_out_weight, 1);
      add(h + "self_attn.out_proj.bias", {C}, ParamRole::bias);
      add(h + "final_layer_norm.weight", {C}, ParamRole::layernorm_weight);
      add(h + "final_layer_norm.bias", {C}, ParamRole::layernorm_bias);
      add(h + "fc1.weight", {F, C}, ParamRole::weight, 0);
      add(h + "fc1.bias", {F}, ParamRole::bias, 0);
      add(h + "fc2.weight", {C, F}, ParamRole::residual_out_weight, 1);
      add(h + "fc2.bias", {C}, ParamRole::bias);
    }
    next_unit();
    add("model.decoder.final_layer_norm.weight", {C}, ParamRole::layernorm_weight);
    add("model.decoder.final_layer_norm.bias", {C}, ParamRole::layernorm_bias);
  }
  return table;
}

}  // namespace

std::vector<ParamUnit> parameter_units(const std::vector<ParamSpec>& table,
                                       std::size_t unit_multiple) {
  std::vector<ParamUnit> units;
  for (const auto& p : table) {
    if (p.unit == int(units.size())) units.push_back({p.offset, p.offset});
    units.back().end = p.offset + p.count;
  }
  for (auto& u : units) u.end = (u.end + unit_multiple - 1) / unit_multiple * unit_multiple;
  return units;
}

std::size_t parameter_count(const ModelSpec& spec) {
  std::size_t n = 0;
  for (const auto& p : parameter_table(spec)) n += p.count;
  return n;
}

double flops_per_token(const ModelSpec& s, int seq_len) {
  const double L = s.layers, d = s.hidden, V = s.vocab, F = s.ffn_hidden;
  if (s.llama()) {
    const double kv = double(s.key_value_heads()) * s.head_dim();
    const double n = L * (2.0 * d * d + 2.0 * d * kv + 3.0 * d * F + 2.0 * d) + d +
                     V * d * (s.tied() ? 1.0 : 2.0);
    return 6.0 * n + 12.0 * L * seq_len * d;
  }
  // 12*L*d^2 generalises to L*(4*d^2 + 2*d*F) when ffn_hidden != 4*hidden.
  const double n = L * (4.0 * d * d + 2.0 * d * F) + 13.0 * L * d + 2.0 * d + V * d;
  return 6.0 * n + 12.0 * L * seq_len * d;
}

void export_owned_runs(const std::vector<LogicalRun>& runs, const std::vector<ParamSpec>& logical,
                       const float* local, float* out) {
  for (const LogicalRun& run : runs) {
    if (!run.owned) continue;
    std::copy_n(local + run.local, run.length, out + logical[run.tensor].offset + run.logical);
  }
}

void import_runs(const std::vector<LogicalRun>& runs, const std::vector<ParamSpec>& logical,
                 const float* values, float* local) {
  for (const LogicalRun& run : runs) {
    std::copy_n(values + logical[run.tensor].offset + run.logical, run.length, local + run.local);
  }
}

double block_forward_flops(const ModelSpec& s, int seq_len) {
  const double C = s.hidden, F = s.ffn_hidden, T = seq_len;
  if (s.llama()) {
    const double kv = double(s.key_value_heads()) * s.head_dim();
    return 2.0 * (2 * C * C + 2 * C * kv + 3 * C * F) + 4.0 * T * C;
  }
  return 2.0 * (4 * C * C + 2 * C * F) + 4.0 * T * C;
}

double head_forward_flops(const ModelSpec& s) { return 2.0 * double(s.hidden) * s.vocab; }

}  // namespace colossal::core
