#include "core/model2d.hpp"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <tuple>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/layers.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"
#include "core/sharded_detail.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

namespace k = kernels;

Model2D::Model2D(const ModelSpec& spec, int batch, int seq_len, Grid2D& grid, Gemm& gemm,
                 MemoryTracker& tracker, TensorGroup* depth, std::size_t unit_multiple,
                 const std::vector<Keep>& keep, bool selective,
                 const StoreFactory& make_store_factory, StageRange stage, int slots,
                 std::size_t first_unit_floats)
    : GridModel(spec, batch, unit_multiple, stage, slots),
      seq_len_(seq_len),
      q_(grid.q()),
      i_(grid.i()),
      j_(grid.j()),
      grid_(grid),
      depth_(depth != nullptr && depth->size() > 1 ? depth : nullptr),
      gemm_(gemm) {
  const int q = q_;
  sharded::require_grid_shape(spec, batch, seq_len, TensorMode::d2, q);
  const int64_t C = spec.hidden, F = spec.ffn_hidden, BT = int64_t(batch) * seq_len;
  rows_ = BT / q;
  c_ = C / q;
  f_ = F / q;
  vocab_block_ = (spec.vocab + q - 1) / q;
  position_block_ = (spec.position_rows() + q - 1) / q;

  // Unit 0: the stage's embeddings (the token embedding on the first and the last stage, the
  // positions on the first), then everything replicated down the grid column (biases,
  // layernorms) as one contiguous region, summed over the column in one all-reduce; unit 1 + b:
  // the stage's block b's weight blocks.
  const int64_t L = blocks(), l0 = first_block();
  const bool embeds = this->stage().embeds, head = this->stage().head;
  blocks_.resize(L);
  const bool gpt2 = spec.arch == Arch::gpt2;
  const std::string emb = gpt2 ? "transformer.wte.weight" : "model.decoder.embed_tokens.weight";
  const std::string pos = gpt2 ? "transformer.wpe.weight" : "model.decoder.embed_positions.weight";
  if (embeds || head) wte_ = append_param(emb, ParamRole::token_embedding, vocab_block_ * c_);
  if (embeds != head) set_tied_floats(std::size_t(vocab_block_ * c_));
  if (embeds) wpe_ = append_param(pos, ParamRole::position_embedding, position_block_ * c_);
  replicated_begin_ = sharded::table_end(table_);
  for (int64_t l = 0; l < L; ++l) {
    Block& b = blocks_[l];
    const std::string h =
        (gpt2 ? "transformer.h." : "model.decoder.layers.") + std::to_string(l0 + l);
    b.ln1_w = append_param(h + ".ln1.weight", ParamRole::layernorm_weight, c_);
    b.ln1_b = append_param(h + ".ln1.bias", ParamRole::layernorm_bias, c_);
    b.qkv.b = append_param(h + ".qkv.bias", ParamRole::bias, 3 * c_);
    b.proj.b = append_param(h + ".proj.bias", ParamRole::bias, c_);
    b.ln2_w = append_param(h + ".ln2.weight", ParamRole::layernorm_weight, c_);
    b.ln2_b = append_param(h + ".ln2.bias", ParamRole::layernorm_bias, c_);
    b.fc.b = append_param(h + ".fc.bias", ParamRole::bias, f_);
    b.fc2.b = append_param(h + ".fc2.bias", ParamRole::bias, c_);
  }
  if (head) {
    lnf_w_ = append_param("ln_f.weight", ParamRole::layernorm_weight, c_);
    lnf_b_ = append_param("ln_f.bias", ParamRole::layernorm_bias, c_);
  }
  replicated_end_ = sharded::table_end(table_);
  end_unit(first_unit_floats);
  for (int64_t l = 0; l < L; ++l) {
    Block& b = blocks_[l];
    const std::string h =
        (gpt2 ? "transformer.h." : "model.decoder.layers.") + std::to_string(l0 + l);
    b.qkv.w = append_param(h + ".qkv.weight", ParamRole::weight, c_ * 3 * c_);
    b.qkv.in = C;
    b.qkv.out = 3 * C;
    b.proj.w = append_param(h + ".proj.weight", ParamRole::residual_out_weight, c_ * c_);
    b.proj.in = C;
    b.proj.out = C;
    b.fc.w = append_param(h + ".fc.weight", ParamRole::weight, c_ * f_);
    b.fc.in = C;
    b.fc.out = F;
    b.fc2.w = append_param(h + ".fc2.weight", ParamRole::residual_out_weight, f_ * c_);
    b.fc2.in = F;
    b.fc2.out = C;
    end_unit();
  }
  make_store(tracker, make_store_factory);
  map_runs();
  for (LogicalRun& run : runs_) run.owned = owns(run.local);

  // Activations kept for backward, per slot: per block, then the stage's output and the head's.
  // x, ln1, atty, xmid, ln2 (R x c each), qkv (R x 3c), four row statistics, the probabilities,
  // and the MLP's pre- and post-activation (R x f each) per kept block; then the stage's output
  // (R x c) and on the last stage the head's.
  const int64_t R = rows_, c = c_, f = f_;
  allocate_activations(tracker, grid_block_floats(spec, TensorMode::d2, batch, seq_len, q), keep,
                       selective, R, c, f, R * vocab_block_);

  const sharded::ScratchSizes sizes = scratch_sizes(spec, batch, seq_len, q);
  const int64_t work = sizes.work, dweight = sizes.dweight, datt = sizes.datt;
  scratch_ = DeviceArray<float>(tracker, MemCategory::temporaries, std::size_t(sizes.total));
  s_ = sharded::carve_scratch(scratch_.data(), work, BT, R, c, f, datt, dweight);
  set_stage_gradient(s_.dx);
}

