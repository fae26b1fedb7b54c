// The symbolic step graph against the real model: its saved bytes are exactly what core::Model
// allocates for activations (counted by a dry-run tracker, nothing allocated) for every layout,
// its temporaries what the model allocates for them; both read core/activation_sizes.hpp, so this
// checks that the ops' shares of that table add up to its totals (the table itself is checked
// against closed forms in tests/test_activation_sizes.cpp). Its matmul FLOPs are 6N + 12LTd per
// token, and split evenly over tensor ranks.
#include <gtest/gtest.h>

#include "core/model.hpp"
#include "planner/step_graph.hpp"
#include "pretend_group.hpp"

using namespace colossal;

namespace {

using test::PretendGroup;

struct Case {
  core::Arch arch;
  int tensor = 1, sequence = 1;
  bool split = false, fused = false;
  core::StageRange stage{};
  int slots = 1;
  std::vector<int> recompute{};  // whole blocks (keep_blocks)
  std::string keep{};            // or per op: A = all, I = input, . = none (two per block)
  bool selective = false;
  bool bf16_operands = false;    // colossal_train's host bf16 storage
};

std::vector<core::Keep> keep_of(const Case& c, int layers) {
  if (c.keep.empty()) return c.recompute.empty() ? std::vector<core::Keep>{}
                                                 : core::keep_blocks(layers, c.recompute);
  std::vector<core::Keep> keep;
  for (char ch : c.keep) {
    keep.push_back(ch == 'A' ? core::Keep::all
                   : ch == 'I' ? core::Keep::input : core::Keep::none);
  }
  return keep;
}

class SavedBytes : public ::testing::TestWithParam<Case> {};

TEST_P(SavedBytes, EqualWhatTheModelAllocates) {
  const Case c = GetParam();
  core::ModelSpec spec = core::model_spec(c.arch, 4, 64, 8, 256, 250, 64);
  spec.fused_attention = c.fused;
  spec.vocab_multiple = 16;
  const int B = 3, T = 32;
  core::MemoryTracker tracker;
  tracker.set_dry_run(true);
  auto gemm = core::make_host_gemm();
  PretendGroup tensor(c.tensor, c.tensor - 1), ring(c.sequence, c.sequence - 1);
  core::Model model(spec, B, T / c.sequence, tracker, *gemm,
                    core::ModelOptions{.tensor = &tensor,
                                       .sequence_split = c.split,
                                       .sequence = &ring,
                                       .stage = c.stage,
                                       .slots = c.slots,
                                       .keep = keep_of(c, spec.layers),
                                       .selective = c.selective,
                                       .bf16_operands = c.bf16_operands,
                                       .bf16_probabilities = c.bf16_operands});
  planner::Layout layout{B,       T,       c.tensor, c.split, c.sequence,
                         c.stage, keep_of(c, spec.layers), c.selective, false, c.bf16_operands};
  const planner::StepGraph graph = planner::build_step_graph(spec, layout);
  EXPECT_EQ(double(model.activation_bytes()), graph.saved_bytes() * c.slots);
  EXPECT_EQ(tracker.current(core::MemCategory::activations), model.activation_bytes());
  EXPECT_EQ(double(model.recompute_bytes()), graph.arena_bytes + graph.selective_bytes);
  EXPECT_EQ(double(model.temporary_bytes()),
            graph.scratch_bytes + graph.arena_bytes + graph.selective_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SavedBytes,
    ::testing::Values(Case{core::Arch::gpt2}, Case{core::Arch::opt}, Case{core::Arch::gpt2, 2},
                      Case{core::Arch::opt, 4, 1, true}, Case{core::Arch::gpt2, 1, 2},
                      Case{core::Arch::gpt2, 2, 2, true}, Case{core::Arch::opt, 1, 1, false, true},
                      Case{core::Arch::gpt2, 1, 1, false, false, {0, 2, true, false}, 3},
                      Case{core::Arch::opt, 2, 1, false, false, {2, 4, false, true}, 2},
                      Case{core::Arch::gpt2, 1, 1, false, false, {1, 3, false, false}, 2},
                      // Activation checkpointing: recomputed blocks keep only their output.
                      Case{core::Arch::gpt2, 1, 1, false, false, {}, 1, {0, 1, 2, 3}},
                      Case{core::Arch::opt, 2, 1, true, false, {}, 2, {1, 3}},
                      Case{core::Arch::gpt2, 1, 2, false, false, {1, 3, false, false}, 2, {2}},
                      // Op granularity: segments across blocks and sub-layers, selective.
                      Case{core::Arch::gpt2, 1, 1, false, false, {}, 1, {}, "I..AAI.A"},
                      Case{core::Arch::opt, 2, 1, true, false, {}, 2, {}, "AI...IAA"},
                      Case{core::Arch::gpt2, 1, 1, false, false, {1, 4, false, true}, 1, {},
                           "AAAI.I.A"},
                      Case{core::Arch::gpt2, 1, 1, false, false, {}, 1, {}, "AAI.AAAA", true},
                      Case{core::Arch::opt, 1, 2, false, false, {}, 2, {}, "I.......", true},
                      // bf16 norm outputs (train.precision: bf16 on the host), recomputed too,
                      // and ignored under sequence_split.
                      Case{core::Arch::gpt2, 1, 1, false, false, {}, 2, {}, "", false, true},
                      Case{core::Arch::opt, 2, 2, false, false, {1, 3, false, true}, 2, {},
                           "AI...IAA", false, true},
                      Case{core::Arch::gpt2, 2, 1, false, true, {}, 1, {0, 2}, "", false, true},
                      Case{core::Arch::opt, 2, 1, true, false, {}, 1, {}, "", false, true}));

TEST(StepGraph, MatmulFlopsAre6NPlus12LTdPerTokenAndSplitOverTensorRanks) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 6, 96, 6, 384, 768, 128);
  const planner::Layout whole{4, 128};
  const planner::StepGraph g = planner::build_step_graph(spec, whole);
  const double L = 6, d = 96, F = 384, V = 768, T = 128, tokens = 4 * 128;
  const double per_token = 6 * (L * (4 * d * d + 2 * d * F) + V * d) + 12 * L * T * d;
  EXPECT_DOUBLE_EQ(g.forward_flops() + g.backward_flops(), per_token * tokens);
  EXPECT_DOUBLE_EQ(g.backward_flops(), 2 * g.forward_flops());
  EXPECT_EQ(g.collective_bytes(), 0.0) << "one rank communicates nothing";
  // Tensor parallelism splits every matmul (the vocabulary, 768, needs no padding at 2 or 3
  // ranks: padding rows would cost FLOPs); with sequence parallelism each rank has 1/S of the
  // queries against all keys.
  for (const planner::Layout& l : {planner::Layout{4, 128, 2}, planner::Layout{4, 128, 3},
                                   planner::Layout{4, 128, 1, false, 2}}) {
    const double ranks = l.tensor * l.sequence;
    EXPECT_DOUBLE_EQ(planner::build_step_graph(spec, l).forward_flops() * ranks,
                     g.forward_flops());
  }
  // 1D tensor parallelism moves four (tokens x hidden) all-reduces per layer, plus the embedding,
  // the LM head's input gradient and 3 floats per token for the cross-entropy.
  const planner::StepGraph tp = planner::build_step_graph(spec, planner::Layout{4, 128, 2});
  EXPECT_DOUBLE_EQ(tp.collective_bytes(), 4.0 * ((4 * L + 2) * tokens * d + 3 * tokens));
}

}  // namespace
