#include "core/model.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/kernels.hpp"
#include "core/layers.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"

namespace colossal::core {

namespace k = kernels;

Model::Model(const ModelSpec& spec, int max_batch, int seq_len, MemoryTracker& tracker, Gemm& gemm,
             std::size_t unit_multiple, ParameterStore* store)
    : spec_(spec), max_batch_(max_batch), seq_len_(seq_len), gemm_(gemm) {
  if (spec.hidden % spec.heads != 0) {
    throw std::invalid_argument("model.hidden (" + std::to_string(spec.hidden) +
                                ") must be divisible by model.heads (" +
                                std::to_string(spec.heads) + ")");
  }
  if (seq_len > spec.max_seq) {
    throw std::invalid_argument("sequence length " + std::to_string(seq_len) +
                                " exceeds model.max_seq " + std::to_string(spec.max_seq));
  }
  table_ = parameter_table(spec, unit_multiple);
  for (const auto& p : table_) num_parameters_ += p.count;
  std::vector<ParamUnit> units = parameter_units(table_, unit_multiple);
  const std::size_t flat = units.back().end;
  if (store == nullptr) {
    own_store_ = std::make_unique<FullParameterStore>(units, flat, tracker);
    store = own_store_.get();
  } else if (store->flat_size() != flat || store->units().size() != units.size()) {
    throw std::invalid_argument("parameter store does not match the model's parameter units");
  }
  store_ = store;
  // Offsets relative to the first element of the tensor's unit.
  auto off = [&](const std::string& name) {
    const ParamSpec& p = parameter(name);
    return p.offset - units[p.unit].begin;
  };
  const bool gpt2 = spec.arch == Arch::gpt2;
  wte_ = off(gpt2 ? "transformer.wte.weight" : "model.decoder.embed_tokens.weight");
  wpe_ = off(gpt2 ? "transformer.wpe.weight" : "model.decoder.embed_positions.weight");
  lnf_w_ = off(gpt2 ? "transformer.ln_f.weight" : "model.decoder.final_layer_norm.weight");
  lnf_b_ = off(gpt2 ? "transformer.ln_f.bias" : "model.decoder.final_layer_norm.bias");
  for (int l = 0; l < spec.layers; ++l) {
    BlockParams b{};
    if (gpt2) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      b.ln1_w = off(h + "ln_1.weight");
      b.ln1_b = off(h + "ln_1.bias");
      b.qkv_parts = 1;
      b.qkv_w[0] = off(h + "attn.c_attn.weight");
      b.qkv_b[0] = off(h + "attn.c_attn.bias");
      b.attn_out_w = off(h + "attn.c_proj.weight");
      b.attn_out_b = off(h + "attn.c_proj.bias");
      b.ln2_w = off(h + "ln_2.weight");
      b.ln2_b = off(h + "ln_2.bias");
      b.fc_w = off(h + "mlp.c_fc.weight");
      b.fc_b = off(h + "mlp.c_fc.bias");
      b.fc_out_w = off(h + "mlp.c_proj.weight");
      b.fc_out_b = off(h + "mlp.c_proj.bias");
    } else {
      const std::string h = "model.decoder.layers." + std::to_string(l) + ".";
      b.ln1_w = off(h + "self_attn_layer_norm.weight");
      b.ln1_b = off(h + "self_attn_layer_norm.bias");
      b.qkv_parts = 3;
      const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
      for (int p = 0; p < 3; ++p) {
        b.qkv_w[p] = off(h + "self_attn." + parts[p] + ".weight");
        b.qkv_b[p] = off(h + "self_attn." + parts[p] + ".bias");
      }
      b.attn_out_w = off(h + "self_attn.out_proj.weight");
      b.attn_out_b = off(h + "self_attn.out_proj.bias");
      b.ln2_w = off(h + "final_layer_norm.weight");
      b.ln2_b = off(h + "final_layer_norm.bias");
      b.fc_w = off(h + "fc1.weight");
      b.fc_b = off(h + "fc1.bias");
      b.fc_out_w = off(h + "fc2.weight");
      b.fc_out_b = off(h + "fc2.bias");
    }
    blocks_.push_back(b);
  }