// Temporaries: the products' work (the largest of every SUMMA call), the embedding's whole-batch
// columns, gradient buffers, one batch row of attention-score gradients and one weight block's
// gradient.
sharded::ScratchSizes Model2D::scratch_sizes(const ModelSpec& spec, int batch, int seq_len, int q) {
  const int64_t C = spec.hidden, F = spec.ffn_hidden, BT = int64_t(batch) * seq_len;
  const int64_t c = C / q, f = F / q, R = BT / q, vb = (spec.vocab + q - 1) / q, Vp = vb * q;
  std::size_t work = 0;
  for (auto [M, N, K] : {std::tuple{BT, 3 * C, C}, std::tuple{BT, C, C}, std::tuple{BT, F, C},
                         std::tuple{BT, C, F}, std::tuple{BT, Vp, C}, std::tuple{BT, C, Vp},
                         std::tuple{Vp, C, BT}, std::tuple{BT, C, 3 * C},
                         std::tuple{C, 3 * C, BT}, std::tuple{C, C, BT}, std::tuple{C, F, BT},
                         std::tuple{F, C, BT}}) {
    work = std::max(work, summa_work_floats(M, N, K, q));
  }
  const int64_t dweight = std::max({vb * c, 3 * c * c, c * f});
  const int64_t datt = grid_attention_work_floats(spec, seq_len, q);
  return {int64_t(work), datt, dweight,
          sharded::scratch_floats(int64_t(work), BT, R, c, f, datt, dweight)};
}

std::size_t Model2D::temporary_floats(const ModelSpec& spec, int batch, int seq_len, int q) {
  return std::size_t(scratch_sizes(spec, batch, seq_len, q).total);
}

std::vector<std::size_t> Model2D::unit_floats(const ModelSpec& s, int q, std::size_t unit_multiple,
                                              StageRange stage,
                                              std::size_t first_unit_floats) {
  using sharded::aligned16;
  const std::size_t c = s.hidden / q, f = s.ffn_hidden / q, L = sharded::stage_blocks(s, stage);
  const std::size_t vb = (s.vocab + q - 1) / q, pb = (s.position_rows() + q - 1) / q;
  auto padded = [&](std::size_t n) { return sharded::round_up(n, unit_multiple); };
  const std::size_t replicated =
      L * (5 * aligned16(c) + aligned16(3 * c) + aligned16(f) + aligned16(c)) +
      (stage.head ? 2 * aligned16(c) : 0);
  const std::size_t embeddings = (stage.embeds || stage.head ? aligned16(vb * c) : 0) +
                                 (stage.embeds ? aligned16(pb * c) : 0);
  std::vector<std::size_t> units{padded(std::max(embeddings + replicated, first_unit_floats))};
  for (std::size_t l = 0; l < L; ++l) {
    units.push_back(padded(aligned16(3 * c * c) + aligned16(c * c) + 2 * aligned16(c * f)));
  }
  return units;
}

