// The activation-size table against closed forms written out by hand for a small model (so the
// table is checked on its own, not only against the model and the step graph that both read it),
// and core::Model's allocations against the table.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "core/activation_sizes.hpp"
#include "core/layers.hpp"
#include "core/memory.hpp"
#include "core/model.hpp"

using namespace colossal::core;

namespace {

// 4 layers, hidden 64, 8 heads (width 8), MLP 256, vocabulary 250 (padded to multiples of 16 per
// tensor rank), micro-batch 3 of 32 tokens.
ModelSpec small_spec(Arch arch = Arch::gpt2) {
  ModelSpec spec = model_spec(arch, 4, 64, 8, 256, 250, 64);
  spec.vocab_multiple = 16;
  return spec;
}
constexpr std::size_t B = 3, T = 32, C = 64, H = 8, F = 256, V = 250;
// The LM head's chunk of logits has rows of V rounded up to 64 floats (kLogitsRowAlign).
constexpr std::size_t Vld = 256;

std::vector<Keep> parse(const std::string& text) {
  std::vector<Keep> keep;
  for (char ch : text) keep.push_back(ch == 'A' ? Keep::all : ch == 'I' ? Keep::input : Keep::none);
  return keep;
}

TEST(ActivationSizes, OneRankIsTheDenseLayout) {
  const ActivationSizes s = activation_sizes(small_spec(), ActivationShape{3, 32});
  // Saved per block.
  EXPECT_EQ(s.residual, B * T * C);  // 6144
  EXPECT_EQ(s.ln1, B * T * C);
  EXPECT_EQ(s.ln1_mean, B * T);
  EXPECT_EQ(s.ln1_rstd, B * T);
  EXPECT_EQ(s.qkv, 3 * B * T * C);
  EXPECT_EQ(s.att, B * H * T * T);  // 24576 probabilities
  EXPECT_EQ(s.atty, B * T * C);
  EXPECT_EQ(s.ln2, B * T * C);
  EXPECT_EQ(s.ln2_mean, B * T);
  EXPECT_EQ(s.ln2_rstd, B * T);
  EXPECT_EQ(s.fch, B * T * F);
  EXPECT_EQ(s.attention_saved(), 6144u + 96 + 96 + 18432 + 24576 + 6144);
  EXPECT_EQ(s.mlp_saved(), 6144u + 96 + 96 + 24576);
  EXPECT_EQ(s.op_saved(4), s.attention_saved());
  EXPECT_EQ(s.op_saved(5), s.mlp_saved());
  // Head: the vocabulary is not padded on one rank.
  EXPECT_EQ(s.lnf, B * T * C);
  EXPECT_EQ(s.lnf_mean, B * T);
  EXPECT_EQ(s.lnf_rstd, B * T);
  EXPECT_EQ(s.losses, B * T);
  // The head runs its backward in forward (head_in_forward) a chunk of rows at a time: it
  // keeps the input gradient of its rows, never the logits (the chunk, all 96 rows here, is a
  // temporary).
  EXPECT_TRUE(s.head_in_forward);
  EXPECT_EQ(s.logits, B * T * C);
  EXPECT_EQ(s.logits_ld, Vld);
  EXPECT_EQ(s.logits_chunk, B * T * Vld);  // 24576
  EXPECT_EQ(s.logits_chunk_bf16, 0u);
  EXPECT_EQ(s.head_saved(), 6144u + 96 + 96 + 96);
  // Temporaries: one batch row of score gradients, nothing for the ring, split or vocab-parallel
  // cross-entropy.
  EXPECT_EQ(s.dresidual, B * T * C);
  EXPECT_EQ(s.dhidden, B * T * C);
  EXPECT_EQ(s.dmlp, B * T * F);
  EXPECT_EQ(s.mlp_act, B * T * F);
  EXPECT_EQ(s.dqkv, 3 * B * T * C);
  EXPECT_EQ(s.datt, H * T * T);
  EXPECT_EQ(s.cross_entropy + s.ring_blocks + s.ring_dkv, 0u);
  EXPECT_EQ(s.split_sums + s.split_gather + s.split_dgather + s.split_rows + s.split_lnf, 0u);
  EXPECT_EQ(s.scratch(), 2 * B * T * C + 2 * B * T * F + 3 * B * T * C + H * T * T);  // 81920
}

// bf16 operands (train.precision: bf16 on the host): the tensors only products read, in half
// their floats (an odd count rounded up): the norm outputs but under sequence_split (gathered in
// fp32), q/k/v but under a ring (sent in fp32), the attention output only unfused and without a
// ring (fused backward reads it element-wise). Everything else as in fp32.
TEST(ActivationSizes, Bf16OperandsTakeHalfTheirFloats) {
  auto sizes = [](ModelSpec spec, ActivationShape shape) {
    shape.bf16_operands = true;
    return activation_sizes(spec, shape);
  };
  const ActivationSizes fp32 = activation_sizes(small_spec(), ActivationShape{3, 32});
  const ActivationSizes s = sizes(small_spec(), ActivationShape{3, 32});
  EXPECT_TRUE(s.bf16_norms && s.bf16_qkv && s.bf16_atty && s.head_in_forward);
  EXPECT_EQ(s.logits, B * T * C) << "the head's input gradient, in fp32";
  EXPECT_EQ(s.logits_chunk, B * T * Vld) << "96 rows, fewer than a chunk";
  EXPECT_EQ(s.logits_chunk_bf16, B * T * Vld / 2) << "the chunk's gradient in bf16 patterns";
  EXPECT_EQ(fp32.logits_chunk, s.logits_chunk);
  EXPECT_EQ(fp32.logits_chunk_bf16, 0u);
  EXPECT_EQ(s.ln1, B * T * C / 2);
  EXPECT_EQ(s.ln2, B * T * C / 2);
  EXPECT_EQ(s.lnf, B * T * C / 2);
  EXPECT_EQ(s.qkv, 3 * B * T * C / 2);
  EXPECT_EQ(s.atty, B * T * C / 2);
  EXPECT_EQ(s.ln1_rstd, fp32.ln1_rstd);
  EXPECT_EQ(s.att, fp32.att);
  EXPECT_EQ(s.fch, fp32.fch);
  EXPECT_EQ(s.residual, fp32.residual);
  EXPECT_EQ(s.scratch(), fp32.scratch());
  EXPECT_EQ(fp32.attention_saved() - s.attention_saved(), 5 * B * T * C / 2);
  EXPECT_EQ(fp32.mlp_saved() - s.mlp_saved(), B * T * C / 2);

  ModelSpec fused = small_spec();
  fused.fused_attention = true;
  const ActivationSizes f = sizes(fused, ActivationShape{3, 32});
  EXPECT_TRUE(f.bf16_norms && f.bf16_qkv && !f.bf16_atty);
  EXPECT_EQ(f.atty, B * T * C);
  EXPECT_EQ(f.qkv, 3 * B * T * C / 2);

  const ActivationSizes ring = sizes(small_spec(), ActivationShape{3, 16, 1, false, 2});
  EXPECT_TRUE(ring.bf16_norms && !ring.bf16_qkv && !ring.bf16_atty);
  EXPECT_EQ(ring.qkv, 3 * B * 16 * C);
  EXPECT_EQ(ring.ln1, B * 16 * C / 2);

  const ActivationSizes split = sizes(small_spec(), ActivationShape{3, 32, 2, true});
  EXPECT_TRUE(!split.bf16_norms && split.bf16_qkv && split.bf16_atty && !split.head_in_forward);
  EXPECT_EQ(split.logits, B * T * 128) << "vocabulary-parallel: the logits whole, in fp32";
  EXPECT_EQ(split.logits_chunk + split.logits_chunk_bf16, 0u);
  EXPECT_EQ(split.ln1, B * T * C / 2) << "the rows of one of two tensor ranks, in fp32";
  EXPECT_EQ(split.lnf, B * T * C);
  EXPECT_EQ(split.qkv, 3 * B * T * (C / 2) / 2);

  // A chunk holds as many rows as kLogitsChunkFloats does: all 288 rows of this 250-entry
  // vocabulary, and 256 rows of gpt2-124m's 50257 (one rank never pads the vocabulary; the
  // chunk's rows are 50304 floats apart, the stride cuBLAS's aligned kernels need). Fewer rows than the
  // micro-batch's: those rows of fp32 logits and their gradient's bf16 patterns, on the head
  // stage only.
  const ActivationSizes all = sizes(small_spec(), ActivationShape{9, 32});
  EXPECT_EQ(all.logits_chunk, 9 * 32 * Vld);
  const ModelSpec gpt2 = *find_preset("gpt2-124m");
  const ActivationSizes gpt2_sizes = activation_sizes(gpt2, ActivationShape{4, 256});
  EXPECT_EQ(gpt2_sizes.logits_ld, 50304u);
  EXPECT_EQ(gpt2_sizes.logits_chunk, 256 * 50304u);
  EXPECT_EQ(activation_sizes(gpt2, ActivationShape{16, 256, 1, false, 1, false, false,
                                                    kDeviceLogitsChunkFloats})
                .logits_chunk,
            2048 * 50304u)
      << "a GPU's chunk: 2048 rows";
  ActivationShape shape{9, 32};
  shape.logits_chunk_rows = 64;
  const ActivationSizes many = sizes(small_spec(), shape);
  EXPECT_EQ(many.logits_chunk, 64 * Vld);
  EXPECT_EQ(many.logits_chunk_bf16, 64 * Vld / 2);
  shape.bf16_operands = true;
  EXPECT_EQ(stage_activations(small_spec(), shape, StageRange{0, 2, true, false}).scratch,
            many.scratch());
  EXPECT_EQ(stage_activations(small_spec(), shape, StageRange{2, 4, false, true}).scratch,
            many.scratch() + 64 * Vld * 3 / 2);

  const ModelSpec odd = model_spec(Arch::gpt2, 2, 9, 3, 36, 50, 16);
  EXPECT_EQ(sizes(odd, ActivationShape{1, 3}).ln1, 14u) << "27 bf16 values need 14 floats";
}

TEST(ActivationSizes, TensorParallelWithSequenceSplit) {
  const int t = 2;
  const ActivationSizes s = activation_sizes(small_spec(), ActivationShape{3, 32, t, true});
  // Heads, MLP width and the vocabulary (250 padded to 256) split; residual-stream rows too.
  const std::size_t Vl = 256 / t, rows = B * T / t;
  EXPECT_EQ(s.residual, rows * C);
  EXPECT_EQ(s.ln1, rows * C);
  EXPECT_EQ(s.ln1_mean, rows);
  EXPECT_EQ(s.ln2_rstd, rows);
  EXPECT_EQ(s.qkv, 3 * B * T * C / t);
  EXPECT_EQ(s.att, B * (H / t) * T * T);
  EXPECT_EQ(s.atty, B * T * C / t);
  EXPECT_EQ(s.fch, B * T * F / t);
  EXPECT_EQ(s.lnf, B * T * C) << "the LM head needs the final layernorm's rows whole";
  EXPECT_EQ(s.lnf_mean, rows);
  EXPECT_EQ(s.losses, B * T);
  EXPECT_EQ(s.logits, B * T * Vl);
  EXPECT_EQ(s.dresidual, B * T * C);
  EXPECT_EQ(s.datt, (H / t) * T * T);
  EXPECT_EQ(s.cross_entropy, 3 * B * T);
  EXPECT_EQ(s.split_sums, B * T * C);
  EXPECT_EQ(s.split_gather, B * T * C);
  EXPECT_EQ(s.split_dgather, B * T * C);
  EXPECT_EQ(s.split_rows, rows * C);
  EXPECT_EQ(s.split_lnf, rows * C);
  EXPECT_EQ(s.scratch(), 2 * B * T * C + 2 * B * T * F / t + 3 * B * T * C / t +
                             (H / t) * T * T + 3 * B * T + 3 * B * T * C + 2 * rows * C);
  // Without the split only the rows change back.
  const ActivationSizes whole = activation_sizes(small_spec(), ActivationShape{3, 32, t, false});
  EXPECT_EQ(whole.residual, B * T * C);
  EXPECT_EQ(whole.ln1_mean, B * T);
  EXPECT_EQ(whole.split_sums + whole.split_rows, 0u);
  EXPECT_EQ(whole.cross_entropy, 3 * B * T);
}

TEST(ActivationSizes, RingAttentionSeesEveryKey) {
  // 2 ring ranks of 16 tokens each: 16 query rows against 32 keys.
  const std::size_t Tl = 16, S = 2;
  const ActivationSizes s = activation_sizes(small_spec(), ActivationShape{3, 16, 1, false, 2});
  EXPECT_EQ(s.residual, B * Tl * C);
  EXPECT_EQ(s.att, B * H * Tl * Tl * S);
  EXPECT_EQ(s.datt, B * H * Tl * Tl * S) << "every batch row's score gradients at once";
  EXPECT_EQ(s.ring_blocks, 2 * B * Tl * C);
  EXPECT_EQ(s.ring_dkv, 2 * S * B * Tl * C);
  EXPECT_EQ(s.logits, B * Tl * C) << "the head's input gradient of this rank's rows";
  EXPECT_EQ(s.logits_chunk, B * Tl * Vld);
}

TEST(ActivationSizes, FusedAttentionSavesTheLogSumExp) {
  ModelSpec spec = small_spec(Arch::opt);
  spec.fused_attention = true;
  const ActivationSizes s = activation_sizes(spec, ActivationShape{3, 32});
  EXPECT_EQ(s.att, B * H * T);
  EXPECT_EQ(s.datt, 2u * 128 * 128 + 2 * 128) << "one tile's scores and their gradients";
  EXPECT_EQ(s.datt, fused_attention_work_floats());
}

TEST(ActivationSizes, RefusesWhatDoesNotDivide) {
  auto message = [](const ActivationShape& shape) {
    try {
      activation_sizes(small_spec(), shape);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({3, 32, 3}).find("model.heads 8 is not divisible by the tensor size 3"),
            std::string::npos);
  EXPECT_NE(message({3, 30, 4, true}).find("local sequence length 30 is not divisible"),
            std::string::npos);
  EXPECT_NE(message({0, 32}).find("micro-batch is 0"), std::string::npos);
  EXPECT_EQ(message({3, 30, 4, false}), "no error") << "rows split only under sequence_split";
}

// x: a sub-layer's input; A, M: what the attention and MLP sub-layers save besides it.
struct OpSizes {
  std::size_t x, A, M, att;
};
OpSizes op_sizes() {
  return {B * T * C, 6144 + 96 + 96 + 18432 + 24576 + 6144, 6144 + 96 + 96 + 24576,
          B * H * T * T};
}

TEST(StageActivations, KeepingEverythingSavesEveryBlockAndTheHead) {
  const StageActivations a = stage_activations(small_spec(), ActivationShape{3, 32}, {});
  const OpSizes o = op_sizes();
  EXPECT_EQ(a.keep, std::vector<Keep>(8, Keep::all));
  // Each of 8 ops keeps its input and set; the stage output; ln_f, statistics and losses.
  EXPECT_EQ(a.saved, 8 * o.x + 4 * (o.A + o.M) + o.x + (B * T * C + 3 * B * T));
  EXPECT_EQ(a.logits, B * T * C);
  EXPECT_EQ(a.arena, 0u);
  EXPECT_EQ(a.selective_att, 0u);
  EXPECT_EQ(a.scratch, a.sizes.scratch() + B * T * Vld) << "the head's chunk of logits";
  EXPECT_EQ(a.temporaries(), a.scratch);
}

TEST(StageActivations, SegmentsAcrossBlocksAndSubLayers) {
  const OpSizes o = op_sizes();
  // I . . A | A I . A: segments {0, 1, 2} (ending at the MLP of block 1) and {5, 6}.
  const StageActivations a =
      stage_activations(small_spec(), ActivationShape{3, 32}, {}, parse("I..AAI.A"));
  // Kept: the inputs of ops 0, 3, 4, 5, 7, the sets of 3, 4, 7, the stage output, the head.
  EXPECT_EQ(a.saved, 5 * o.x + 2 * o.M + o.A + o.x + (B * T * C + 3 * B * T));
  // The arena holds the larger segment: op 0's set, then ops 1 and 2 with their inputs.
  EXPECT_EQ(a.arena, o.A + (o.x + o.M) + (o.x + o.A));
  EXPECT_FALSE(a.selective);
  EXPECT_TRUE(a.keeps_input(0));
  EXPECT_FALSE(a.keeps_saved(0));
  EXPECT_FALSE(a.keeps_input(1));
  EXPECT_TRUE(a.keeps_saved(3));
}

TEST(StageActivations, SelectiveMovesKeptProbabilitiesToOneBuffer) {
  const OpSizes o = op_sizes();
  const StageActivations a =
      stage_activations(small_spec(), ActivationShape{3, 32}, {}, parse("AAI.AAAA"), true);
  EXPECT_TRUE(a.selective);
  EXPECT_TRUE(a.selective_at(0));
  EXPECT_FALSE(a.selective_at(2)) << "a recomputed attention op has its probabilities in the arena";
  EXPECT_EQ(a.op_saved(0), o.A - o.att);
  EXPECT_EQ(a.op_saved(2), o.A);
  // Every input but op 3's and the stage output; attention ops 0, 4, 6 kept without their
  // probabilities, the MLPs 1, 5, 7 whole; ops 2 and 3 recomputed.
  EXPECT_EQ(a.saved, 8 * o.x + 3 * (o.A - o.att) + 3 * o.M + (B * T * C + 3 * B * T));
  EXPECT_EQ(a.arena, o.A + o.x + o.M);
  EXPECT_EQ(a.selective_att, o.att);
  EXPECT_EQ(a.temporaries(), a.sizes.scratch() + B * T * Vld + o.A + o.x + o.M + o.att);
  // Nothing to drop with fused attention, nor where no attention op keeps its set.
  ModelSpec fused = small_spec();
  fused.fused_attention = true;
  EXPECT_FALSE(stage_activations(fused, ActivationShape{3, 32}, {}, {}, true).selective);
  const StageActivations full = stage_activations(small_spec(), ActivationShape{3, 32}, {},
                                                  keep_blocks(4, {0, 1, 2, 3}), true);
  EXPECT_FALSE(full.selective);
  EXPECT_EQ(full.selective_att, 0u);
}

TEST(StageActivations, AStageStartsFromItsInput) {
  const OpSizes o = op_sizes();
  // Blocks 1 and 2 without embedding or head: their local ops read ". . A A" of "AA..AAAA", and
  // the stage's first op keeps its input whatever the schedule says.
  const StageActivations a = stage_activations(small_spec(), ActivationShape{3, 32},
                                               StageRange{1, 3, false, false}, parse("AA..AAAA"));
  EXPECT_EQ(a.keep, parse("I.AA"));
  EXPECT_EQ(a.saved, o.x + o.x + (o.x + o.A) + (o.x + o.M));
  EXPECT_EQ(a.logits, 0u);
  EXPECT_EQ(a.arena, o.A + o.x + o.M);
  EXPECT_THROW(stage_activations(small_spec(), ActivationShape{3, 32}, {}, parse("AAAA")),
               std::invalid_argument);
}

TEST(StageActivations, ModelAllocatesExactlyTheTable) {
  const ModelSpec spec = small_spec();
  MemoryTracker tracker;
  tracker.set_dry_run(true);
  auto gemm = make_host_gemm();
  const std::vector<Keep> keep = parse("I..AAI.A");
  const Model model(spec, 3, 32, tracker, *gemm,
                    ModelOptions{.stage = {}, .slots = 2, .keep = keep, .selective = true});
  const StageActivations a = stage_activations(spec, ActivationShape{3, 32}, {}, keep, true);
  EXPECT_EQ(model.activations().saved, a.saved);
  EXPECT_EQ(model.activations().arena, a.arena);
  EXPECT_EQ(model.activation_bytes(), 4 * 2 * (a.saved + a.logits));
  EXPECT_EQ(tracker.current(MemCategory::activations), 4 * 2 * (a.saved + a.logits));
  EXPECT_EQ(tracker.current(MemCategory::temporaries), 4 * a.temporaries());
  EXPECT_EQ(model.recompute_bytes(), 4 * (a.arena + a.selective_att));
}

}  // namespace
