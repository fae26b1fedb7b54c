#include "core/model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/decode_kernels.hpp"
#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"
#include "core/layers.hpp"
#include "core/llama_kernels.hpp"
#include "core/optimizer.hpp"
#include "core/rng.hpp"
#include "core/tensor2d.hpp"

namespace colossal::core {

namespace k = kernels;

Model::Model(const ModelSpec& spec, int max_batch, int seq_len, MemoryTracker& tracker, Gemm& gemm,
             const ModelOptions& options)
    : spec_(spec), max_batch_(max_batch), seq_len_(seq_len), gemm_(gemm), tp_(options.tensor),
      ring_(options.sequence) {
  const std::size_t unit_multiple = options.unit_multiple;
  ParameterStore* store = options.store;
  const bool sequence_split = options.sequence_split;
  stage_ = options.stage;
  layer_begin_ = stage_.layer_begin;
  layer_end_ = stage_.layer_end < 0 ? spec.layers : stage_.layer_end;
  if (options.slots < 1) throw std::invalid_argument("a model needs at least one activation slot");
  if (tp_ != nullptr && tp_->size() == 1) tp_ = nullptr;
  if (ring_ != nullptr && ring_->size() == 1) ring_ = nullptr;
  if (ring_ != nullptr && spec.fused_attention) {
    throw std::invalid_argument(
        "model.fused_attention is not available with parallel.sequence > 1 (ring self-attention "
        "keeps its rows of the probabilities); set model.fused_attention: false");
  }
  const int ring_size = ring_ ? ring_->size() : 1;
  position_begin_ = ring_ ? ring_->rank() * seq_len : 0;
  sequence_split_ = sequence_split && tp_ != nullptr;
  if (sequence_split_ && seq_len % tp_->size() != 0) {
    throw std::invalid_argument("sequence_split: train.seq_len " + std::to_string(seq_len) +
                                " is not divisible by the tensor size " +
                                std::to_string(tp_->size()));
  }
  const TensorSplit split{tp_ ? tp_->size() : 1, tp_ ? tp_->rank() : 0};
  if (spec.hidden % spec.heads != 0) {
    throw std::invalid_argument("model.hidden (" + std::to_string(spec.hidden) +
                                ") must be divisible by model.heads (" +
                                std::to_string(spec.heads) + ")");
  }
  if (int64_t(seq_len) * ring_size > spec.max_seq) {
    throw std::invalid_argument("sequence length " + std::to_string(seq_len * ring_size) +
                                " exceeds model.max_seq " + std::to_string(spec.max_seq));
  }
  table_ = parameter_table(spec, unit_multiple, split, stage_);
  num_parameters_ = parameter_count(spec);
  // This rank's share of heads, MLP width and (padded) vocabulary rows.
  local_hidden_ = spec.hidden / split.size;
  local_heads_ = spec.heads / split.size;
  local_ffn_ = spec.ffn_hidden / split.size;
  local_kv_heads_ = spec.key_value_heads() / split.size;
  local_vocab_ = padded_vocab(spec, split.size) / split.size;
  vocab_begin_ = int64_t(split.rank) * local_vocab_;
  valid_vocab_ = int(std::clamp<int64_t>(spec.vocab - vocab_begin_, 0, local_vocab_));
  std::vector<ParamUnit> units = parameter_units(table_, unit_multiple);
  const std::size_t flat = units.back().end;
  if (store == nullptr) {
    own_store_ = std::make_unique<FullParameterStore>(units, flat, tracker);
    store = own_store_.get();
  } else if (store->flat_size() != flat || store->units().size() != units.size()) {
    throw std::invalid_argument("parameter store does not match the model's parameter units");
  }
  store_ = store;
  runs_ = core::logical_runs(table_, parameter_table(spec), split.rank, stage_.embeds);
  // Offsets relative to the first element of the tensor's unit.
  auto off = [&](const std::string& name) {
    const ParamSpec& p = parameter(name);
    return p.offset - units[p.unit].begin;
  };
  const bool gpt2 = spec.arch == Arch::gpt2;
  if (spec.llama()) {
    if (stage_.embeds || (stage_.head && spec.tied())) {
      wte_ = off("model.embed_tokens.weight");
      embed_unit_ = parameter("model.embed_tokens.weight").unit;
    }
    if (stage_.head) {
      lnf_w_ = off("model.norm.weight");
      if (!spec.tied()) lm_head_ = off("lm_head.weight");
      final_unit_ = parameter("model.norm.weight").unit;
    }
  } else if (stage_.embeds || stage_.head) {
    const std::string wte = gpt2 ? "transformer.wte.weight" : "model.decoder.embed_tokens.weight";
    wte_ = off(wte);
    wpe_ = off(gpt2 ? "transformer.wpe.weight" : "model.decoder.embed_positions.weight");
    embed_unit_ = parameter(wte).unit;
  }
  if (stage_.head && !spec.llama()) {
    const std::string lnf = gpt2 ? "transformer.ln_f.weight" : "model.decoder.final_layer_norm.weight";
    lnf_w_ = off(lnf);
    lnf_b_ = off(gpt2 ? "transformer.ln_f.bias" : "model.decoder.final_layer_norm.bias");
    final_unit_ = parameter(lnf).unit;
  }
  for (int l = layer_begin_; l < layer_end_; ++l) {
    BlockParams b{};
    if (spec.llama()) {
      const std::string h = "model.layers." + std::to_string(l) + ".";
      b.unit = parameter(h + "input_layernorm.weight").unit;
      b.ln1_w = off(h + "input_layernorm.weight");
      b.ln2_w = off(h + "post_attention_layernorm.weight");
      b.ln1_b = b.ln2_b = kNoBias;
      b.qkv_parts = 3;
      const char* parts[3] = {"q_proj", "k_proj", "v_proj"};
      for (int p = 0; p < 3; ++p) {
        b.qkv_w[p] = off(h + "self_attn." + parts[p] + ".weight");
        b.qkv_b[p] = kNoBias;
      }
      b.attn_out_w = off(h + "self_attn.o_proj.weight");
      b.fc_w = off(h + "mlp.gate_proj.weight");
      b.up_w = off(h + "mlp.up_proj.weight");
      b.fc_out_w = off(h + "mlp.down_proj.weight");
      b.attn_out_b = b.fc_b = b.fc_out_b = kNoBias;
    } else if (gpt2) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      b.unit = parameter(h + "ln_1.weight").unit;
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
      b.unit = parameter(h + "self_attn_layer_norm.weight").unit;
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

  // Saved activations and temporaries: sized by the activation table (core/activation_sizes.hpp),
  // the saved ones carved from one arena per slot in a fixed order. Per local op (two per block,
  // ModelOptions::keep): op 2i is block i's attention sub-layer (input residual[i]; saves ln1 and
  // its statistics, qkv, the probabilities and the attention output), op 2i+1 its MLP (input mid;
  // saves ln2 and its statistics and fch). `all` keeps input and saved set, `input` the input
  // alone, `none` nothing: dropped sets live in one arena, carved per segment from its start.
  constexpr int kOps = kOpsPerBlock;
  const ActivationShape shape{max_batch,
                              seq_len,
                              split.size,
                              sequence_split_,
                              ring_size,
                              options.bf16_operands,
                              options.bf16_probabilities,
                              device_memory_v<k::Exec> ? kDeviceLogitsChunkFloats
                                                       : kLogitsChunkFloats,
                              options.logits_chunk_rows};
  activations_ = stage_activations(spec, shape, stage_, options.keep, options.selective);
  shape_ = shape;
  const ActivationSizes& sz = activations_.sizes;
  bf16_norms_ = sz.bf16_norms;
  bf16_qkv_ = sz.bf16_qkv;
  if (spec.fused_attention) {
    const std::string why = fused_attention_unsupported(spec.hidden / spec.heads, bf16_qkv_);
    if (!why.empty()) throw std::invalid_argument(why);
  }
  bf16_atty_ = sz.bf16_atty;
  head_in_forward_ = sz.head_in_forward;
  bf16_att_ = sz.bf16_att;
  bf16_act_ = options.bf16_operands && !spec.llama();
  keep_ = activations_.keep;
  selective_ = activations_.selective;
  const std::size_t L = std::size_t(layer_end_ - layer_begin_);
  const std::size_t slots = std::size_t(options.slots);
  acts_ = DeviceArray<float>(tracker, MemCategory::activations, activations_.saved * slots);
  logits_ = DeviceArray<float>(tracker, MemCategory::activations, activations_.logits * slots);
  recompute_arena_ = DeviceArray<float>(tracker, MemCategory::temporaries, activations_.arena);
  selective_att_ =
      DeviceArray<float>(tracker, MemCategory::temporaries, activations_.selective_att);
  float* cursor = nullptr;
  float* arena_cursor = nullptr;
  auto carve_from = [](float*& from, std::size_t n) {
    float* p = from;
    if (from != nullptr) from += n;  // null in a dry run (MemoryTracker::set_dry_run)
    return p;
  };
  auto carve = [&](std::size_t n) { return carve_from(cursor, n); };
  // The saved set of op `op` and its input: kept, or in the arena.
  auto carve_op = [&](std::size_t op, Acts& acts) {
    const Keep keep = keep_[op];
    if (keep == Keep::input) arena_cursor = recompute_arena_.data();  // a segment starts
    float*& x = keep == Keep::none ? arena_cursor : cursor;
    float*& s = keep == Keep::all ? cursor : arena_cursor;
    BlockActs& a = acts.blocks[op / kOps];
    if (op % kOps == 0) {
      acts.residual[op / kOps] = carve_from(x, sz.residual);
      a.ln1 = carve_from(s, sz.ln1);
      a.ln1_mean = carve_from(s, sz.ln1_mean);
      a.ln1_rstd = carve_from(s, sz.ln1_rstd);
      a.qkv = carve_from(s, sz.qkv);
      a.att = activations_.selective_at(op) ? selective_att_.data() : carve_from(s, sz.att);
      a.atty = carve_from(s, sz.atty);
    } else {
      a.mid = carve_from(x, sz.residual);
      a.ln2 = carve_from(s, sz.ln2);
      a.ln2_mean = carve_from(s, sz.ln2_mean);
      a.ln2_rstd = carve_from(s, sz.ln2_rstd);
      a.fch = carve_from(s, sz.fch);
    }
  };
  cursor = acts_.data();
  for (std::size_t slot = 0; slot < slots; ++slot) {
    Acts acts{};
    acts.residual.assign(L + 1, nullptr);
    acts.blocks.assign(L, BlockActs{});
    for (std::size_t op = 0; op < keep_.size(); ++op) carve_op(op, acts);
    acts.residual[L] = carve(sz.residual);
    if (stage_.head) {
      acts.lnf = carve(sz.lnf);
      acts.lnf_mean = carve(sz.lnf_mean);
      acts.lnf_rstd = carve(sz.lnf_rstd);
      acts.losses = carve(sz.losses);
      acts.logits = logits_.data() == nullptr ? nullptr
                                              : logits_.data() + slot * activations_.logits;
    }
    slot_acts_.push_back(std::move(acts));
  }
  // The carving above and the table's totals must be the same sums.
  auto check_carved = [](const float* end, const DeviceArray<float>& buffer, const char* what) {
    if (end != nullptr && end != buffer.data() + buffer.size()) {
      throw std::logic_error(std::string("core::Model carved its ") + what +
                             " other than the activation table sized them");
    }
  };
  check_carved(cursor, acts_, "saved activations");

  scratch_ = DeviceArray<float>(tracker, MemCategory::temporaries, activations_.scratch);
  cursor = scratch_.data();
  // The LM head's chunk first, at the buffer's start (Kokkos' allocations are 128-byte
  // aligned): its rows of a multiple of 64 floats (kLogitsRowAlign) then all start 128-byte
  // aligned, as cuBLAS's tensor-core kernels and the vectorised bf16 rounding want; carved after
  // buffers of odd sizes (H x T x T, the RoPE tables) they need not. Its sizes are multiples of
  // 32 floats, so the buffers after it keep the alignment they had.
  if (stage_.head) {  // head_in_forward_ only
    logits_chunk_ = carve(sz.logits_chunk);
    logits_chunk_bf16_ = sz.logits_chunk_bf16 > 0 ? carve(sz.logits_chunk_bf16) : nullptr;
  }
  dresidual_ = carve(sz.dresidual);
  dbuf_c_ = carve(sz.dhidden);
  dbuf_f_ = carve(sz.dmlp);
  act_buf_ = carve(sz.mlp_act);
  dqkv_ = carve(sz.dqkv);
  datt_ = carve(sz.datt);
  ce_buf_ = carve(sz.cross_entropy);
  if (ring_) {
    ring_block_ = carve(sz.ring_blocks);
    dkv_all_ = carve(sz.ring_dkv);
  }
  if (sequence_split_) {
    full_tmp_ = carve(sz.split_sums);
    gather_tmp_ = carve(sz.split_gather);
    dfull_ = carve(sz.split_dgather);
    rows_tmp_ = carve(sz.split_rows);
    lnf_local_ = carve(sz.split_lnf);
  }
  if (spec.llama()) {
    qkv_gqa_ = carve(sz.qkv_gqa);
    rope_cos_ = carve(sz.rope_tables / 2);
    rope_sin_ = carve(sz.rope_tables / 2);
    if (rope_cos_ != nullptr) {  // the rotations of every position of the (ring's) sequence
      const int positions = seq_len * ring_size, hs = spec.head_dim();
      std::vector<float> cs(sz.rope_tables / 2), sn(sz.rope_tables / 2);
      k::rope_table(cs.data(), sn.data(), positions, hs, spec.rope_theta, spec.rope_scaling);
      copy_to_device(rope_cos_, cs.data(), cs.size() * sizeof(float));
      copy_to_device(rope_sin_, sn.data(), sn.size() * sizeof(float));
    }
  }
  head_pending_.assign(slots, 0);
  check_carved(cursor, scratch_, "temporaries");
  // The order of backward's gathers of units other than 0 (a ZeRO-3 store prefetches by it):
  // the final unit, then the blocks as backward() and recompute_segment() gather them.
  if (stage_.head && final_unit_ > 0) backward_gathers_.push_back(final_unit_);
  for (int b : backward_block_gathers(keep_)) {
    if (blocks_[std::size_t(b)].unit > 0) backward_gathers_.push_back(blocks_[std::size_t(b)].unit);
  }
}

const ParamSpec& Model::parameter(const std::string& name) const {
  for (const auto& p : table_) {
    if (p.name == name) return p;
  }
  throw std::out_of_range("no parameter named '" + name + "'");
}

std::size_t Model::activation_bytes() const { return acts_.bytes() + logits_.bytes(); }
std::size_t Model::temporary_bytes() const {
  return scratch_.bytes() + recompute_arena_.bytes() + selective_att_.bytes();
}
std::size_t Model::recompute_bytes() const {
  return recompute_arena_.bytes() + selective_att_.bytes();
}

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
        default:
          // Keyed by the element's index in the logical tensor: a tensor-parallel shard draws
          // exactly the values of its part of the whole (padding rows stay zero).
          for (const ShardRun& run : shard_runs(p, tp_ ? tp_->rank() : 0)) {
            fill_normal(dst + run.local, run.length, p.init_std(spec_.layers), seed,
                        hash_name(p.name), run.logical);
          }
          break;
      }
    }
    fence_kernels();
    store_->commit(int(u));
  }
}

