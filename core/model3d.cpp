#include "core/model3d.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/layers.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"
#include "core/sharded_detail.hpp"
#include "core/tensor2d.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

namespace k = kernels;

Model3D::Model3D(const ModelSpec& spec, int batch, int seq_len, Cube3DGroups& groups, Gemm& gemm,
                 MemoryTracker& tracker, std::size_t unit_multiple, const std::vector<Keep>& keep,
                 bool selective, const StoreFactory& make_store_factory, StageRange stage,
                 int slots, std::size_t first_unit_floats)
    : GridModel(spec, batch, unit_multiple, stage, slots),
      seq_len_(seq_len),
      q_(groups.input.size()),
      i_(groups.weight.rank()),
      j_(groups.input.rank()),
      l_(groups.output.rank()),
      groups_(groups),
      first_{groups.input, groups.weight, groups.output},
      second_{groups.output, groups.weight, groups.input},
      gemm_(gemm) {
  const int q = q_, q2 = q * q;
  sharded::require_grid_shape(spec, batch, seq_len, TensorMode::d3, q);
  const int64_t C = spec.hidden, F = spec.ffn_hidden, BT = int64_t(batch) * seq_len;
  rows_ = BT / q2;
  c_ = C / q;
  f_ = F / q;
  vocab_block_ = (spec.vocab + q2 - 1) / q2;
  position_block_ = (spec.position_rows() + q2 - 1) / q2;
  const int64_t c = c_, f = f_, cq = c / q, fq = f / q, Vp = vocab_block_ * q2;
  const bool gpt2 = spec.arch == Arch::gpt2;
  const int L = blocks(), l0 = first_block();
  const bool embeds = this->stage().embeds, head = this->stage().head;
  blocks_.resize(L);
  // Unit 0: the stage's embeddings (the token embedding on the first and the last stage, the
  // positions on the first), then the vectors replicated over the plane sharing j and those
  // replicated over the plane sharing l (two contiguous regions, each summed over its plane in
  // one all-reduce); unit 1 + b: the stage's block b's weight blocks.
  if (embeds || head) wte_ = append_param("wte", ParamRole::token_embedding, c * vocab_block_);
  if (embeds != head) set_tied_floats(std::size_t(c * vocab_block_));
  if (embeds) wpe_ = append_param("wpe", ParamRole::position_embedding, position_block_ * c);
  plane_j_begin_ = sharded::table_end(table_);
  for (int l = 0; l < L; ++l) {  // outputs in the Y layout: replicated over the plane sharing j
    Block& b = blocks_[l];
    const std::string h = "layer" + std::to_string(l0 + l);
    b.qkv.b = append_param(h + ".qkv.bias", ParamRole::bias, 3 * c);
    b.fc.b = append_param(h + ".fc.bias", ParamRole::bias, f);
  }
  plane_l_begin_ = sharded::table_end(table_);
  for (int l = 0; l < L; ++l) {  // X layout: replicated over the plane sharing l
    Block& b = blocks_[l];
    const std::string h = "layer" + std::to_string(l0 + l);
    b.ln1_w = append_param(h + ".ln1.weight", ParamRole::layernorm_weight, c);
    b.ln1_b = append_param(h + ".ln1.bias", ParamRole::layernorm_bias, c);
    b.proj.b = append_param(h + ".proj.bias", ParamRole::bias, c);
    b.ln2_w = append_param(h + ".ln2.weight", ParamRole::layernorm_weight, c);
    b.ln2_b = append_param(h + ".ln2.bias", ParamRole::layernorm_bias, c);
    b.fc2.b = append_param(h + ".fc2.bias", ParamRole::bias, c);
  }
  if (head) {
    lnf_w_ = append_param("ln_f.weight", ParamRole::layernorm_weight, c);
    lnf_b_ = append_param("ln_f.bias", ParamRole::layernorm_bias, c);
  }
  plane_l_end_ = sharded::table_end(table_);
  end_unit(first_unit_floats);
  for (int l = 0; l < L; ++l) {
    Block& b = blocks_[l];
    const std::string h = "layer" + std::to_string(l0 + l);
    auto linear = [&](Linear& lin, const std::string& name, ParamRole role, std::size_t count,
                      int64_t in, int64_t out, bool to_y) {
      lin.w = append_param(name, role, count);
      lin.in = in;
      lin.out = out;
      lin.to_y = to_y;
    };
    linear(b.qkv, h + ".qkv", ParamRole::weight, c * (3 * c / q), C, 3 * C, true);
    linear(b.proj, h + ".proj", ParamRole::residual_out_weight, c * cq, C, C, false);
    linear(b.fc, h + ".fc", ParamRole::weight, c * fq, C, F, true);
    linear(b.fc2, h + ".fc2", ParamRole::residual_out_weight, f * cq, F, C, false);
    end_unit();
  }
  (void)gpt2;
  make_store(tracker, make_store_factory);
  map_runs();
  for (LogicalRun& run : runs_) run.owned = owns(run.local);

  // Per slot: the blocks' activations, the stage's output (R x c) and on the last stage the
  // head's.
  const int64_t R = rows_;
  const int64_t logits = R * (Vp / q);
  allocate_activations(tracker, grid_block_floats(spec, TensorMode::d3, batch, seq_len, q), keep,
                       selective, R, c, f, logits);

  const sharded::ScratchSizes sizes = scratch_sizes(spec, batch, seq_len, q);
  const int64_t work = sizes.work, dweight = sizes.dweight, datt = sizes.datt;
  scratch_ = DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.total));
  s_ = sharded::carve_scratch(scratch_.data(), work, BT, R, c, f, datt, dweight);
  set_stage_gradient(s_.dx);
}

