// Activation checkpointing under every policy and the cost model's memory prediction, on one rank
// and under the parallel layouts (mpirun -np 1/2/4):
// - each policy trains the same losses as keeping everything on the same layout (bitwise on one
//   rank; within 1e-6 relative under parallel layouts);
// - the predicted memory per rank (planner::predict_memory on the layout and schedule the trainer
//   runs) is within 5% of what the tracker counted during the run (both printed);
// - rotor's schedule fits its budget and drops something when the budget demands it.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "apps/layout.hpp"
#include "apps/trainer.hpp"
#include "io/config.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"

using namespace colossal;

namespace {

struct Case {
  int ranks;
  std::string arch;
  std::string parallel;       // the parallel: block's body
  std::string checkpointing;  // the checkpointing: block's body; rotor's budget is filled in
  std::string name;
};

std::string config_text(const std::string& data, const Case& c, const std::string& checkpointing,
                        const std::string& run) {
  return "model: {arch: " + c.arch + (c.arch == "llama" ? ", kv_heads: 2" : "") +
         ", layers: 4, hidden: 32, heads: 4, ffn_hidden: 64, "
         "vocab: 200, max_seq: 64, vocab_multiple: 16}\n"
         "data: {path: " + data + "}\n"
         "train: {steps: 4, seq_len: 64, global_batch: 8, micro_batch: 2,\n"
         "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
         "parallel: {" + c.parallel + "}\n"
         "checkpointing: {" + checkpointing + "}\n"
         "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
         (std::filesystem::temp_directory_path() / ("colossal_ap_" + run)).string() + "}\n";
}

int pipeline_rank(const io::Config& config, int world_rank, int world_size) {
  return world_rank / (world_size / config.parallel.pipeline);  // stages are outermost
}

// A budget half-way between the `full` and `none` memory of the most demanding pipeline rank.
double rotor_budget_gib(const io::Config& base) {
  const planner::HardwareSpec hw = apps::hardware_spec(base, 0);
  double none = 0, full = 0;
  for (int stage = 0; stage < base.parallel.pipeline; ++stage) {
    io::Config c = base;
    c.checkpointing = {};
    none = std::max(none, planner::predict_memory(c.model, apps::rank_layout(c, stage)).total());
    c.checkpointing.policy = core::CheckpointPolicy::full;
    const apps::ActivationPlan plan = apps::activation_plan(c, stage, hw);
    full = std::max(full, planner::predict_memory(
                              c.model, apps::rank_layout(c, stage, plan.keep, plan.selective))
                              .total());
  }
  return (full + 0.5 * (none - full)) / (1024.0 * 1024.0 * 1024.0);
}

class ActivationPlans : public ::testing::TestWithParam<Case> {};

TEST_P(ActivationPlans, SameLossesAndPredictedMemory) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Case c = GetParam();
  if (world.size() != c.ranks) GTEST_SKIP() << "layout needs " << c.ranks << " ranks";
  const std::string data = test::shared_training_text(world, "colossal_ap_data.txt", 4242);

  const io::Config kept = io::parse_config(config_text(data, c, "policy: none", "kept"), "test");
  std::string checkpointing = c.checkpointing;
  if (checkpointing.find("rotor") != std::string::npos) {
    char budget[64];
    std::snprintf(budget, sizeof budget, ", memory_budget: %.9f", rotor_budget_gib(kept));
    checkpointing += budget;
  }
  const io::Config config =
      io::parse_config(config_text(data, c, checkpointing, "plan"), "test");

  apps::Trainer reference(kept, nullptr, &world);
  const apps::TrainSummary expected = reference.train();
  apps::Trainer trainer(config, nullptr, &world);
  const apps::TrainSummary got = trainer.train();
  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    if (c.ranks == 1) {
      EXPECT_EQ(got.losses[i], expected.losses[i]) << "step " << i + 1;
    } else {
      EXPECT_NEAR(got.losses[i], expected.losses[i], 1e-6 * std::abs(expected.losses[i]))
          << "step " << i + 1;
    }
  }

  // The prediction for this rank's layout and schedule against the tracker.
  const int stage = pipeline_rank(config, world.rank(), world.size());
  const planner::HardwareSpec hw = apps::hardware_spec(config, 0);  // as the trainer plans
  const apps::ActivationPlan plan = apps::activation_plan(config, stage, hw);
  const planner::MemoryPrediction predicted =
      planner::predict_memory(config.model, apps::rank_layout(config, stage, plan.keep, plan.selective));
  const double measured = double(trainer.memory().peak_total());
  std::printf("[rank %d] %s: %s | predicted %.0f bytes, tracker peak %.0f (%+.2f%%)\n",
              world.rank(), c.name.c_str(), plan.description.c_str(), predicted.total(), measured,
              100.0 * (predicted.total() / measured - 1.0));
  EXPECT_NEAR(predicted.total(), measured, 0.05 * measured) << predicted.format();
  const double reference_memory = double(reference.memory().peak_total());
  // Never more than keeping everything; strictly less where something must be dropped (a stage
  // with one micro-batch in flight and one segment over all its blocks saves nothing: the arena
  // then holds what would have been kept).
  EXPECT_LE(measured, reference_memory);
  if (c.ranks == 1) {
    EXPECT_LT(measured, reference_memory) << "checkpointing must save memory";
  }
  if (config.checkpointing.policy == core::CheckpointPolicy::rotor) {
    EXPECT_LE(predicted.total(), config.checkpointing.memory_budget * 1024.0 * 1024.0 * 1024.0);
  }
}