void Model::zero_grad() { store_->zero_gradients(); }

template <class Write>
void Model::write_act(Write&& write) {
  Profiler::Scope scope(profiler_, WorkKind::activation);
  if (bf16_act_) {
    write(reinterpret_cast<std::uint16_t*>(act_buf_));
  } else {
    write(act_buf_);
  }
}

void Model::activation_forward(const float* inp, int64_t n) {
  write_act([&](auto* out) {
    if (spec_.arch == Arch::gpt2) {
      k::gelu_forward(out, inp, n);
    } else {
      k::relu_forward(out, inp, n);
    }
  });
}

void Model::bias_activation_forward(float* pre, const float* bias, int64_t N) {
  write_act([&](auto* out) {
    k::bias_activation_forward(out, pre, bias, N, local_ffn_, spec_.arch == Arch::gpt2);
  });
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
  const int Cl = local_hidden_;
  return Linear{bp.qkv_w[part], bp.qkv_b[part], spec_.hidden, bp.qkv_parts == 1 ? 3 * Cl : Cl};
}

void Model::tensor_all_reduce(float* data, int64_t n) {
  if (tp_ == nullptr) return;
  Profiler::Scope scope(profiler_, WorkKind::communication);
  fence_kernels();  // the collective reads what the kernels wrote
  tp_->all_reduce_sum(data, std::size_t(n));
}

