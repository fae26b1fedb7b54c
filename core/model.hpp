// The explicit GPT-2 / OPT / LLaMA transformer: forward and backward written out layer by layer
// over buffers allocated once at construction (no autograd, no allocation per step).
//
// GPT-2 and OPT are pre-LN decoders with learned positions and a tied LM head; they differ in
// the activation (GPT-2: GELU tanh, OPT: ReLU), in the q/k/v projection (GPT-2: one fused Conv1D
// [C, 3C]; OPT: three nn.Linear [C, C]), in the weight layout ([in, out] vs [out, in]) and in OPT's
// position offset of 2. LLaMA (arch llama) is pre-norm too, with RMSNorm, no biases, rotary
// positions applied to q and k (from the global position of each token, so a ring rank's chunk
// turns by its own positions), grouped-query attention (k/v projected for kv_heads heads and
// expanded to every query head before the shared attention kernels, dense, fused or ring),
// a SwiGLU MLP (gate and up projections side by side in fch) and an untied lm_head.weight unless
// tie_embeddings (core/llama_kernels.hpp). Parameters keep the Hugging Face names, shapes and
// layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/activation_sizes.hpp"
#include "core/gemm.hpp"
#include "core/keep.hpp"
#include "core/layers.hpp"
#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/parameter_store.hpp"
#include "core/profiler.hpp"
#include "core/residual_copy.hpp"
#include "core/stage_model.hpp"
#include "core/tensor_group.hpp"