sharded::ScratchSizes Model3D::scratch_sizes(const ModelSpec& spec, int batch, int seq_len, int q) {
  const int64_t q2 = int64_t(q) * q, C = spec.hidden, F = spec.ffn_hidden,
                BT = int64_t(batch) * seq_len;
  const int64_t c = C / q, f = F / q, cq = c / q, fq = f / q, R = BT / q2;
  const int64_t vb = (spec.vocab + q2 - 1) / q2, Vp = vb * q2;
  std::size_t work = 0;
  for (auto [M, N, K] : {std::tuple{BT, 3 * C, C}, std::tuple{BT, C, C}, std::tuple{BT, F, C},
                         std::tuple{BT, C, F}, std::tuple{BT, Vp, C}}) {
    work = std::max(work, linear3d_work_floats(M, N, K, q));
  }
  const int64_t dweight = std::max({c * (3 * c / q), c * cq, c * fq, f * cq, c * vb});
  const int64_t datt = grid_attention_work_floats(spec, seq_len, q);
  return {int64_t(work), datt, dweight,
          sharded::scratch_floats(int64_t(work), BT, R, c, f, datt, dweight)};
}

std::size_t Model3D::temporary_floats(const ModelSpec& spec, int batch, int seq_len, int q) {
  return std::size_t(scratch_sizes(spec, batch, seq_len, q).total);
}

std::vector<std::size_t> Model3D::unit_floats(const ModelSpec& s, int q, std::size_t unit_multiple,
                                              StageRange stage,
                                              std::size_t first_unit_floats) {
  using sharded::aligned16;
  const std::size_t q2 = std::size_t(q) * q, c = s.hidden / q, f = s.ffn_hidden / q,
                    L = sharded::stage_blocks(s, stage);
  const std::size_t vb = (s.vocab + q2 - 1) / q2, pb = (s.position_rows() + q2 - 1) / q2;
  auto padded = [&](std::size_t n) { return sharded::round_up(n, unit_multiple); };
  const std::size_t plane_j = L * (aligned16(3 * c) + aligned16(f));
  const std::size_t plane_l = L * 6 * aligned16(c) + (stage.head ? 2 * aligned16(c) : 0);
  const std::size_t embeddings = (stage.embeds || stage.head ? aligned16(c * vb) : 0) +
                                 (stage.embeds ? aligned16(pb * c) : 0);
  std::vector<std::size_t> units{
      padded(std::max(embeddings + plane_j + plane_l, first_unit_floats))};
  for (std::size_t l = 0; l < L; ++l) {
    units.push_back(padded(aligned16(c * (3 * c / q)) + aligned16(c * (c / q)) +
                           aligned16(c * (f / q)) + aligned16(f * (c / q))));
  }
  return units;
}