std::size_t Model2D::parameter_floats(const ModelSpec& s, int q, std::size_t unit_multiple,
                                      StageRange stage) {
  std::size_t n = 0;
  for (std::size_t u : unit_floats(s, q, unit_multiple, stage)) n += u;
  return n;
}

std::size_t Model2D::activation_floats(const ModelSpec& s, int batch, int seq_len, int q,
                                       StageRange stage) {
  const std::size_t R = std::size_t(batch) * seq_len / q, c = s.hidden / q;
  const std::size_t vb = (s.vocab + q - 1) / q;
  const GridBlockFloats block = grid_block_floats(s, TensorMode::d2, batch, seq_len, q);
  return sharded::stage_blocks(s, stage) * std::size_t(block.set) +
         std::size_t(sharded::head_act_floats(int64_t(R), int64_t(c), int64_t(R * vb), stage.head));
}

Model2D::Communication Model2D::step_communication(const ModelSpec& s, int batch, int seq_len,
                                                   int q, StageRange stage) {
  const double BT = double(batch) * seq_len, R = BT / q, C = s.hidden, F = s.ffn_hidden;
  const double Vp = double((s.vocab + q - 1) / q) * q;
  Communication m;
  auto linear = [&](double in, double out) {
    m.row_broadcast += BT * in / q;         // forward: A blocks along the row
    m.col_broadcast += in * out / q;        // forward: W blocks down the column
    m.col_all_gather += in * out / q;       // input gradient: W's column of blocks
    m.row_reduce_scatter += BT * in / q;    // input gradient: q partial blocks
    m.row_all_gather += BT * in / q;        // weight gradient: the input's row of blocks
    m.col_reduce_scatter += in * out / q;   // weight gradient: q partial blocks
  };
  const int blocks = sharded::stage_blocks(s, stage);
  for (int l = 0; l < blocks; ++l) {
    linear(C, 3 * C);
    linear(C, C);
    linear(C, F);
    linear(F, C);
  }
  const double layernorms = 2.0 * blocks + (stage.head ? 1 : 0);
  m.row_all_reduce += layernorms * (2 * R + 2 * R);  // forward + backward
  if (stage.head) {
    m.row_all_reduce += 3 * R;  // cross-entropy
    // Tied head: forward A B^T, backward A B and A^T B.
    m.col_all_gather += Vp * C / q;
    m.row_reduce_scatter += BT * Vp / q;
    m.row_broadcast += BT * Vp / q;
    m.col_broadcast += Vp * C / q;
    m.row_all_gather += BT * Vp / q;
    m.col_reduce_scatter += Vp * C / q;
    m.col_all_reduce += 1;  // loss
  }
  if (stage.embeds) {  // embedding
    m.col_reduce_scatter += BT * C / q;
    m.col_all_gather += BT * C / q;
  }
  return m;
}

