#include "core/sharded_detail.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <Kokkos_Core.hpp>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/memory.hpp"
#include "core/rng.hpp"

namespace colossal::core {

int TensorGrid::ranks(int side) const {
  int n = depth;
  for (int k = 0; k < power; ++k) n *= side;
  return n;
}

TensorGrid tensor_grid(TensorMode mode, int size, int depth) {
  TensorGrid g;
  g.power = mode == TensorMode::d3 ? 3 : 2;
  g.depth = tensor_depth(mode, depth);
  while (g.ranks(g.q + 1) <= size) ++g.q;
  g.exact = g.q >= 2 && g.ranks(g.q) == size;
  return g;
}

int tensor_grid_multiple(TensorMode mode, int q) { return mode == TensorMode::d3 ? q * q : q; }

}  // namespace colossal::core

namespace colossal::core::sharded {

namespace {
void require_multiple(const char* key, int64_t value, int64_t m, const char* mode) {
  if (value % m == 0) return;
  const int64_t lower = value / m * m;
  throw std::invalid_argument(std::string(key) + " = " + std::to_string(value) +
                              " must be a multiple of " + std::to_string(m) + " for " + mode +
                              " tensor parallelism (nearest: " +
                              (lower > 0 ? std::to_string(lower) + " or " : std::string()) +
                              std::to_string(lower + m) + ")");
}
}  // namespace

void require_grid_shape(const ModelSpec& spec, int batch, int seq_len, TensorMode mode, int q) {
  if (spec.arch == Arch::llama) {
    throw std::invalid_argument(
        std::string("model.arch llama is not available with parallel.tensor.mode ") +
        tensor_mode_name(mode) +
        ": the 2D/2.5D/3D models run gpt2 and opt only; set parallel.tensor.mode: 1d");
  }
  const int m = tensor_grid_multiple(mode, q);
  const char* name = mode == TensorMode::d3 ? "3D" : "2D";
  require_multiple("train.micro_batch", batch, m, name);
  require_multiple("model.heads", spec.heads, q, name);
  require_multiple("model.hidden", spec.hidden, m, name);
  require_multiple("model.ffn_hidden", spec.ffn_hidden, m, name);
  if (seq_len > spec.max_seq) {
    throw std::invalid_argument("train.seq_len = " + std::to_string(seq_len) +
                                " exceeds model.max_seq = " + std::to_string(spec.max_seq));
  }
}

std::size_t table_end(const std::vector<ParamSpec>& table) {
  return table.empty() ? 0 : aligned16(table.back().offset + table.back().count);
}

std::size_t append_param(std::vector<ParamSpec>& table, const std::string& name, ParamRole role,
                         std::size_t count, std::size_t at_least, int unit) {
  ParamSpec p;
  p.unit = unit;
  p.name = name;
  p.role = role;
  p.count = count;
  p.shape = {int64_t(count)};
  p.local_shape = p.shape;
  p.offset = std::max(table_end(table), at_least);
  table.push_back(p);
  return p.offset;
}

void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t cols) {
  Kokkos::parallel_for(
      "colossal::core::sharded_add_bias", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(int64_t n) {
        for (int64_t e = 0; e < cols; ++e) out[n * cols + e] += bias[e];
      });
}

void append_element(std::vector<LogicalRun>& runs, std::size_t local, int tensor,
                    std::size_t logical) {
  if (!runs.empty()) {
    LogicalRun& r = runs.back();
    if (r.tensor == tensor && r.local + r.length == local && r.logical + r.length == logical) {
      ++r.length;
      return;
    }
  }
  runs.push_back({local, tensor, logical, 1});
}

void init_from_runs(float* params, std::size_t size, const std::vector<LogicalRun>& runs,
                    const ModelSpec& spec, uint64_t seed) {
  // Drawn where the parameters live (on the GPU in a Kokkos CUDA build): fill_normal is a kernel
  // of the default execution space, so a host staging buffer would be written by the device.
  const std::vector<ParamSpec> logical = parameter_table(spec);
  kernels::fill(params, int64_t(size), 0.0f);  // padding and biases
  for (const LogicalRun& run : runs) {
    const ParamSpec& p = logical[run.tensor];
    float* dst = params + run.local;
    switch (p.role) {
      case ParamRole::layernorm_weight: kernels::fill(dst, int64_t(run.length), 1.0f); break;
      case ParamRole::layernorm_bias:
      case ParamRole::bias: break;
      default:
        // Keyed by the logical element, as the single-rank model draws it.
        fill_normal(dst, run.length, p.init_std(spec.layers), seed, hash_name(p.name),
                    run.logical);
    }
  }
  fence_kernels();
}

