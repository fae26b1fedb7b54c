// parallel.zero.offload.policy: auto: the decisions from the memory plan for made-up device
// sizes (fits: nothing; a little short: the fewest 64ths of the optimizer states; more: all of
// them, then the fewest 64ths of the parameter shards too; impossible: an
// error naming the categories), the 2d grid's optimizer offload, the static policy untouched, and
// the keys' validation.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "apps/layout.hpp"
#include "apps/memory_fit.hpp"
#include "apps/offload_policy.hpp"
#include "io/config.hpp"
#include "planner/layout_plan.hpp"
#include "planner/search.hpp"

namespace colossal::apps {
namespace {

io::Config config(int zero_stage, const std::string& extra = "") {
  return io::parse_config(
      "model: {layers: 4, hidden: 256, heads: 8, vocab: 512, max_seq: 64}\n"
      "data: {path: unused.bin}\n"
      "train: {steps: 3, seq_len: 64, global_batch: 4, micro_batch: 2}\n"
      "parallel: {data: 2, zero: {stage: " + std::to_string(zero_stage) +
          ", offload: {policy: auto}}" + extra + "}\n",
      "t.yaml");
}

// The worst rank's device bytes with the given flags, as the planner predicts them.
double need(io::Config c, bool opt, bool params, double fraction = 1.0,
            double params_fraction = 1.0) {
  c.parallel.offload_optimizer = opt;
  c.parallel.offload_params = params;
  c.parallel.offload_fraction = fraction;
  c.parallel.offload_params_fraction = params_fraction;
  double worst = 0;
  for (int r = 0; r < c.parallel.world_size(); ++r) {
    worst = std::max(worst, rank_memory(c, r).device());
  }
  return worst;
}

TEST(OffloadPolicy, DecidesFromTheMemoryPlanAndTheDeviceSize) {
  const io::Config c = config(3);
  const double none = need(c, false, false), opt = need(c, true, false), both = need(c, true, true);
  ASSERT_GT(none, opt);  // the moments leave the device
  ASSERT_GT(opt, both);  // and then the parameter shard
  // Fits (exactly, and with room): nothing moves.
  for (double cap : {none, none * 4}) {
    const OffloadDecision d = decide_offload(c, cap);
    EXPECT_FALSE(d.optimizer);
    EXPECT_FALSE(d.params);
    EXPECT_EQ(d.device_bytes, none);
    EXPECT_NE(d.describe().find("nothing to the host"), std::string::npos) << d.describe();
  }
  // Slightly too big: one chunk (1/64) of each rank's optimizer state.
  OffloadDecision d = decide_offload(c, none - 1);
  EXPECT_TRUE(d.optimizer);
  EXPECT_FALSE(d.params);
  EXPECT_EQ(d.fraction, 1.0 / kOffloadChunks);
  EXPECT_EQ(d.device_bytes, need(c, true, false, 1.0 / kOffloadChunks));
  EXPECT_LT(d.device_bytes, none);
  EXPECT_NE(d.describe().find("1 of 64 chunks of each rank's optimizer states"),
            std::string::npos) << d.describe();
  EXPECT_NE(d.describe().find("optimizer_fraction 0.015625"), std::string::npos);
  // In between: the fewest chunks that fit (one fewer does not).
  for (double cap : {none - (none - opt) / 4, (none + opt) / 2, opt + (none - opt) / 10}) {
    d = decide_offload(c, cap);
    const int chunks = int(std::lround(d.fraction * kOffloadChunks));
    EXPECT_TRUE(d.optimizer && !d.params);
    EXPECT_GT(chunks, 1);
    EXPECT_LT(chunks, kOffloadChunks);
    EXPECT_LE(d.device_bytes, cap);
    EXPECT_EQ(d.device_bytes, need(c, true, false, d.fraction));
    EXPECT_GT(need(c, true, false, double(chunks - 1) / kOffloadChunks), cap) << chunks;
  }
  // Every chunk needed: the whole optimizer state.
  d = decide_offload(c, opt);
  EXPECT_TRUE(d.optimizer && !d.params);
  EXPECT_EQ(d.fraction, 1.0);
  EXPECT_EQ(d.device_bytes, opt);
  EXPECT_NE(d.describe().find("optimizer states to the host"), std::string::npos);
  // Too big for that: all of the optimizer state and the fewest 64ths of each parameter shard
  // (one fewer does not fit), down to the whole shard.
  ASSERT_GT(opt, need(c, true, true, 1.0, 1.0 / kOffloadChunks));
  d = decide_offload(c, opt - 1);
  EXPECT_TRUE(d.optimizer && d.params);
  EXPECT_EQ(d.fraction, 1.0);
  EXPECT_EQ(d.params_fraction, 1.0 / kOffloadChunks);
  EXPECT_EQ(d.device_bytes, need(c, true, true, 1.0, 1.0 / kOffloadChunks));
  EXPECT_NE(d.describe().find("optimizer states and 1 of 64 chunks of each rank's parameter "
                              "shard (parallel.zero.offload.params_fraction 0.015625)"),
            std::string::npos) << d.describe();
  for (double cap : {opt - (opt - both) / 4, (opt + both) / 2, both + (opt - both) / 10}) {
    d = decide_offload(c, cap);
    const int chunks = int(std::lround(d.params_fraction * kOffloadChunks));
    EXPECT_TRUE(d.optimizer && d.params);
    EXPECT_EQ(d.fraction, 1.0);
    EXPECT_GT(chunks, 1);
    EXPECT_LT(chunks, kOffloadChunks);
    EXPECT_LE(d.device_bytes, cap);
    EXPECT_EQ(d.device_bytes, need(c, true, true, 1.0, d.params_fraction));
    EXPECT_GT(need(c, true, true, 1.0, double(chunks - 1) / kOffloadChunks), cap) << chunks;
  }
  d = decide_offload(c, both);
  EXPECT_TRUE(d.optimizer && d.params);
  EXPECT_EQ(d.params_fraction, 1.0);
  EXPECT_EQ(d.device_bytes, both);
  EXPECT_NE(d.describe().find("optimizer states and parameters to the host"), std::string::npos);
  // Two ranks sharing the device need twice the room.
  d = decide_offload(c, none * 1.5, 2);
  EXPECT_TRUE(d.optimizer);
  if (none * 1.5 >= 2 * opt) {
    EXPECT_FALSE(d.params);
    EXPECT_EQ(d.device_bytes, 2 * need(c, true, false, d.fraction));
    EXPECT_LE(d.device_bytes, none * 1.5);
  } else {
    EXPECT_TRUE(d.params);
    EXPECT_EQ(d.device_bytes, 2 * need(c, true, true, 1.0, d.params_fraction));
  }
  // Impossible: the error names the device's categories, the capacity and what would help.
  try {
    decide_offload(c, both - 1);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const char* part : {"parallel.zero.offload.policy: auto", "does not fit on the device",
                             "with optimizer states and parameters offloaded", "params",
                             "grads", "activations", "hardware.device_memory_gib"}) {
      EXPECT_NE(m.find(part), std::string::npos) << part << ": " << m;
    }
  }
  // No device limit (a CPU build without hardware.device_memory_gib): nothing moves.
  d = decide_offload(c, 0);
  EXPECT_FALSE(d.optimizer || d.params);
  EXPECT_NE(d.describe().find("no device limit"), std::string::npos);
}

TEST(OffloadPolicy, TheZeroStageBoundsWhatCanMove) {
  const io::Config one = config(1);
  const double none = need(one, false, false), opt = need(one, true, false);
  const OffloadDecision d = decide_offload(one, none - 1);
  EXPECT_TRUE(d.optimizer);
  EXPECT_FALSE(d.params);  // stage 1 keeps whole parameters: they cannot move
  try {
    decide_offload(one, opt - 1);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.zero.stage: 3 would let the parameters move"),
              std::string::npos) << e.what();
  }
  try {
    decide_offload(config(0), need(config(0), false, false) - 1);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("without offload"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parallel.zero.stage >= 1"), std::string::npos);
  }
}

// 2d (and 2.5d / 3d) run ZeRO 1 on the model's own store: the moments can move, the parameters
// cannot (ZeRO 3 runs in 1d only). The planner's grid closed forms price both.
TEST(OffloadPolicy, GridModesOffloadTheOptimizerStatesOnly) {
  const io::Config grid = config(1, ", tensor: {size: 4, mode: 2d}");
  const double none = need(grid, false, false), opt = need(grid, true, false);
  ASSERT_GT(none, opt);
  OffloadDecision d = decide_offload(grid, none - 1);
  EXPECT_TRUE(d.optimizer);
  EXPECT_FALSE(d.params);
  EXPECT_EQ(d.fraction, 1.0 / kOffloadChunks);
  d = decide_offload(grid, opt);
  EXPECT_TRUE(d.optimizer && !d.params);
  EXPECT_EQ(d.device_bytes, opt);
  try {
    decide_offload(grid, opt - 1);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("2d cannot offload parameters"), std::string::npos)
        << e.what();
  }
}