namespace colossal::core {

// Where a model runs besides its sizes: its parameter store, its tensor and sequence groups, its
// pipeline stage and how many micro-batches' activations it keeps at once.
struct ModelOptions {
  std::size_t unit_multiple = 16;    // parameter units padded to this many floats (dp * 16)
  ParameterStore* store = nullptr;   // null: a FullParameterStore of the model's own
  TensorGroup* tensor = nullptr;     // 1D tensor parallelism
  bool sequence_split = false;       // Megatron sequence parallelism inside the tensor group
  TensorGroup* sequence = nullptr;   // ring self-attention
  StageRange stage{};                // pipeline stage (the whole model by default)
  int slots = 1;                     // activation sets: micro-batches in flight on this stage
  // Activation checkpointing: one entry per op of the whole model, two per block (attention
  // sub-layer, MLP sub-layer; core/keep.hpp); empty keeps everything. Dropped ops
  // are recomputed in backward from the last kept input, into one arena (a temporary) sized for
  // the largest segment. A stage's first op is always treated as keeping its input.
  std::vector<Keep> keep{};
  // Selective recompute (Korthikanti et al. 2022): the attention probabilities of kept blocks
  // are not saved but recomputed from q, k, v in backward. Nothing to drop with fused
  // attention, which never stores them.
  bool selective = false;
  // 2d / 2.5d / 3d (core::GridModel, which lays out its own units): makes the store over them
  // (ZeRO 2: a zero::ShardedParameterStore); unset, a FullParameterStore. Model ignores it.
  StoreFactory grid_store{};
  // 2d / 2.5d / 3d: unit 0 padded to at least this many floats (core::grid_first_unit_floats),
  // so that the first and the last pipeline stage slice their tied token embedding alike under
  // ZeRO 2; 0: no floor. Model ignores it.
  std::size_t grid_first_unit_floats = 0;
  // train.precision: bf16: the activations that only matrix products read (norm outputs,
  // q/k/v, unfused attention's output, the chunk of the logits' gradient) saved in bf16
  // (ActivationShape::bf16_operands says which, when), in host or device memory. The gemm must
  // then round its operands to bf16 (a bf16 backend), or the step would differ from fp32
  // storage. Model2D / Model3D ignore it.
  bool bf16_operands = false;
  // With it, the attention probabilities in bf16 too (ActivationShape::bf16_probabilities: not
  // exact).
  bool bf16_probabilities = false;
  // Rows of logits per chunk of the LM head (ActivationShape::logits_chunk_rows); 0: as many as
  // kLogitsChunkFloats hold (kDeviceLogitsChunkFloats on a GPU).
  std::size_t logits_chunk_rows = 0;
};

class Model final : public StageModel {
 public:
  // Buffers sized for up to `max_batch` sequences of exactly `seq_len` tokens. Parameter units
  // (parameter_table) are padded to a multiple of `unit_multiple` floats (ZeRO shards each unit
  // into equal parts); padding stays zero. Parameters and gradients live in `store` (which must
  // have this table's units), or in a FullParameterStore of the model's own when it is null.
  //
  // With a `tensor` group of size t > 1 the model is this rank's part of a 1D (Megatron) tensor-
  // parallel model: q/k/v and the first MLP linear column-parallel (heads and MLP width split),
  // the attention output and second MLP linear row-parallel (partial sums all-reduced), the tied
  // embedding / LM head split by (padded) vocabulary rows with a vocabulary-parallel
  // cross-entropy; layernorms, positions and row-parallel biases replicated. Forward all-reduces
  // the embedding and two (B,T,C) activations per block; backward the LM-head input gradient and
  // two per block; the cross-entropy 3 floats per token.
  //
  // With `sequence_split` (Megatron sequence parallelism, Korthikanti et al. 2022) each tensor
  // rank keeps only 1/t of the token rows of the residual stream, layernorms and residual adds:
  // every all-reduce becomes a reduce-scatter to the rows (after row-parallel layers) plus an
  // all-gather of the rows (before column-parallel ones); backward gathers the saved layernorm
  // outputs again rather than keeping them whole. Layernorm weight gradients are then partial
  // sums over the tensor group (the optimizer sums them).
  //
  // With a `sequence` group of size S > 1 (ring self-attention, Li et al. 2021) every sequence is
  // split into S contiguous chunks: `seq_len` is this rank's chunk, rank s of the group holding
  // positions [s*seq_len, (s+1)*seq_len). Every layer but attention works on the chunk alone;
  // attention passes key and value blocks around the ring (layers.hpp). Parameter gradients are
  // this chunk's part: the caller sums them over the sequence group as over data parallelism.
  //
  // A pipeline stage (options.stage) runs blocks [layer_begin, layer_end): the first stage embeds
  // the tokens, later ones start from stage_input(); the last runs the final layernorm, the tied
  // LM head and the loss, earlier ones leave stage_output() for the next stage and start backward
  // from output_gradient(). `slots` sets of activations let several micro-batches be in flight.
  Model(const ModelSpec& spec, int max_batch, int seq_len, MemoryTracker& tracker, Gemm& gemm,
        const ModelOptions& options = {});
  // Lets go of the parameters held in the GEMM (Gemm::hold_stable) before they are freed.
  ~Model() override { gemm_.hold_stable(nullptr, 0, false); }

  const ModelSpec& spec() const override { return spec_; }
  int max_batch() const { return max_batch_; }
  int seq_len() const { return seq_len_; }
  const std::vector<ParamSpec>& parameters() const override { return table_; }
  const ParamSpec& parameter(const std::string& name) const;
  const std::vector<ParamUnit>& units() const { return store_->units(); }
  std::size_t flat_size() const override { return store_->flat_size(); }  // padded length of the flat buffers
  std::size_t held_floats() override;
  std::size_t num_parameters() const { return num_parameters_; }  // logical elements
  ParameterStore& store() override { return *store_; }
  // The whole flat buffers; only when the store keeps them whole (throws under ZeRO-3 sharding).
  float* params() { return full(store_->full_params()); }
  float* grads() { return full(store_->full_grads()); }
  const float* params() const { return full(store_->full_params()); }
  const float* grads() const { return full(store_->full_grads()); }

  // normal(0, init_std) from (seed, tensor name, element index); layernorm weights 1, biases 0.
  void init_parameters(uint64_t seed) override;