  // Saved activations: one arena carved in a fixed order.
  const std::size_t B = max_batch, T = seq_len, C = spec.hidden, F = spec.ffn_hidden,
                    H = spec.heads, L = spec.layers;
  const std::size_t BT = B * T, BTC = BT * C;
  // ln1, atty, mid, ln2 (4 BTC) + qkv (3 BTC) + two means and rstds + probabilities + fch
  const std::size_t att_floats = spec.fused_attention ? B * H * T : B * H * T * T;
  const std::size_t per_block = 7 * BTC + 4 * BT + att_floats + BT * F;
  acts_ = DeviceArray<float>(tracker, MemCategory::activations,
                             BTC * (L + 1) + L * per_block + BTC + 3 * BT);
  float* cursor = acts_.data();
  auto carve = [&cursor](std::size_t n) {
    float* p = cursor;
    cursor += n;
    return p;
  };
  for (std::size_t l = 0; l <= L; ++l) residual_.push_back(carve(BTC));
  for (std::size_t l = 0; l < L; ++l) {
    BlockActs a{};
    a.ln1 = carve(BTC);
    a.ln1_mean = carve(BT);
    a.ln1_rstd = carve(BT);
    a.qkv = carve(3 * BTC);
    a.att = carve(att_floats);
    a.atty = carve(BTC);
    a.mid = carve(BTC);
    a.ln2 = carve(BTC);
    a.ln2_mean = carve(BT);
    a.ln2_rstd = carve(BT);
    a.fch = carve(BT * F);
    block_acts_.push_back(a);
  }
  lnf_ = carve(BTC);
  lnf_mean_ = carve(BT);
  lnf_rstd_ = carve(BT);
  losses_ = carve(BT);

  // Temporaries shared by every block: the MLP activation output (recomputed in backward rather
  // than saved), gradient buffers, and one batch-row of attention-score gradients.
  const std::size_t datt_floats = spec.fused_attention ? 0 : H * T * T;
  scratch_ = DeviceArray<float>(tracker, MemCategory::temporaries,
                                BTC * 2 + BT * F * 2 + 3 * BTC + datt_floats);
  cursor = scratch_.data();
  dresidual_ = carve(BTC);
  dbuf_c_ = carve(BTC);
  dbuf_f_ = carve(BT * F);
  act_buf_ = carve(BT * F);
  dqkv_ = carve(3 * BTC);
  datt_ = carve(datt_floats);

  logits_ = DeviceArray<float>(tracker, MemCategory::activations, BT * spec.vocab);
}

const ParamSpec& Model::parameter(const std::string& name) const {
  for (const auto& p : table_) {
    if (p.name == name) return p;
  }
  throw std::out_of_range("no parameter named '" + name + "'");
}

std::size_t Model::activation_bytes() const { return acts_.bytes() + logits_.bytes(); }
std::size_t Model::temporary_bytes() const { return scratch_.bytes(); }

void Model::set_gradients_ready_hook(std::function<void(std::size_t offset)> hook) {
  if (!own_store_) {
    throw std::logic_error("set_gradients_ready_hook needs the model's own parameter store");
  }
  own_store_->set_gradients_ready_hook(std::move(hook));
}

void Model::init_parameters(uint64_t seed) {
  const auto& units = store_->units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    float* unit = store_->begin_write(int(u));
    k::fill(unit, int64_t(units[u].size()), 0.0f);  // padding too
    for (const auto& p : table_) {
      if (p.unit != int(u)) continue;
      float* dst = unit + (p.offset - units[u].begin);
      switch (p.role) {
        case ParamRole::layernorm_weight: k::fill(dst, p.count, 1.0f); break;
        case ParamRole::layernorm_bias:
        case ParamRole::bias: break;
        default: fill_normal(dst, p.count, p.init_std(spec_.layers), seed, hash_name(p.name)); break;
      }
    }
    Kokkos::fence();
    store_->commit(int(u));
  }
}

void Model::zero_grad() { store_->zero_gradients(); }

void Model::activation_forward(float* out, const float* inp, int64_t n) {
  Profiler::Scope scope(profiler_, WorkKind::activation);
  if (spec_.arch == Arch::gpt2) {
    k::gelu_forward(out, inp, n);
  } else {
    k::relu_forward(out, inp, n);
  }
}

void Model::activation_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  Profiler::Scope scope(profiler_, WorkKind::activation);
  if (spec_.arch == Arch::gpt2) {
    k::gelu_backward(dinp, inp, dout, n);
  } else {
    k::relu_backward(dinp, inp, dout, n);
  }
}