BlockRecompute stage_recompute(const std::vector<Keep>& keep, const ModelSpec& spec,
                               const StageRange& stage, bool selective) {
  const int blocks = stage_blocks(spec, stage);
  // The fused attention keeps no probabilities: selective has nothing to drop.
  selective = selective && !spec.fused_attention;
  if (keep.empty()) return block_recompute(keep, blocks, selective);
  if (keep.size() != std::size_t(spec.layers) * kOpsPerBlock) {
    throw std::invalid_argument("checkpointing.policy: a schedule of " +
                                std::to_string(keep.size()) + " ops for " +
                                std::to_string(spec.layers) + " blocks");
  }
  const auto first = keep.begin() + std::ptrdiff_t(stage.layer_begin) * kOpsPerBlock;
  return block_recompute(std::vector<Keep>(first, first + std::ptrdiff_t(blocks) * kOpsPerBlock),
                         blocks, selective, stage.layer_begin);
}

BlockRecompute block_recompute(const std::vector<Keep>& keep, int layers, bool selective,
                               int block0) {
  BlockRecompute plan;
  plan.selective = selective;
  plan.start.assign(std::size_t(layers), -1);
  if (keep.empty()) return plan;
  if (keep.size() != std::size_t(layers) * kOpsPerBlock) {
    throw std::invalid_argument("checkpointing.policy: a schedule of " +
                                std::to_string(keep.size()) + " ops for " +
                                std::to_string(layers) + " blocks");
  }
  for (int b = 0; b < layers; ++b) {
    const Keep first = keep[std::size_t(b) * kOpsPerBlock];
    const Keep second = keep[std::size_t(b) * kOpsPerBlock + 1];
    if (first == Keep::all && second == Keep::all) continue;
    if (second != Keep::none || first == Keep::all) {
      throw std::invalid_argument(
          "checkpointing.policy: the schedule recomputes part of block " +
          std::to_string(block0 + b) +
          "; the 2d/2.5d/3d models recompute whole blocks only (use full, every_k, sqrt or "
          "manual)");
    }
    const bool continues = first == Keep::none && b > 0 && plan.start[std::size_t(b) - 1] >= 0;
    plan.start[std::size_t(b)] = continues ? plan.start[std::size_t(b) - 1] : b;
    plan.longest = std::max(plan.longest, b - plan.start[std::size_t(b)] + 1);
  }
  return plan;
}

float* carve_blocks(std::vector<LayerActs>& acts, const BlockRecompute& plan, float* kept,
                    float* arena, int64_t R, int64_t c, int64_t f, int64_t att,
                    float* selective_att) {
  const int64_t per_layer = layer_act_floats(R, c, f, att);
  acts.resize(plan.start.size());
  for (int b = 0; b < int(plan.start.size()); ++b) {
    LayerActs& a = acts[std::size_t(b)];
    if (!plan.dropped(b)) {
      kept = carve_layer(a, kept, R, c, f, plan.selective ? 0 : att);
      if (plan.selective) a.att = selective_att;
      continue;
    }
    const int start = plan.start[std::size_t(b)];
    carve_layer(a, arena + int64_t(b - start) * per_layer, R, c, f, att);
    if (start == b) {  // the segment's input is kept
      a.x = kept;
      kept += R * c;
    }
  }
  return kept;
}

namespace {
// Hands out consecutive pieces of a buffer.
struct Carver {
  float*& cursor;
  float* operator()(int64_t n) const {
    float* p = cursor;
    cursor += n;
    return p;
  }
};
}  // namespace

float* carve_head(HeadActs& h, float* cursor, int64_t R, int64_t c, int64_t logits, bool head) {
  const Carver carve{cursor};
  h.x_final = carve(R * c);
  if (!head) return cursor;
  h.lnf = carve(R * c);
  h.lnf_mean = carve(R);
  h.lnf_rstd = carve(R);
  h.logits = carve(logits);
  h.losses = carve(R);
  return cursor;
}

float* carve_layer(LayerActs& a, float* cursor, int64_t R, int64_t c, int64_t f, int64_t att) {
  const Carver carve{cursor};
  a.x = carve(R * c);
  a.ln1 = carve(R * c);
  a.ln1_mean = carve(R);
  a.ln1_rstd = carve(R);
  a.qkv = carve(3 * R * c);
  a.att = carve(att);
  a.atty = carve(R * c);
  a.xmid = carve(R * c);
  a.ln2 = carve(R * c);
  a.ln2_mean = carve(R);
  a.ln2_rstd = carve(R);
  a.h = carve(R * f);
  a.a = carve(R * f);
  return cursor;
}

Scratch carve_scratch(float* cursor, int64_t work, int64_t BT, int64_t R, int64_t c, int64_t f,
                      int64_t datt, int64_t dweight) {
  auto carve = [&cursor](int64_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  Scratch s;
  s.work = carve(work);
  s.embed = carve(BT * c);
  s.dx = carve(R * c);
  s.dln = carve(R * c);
  s.datty = carve(R * c);
  s.dqkv = carve(3 * R * c);
  s.dh = carve(R * f);
  s.datt = carve(datt);
  s.dweight = carve(dweight);
  s.ln_work = carve(3 * R);
  return s;
}

}  // namespace colossal::core::sharded
