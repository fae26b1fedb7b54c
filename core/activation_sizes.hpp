// The activation-size table of core::Model, after llm.c's fill_in_activation_sizes: the floats of
// every tensor one micro-batch saves for backward on one rank (per block and for the head) and
// of the temporaries backward shares, for a model spec and a rank's share of the work (micro-
// batch, local sequence, tensor size, sequence_split, ring size; fused attention comes with the
// spec). stage_activations applies a pipeline stage and an activation-checkpoint schedule to it:
// what each micro-batch slot keeps, the recompute arena and the selective buffer.
//
// core::Model carves its buffers from this table and planner::build_step_graph (hence the cost
// model and the checkpoint solvers' chains) reads its saved and temporary bytes from it, so what
// is predicted and what is allocated cannot disagree. Sizes are floats; the planner multiplies
// them by the bytes of its activation type.
#pragma once

#include <cstddef>
#include <vector>

#include "core/keep.hpp"
#include "core/model_spec.hpp"

namespace colossal::core {

// Floats of logits computed at a time (ActivationSizes::head_in_forward): as many rows as fit,
// at least one. On a CPU 256 rows of gpt2-124m's padded vocabulary (50304), 51 MB: each chunk's
// weight-gradient product (V x C += chunk^T x lnf) reads and writes the whole V x C gradient,
// which 128 rows made memory-bound (gpt2-124m B=4 T=256 on 2 AMX cores, tokens/s: bf16 670 at
// 128 rows, 736 at 256, 739 at 512; fp32 within noise of the unchunked 334 from 256 rows up),
// while a small vocabulary takes all its rows in one chunk (the quickstart's 256 entries: chunks
// of 256 of its 2048 rows cost 15% of its fp32 step in small products). On a GPU 2048 such rows
// (one product of 128 rows by V = 50257 leaves most of an H200's SMs idle), 0.4 GB.
constexpr std::size_t kLogitsChunkFloats = std::size_t(256) * 50304;
constexpr std::size_t kDeviceLogitsChunkFloats = std::size_t(2048) * 50304;

// Row stride of that chunk: the vocabulary rounded up to 64 floats, so every row of the logits
// and of their bf16 gradient starts 256 (128) bytes aligned. GPT-2's 50257 is odd: with rows of
// 50257 cuBLAS cannot take its tensor-core kernels' aligned loads (an H200 ran the LM head's
// products at 94-130 TFLOP/s against 265-466 on the blocks' shapes; llm.c and nanoGPT pad the
// vocabulary to 50304 for the same reason). The padded columns are never computed or read.
constexpr std::size_t kLogitsRowAlign = 64;

// One rank's share of a micro-batch: what sets the size of every activation.
struct ActivationShape {
  int batch = 1;                // sequences per micro-batch (buffers hold the largest)
  int seq_len = 1;              // this rank's tokens of each sequence (its chunk under a ring)
  int tensor = 1;               // 1D tensor-parallel ranks: heads, MLP width, vocabulary split
  bool sequence_split = false;  // residual-stream rows split over the tensor ranks (tensor > 1)
  int ring = 1;                 // ring self-attention ranks: each query sees seq_len * ring keys
  // train.precision: bf16 on the host: the activations whose only readers are matrix products
  // stored as bfloat16. Those products round them to bf16 anyway, so the step is bitwise the same
  // in half their memory: the norm outputs ln1, ln2 and lnf (not under sequence_split, whose
  // gathers move them in fp32), q/k/v and, with unfused attention, the attention output (neither
  // under a ring, which sends them in fp32; fused attention's backward reads its output
  // element-wise), and the chunk of the logits' gradient the LM head's products read
  // (ActivationSizes::head_in_forward). ActivationSizes says which apply.
  bool bf16_operands = false;
  // And the attention probabilities (unfused, no ring), which the softmax backward reads
  // element-wise: not exact (that backward sees them rounded to bf16), the rest of mixed
  // precision's activation memory.
  bool bf16_probabilities = false;
  std::size_t logits_chunk_floats = kLogitsChunkFloats;  // kDeviceLogitsChunkFloats on a GPU
  std::size_t logits_chunk_rows = 0;  // > 0: exactly this many rows per chunk (tests)
};

// Floats of each tensor of one micro-batch on one rank. B batch, T local tokens, C hidden,
// H/t heads, C/t and F/t their widths, V/t the padded vocabulary rows, r = 1 or t the split of
// the residual-stream rows under sequence_split, S the ring size.
struct ActivationSizes {
  // Saved by each block. `residual` is the residual stream between sub-layers: the input of the
  // attention sub-layer (and the stage's output after the last block) and `mid`, the input of
  // the MLP sub-layer, each saved by the sub-layer that produced it.
  std::size_t residual = 0;                         // (B,T,C)/r
  std::size_t ln1 = 0, ln1_mean = 0, ln1_rstd = 0;  // (B,T,C)/r, (B,T)/r, (B,T)/r
  std::size_t qkv = 0;                              // (B,T,3C/t)
  std::size_t att = 0;   // (B,H/t,T,T*S) probabilities, or (B,H/t,T) log-sum-exp when fused
  std::size_t atty = 0;  // (B,T,C/t) attention output before its projection
  std::size_t ln2 = 0, ln2_mean = 0, ln2_rstd = 0;  // as ln1
  std::size_t fch = 0;  // (B,T,F/t) before the MLP activation; llama (B,T,2F/t): gate | up
  // llama: no means (RMSNorm), ln*_mean = lnf_mean = 0; qkv holds q and k after the rotation,
  // k and v expanded to every query head (the layout of the attention kernels).
  // Saved by the head stage: the final layernorm's output whole (the LM head's input), its row
  // statistics, the per-token losses and `logits`: the logits, which become their gradient, or
  // under head_in_forward the LM head's input gradient.
  std::size_t lnf = 0;                     // (B,T,C)
  // Which tensors hold bf16 patterns (ActivationShape::bf16_operands): ln1, ln2 and lnf; qkv;
  // atty. Their sizes above are then the floats that hold them, half as many, rounded up.
  bool bf16_norms = false, bf16_qkv = false, bf16_atty = false;
  bool bf16_att = false;  // the probabilities (ActivationShape::bf16_probabilities)
  // Without tensor parallelism (whose cross-entropy works across ranks) the LM head, the
  // cross-entropy and the head's backward run in forward, a chunk of rows at a time
  // (ActivationShape::logits_chunk_floats; the fused linear cross-entropy): the logits are never
  // whole, and a training forward leaves the LM head's input gradient (B,T,C) in `logits` and its
  // weight gradient accumulated.
  // The chunk of fp32 logits (their gradient after the cross-entropy) and, under bf16_operands,
  // that gradient's bf16 patterns are temporaries of the head stage (StageActivations::scratch),
  // not in scratch() below.
  bool head_in_forward = false;
  std::size_t logits_chunk = 0, logits_chunk_bf16 = 0;
  std::size_t logits_ld = 0;  // the chunk's row stride: V rounded up to kLogitsRowAlign
  std::size_t lnf_mean = 0, lnf_rstd = 0;  // (B,T)/r
  std::size_t losses = 0;                  // (B,T)
  std::size_t logits = 0;                  // (B,T,V/t), or (B,T,C) under head_in_forward
  // Temporaries shared by every block: gradient buffers of the residual stream and of the
  // hidden width, the MLP activation (recomputed in backward rather than saved), q/k/v
  // gradients, attention-score gradients (one batch row of them; all rows under a ring; one
  // tile's work under fused attention), and the vocabulary-parallel cross-entropy's row maxima,
  // sums and target logits.
  std::size_t dresidual = 0, dhidden = 0;  // (B,T,C), (B,T,C)
  std::size_t dmlp = 0, mlp_act = 0;       // (B,T,F/t) each; llama mlp_act (B,T,2F/t)
  std::size_t dqkv = 0;                    // (B,T,3C/t)
  std::size_t datt = 0;  // (H/t,T,T); ring (B,H/t,T,T*S); fused fused_attention_work_floats()
  std::size_t cross_entropy = 0;           // 3 (B,T) with tensor > 1
  // Ring only: two key/value blocks in flight and this rank's part of every block's dK and dV.
  std::size_t ring_blocks = 0, ring_dkv = 0;  // 2 (B,T,C/t), 2 S (B,T,C/t)
  // sequence_split only: whole-row buffers for partial sums, gathers and gathered gradients,
  // and two of this rank's rows (reduce-scatter results, the final layernorm's rows).
  std::size_t split_sums = 0, split_gather = 0, split_dgather = 0;  // (B,T,C) each
  std::size_t split_rows = 0, split_lnf = 0;                          // (B,T,C)/r each
  // llama only: the grouped q|k|v projection (and its gradient), (B,T,(H+2KV)hs/t), and the
  // rotary cos/sin tables of every position the ring's sequence holds, 2 (T*S, hs/2).
  std::size_t qkv_gqa = 0, rope_tables = 0;