Model::Linear Model::qkv_part(const BlockParams& bp, int part) const {
  const int C = spec_.hidden;
  return Linear{bp.qkv_w[part], bp.qkv_b[part], C, bp.qkv_parts == 1 ? 3 * C : C};
}

void Model::linear_forward(const float* P, float* out, int ld_out, const float* inp, int ld_in,
                           const Linear& lin, int64_t N) {
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  core::linear_forward(gemm_, layout(), out, ld_out, inp, ld_in, P + lin.w, lin.in, lin.out, N);
}

void Model::linear_backward(const float* P, float* G, float* dinp, int ld_dinp, const float* dout,
                            int ld_dout, const float* inp, int ld_in, const Linear& lin, int64_t N,
                            bool accumulate) {
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  core::linear_backward(gemm_, layout(), dinp, ld_dinp, G + lin.w, G + lin.b, dout, ld_dout, inp,
                        ld_in, P + lin.w, lin.in, lin.out, N, accumulate);
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int B, float grad_scale) {
  if (B < 1 || B > max_batch_) {
    throw std::invalid_argument("batch " + std::to_string(B) + " outside [1, " +
                                std::to_string(max_batch_) + "]");
  }
  const int T = seq_len_, C = spec_.hidden, F = spec_.ffn_hidden, V = spec_.vocab;
  const int64_t N = int64_t(B) * T;
  const float eps = spec_.layernorm_eps();
  // The embeddings (unit 0) stay gathered until the tied LM head; blocks one at a time.
  const float* E = store_->gather(0);

  timed(WorkKind::embedding, [&] {
    k::embedding_forward(residual_[0], tokens, E + wte_, E + wpe_, B, T, C,
                         spec_.position_offset());
  });
  for (int l = 0; l < spec_.layers; ++l) {
    const BlockParams& bp = blocks_[l];
    BlockActs& a = block_acts_[l];
    const float* P = store_->gather(1 + l);
    timed(WorkKind::layernorm, [&] {
      k::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual_[l], P + bp.ln1_w,
                           P + bp.ln1_b, N, C, eps);
    });
    for (int part = 0; part < bp.qkv_parts; ++part) {
      const Linear lin = qkv_part(bp, part);
      float* out = a.qkv + part * C;
      timed(WorkKind::gemm, [&] { k::broadcast_rows(out, P + lin.b, N, lin.out, 3 * C); });
      linear_forward(P, out, 3 * C, a.ln1, C, lin, N);
    }
    timed(WorkKind::attention, [&] {
      if (spec_.fused_attention) {
        fused_attention_forward(a.att, a.atty, a.qkv, B, T, C, spec_.heads);
      } else {
        attention_forward(gemm_, a.att, a.atty, a.qkv, B, T, C, spec_.heads);
      }
    });
    timed(WorkKind::gemm,
          [&] { k::residual_plus_bias(a.mid, residual_[l], P + bp.attn_out_b, N, C); });
    linear_forward(P, a.mid, C, a.atty, C, Linear{bp.attn_out_w, bp.attn_out_b, C, C}, N);

    timed(WorkKind::layernorm, [&] {
      k::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, P + bp.ln2_w, P + bp.ln2_b, N,
                           C, eps);
    });
    timed(WorkKind::gemm, [&] { k::broadcast_rows(a.fch, P + bp.fc_b, N, F, F); });
    linear_forward(P, a.fch, F, a.ln2, C, Linear{bp.fc_w, bp.fc_b, C, F}, N);
    activation_forward(act_buf_, a.fch, N * F);
    timed(WorkKind::gemm,
          [&] { k::residual_plus_bias(residual_[l + 1], a.mid, P + bp.fc_out_b, N, C); });
    linear_forward(P, residual_[l + 1], C, act_buf_, F,
                   Linear{bp.fc_out_w, bp.fc_out_b, F, C}, N);
    store_->release(1 + l);
  }
  const float* Pf = store_->gather(final_unit());
  timed(WorkKind::layernorm, [&] {
    k::layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, residual_[spec_.layers], Pf + lnf_w_,
                         Pf + lnf_b_, N, C, eps);
  });
  store_->release(final_unit());
  // Tied LM head: logits = lnf x wte^T.
  timed(WorkKind::gemm, [&] {
    gemm_.gemm(Trans::N, Trans::T, N, V, C, 1.0f, lnf_, C, E + wte_, C, 0.0f, logits_.data(), V);
  });
  store_->release(0);
  Profiler::Scope loss_scope(profiler_, WorkKind::loss);
  k::cross_entropy_forward_backward(logits_.data(), losses_, targets, N, V, grad_scale);
  return k::sum(losses_, N) / static_cast<double>(N);
}

