// The GPT-2 / OPT transformer under 3D tensor parallelism (Bian et al. 2021) on a q x q x q cube
// (core/tensor3d.hpp), written out layer by layer like core::Model and core::Model2D.
//
// Two activation layouts alternate (c = C/q, R = B*T/q^2 token rows per rank):
//   X layout  rows block i q + j of q^2, columns block l: the residual stream, layernorms, the
//             input of q|k|v, the first MLP linear and the LM head, the output of the attention
//             projection and of the second MLP linear
//   Y layout  rows block i q + l, columns block j: the output of q|k|v, the first MLP linear and
//             the LM head (attention, the activation function and the cross-entropy run here)
// Linears from X to Y run on the cube (input, weight, output); linears from Y back to X on the
// cube with the input and output groups exchanged, so no activation is ever redistributed.
// Weights are blocks [in/q x out/q^2] (1/q^3 per rank); q|k|v columns are regrouped as in 2D so
// that columns block j holds whole heads (attention is local: B/q^2 sequences x H/q heads).
// The tied embedding is the LM head's weight block (vocabulary block j q + i, hidden block l),
// looked up by a reduce-scatter over the plane of the q^2 ranks sharing l. Biases of Y-layout
// outputs are replicated over the plane sharing j, those of X-layout outputs and the layernorms
// over the plane sharing l; reduce_gradients sums them there.
//
// A core::StageModel through core::GridModel (a pipeline stage's blocks in `slots` activation
// sets, its own parameter store); the stage boundary is this rank's R x c block of the residual
// stream (X layout), which the same cube position of the neighbouring stage holds.
// Not here (yet): ZeRO 3 (parameters are never gathered), sequence parallelism (the config
// refuses them with mode 3d). model.fused_attention runs
// (GridModel::attention_core_forward). colossal_train builds this model for
// parallel.tensor.mode 3d (apps/trainer.cpp); tests/test_model3d.cpp drives it alone.
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
#include "core/tensor3d.hpp"

namespace colossal::core {

class TensorGroup;

// The cube's groups for a model: the three axes and the two planes the replicated parameters
// and the embedding use. Rank (i, j, l).
struct Cube3DGroups {
  TensorGroup& input;    // (i, *, l), by j
  TensorGroup& weight;   // (*, j, l), by i
  TensorGroup& output;   // (i, j, *), by l
  TensorGroup& plane_l;  // (*, *, l), by i q + j
  TensorGroup& plane_j;  // (*, j, *), any order
};

class Model3D final : public GridModel {
 public:
  // batch % q^2 == 0, hidden and ffn_hidden multiples of q^2, heads of q (throws naming the
  // value and the nearest valid ones otherwise). `keep` and `selective`: activation checkpointing
  // as in Model2D.
  Model3D(const ModelSpec& spec, int batch, int seq_len, Cube3DGroups& groups, Gemm& gemm,
          MemoryTracker& tracker, std::size_t unit_multiple = 16,
          const std::vector<Keep>& keep = {}, bool selective = false,
          const StoreFactory& make_store = {}, StageRange stage = {}, int slots = 1,
          std::size_t first_unit_floats = 0);

  void init_parameters(uint64_t seed) override;  // the single-rank model's values
  // tokens, targets: the whole micro-batch, the same on every rank; returns its mean loss.
  double forward(const int32_t* tokens, const int32_t* targets, int batch, float grad_scale,
                 int slot = 0) override;
  void backward(const int32_t* tokens, int batch, int slot = 0) override;
  // Sums the replicated parameters' gradients over their planes (once per optimizer step).
  void reduce_gradients() override;
  // This rank's part of the global sum of squared gradients (every element once over the cube).
  double gradient_sum_squares() const override;
  std::vector<std::pair<std::size_t, std::size_t>> norm_ranges() const override;


