// Pieces core::Model2D and core::Model3D share (internal to core/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/keep.hpp"
#include "core/model_spec.hpp"
#include "core/stage_model.hpp"
#include "core/tensor_mode.hpp"

namespace colossal::core::sharded {

// Checks a micro-batch of `batch` sequences of `seq_len` tokens against a grid of side q in
// `mode` (2d, 2.5d or 3d): micro_batch, hidden and ffn_hidden multiples of
// tensor_grid_multiple(mode, q), heads of q, seq_len <= max_seq. Throws invalid_argument
// "<key> = <value> must be a multiple of <m> for 2D tensor parallelism (nearest: a or b)".
// (model.arch llama is refused: the grid models run gpt2 and opt.)
void require_grid_shape(const ModelSpec& spec, int batch, int seq_len, TensorMode mode, int q);

// n rounded up to 16 floats (every local tensor starts 64-byte aligned).
constexpr std::size_t aligned16(std::size_t n) { return (n + 15) / 16 * 16; }
// n rounded up to a multiple of m (a parameter unit's padding).
constexpr std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }
// The blocks of a pipeline stage (layer_end -1: through the last).
inline int stage_blocks(const ModelSpec& spec, const StageRange& stage) {
  return (stage.layer_end < 0 ? spec.layers : stage.layer_end) - stage.layer_begin;
}
// The end of a local table's flat layout (16-float aligned), where the next tensor starts.
std::size_t table_end(const std::vector<ParamSpec>& table);
// Appends a local tensor of `count` floats at table_end (or `at_least`, where a parameter unit
// starts) in parameter unit `unit`, and returns its offset.
std::size_t append_param(std::vector<ParamSpec>& table, const std::string& name, ParamRole role,
                         std::size_t count, std::size_t at_least = 0, int unit = 0);

// out[n, e] += bias[e] over `rows` rows of `cols`.
void add_bias_rows(float* out, const float* bias, int64_t rows, int64_t cols);

// Appends local element `local` -> element `logical` of tensor `tensor`, extending the last run
// when both sides continue it.
void append_element(std::vector<LogicalRun>& runs, std::size_t local, int tensor,
                     std::size_t logical);

// The single-rank model's initial values (core::Model::init_parameters) at the runs' elements,
// into the device buffer `params` of `size` floats (zero elsewhere).
void init_from_runs(float* params, std::size_t size, const std::vector<LogicalRun>& runs,
                    const ModelSpec& spec, uint64_t seed);

// What one block keeps for backward, R token rows of c (or 3c, f) local columns: the input, ln1
// and its statistics, q|k|v, the attention probabilities (`att` floats; the fused attention's
// log-sum-exp of each row), the attention output,
// the residual after attention, ln2 and its statistics, the MLP's pre- and post-activation.
struct LayerActs {
  float *x, *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *xmid, *ln2, *ln2_mean, *ln2_rstd,
      *h, *a;
};
constexpr int64_t layer_act_floats(int64_t R, int64_t c, int64_t f, int64_t att) {
  return 5 * R * c + 3 * R * c + 4 * R + att + 2 * R * f;
}
// Points `a` into [cursor, cursor + layer_act_floats) and returns the end.
float* carve_layer(LayerActs& a, float* cursor, int64_t R, int64_t c, int64_t f, int64_t att);

// Activation checkpointing at block granularity (core/keep.hpp's schedule, two ops a block):
// a block keeps everything (all, all), starts a recomputed segment (input, none) or continues
// one (none, none; after a kept block, or as block 0, it starts one). start[b] is the first
// block of b's segment, -1 for a kept block; `longest` the most blocks in one segment. A segment
// keeps only its first block's input; backward runs the segment's forward again, into an arena
// of `longest` block sets, before its blocks' backward. Throws invalid_argument naming
// checkpointing.policy for a schedule that splits a block (these models recompute whole blocks).
// `selective` (checkpointing.policy: selective): the kept blocks' attention probabilities share
// one block's buffer (a temporary) and backward recomputes each from the kept q|k|v.
struct BlockRecompute {
  std::vector<int> start;
  int longest = 0;
  bool selective = false;
  bool dropped(int b) const { return start[std::size_t(b)] >= 0; }
  int dropped_blocks() const {
    int n = 0;
    for (int s : start) n += s >= 0 ? 1 : 0;
    return n;
  }
  // selective: backward rebuilds block b's probabilities (a kept block; a dropped one's come
  // back with its segment).
  bool rebuilds_probabilities(int b) const { return selective && !dropped(b); }
  // The segment's last block: backward recomputes the segment on reaching it.
  bool segment_end(int b) const {
    return dropped(b) && (b + 1 == int(start.size()) || start[std::size_t(b) + 1] != start[std::size_t(b)]);
  }
};
// `block0`: the model's index of block 0 (for messages).
BlockRecompute block_recompute(const std::vector<Keep>& keep, int layers, bool selective = false,
                               int block0 = 0);
// The same for a pipeline stage's blocks, from `keep` over the whole model's ops (empty: keep
// all); the stage's first block starts a segment. Under model.fused_attention `selective` is
// dropped (the blocks keep no probabilities).
BlockRecompute stage_recompute(const std::vector<Keep>& keep, const ModelSpec& spec,
                               const StageRange& stage, bool selective = false);
// Points every block's activations: kept blocks at `kept` (advanced past them and returned; when
// selective, their probabilities at `selective_att`), dropped ones at their slot of `arena`,
// segment starts with their input x at `kept`.
float* carve_blocks(std::vector<LayerActs>& acts, const BlockRecompute& plan, float* kept,
                    float* arena, int64_t R, int64_t c, int64_t f, int64_t att,
                    float* selective_att = nullptr);

// One activation slot's floats after a grid model's blocks (R x c rows and columns of the
// residual stream): the stage's output x_final and, on the stage with the head, the final
// layernorm, its row statistics, this rank's `logits` floats and the token losses.
struct HeadActs {
  float *x_final = nullptr, *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr,
        *logits = nullptr, *losses = nullptr;
};
constexpr int64_t head_act_floats(int64_t R, int64_t c, int64_t logits, bool head) {
  return head ? 2 * R * c + 3 * R + logits : R * c;
}
float* carve_head(HeadActs& h, float* cursor, int64_t R, int64_t c, int64_t logits, bool head);

// Temporaries of a step: the products' work (`work` floats), the embedding's whole-batch columns
// (BT x c), gradient buffers (R x c three times, R x 3c, R x f), one batch row of attention-score
// gradients (`datt`), one weight block's gradient (`dweight`) and 3R of reduction work.
struct Scratch {
  float *work, *embed, *dx, *dln, *datty, *dqkv, *dh, *datt, *dweight, *ln_work;
};
constexpr int64_t scratch_floats(int64_t work, int64_t BT, int64_t R, int64_t c, int64_t f,
                                 int64_t datt, int64_t dweight) {
  return work + BT * c + 3 * R * c + 3 * R * c + R * f + datt + dweight + 3 * R;
}
struct ScratchSizes {
  int64_t work, datt, dweight, total;
};
Scratch carve_scratch(float* cursor, int64_t work, int64_t BT, int64_t R, int64_t c, int64_t f,
                      int64_t datt, int64_t dweight);

}  // namespace colossal::core::sharded
