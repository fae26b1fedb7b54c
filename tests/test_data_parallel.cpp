// Data parallelism and ZeRO stages 0-2 train the same model as one rank: per-step losses and final
// weights against a single-process run of the same config, plus the per-rank memory and the bytes
// each stage moves, against their closed forms.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "apps/trainer.hpp"
#include "io/config.hpp"
#include "parallel/mpi_communicator.hpp"

using namespace colossal;

namespace {

std::string shared_data(parallel::Communicator& world) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "colossal_dp_data.txt").string();
  if (world.rank() == 0) {
    // Text with structure but no short period, so losses keep moving for all ten steps.
    std::string text;
    uint32_t s = 12345;
    for (int i = 0; i < 6000; ++i) {
      s = s * 1103515245u + 12345u;
      text.push_back(static_cast<char>("abcdefgh ijklmnop\n"[(s >> 16) % 18]));
      if (i % 7 == 0) text += "the ";
    }
    std::ofstream(path) << text;
  }
  world.barrier();
  return path;
}

// `run` names the log directory: single-rank references run on every rank at once, so each needs
// its own.
io::Config config(const std::string& data, const std::string& arch, int dp, int stage,
                  const std::string& run = "dp", bool offload = false) {
  const std::string text =
      "model: {arch: " + arch + ", layers: 2, hidden: 32, heads: 4, vocab: 256, max_seq: 16}\n"
      "data: {path: " + data + "}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 8, micro_batch: 2,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
      "parallel: {data: " + std::to_string(dp) + ", zero: {stage: " + std::to_string(stage) +
      ", offload: {optimizer: " + (offload ? "true" : "false") + "}}, bucket_mb: 0.01}\n"
      "eval: {every: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

struct Param {
  std::string arch;
  int stage;
  bool offload = false;
};

class DataParallel : public ::testing::TestWithParam<Param> {};

TEST_P(DataParallel, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size();
  const std::string data = shared_data(world);
  const auto [arch, stage, offload] = GetParam();

  apps::Trainer reference(config(data, arch, 1, 0, "reference" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();

  apps::Trainer trainer(config(data, arch, dp, stage, "dp", offload), nullptr, &world);
  EXPECT_NE(trainer.plan().find("mesh: {data: " + std::to_string(dp) + ","), std::string::npos)
      << trainer.plan();
  EXPECT_NE(trainer.plan().find("zero: {stage: " + std::to_string(stage) + ","), std::string::npos);
  world.reset_stats();
  const apps::TrainSummary got = trainer.train();

  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], expected.losses[i], 1e-5 * std::abs(expected.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_LT(got.losses.back(), got.losses.front() - 0.5) << "the run must actually learn";
  const std::size_t logical = reference.model().flat_size();  // padded for one rank
  double worst = 0;
  for (std::size_t i = 0; i < logical; ++i) {
    worst = std::max(worst, double(std::abs(trainer.model().params()[i] - reference.model().params()[i])));
  }
  EXPECT_LT(worst, 1e-5);

  // Memory per rank: the flat buffers are padded to dp*16 floats and split in dp shards.
  const std::size_t padded = trainer.model().flat_size();
  EXPECT_EQ(padded % (std::size_t(dp) * 16), 0u);
  const std::size_t shard = padded / dp;
  const auto& mem = trainer.memory();
  if (offload) {
    // Moments, the gradient shard and the parameter shard, all in host memory.
    EXPECT_EQ(mem.current(core::MemCategory::optimizer), 0u);
    EXPECT_EQ(mem.current(core::MemCategory::offloaded), 4 * 4 * shard);
    EXPECT_EQ(trainer.optimizer().offload_stats().to_host_bytes, 10 * 2 * 4 * shard);
    EXPECT_EQ(trainer.optimizer().offload_stats().to_device_bytes, 10 * 4 * shard);
  } else {
    EXPECT_EQ(mem.current(core::MemCategory::optimizer), 2 * 4 * (stage == 0 ? padded : shard));
    EXPECT_EQ(mem.current(core::MemCategory::offloaded), 0u);
  }
  EXPECT_EQ(mem.current(core::MemCategory::gradients), 4 * (padded + (stage == 2 ? shard : 0)));

  // Bytes per step on the data-parallel communicator (payload convention of CommStats):
  // the loss all-reduce (one double, 8 bytes) plus the gradient sync and, for stages 1-2, the
  // gather.
  const auto& stats = world.stats();
  const uint64_t steps = 10;
  const uint64_t grads = padded * 4;
  if (dp == 1) {
    // One rank moves nothing: only the scalar loss all-reduce is called (no gradient buckets).
    EXPECT_EQ(stats.total_wire_bytes(), 0.0) << "one rank communicates nothing";
    EXPECT_EQ(stats.total_calls(), steps * (stage == 2 ? 2 : 1));
    EXPECT_EQ(stats.reduce_scatter.calls + stats.all_gather.calls, 0u);
  } else if (stage < 2) {
    EXPECT_EQ(stats.all_reduce.payload_bytes, steps * (grads + 8));
    EXPECT_EQ(stats.all_reduce.calls, steps * (trainer.optimizer().buckets().size() + 1));
    EXPECT_EQ(stats.reduce_scatter.calls, 0u);
    EXPECT_EQ(stats.all_gather.payload_bytes, stage == 1 ? steps * grads : 0u);
  } else {
    EXPECT_EQ(stats.reduce_scatter.payload_bytes, steps * grads);
    EXPECT_EQ(stats.reduce_scatter.calls, steps * trainer.optimizer().buckets().size());
    EXPECT_EQ(stats.all_reduce.payload_bytes, steps * 16);  // loss and squared norm, doubles
    EXPECT_EQ(stats.all_gather.payload_bytes, steps * grads);
  }
  if (dp > 1) {
    EXPECT_GT(trainer.optimizer().buckets().size(), 1u) << "bucket_mb 0.01 must give several buckets";
    if (stage < 2) {
      // Buckets of the last blocks start reducing while backward still runs the earlier ones.
      EXPECT_GT(trainer.optimizer().buckets_started_early(), steps);
    }
    // Ring algorithms: an all-reduce moves 2(p-1)/p of its payload per rank, reduce-scatter and
    // all-gather (p-1)/p.
    const double f = double(dp - 1) / dp;
    if (stage < 2) {
      EXPECT_NEAR(stats.all_reduce.wire_bytes, 2 * f * steps * (grads + 8), 1.0);
    } else {
      EXPECT_NEAR(stats.reduce_scatter.wire_bytes, f * steps * grads, 1.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesAndArchitectures, DataParallel,
    ::testing::Values(Param{"gpt2", 0}, Param{"gpt2", 1}, Param{"gpt2", 2}, Param{"opt", 0},
                      Param{"opt", 1}, Param{"opt", 2}, Param{"gpt2", 1, true},
                      Param{"opt", 2, true}),
    [](const auto& info) {
      return info.param.arch + "_zero" + std::to_string(info.param.stage) +
             (info.param.offload ? "_offload" : "");
    });

TEST(DataParallelConfig, WorldSizeMismatchIsACollectiveError) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = shared_data(world);
  try {
    const int wrong = world.size() == 1 ? 2 : 1;  // still a valid config on its own
    apps::Trainer trainer(config(data, "gpt2", wrong, 0), nullptr, &world);
    FAIL() << "expected an error";
  } catch (const apps::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks were started"), std::string::npos) << e.what();
  }
}

}  // namespace