int64_t Model::local_rows(int64_t N) const {
  if (!sequence_split_) return N;
  if (N % tp_->size() != 0) {
    throw std::invalid_argument("sequence_split: " + std::to_string(N) +
                                " tokens per micro-batch do not divide over " +
                                std::to_string(tp_->size()) + " tensor ranks");
  }
  return N / tp_->size();
}

float* Model::row_parallel_begin(float* out, const float* residual, const float* bias,
                                 int64_t N, bool prefilled) {
  const int C = spec_.hidden;
  if (prefilled) return out;
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  if (sequence_split_) {
    k::fill(full_tmp_, N * C, 0.0f);  // partial sums of every row, scattered by rows after
    return full_tmp_;
  }
  if (tp_ == nullptr || tp_->rank() == 0) {
    if (bias != nullptr) {
      k::residual_plus_bias(out, residual, bias, N, C);
    } else {
      k::copy(out, residual, N * C);
    }
  } else {
    k::fill(out, N * C, 0.0f);  // the residual and bias enter the sum once, from rank 0
  }
  return out;
}

void Model::row_parallel_end(float* out, const float* residual, const float* bias, int64_t N) {
  if (!sequence_split_) {
    tensor_all_reduce(out, N * spec_.hidden);
    return;
  }
  // Reduce-scatter the partial sums to this rank's rows, then add its residual rows and the bias.
  const int64_t Nl = local_rows(N);
  scatter_rows(full_tmp_, rows_tmp_, N);
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  if (bias != nullptr) {
    k::residual_plus_bias(out, residual, bias, Nl, spec_.hidden);
  } else {
    k::copy(out, residual, Nl * spec_.hidden);
  }
  k::add(out, rows_tmp_, Nl * spec_.hidden);
}

void Model::scatter_rows(float* full, float* rows, int64_t N) {
  Profiler::Scope scope(profiler_, WorkKind::communication);
  fence_kernels();
  tp_->reduce_scatter(full, std::size_t(N) * spec_.hidden, rows);
}

void Model::all_gather_rows(const float* rows, float* full, int64_t N) {
  Profiler::Scope scope(profiler_, WorkKind::communication);
  fence_kernels();
  tp_->all_gather(rows, std::size_t(local_rows(N)) * spec_.hidden, full);
}

const float* Model::gather_rows(const float* rows, int64_t N, float* full) {
  if (!sequence_split_) return rows;
  if (full == nullptr) full = gather_tmp_;
  all_gather_rows(rows, full, N);
  return full;
}

float* Model::column_parallel_dinp() { return sequence_split_ ? full_tmp_ : dbuf_c_; }

const float* Model::column_parallel_end(int64_t N) {
  if (!sequence_split_) {
    tensor_all_reduce(dbuf_c_, N * spec_.hidden);
    return dbuf_c_;
  }
  scatter_rows(full_tmp_, rows_tmp_, N);
  return rows_tmp_;
}

void Model::token_losses(int64_t rows, float* out, int slot) {
  if (!stage_.head) throw std::logic_error("core::Model::token_losses: not the head stage");
  if (rows < 0 || rows > int64_t(max_batch_) * seq_len_) {
    throw std::invalid_argument("core::Model::token_losses: " + std::to_string(rows) +
                                " rows outside [0, " +
                                std::to_string(int64_t(max_batch_) * seq_len_) + "]");
  }
  fence_kernels();
  copy_to_host(out, acts_of(slot).losses, std::size_t(rows) * sizeof(float));
}

float* Model::gather_buffer(std::size_t n) {
  if (gather_buffer_.size() < n) {
    gather_buffer_ = DeviceArray<float>();  // the old one first: one at a time
    gather_buffer_ = DeviceArray<float>(scratch_tracker_, MemCategory::temporaries, n);
  }
  return gather_buffer_.data();
}

void Model::gather_logits(int64_t row, float* out) {
  if (head_in_forward_) {  // the logits were never kept whole: this row's again, from ln_f
    const int C = spec_.hidden, V = int(local_vocab_);
    const bool tied = spec_.tied();
    const float* W = tied ? store_->gather(embed_unit_) + wte_
                          : store_->gather(final_unit_) + lm_head_;
    float* logits = gather_buffer(std::size_t(V));
    gemm_.gemm_mixed(Trans::N, Trans::T, 1, V, C, 1.0f,
                     norm_operand(slot_acts_.front().lnf) + row * C, C, W, C, 0.0f, logits, V);
    store_->release(tied ? embed_unit_ : final_unit_);
    copy_to_host(out, logits, std::size_t(spec_.vocab) * sizeof(float));
    return;
  }
  const float* local = slot_acts_.front().logits + row * local_vocab_;
  if (tp_ == nullptr) {
    copy_to_host(out, local, std::size_t(spec_.vocab) * sizeof(float));
    return;
  }
  std::vector<float> all(std::size_t(local_vocab_) * tp_->size());
  float* staging = gather_buffer(all.size());
  fence_kernels();
  tp_->all_gather(local, std::size_t(local_vocab_), staging);
  copy_to_host(all.data(), staging, all.size() * sizeof(float));
  std::copy(all.begin(), all.begin() + spec_.vocab, out);
}

