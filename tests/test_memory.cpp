#include <gtest/gtest.h>

#include "core/memory.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"

using namespace colossal::core;

TEST(MemoryTracker, CountsCurrentAndPeakByCategory) {
  MemoryTracker t;
  {
    DeviceArray<float> a(t, MemCategory::parameters, 1000);
    DeviceArray<int32_t> b(t, MemCategory::data, 10);
    EXPECT_EQ(t.current(MemCategory::parameters), 4000u);
    EXPECT_EQ(t.current(MemCategory::data), 40u);
    EXPECT_EQ(t.current_total(), 4040u);
    DeviceArray<float> moved = std::move(a);
    EXPECT_EQ(t.current(MemCategory::parameters), 4000u) << "a move must not double count";
  }
  EXPECT_EQ(t.current_total(), 0u);
  EXPECT_EQ(t.peak_total(), 4040u);
  EXPECT_EQ(t.peak(MemCategory::parameters), 4000u);
}

TEST(MemoryTracker, ModelAndOptimizerBytesMatchTheTensorTable) {
  const ModelSpec s = model_spec(Arch::gpt2, 2, 32, 4, 128, 50, 16);
  const int B = 3, T = 16;
  MemoryTracker t;
  auto gemm = make_host_gemm();
  Model model(s, B, T, t, *gemm);
  AdamW opt(model.parameters(), model.flat_size(), t);
  // The flat buffer is the table padded to 16-float alignment per tensor.
  std::size_t padded = 0;
  for (const auto& p : model.parameters()) padded += (p.count + 15) / 16 * 16;
  EXPECT_EQ(model.flat_size(), padded);
  EXPECT_EQ(t.current(MemCategory::parameters), padded * 4);
  EXPECT_EQ(t.current(MemCategory::gradients), padded * 4);
  EXPECT_EQ(t.current(MemCategory::optimizer), padded * 8);
  // Saved activations: per block ln1, atty, mid, ln2 (4 BTC), qkv (3 BTC), 4 row statistics,
  // probabilities (B H T T) and the MLP hidden (B T F); plus L+1 residuals, ln_f with statistics,
  // losses, and the LM head's input gradient (B T C: the head runs its backward in forward, so
  // the logits (B T V) are only ever a temporary chunk).
  const std::size_t BT = B * T, BTC = BT * s.hidden;
  const std::size_t block = 7 * BTC + 4 * BT + std::size_t(B) * s.heads * T * T + BT * s.ffn_hidden;
  const std::size_t acts = BTC * (s.layers + 1) + s.layers * block + BTC + 3 * BT + BTC;
  EXPECT_EQ(t.current(MemCategory::activations), acts * 4);
  EXPECT_EQ(model.activation_bytes(), acts * 4);
  EXPECT_EQ(t.current_total(), t.current(MemCategory::parameters) * 4 + acts * 4 + model.temporary_bytes());
}
