// The GPT-2 / OPT transformer under 2D tensor parallelism (Optimus, Xu et al. 2021) on a q x q
// grid (core/tensor2d.hpp), written out layer by layer like core::Model: every activation and
// every weight matrix is a q x q block of the logical one, so each rank holds 1/q^2 of both.
//
// Layout on rank (i, j), with c = C/q, f = F/q, Vp the vocabulary padded to a multiple of q and
// Pp the position rows padded likewise:
//   activations  rows block i of the micro-batch's B*T token rows (whole sequences: B % q == 0),
//                columns block j; the residual stream is R x c with R = B*T/q
//   wte, wpe     rows (vocabulary / position) block i, columns block j: Vp/q x c, Pp/q x c
//   linears      weights as [in, out] blocks (i, j) whatever the architecture's storage (OPT's
//                [out, in] tensors are mapped transposed); q|k|v columns are regrouped so that
//                column block j holds the q, k and v columns of heads [j H/q, (j+1) H/q), which
//                makes attention local: B/q sequences x H/q heads on every rank
//   biases, layernorm weights  columns block j, replicated down the grid column (their gradients
//                are summed over it: reduce_gradients)
// Products are SUMMA (forward A B; backward A B^T for inputs, A^T B for weights); layernorm
// statistics and the cross-entropy are reduced along the grid row; the embedding is a
// vocabulary-parallel lookup down the grid column (each rank adds its rows' part for every token,
// a reduce-scatter down the column sums them) and its gradient an all-gather down the column.
//
// 2.5D (Tesseract, Wang et al. 2021) is this model with a `depth` group: d layers of q x q grids,
// the batch split across the layers (each runs `batch` sequences of its own), weights replicated
// across them and every gradient summed over the depth (reduce_gradients). Within a layer the
// products, layernorms and cross-entropy are the 2D ones; as the weights are the same in every
// layer, this is also what 2D x data parallelism computes (the depth group is the data group).
//
// A core::StageModel through core::GridModel (a pipeline stage's blocks in `slots` activation
// sets, its own parameter store); the stage boundary is this rank's R x c block of the residual
// stream, which the same grid position of the neighbouring stage holds.
// Not here (yet): ZeRO 3 (parameters are never gathered), sequence parallelism (the config
// refuses them with mode 2d/2.5d). model.fused_attention runs
// (GridModel::attention_core_forward). colossal_train builds this model for
// parallel.tensor.mode 2d and 2.5d (apps/trainer.cpp); tests/test_model2d.cpp drives it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/gemm.hpp"
#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/sharded_detail.hpp"
#include "core/grid_model.hpp"
#include "core/tensor2d.hpp"

namespace colossal::core {

class Model2D final : public GridModel {
 public:
  // Buffers for micro-batches of exactly `batch` sequences of `seq_len` tokens (batch % q == 0,
  // heads, hidden and ffn_hidden multiples of q; throws naming the value otherwise).
  // `depth` (2.5D): the ranks at this grid position in the other depth layers; null for 2D.
  // `keep`: activation checkpointing at block granularity (sharded::BlockRecompute): a dropped
  // block's activations live in a recompute arena (temporaries) and are rebuilt in backward.
  // `selective`: the kept blocks' attention probabilities share one block's buffer
  // (temporaries) and are rebuilt from q|k|v before each block's attention backward.
  Model2D(const ModelSpec& spec, int batch, int seq_len, Grid2D& grid, Gemm& gemm,
          MemoryTracker& tracker, TensorGroup* depth = nullptr, std::size_t unit_multiple = 16,
          const std::vector<Keep>& keep = {}, bool selective = false,
          const StoreFactory& make_store = {}, StageRange stage = {}, int slots = 1,
          std::size_t first_unit_floats = 0);

  // The values the single-rank model draws for the same seed (keyed by logical element).
  void init_parameters(uint64_t seed) override;

  // tokens and targets: this layer's micro-batch (batch x seq_len), the same on every rank of the
  // grid. Returns the mean loss over its tokens and those of the other depth layers (identical
  // on every rank); with grad_scale != 0 the logits keep grad_scale * (softmax - onehot) for
  // backward (1/(depth * batch * seq_len) for the mean).
  double forward(const int32_t* tokens, const int32_t* targets, int batch, float grad_scale,
                 int slot = 0) override;
  // Accumulates this micro-batch's gradients into grads().
  void backward(const int32_t* tokens, int batch, int slot = 0) override;
  // Once per optimizer step, before the norm and the update: sums every gradient over the depth
  // (2.5D), then those of the parameters replicated down the grid column over it.
  void reduce_gradients() override;
  // 2.5D: each depth layer takes its own micro-batch.
  int batch_replicas() const override;
  int batch_replica() const override;
  // This rank's part of the global sum of squared gradients: every element once over the grid
  // (replicated parameters counted on grid row 0 only). Sum it over all ranks.
  double gradient_sum_squares() const override;
  std::vector<std::pair<std::size_t, std::size_t>> norm_ranges() const override;

