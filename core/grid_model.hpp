// What core::Model2D (2D, 2.5D) and core::Model3D (3D) share as StageModels: a pipeline stage's
// blocks (the whole model, or a part of it) with `slots` activation sets, micro-batches of the
// one size the buffers were built for, and their parameters and gradients in a parameter store
// of their own over the units their constructors lay out: unit 0 the stage's embeddings (the
// token embedding first, on the first and the last stage: the tied LM head) and every vector
// replicated inside the tensor group (biases, layernorms: the regions reduce_gradients sums),
// unit 1 + b the stage's block b's weight blocks, each padded to `unit_multiple` floats. The
// store is a FullParameterStore, or what the `make_store` factory returns (ZeRO 2:
// zero::ShardedParameterStore, which reduce-scatters each unit's gradients over the data ranks
// as backward finishes it). A stage's boundary (what the pipeline sends between stages) is this
// rank's block of the residual stream, R x c: the same tensor rank of the next stage holds the
// same block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/gemm.hpp"
#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/parameter_store.hpp"
#include "core/sharded_detail.hpp"
#include "core/stage_model.hpp"
#include "core/tensor_mode.hpp"

namespace colossal::core {

// One transformer block's activations on each rank of a 2d / 2.5d grid or a 3d cube, in floats
// (sharded::layer_act_floats: R token rows of c = C/q columns, R = B*T/q in 2d and 2.5d, B*T/q^2
// in 3d): `set`, what a kept block holds; `input`, its input x (R x c), all that the first block
// of a recomputed segment keeps; `att`, its attention probabilities (in the set), which selective
// checkpointing keeps for one block only, or under model.fused_attention each row's log-sum-exp
// (B/q or B/q^2 sequences x H/q heads x T: linear in T; selective then has nothing to drop). What
// Model2D / Model3D allocate from and the planner costs from.
struct GridBlockFloats {
  int64_t set = 0, input = 0, att = 0;
};
GridBlockFloats grid_block_floats(const ModelSpec& spec, TensorMode mode, int batch, int seq_len,
                                  int q);
// What a checkpoint schedule makes of the blocks, in floats: `kept` in the activations buffer
// (a kept block's set, less its probabilities when selective; a segment's first input), and
// among the temporaries the recompute `arena` (the longest segment's sets) and `selective`'s one
// block of probabilities (when some block is kept). The models allocate it; the planner costs it.
struct GridActivationFloats {
  int64_t kept = 0, arena = 0, selective = 0;
};
GridActivationFloats grid_activation_floats(const sharded::BlockRecompute& plan,
                                            const GridBlockFloats& block);
// The attention's work buffer of a block's backward (sharded::ScratchSizes::datt), shared by
// the blocks: one sequence's score gradients (H/q x T x T), or under model.fused_attention the
// fused kernels' tile work (fused_attention_work_floats, whatever T is).
int64_t grid_attention_work_floats(const ModelSpec& spec, int seq_len, int q);
// The floor on unit 0 of `stage` (ModelOptions::grid_first_unit_floats): under ZeRO 2, on a
// stage of several that holds the tied token embedding (the first or the last), the whole
// model's unit 0 (every stage's is smaller), so that the first and the last stage's unit 0 have
// one size, their data ranks' slices cover the same floats, and the token embedding's gradients
// (the first floats on both) are summed slice by slice. A few MiB at most (the position
// embedding and the replicated vectors of the other stages' blocks); 0 elsewhere.
std::size_t grid_first_unit_floats(const ModelSpec& spec, TensorMode mode, int q,
                                   std::size_t unit_multiple, const StageRange& stage,
                                   int zero_stage);

class GridModel : public StageModel {
 public:
  const ModelSpec& spec() const override { return spec_; }
  void zero_grad() override { store_->zero_gradients(); }

  bool fixed_batch() const override { return true; }

  // The stage's boundary buffers (std::logic_error when the model is one whole stage).
  const StageRange& stage() const override { return stage_; }
  int slots() const override { return slots_; }
  int64_t stage_floats(int batch) const override;
  float* stage_input(int slot) override;
  const float* stage_output(int slot) override;
  float* output_gradient() override;
  const float* input_gradient() const override;