  // Runs the batch (tokens and targets are (batch, seq_len) int32 in device memory) and returns the
  // mean cross-entropy over its tokens. With grad_scale != 0 it also starts the backward of
  // grad_scale * (sum of token losses): without tensor parallelism the LM head's backward runs
  // here, a chunk of rows at a time (ActivationSizes::head_in_forward: the logits are never
  // whole), accumulating the head's weight gradient and keeping its input gradient for backward();
  // with tensor parallelism the logits buffer becomes their gradient. Every such forward of a
  // slot must be followed by backward() of that slot before the slot's next forward with
  // grad_scale != 0 (a second one throws std::logic_error). grad_scale = 0 computes the losses
  // alone (gather_logits reads the logits).
  // `slot` chooses the activation set (pipelines keep several micro-batches in flight). On a stage
  // without the head it returns 0 and leaves stage_output(slot).
  double forward(const int32_t* tokens, const int32_t* targets, int batch, float grad_scale,
                 int slot = 0) override;
  // Accumulates parameter gradients (+=) of the forward() of `slot` (which must have had
  // grad_scale != 0). A stage without the head starts from output_gradient(); one that does not
  // embed leaves the gradient of its input in input_gradient().
  void backward(const int32_t* tokens, int batch, int slot = 0) override;
  void zero_grad() override;

  // Pipeline stage boundaries: (local rows of batch * seq_len, hidden) floats each.
  const StageRange& stage() const override { return stage_; }
  int64_t stage_floats(int batch) const override {
    return local_rows(int64_t(batch) * seq_len_) * spec_.hidden;
  }
  float* stage_input(int slot) override { return acts_of(slot).residual.front(); }
  const float* stage_output(int slot) override { return acts_of(slot).residual.back(); }
  float* output_gradient() override { return dresidual_; }
  const float* input_gradient() const override { return dresidual_; }
  int slots() const override { return int(slot_acts_.size()); }

  int64_t local_vocab() const { return local_vocab_; }
  // The full-vocabulary logits of token row `row` (batch * seq_len + position) of the last
  // forward into host memory `out` (vocab floats). Collective over the tensor group.
  void gather_logits(int64_t row, float* out);
  // The cross-entropy of each token row (batch * seq_len, this rank's positions) of the last
  // forward of `slot` into host memory `out` (`rows` floats); on the head stage only. Every
  // rank of the tensor group holds the same ones.
  void token_losses(int64_t rows, float* out, int slot = 0);

  // Incremental decoding (colossal_generate): instead of a forward over the whole window for
  // every sampled token, each block keeps the keys and values of the positions seen so far
  // (core::decode_sizes: the window is the whole sequence, seq_len x the ring size) and decode()
  // runs only the new positions. enable_decode allocates that state once, the cache as
  // activations and the rows' buffers as temporaries of `tracker` (the memory plan prices both:
  // planner::RankLayout::decode).
  void enable_decode(MemoryTracker& tracker);
  bool decodes() const { return decode_.window > 0; }
  const DecodeSizes& decode_shape() const { return decode_; }
  // n <= decode_shape().rows new tokens at positions [position, position + n) of one sequence,
  // attending to the cached positions before them (which must be this sequence's 0..position-1:
  // position 0 starts it again), appended to the cache. The stage that embeds reads `tokens`
  // (n int32 in device memory); another starts from decode_input() (n rows of C floats, whole
  // rows on every tensor rank, also under sequence_split), and a stage without the head leaves
  // decode_output(). The head stage writes the full-vocabulary logits of the last row to `logits`
  // (host memory, vocab floats; null: none, a prefill's earlier rows). Collective over the
  // tensor group (and under ZeRO-3 the store's group); a ring's ranks each run it alone, whole
  // (the ring is not used).
  void decode(const int32_t* tokens, int n, int position, float* logits);
  float* decode_input() { return dec_x_; }
  const float* decode_output() const { return dec_x_; }