// A grid run that samples at its end holds the whole model on world rank 0 beside its grid rank
// (apps::whole_model_bytes), which nothing offloads: the device must hold both there.
TEST(OffloadPolicy, GridRankZeroCountsTheWholeModelItSamplesWith) {
  io::Config grid = config(1, ", tensor: {size: 4, mode: 2d}");
  grid.sample.tokens = 20;
  const double whole = whole_model_bytes(grid, MemoryPool::device, /*device_build=*/true);
  ASSERT_GT(whole, 0.0);
  const double none = need(grid, false, false), opt = need(grid, true, false);
  EXPECT_FALSE(decide_offload(grid, none + whole).optimizer);
  OffloadDecision d = decide_offload(grid, none + whole - 1);
  EXPECT_TRUE(d.optimizer);
  d = decide_offload(grid, opt + whole);
  EXPECT_EQ(d.fraction, 1.0);
  EXPECT_EQ(d.device_bytes, opt + whole);
  EXPECT_THROW(decide_offload(grid, opt + whole - 1), std::invalid_argument);
  // Two ranks on the GPU: each rank's plan twice, the whole model once.
  EXPECT_FALSE(decide_offload(grid, 2 * none + whole, 2).optimizer);
  EXPECT_TRUE(decide_offload(grid, 2 * none + whole - 1, 2).optimizer);
  EXPECT_EQ(decide_offload(grid, 2 * opt + whole, 2).device_bytes, 2 * opt + whole);
}