void Model::linear_forward(const float* P, float* out, int ld_out, GemmOperand inp, int ld_in,
                           const Linear& lin, int64_t N, bool accumulate) {
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  core::linear_forward(gemm_, layout(), out, ld_out, inp, ld_in, P + lin.w, lin.in, lin.out, N,
                       accumulate);
}

void Model::linear_backward(const float* P, float* G, float* dinp, int ld_dinp, const float* dout,
                            int ld_dout, GemmOperand inp, int ld_in, const Linear& lin, int64_t N,
                            bool accumulate) {
  Profiler::Scope scope(profiler_, WorkKind::gemm);
  core::linear_backward(gemm_, layout(), dinp, ld_dinp, G + lin.w, bias_at(G, lin.b), dout,
                        ld_dout, inp, ld_in, P + lin.w, lin.in, lin.out, N, accumulate);
}

void Model::norm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int64_t rows,
                         ResidualCopy prefill) {
  const int C = spec_.hidden;
  const float eps = spec_.layernorm_eps();
  auto run = [&](auto* o) {
    using Out = std::remove_pointer_t<decltype(o)>;
    if (spec_.llama()) {
      k::rmsnorm_forward<k::Exec, Out>(o, rstd, inp, weight, rows, C, eps);
    } else {
      k::layernorm_forward<k::Exec, Out>(o, mean, rstd, inp, weight, bias, rows, C, eps,
                                         prefill);
    }
  };
  timed(WorkKind::layernorm, [&] {
    if (bf16_norms_) {
      run(reinterpret_cast<std::uint16_t*>(out));
    } else {
      run(out);
    }
  });
}

void Model::store_staged(const float* staging, float* saved, bool bf16, int64_t n) {
  if (bf16) k::to_bf16(reinterpret_cast<std::uint16_t*>(saved), staging, n);
}

void Model::attention_core_forward(BlockActs& a, int B) {
  const int T = seq_len_, Cl = local_hidden_, H = local_heads_;
  timed(WorkKind::attention, [&] {
    if (ring_) {  // q/k/v and the output in fp32 (ActivationSizes)
      ring_attention_forward(gemm_, *ring_, a.att, a.atty, a.qkv, ring_block_, B, T, Cl, H);
    } else if (spec_.fused_attention) {  // the output in fp32: its backward reads it
      model_fused_attention_forward(gemm_, a.att, a.atty, qkv_operand(a), datt_, B, T, Cl, H);
    } else {
      // The output staged in dbuf_c_, free here in forward and where backward recomputes.
      // bf16 probabilities: one sequence's at a time in datt_ (free there too), then saved.
      float* atty = staged(a.atty, bf16_atty_, dbuf_c_);
      attention_forward(gemm_, bf16_att_ ? datt_ : a.att, atty, qkv_operand(a), B, T, Cl, H,
                        bf16_att_ ? reinterpret_cast<std::uint16_t*>(a.att) : nullptr);
      store_staged(atty, a.atty, bf16_atty_, int64_t(B) * T * Cl);
    }
  });
}

// Block i's attention sub-layer, from A.residual[i] to a.mid.
void Model::attention_op_forward(int i, Acts& A, int B, const float* P) {
  const int T = seq_len_, C = spec_.hidden, Cl = local_hidden_;
  const int64_t N = int64_t(B) * T;
  const int64_t Nl = local_rows(N);
  const BlockParams& bp = blocks_[i];
  BlockActs& a = A.blocks[i];
  // The layernorm's pass also pre-fills a.mid with the residual and the projection's bias.
  const bool prefill = prefill_in_norm();
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, A.residual[i], P + bp.ln1_w, bias_at(P, bp.ln1_b),
               Nl, prefill ? ResidualCopy{a.mid, bias_at(P, bp.attn_out_b)} : ResidualCopy{});
  const GemmOperand ln1 = norm_operand(gather_rows(a.ln1, N));
  // q/k/v staged in dqkv_ (free here in forward and where backward recomputes) when saved in bf16.
  float* qkv = staged(a.qkv, bf16_qkv_, dqkv_);
  if (spec_.llama()) {  // grouped in qkv_gqa_, then k and v expanded to every query head
    qkv_projection(bp, P, ln1, qkv_gqa_, B, T, position_begin_);
    timed(WorkKind::attention, [&] {
      k::gqa_expand(qkv, qkv_gqa_, N, local_heads_, local_kv_heads_, spec_.head_dim());
    });
  } else {
    qkv_projection(bp, P, ln1, qkv, B, T, 0);
  }
  timed(WorkKind::attention, [&] { store_staged(qkv, a.qkv, bf16_qkv_, N * 3 * Cl); });
  attention_core_forward(a, B);
  // Row-parallel output projection: partial sums over the tensor group.
  float* out = row_parallel_begin(a.mid, A.residual[i], bias_at(P, bp.attn_out_b), N, prefill);
  linear_forward(P, out, C, atty_operand(a), Cl, Linear{bp.attn_out_w, bp.attn_out_b, Cl, C}, N);
  row_parallel_end(a.mid, A.residual[i], bias_at(P, bp.attn_out_b), N);
}

int Model::qkv_projection(const BlockParams& bp, const float* P, GemmOperand ln1, float* out,
                          int B, int T, int position) {
  const int C = spec_.hidden, Cl = local_hidden_, hs = spec_.head_dim();
  const int64_t N = int64_t(B) * T;
  if (!spec_.llama()) {
    for (int part = 0; part < bp.qkv_parts; ++part) {
      const Linear lin = qkv_part(bp, part);
      float* o = out + part * Cl;
      timed(WorkKind::gemm, [&] { k::broadcast_rows(o, P + lin.b, N, lin.out, 3 * Cl); });
      linear_forward(P, o, 3 * Cl, ln1, C, lin, N);
    }
    return 3 * Cl;
  }
  const int H = local_heads_, KV = local_kv_heads_, W = gqa_width();
  timed(WorkKind::gemm, [&] { k::fill(out, N * W, 0.0f); });
  const int cols[3] = {0, H * hs, (H + KV) * hs}, widths[3] = {H * hs, KV * hs, KV * hs};
  for (int part = 0; part < 3; ++part) {
    linear_forward(P, out + cols[part], W, ln1, C,
                   Linear{bp.qkv_w[part], kNoBias, C, widths[part]}, N);
  }
  timed(WorkKind::attention, [&] {
    k::rope_rotate(out, B, T, W, 0, H, hs, position, rope_cos_, rope_sin_, false);
    k::rope_rotate(out, B, T, W, H * hs, KV, hs, position, rope_cos_, rope_sin_, false);
  });
  return W;
}

// The transpose: dqkv_ (every query head's dq, dk, dv) summed into the groups, turned back, and
// through the three projections into dln1 (assigned).
void Model::llama_qkv_backward(const BlockParams& bp, const float* P, float* G, GemmOperand ln1,
                               float* dln1, int B) {
  const int T = seq_len_, C = spec_.hidden, hs = spec_.head_dim();
  const int H = local_heads_, KV = local_kv_heads_, W = gqa_width();
  const int64_t N = int64_t(B) * T;
  timed(WorkKind::attention, [&] {
    k::gqa_reduce(qkv_gqa_, dqkv_, N, H, KV, hs);
    k::rope_rotate(qkv_gqa_, B, T, W, 0, H, hs, position_begin_, rope_cos_, rope_sin_, true);
    k::rope_rotate(qkv_gqa_, B, T, W, H * hs, KV, hs, position_begin_, rope_cos_, rope_sin_,
                   true);
  });
  const int cols[3] = {0, H * hs, (H + KV) * hs}, widths[3] = {H * hs, KV * hs, KV * hs};
  for (int part = 0; part < 3; ++part) {
    linear_backward(P, G, dln1, C, qkv_gqa_ + cols[part], W, ln1, C,
                    Linear{bp.qkv_w[part], kNoBias, C, widths[part]}, N, part > 0);
  }
}