  // With the model's own store: called during backward() whenever the gradients of
  // [offset, flat_size()) have become final (after the final layernorm, after each block from the
  // last to the first, and with 0 at the end). Empty: not called.
  void set_gradients_ready_hook(std::function<void(std::size_t offset)> hook);

  // Times forward and backward by kind of work while `profiler` is enabled (nullptr: never).
  void set_profiler(Profiler* profiler) override { profiler_ = profiler; }

  // This rank's runs of every tensor it holds (core::logical_runs of its table).
  const std::vector<LogicalRun>& logical_runs() const override { return runs_; }

  // The activation table its buffers were carved from (core/activation_sizes.hpp): the floats
  // of every saved tensor and temporary, what each slot keeps, the recompute arena. The cost
  // model reads the same table without building a model.
  const StageActivations& activations() const { return activations_; }
  // Bytes of saved activations and of temporaries (for reports and the cost model's checks).
  std::size_t activation_bytes() const;
  std::size_t temporary_bytes() const;
  // Of the temporaries: activation checkpointing's recompute arena and selective buffer.
  std::size_t recompute_bytes() const;

 private:
  // gather_buffer_, at least n floats (grown, never shrunk).
  float* gather_buffer(std::size_t n);
  // Offsets of one block's parameters relative to its unit's first element. qkv has one entry for
  // GPT-2's fused c_attn and three (q, k, v) for OPT and LLaMA. LLaMA: no biases (kNoBias),
  // fc_w the gate projection, up_w the up projection, fc_out_w the down projection.
  static constexpr std::size_t kNoBias = std::size_t(-1);
  struct BlockParams {
    std::size_t ln1_w, ln1_b, ln2_w, ln2_b;
    std::size_t qkv_w[3], qkv_b[3];
    int qkv_parts;
    std::size_t attn_out_w, attn_out_b, fc_w, fc_b, fc_out_w, fc_out_b;
    std::size_t up_w = kNoBias;
    int unit;
  };
  // Saved activations of one block.
  struct BlockActs {
    float* ln1;       // (B,T,C)
    float* ln1_mean;  // (B,T)
    float* ln1_rstd;  // (B,T)
    float* qkv;       // (B,T,3C)
    float* att;       // (B,H,T,T) softmax probabilities, or (B,H,T) log-sum-exp when fused
    float* atty;      // (B,T,C) attention output before its projection
    float* mid;       // (B,T,C) residual after attention
    float* ln2;       // (B,T,C)
    float* ln2_mean;  // (B,T)
    float* ln2_rstd;  // (B,T)
    float* fch;       // (B,T,F) first MLP linear output, before the activation
  };