  ParameterStore& store() override { return *store_; }
  const std::vector<ParamSpec>& parameters() const override { return table_; }
  std::size_t flat_size() const override { return store_->flat_size(); }
  // Nothing: every product of the grid layouts takes its weight blocks from a copy, a broadcast
  // or an all-gather into work buffers (SUMMA, the 3D cube), never from the flat buffer, so a
  // bf16 copy of the weights would be memory no product reads.
  std::size_t held_floats() override { return 0; }
  const std::vector<LogicalRun>& logical_runs() const override { return runs_; }

  // The local flat buffers: parameters whole in every store; gradients whole in a
  // FullParameterStore (nullptr when sharded).
  float* params() { return store_->full_params(); }
  float* grads() { return store_->full_grads(); }
  const float* params() const { return store_->full_params(); }
  const float* grads() const { return store_->full_grads(); }
  // This rank's part of the global sum of squared gradients: every element once per copy of the
  // model (one grid in 2D and 3D, one depth layer's grid in 2.5D). Sum it over the tensor group.
  // Whole gradients only (a FullParameterStore).
  virtual double gradient_sum_squares() const = 0;
  // The [begin, end) ranges of the gradient buffer this rank counts in the global norm, so that
  // every element is counted once over the whole tensor group (2.5D: depth layer 0's grid):
  // zero::GradientSync sums their squares over the tensor group.
  virtual std::vector<std::pair<std::size_t, std::size_t>> norm_ranges() const = 0;
  // The floats at the start of unit 0 that hold the token embedding on the first and the last
  // stage of a pipeline (the tied LM head): what zero::GradientSync sums over the two; 0 on a
  // stage without it.
  std::size_t tied_floats() const { return tied_floats_; }

 protected:
  // `stage`: this pipeline stage's blocks (layer_end -1: through the last), whether it embeds
  // and whether it holds the head; `slots` activation sets (micro-batches in flight).
  GridModel(const ModelSpec& spec, int batch, std::size_t unit_multiple, StageRange stage = {},
            int slots = 1);
  // The stage's blocks [first_block(), first_block() + blocks()) of the whole model.
  int first_block() const { return stage_.layer_begin; }
  int blocks() const {
    return (stage_.layer_end < 0 ? spec_.layers : stage_.layer_end) - stage_.layer_begin;
  }
  // Lays out a local tensor in the current unit (table_) and returns its offset.
  std::size_t append_param(const std::string& name, ParamRole role, std::size_t count);
  // Ends the current unit: its end padded to unit_multiple floats; the next tensor starts there.
  // `at_least`: the unit's floats before the padding (a floor; 0: none).
  void end_unit(std::size_t at_least = 0);
  // After the constructor has laid out table_ in units: the store over them (`make_store`, or
  // a FullParameterStore), both buffers zero.
  void make_store(MemoryTracker& tracker, const StoreFactory& make_store);
  // Backward's gradients, unit by unit through the store: open_gradients(u) before writing unit
  // u's, close_gradients(u) once backward has finished them for this micro-batch; grad(offset)
  // is where flat element `offset` of an open unit accumulates (unit 0 and one block unit may be
  // open at once, as ParameterStore allows).
  void open_gradients(int unit);
  void close_gradients(int unit);
  float* grad(std::size_t offset) const;
  // This rank's reduced gradients of the flat range [begin, end) (ParameterStore::
  // gradient_pieces): what reduce_gradients sums over the grid's sub-groups.
  std::vector<std::pair<float*, std::size_t>> gradient_pieces(std::size_t begin,
                                                              std::size_t end) {
    return store_->gradient_pieces(begin, end);
  }
  // Activation checkpointing's block activations (`keep`, per op of the whole model; `selective`:
  // sharded::BlockRecompute over the stage's blocks): the activations buffer holds, for each
  // slot, the kept sets (grid_activation_floats) and then the stage's output and head
  // (sharded::head_act_floats with this rank's `logits` floats); the temporaries the recompute
  // arena and selective's probabilities (shared by the slots: one backward runs at a time).
  // recompute_plan_, the slots' block activations (R x c, f local columns) and heads point into
  // them; use_slot(0) is selected.
  void allocate_activations(MemoryTracker& tracker, const GridBlockFloats& block,
                            const std::vector<Keep>& keep, bool selective, int64_t R, int64_t c,
                            int64_t f, int64_t logits);
  // A block's attention core on this rank's B sequences and H heads (c = H x head size columns of
  // q|k|v): model.fused_attention's (A.att the rows' log-sum-exp; the tensor-core kernels need
  // q/k/v in bf16, which the grid models keep in fp32, so a GPU runs the fp32 team kernels) or
  // the dense one (A.att the probabilities). `work`: grid_attention_work_floats (backward's
  // score gradients, or the fused tiles' work in both directions).
  void attention_core_forward(Gemm& gemm, sharded::LayerActs& A, float* work, int B, int T,
                              int c, int H);
  void attention_core_backward(Gemm& gemm, float* dqkv, float* work, const float* datty,
                               const sharded::LayerActs& A, int B, int T, int c, int H);
  // Makes layer_acts_ and head_ slot `slot`'s (after check_micro_batch).
  void use_slot(int slot) {
    layer_acts_ = slot_acts_[std::size_t(slot)];
    head_ = heads_[std::size_t(slot)];
  }
  // The running gradient of the residual stream (R x c): on a stage of a pipeline, what backward
  // starts from without the head and ends with without embeddings (output_gradient(),
  // input_gradient()); each slot's R x c output (head_.x_final) is the stage's output.
  void set_stage_gradient(float* gradient) { gradient_ = gradient; }
  void set_tied_floats(std::size_t n) { tied_floats_ = n; }
  // Where the tensors end (the store's padding follows): what the reductions cover.
  std::size_t params_end() const { return params_end_; }
  // Throws std::invalid_argument unless `batch` is the built micro-batch and `slot` one of the
  // model's slots.
  void check_micro_batch(int batch, int slot) const;