void Model::backward(const int32_t* tokens, int B) {
  const int T = seq_len_, C = spec_.hidden, F = spec_.ffn_hidden, V = spec_.vocab;
  const int64_t N = int64_t(B) * T;
  const float* dlogits = logits_.data();

  // LM head: dlnf = dlogits x wte, dwte += dlogits^T x lnf. The embedding gradients stay open
  // until the embedding backward at the end.
  const float* E = store_->gather(0);
  float* GE = store_->gradients(0);
  timed(WorkKind::gemm, [&] {
    gemm_.gemm(Trans::N, Trans::N, N, C, V, 1.0f, dlogits, V, E + wte_, C, 0.0f, dbuf_c_, C);
    gemm_.gemm(Trans::T, Trans::N, V, C, N, 1.0f, dlogits, V, lnf_, C, 1.0f, GE + wte_, C);
  });
  store_->release(0);
  {
    const float* Pf = store_->gather(final_unit());
    float* Gf = store_->gradients(final_unit());
    timed(WorkKind::layernorm, [&] {
      k::fill(dresidual_, N * C, 0.0f);
      k::layernorm_backward(dresidual_, Gf + lnf_w_, Gf + lnf_b_, dbuf_c_,
                            residual_[spec_.layers], Pf + lnf_w_, lnf_mean_, lnf_rstd_, N, C);
    });
    store_->release(final_unit());
    store_->gradients_done(final_unit());
  }

  for (int l = spec_.layers - 1; l >= 0; --l) {
    const BlockParams& bp = blocks_[l];
    const BlockActs& a = block_acts_[l];
    const float* P = store_->gather(1 + l);
    float* G = store_->gradients(1 + l);
    // MLP: the activation output was not saved; recompute it for the second linear's dW.
    activation_forward(act_buf_, a.fch, N * F);
    linear_backward(P, G, dbuf_f_, F, dresidual_, C, act_buf_, F,
                    Linear{bp.fc_out_w, bp.fc_out_b, F, C}, N, false);
    activation_backward(dbuf_f_, a.fch, dbuf_f_, N * F);
    linear_backward(P, G, dbuf_c_, C, dbuf_f_, F, a.ln2, C, Linear{bp.fc_w, bp.fc_b, C, F}, N,
                    false);
    timed(WorkKind::layernorm, [&] {
      k::layernorm_backward(dresidual_, G + bp.ln2_w, G + bp.ln2_b, dbuf_c_, a.mid, P + bp.ln2_w,
                            a.ln2_mean, a.ln2_rstd, N, C);
    });
    // Attention.
    linear_backward(P, G, dbuf_c_, C, dresidual_, C, a.atty, C,
                    Linear{bp.attn_out_w, bp.attn_out_b, C, C}, N, false);
    timed(WorkKind::attention, [&] {
      if (spec_.fused_attention) {
        fused_attention_backward(dqkv_, dbuf_c_, a.atty, a.qkv, a.att, B, T, C, spec_.heads);
      } else {
        attention_backward(gemm_, dqkv_, datt_, dbuf_c_, a.qkv, a.att, B, T, C, spec_.heads);
      }
    });
    for (int part = 0; part < bp.qkv_parts; ++part) {
      const Linear lin = qkv_part(bp, part);
      linear_backward(P, G, dbuf_c_, C, dqkv_ + part * C, 3 * C, a.ln1, C, lin, N, part > 0);
    }
    timed(WorkKind::layernorm, [&] {
      k::layernorm_backward(dresidual_, G + bp.ln1_w, G + bp.ln1_b, dbuf_c_, residual_[l],
                            P + bp.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
    });
    store_->release(1 + l);
    Kokkos::fence();
    store_->gradients_done(1 + l);
  }
  timed(WorkKind::embedding, [&] {
    k::embedding_backward(GE + wte_, GE + wpe_, dresidual_, tokens, B, T, C,
                          spec_.position_offset());
  });
  Kokkos::fence();
  store_->gradients_done(0);
}

}  // namespace colossal::core