  // A linear layer's parameter offsets (relative to its unit) and sizes; the layout follows the
  // architecture.
  struct Linear {
    std::size_t w, b;
    int in, out;
  };
  // One micro-batch's saved activations.
  struct Acts {
    std::vector<float*> residual;  // stage blocks + 1 entries of (B,T,C)
    std::vector<BlockActs> blocks;
    float *lnf, *lnf_mean, *lnf_rstd, *losses, *logits;
  };
  // The two ops of local block i: attention from residual[i] to mid, MLP from mid to
  // residual[i + 1], their activations into wherever the schedule put them.
  void attention_op_forward(int i, Acts& A, int batch, const float* P);
  void mlp_op_forward(int i, Acts& A, int batch, const float* P);
  // The attention core alone: probabilities (or log-sum-exp) and output from q, k, v.
  void attention_core_forward(BlockActs& a, int batch);
  // Recomputes the dropped segment that ends at local op `last` (forward again from its kept
  // input); gathers and releases each block's parameters itself.
  void recompute_segment(Acts& A, int batch, int last);
  // Local op j's schedule entry, and whether a recomputed segment ends at it.
  Keep keep_of(int op) const { return keep_[std::size_t(op)]; }
  bool segment_ends_at(int op) const;
  Acts& acts_of(int slot) {
    if (slot < 0 || slot >= int(slot_acts_.size())) {
      throw std::out_of_range("activation slot " + std::to_string(slot) + " of " +
                              std::to_string(slot_acts_.size()));
    }
    return slot_acts_[slot];
  }
  // out(N, ld_out)[:, :lin.out] += inp(N, ld_in) x W   (out pre-filled with bias / residual),
  // or = without accumulate; P is the unit's parameters.
  void linear_forward(const float* P, float* out, int ld_out, GemmOperand inp, int ld_in,
                      const Linear& lin, int64_t N, bool accumulate = true);
  // dinp = (or += when accumulate) dout x W^T; dW += ...; db += colsum(dout); G is the unit's
  // gradients.
  void linear_backward(const float* P, float* G, float* dinp, int ld_dinp, const float* dout,
                       int ld_dout, GemmOperand inp, int ld_in, const Linear& lin, int64_t N,
                       bool accumulate);
  // head_in_forward_: the LM head, the cross-entropy and (grad_scale != 0) the head's backward in
  // chunks of rows, W the head's weights and GW their gradient (null when grad_scale is 0); the
  // head's input gradient goes to A.logits.
  void chunked_head_forward(Acts& A, const float* W, float* GW, const int32_t* targets, int64_t N,
                            float grad_scale);
  // A norm (layernorm, or llama's RMSNorm: mean unused) of `rows` rows into its saved buffer
  // `out`: fp32, or bf16 patterns under bf16_norms_. With prefill.out (prefill_in_norm() only),
  // the layernorm's pass also writes prefill.out = inp + prefill.bias: the sub-layer's row-
  // parallel output, pre-filled (row_parallel_begin's `prefilled`).
  void norm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                    const float* bias, int64_t rows, ResidualCopy prefill = {});
  // Whether a sub-layer's layernorm pre-fills its output with the residual and the output
  // product's bias (gpt2/opt without tensor parallelism, whose rank 0 alone adds them).
  bool prefill_in_norm() const { return tp_ == nullptr && !sequence_split_ && !spec_.llama(); }
  // A saved activation as a GEMM operand: the bf16 patterns it holds when `bf16`.
  static GemmOperand operand(const float* saved, bool bf16) {
    if (bf16) return reinterpret_cast<const std::uint16_t*>(saved);
    return saved;
  }
  // A saved norm output (all its rows: gather_rows first), q/k/v, the attention output.
  GemmOperand norm_operand(const float* saved) const { return operand(saved, bf16_norms_); }
  GemmOperand qkv_operand(const BlockActs& a) const { return operand(a.qkv, bf16_qkv_); }
  GemmOperand atty_operand(const BlockActs& a) const { return operand(a.atty, bf16_atty_); }
  // A GEMM-written activation saved in bf16 is written to `staging` in fp32 first, then
  // converted into its saved buffer (store_staged); in fp32 it is written in place.
  static float* staged(float* saved, bool bf16, float* staging) { return bf16 ? staging : saved; }
  void store_staged(const float* staging, float* saved, bool bf16, int64_t n);
  template <class T>
  static T* full(T* p) {
    if (p == nullptr) {
      throw std::logic_error("the flat parameter buffers are sharded (ZeRO-3); gather units");
    }
    return p;
  }
  int final_unit() const { return final_unit_; }
  // Sum over the tensor group, in place (nothing without tensor parallelism).
  void tensor_all_reduce(float* data, int64_t n);
  // Token rows of the residual stream on this rank (N, or N/t under sequence_split).
  int64_t local_rows(int64_t N) const;
  // A row-parallel linear: begin returns where its partial sums go (out pre-filled with residual
  // + bias on rank 0, unless the layernorm did already: `prefilled`; a zeroed whole-row buffer
  // under sequence_split); end makes `out` this rank's rows of residual + bias + the sum over
  // the group.
  float* row_parallel_begin(float* out, const float* residual, const float* bias, int64_t N,
                            bool prefilled = false);
  void row_parallel_end(float* out, const float* residual, const float* bias, int64_t N);
  // sequence_split: whole (N, C) rows <-> this rank's rows.
  void scatter_rows(float* full, float* rows, int64_t N);  // reduce-scatter of partial sums
  void all_gather_rows(const float* rows, float* full, int64_t N);
  // All rows of `rows` (gathered into `full`, by default a shared buffer, under sequence_split).
  const float* gather_rows(const float* rows, int64_t N, float* full = nullptr);
  // Where a column-parallel layer writes its input gradient, and that gradient summed over the
  // group on this rank's rows.
  float* column_parallel_dinp();
  const float* column_parallel_end(int64_t N);
  template <class F>
  void timed(WorkKind kind, F&& work) {
    Profiler::Scope scope(profiler_, kind);
    work();
  }
  WeightLayout layout() const {
    return spec_.arch == Arch::gpt2 ? WeightLayout::in_out : WeightLayout::out_in;
  }
  // A bias's parameters (or gradients) in unit X, null for none.
  static const float* bias_at(const float* X, std::size_t b) {
    return b == kNoBias ? nullptr : X + b;
  }
  static float* bias_at(float* X, std::size_t b) { return b == kNoBias ? nullptr : X + b; }
  // q|k|v of B sequences of T rows (positions from `position` on) from the norm output ln1 into
  // `out`, whose row stride it returns: gpt2/opt (B*T, 3C/t) with the biases; llama the grouped
  // (B*T, gqa_width()) layout with q and k turned by RoPE, which the training forward expands to
  // every query head and the decoding caches as it is. And llama's transpose (dqkv_ -> gradient
  // of the projections in qkv_gqa_).
  int qkv_projection(const BlockParams& bp, const float* P, GemmOperand ln1, float* out, int B,
                     int T, int position);
  void llama_qkv_backward(const BlockParams& bp, const float* P, float* G, GemmOperand ln1,
                          float* dln1, int B);
  void llama_mlp_backward(const BlockParams& bp, BlockActs& a, const float* P, float* G, int B);
  int gqa_width() const { return (local_heads_ + 2 * local_kv_heads_) * spec_.head_dim(); }
  // act_buf_ = act(inp) (GELU for GPT-2, ReLU for OPT), in bf16 patterns when bf16_act_.
  void activation_forward(const float* inp, int64_t n);
  // pre += bias (per column of the local MLP width) and act_buf_ = act(pre), one pass.
  void bias_activation_forward(float* pre, const float* bias, int64_t N);
  GemmOperand act_operand() const { return operand(act_buf_, bf16_act_); }
  // write(out) with act_buf_ as float*, or as std::uint16_t* when bf16_act_, timed as activation.
  template <class Write>
  void write_act(Write&& write);
  void activation_backward(float* dinp, const float* inp, const float* dout, int64_t n);
  Linear qkv_part(const BlockParams& bp, int part) const;