// checkpointing.policy: rotor under a memory_budget that no schedule meets while the optimizer
// state is on a GPU's device: offloading takes it off the budget (MemoryPrediction::against), so
// the policy offloads until the schedule fits rather than stopping at the first unmet budget;
// and a budget that no offload can meet is that error, naming the key.
TEST(OffloadPolicy, OffloadsUntilRotorsBudgetIsMet) {
  io::Config c = config(1);
  c.hardware.preset = "h200";
  c.checkpointing.policy = core::CheckpointPolicy::rotor;
  c.checkpointing.memory_budget = 1.0;
  const planner::HardwareSpec hw = hardware_spec(c, 0);
  ASSERT_GT(hw.host_link_bandwidth, 0.0);
  auto minimum = [&](bool offload) {
    io::Config o = c;
    o.parallel.offload_optimizer = offload;
    return planner::plan_checkpointing(o.model, rank_layout(o, 0), hw,
                                       core::CheckpointPolicy::rotor, 1.0, 0, {})
        .minimum_bytes;
  };
  const double kept = minimum(false), moved = minimum(true);
  ASSERT_LT(moved, kept);
  c.checkpointing.memory_budget = (kept + moved) / 2 / (1024.0 * 1024 * 1024);
  const OffloadDecision d = decide_offload(c, 1e12);
  EXPECT_TRUE(d.optimizer);
  EXPECT_GT(d.fraction, 0.0);
  c.checkpointing.memory_budget = moved / 2 / (1024.0 * 1024 * 1024);
  try {
    decide_offload(c, 1e12);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("checkpointing.memory_budget"), std::string::npos)
        << e.what();
  }
}