  // logical_runs(): padding (vocabulary and position rows past the logical ones) has no run;
  // replicated parameters have runs on every grid row and depth layer. The owner of an element is
  // depth layer 0, and for a replicated parameter grid row 0 of it; of the tied token
  // embedding, the first pipeline stage (the last stage's copy has runs, not owned).

  int local_rows() const { return rows_; }

  // Closed forms, per rank, in floats. Parameters: Vp/q c + Pp/q c + L (3c^2 + c^2 + 2 c f) in
  // weight blocks and L (4c + 3c + c + f + c) + 2c replicated, each tensor 16-float aligned.
  // Activations kept: L (8 R c + 4 R + (B/q)(H/q) T^2 + 2 R f) + 2 R c + 3 R + R Vp/q.
  // Per parameter unit (unit 0 the embeddings and replicated vectors, 1 + l block l's weight
  // blocks), each padded to `unit_multiple` floats; parameter_floats is their sum, the store's
  // flat size.
  // A pipeline `stage` holds its blocks, the token embedding when it embeds or has the (tied)
  // head, the positions when it embeds, the final layernorm with the head; activation_floats
  // are one slot's (a stage without the head keeps its R x c output in place of the head's).
  static std::vector<std::size_t> unit_floats(const ModelSpec& spec, int q,
                                              std::size_t unit_multiple = 16,
                                              StageRange stage = {},
                                              std::size_t first_unit_floats = 0);
  static std::size_t parameter_floats(const ModelSpec& spec, int q,
                                      std::size_t unit_multiple = 16, StageRange stage = {});
  static std::size_t activation_floats(const ModelSpec& spec, int batch, int seq_len, int q,
                                       StageRange stage = {});
  // Temporaries (the step's scratch: SUMMA / cube work, the embedding's whole-batch columns,
  // gradient buffers, one batch row of score gradients or, under model.fused_attention, the
  // fused tiles' work: grid_attention_work_floats; one weight block's gradient).
  static std::size_t temporary_floats(const ModelSpec& spec, int batch, int seq_len, int q);

  // Payload floats one forward + backward moves in each group (all-gathers count their output,
  // reduce-scatters their input, as the communicator's counters do). For a linear [in, out] over
  // BT token rows: forward SUMMA broadcasts BT in / q along the row and in out / q down the
  // column; backward's input gradient all-gathers in out / q down the column and reduce-scatters
  // BT in / q along the row, its weight gradient all-gathers BT in / q along the row and
  // reduce-scatters in out / q down the column. Each layernorm all-reduces 2R along the row
  // forward and 2R backward; the cross-entropy R (max) and 2R (sums). The tied head is a linear
  // [C, Vp] run as A B^T forward (column all-gather Vp C / q, row reduce-scatter BT Vp / q) and
  // A B / A^T B backward. The embedding reduce-scatters BT c down the column and all-gathers it
  // back in backward; the loss is one float down the column.
  struct Communication {
    double row_broadcast = 0, row_all_gather = 0, row_reduce_scatter = 0, row_all_reduce = 0;
    double col_broadcast = 0, col_all_gather = 0, col_reduce_scatter = 0, col_all_reduce = 0;
  };
  static Communication step_communication(const ModelSpec& spec, int batch, int seq_len, int q,
                                          StageRange stage = {});

 private:
  bool owns(std::size_t local) const;  // sets LogicalRun::owned
  // The ranges each element of one grid is counted in once (replicated vectors on row 0).
  std::vector<std::pair<std::size_t, std::size_t>> grid_ranges() const;
  struct Linear {
    std::size_t w = 0, b = 0;  // offsets of the weight block (in x out) and the bias block
    int64_t in = 0, out = 0;   // logical sizes
  };
  struct Block {
    std::size_t ln1_w, ln1_b, ln2_w, ln2_b;
    Linear qkv, proj, fc, fc2;
  };

  // This rank's vocabulary and position rows: [v0, v0 + vb) and [p0, p0 + pb); the position of
  // token t is row t + offset.
  struct EmbeddingRows {
    int64_t v0, vb, p0, pb, offset;
  };
  EmbeddingRows embedding_rows() const;
  static sharded::ScratchSizes scratch_sizes(const ModelSpec& spec, int batch, int seq_len,
                                             int q);
  void map_runs();
  void block_forward(int l);  // block l from layer_acts_[l].x into the next block's input
  void linear_forward(const Linear& lin, const float* in, float* out);
  void linear_backward(const Linear& lin, const float* in, const float* dout, float* din);
  void activation_forward(float* out, const float* in, int64_t n);
  void activation_backward(float* din, const float* in, const float* dout, int64_t n);

  int seq_len_, q_, i_, j_;
  int64_t rows_, c_, f_, vocab_block_, position_block_;
  Grid2D& grid_;
  TensorGroup* depth_;
  Gemm& gemm_;
  std::size_t replicated_begin_ = 0, replicated_end_ = 0;  // unit 0's column-replicated region
  std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<Block> blocks_;
  DeviceArray<float> scratch_;
  sharded::Scratch s_{};  // the step's temporaries (core/sharded_detail.hpp)
};

}  // namespace colossal::core