  ModelSpec spec_;
  int max_batch_, seq_len_;
  Gemm& gemm_;
  std::vector<ParamSpec> table_;
  std::size_t num_parameters_ = 0;
  std::size_t wte_ = 0, wpe_ = kNoBias, lnf_w_ = 0, lnf_b_ = kNoBias;  // relative to their units
  std::size_t lm_head_ = kNoBias;  // untied llama: lm_head.weight in the final unit
  StageRange stage_;
  int layer_begin_ = 0, layer_end_ = 0;
  int embed_unit_ = -1, final_unit_ = -1;  // -1 where this stage holds neither
  std::vector<BlockParams> blocks_;        // this stage's blocks (BlockParams::unit)
  // The units other than 0 that backward gathers, in order (ParameterStore::plan_gathers).
  std::vector<int> backward_gathers_;

  std::unique_ptr<FullParameterStore> own_store_;
  ParameterStore* store_ = nullptr;
  TensorGroup* tp_ = nullptr;  // null without tensor parallelism
  int local_hidden_ = 0, local_heads_ = 0, local_ffn_ = 0;  // per tensor rank
  int local_kv_heads_ = 0;                                  // llama
  float *qkv_gqa_ = nullptr, *rope_cos_ = nullptr, *rope_sin_ = nullptr;  // llama temporaries
  int64_t local_vocab_ = 0, vocab_begin_ = 0;               // padded rows held, first row
  int valid_vocab_ = 0;                                     // rows that are real tokens
  MemoryTracker scratch_tracker_;                           // gather_logits staging
  // gather_logits' row of logits, made by the first call and kept (a sample without the
  // key/value cache gathers a row per token: no allocation, and no cudaFree's device-wide wait,
  // per token). Declared after its tracker, so it is freed first.
  DeviceArray<float> gather_buffer_;
  DeviceArray<float> acts_;        // every saved activation of every slot, carved below
  DeviceArray<float> scratch_;     // temporaries of backward, shared by all blocks
  DeviceArray<float> logits_;      // per slot, head stage: ActivationSizes::logits
  std::vector<Acts> slot_acts_;
  StageActivations activations_;  // the sizes of everything below
  std::vector<Keep> keep_;  // per local op (2 per block)
  bool selective_ = false;                    // probabilities of kept blocks recomputed
  DeviceArray<float> recompute_arena_;        // the activations of the segment being recomputed
  DeviceArray<float> selective_att_;          // selective: the probabilities of one block
  float *dresidual_, *dbuf_c_, *dbuf_f_, *act_buf_, *dqkv_, *datt_, *ce_buf_;
  bool sequence_split_ = false;
  // Saved as bf16 patterns (ActivationSizes): ln1, ln2 and lnf; qkv; atty.
  bool bf16_norms_ = false, bf16_qkv_ = false, bf16_atty_ = false;
  bool bf16_att_ = false;  // the probabilities, staged one sequence at a time in datt_
  // The MLP activation's output (act_buf_, a temporary only the second linear layer's products
  // read, in forward and in backward's recomputation): bf16 patterns under bf16_operands.
  bool bf16_act_ = false;
  // ActivationSizes::head_in_forward: the logits a chunk of rows at a time in logits_chunk_ (then
  // their gradient, as bf16 patterns in logits_chunk_bf16_ under bf16_operands).
  bool head_in_forward_ = false;
  float* logits_chunk_ = nullptr;
  float* logits_chunk_bf16_ = nullptr;
  // Which slots' training forwards have accumulated the LM head's weight gradient (into the
  // store's open buffer of the embeddings, or of the final unit of an untied head) without their
  // backward yet.
  std::vector<char> head_pending_;
  TensorGroup* ring_ = nullptr;  // sequence (ring attention) group; null without one
  int position_begin_ = 0;       // first position of this rank's chunk
  float *ring_block_ = nullptr, *dkv_all_ = nullptr;
  float *full_tmp_ = nullptr, *gather_tmp_ = nullptr, *dfull_ = nullptr, *rows_tmp_ = nullptr,
        *lnf_local_ = nullptr;
  Profiler* profiler_ = nullptr;
  std::vector<LogicalRun> runs_;
  // Incremental decoding (enable_decode): the shape the buffers were sized for, the sizes, the
  // cache (keys then values of each block) and the rows' buffers carved from one array.
  ActivationShape shape_;
  DecodeSizes decode_{};
  DeviceArray<float> kv_cache_, decode_buffers_;
  float *dec_x_ = nullptr, *dec_mid_ = nullptr, *dec_norm_ = nullptr, *dec_stats_ = nullptr,
        *dec_qkv_ = nullptr, *dec_atty_ = nullptr, *dec_fch_ = nullptr, *dec_logits_ = nullptr,
        *dec_gather_ = nullptr;
  // A row-parallel product into the residual stream for n decoded rows: out = residual + bias on
  // tensor rank 0 (0 elsewhere) + in x W, summed over the tensor group.
  void decode_row_parallel(const float* P, float* out, const float* residual, GemmOperand in,
                           const Linear& lin, int n);
};

}  // namespace colossal::core