TEST(OffloadPolicy, ApplyUsesTheConfiguredDeviceSizeAndStaticChangesNothing) {
  io::Config c = config(3);
  const double none = need(c, false, false), opt = need(c, true, false);
  // (A CUDA build keeps kDeviceRuntimeBytesPerRank of the key free for cuBLAS and NCCL.)
  const double room = device_resident_build() ? kDeviceRuntimeBytesPerRank : 0.0;
  c.hardware.device_memory_gib = ((none + opt) / 2 + room) / (1024.0 * 1024 * 1024);
  const io::Config decided = apply_offload_policy(c, nullptr);
  EXPECT_TRUE(decided.parallel.offload_optimizer);
  EXPECT_FALSE(decided.parallel.offload_params);
  // About half of the moments' bytes are needed: about half of the chunks move, and the planner
  // says the decided config fits.
  EXPECT_GT(decided.parallel.offload_fraction, 0.3);
  EXPECT_LT(decided.parallel.offload_fraction, 0.7);
  EXPECT_LE(need(decided, true, false, decided.parallel.offload_fraction),
            c.hardware.device_memory_gib * 1024.0 * 1024 * 1024);
  c.parallel.offload_policy = "static";
  const io::Config same = apply_offload_policy(c, nullptr);
  EXPECT_FALSE(same.parallel.offload_optimizer);
}