// Element by element (set-up only), merged into runs.
void Model2D::map_runs() {
  const std::vector<ParamSpec> logical = parameter_table(spec_);
  std::map<std::string, int> index;
  for (std::size_t t = 0; t < logical.size(); ++t) index[logical[t].name] = int(t);
  auto tensor = [&](const std::string& name) { return index.at(name); };
  auto emit = [this](std::size_t local, int t, std::size_t at) {
    sharded::append_element(runs_, local, t, at);
  };
  const bool gpt2 = spec_.arch == Arch::gpt2;
  const int64_t C = spec_.hidden, F = spec_.ffn_hidden, c = c_, f = f_;
  // A [rows x cols] table (embedding) whose row block i and column block j are held here.
  auto table_block = [&](std::size_t off, int t, int64_t block_rows, int64_t logical_rows) {
    for (int64_t r = 0; r < block_rows; ++r) {
      const int64_t row = i_ * block_rows + r;
      if (row >= logical_rows) break;  // padding rows: no logical element
      for (int64_t s = 0; s < c; ++s) emit(off + r * c + s, t, row * C + j_ * c + s);
    }
  };
  // Column block j of a vector of length n_local * q.
  auto vector_block = [&](std::size_t off, int t, int64_t n_local) {
    for (int64_t s = 0; s < n_local; ++s) emit(off + s, t, j_ * n_local + s);
  };
  // An [in x out] weight block (i, j); `locate(in, out)` gives the logical tensor and element.
  auto matrix_block = [&](std::size_t off, int64_t in_local, int64_t out_local, auto locate) {
    for (int64_t r = 0; r < in_local; ++r) {
      for (int64_t s = 0; s < out_local; ++s) {
        const auto [t, at] = locate(i_ * in_local + r, s);
        emit(off + r * out_local + s, t, at);
      }
    }
  };
  const bool embeds = stage().embeds, head = stage().head;
  if (embeds || head) {
    table_block(wte_,
                tensor(gpt2 ? "transformer.wte.weight" : "model.decoder.embed_tokens.weight"),
                vocab_block_, spec_.vocab);
  }
  if (embeds) {
    table_block(wpe_,
                tensor(gpt2 ? "transformer.wpe.weight" : "model.decoder.embed_positions.weight"),
                position_block_, spec_.position_rows());
  }
  auto prefix = [&](int l) {
    return (gpt2 ? "transformer.h." : "model.decoder.layers.") + std::to_string(first_block() + l) +
           ".";
  };
  for (int l = 0; l < blocks(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = prefix(l);
    // q|k|v: local column s is part s / c (q, k, v), logical column j c + s % c of that part.
    const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
    matrix_block(b.qkv.w, c, 3 * c, [&](int64_t in, int64_t s) {
      const int64_t part = s / c, out = j_ * c + s % c;
      if (gpt2) {
        return std::pair{tensor(h + "attn.c_attn.weight"),
                         std::size_t(in * 3 * C + part * C + out)};
      }
      return std::pair{tensor(h + "self_attn." + parts[part] + ".weight"),
                       std::size_t(out * C + in)};
    });
    // The other linears: local column s is logical column j out_local + s.
    auto linear = [&](const Linear& lin, int64_t in_local, int64_t out_local,
                      const std::string& name, bool out_in) {
      const int t = tensor(name);
      matrix_block(lin.w, in_local, out_local, [&](int64_t in, int64_t s) {
        const int64_t out = j_ * out_local + s;
        return std::pair{t, std::size_t(out_in ? out * lin.in + in : in * lin.out + out)};
      });
    };
    if (gpt2) {
      linear(b.proj, c, c, h + "attn.c_proj.weight", false);
      linear(b.fc, c, f, h + "mlp.c_fc.weight", false);
      linear(b.fc2, f, c, h + "mlp.c_proj.weight", false);
    } else {
      linear(b.proj, c, c, h + "self_attn.out_proj.weight", true);
      linear(b.fc, c, f, h + "fc1.weight", true);
      linear(b.fc2, f, c, h + "fc2.weight", true);
    }
  }
  for (int l = 0; l < blocks(); ++l) {
    const Block& b = blocks_[l];
    const std::string h = prefix(l);
    vector_block(b.ln1_w, tensor(h + (gpt2 ? "ln_1.weight" : "self_attn_layer_norm.weight")), c);
    vector_block(b.ln1_b, tensor(h + (gpt2 ? "ln_1.bias" : "self_attn_layer_norm.bias")), c);
    if (gpt2) {
      for (int64_t s = 0; s < 3 * c; ++s) {
        emit(b.qkv.b + s, tensor(h + "attn.c_attn.bias"), (s / c) * C + j_ * c + s % c);
      }
    } else {
      const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
      for (int part = 0; part < 3; ++part) {
        vector_block(b.qkv.b + part * c, tensor(h + "self_attn." + parts[part] + ".bias"), c);
      }
    }
    vector_block(b.proj.b, tensor(h + (gpt2 ? "attn.c_proj.bias" : "self_attn.out_proj.bias")), c);
    vector_block(b.ln2_w, tensor(h + (gpt2 ? "ln_2.weight" : "final_layer_norm.weight")), c);
    vector_block(b.ln2_b, tensor(h + (gpt2 ? "ln_2.bias" : "final_layer_norm.bias")), c);
    vector_block(b.fc.b, tensor(h + (gpt2 ? "mlp.c_fc.bias" : "fc1.bias")), f);
    vector_block(b.fc2.b, tensor(h + (gpt2 ? "mlp.c_proj.bias" : "fc2.bias")), c);
  }
  if (head) {
    vector_block(
        lnf_w_, tensor(gpt2 ? "transformer.ln_f.weight" : "model.decoder.final_layer_norm.weight"),
        c);
    vector_block(lnf_b_,
                 tensor(gpt2 ? "transformer.ln_f.bias" : "model.decoder.final_layer_norm.bias"),
                 c);
  }
  (void)F;
}

void Model2D::init_parameters(uint64_t seed) {
  sharded::init_from_runs(params(), params_end(), runs_, spec_, seed);
}

Model2D::EmbeddingRows Model2D::embedding_rows() const {
  return {i_ * vocab_block_, vocab_block_, i_ * position_block_, position_block_,
          int64_t(spec_.position_offset())};
}

void Model2D::linear_forward(const Linear& lin, const float* in, float* out) {
  const int64_t BT = int64_t(batch_) * seq_len_;
  summa_ab(gemm_, grid_, in, params() + lin.w, out, BT, lin.out, lin.in, s_.work);
  sharded::add_bias_rows(out, params() + lin.b, rows_, lin.out / q_);
}

// din = dout W^T (assigned); dW += in^T dout; db += column sums of dout.
void Model2D::linear_backward(const Linear& lin, const float* in, const float* dout, float* din) {
  const int64_t BT = int64_t(batch_) * seq_len_, out_local = lin.out / q_;
  k::bias_backward(grad(lin.b), dout, rows_, int(out_local), int(out_local));
  summa_abt(gemm_, grid_, dout, params() + lin.w, din, BT, lin.in, lin.out, s_.work);
  summa_atb(gemm_, grid_, in, dout, s_.dweight, lin.in, lin.out, BT, s_.work);
  k::add(grad(lin.w), s_.dweight, lin.in / q_ * out_local);
}

void Model2D::activation_forward(float* out, const float* in, int64_t n) {
  if (spec_.arch == Arch::gpt2) {
    k::gelu_forward(out, in, n);
  } else {
    k::relu_forward(out, in, n);
  }
}

void Model2D::activation_backward(float* din, const float* in, const float* dout, int64_t n) {
  if (spec_.arch == Arch::gpt2) {
    k::gelu_backward(din, in, dout, n);
  } else {
    k::relu_backward(din, in, dout, n);
  }
}

// Block l's forward: its activations (kept, or the recompute arena's) from its input x; the
// output goes to the next block's input (the final layernorm's after the last block).
void Model2D::block_forward(int l) {
  const int q = q_, T = seq_len_;
  const int64_t BT = int64_t(batch_) * T, R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  const float eps = spec_.layernorm_eps();
  const int L = blocks(), Bl = batch_ / q, Hl = spec_.heads / q;
  sharded::LayerActs& A = layer_acts_[l];
  const Block& b = blocks_[l];
  float* next = l + 1 < L ? layer_acts_[l + 1].x : head_.x_final;
  layernorm2d_forward(grid_, A.ln1, A.ln1_mean, A.ln1_rstd, A.x, P + b.ln1_w, P + b.ln1_b, BT,
                      C, eps, s_.ln_work);
  linear_forward(b.qkv, A.ln1, A.qkv);
  attention_core_forward(gemm_, A, s_.datt, Bl, T, int(c), Hl);
  linear_forward(b.proj, A.atty, A.xmid);
  k::add(A.xmid, A.x, R * c);
  layernorm2d_forward(grid_, A.ln2, A.ln2_mean, A.ln2_rstd, A.xmid, P + b.ln2_w, P + b.ln2_b, BT,
                      C, eps, s_.ln_work);
  linear_forward(b.fc, A.ln2, A.h);
  activation_forward(A.a, A.h, R * f_);
  linear_forward(b.fc2, A.a, next);
  k::add(next, A.xmid, R * c);
}

double Model2D::forward(const int32_t* tokens, const int32_t* targets, int batch,
                        float grad_scale, int slot) {
  take_parameters_unchanged();  // nothing to keep across calls: see GridModel::held_floats
  check_micro_batch(batch, slot);
  use_slot(slot);
  const int q = q_, T = seq_len_;
  const int64_t BT = int64_t(batch_) * T, R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  const float eps = spec_.layernorm_eps();
  // Embedding (the first stage; later ones find their input in stage_input(slot)): every token
  // row's part from this rank's vocabulary and position rows (block i), columns j; the
  // reduce-scatter down the column sums the parts and leaves row block i here.
  if (stage().embeds) {
    float* part = s_.embed;
    const float* wte = P + wte_;
    const float* wpe = P + wpe_;
    const EmbeddingRows r = embedding_rows();
    grid_embedding_forward(part, tokens, wte, c, 1, wpe, BT, T, c, r.v0, r.vb, r.offset, r.p0,
                           r.pb);
    fence_kernels();
    grid_.col.reduce_scatter(part, std::size_t(BT * c), layer_acts_[0].x);
  }
  for (int l = 0; l < blocks(); ++l) block_forward(l);
  if (!stage().head) {
    fence_kernels();  // the output goes to the next stage
    return 0.0;
  }
  layernorm2d_forward(grid_, head_.lnf, head_.lnf_mean, head_.lnf_rstd, head_.x_final, P + lnf_w_,
                      P + lnf_b_, BT, C, eps, s_.ln_work);
  // Logits block (i, j): this rank's rows against vocabulary block j (tied LM head).
  const int64_t Vp = vocab_block_ * q;
  summa_abt(gemm_, grid_, head_.lnf, P + wte_, head_.logits, BT, Vp, C, s_.work);
  const int64_t v0 = j_ * vocab_block_;
  const int valid = int(std::clamp<int64_t>(spec_.vocab - v0, 0, vocab_block_));
  vocab_parallel_cross_entropy(grid_.row, head_.logits, head_.losses, targets + i_ * R, R,
                               int(vocab_block_), valid, v0, grad_scale, s_.ln_work);
  // Every rank of grid row i has the same losses of row block i: sum the row blocks down the
  // column (and the layers over the depth).
  float total = float(k::sum(head_.losses, R));
  grid_.col.all_reduce_sum(&total, 1);
  const int layers = depth_ != nullptr ? depth_->size() : 1;
  if (depth_ != nullptr) depth_->all_reduce_sum(&total, 1);
  return double(total) / (double(BT) * layers);
}

void Model2D::backward(const int32_t* tokens, int batch, int slot) {
  check_micro_batch(batch, slot);
  use_slot(slot);
  const int q = q_, T = seq_len_;
  const int64_t BT = int64_t(batch_) * T, R = rows_, c = c_, C = spec_.hidden;
  const float* P = params();
  open_gradients(0);
  if (stage().head) {
    const int64_t Vp = vocab_block_ * q;
    // LM head: the logits hold their gradient.
    summa_ab(gemm_, grid_, head_.logits, P + wte_, s_.dln, BT, C, Vp, s_.work);
    summa_atb(gemm_, grid_, head_.logits, head_.lnf, s_.dweight, Vp, C, BT, s_.work);
    k::add(grad(wte_), s_.dweight, vocab_block_ * c);
    k::fill(s_.dx, R * c, 0.0f);
    layernorm2d_backward(grid_, s_.dx, grad(lnf_w_), grad(lnf_b_), s_.dln, head_.x_final,
                         P + lnf_w_, head_.lnf_mean, head_.lnf_rstd, BT, C, s_.ln_work);
  }  // else the next stage's gradient of this stage's output is in s_.dx (output_gradient())
  const int Bl = batch_ / q, Hl = spec_.heads / q;
  for (int l = blocks() - 1; l >= 0; --l) {
    // A recomputed segment's forward again, from its kept input, before its last block's
    // backward (the same operations in the same order: the same bits; the rewritten output is
    // the next block's input as forward left it).
    if (recompute_plan_.segment_end(l)) {
      for (int m = recompute_plan_.start[std::size_t(l)]; m <= l; ++m) block_forward(m);
    }
    sharded::LayerActs& A = layer_acts_[l];
    const Block& b = blocks_[l];
    open_gradients(1 + l);
    // dx holds the gradient of the block's output; the residual passes it to xmid unchanged.
    linear_backward(b.fc2, A.a, s_.dx, s_.dh);
    activation_backward(s_.dh, A.h, s_.dh, R * f_);
    linear_backward(b.fc, A.ln2, s_.dh, s_.dln);
    layernorm2d_backward(grid_, s_.dx, grad(b.ln2_w), grad(b.ln2_b), s_.dln, A.xmid, P + b.ln2_w,
                         A.ln2_mean, A.ln2_rstd, BT, C, s_.ln_work);
    linear_backward(b.proj, A.atty, s_.dx, s_.datty);
    if (recompute_plan_.rebuilds_probabilities(l)) {
      // selective: the probabilities again from the kept q|k|v (atty rewritten with its bits).
      attention_core_forward(gemm_, A, s_.datt, Bl, T, int(c), Hl);
    }
    attention_core_backward(gemm_, s_.dqkv, s_.datt, s_.datty, A, Bl, T, int(c), Hl);
    linear_backward(b.qkv, A.ln1, s_.dqkv, s_.dln);
    layernorm2d_backward(grid_, s_.dx, grad(b.ln1_w), grad(b.ln1_b), s_.dln, A.x, P + b.ln1_w,
                         A.ln1_mean, A.ln1_rstd, BT, C, s_.ln_work);
    close_gradients(1 + l);
  }
  fence_kernels();
  if (!stage().embeds) {  // s_.dx: the gradient of the stage's input, for the previous stage
    close_gradients(0);
    return;
  }
  // Embedding: every token row's gradient (columns j), gathered down the column, added into this
  // rank's vocabulary and position rows; one work item per column, so no two write one element.
  grid_.col.all_gather(s_.dx, std::size_t(R * c), s_.embed);
  const float* d = s_.embed;
  float* dwte = grad(wte_);
  float* dwpe = grad(wpe_);
  const EmbeddingRows r = embedding_rows();
  grid_embedding_backward(dwte, c, 1, dwpe, d, tokens, BT, batch_, T, c, r.v0, r.vb, r.offset,
                          r.p0, r.pb);
  close_gradients(0);
}

int Model2D::batch_replicas() const { return depth_ != nullptr ? depth_->size() : 1; }
int Model2D::batch_replica() const { return depth_ != nullptr ? depth_->rank() : 0; }

void Model2D::reduce_gradients() {
  fence_kernels();
  if (depth_ != nullptr) {
    for (const auto& [p, n] : gradient_pieces(0, params_end())) depth_->all_reduce_sum(p, n);
  }
  for (const auto& [p, n] : gradient_pieces(replicated_begin_, replicated_end_)) {
    grid_.col.all_reduce_sum(p, n);
  }
}

bool Model2D::owns(std::size_t local) const {
  // Depth layer 0 writes (the layers hold equal copies); replicated parameters grid row 0.
  if (depth_ != nullptr && depth_->rank() != 0) return false;
  // The last stage's copy of the tied token embedding: the first stage writes it.
  if (!stage().embeds && local < replicated_begin_) return false;
  return local < replicated_begin_ || local >= replicated_end_ || i_ == 0;
}

std::vector<std::pair<std::size_t, std::size_t>> Model2D::grid_ranges() const {
  // The embeddings and the weight blocks everywhere; the replicated vectors on grid row 0. The
  // last stage's tied token embedding is counted on the first stage.
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  if (stage().embeds) ranges.emplace_back(0, replicated_begin_);
  ranges.emplace_back(replicated_end_, params_end());
  if (i_ == 0) ranges.emplace_back(replicated_begin_, replicated_end_);
  return ranges;
}

std::vector<std::pair<std::size_t, std::size_t>> Model2D::norm_ranges() const {
  // One grid counts (2.5D: depth layer 0's).
  if (depth_ != nullptr && depth_->rank() != 0) return {};
  return grid_ranges();
}

double Model2D::gradient_sum_squares() const {
  // Every element once over this rank's grid (whatever its depth layer).
  double s = 0.0;
  for (const auto& [begin, end] : grid_ranges()) s += sum_of_squares(grads() + begin, end - begin);
  return s;
}

}  // namespace colossal::core