// Block i's MLP sub-layer, from a.mid to A.residual[i + 1].
void Model::mlp_op_forward(int i, Acts& A, int B, const float* P) {
  const int T = seq_len_, C = spec_.hidden, F = local_ffn_;
  const int64_t N = int64_t(B) * T;
  const int64_t Nl = local_rows(N);
  const BlockParams& bp = blocks_[i];
  BlockActs& a = A.blocks[i];
  // gpt2/opt: the layernorm's pass also pre-fills the block's output with the residual and the
  // second linear's bias.
  const bool prefill = prefill_in_norm();
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, P + bp.ln2_w, bias_at(P, bp.ln2_b), Nl,
               prefill ? ResidualCopy{A.residual[i + 1], P + bp.fc_out_b} : ResidualCopy{});
  const GemmOperand ln2 = norm_operand(gather_rows(a.ln2, N));

  if (spec_.llama()) {
    // gate | up side by side in fch (N, 2F), silu(gate) * up into act_buf_ (N, F).
    timed(WorkKind::gemm, [&] { k::fill(a.fch, N * 2 * F, 0.0f); });
    linear_forward(P, a.fch, 2 * F, ln2, C, Linear{bp.fc_w, kNoBias, C, F}, N);
    linear_forward(P, a.fch + F, 2 * F, ln2, C, Linear{bp.up_w, kNoBias, C, F}, N);
    timed(WorkKind::activation,
          [&] { k::swiglu_forward(act_buf_, a.fch, a.fch + F, 2 * F, N, F); });
    float* out = row_parallel_begin(A.residual[i + 1], a.mid, nullptr, N);
    linear_forward(P, out, C, act_buf_, F, Linear{bp.fc_out_w, kNoBias, F, C}, N);
    row_parallel_end(A.residual[i + 1], a.mid, nullptr, N);
    return;
  }
  // The product alone, then its bias and the activation in one pass (fch keeps the
  // pre-activation for backward).
  linear_forward(P, a.fch, F, ln2, C, Linear{bp.fc_w, bp.fc_b, C, F}, N, /*accumulate=*/false);
  bias_activation_forward(a.fch, P + bp.fc_b, N);
  float* out = row_parallel_begin(A.residual[i + 1], a.mid, P + bp.fc_out_b, N, prefill);
  linear_forward(P, out, C, act_operand(), F, Linear{bp.fc_out_w, bp.fc_out_b, F, C}, N);
  row_parallel_end(A.residual[i + 1], a.mid, P + bp.fc_out_b, N);
}

// The LM head and cross-entropy a chunk of rows at a time (ActivationShape::logits_chunk_rows)
// through logits_chunk_, and with grad_scale != 0 the head's backward of each chunk right after
// its cross-entropy: the input gradient of its rows into A.logits (N, C) and the weight gradient
// accumulated into GW. Only a chunk of logits ever exists (the fused linear cross-entropy).
void Model::chunked_head_forward(Acts& A, const float* W, float* GW, const int32_t* targets,
                                 int64_t N, float grad_scale) {
  const int C = spec_.hidden, V = int(local_vocab_);
  const int ld = int(activations_.sizes.logits_ld);  // V rounded up: aligned rows
  const int64_t R = int64_t(activations_.sizes.logits_chunk / std::size_t(ld));
  auto* dlogits_bf16 = reinterpret_cast<std::uint16_t*>(logits_chunk_bf16_);
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t rows = std::min(R, N - r0);
    const GemmOperand lnf = norm_operand(A.lnf) + r0 * C;
    timed(WorkKind::gemm, [&] {
      gemm_.gemm_mixed(Trans::N, Trans::T, rows, V, C, 1.0f, lnf, C, W, C, 0.0f, logits_chunk_,
                       ld);
    });
    timed(WorkKind::loss, [&] {
      k::cross_entropy_forward_backward(logits_chunk_, A.losses + r0, targets + r0, rows, V,
                                        ld, grad_scale);
      if (grad_scale != 0.0f && dlogits_bf16 != nullptr) {
        k::to_bf16(dlogits_bf16, logits_chunk_, rows * ld);  // padding too: one aligned pass
      }
    });
    if (grad_scale == 0.0f) continue;
    // dlnf = dlogits x W, dW += dlogits^T x lnf (the products round dlogits to bf16 anyway
    // under bf16_operands: the stored patterns are the same values).
    const GemmOperand dlogits = dlogits_bf16 != nullptr ? GemmOperand(dlogits_bf16)
                                                        : GemmOperand(logits_chunk_);
    timed(WorkKind::gemm, [&] {
      gemm_.gemm_mixed(Trans::N, Trans::N, rows, C, V, 1.0f, dlogits, ld, W, C, 0.0f,
                       A.logits + r0 * C, C);
      gemm_.gemm_mixed(Trans::T, Trans::N, V, C, rows, 1.0f, dlogits, ld, lnf, C, 1.0f, GW, C);
    });
  }
}