TEST(OffloadPolicy, KeysAreValidated) {
  auto error = [](const std::string& extra) {
    try {
      config(3, extra);
    } catch (const io::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  try {
    io::parse_config("model: {preset: gpt2-124m}\ndata: {path: d}\n"
                     "parallel: {zero: {offload: {policy: dynamic}}}\n", "t.yaml");
    ADD_FAILURE() << "accepted";
  } catch (const io::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.zero.offload.policy: invalid value 'dynamic'"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("one of: static, auto"), std::string::npos);
  }
  EXPECT_EQ(error(""), "accepted");
  // A share of the optimizer state: in (0, 1], with the optimizer offloaded and the parameters
  // not.
  auto offload = [](const std::string& keys) {
    try {
      io::parse_config("model: {layers: 4, hidden: 256, heads: 8, vocab: 512, max_seq: 64}\n"
                       "data: {path: unused.bin}\n"
                       "train: {steps: 3, seq_len: 64, global_batch: 4, micro_batch: 2}\n"
                       "parallel: {data: 2, zero: {stage: 3, offload: {" + keys + "}}}\n",
                       "t.yaml");
    } catch (const io::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(offload("optimizer: true, optimizer_fraction: 0.25"), "accepted");
  EXPECT_EQ(offload("optimizer: true, params: true, params_fraction: 0.25"), "accepted");
  for (const auto& [keys, want] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer: true, optimizer_fraction: 0", "parallel.zero.offload.optimizer_fraction"},
           {"optimizer: true, optimizer_fraction: 1.5",
            "parallel.zero.offload.optimizer_fraction"},
           {"optimizer_fraction: 0.5", "with parallel.zero.offload.optimizer = false"},
           {"optimizer: true, params: true, optimizer_fraction: 0.5",
            "with parallel.zero.offload.params = true"},
           // A share of the parameter shard: in (0, 1], with the parameters offloaded.
           {"optimizer: true, params: true, params_fraction: 0",
            "parallel.zero.offload.params_fraction"},
           {"optimizer: true, params: true, params_fraction: 2",
            "parallel.zero.offload.params_fraction"},
           {"optimizer: true, params_fraction: 0.5",
            "0.5 with parallel.zero.offload.params = false"}}) {
    const std::string got = offload(keys);
    EXPECT_NE(got.find(want), std::string::npos) << keys << ": " << got;
  }
  try {
    io::parse_config("model: {preset: gpt2-124m}\ndata: {path: d}\n"
                     "hardware: {device_memory_gib: -1}\n", "t.yaml");
    ADD_FAILURE() << "accepted";
  } catch (const io::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hardware.device_memory_gib"), std::string::npos)
        << e.what();
  }
}

// model.fused_attention: auto under offload.policy: auto: each attention is costed with the offload
// the policy would then choose for it. Where only offloading makes either fit (the optimizer
// state of a large vocabulary dwarfs the probabilities), both fit with it and the faster wins,
// with its offload; costed as written, neither would fit and the smaller (fused) would be taken
// for nothing.
TEST(AttentionAuto, EachAttentionIsCostedWithTheOffloadThePolicyChooses) {
  const io::Config c = io::parse_config(
      "model: {layers: 2, hidden: 256, heads: 4, vocab: 60000, max_seq: 256, "
      "fused_attention: auto}\n"
      "data: {path: unused.bin}\n"
      "train: {steps: 3, seq_len: 256, global_batch: 8, micro_batch: 2}\n"
      "parallel: {data: 2, zero: {stage: 1, offload: {policy: auto}}}\n",
      "t.yaml");
  ASSERT_TRUE(c.fused_attention_auto);
  io::Config dense = c, fused = c;
  dense.fused_attention_auto = fused.fused_attention_auto = false;
  fused.model.fused_attention = true;
  const double dense_kept = need(dense, false, false), dense_moved = need(dense, true, false);
  const double fused_kept = need(fused, false, false), fused_moved = need(fused, true, false);
  ASSERT_LT(fused_kept, dense_kept);
  ASSERT_LT(std::max(dense_moved, fused_moved), fused_kept) << "the moments dominate";
  const double cap = (std::max(dense_moved, fused_moved) + fused_kept) / 2;
  planner::Cluster cluster{planner::hardware_preset("h100"), 2};
  cluster.hw.memory_bytes = cap;
  const AttentionDecision d = decide_attention(c, cluster, cap);
  ASSERT_GT(d.fused_plan.step_time, 0.0) << d.unavailable;
  EXPECT_TRUE(d.dense_plan.fits) << d.dense_plan.why;
  EXPECT_TRUE(d.fused_plan.fits) << d.fused_plan.why;
  EXPECT_TRUE(d.dense_plan.run.offload_optimizer && d.fused_plan.run.offload_optimizer);
  EXPECT_EQ(d.fused, d.fused_plan.step_time < d.dense_plan.step_time);
  // offload.policy: static, as written: neither fits, the smaller is taken.
  io::Config fixed = c;
  fixed.parallel.offload_policy = "static";
  const AttentionDecision s = decide_attention(fixed, cluster, cap);
  EXPECT_FALSE(s.dense_plan.fits);
  EXPECT_FALSE(s.fused_plan.fits);
  EXPECT_TRUE(s.fused);
  // Ring attention keeps its rows of the probabilities: dense, the fused one not costed.
  io::Config ring = c;
  ring.parallel.data = 1;
  ring.parallel.sequence = 2;
  const AttentionDecision r = decide_attention(ring, cluster, cap);
  EXPECT_FALSE(r.fused);
  EXPECT_EQ(r.fused_plan.step_time, 0.0);
  EXPECT_NE(r.unavailable.find("ring attention"), std::string::npos) << r.unavailable;
}

}  // namespace
}  // namespace colossal::apps