std::size_t Model3D::parameter_floats(const ModelSpec& s, int q, std::size_t unit_multiple,
                                      StageRange stage) {
  std::size_t n = 0;
  for (std::size_t u : unit_floats(s, q, unit_multiple, stage)) n += u;
  return n;
}

std::size_t Model3D::activation_floats(const ModelSpec& s, int batch, int seq_len, int q,
                                       StageRange stage) {
  const std::size_t q2 = std::size_t(q) * q, R = std::size_t(batch) * seq_len / q2;
  const std::size_t c = s.hidden / q;
  const std::size_t vb = (s.vocab + q2 - 1) / q2;
  const GridBlockFloats block = grid_block_floats(s, TensorMode::d3, batch, seq_len, q);
  return sharded::stage_blocks(s, stage) * std::size_t(block.set) +
         std::size_t(sharded::head_act_floats(int64_t(R), int64_t(c), int64_t(R * vb * q),
                                              stage.head));
}

Model3D::Communication Model3D::step_communication(const ModelSpec& s, int batch, int seq_len,
                                                   int q, StageRange stage) {
  const double q2 = double(q) * q, M = double(batch) * seq_len, R = M / q2, C = s.hidden,
               F = s.ffn_hidden;
  const double Vp = std::ceil(double(s.vocab) / q2) * q2;
  Communication m;
  auto linear = [&](double K, double N, bool to_y) {
    double& in_ag = to_y ? m.input_all_gather : m.output_all_gather;
    double& in_rs = to_y ? m.input_reduce_scatter : m.output_reduce_scatter;
    double& out_ag = to_y ? m.output_all_gather : m.input_all_gather;
    double& out_rs = to_y ? m.output_reduce_scatter : m.input_reduce_scatter;
    in_ag += 2 * M * K / q2;         // forward, and again in backward: the input's blocks
    m.weight_all_gather += 2 * K * N / q2;  // likewise the weight's
    out_rs += M * N / q2;            // forward: the partial products
    out_ag += M * N / q2;            // backward: the output gradient's blocks
    in_rs += M * K / q2;             // backward: the input gradient's partials
    m.weight_reduce_scatter += K * N / q2;
  };
  const int blocks = sharded::stage_blocks(s, stage);
  for (int l = 0; l < blocks; ++l) {
    linear(C, 3 * C, true);
    linear(C, C, false);
    linear(C, F, true);
    linear(F, C, false);
  }
  m.output_all_reduce += 2.0 * blocks * 4 * R;  // the blocks' layernorms
  if (stage.head) {  // the tied head, the final layernorm, the cross-entropy and the loss
    linear(C, Vp, true);
    m.output_all_reduce += 4 * R + 1;
    m.input_all_reduce += 3 * R;
    m.weight_all_reduce += 1;
  }
  if (stage.embeds) {  // the embedding
    m.plane_reduce_scatter += M * C / q;
    m.plane_all_gather += M * C / q;
  }
  return m;
}