// parallel.mode: auto at every rank count: rank 0 plans the layout (whatever it chooses: data,
// tensor, sequence, pipeline, ZeRO, checkpointing), every rank trains it, and the losses are those
// of one rank.
TEST(AutoPlan, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = test::shared_training_text(world, "colossal_auto_data.txt", 99);
  auto text = [&](const std::string& run, const std::string& mode) {
    return "model: {arch: gpt2, layers: 4, hidden: 32, heads: 4, ffn_hidden: 64, vocab: 200, "
           "max_seq: 32, vocab_multiple: 16}\n"
           "data: {path: " + data + "}\n"
           "train: {steps: 10, seq_len: 32, global_batch: 8, micro_batch: 2,\n"
           "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
           "parallel: {mode: " + mode + ", bucket_mb: 0.01}\n"
           "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
           (std::filesystem::temp_directory_path() / ("colossal_auto_" + run)).string() + "}\n";
  };
  apps::Trainer reference(
      io::parse_config(text("ref" + std::to_string(world.rank()), "manual"), "test"), nullptr);
  const apps::TrainSummary expected = reference.train();
  std::string report;
  const io::Config planned = apps::plan_automatically(
      io::parse_config(text("auto", "auto"), "test"), world, 1, &report);
  if (world.rank() == 0) std::printf("%s", report.c_str());
  EXPECT_EQ(planned.parallel.mode, io::ParallelMode::manual);
  EXPECT_EQ(planned.parallel.world_size(), world.size());
  // As colossal_train does: 2d / 2.5d / 3d plans run on apps::Trainer.
  if (planned.parallel.tensor_mode != core::TensorMode::d1) {
    apps::Trainer trainer(planned, nullptr, &world);
    test::expect_same_losses(trainer.train(), expected);
    if (world.rank() == 0) std::printf("planned:\n%s", trainer.plan().c_str());
    return;
  }
  apps::Trainer trainer(planned, nullptr, &world);
  const apps::TrainSummary got = trainer.train();
  test::expect_same_losses(got, expected);
  if (world.rank() == 0) std::printf("planned:\n%s", trainer.plan().c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ActivationPlans,
    ::testing::Values(
        Case{1, "gpt2", "", "policy: full", "gpt2_full"},
        Case{1, "llama", "", "policy: full", "llama_full"},
        Case{2, "llama", "tensor: {size: 2}", "policy: full", "llama_tp2_full"},
        Case{1, "opt", "", "policy: every_k, every: 2", "opt_every2"},
        Case{1, "gpt2", "", "policy: sqrt", "gpt2_sqrt"},
        Case{1, "opt", "", "policy: rotor", "opt_rotor"},
        Case{1, "gpt2", "", "policy: rotor", "gpt2_rotor"},
        Case{1, "gpt2", "", "policy: selective", "gpt2_selective"},
        Case{1, "opt", "", "policy: manual, blocks: [1, 3]", "opt_manual"},
        Case{2, "gpt2", "data: 2", "policy: full", "gpt2_dp2_full"},
        Case{2, "opt", "data: 2, zero: {stage: 2}", "policy: rotor", "opt_dp2_zero2_rotor"},
        Case{2, "gpt2", "data: 2, zero: {stage: 3, offload: {optimizer: true, params: true}}",
             "policy: sqrt", "gpt2_dp2_zero3_offload_sqrt"},
        // Recomputed segments gather their blocks out of the prefetch's order.
        Case{2, "opt", "data: 2, zero: {stage: 3}", "policy: every_k, every: 2",
             "opt_dp2_zero3_every2"},
        Case{2, "opt", "tensor: {size: 2}", "policy: rotor", "opt_tp2_rotor"},
        Case{2, "gpt2", "tensor: {size: 2, sequence_split: true}", "policy: every_k, every: 2",
             "gpt2_tp2_split_every2"},
        Case{2, "gpt2", "pipeline: {size: 2}", "policy: rotor", "gpt2_pp2_rotor"},
        Case{2, "opt", "sequence: 2", "policy: full", "opt_sp2_full"},
        Case{2, "gpt2", "pipeline: {size: 2, schedule: gpipe}", "policy: selective",
             "gpt2_pp2_gpipe_selective"},
        Case{4, "gpt2", "data: 2, tensor: {size: 2}, zero: {stage: 1}", "policy: rotor",
             "gpt2_dp2_tp2_zero1_rotor"},
        Case{4, "opt", "data: 2, pipeline: {size: 2}, zero: {stage: 2}", "policy: full",
             "opt_dp2_pp2_zero2_full"},
        Case{4, "gpt2", "data: 2, pipeline: {size: 2, schedule: interleaved, chunks: 2}",
             "policy: rotor", "gpt2_dp2_pp2_interleaved_rotor"},
        Case{4, "opt", "tensor: {size: 2, sequence_split: true}, pipeline: {size: 2}",
             "policy: sqrt", "opt_tp2_split_pp2_sqrt"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