  // Closed forms, per rank, in floats (c = C/q, f = F/q, R = B T / q^2, Vp and Pp padded to
  // q^2). Parameters: c Vp/q^2 + Pp/q^2 c + L (c 3c/q + c c/q + c f/q + f c/q) in weight blocks,
  // L (3c + f) replicated over the plane sharing j, L 6c + 2c over the plane sharing l, each
  // tensor 16-float aligned. Activations kept: L (8 R c + 4 R + (B/q^2)(H/q) T^2 + 2 R f) +
  // 2 R c + 3 R + R Vp/q.
  // Per parameter unit (unit 0 the embeddings and replicated vectors, 1 + l block l's weight
  // blocks), each padded to `unit_multiple` floats; parameter_floats is their sum, the store's
  // flat size. A pipeline `stage` as in Model2D (its blocks; the token embedding on the first
  // and last stage, positions on the first, the final layernorm on the last; activation_floats
  // are one slot's, a stage without the head keeping its R x c output).
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
  // Payload floats of one forward + backward in each group (all-gathers count their output,
  // reduce-scatters their input). A linear [K, N] over M = B T rows on a cube moves, forward,
  // an all-gather of M K / q^2 in its input group and of K N / q^2 in the weight group and a
  // reduce-scatter of M N / q^2 in its output group; backward the all-gather of M N / q^2 in the
  // output group and reduce-scatters of M K / q^2 (input) and K N / q^2 (weight), after
  // gathering the saved input and weight blocks again (nothing gathered is kept). q|k|v, the
  // first MLP linear and the head run on the cube (input = input group), the projection and the
  // second MLP linear on the swapped cube (input = output group). Layernorms all-reduce 2R
  // forward and 2R backward in the output group; the cross-entropy 3R in the input group; the
  // loss one float in the output and the weight groups; the embedding reduce-scatters B T c over
  // the plane sharing l and all-gathers it back in backward.
  struct Communication {
    double input_all_gather = 0, input_reduce_scatter = 0, input_all_reduce = 0;
    double weight_all_gather = 0, weight_reduce_scatter = 0, weight_all_reduce = 0;
    double output_all_gather = 0, output_reduce_scatter = 0, output_all_reduce = 0;
    double plane_all_gather = 0, plane_reduce_scatter = 0;
  };
  static Communication step_communication(const ModelSpec& spec, int batch, int seq_len, int q,
                                          StageRange stage = {});

 private:
  // Sets LogicalRun::owned: replicated vectors on the plane's rank 0, the tied token embedding
  // on the first pipeline stage.
  bool owns(std::size_t local) const;
  struct Linear {
    std::size_t w = 0, b = 0;
    int64_t in = 0, out = 0;
    bool to_y = true;  // X -> Y on the cube; false: Y -> X on the swapped cube
  };
  struct Block {
    std::size_t ln1_w, ln1_b, ln2_w, ln2_b;
    Linear qkv, proj, fc, fc2;
  };

  static sharded::ScratchSizes scratch_sizes(const ModelSpec& spec, int batch, int seq_len,
                                             int q);
  void map_runs();
  void block_forward(int l);  // block l from layer_acts_[l].x into the next block's input
  Cube3D& cube(const Linear& lin) { return lin.to_y ? first_ : second_; }
  void linear_forward(const Linear& lin, const float* in, float* out);
  void linear_backward(const Linear& lin, const float* in, const float* dout, float* din);

  int seq_len_, q_, i_, j_, l_;
  int64_t rows_, c_, f_, vocab_block_, position_block_;
  Cube3DGroups& groups_;
  Cube3D first_, second_;
  Gemm& gemm_;
  // Unit 0's replicated regions, in this order: [plane_j_begin_, plane_l_begin_) over the plane
  // sharing j, [plane_l_begin_, plane_l_end_) over the plane sharing l.
  std::size_t plane_j_begin_ = 0, plane_l_begin_ = 0, plane_l_end_ = 0;
  std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
  std::vector<Block> blocks_;
  DeviceArray<float> scratch_;
  sharded::Scratch s_{};  // the step's temporaries (core/sharded_detail.hpp)
};

}  // namespace colossal::core