void Model3D::map_runs() {
  const std::vector<ParamSpec> logical = parameter_table(spec_);
  std::map<std::string, int> index;
  for (std::size_t t = 0; t < logical.size(); ++t) index[logical[t].name] = int(t);
  auto tensor = [&](const std::string& name) { return index.at(name); };
  auto emit = [this](std::size_t local, int t, std::size_t at) {
    sharded::append_element(runs_, local, t, at);
  };
  const bool gpt2 = spec_.arch == Arch::gpt2;
  const int q = q_;
  const int64_t C = spec_.hidden, c = c_, f = f_, cq = c / q, fq = f / q;
  const int64_t plane = int64_t(j_) * q + i_;  // this rank's block of q^2 (vocabulary, positions)
  // The head's weight block: hidden rows [l c, (l+1) c), vocabulary columns of block `plane`.
  const bool embeds = stage().embeds, head = stage().head;
  const int wte = tensor(gpt2 ? "transformer.wte.weight" : "model.decoder.embed_tokens.weight");
  for (int64_t r = 0; r < (embeds || head ? c : 0); ++r) {
    for (int64_t s = 0; s < vocab_block_; ++s) {
      const int64_t v = plane * vocab_block_ + s;
      if (v < spec_.vocab) emit(wte_ + r * vocab_block_ + s, wte, v * C + l_ * c + r);
    }
  }
  const int wpe =
      tensor(gpt2 ? "transformer.wpe.weight" : "model.decoder.embed_positions.weight");
  for (int64_t r = 0; r < (embeds ? position_block_ : 0); ++r) {
    const int64_t p = plane * position_block_ + r;
    if (p >= spec_.position_rows()) break;
    for (int64_t s = 0; s < c; ++s) emit(wpe_ + r * c + s, wpe, p * C + l_ * c + s);
  }
  // An [in x out] weight block: rows [row0, row0 + in_local), columns [col0, col0 + out_local)
  // of the logical (q|k|v-regrouped) matrix.
  auto matrix_block = [&](std::size_t off, int64_t row0, int64_t in_local, int64_t col0,
                          int64_t out_local, auto locate) {
    for (int64_t r = 0; r < in_local; ++r) {
      for (int64_t s = 0; s < out_local; ++s) {
        const auto [t, at] = locate(row0 + r, col0 + s);
        emit(off + r * out_local + s, t, at);
      }
    }
  };
  // Regrouped q|k|v column u of 3C -> (part, logical column within the part).
  auto qkv_column = [&](int64_t u) {
    const int64_t block = u / (3 * c), within = u % (3 * c);
    return std::pair{within / c, block * c + within % c};
  };
  const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
  auto prefix = [&](int l) {
    return (gpt2 ? "transformer.h." : "model.decoder.layers.") + std::to_string(first_block() + l) +
           ".";
  };
  for (int l = 0; l < blocks(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = prefix(l);
    // X -> Y weights: rows block l, columns block (j q + i) of q^2.
    const int64_t qkv_cols = 3 * c / q;
    matrix_block(b.qkv.w, l_ * c, c, plane * qkv_cols, qkv_cols, [&](int64_t in, int64_t u) {
      const auto [part, out] = qkv_column(u);
      if (gpt2) {
        return std::pair{tensor(h + "attn.c_attn.weight"),
                         std::size_t(in * 3 * C + part * C + out)};
      }
      return std::pair{tensor(h + "self_attn." + parts[part] + ".weight"),
                       std::size_t(out * C + in)};
    });
    auto linear = [&](const Linear& lin, int64_t row0, int64_t in_local, int64_t col0,
                      int64_t out_local, const std::string& name, bool out_in) {
      const int t = tensor(name);
      matrix_block(lin.w, row0, in_local, col0, out_local, [&](int64_t in, int64_t out) {
        return std::pair{t, std::size_t(out_in ? out * lin.in + in : in * lin.out + out)};
      });
    };
    // Y -> X weights (the swapped cube): rows block j, columns block (l q + i) of q^2.
    const int64_t swapped = int64_t(l_) * q + i_;
    linear(b.proj, j_ * c, c, swapped * cq, cq,
           h + (gpt2 ? "attn.c_proj.weight" : "self_attn.out_proj.weight"), !gpt2);
    linear(b.fc, l_ * c, c, plane * fq, fq, h + (gpt2 ? "mlp.c_fc.weight" : "fc1.weight"), !gpt2);
    linear(b.fc2, j_ * f, f, swapped * cq, cq, h + (gpt2 ? "mlp.c_proj.weight" : "fc2.weight"),
           !gpt2);
  }
  // Replicated vectors: Y-layout biases hold columns block j, X-layout ones block l.
  auto vector_block = [&](std::size_t off, int t, int64_t first, int64_t n) {
    for (int64_t s = 0; s < n; ++s) emit(off + s, t, first + s);
  };
  for (int l = 0; l < blocks(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = prefix(l);
    for (int64_t s = 0; s < 3 * c; ++s) {
      const auto [part, out] = qkv_column(j_ * 3 * c + s);
      if (gpt2) {
        emit(b.qkv.b + s, tensor(h + "attn.c_attn.bias"), part * C + out);
      } else {
        emit(b.qkv.b + s, tensor(h + "self_attn." + parts[part] + ".bias"), out);
      }
    }
    vector_block(b.fc.b, tensor(h + (gpt2 ? "mlp.c_fc.bias" : "fc1.bias")), j_ * f, f);
  }
  for (int l = 0; l < blocks(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = prefix(l);
    const int64_t x0 = l_ * c;
    vector_block(b.ln1_w, tensor(h + (gpt2 ? "ln_1.weight" : "self_attn_layer_norm.weight")), x0,
                 c);
    vector_block(b.ln1_b, tensor(h + (gpt2 ? "ln_1.bias" : "self_attn_layer_norm.bias")), x0, c);
    vector_block(b.proj.b, tensor(h + (gpt2 ? "attn.c_proj.bias" : "self_attn.out_proj.bias")),
                 x0, c);
    vector_block(b.ln2_w, tensor(h + (gpt2 ? "ln_2.weight" : "final_layer_norm.weight")), x0, c);
    vector_block(b.ln2_b, tensor(h + (gpt2 ? "ln_2.bias" : "final_layer_norm.bias")), x0, c);
    vector_block(b.fc2.b, tensor(h + (gpt2 ? "mlp.c_proj.bias" : "fc2.bias")), x0, c);
  }
  if (!head) return;
  vector_block(
      lnf_w_, tensor(gpt2 ? "transformer.ln_f.weight" : "model.decoder.final_layer_norm.weight"),
      l_ * c, c);
  vector_block(
      lnf_b_, tensor(gpt2 ? "transformer.ln_f.bias" : "model.decoder.final_layer_norm.bias"),
      l_ * c, c);
}

void Model3D::init_parameters(uint64_t seed) {
  sharded::init_from_runs(params(), params_end(), runs_, spec_, seed);
}

void Model3D::linear_forward(const Linear& lin, const float* in, float* out) {
  const int64_t BT = int64_t(batch_) * seq_len_;
  linear3d_forward(gemm_, cube(lin), in, params() + lin.w, out, BT, lin.out, lin.in, s_.work);
  sharded::add_bias_rows(out, params() + lin.b, rows_, lin.out / q_);
}

void Model3D::linear_backward(const Linear& lin, const float* in, const float* dout, float* din) {
  const int64_t BT = int64_t(batch_) * seq_len_, out_local = lin.out / q_;
  k::bias_backward(grad(lin.b), dout, rows_, int(out_local), int(out_local));
  linear3d_backward(gemm_, cube(lin), dout, in, params() + lin.w, din, s_.dweight, BT,
                    lin.out, lin.in, s_.work);
  k::add(grad(lin.w), s_.dweight, lin.in / q_ * (lin.out / (q_ * q_)));
}

// Block l's forward: its activations (kept, or the recompute arena's) from its input x; the
// output goes to the next block's input (the final layernorm's after the last block).
void Model3D::block_forward(int l) {
  const int q = q_, T = seq_len_;
  const int64_t R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  const float eps = spec_.layernorm_eps();
  const int L = blocks(), Bl = batch_ / (q * q), Hl = spec_.heads / q;
  TensorGroup& x_columns = groups_.output;  // splits the X layout's columns
  sharded::LayerActs& A = layer_acts_[l];
  const Block& b = blocks_[l];
  float* next = l + 1 < L ? layer_acts_[l + 1].x : head_.x_final;
  layernorm_split_forward(x_columns, A.ln1, A.ln1_mean, A.ln1_rstd, A.x, P + b.ln1_w,
                          P + b.ln1_b, R, c, C, eps, s_.ln_work);
  linear_forward(b.qkv, A.ln1, A.qkv);
  attention_core_forward(gemm_, A, s_.datt, Bl, T, int(c), Hl);
  linear_forward(b.proj, A.atty, A.xmid);
  k::add(A.xmid, A.x, R * c);
  layernorm_split_forward(x_columns, A.ln2, A.ln2_mean, A.ln2_rstd, A.xmid, P + b.ln2_w,
                          P + b.ln2_b, R, c, C, eps, s_.ln_work);
  linear_forward(b.fc, A.ln2, A.h);
  if (spec_.arch == Arch::gpt2) {
    k::gelu_forward(A.a, A.h, R * f_);
  } else {
    k::relu_forward(A.a, A.h, R * f_);
  }
  linear_forward(b.fc2, A.a, next);
  k::add(next, A.xmid, R * c);
}

double Model3D::forward(const int32_t* tokens, const int32_t* targets, int batch,
                        float grad_scale, int slot) {
  take_parameters_unchanged();  // nothing to keep across calls: see GridModel::held_floats
  check_micro_batch(batch, slot);
  use_slot(slot);
  const int q = q_, T = seq_len_;
  const int64_t BT = int64_t(batch_) * T, R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  const float eps = spec_.layernorm_eps();
  // Embedding on the first stage; later ones find their input in stage_input(slot).
  if (stage().embeds) {
    float* part = s_.embed;
    const float* wte = P + wte_;
    const float* wpe = P + wpe_;
    const int64_t plane = int64_t(j_) * q + i_, vb = vocab_block_, pb = position_block_;
    const int64_t v0 = plane * vb, p0 = plane * pb, offset = spec_.position_offset();
    grid_embedding_forward(part, tokens, wte, 1, vb, wpe, BT, T, c, v0, vb, offset, p0, pb);
    fence_kernels();
    groups_.plane_l.reduce_scatter(part, std::size_t(BT * c), layer_acts_[0].x);
  }
  for (int l = 0; l < blocks(); ++l) block_forward(l);
  if (!stage().head) {
    fence_kernels();  // the output goes to the next stage
    return 0.0;
  }
  TensorGroup& x_columns = groups_.output;  // splits the X layout's columns
  layernorm_split_forward(x_columns, head_.lnf, head_.lnf_mean, head_.lnf_rstd, head_.x_final,
                          P + lnf_w_, P + lnf_b_, R, c, C, eps, s_.ln_work);
  // Logits in the Y layout: rows block i q + l, vocabulary block j of q.
  const int64_t Vp = vocab_block_ * q * q, vq = Vp / q;
  linear3d_forward(gemm_, first_, head_.lnf, P + wte_, head_.logits, BT, Vp, C, s_.work);
  const int64_t v0 = j_ * vq;
  const int valid = int(std::clamp<int64_t>(spec_.vocab - v0, 0, vq));
  vocab_parallel_cross_entropy(groups_.input, head_.logits, head_.losses,
                               targets + (int64_t(i_) * q + l_) * R, R, int(vq), valid, v0,
                               grad_scale, s_.ln_work);
  // Rows block (i, l) is the same on every j: sum over l, then over i.
  float total = float(k::sum(head_.losses, R));
  groups_.output.all_reduce_sum(&total, 1);
  groups_.weight.all_reduce_sum(&total, 1);
  return double(total) / double(BT);
}

void Model3D::backward(const int32_t* tokens, int batch, int slot) {
  check_micro_batch(batch, slot);
  use_slot(slot);
  const int q = q_, T = seq_len_;
  const int64_t BT = int64_t(batch_) * T, R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  open_gradients(0);
  TensorGroup& x_columns = groups_.output;
  if (stage().head) {
    const int64_t Vp = vocab_block_ * q * q;
    linear3d_backward(gemm_, first_, head_.logits, head_.lnf, P + wte_, s_.dln, s_.dweight, BT, Vp,
                      C, s_.work);
    k::add(grad(wte_), s_.dweight, c * vocab_block_);
    k::fill(s_.dx, R * c, 0.0f);
    layernorm_split_backward(x_columns, s_.dx, grad(lnf_w_), grad(lnf_b_), s_.dln, head_.x_final,
                             P + lnf_w_, head_.lnf_mean, head_.lnf_rstd, R, c, C, s_.ln_work);
  }  // else the next stage's gradient of this stage's output is in s_.dx (output_gradient())
  const int Bl = batch_ / (q * q), Hl = spec_.heads / q;
  for (int l = blocks() - 1; l >= 0; --l) {
    // A recomputed segment's forward again, from its kept input, before its last block's
    // backward (the same operations in the same order: the same bits).
    if (recompute_plan_.segment_end(l)) {
      for (int m = recompute_plan_.start[std::size_t(l)]; m <= l; ++m) block_forward(m);
    }
    sharded::LayerActs& A = layer_acts_[l];
    const Block& b = blocks_[l];
    open_gradients(1 + l);
    linear_backward(b.fc2, A.a, s_.dx, s_.dh);
    if (spec_.arch == Arch::gpt2) {
      k::gelu_backward(s_.dh, A.h, s_.dh, R * f_);
    } else {
      k::relu_backward(s_.dh, A.h, s_.dh, R * f_);
    }
    linear_backward(b.fc, A.ln2, s_.dh, s_.dln);
    layernorm_split_backward(x_columns, s_.dx, grad(b.ln2_w), grad(b.ln2_b), s_.dln, A.xmid,
                             P + b.ln2_w, A.ln2_mean, A.ln2_rstd, R, c, C, s_.ln_work);
    linear_backward(b.proj, A.atty, s_.dx, s_.datty);
    if (recompute_plan_.rebuilds_probabilities(l)) {
      // selective: the probabilities again from the kept q|k|v (atty rewritten with its bits).
      attention_core_forward(gemm_, A, s_.datt, Bl, T, int(c), Hl);
    }
    attention_core_backward(gemm_, s_.dqkv, s_.datt, s_.datty, A, Bl, T, int(c), Hl);
    linear_backward(b.qkv, A.ln1, s_.dqkv, s_.dln);
    layernorm_split_backward(x_columns, s_.dx, grad(b.ln1_w), grad(b.ln1_b), s_.dln, A.x,
                             P + b.ln1_w, A.ln1_mean, A.ln1_rstd, R, c, C, s_.ln_work);
    close_gradients(1 + l);
  }
  fence_kernels();
  if (!stage().embeds) {  // s_.dx: the gradient of the stage's input, for the previous stage
    close_gradients(0);
    return;
  }
  groups_.plane_l.all_gather(s_.dx, std::size_t(R * c), s_.embed);
  const float* d = s_.embed;
  float* dwte = grad(wte_);
  float* dwpe = grad(wpe_);
  const int64_t plane = int64_t(j_) * q + i_, vb = vocab_block_, pb = position_block_;
  const int64_t v0 = plane * vb, p0 = plane * pb, offset = spec_.position_offset();
  grid_embedding_backward(dwte, 1, vb, dwpe, d, tokens, BT, batch_, T, c, v0, vb, offset, p0, pb);
  close_gradients(0);
}

void Model3D::reduce_gradients() {
  fence_kernels();
  for (const auto& [p, n] : gradient_pieces(plane_j_begin_, plane_l_begin_)) {
    groups_.plane_j.all_reduce_sum(p, n);
  }
  for (const auto& [p, n] : gradient_pieces(plane_l_begin_, plane_l_end_)) {
    groups_.plane_l.all_reduce_sum(p, n);
  }
}

bool Model3D::owns(std::size_t local) const {
  // The last stage's copy of the tied token embedding: the first stage writes it.
  if (!stage().embeds && local < plane_j_begin_) return false;
  if (local < plane_j_begin_ || local >= plane_l_end_) return true;
  if (local < plane_l_begin_) return i_ == 0 && l_ == 0;
  return i_ == 0 && j_ == 0;
}

std::vector<std::pair<std::size_t, std::size_t>> Model3D::norm_ranges() const {
  // The last stage's tied token embedding is counted on the first stage.
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  if (stage().embeds) ranges.emplace_back(0, plane_j_begin_);
  ranges.emplace_back(plane_l_end_, params_end());
  if (i_ == 0 && l_ == 0) ranges.emplace_back(plane_j_begin_, plane_l_begin_);
  if (i_ == 0 && j_ == 0) ranges.emplace_back(plane_l_begin_, plane_l_end_);
  return ranges;
}

double Model3D::gradient_sum_squares() const {
  double s = 0.0;
  for (const auto& [begin, end] : norm_ranges()) s += sum_of_squares(grads() + begin, end - begin);
  return s;
}

}  // namespace colossal::core