std::size_t Model::held_floats() {
  if (store_->keeps_whole()) return store_->flat_size();
  // forward() holds the LM head's weight for its chunks of logits.
  return stage_.head && head_in_forward_ ? std::size_t(local_vocab_) * std::size_t(spec_.hidden)
                                         : 0;
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int B, float grad_scale,
                      int slot) {
  const bool unchanged = take_parameters_unchanged();  // for this call only, whatever happens
  if (B < 1 || B > max_batch_) {
    throw std::invalid_argument("batch " + std::to_string(B) + " outside [1, " +
                                std::to_string(max_batch_) + "]");
  }
  Acts& A = acts_of(slot);
  const int T = seq_len_, C = spec_.hidden, V = int(local_vocab_);
  const int64_t N = int64_t(B) * T;
  const int64_t Nl = local_rows(N);  // rows of the residual stream on this rank
  // The parameters do not change until the next forward: a converting (bf16) GEMM converts the
  // weights once for this forward and the backward after it, or keeps the copy of the forward
  // before when the caller says they have not changed since (nothing held under ZeRO-3).
  float* whole = store_->full_params();
  gemm_.hold_stable(whole, whole == nullptr ? 0 : store_->flat_size(), unchanged);

  // The embeddings stay gathered from the token embedding to the tied LM head (one stage that
  // does both gathers them once per forward).
  const float* E = nullptr;
  if (stage_.embeds) {
    // Vocabulary-parallel: each rank embeds the tokens of its rows, rank 0 adds the positions,
    // and the sum over the tensor group is the embedding (scattered by rows under
    // sequence_split).
    E = store_->gather(embed_unit_);
    timed(WorkKind::embedding, [&] {
      const bool positions = wpe_ != kNoBias && (tp_ == nullptr || tp_->rank() == 0);
      k::embedding_forward(sequence_split_ ? full_tmp_ : A.residual[0], tokens, E + wte_,
                           positions ? E + wpe_ : nullptr, B, T, C,
                           spec_.position_offset() + position_begin_, vocab_begin_,
                           local_vocab_);
    });
    if (sequence_split_) {
      scatter_rows(full_tmp_, A.residual[0], N);
    } else {
      tensor_all_reduce(A.residual[0], N * C);
    }
  }  // else the previous stage's output is already in stage_input(slot)
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const float* P = store_->gather(blocks_[i].unit);
    attention_op_forward(int(i), A, B, P);
    mlp_op_forward(int(i), A, B, P);
    store_->release(blocks_[i].unit);
  }
  if (!stage_.head) {  // stage_output(slot) goes to the next stage
    if (E != nullptr) store_->release(embed_unit_);
    return 0.0;
  }

  const float* Pf = store_->gather(final_unit_);
  // Under sequence_split the final layernorm runs on this rank's rows and the LM head on all.
  float* lnf_rows = sequence_split_ ? lnf_local_ : A.lnf;
  norm_forward(lnf_rows, A.lnf_mean, A.lnf_rstd, A.residual.back(), Pf + lnf_w_,
               bias_at(Pf, lnf_b_), Nl);
  if (sequence_split_) all_gather_rows(lnf_rows, A.lnf, N);
  // LM head: logits = lnf x W^T, W the tied token embedding or (untied llama) lm_head.weight.
  const float* W = nullptr;
  if (spec_.tied()) {
    store_->release(final_unit_);
    if (E == nullptr) E = store_->gather(embed_unit_);
    W = E + wte_;
  } else {
    W = Pf + lm_head_;
  }
  if (head_in_forward_) {
    // A training forward runs the head's backward too, into the weight's gradient buffer, which
    // stays open (the store hands backward the same buffer) until a backward finishes it.
    float* GW = nullptr;
    if (grad_scale != 0.0f) {
      if (head_pending_[std::size_t(slot)] != 0) {
        throw std::logic_error("core::Model: a training forward of slot " + std::to_string(slot) +
                               " again before its backward (the LM head's gradient of the "
                               "first is already accumulated)");
      }
      head_pending_[std::size_t(slot)] = 1;
      GW = spec_.tied() ? store_->gradients(embed_unit_) + wte_
                        : store_->gradients(final_unit_) + lm_head_;
    }
    // Under ZeRO-3 (nothing held) the gathered head weight is held for its chunks, which
    // would otherwise convert it twice each.
    if (whole == nullptr) gemm_.hold_stable(W, std::size_t(V) * std::size_t(C), false);
    chunked_head_forward(A, W, GW, targets, N, grad_scale);
    if (whole == nullptr) gemm_.hold_stable(nullptr, 0, false);
  } else {
    timed(WorkKind::gemm, [&] {
      gemm_.gemm_mixed(Trans::N, Trans::T, N, V, C, 1.0f, norm_operand(A.lnf), C, W, C, 0.0f,
                       A.logits, V);
    });
  }
  if (!spec_.tied()) store_->release(final_unit_);
  if (E != nullptr) store_->release(embed_unit_);
  if (head_in_forward_) {
    // the losses are in A.losses already
  } else if (tp_ != nullptr) {
    vocab_parallel_cross_entropy(*tp_, A.logits, A.losses, targets, N, V, valid_vocab_,
                                 vocab_begin_, grad_scale, ce_buf_, profiler_);
  } else {
    Profiler::Scope loss_scope(profiler_, WorkKind::loss);
    k::cross_entropy_forward_backward(A.logits, A.losses, targets, N, V, V, grad_scale);
  }
  Profiler::Scope loss_scope(profiler_, WorkKind::loss);
  return k::sum(A.losses, N) / static_cast<double>(N);
}