  ModelSpec spec_;
  int batch_;
  std::vector<ParamSpec> table_;
  std::vector<LogicalRun> runs_;
  sharded::BlockRecompute recompute_plan_;
  std::span<sharded::LayerActs> layer_acts_;  // the current slot's (use_slot)
  sharded::HeadActs head_;                      // the current slot's

 private:
  // Throws std::logic_error on a model built as one whole stage (no boundary).
  void require_boundary() const;
  StageRange stage_{};
  int slots_ = 1;
  std::vector<std::vector<sharded::LayerActs>> slot_acts_;
  std::vector<sharded::HeadActs> heads_;
  int64_t boundary_floats_ = 0;  // R x c
  float* gradient_ = nullptr;
  std::size_t tied_floats_ = 0;
  std::size_t params_end_ = 0;
  std::size_t unit_multiple_;
  std::vector<std::size_t> unit_ends_;  // where each unit ends, padding included
  std::unique_ptr<ParameterStore> store_;
  DeviceArray<float> acts_;           // kept block activations, then the head's
  DeviceArray<float> recompute_;      // the activations of the segment being recomputed
  DeviceArray<float> selective_att_;  // selective: one kept block's attention probabilities
  float* open_[2] = {nullptr, nullptr};  // open gradient buffers: unit 0, one block unit
  int open_unit_ = -1;                   // the open block unit
};

// The grid layouts' embedding blocks (2D, 2.5D, 3D). A rank holds token rows [v0, v0 + vb) of
// wte, element (row, s) at wte[row * rs + s * cs] (2D: (c, 1); 3D's hidden x vocabulary block:
// (1, vb)), and position rows [p0, p0 + pb) of wpe, (pb, c) row-major; position n % T + offset.
// Forward: out (BT, c) = the rows it holds of each token's and position's embedding, zero for
// the others. Backward: accumulates dout (BT, c) into the rows it holds, each element receiving
// its positions in increasing order (deterministic). The team forms
// (core/grid_kernels_team.hpp) where the kernels take them (team_kernels_v), else one work item
// per token row (forward) or per column (backward).
void grid_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t rs,
                            int64_t cs, const float* wpe, int64_t BT, int T, int64_t c,
                            int64_t v0, int64_t vb, int64_t offset, int64_t p0, int64_t pb);
void grid_embedding_backward(float* dwte, int64_t rs, int64_t cs, float* dwpe, const float* dout,
                             const int32_t* tokens, int64_t BT, int batch, int T, int64_t c,
                             int64_t v0, int64_t vb, int64_t offset, int64_t p0, int64_t pb);

}  // namespace colossal::core
