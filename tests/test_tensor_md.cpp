// colossal_train's 2d, 2.5d and 3d tensor modes (apps::Trainer) train the single-rank model:
// 10 steps of per-step losses within 1e-5 relative and final logical weights (worst below 1e-4,
// mean below 1e-6: tests/sharded_parity.hpp says why looser than 1d's count) against
// apps::Trainer on one rank, for GPT-2 and OPT: 2d on 4 ranks, 2.5d (q = 2, depth 2), 3d and
// 2d x dp2 (also with ZeRO 1, ZeRO 1 with the optimizer offloaded, ZeRO 2, and ZeRO 2 with the
// optimizer offloaded, whole or half of each shard's states), and 3d under ZeRO 2 (one data rank: the sharded store's slices are whole
// units) on 8; with two pipeline stages (1F1B, and GPipe under ZeRO 1), 2d on 8 and 2.5d, 3d and
// 2d x dp2 on 16, also 2d x dp2 and 3d under ZeRO 2 (the tied embedding summed between the
// first and the last stage's shards); interleaved (2 chunks a rank, 4 blocks) 2d x pp2 on 8 and
// 2d x dp2 x pp2 under ZeRO 2 on 16; with model.fused_attention (against the single rank's
// fused run), 2d on 4, 2.5d, 3d and 2d x pp2 on 8. Also the model
// file holds the logical tensors and the tensor group's per-rank parameters are the mode's
// fraction; and training checkpoints resume, also across layouts.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "apps/layout.hpp"
#include "apps/trainer.hpp"
#include "core/host_threads.hpp"
#include "io/config.hpp"
#include "io/hdf5_file.hpp"
#include "parallel/mpi_communicator.hpp"
#include "planner/cost_model.hpp"
#include "train_parity.hpp"

using namespace colossal;

namespace {

struct Layout {
  std::string arch, mode;
  int tensor, depth = 1, data = 1;
  int zero = 0;  // ZeRO stage (0, 1 or 2)
  bool offload = false;  // parallel.zero.offload.optimizer (ZeRO 1-2)
  int pipeline = 1;      // pipeline stages
  std::string schedule = "1f1b";
  int chunks = 1;        // model chunks per rank (schedule interleaved)
  int layers = 2;
  bool bf16_reduce = false;  // parallel.grad_reduce: bf16 (the data ranks' sums)
  double offload_fraction = 1.0;  // parallel.zero.offload.optimizer_fraction
  bool fused = false;  // model.fused_attention (the single-rank reference's too)
  int ranks() const { return tensor * data * pipeline; }
  // This rank's pipeline stage (the mesh: tensor innermost, then data, then pipeline).
  int stage(int rank) const { return rank / (tensor * data); }
};

io::Config config(const std::string& data, const Layout& l, bool sharded, const std::string& run) {
  const std::string text =
      "model: {arch: " + l.arch + ", layers: " + std::to_string(l.layers) +
      ", hidden: 32, heads: 4, ffn_hidden: 64, vocab: 201,"
      " max_seq: 16" + (l.fused ? ", fused_attention: true" : "") + "}\n"
      "data: {path: " + data + "}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 16, micro_batch: 4,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n" +
      (sharded ? "parallel: {data: " + std::to_string(l.data) + ", tensor: {size: " +
                     std::to_string(l.tensor) + ", mode: " + l.mode +
                     ", depth: " + std::to_string(l.depth) + "}, zero: {stage: " +
                     std::to_string(l.zero) + ", offload: {optimizer: " +
                     (l.offload ? "true" : "false") +
                     (l.offload_fraction < 1.0
                          ? ", optimizer_fraction: " + std::to_string(l.offload_fraction)
                          : std::string()) +
                     "}}, pipeline: {size: " +
                     std::to_string(l.pipeline) + ", schedule: " + l.schedule +
                     ", chunks: " + std::to_string(l.chunks) + "}" +
                     (l.bf16_reduce ? ", grad_reduce: bf16" : "") + "}\n"
               : std::string()) +
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

// Under COLOSSAL_TEST_GROUPED_P2P=1 (ctest's grouped-p2p run: the pipeline's messages exchanged
// in groups, as under NCCL) only the layouts with pipeline stages have anything new to show.
class TensorMD : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    const char* grouped = std::getenv("COLOSSAL_TEST_GROUPED_P2P");
    if (grouped != nullptr && std::string(grouped) == "1" && GetParam().pipeline == 1) {
      GTEST_SKIP() << "no pipeline stages: nothing grouped";
    }
  }
};

