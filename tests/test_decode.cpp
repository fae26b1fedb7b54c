// core::Model's incremental decoding (colossal_generate) against the model's own forward over the
// whole window: the logits of every position, prefilled several rows at once and then one row
// at a time with the key/value cache, equal the forward's for GPT-2, OPT, LLaMA with grouped
// keys and values, and fused attention (fp32: 1e-6 of the largest logit; bf16 operands, whose
// forward rounds q/k/v to bf16 where the decode keeps them in fp32: 1e-2). The layouts (tensor,
// sequence_split, ring, pipeline, ZeRO-3) are tested through the trainer in test_inference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/activation_sizes.hpp"
#include "core/model.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;

namespace {

struct Case {
  std::string name;
  ModelSpec spec;
  bool bf16 = false;
};

ModelSpec with_fused(ModelSpec spec) {
  spec.fused_attention = true;
  return spec;
}

std::vector<Case> cases() {
  std::vector<Case> out = {
      {"gpt2", model_spec(Arch::gpt2, 2, 16, 4, 24, 11, 16)},
      {"opt", model_spec(Arch::opt, 2, 16, 4, 24, 11, 16)},
      {"llama_gqa", llama_spec(2, 16, 4, 2, 24, 11, 16, 10000.0, 1e-5, false)},
      {"gpt2_fused", with_fused(model_spec(Arch::gpt2, 2, 16, 4, 24, 11, 16))}};
  if (test::host_memory()) {  // bf16 norm outputs are host-only
    out.push_back({"gpt2_bf16", model_spec(Arch::gpt2, 2, 16, 4, 24, 11, 16), true});
    out.push_back({"llama_bf16", llama_spec(2, 16, 4, 2, 24, 11, 16, 10000.0, 1e-5, false),
                   true});
  }
  return out;
}

// The largest |a - b| over the largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, double(std::abs(a[i] - b[i])));
    scale = std::max(scale, double(std::abs(b[i])));
  }
  return gap / std::max(scale, 1e-30);
}

class Decode : public ::testing::TestWithParam<Case> {};

TEST_P(Decode, LogitsEqualTheWholeWindowsForward) {
  const Case& c = GetParam();
  const int B = 2, T = 12, V = c.spec.vocab;
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8,
                                       9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4};
  const std::vector<int32_t> targets(tokens.size(), 0);
  const test::DeviceTokens device(tokens, targets);
  MemoryTracker tracker;
  auto gemm = c.bf16 ? make_bf16_gemm(make_host_gemm()) : make_default_gemm();
  Model model(c.spec, B, T, tracker, *gemm, ModelOptions{.bf16_operands = c.bf16});
  model.init_parameters(7);
  const double tolerance = c.bf16 ? 1e-2 : 1e-6;  // measured: up to 8.2e-8 and 4.1e-3

  // The reference: each sequence's forward (batch 1) and the logits of each of its positions.
  std::vector<std::vector<std::vector<float>>> want(2);
  for (int s = 0; s < 2; ++s) {
    model.forward(device.tokens(std::size_t(s) * T), device.targets(), 1, 0.0f);
    for (int r = 0; r < T; ++r) {
      want[s].emplace_back(std::size_t(V));
      model.gather_logits(r, want[s].back().data());
    }
  }

  std::vector<float> got(static_cast<std::size_t>(V));
  EXPECT_THROW(model.decode(device.tokens(), 1, 0, got.data()), std::logic_error);
  const std::size_t before = tracker.current(MemCategory::activations);
  const std::size_t temporaries = tracker.current(MemCategory::temporaries);
  model.enable_decode(tracker);
  const DecodeSizes& d = model.decode_shape();
  EXPECT_EQ(d.window, T);
  EXPECT_EQ(d.rows, T);  // min(window, B x T)
  EXPECT_EQ(tracker.current(MemCategory::activations) - before, d.cache * sizeof(float));
  EXPECT_EQ(tracker.current(MemCategory::temporaries) - temporaries, d.buffers() * sizeof(float));
  EXPECT_EQ(d.cache, std::size_t(2 * 2 * T * c.spec.key_value_heads() * c.spec.head_dim()));

  for (int s = 0; s < 2; ++s) {
    const std::size_t first = std::size_t(s) * T;
    SCOPED_TRACE(c.name + ", sequence " + std::to_string(s));
    // A prefill of 5 positions (the cache starts again at position 0), then one at a time.
    model.decode(device.tokens(first), 5, 0, got.data());
    EXPECT_LT(relative_gap(got, want[s][4]), tolerance) << "after the prefill of 5";
    for (int r = 5; r < T; ++r) {
      model.decode(device.tokens(first + r), 1, r, got.data());
      const double gap = relative_gap(got, want[s][r]);
      EXPECT_LT(gap, tolerance) << "position " << r;
      if (r == T - 1) std::printf("%s sequence %d: last position's gap %.3g\n",
                                  c.name.c_str(), s, gap);
    }
    // The whole window at once.
    model.decode(device.tokens(first), T, 0, got.data());
    EXPECT_LT(relative_gap(got, want[s][T - 1]), tolerance) << "the whole window at once";
  }
  // The logits differ between positions: the comparison above is not of constants.
  EXPECT_GT(relative_gap(want[0][0], want[0][T - 1]), 1e-3);

  EXPECT_THROW(model.decode(device.tokens(), T + 1, 0, got.data()), std::invalid_argument);
  EXPECT_THROW(model.decode(device.tokens(), 2, T - 1, got.data()), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Models, Decode, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The memory plan prices what enable_decode allocates (planner::RankLayout::decode): the cache
// of every block of the stage and the rows' buffers, the logits on the head stage alone.
TEST(DecodeSizes, CacheOfTheStagesBlocksAndRowBuffers) {
  const ModelSpec spec = llama_spec(4, 32, 8, 2, 64, 100, 64, 10000.0, 1e-5, false);
  ActivationShape shape;
  shape.batch = 2;
  shape.seq_len = 16;  // a ring rank's chunk
  shape.ring = 4;
  shape.tensor = 2;
  const DecodeSizes head = decode_sizes(spec, shape, StageRange{2, 4, false, true});
  EXPECT_EQ(head.window, 64);
  EXPECT_EQ(head.rows, 32);
  EXPECT_EQ(head.kv_width, 1 * 4);  // 2 KV heads over 2 ranks, head_dim 4
  EXPECT_EQ(head.cache, std::size_t(2 * 2 * 64 * 4));
  EXPECT_EQ(head.qkv, std::size_t(32 * (4 + 2 * 1) * 4));
  EXPECT_EQ(head.fch, std::size_t(32 * 2 * 32));
  EXPECT_EQ(head.logits, std::size_t(padded_vocab(spec, 2) / 2));
  EXPECT_EQ(head.logits_gather, head.logits * 2);
  const DecodeSizes first = decode_sizes(spec, shape, StageRange{0, 2, true, false});
  EXPECT_EQ(first.logits + first.logits_gather, 0u);
  EXPECT_EQ(first.buffers() + head.logits + head.logits_gather, head.buffers());
}

}  // namespace