  // What the attention sub-layer (op 2i) and the MLP sub-layer (op 2i+1) save besides their
  // input (the residual before them).
  std::size_t attention_saved() const { return ln1 + ln1_mean + ln1_rstd + qkv + att + atty; }
  std::size_t mlp_saved() const { return ln2 + ln2_mean + ln2_rstd + fch; }
  std::size_t op_saved(std::size_t op) const {
    return op % kOpsPerBlock == 0 ? attention_saved() : mlp_saved();
  }
  // The head's saved tensors but the logits (which live in a buffer of their own).
  std::size_t head_saved() const { return lnf + lnf_mean + lnf_rstd + losses; }
  // Every temporary above, in one buffer.
  std::size_t scratch() const;
};

// Throws std::invalid_argument naming the size that does not divide (heads or MLP width by the
// tensor size, the local sequence by it under sequence_split) or is not positive.
ActivationSizes activation_sizes(const ModelSpec& spec, const ActivationShape& shape);
// ActivationSizes::head_in_forward: the LM head runs in forward, in chunks, without tensor
// parallelism (whose cross-entropy works across ranks).
constexpr bool head_in_forward(int tensor) { return tensor == 1; }

// One pipeline stage's activations under an activation-checkpoint schedule, per micro-batch slot
// (core/keep.hpp): an op keeping `all` keeps its input and its saved set, `input` its input
// alone and starts a recomputed segment, `none` nothing and continues the segment. Dropped sets
// (and the inputs of `none` ops) live in one arena as large as the largest segment. Selective
// recompute (unfused attention only, and only where some attention op keeps `all`) keeps the
// probabilities of such ops out of the slot, in one block's buffer recomputed in backward.
struct StageActivations {
  ActivationSizes sizes;
  std::vector<Keep> keep;      // per local op (two per block); the first is never `none`
  bool selective = false;      // whether selective recompute applies
  std::size_t saved = 0;       // per slot: kept inputs and sets, the stage output, the head's
  std::size_t logits = 0;      // per slot, head stage only
  std::size_t arena = 0;       // the recompute arena (a temporary)
  std::size_t selective_att = 0;  // selective: one block's probabilities (a temporary)
  std::size_t scratch = 0;     // sizes.scratch(), and on the head stage the logits' chunks