void Model::backward(const int32_t* tokens, int B, int slot) {
  Acts& A = acts_of(slot);
  const int T = seq_len_, C = spec_.hidden, F = local_ffn_, Cl = local_hidden_;
  const int H = local_heads_, V = int(local_vocab_);
  const int64_t N = int64_t(B) * T;
  const int64_t Nl = local_rows(N);

  if (stage_.head && head_in_forward_) {
    if (head_pending_[std::size_t(slot)] == 0) {
      throw std::logic_error("core::Model: backward of slot " + std::to_string(slot) +
                             " without a training forward (grad_scale != 0) before it");
    }
    head_pending_[std::size_t(slot)] = 0;
  }
  // The head stage: LM head (dlnf = dlogits x wte, dwte += dlogits^T x lnf; under
  // head_in_forward_ forward did both) and the final layernorm. The embedding gradients stay
  // open until the end of backward.
  store_->plan_gathers(backward_gathers_.data(), backward_gathers_.size());
  float* GE = nullptr;
  if (embed_unit_ >= 0 && (stage_.head || stage_.embeds)) GE = store_->gradients(embed_unit_);
  if (stage_.head) {
    const bool tied = spec_.tied();
    float* Gf = store_->gradients(final_unit_);
    const float* dlnf_rows = nullptr;
    const float* Pf = nullptr;
    if (head_in_forward_) {  // forward ran the head's backward: dlnf is in A.logits
      dlnf_rows = A.logits;
      Pf = store_->gather(final_unit_);
    } else {
      const GemmOperand dlogits = A.logits;
      // The logits' gradient from forward (tensor parallelism). Untied llama: lm_head.weight
      // lives in the final unit, gathered once for the head and the final norm.
      Pf = tied ? nullptr : store_->gather(final_unit_);
      const float* W = tied ? store_->gather(embed_unit_) + wte_ : Pf + lm_head_;
      float* GW = tied ? GE + wte_ : Gf + lm_head_;
      float* dlnf = column_parallel_dinp();
      timed(WorkKind::gemm, [&] {
        gemm_.gemm_mixed(Trans::N, Trans::N, N, C, V, 1.0f, dlogits, V, W, C, 0.0f, dlnf, C);
        gemm_.gemm_mixed(Trans::T, Trans::N, V, C, N, 1.0f, dlogits, V, norm_operand(A.lnf), C,
                         1.0f, GW, C);
      });
      if (tied) store_->release(embed_unit_);
      // Each rank's vocabulary rows gave part of dlnf.
      dlnf_rows = column_parallel_end(N);
      if (tied) Pf = store_->gather(final_unit_);
    }
    timed(WorkKind::layernorm, [&] {
      k::fill(dresidual_, Nl * C, 0.0f);
      if (spec_.llama()) {
        k::rmsnorm_backward(dresidual_, Gf + lnf_w_, dlnf_rows, A.residual.back(), Pf + lnf_w_,
                            A.lnf_rstd, Nl, C);
      } else {
        k::layernorm_backward(dresidual_, Gf + lnf_w_, Gf + lnf_b_, dlnf_rows,
                              A.residual.back(), Pf + lnf_w_, A.lnf_mean, A.lnf_rstd, Nl, C);
      }
    });
    store_->release(final_unit_);
    store_->gradients_done(final_unit_);
  }  // else the next stage's gradient is already in output_gradient()

  for (int i = int(blocks_.size()) - 1; i >= 0; --i) {
    const BlockParams& bp = blocks_[i];
    BlockActs& a = A.blocks[i];
    constexpr int kOps = kOpsPerBlock;
    // Dropped activations: run the forward of their segment again from its kept input first
    // (no block's parameters are gathered meanwhile: ZeRO-3 has one work buffer for them).
    if (segment_ends_at(i * kOps + 1)) recompute_segment(A, B, i * kOps + 1);
    const float* P = store_->gather(bp.unit);
    float* G = store_->gradients(bp.unit);
    if (spec_.llama()) {
      llama_mlp_backward(bp, a, P, G, B);
    } else {
      // MLP: the activation output was not saved; recompute it for the second linear's dW.
      activation_forward(a.fch, N * F);
      const float* dres = gather_rows(dresidual_, N, dfull_);
      linear_backward(P, G, dbuf_f_, F, dres, C, act_operand(), F,
                      Linear{bp.fc_out_w, bp.fc_out_b, F, C}, N, false);
      activation_backward(dbuf_f_, a.fch, dbuf_f_, N * F);
      // sequence_split: gathered again, not saved whole.
      const GemmOperand ln2 = norm_operand(gather_rows(a.ln2, N));
      linear_backward(P, G, column_parallel_dinp(), C, dbuf_f_, F, ln2, C,
                      Linear{bp.fc_w, bp.fc_b, C, F}, N, false);
      const float* dln2 = column_parallel_end(N);
      timed(WorkKind::layernorm, [&] {
        k::layernorm_backward(dresidual_, G + bp.ln2_w, G + bp.ln2_b, dln2, a.mid,
                              P + bp.ln2_w, a.ln2_mean, a.ln2_rstd, Nl, C);
      });
    }
    // Attention.
    if (segment_ends_at(i * kOps)) {
      store_->release(bp.unit);
      recompute_segment(A, B, i * kOps);
      P = store_->gather(bp.unit);
    } else if (selective_ && keep_of(i * kOps) == Keep::all) {
      attention_core_forward(a, B);  // the probabilities again (the output rewritten unchanged)
    }
    const float* dres = gather_rows(dresidual_, N, dfull_);
    linear_backward(P, G, dbuf_c_, Cl, dres, C, atty_operand(a), Cl,
                    Linear{bp.attn_out_w, bp.attn_out_b, Cl, C}, N, false);
    timed(WorkKind::attention, [&] {
      if (ring_) {
        ring_attention_backward(gemm_, *ring_, dqkv_, datt_, dbuf_c_, a.qkv, a.att, ring_block_,
                                dkv_all_, B, T, Cl, H);
      } else if (spec_.fused_attention) {
        model_fused_attention_backward(gemm_, dqkv_, dbuf_c_, a.atty, qkv_operand(a), a.att, datt_,
                                       B, T, Cl, H);
      } else {
        attention_backward(gemm_, dqkv_, datt_, dbuf_c_, qkv_operand(a), operand(a.att, bf16_att_),
                           B, T, Cl, H);
      }
    });
    const GemmOperand ln1 = norm_operand(gather_rows(a.ln1, N));
    float* dln1_full = column_parallel_dinp();
    if (spec_.llama()) {
      llama_qkv_backward(bp, P, G, ln1, dln1_full, B);
    } else {
      for (int part = 0; part < bp.qkv_parts; ++part) {
        const Linear lin = qkv_part(bp, part);
        linear_backward(P, G, dln1_full, C, dqkv_ + part * Cl, 3 * Cl, ln1, C, lin, N, part > 0);
      }
    }
    const float* dln1 = column_parallel_end(N);
    timed(WorkKind::layernorm, [&] {
      if (spec_.llama()) {
        k::rmsnorm_backward(dresidual_, G + bp.ln1_w, dln1, A.residual[i], P + bp.ln1_w,
                            a.ln1_rstd, Nl, C);
      } else {
        k::layernorm_backward(dresidual_, G + bp.ln1_w, G + bp.ln1_b, dln1, A.residual[i],
                              P + bp.ln1_w, a.ln1_mean, a.ln1_rstd, Nl, C);
      }
    });
    store_->release(bp.unit);
    // No fence: the store orders what reads these gradients after the kernels (a fence for MPI
    // and the staged path, NCCL's event; zero::GradientSync, zero::ShardedParameterStore).
    store_->gradients_done(bp.unit);
  }
  if (stage_.embeds) {
    const float* dembed = gather_rows(dresidual_, N, dfull_);
    timed(WorkKind::embedding, [&] {
      k::embedding_backward(GE + wte_, bias_at(GE, wpe_), dembed, tokens, B, T, C,
                            spec_.position_offset() + position_begin_, vocab_begin_,
                            local_vocab_);
    });
  }  // else input_gradient() goes to the previous stage (the stage link orders its sends and
     // receives after the kernels)
  if (GE != nullptr) store_->gradients_done(embed_unit_);
}

// The llama MLP's backward, from dresidual_ (the gradient after the block) into dresidual_:
// down projection, SwiGLU, gate and up projections, RMSNorm.
void Model::llama_mlp_backward(const BlockParams& bp, BlockActs& a, const float* P, float* G,
                               int B) {
  const int T = seq_len_, C = spec_.hidden, F = local_ffn_;
  const int64_t N = int64_t(B) * T;
  const int64_t Nl = local_rows(N);
  // silu(gate) * up was not saved: again, for the down projection's dW.
  timed(WorkKind::activation,
        [&] { k::swiglu_forward(act_buf_, a.fch, a.fch + F, 2 * F, N, F); });
  const float* dres = gather_rows(dresidual_, N, dfull_);
  linear_backward(P, G, dbuf_f_, F, dres, C, act_buf_, F, Linear{bp.fc_out_w, kNoBias, F, C}, N,
                  false);
  // act_buf_ (N, 2F) now takes the gradients of gate | up.
  timed(WorkKind::activation, [&] {
    k::swiglu_backward(act_buf_, act_buf_ + F, dbuf_f_, a.fch, a.fch + F, 2 * F, N, F);
  });
  const GemmOperand ln2 = norm_operand(gather_rows(a.ln2, N));
  float* dln2_full = column_parallel_dinp();
  linear_backward(P, G, dln2_full, C, act_buf_, 2 * F, ln2, C, Linear{bp.fc_w, kNoBias, C, F}, N,
                  false);
  linear_backward(P, G, dln2_full, C, act_buf_ + F, 2 * F, ln2, C,
                  Linear{bp.up_w, kNoBias, C, F}, N, true);
  const float* dln2 = column_parallel_end(N);
  timed(WorkKind::layernorm, [&] {
    k::rmsnorm_backward(dresidual_, G + bp.ln2_w, dln2, a.mid, P + bp.ln2_w, a.ln2_rstd, Nl, C);
  });
}

bool Model::segment_ends_at(int op) const { return core::segment_ends_at(keep_, op); }

void Model::recompute_segment(Acts& A, int B, int last) {
  constexpr int kOps = kOpsPerBlock;
  const int first = segment_first(keep_, last);  // keep_[0] is never none
  for (int block = first / kOps; block <= last / kOps; ++block) {
    const float* P = store_->gather(blocks_[block].unit);
    if (first <= block * kOps) attention_op_forward(block, A, B, P);
    if (last >= block * kOps + 1) mlp_op_forward(block, A, B, P);
    store_->release(blocks_[block].unit);
  }
}

// ---- Incremental decoding -------------------------------------------------------------------

