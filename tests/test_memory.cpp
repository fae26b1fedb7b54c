#include <gtest/gtest.h>

#include <array>
#include <string>

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

// Out of memory mid-run: the report names the request, what is tracked, the plan and the
// category furthest past it, and the keys that need less.
TEST(MemoryTracker, OutOfMemoryReportNamesTheCategoryThatGrewAndThePlan) {
  MemoryTracker t;
  std::array<double, std::size_t(MemCategory::count)> plan{};
  plan[std::size_t(MemCategory::parameters)] = 4096.0 * 1024;
  plan[std::size_t(MemCategory::activations)] = 2048.0 * 1024;
  t.set_plan(plan);
  DeviceArray<float> params(t, MemCategory::parameters, 1024 * 1024);      // 4 MiB, as planned
  DeviceArray<float> activations(t, MemCategory::activations, 512 * 1024);  // 2 MiB, as planned
  const std::string report = t.out_of_memory_report(MemCategory::activations, 3u << 20, "test");
  EXPECT_NE(report.find("3.0 MiB more of activations could not be allocated (test)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("tracked now: params 4.0 MiB, activations 2.0 MiB, total 6.0 MiB"),
            std::string::npos) << report;
  EXPECT_NE(report.find("memory plan: params 4.0 MiB, activations 2.0 MiB, total 6.0 MiB"),
            std::string::npos) << report;
  EXPECT_NE(report.find("activations grew past the plan: 5.0 MiB against 2.0 MiB planned"),
            std::string::npos) << report;
  EXPECT_NE(report.find("train.micro_batch"), std::string::npos) << report;
  // The request within its category's plan while another grew: that one is named.
  DeviceArray<float> more(t, MemCategory::parameters, 1024 * 1024);
  const std::string other = t.out_of_memory_report(MemCategory::activations, 1, "test");
  EXPECT_NE(other.find("params grew past the plan: 8.0 MiB against 4.0 MiB planned"),
            std::string::npos) << other;
}

// A real failed allocation throws OutOfMemory with that report and leaves nothing counted. (Not
// under AddressSanitizer, whose allocator aborts on an impossible size instead of failing it.)
TEST(MemoryTracker, AFailedAllocationThrowsTheReportAndUncountsIt) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on impossible allocations";
#else
  MemoryTracker t;
  DeviceArray<float> params(t, MemCategory::parameters, 1000);
  try {
    DeviceArray<float> huge(t, MemCategory::activations, std::size_t(1) << 61);  // 8 EiB
    FAIL() << "an 8 EiB allocation cannot succeed";
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("more of activations could not be allocated"),
              std::string::npos) << e.what();
  }
  EXPECT_EQ(t.current(MemCategory::activations), 0u);
  EXPECT_EQ(t.current_total(), 4000u);
  EXPECT_EQ(t.peak(MemCategory::activations), 0u) << "the failed request must leave no peak";
  EXPECT_EQ(t.peak_total(), 4000u);
#endif
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

TEST(Format, NumbersReadBackExactly) {
  EXPECT_EQ(colossal::core::format_number(0.015625), "0.015625");
  EXPECT_EQ(colossal::core::format_number(0.75), "0.75");
  EXPECT_EQ(colossal::core::format_number(0.3), "0.3");
  EXPECT_EQ(colossal::core::format_number(1.0), "1");
  EXPECT_EQ(std::stod(colossal::core::format_number(1.0 / 3.0)), 1.0 / 3.0);
}