TEST_P(TensorMD, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  if (world.size() != layout.ranks()) GTEST_SKIP() << "needs another rank count";
  const std::string data = test::shared_training_text(world, "colossal_md_data.txt", 4242);
  apps::Trainer reference(config(data, layout, false, "md_ref" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();

  apps::Trainer trainer(config(data, layout, true, "md_" + layout.mode), nullptr, &world);
  EXPECT_NE(trainer.plan().find("mode: " + layout.mode), std::string::npos) << trainer.plan();
  const apps::TrainSummary got = trainer.train();
  // Gradients summed in bf16 over the data ranks: losses within bf16's rounding of the fp32
  // run's, and weights off by AdamW's response to it (test_data_parallel), not fp32 rounding.
  test::expect_same_losses(got, expected, layout.bf16_reduce ? 2e-4 : 1e-5);

  const std::vector<float> weights = trainer.logical_parameters();
  const std::vector<float> want = reference.logical_parameters();
  ASSERT_EQ(weights.size(), want.size());
  const test::WeightDifference diff = test::weight_difference(weights, want);
  if (layout.bf16_reduce) {
    EXPECT_LT(diff.mean, 1e-4);
    EXPECT_GT(diff.mean, 1e-7) << "the sums must have been rounded";
  } else {
    EXPECT_LT(diff.worst, 1e-4);
    EXPECT_LT(diff.mean, 1e-6);
  }

  // The model file (rank 0) holds the same logical tensors.
  if (world.rank() == 0) {
    std::vector<float> file(want.size(), 0.0f);
    io::read_model_file(got.model_path, trainer.logical_table(), file);
    for (std::size_t e = 0; e < file.size(); ++e) ASSERT_EQ(file[e], weights[e]) << e;
  }
  // Parameters per rank: about 1/q^2 (2d, 2.5d) or 1/q^3 (3d) of the single rank's, plus the
  // replicated vectors; over pipeline stages, this stage's blocks (and embedding or head).
  const double share = double(trainer.memory().current(core::MemCategory::parameters)) /
                       double(reference.memory().current(core::MemCategory::parameters));
  const double blocks = (layout.mode == "3d" ? 1.0 / 8 : 1.0 / 4) / layout.pipeline;
  EXPECT_GT(share, blocks);
  EXPECT_LT(share, blocks + 0.15);
  // The planner's prediction for this layout is the tracker's, category by category.
  const io::Config c = config(data, layout, true, "md_" + layout.mode);
  planner::RankLayout l = apps::rank_layout(c, layout.stage(world.rank()));  // stage and slots
  l.tensor_mode = *core::parse_tensor_mode(layout.mode);
  l.tensor = layout.tensor;  // q = 2
  l.depth = layout.depth;
  l.data = layout.data;
  l.micro_batch = c.train.micro_batch;
  l.micro_batches = c.accumulation_steps();
  l.seq_len = c.train.seq_len;
  l.zero_stage = layout.zero;
  l.offload_optimizer = layout.offload;
  l.offload_fraction = layout.offload_fraction;
  l.bf16_reduce = layout.bf16_reduce;
  const planner::MemoryPrediction predicted = planner::predict_memory(c.model, l);
  for (int k = 0; k < int(core::MemCategory::count); ++k) {
    EXPECT_EQ(predicted.bytes[std::size_t(k)],
              double(trainer.memory().peak(core::MemCategory(k))))
        << core::category_name(core::MemCategory(k));
  }
  if (layout.fused) {
    // Each block kept its rows' log-sum-exp, not the T x T probabilities: (B/q) sequences (3d:
    // B/q^2) x (H/q) heads x T x (T - 1) floats fewer than the dense attention's plan, a slot.
    core::ModelSpec dense = c.model;
    dense.fused_attention = false;
    const double activations = double(trainer.memory().peak(core::MemCategory::activations));
    const int T = c.train.seq_len, q = 2, blocks = c.model.layers / layout.pipeline;
    const double sequences = double(c.train.micro_batch) / (layout.mode == "3d" ? q * q : q);
    EXPECT_EQ(planner::predict_memory(dense, l)[core::MemCategory::activations] - activations,
              4.0 * l.chunks.front().slots * blocks * sequences * (c.model.heads / q) * T *
                  (T - 1));
  }
  // Ranks taking turns on the cores (mpirun --oversubscribe): every rank of a stage's grid does
  // the same work, so the predicted step is the node's thread-seconds (the stages' mean busy
  // time: they have equal ranks) over its cores.
  const core::ThreadPlan threads = core::current_thread_plan();
  const planner::TimePrediction& time = trainer.predicted_time();
  if (threads.oversubscribed()) {
    double busy = time.step - time.shared_cores;
    MPI_Allreduce(MPI_IN_PLACE, &busy, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    busy /= world.size();
    EXPECT_GT(time.shared_cores, 0.0);
    EXPECT_NEAR(time.step, busy * threads.local_ranks * threads.threads / threads.node_cores,
                1e-9 * time.step);
  } else {
    EXPECT_EQ(time.shared_cores, 0.0);
  }
}

// Training checkpoints: a resumed run continues bitwise where the interrupted one left off; and
// since the files hold logical tensors, apps::Trainer on one rank (1d) resumes a 2d/2.5d/3d
// checkpoint and this layout resumes one written by a single rank, both continuing the same
// curve (within the parity tolerance).
TEST_P(TensorMD, CheckpointsResumeHereAndAcrossLayouts) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  if (world.size() != layout.ranks()) GTEST_SKIP() << "needs another rank count";
  // They compare against fp32 sums; the bf16 sums' layouts are TrainsTheSingleRankModel's.
  if (layout.bf16_reduce) GTEST_SKIP() << "compares against fp32 gradient sums";
  const std::string data = test::shared_training_text(world, "colossal_md_data.txt", 4242);
  const std::string name = "md_ck_" + layout.arch + "_" + std::to_string(layout.tensor) + "_" +
                           std::to_string(layout.data) + "_" + std::to_string(layout.depth) +
                           "_z" + std::to_string(layout.zero) + (layout.offload ? "o" : "") +
                           (layout.offload_fraction < 1.0 ? "h" : "") +
                           "_pp" + std::to_string(layout.pipeline) + "x" +
                           std::to_string(layout.chunks) + (layout.fused ? "f" : "");
  const std::string rank = std::to_string(world.rank());
  // Steps 1-10 with checkpoints after 4, 8 and 10; then only the one after 4 is left.
  io::Config full = config(data, layout, true, name);
  full.checkpoint.every = 4;
  full.checkpoint.keep = 3;
  const std::string dir = apps::checkpoint_dir(full);
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  const apps::TrainSummary whole = apps::Trainer(full, nullptr, &world).train();
  ASSERT_EQ(whole.losses.size(), 10u);
  // A run resumed after step 4 trains steps 5-10 on `whole`'s curve: bitwise on this layout
  // (relative 0), within the parity tolerance on another.
  auto expect_continues = [&](const apps::TrainSummary& s, double relative) {
    EXPECT_EQ(s.first_step, 4);
    ASSERT_EQ(s.losses.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(s.losses[i], whole.losses[4 + i], relative * whole.losses[4 + i]) << i;
    }
  };
  // This layout resuming from the checkpoints in `from` (none written).
  auto resuming = [&](const std::string& from) {
    io::Config c = full;
    c.checkpoint.every = 0;
    c.checkpoint.resume = io::ResumeMode::automatic;
    c.checkpoint.dir = from;
    return c;
  };
  // Leaves only the checkpoint after step 4 in `in`.
  auto keep_step_4 = [](const std::string& in) {
    ASSERT_TRUE(std::filesystem::remove(in + "/ckpt-8.h5"));
    ASSERT_TRUE(std::filesystem::remove(in + "/ckpt-10.h5"));
  };
  world.barrier();
  if (world.rank() == 0) {
    ASSERT_NO_FATAL_FAILURE(keep_step_4(dir));
  }
  world.barrier();
  expect_continues(apps::Trainer(resuming(dir), nullptr, &world).train(), 0.0);

  // One rank, 1d, from this layout's checkpoint.
  io::Config single = config(data, layout, false, name + "_1d" + rank);
  single.checkpoint.dir = dir;
  single.checkpoint.resume = io::ResumeMode::automatic;
  expect_continues(apps::Trainer(single, nullptr).train(), 1e-5);
  world.barrier();

  // This layout, from the checkpoint a single rank wrote after 4 of its 10 steps (rank 0's).
  io::Config writer = config(data, layout, false, name + "_w" + rank);
  writer.checkpoint.every = 4;
  writer.checkpoint.keep = 3;
  const std::string written = apps::checkpoint_dir(writer);
  std::filesystem::remove_all(written);
  apps::Trainer(writer, nullptr).train();
  ASSERT_NO_FATAL_FAILURE(keep_step_4(written));
  world.barrier();
  const std::string rank0s = apps::checkpoint_dir(config(data, layout, false, name + "_w0"));
  expect_continues(apps::Trainer(resuming(rank0s), nullptr, &world).train(), 1e-5);

  // A stop request (SIGTERM/SIGUSR1) on one rank: every rank stops after the step it is in, with
  // a checkpoint (here after step 5 of the run resumed at 4).
  world.barrier();
  if (world.rank() == 0) apps::request_stop(SIGUSR1);
  const apps::TrainSummary stopped = apps::Trainer(resuming(dir), nullptr, &world).train();
  apps::request_stop(0);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.steps, 5);
  EXPECT_EQ(stopped.checkpoint, dir + "/ckpt-5.h5");
  EXPECT_TRUE(std::filesystem::exists(dir + "/ckpt-5.h5"));
  ASSERT_EQ(stopped.losses.size(), 1u);
  EXPECT_EQ(stopped.losses[0], whole.losses[4]);
}

// Activation checkpointing (whole blocks): `full` recomputes each block from its kept input,
// `sqrt` (2 blocks: one segment of both) the two from block 0's input. The recompute repeats the
// forward's operations in order, so the run is bitwise the one without checkpointing (and so
// within the parity tolerance of one rank); the tracker shows what moved: a dropped block keeps
// only its segment's input (R x c floats) in the activations, and the recompute arena
// (temporaries) holds the longest segment's block sets. rotor (a budget halfway between full and
// keeping everything) and selective (the probabilities rebuilt from q|k|v) are bitwise the same
// run too, and the planner's closed forms with each schedule equal the tracker.
TEST_P(TensorMD, CheckpointingRecomputesBitwiseAndDropsActivations) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  if (world.size() != layout.ranks()) GTEST_SKIP() << "needs another rank count";
  // They compare against fp32 sums; the bf16 sums' layouts are TrainsTheSingleRankModel's.
  if (layout.bf16_reduce) GTEST_SKIP() << "compares against fp32 gradient sums";
  const std::string data = test::shared_training_text(world, "colossal_md_data.txt", 4242);
  apps::Trainer reference(config(data, layout, false, "md_ckref" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();
  auto checkpointed = [&](core::CheckpointPolicy policy, const std::string& name,
                          double budget_gib) {
    io::Config c = config(data, layout, true, "md_ck" + name + layout.mode);
    c.checkpointing.policy = policy;
    c.checkpointing.memory_budget = budget_gib;
    return c;
  };
  auto run = [&](core::CheckpointPolicy policy, const std::string& name, double budget_gib = 0) {
    auto trainer = std::make_unique<apps::Trainer>(checkpointed(policy, name, budget_gib), nullptr,
                                                   &world);
    const apps::TrainSummary s = trainer->train();
    return std::pair{std::move(trainer), s};
  };
  auto [plain, plain_summary] = run(core::CheckpointPolicy::none, "none");
  auto [full, full_summary] = run(core::CheckpointPolicy::full, "full");
  auto [sqrt, sqrt_summary] = run(core::CheckpointPolicy::sqrt, "sqrt");
  // rotor under a budget halfway between full's peak and keeping everything: the grid's own
  // block sizes (planner::plan_grid_checkpointing), so its peak is within the budget.
  // Pipeline stages differ: every rank takes the largest stage's budget (one config for all).
  const double gib = 1024.0 * 1024.0 * 1024.0;
  double rotor_budget =
      (double(full->memory().peak_total()) + double(plain->memory().peak_total())) / 2 / gib;
  MPI_Allreduce(MPI_IN_PLACE, &rotor_budget, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  auto [rotor, rotor_summary] = run(core::CheckpointPolicy::rotor, "rotor", rotor_budget);
  // selective: every block kept but its attention probabilities, rebuilt in backward.
  auto [selective, selective_summary] = run(core::CheckpointPolicy::selective, "selective");
  EXPECT_LE(double(rotor->memory().peak_total()), rotor_budget * gib);
  if (layout.pipeline == 1) {
    EXPECT_LT(rotor->memory().peak_total(), plain->memory().peak_total());
  }
  // The planner's closed forms with each schedule are the tracker's, category by category.
  for (auto [t, policy, name, budget] :
       {std::tuple{full.get(), core::CheckpointPolicy::full, "full", 0.0},
        std::tuple{sqrt.get(), core::CheckpointPolicy::sqrt, "sqrt", 0.0},
        std::tuple{rotor.get(), core::CheckpointPolicy::rotor, "rotor", rotor_budget},
        std::tuple{selective.get(), core::CheckpointPolicy::selective, "selective", 0.0}}) {
    const io::Config c = checkpointed(policy, name, budget);
    const int stage = layout.stage(world.rank());
    const apps::ActivationPlan plan =
        apps::activation_plan(c, stage, apps::hardware_spec(c, 0));
    EXPECT_TRUE(plan.selective || (layout.pipeline > 1 && policy == core::CheckpointPolicy::rotor) ||
                std::count(plan.keep.begin(), plan.keep.end(), core::Keep::input) != 0)
        << plan.description;
    const planner::RankLayout l = apps::rank_layout(c, stage, plan.keep, plan.selective);
    const planner::MemoryPrediction predicted = planner::predict_memory(c.model, l);
    for (int k = 0; k < int(core::MemCategory::count); ++k) {
      EXPECT_EQ(predicted.bytes[std::size_t(k)], double(t->memory().peak(core::MemCategory(k))))
          << name << " " << core::category_name(core::MemCategory(k));
    }
  }
  test::expect_same_losses(full_summary, expected);
  const std::vector<float> want = plain->logical_parameters();
  for (apps::Trainer* t : {full.get(), sqrt.get(), rotor.get(), selective.get()}) {
    const apps::TrainSummary& s = t == full.get()    ? full_summary
                                  : t == sqrt.get()  ? sqrt_summary
                                  : t == rotor.get() ? rotor_summary
                                                     : selective_summary;
    ASSERT_EQ(s.losses.size(), plain_summary.losses.size());
    for (std::size_t i = 0; i < s.losses.size(); ++i) {
      EXPECT_EQ(s.losses[i], plain_summary.losses[i]) << "step " << i + 1;
    }
    const std::vector<float> got = t->logical_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t e = 0; e < got.size(); ++e) ASSERT_EQ(got[e], want[e]) << e;
  }
  const test::WeightDifference diff =
      test::weight_difference(full->logical_parameters(), reference.logical_parameters());
  EXPECT_LT(diff.worst, 1e-4);
  EXPECT_LT(diff.mean, 1e-6);
  // What moved, block by block, on one stage of both blocks in one slot (the pipeline layouts
  // checked the tracker against the closed forms above).
  if (layout.pipeline > 1) return;

  using core::MemCategory;
  auto peak = [](apps::Trainer& t, MemCategory k) { return int64_t(t.memory().peak(k)); };
  const int64_t block = peak(*full, MemCategory::temporaries) -
                        peak(*plain, MemCategory::temporaries);  // one block's set, in bytes
  const io::Config c = config(data, layout, true, "md_ck");
  const int64_t input = int64_t(c.train.micro_batch) * c.train.seq_len * c.model.hidden /
                        (layout.mode == "3d" ? 8 : 4) * int64_t(sizeof(float));
  EXPECT_GT(block, 4 * input) << "a block keeps far more than its input";
  EXPECT_EQ(peak(*sqrt, MemCategory::temporaries) - peak(*plain, MemCategory::temporaries),
            2 * block);
  EXPECT_EQ(peak(*plain, MemCategory::activations) - peak(*full, MemCategory::activations),
            2 * (block - input));
  EXPECT_EQ(peak(*plain, MemCategory::activations) - peak(*sqrt, MemCategory::activations),
            2 * block - input);
  // selective moves the two blocks' probabilities, (B/q) sequences x (H/q) heads x T x T each
  // (3d: B/q^2), to one block's buffer among the temporaries; under the fused attention there
  // are none, and selective moves nothing.
  const int64_t att = layout.fused ? 0
                                   : int64_t(c.train.micro_batch) / (layout.mode == "3d" ? 4 : 2) *
                                         (c.model.heads / 2) * c.train.seq_len *
                                         c.train.seq_len * int64_t(sizeof(float));
  EXPECT_EQ(peak(*plain, MemCategory::activations) - peak(*selective, MemCategory::activations),
            2 * att);
  EXPECT_EQ(peak(*selective, MemCategory::temporaries) - peak(*plain, MemCategory::temporaries),
            att);
  if (world.rank() == 0) {
    std::printf("[ memory ] %s: activations %lld B (none), %lld B (full), %lld B (sqrt); "
                "recompute arena %lld B (full), %lld B (sqrt)\n",
                layout.mode.c_str(), (long long)peak(*plain, MemCategory::activations),
                (long long)peak(*full, MemCategory::activations),
                (long long)peak(*sqrt, MemCategory::activations), (long long)block,
                (long long)(2 * block));
  }
}

// train.on_nonfinite: skip. An absurd learning rate makes the first update blow the weights up, so
// every later step's loss is non-finite: the grid run skips the same 9 steps as one rank does,
// and the skipped steps leave the weights bitwise where the one good step put them.
TEST_P(TensorMD, SkipsNonFiniteStepsLikeOneRank) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  if (world.size() != layout.ranks()) GTEST_SKIP() << "needs another rank count";
  const std::string data = test::shared_training_text(world, "colossal_md_data.txt", 4242);
  auto blow_up = [&](io::Config c, int64_t steps) {
    c.train.steps = steps;
    c.train.optimizer.lr = 1e30;
    c.train.optimizer.min_lr = 1e29;
    c.train.optimizer.warmup = 0;
    c.train.optimizer.grad_clip = 0;
    c.train.on_nonfinite = io::OnNonfinite::skip;
    return c;
  };
  apps::Trainer reference(
      blow_up(config(data, layout, false, "md_skip_ref" + std::to_string(world.rank())), 10),
      nullptr);
  const apps::TrainSummary expected = reference.train();
  ASSERT_EQ(expected.skipped_steps, 9) << "the forcing did not make steps 2-10 non-finite";

  apps::Trainer trainer(blow_up(config(data, layout, true, "md_skip_" + layout.mode), 10),
                        nullptr, &world);
  const apps::TrainSummary got = trainer.train();
  EXPECT_EQ(got.steps, 10);
  EXPECT_EQ(got.skipped_steps, expected.skipped_steps);
  EXPECT_NEAR(got.first_loss, expected.first_loss, 1e-5 * expected.first_loss);
  EXPECT_FALSE(std::isfinite(got.last_loss));

  apps::Trainer one_step(blow_up(config(data, layout, true, "md_skip1_" + layout.mode), 1),
                         nullptr, &world);
  EXPECT_EQ(one_step.train().skipped_steps, 0);
  const std::vector<float> after_ten = trainer.logical_parameters();
  const std::vector<float> after_one = one_step.logical_parameters();
  ASSERT_EQ(after_ten.size(), after_one.size());
  for (std::size_t e = 0; e < after_ten.size(); ++e) ASSERT_EQ(after_ten[e], after_one[e]) << e;
}

// The grids evaluate whole micro-batches of every replica: a validation set (or a
// data.val_windows cap) below one micro-batch each is refused when training starts, on every
// rank, naming the keys (it used to end a finished run at its closing validation pass).
TEST(TensorMDConfig, TooFewValidationWindowsAreRefusedAtStart) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks (2d)";
  const std::string data = test::shared_training_text(world, "colossal_md_data.txt", 4242);
  io::Config c = config(data, Layout{"gpt2", "2d", 4}, true, "md_val");
  c.data.val_path = data;
  c.data.val_windows = 3;  // micro_batch 4
  c.train.steps = 1;
  apps::Trainer few(c, nullptr, &world);
  try {
    few.train();
    FAIL() << "expected too few validation windows to be refused";
  } catch (const apps::DataFileError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gives 3 validation window(s)"), std::string::npos) << what;
    EXPECT_NE(what.find("at least train.micro_batch x data x depth = 4"), std::string::npos)
        << what;
    EXPECT_NE(what.find("raise data.val_windows"), std::string::npos) << what;
  }
  c.data.val_windows = 4;
  apps::Trainer enough(c, nullptr, &world);  // one micro-batch per replica: trains, evaluates
  const apps::TrainSummary done = enough.train();
  EXPECT_EQ(done.steps, 1);
  EXPECT_GT(done.val_loss, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TensorMD,
    ::testing::Values(Layout{"gpt2", "2d", 4}, Layout{"opt", "2d", 4},
                      Layout{"gpt2", "2.5d", 8, 2}, Layout{"opt", "2.5d", 8, 2},
                      Layout{"gpt2", "3d", 8}, Layout{"opt", "3d", 8},
                      Layout{"gpt2", "2d", 4, 1, 2}, Layout{"opt", "2d", 4, 1, 2, 1},
                      Layout{"gpt2", "2d", 4, 1, 2, 1, true}, Layout{"gpt2", "2d", 4, 1, 2, 2},
                      Layout{"opt", "2d", 4, 1, 2, 2, true}, Layout{"gpt2", "3d", 8, 1, 1, 2},
                      Layout{"gpt2", "2d", 4, 1, 1, 0, false, 2},
                      Layout{"opt", "2d", 4, 1, 1, 1, false, 2, "gpipe"},
                      Layout{"gpt2", "2.5d", 8, 2, 1, 0, false, 2},
                      Layout{"opt", "2d", 4, 1, 2, 1, false, 2},
                      Layout{"gpt2", "3d", 8, 1, 1, 0, false, 2},
                      Layout{"opt", "3d", 8, 1, 1, 1, false, 2, "gpipe"},
                      Layout{"gpt2", "2d", 4, 1, 2, 2, false, 2},
                      Layout{"opt", "3d", 8, 1, 1, 2, false, 2},
                      Layout{"gpt2", "2d", 4, 1, 1, 0, false, 2, "interleaved", 2, 4},
                      Layout{"opt", "2d", 4, 1, 2, 2, false, 2, "interleaved", 2, 4},
                      Layout{"gpt2", "2d", 4, 1, 2, 0, false, 1, "1f1b", 1, 2, true},
                      Layout{"opt", "2d", 4, 1, 2, 2, false, 1, "1f1b", 1, 2, true},
                      // Half of each shard's optimizer state on the host, half on the device.
                      Layout{"opt", "2d", 4, 1, 2, 2, true, 1, "1f1b", 1, 2, false, 0.5},
                      // model.fused_attention: each row's log-sum-exp kept, no probabilities.
                      Layout{"gpt2", "2d", 4, 1, 1, 0, false, 1, "1f1b", 1, 2, false, 1.0, true},
                      Layout{"opt", "2.5d", 8, 2, 1, 0, false, 1, "1f1b", 1, 2, false, 1.0, true},
                      Layout{"gpt2", "3d", 8, 1, 1, 0, false, 1, "1f1b", 1, 2, false, 1.0, true},
                      Layout{"opt", "2d", 4, 1, 1, 0, false, 2, "1f1b", 1, 2, false, 1.0, true}),
    [](const auto& info) {
      std::string mode = info.param.mode == "2.5d" ? "2p5d" : info.param.mode;
      return info.param.arch + "_" + mode + (info.param.data > 1 ? "_dp2" : "") +
             (info.param.zero > 0 ? "_zero" + std::to_string(info.param.zero) : "") +
             (info.param.offload ? "_offload" : "") +
             (info.param.offload_fraction < 1.0 ? "_half" : "") +
             (info.param.pipeline > 1 ? "_pp" + std::to_string(info.param.pipeline) + "_" +
                                            info.param.schedule
                                      : "") +
             (info.param.chunks > 1 ? "_v" + std::to_string(info.param.chunks) : "") +
             (info.param.bf16_reduce ? "_bf16reduce" : "") + (info.param.fused ? "_fused" : "");
    });

}  // namespace