  bool keeps_input(std::size_t op) const { return keep[op] != Keep::none; }
  bool keeps_saved(std::size_t op) const { return keep[op] == Keep::all; }
  // Whether op's probabilities go to the selective buffer instead of the slot.
  bool selective_at(std::size_t op) const {
    return selective && op % kOpsPerBlock == 0 && keep[op] == Keep::all;
  }
  // What op saves besides its input, wherever it lives (slot or arena).
  std::size_t op_saved(std::size_t op) const {
    return sizes.op_saved(op) - (selective_at(op) ? sizes.att : 0);
  }
  std::size_t temporaries() const { return scratch + arena + selective_att; }
};

// `keep` has one entry per op of the whole model (empty keeps everything); the stage's blocks
// [layer_begin, layer_end) take theirs. Throws std::invalid_argument when it has another length.
StageActivations stage_activations(const ModelSpec& spec, const ActivationShape& shape,
                                   const StageRange& stage, const std::vector<Keep>& keep = {},
                                   bool selective = false);

// Incremental decoding (core::Model::enable_decode, colossal_generate): what one stage of a
// model keeps to sample token by token instead of running the whole window for each token.
// The window is the whole sequence (shape.seq_len x shape.ring); rows new positions (at most
// the micro-batch's rows, batch x seq_len, whose MLP buffers the decode reuses, and at most the
// window) go through the stage at a time. Floats:
struct DecodeSizes {
  int window = 0, rows = 0;
  int kv_width = 0;          // cached floats per position and block: this rank's K/V heads x hs
  std::size_t cache = 0;  // keys and values of the stage's blocks: 2 x blocks x window x kv_width
  // The rows' buffers (temporaries): the residual stream twice, a norm's output and statistics,
  // q|k|v (llama: the grouped projection), the attention output, the first MLP linear's output
  // (llama: gate | up), and on the head stage one row of this rank's logits, plus their gather
  // over the tensor ranks.
  std::size_t x = 0, mid = 0, norm = 0, stats = 0, qkv = 0, atty = 0, fch = 0;
  std::size_t logits = 0, logits_gather = 0;
  std::size_t buffers() const {
    return x + mid + norm + stats + qkv + atty + fch + logits + logits_gather;
  }
};
DecodeSizes decode_sizes(const ModelSpec& spec, const ActivationShape& shape,
                         const StageRange& stage);

}  // namespace colossal::core