void Model::enable_decode(MemoryTracker& tracker) {
  if (decodes()) return;
  const DecodeSizes d = decode_sizes(spec_, shape_, stage_);
  kv_cache_ = DeviceArray<float>(tracker, MemCategory::activations, d.cache);
  decode_buffers_ = DeviceArray<float>(tracker, MemCategory::temporaries, d.buffers());
  float* cursor = decode_buffers_.data();  // null in a dry run: every pointer stays null
  auto carve = [&](std::size_t n) {
    float* p = cursor == nullptr || n == 0 ? nullptr : cursor;
    if (cursor != nullptr) cursor += n;
    return p;
  };
  dec_x_ = carve(d.x);
  dec_mid_ = carve(d.mid);
  dec_norm_ = carve(d.norm);
  dec_stats_ = carve(d.stats);
  dec_qkv_ = carve(d.qkv);
  dec_atty_ = carve(d.atty);
  dec_fch_ = carve(d.fch);
  dec_logits_ = carve(d.logits);
  dec_gather_ = carve(d.logits_gather);
  decode_ = d;
}

void Model::decode_row_parallel(const float* P, float* out, const float* residual,
                                GemmOperand in, const Linear& lin, int n) {
  const int C = spec_.hidden;
  timed(WorkKind::gemm, [&] {
    if (tp_ == nullptr || tp_->rank() == 0) {  // the residual and bias enter the sum once
      if (const float* bias = bias_at(P, lin.b); bias != nullptr) {
        k::residual_plus_bias(out, residual, bias, n, C);
      } else {
        k::copy(out, residual, int64_t(n) * C);
      }
    } else {
      k::fill(out, int64_t(n) * C, 0.0f);
    }
  });
  linear_forward(P, out, C, in, lin.in, lin, n);
  tensor_all_reduce(out, int64_t(n) * C);
}

void Model::decode(const int32_t* tokens, int n, int position, float* logits) {
  if (!decodes()) throw std::logic_error("core::Model::decode before enable_decode");
  if (n < 1 || n > decode_.rows || position < 0 || position + n > decode_.window) {
    throw std::invalid_argument("core::Model::decode: " + std::to_string(n) +
                                " rows at position " + std::to_string(position) +
                                " outside the decode shape (at most " +
                                std::to_string(decode_.rows) + " rows, window " +
                                std::to_string(decode_.window) + ")");
  }
  const bool unchanged = take_parameters_unchanged();
  float* whole = store_->full_params();
  gemm_.hold_stable(whole, whole == nullptr ? 0 : store_->flat_size(), unchanged);
  const int C = spec_.hidden, Cl = local_hidden_, F = local_ffn_, hs = spec_.head_dim();
  const int H = local_heads_, KV = local_kv_heads_, kvw = decode_.kv_width;
  const int64_t N = n;
  const std::size_t block_cache = std::size_t(decode_.window) * std::size_t(kvw);
  float* mean = dec_stats_;
  float* rstd = dec_stats_ + decode_.rows;

  // As forward(): the embeddings stay gathered from the token embedding to a tied head.
  const float* E = nullptr;
  if (stage_.embeds) {
    E = store_->gather(embed_unit_);
    timed(WorkKind::embedding, [&] {
      const bool positions = wpe_ != kNoBias && (tp_ == nullptr || tp_->rank() == 0);
      k::embedding_forward(dec_x_, tokens, E + wte_, positions ? E + wpe_ : nullptr, 1, n, C,
                           spec_.position_offset() + position, vocab_begin_, local_vocab_);
    });
    tensor_all_reduce(dec_x_, N * C);
  }
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const BlockParams& bp = blocks_[i];
    const float* P = store_->gather(bp.unit);
    // Attention: q|k|v of the new rows, their k and v appended, q against every cached position.
    norm_forward(dec_norm_, mean, rstd, dec_x_, P + bp.ln1_w, bias_at(P, bp.ln1_b), N);
    const int ld = qkv_projection(bp, P, norm_operand(dec_norm_), dec_qkv_, 1, n, position);
    // k and v: after q's heads, in the grouped layout (llama) or the fused one.
    const int k_col = spec_.llama() ? H * hs : Cl, v_col = spec_.llama() ? (H + KV) * hs : 2 * Cl;
    float* cache_k = kv_cache_.data() + 2 * i * block_cache;
    float* cache_v = cache_k + block_cache;
    timed(WorkKind::attention, [&] {
      k::kv_append(cache_k, cache_v, dec_qkv_, N, ld, k_col, v_col, kvw, position);
      k::cached_attention(dec_atty_, dec_qkv_, ld, cache_k, cache_v, N, position, H, KV, hs);
    });
    decode_row_parallel(P, dec_mid_, dec_x_, dec_atty_,
                        Linear{bp.attn_out_w, bp.attn_out_b, Cl, C}, n);
    // MLP, back into dec_x_.
    norm_forward(dec_norm_, mean, rstd, dec_mid_, P + bp.ln2_w, bias_at(P, bp.ln2_b), N);
    const GemmOperand ln2 = norm_operand(dec_norm_);
    if (spec_.llama()) {
      timed(WorkKind::gemm, [&] { k::fill(dec_fch_, N * 2 * F, 0.0f); });
      linear_forward(P, dec_fch_, 2 * F, ln2, C, Linear{bp.fc_w, kNoBias, C, F}, N);
      linear_forward(P, dec_fch_ + F, 2 * F, ln2, C, Linear{bp.up_w, kNoBias, C, F}, N);
      timed(WorkKind::activation,
            [&] { k::swiglu_forward(act_buf_, dec_fch_, dec_fch_ + F, 2 * F, N, F); });
      decode_row_parallel(P, dec_x_, dec_mid_, act_buf_, Linear{bp.fc_out_w, kNoBias, F, C}, n);
    } else {
      linear_forward(P, dec_fch_, F, ln2, C, Linear{bp.fc_w, bp.fc_b, C, F}, N,
                     /*accumulate=*/false);
      bias_activation_forward(dec_fch_, P + bp.fc_b, N);
      decode_row_parallel(P, dec_x_, dec_mid_, act_operand(),
                          Linear{bp.fc_out_w, bp.fc_out_b, F, C}, n);
    }
    store_->release(bp.unit);
  }
  if (!stage_.head || logits == nullptr) {  // decode_output() goes to the next stage
    if (E != nullptr) store_->release(embed_unit_);
    return;
  }
  // The head: the last row's final norm and its logits, gathered over the vocabulary's ranks.
  const float* Pf = store_->gather(final_unit_);
  norm_forward(dec_norm_, mean, rstd, dec_x_ + (N - 1) * C, Pf + lnf_w_, bias_at(Pf, lnf_b_), 1);
  const float* W = nullptr;
  if (spec_.tied()) {
    store_->release(final_unit_);
    if (E == nullptr) E = store_->gather(embed_unit_);
    W = E + wte_;
  } else {
    W = Pf + lm_head_;
  }
  const int Vl = int(local_vocab_);
  timed(WorkKind::gemm, [&] {
    gemm_.gemm_mixed(Trans::N, Trans::T, 1, Vl, C, 1.0f, norm_operand(dec_norm_), C, W, C, 0.0f,
                     dec_logits_, Vl);
  });
  if (!spec_.tied()) store_->release(final_unit_);
  if (E != nullptr) store_->release(embed_unit_);
  const std::size_t bytes = std::size_t(spec_.vocab) * sizeof(float);
  if (tp_ == nullptr) {
    copy_to_host(logits, dec_logits_, bytes);
    return;
  }
  // Rank r holds padded rows [r Vl, (r + 1) Vl): the first vocab of the gathered rows.
  {
    Profiler::Scope scope(profiler_, WorkKind::communication);
    fence_kernels();
    tp_->all_gather(dec_logits_, std::size_t(Vl), dec_gather_);
  }
  copy_to_host(logits, dec_gather_, bytes);
}

}  // namespace colossal::core
