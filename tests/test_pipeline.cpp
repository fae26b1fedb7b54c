// Pipeline parallelism (GPipe and 1F1B), alone and with data, tensor and sequence parallelism and
// ZeRO-1, trains the single-rank model: per-step losses and final logical weights against a
// single-process run; every stage runs each micro-batch's forward and backward once, holds the
// number of micro-batches in flight that its schedule says, and sends exactly its activations and
// input gradients.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <filesystem>

#include "apps/layout.hpp"
#include "apps/trainer.hpp"
#include "io/config.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/stage_partition.hpp"
#include "planner/layout_plan.hpp"
#include "train_parity.hpp"
#include "zero/sharded_store.hpp"

using namespace colossal;

namespace {

TEST(PipelineSchedule, EveryMicroBatchOnceAndTheTheoreticalInFlight) {
  for (const std::string kind : {"gpipe", "1f1b"}) {
    for (int stages : {1, 2, 4}) {
      for (int micro : {4, 7}) {
        for (int stage = 0; stage < stages; ++stage) {
          SCOPED_TRACE(kind + " stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                       ", " + std::to_string(micro) + " micro-batches");
          const auto actions = parallel::pipeline_schedule(kind, stages, stage, micro);
          ASSERT_EQ(actions.size(), std::size_t(2 * micro));
          std::vector<int> forwarded(micro, 0), backwarded(micro, 0);
          for (const auto& a : actions) {
            if (a.forward) {
              ++forwarded[a.micro];
            } else {
              EXPECT_EQ(forwarded[a.micro], 1) << "backward of " << a.micro << " before forward";
              ++backwarded[a.micro];
            }
          }
          EXPECT_EQ(std::count(forwarded.begin(), forwarded.end(), 1), micro);
          EXPECT_EQ(std::count(backwarded.begin(), backwarded.end(), 1), micro);
          // GPipe holds every micro-batch; 1F1B at most stages - stage.
          EXPECT_EQ(parallel::peak_in_flight(actions),
                    kind == "gpipe" ? micro : std::min(stages - stage, micro));
        }
      }
    }
  }
  EXPECT_THROW(parallel::pipeline_schedule("zigzag", 2, 0, 4), std::invalid_argument);
}

// Every schedule, run rank against rank with blocking receives and non-blocking sends, finishes:
// no rank ever waits for a message its neighbour only sends after waiting on it.
TEST(PipelineSchedule, NoScheduleDeadlocks) {
  for (int stages : {1, 2, 3, 4}) {
    for (int micro : {4, 8, 12}) {
      EXPECT_TRUE(parallel::schedule_completes("gpipe", stages, micro)) << stages << " " << micro;
      EXPECT_TRUE(parallel::schedule_completes("1f1b", stages, micro)) << stages << " " << micro;
      for (int chunks : {1, 2, 3}) {
        if (micro % stages != 0) continue;
        EXPECT_TRUE(parallel::schedule_completes("interleaved", stages, micro, chunks))
            << stages << " stages, " << micro << " micro-batches, " << chunks << " chunks";
      }
    }
  }
}

// Under NCCL's point-to-point rule (a send completes only while its receive runs; messages of a
// pair match in issue order) every schedule's groups complete, with each message meeting its
// own counterpart, over every stage, micro-batch and chunk count tried.
TEST(PipelineExchanges, EveryScheduleCompletesUnderNcclsRule) {
  using parallel::PipelineSchedule;
  for (int stages = 1; stages <= 8; ++stages) {
    for (int micro = 1; micro <= 24; ++micro) {
      EXPECT_TRUE(parallel::exchanges_complete(PipelineSchedule::gpipe, stages, micro))
          << stages << " " << micro;
      EXPECT_TRUE(parallel::exchanges_complete(PipelineSchedule::one_f_one_b, stages, micro))
          << stages << " " << micro;
      for (int chunks = 1; chunks <= 4 && micro % stages == 0; ++chunks) {
        EXPECT_TRUE(
            parallel::exchanges_complete(PipelineSchedule::interleaved, stages, micro, chunks))
            << stages << " stages, " << micro << " micro-batches, " << chunks << " chunks";
      }
    }
  }
}

// The simulator says no where NCCL would hang or mix messages up.
TEST(PipelineExchanges, TheSimulatorCatchesDeadlocksAndMismatches) {
  using M = parallel::PipelineMessage;
  const M send_a0{true, false, 0, 0, 1}, recv_a0{false, false, 0, 0, 0};
  const M send_a1{true, false, 0, 1, 1}, recv_a1{false, false, 0, 1, 0};
  const M send_g0{true, true, 0, 0, 0}, recv_g0{false, true, 0, 0, 1};
  // Together they complete: each rank's send and receive in one group.
  EXPECT_TRUE(parallel::groups_complete({{{send_a0, recv_g0}}, {{recv_a0, send_g0}}}));
  // Each rank sends first and receives in a later group: both sends wait forever.
  EXPECT_FALSE(parallel::groups_complete({{{send_a0}, {recv_g0}}, {{send_g0}, {recv_a0}}}));
  // Two messages one way, received in the other order: NCCL would swap their contents.
  EXPECT_FALSE(parallel::groups_complete({{{send_a0, send_a1}}, {{recv_a1, recv_a0}}}));
  EXPECT_TRUE(parallel::groups_complete({{{send_a0, send_a1}}, {{recv_a0, recv_a1}}}));
  // A message nobody receives, and a peer outside the pipeline.
  EXPECT_FALSE(parallel::groups_complete({{{send_a0}}, {{}}}));
  EXPECT_FALSE(parallel::groups_complete({{{M{true, false, 0, 0, 2}}}, {{}}}));
  // One rank messaging itself (interleaved chunks on one pipeline rank): in one group, or never.
  const M self_send{true, false, 0, 0, 0}, self_recv{false, false, 0, 0, 0};
  EXPECT_TRUE(parallel::groups_complete({{{self_send, self_recv}}}));
  EXPECT_FALSE(parallel::groups_complete({{{self_send}, {self_recv}}}));
  // The interleaved schedule grouped before every action, as gpipe and 1f1b are, deadlocks.
  const int stages = 2, micro = 4, chunks = 2;
  std::vector<std::vector<std::vector<M>>> unpaired;
  for (int r = 0; r < stages; ++r) {
    const auto actions = parallel::pipeline_schedule("interleaved", stages, r, micro, chunks);
    std::vector<std::vector<M>> groups(actions.size() + 1);
    for (std::size_t i = 0; i < actions.size(); ++i) {
      const int v = actions[i].chunk * stages + r, next = (r + 1) % stages;
      const int prev = (r + stages - 1) % stages;
      if (actions[i].forward) {
        if (v > 0) groups[i].push_back({false, false, v - 1, actions[i].micro, prev});
        if (v + 1 < stages * chunks) groups[i + 1].push_back({true, false, v, actions[i].micro, next});
      } else {
        if (v + 1 < stages * chunks) groups[i].push_back({false, true, v, actions[i].micro, next});
        if (v > 0) groups[i + 1].push_back({true, true, v - 1, actions[i].micro, prev});
      }
    }
    for (auto& g : groups) std::sort(g.begin(), g.end(), parallel::exchange_order);
    unpaired.push_back(groups);
  }
  EXPECT_FALSE(parallel::groups_complete(unpaired));
  EXPECT_THROW(parallel::pipeline_exchanges(parallel::PipelineSchedule::one_f_one_b, 2, 0, 4, 2),
               std::invalid_argument);
}

// The groups of 1F1B on the first of two stages, 3 micro-batches (Megatron's steady state:
// the forward's output leaves with the receive of the gradient the next backward needs).
TEST(PipelineExchanges, OneFOneBGroupsSendsWithTheNextReceive) {
  using M = parallel::PipelineMessage;
  const auto groups =
      parallel::pipeline_exchanges(parallel::PipelineSchedule::one_f_one_b, 2, 0, 3);
  // Actions: F0 F1 B0 F2 B1 B2.
  const std::vector<std::vector<M>> expected = {
      {},                                                // before F0
      {M{true, false, 0, 0, 1}},                         // before F1: send F0's output
      {M{true, false, 0, 1, 1}, M{false, true, 0, 0, 1}},  // before B0: F1's out, B0's gradient
      {},                                                // before F2: B0 sends nothing back
      {M{true, false, 0, 2, 1}, M{false, true, 0, 1, 1}},  // before B1
      {M{false, true, 0, 2, 1}},                         // before B2
      {}};                                               // after
  EXPECT_EQ(groups, expected);
  // The last stage mirrors it: each forward's input arrives with the previous gradient sent.
  const auto last = parallel::pipeline_exchanges(parallel::PipelineSchedule::one_f_one_b, 2, 1, 3);
  // Actions: F0 B0 F1 B1 F2 B2.
  const std::vector<std::vector<M>> mirrored = {
      {M{false, false, 0, 0, 0}},                        // before F0
      {},                                                // before B0
      {M{false, false, 0, 1, 0}, M{true, true, 0, 0, 0}},  // before F1
      {},
      {M{false, false, 0, 2, 0}, M{true, true, 0, 1, 0}},  // before F2
      {},
      {M{true, true, 0, 2, 0}}};                         // after B2
  EXPECT_EQ(last, mirrored);
}

// The interleaved schedule exchanges once per steady forward-backward pair: no group between
// them, so the pair's backward gradient is received before the forward runs. Apart, the groups
// deadlock (exchanges_complete says so for a schedule built that way: 2 stages, 4 micro-batches,
// 2 chunks was the first case found).
TEST(PipelineExchanges, InterleavedPairsShareOneGroup) {
  const int stages = 2, micro = 4, chunks = 2;
  for (int stage = 0; stage < stages; ++stage) {
    const auto actions = parallel::pipeline_schedule("interleaved", stages, stage, micro, chunks);
    const auto groups = parallel::pipeline_exchanges(parallel::PipelineSchedule::interleaved,
                                                     stages, stage, micro, chunks);
    ASSERT_EQ(groups.size(), actions.size() + 1);
    const int warmup = (stages - stage - 1) * 2 + (chunks - 1) * stages;
    for (std::size_t i = std::size_t(warmup); i + 1 < actions.size(); i += 2) {
      if (i + 1 >= std::size_t(2 * micro * chunks - warmup)) break;  // the cool-down
      ASSERT_TRUE(actions[i].forward && !actions[i + 1].forward) << i;
      EXPECT_TRUE(groups[i + 1].empty()) << "no group inside the pair at action " << i + 1;
    }
    std::size_t messages = 0;
    for (const auto& g : groups) messages += g.size();
    // Every virtual stage but the ends sends and receives each micro-batch both ways.
    std::size_t expected = 0;
    for (int c = 0; c < chunks; ++c) {
      const int v = c * stages + stage;
      expected += std::size_t(micro) * ((v > 0 ? 2 : 0) + (v + 1 < stages * chunks ? 2 : 0));
    }
    EXPECT_EQ(messages, expected);
  }
}

TEST(PipelineSchedule, InterleavedRunsEveryChunkOfEveryMicroBatchOnce) {
  const int stages = 4, micro = 8, chunks = 2;
  for (int stage = 0; stage < stages; ++stage) {
    const auto actions = parallel::pipeline_schedule("interleaved", stages, stage, micro, chunks);
    ASSERT_EQ(actions.size(), std::size_t(2 * micro * chunks));
    std::vector<int> forwarded(micro * chunks, 0), backwarded(micro * chunks, 0);
    for (const auto& a : actions) {
      const int id = a.chunk * micro + a.micro;
      if (a.forward) {
        ++forwarded[id];
      } else {
        EXPECT_EQ(forwarded[id], 1);
        ++backwarded[id];
      }
    }
    EXPECT_EQ(std::count(forwarded.begin(), forwarded.end(), 1), micro * chunks);
    EXPECT_EQ(std::count(backwarded.begin(), backwarded.end(), 1), micro * chunks);
  }
  // Megatron's warm-up: the first stage runs (stages - 1) * 2 + (chunks - 1) * stages forwards
  // before its first backward.
  const auto first = parallel::pipeline_schedule("interleaved", stages, 0, micro, chunks);
  const auto warm = std::find_if(first.begin(), first.end(), [](const auto& a) { return !a.forward; });
  EXPECT_EQ(warm - first.begin(), (stages - 1) * 2 + (chunks - 1) * stages + 1);
  EXPECT_THROW(parallel::pipeline_schedule("interleaved", 4, 0, 6, 2), std::invalid_argument);
}

// The cases of the greedy partitioner this one replaced (balance_stages: `layers` blocks of cost
// `block`, the LM head's `head` on the last stage), now on the dynamic program.
std::vector<int> balanced(int layers, int stages, double block, double head) {
  return parallel::partition_stages(std::vector<double>(std::size_t(layers), block), stages, 0.0,
                                    head);
}

double slowest_stage(const std::vector<int>& counts, double block, double head) {
  double worst = 0.0;
  for (std::size_t s = 0; s < counts.size(); ++s) {
    worst = std::max(worst, counts[s] * block + (s + 1 == counts.size() ? head : 0.0));
  }
  return worst;
}

TEST(PipelineSchedule, BalancedStagesGiveTheHeadStageFewerBlocks) {
  EXPECT_EQ(balanced(8, 2, 1.0, 0.0), (std::vector<int>{4, 4}));
  EXPECT_EQ(balanced(8, 2, 1.0, 2.0), (std::vector<int>{5, 3}));
  // Greedy gave {2, 3, 3, 2}; the program's tie-break puts the fewest blocks on the earliest
  // stages, and its slowest stage is no slower than greedy's.
  const std::vector<int> ten = balanced(10, 4, 1.0, 0.0);
  EXPECT_EQ(ten, (std::vector<int>{2, 2, 3, 3}));
  EXPECT_LE(slowest_stage(ten, 1.0, 0.0), slowest_stage({2, 3, 3, 2}, 1.0, 0.0));
  EXPECT_EQ(balanced(4, 4, 1.0, 5.0), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_THROW(balanced(3, 4, 1.0, 0.0), std::invalid_argument);
}

// The trainer's default split and the planner's are this partition of the model's FLOPs: a
// block's forward FLOPs per token against the LM head's on the last stage.
TEST(PipelineSchedule, BalancedStageLayersWeighTheHead) {
  core::ModelSpec spec;
  spec.layers = 12;
  spec.hidden = 64;
  spec.ffn_hidden = 256;
  spec.vocab = 2048;
  // block = 2 (4 * 64^2 + 2 * 64 * 256) + 4 * 128 * 64 = 131072; head = 2 * 64 * 2048, 2 blocks.
  const double block = 2.0 * (4 * 64.0 * 64 + 2 * 64.0 * 256) + 4.0 * 128 * 64;
  EXPECT_DOUBLE_EQ(block, 131072.0);
  EXPECT_DOUBLE_EQ(core::block_forward_flops(spec, 128), block);
  EXPECT_DOUBLE_EQ(core::head_forward_flops(spec), 2 * block);
  // 12 blocks and the head over 4 stages: the slowest stage is 4 blocks at best, the head's
  // stage gets 2 blocks, the earliest stages the fewest of the rest.
  const std::vector<int> counts = parallel::balanced_stage_layers(spec, 128, 4);
  EXPECT_EQ(counts, (std::vector<int>{3, 3, 4, 2}));
  EXPECT_DOUBLE_EQ(slowest_stage(counts, block, 2 * block), 4 * block);
  EXPECT_EQ(parallel::balanced_stage_layers(spec, 128, 1), (std::vector<int>{12}));
}

struct Layout {
  std::string arch;
  int pipeline;
  std::string schedule = "1f1b";
  int data = 1, tensor = 1, sequence = 1, stage = 0;
  std::string layers = "[]";
  int chunks = 1;
  int recompute_every = 0;  // activation checkpointing
  bool offload = false;     // parallel.zero.offload.optimizer (ZeRO >= 1)
};

io::Config config(const std::string& data, const Layout& l, bool parallel, const std::string& run) {
  const std::string text =
      "model: {arch: " + l.arch + (l.arch == "llama" ? ", kv_heads: 2" : "") +
      ", layers: 4, hidden: 32, heads: 4, ffn_hidden: 64, vocab: 200,"
      " max_seq: 16, vocab_multiple: 16}\n"
      "data: {path: " + data + ", val_path: " + data + ", val_windows: 8}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 8, micro_batch: 2,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n" +
      (parallel && l.recompute_every > 0
           ? "checkpointing: {policy: every_k, every: " + std::to_string(l.recompute_every) + "}\n"
           : std::string()) +
      (parallel ? "parallel: {data: " + std::to_string(l.data) + ", tensor: {size: " +
                      std::to_string(l.tensor) + "}, sequence: " + std::to_string(l.sequence) +
                      ", pipeline: {size: " + std::to_string(l.pipeline) + ", schedule: " +
                      l.schedule + ", layers: " + l.layers + ", chunks: " +
                      std::to_string(l.chunks) + "}, zero: {stage: " +
                      std::to_string(l.stage) +
                      (l.offload ? ", offload: {optimizer: true}" : "") + "}, bucket_mb: 0.01}\n"
                : std::string()) +
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

class Pipeline : public ::testing::TestWithParam<Layout> {};

TEST_P(Pipeline, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Layout layout = GetParam();
  const int ranks = layout.pipeline * layout.data * layout.tensor * layout.sequence;
  if (world.size() != ranks) GTEST_SKIP() << "layout needs " << ranks << " ranks";
  const std::string data = test::shared_training_text(world, "colossal_pp_data.txt", 777);

  apps::Trainer reference(config(data, layout, false, "pp_ref" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();

  apps::Trainer trainer(config(data, layout, true, "pp"), nullptr, &world);
  parallel::Communicator& pp = trainer.pipeline_parallel();
  ASSERT_EQ(pp.size(), layout.pipeline);
  EXPECT_EQ(pp.rank(), world.rank() / (ranks / layout.pipeline)) << "stages are outermost";
  EXPECT_NE(trainer.plan().find("pipeline: {schedule: " + layout.schedule), std::string::npos)
      << trainer.plan();
  pp.reset_stats();
  const apps::TrainSummary got = trainer.train();
  test::expect_same_losses(got, expected);
  // The last step validated (data.val_path): the same loss through the stages' forward, whose
  // sends this evaluation counts again, to be taken from the step's below.
  const parallel::CommStats trained = pp.stats();
  pp.reset_stats();
  const double val = trainer.evaluate(), val_reference = reference.evaluate();
  EXPECT_NEAR(val, val_reference, 1e-5 * std::abs(val_reference));
  EXPECT_GT(val, 0.0);
  const parallel::CommStats validated = pp.stats();

  // Schedule theory: every micro-batch forward and backward once per step and chunk; in flight
  // at most all of them (GPipe), stages - stage (1F1B), or what the interleaved schedule says.
  const int64_t steps = 10, micro = 8 / (2 * layout.data), chunks = layout.chunks;
  const int stage = pp.rank(), stages = pp.size();
  const auto& stats = trainer.pipeline_stats();
  EXPECT_EQ(stats.forwards, steps * micro * chunks);
  EXPECT_EQ(stats.backwards, steps * micro * chunks);
  const int theory =
      layout.schedule == "gpipe" ? int(micro)
      : layout.schedule == "1f1b"
          ? std::min<int>(stages - stage, int(micro))
          : parallel::peak_in_flight(parallel::pipeline_schedule("interleaved", stages, stage,
                                                                 int(micro), int(chunks)));
  EXPECT_EQ(stats.peak_in_flight, theory);
  // Point to point: each micro-batch's output goes forward (but from the last stage) and its input
  // gradient back (but from the first), micro_batch x (T / sequence) x hidden floats, divided by
  // the tensor size: each tensor rank sends its part and the receivers all-gather (scatter-gather).
  const uint64_t floats = 2 * (16 / layout.sequence) * 32 / layout.tensor;
  // Every (chunk, micro-batch) sends forward but on the last virtual stage, back but on the first.
  const uint64_t sends = uint64_t(steps * micro) *
                         (2 * chunks - (stage + 1 == stages) - (stage == 0));
  EXPECT_EQ(trained.send.calls - validated.send.calls, sends);
  EXPECT_EQ(trained.send.payload_bytes - validated.send.payload_bytes, sends * floats * 4);
  EXPECT_EQ(trained.recv.calls - validated.recv.calls, sends);

  if (layout.stage == 3 && layout.chunks == 1) {
    // ZeRO-3 keeps the last unit other than 0 it gathered in its buffer: at each F B turn of
    // the stage's schedule the backward finds the forward's last unit there, at each B F turn
    // the forward its first unit after 0 (the first block, or on a stage without the embeddings
    // the second: its first block is its unit 0, in a buffer of its own), as the cost model
    // counts them (planner::RankLayout::Chunk's turns).
    const planner::RankLayout rank =
        planner::rank_layout(apps::run_layout(config(data, layout, true, "pp")), stage);
    const planner::RankLayout::Chunk& chunk = rank.chunks.front();
    ASSERT_GE(chunk.forward_turns, 1);
    const int64_t kept = chunk.forward_turns + chunk.backward_turns;
    auto& store = dynamic_cast<zero::ShardedParameterStore&>(trainer.model().store());
    EXPECT_EQ(int64_t(store.reused_gathers()), steps * kept)
        << "stage " << stage << ": " << chunk.forward_turns << " F B and "
        << chunk.backward_turns << " B F turns a step";
  }
  test::expect_same_weights(trainer, reference);
  if (layout.offload && layout.stage >= 2) {
    // The offloaded gradients go down during backward, but the tied embedding's unit 0 (summed
    // over the first and last stage after backward), which waits for the step on both stages.
    const auto& off = trainer.optimizer().offload_stats();
    const uint64_t gradients = off.to_host_bytes / 2;  // the other half: parameters
    EXPECT_GT(off.early_to_host_bytes, 0u);
    if (layout.arch != "llama") {
      EXPECT_LT(off.early_to_host_bytes, gradients);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Pipeline,
    ::testing::Values(Layout{"gpt2", 2, "gpipe"}, Layout{"opt", 2, "gpipe"},
                      Layout{"gpt2", 2, "1f1b"}, Layout{"opt", 2, "1f1b", 1, 1, 1, 0, "[3, 1]"},
                      Layout{"gpt2", 4, "1f1b"}, Layout{"opt", 4, "gpipe"},
                      Layout{"gpt2", 2, "1f1b", 2}, Layout{"opt", 2, "gpipe", 2, 1, 1, 1},
                      Layout{"gpt2", 2, "1f1b", 1, 2}, Layout{"opt", 2, "1f1b", 1, 1, 2},
                      Layout{"gpt2", 2, "1f1b", 2, 2, 1, 1}, Layout{"opt", 2, "gpipe", 2, 2},
                      Layout{"gpt2", 2, "1f1b", 2, 1, 1, 2}, Layout{"opt", 2, "1f1b", 2, 1, 1, 3},
                      Layout{"gpt2", 2, "gpipe", 2, 1, 1, 3},
                      // Interleaved: 2 model chunks per rank, 4 virtual stages of one block.
                      Layout{"gpt2", 2, "interleaved", 1, 1, 1, 0, "[]", 2},
                      Layout{"opt", 2, "interleaved", 2, 1, 1, 1, "[]", 2},
                      Layout{"gpt2", 2, "interleaved", 1, 2, 1, 0, "[]", 2},
                      // Activation checkpointing inside pipeline stages with tensor parallelism.
                      Layout{"opt", 2, "1f1b", 1, 2, 1, 0, "[]", 1, 1},
                      // LLaMA (untied lm_head on the last stage): 1F1B, with ZeRO-3 and data,
                      // with tensor parallelism and recompute.
                      Layout{"llama", 2, "1f1b"}, Layout{"llama", 2, "1f1b", 2, 1, 1, 3},
                      Layout{"llama", 2, "1f1b", 1, 2, 1, 0, "[]", 1, 1},
                      // ZeRO-2 with the optimizer offloaded (copies during backward).
                      Layout{"gpt2", 2, "1f1b", 2, 1, 1, 2, "[]", 1, 0, true}),
    [](const auto& info) {
      const Layout& l = info.param;
      std::string name = l.arch + "_pp" + std::to_string(l.pipeline) + "_" + l.schedule;
      if (l.data > 1) name += "_dp" + std::to_string(l.data);
      if (l.tensor > 1) name += "_tp" + std::to_string(l.tensor);
      if (l.sequence > 1) name += "_sp" + std::to_string(l.sequence);
      if (l.stage > 0) name += "_zero" + std::to_string(l.stage);
      if (l.layers != "[]") name += "_given";
      if (l.chunks > 1) name += "_chunks" + std::to_string(l.chunks);
      if (l.recompute_every > 0) name += "_recompute";
      if (l.offload) name += "_offload";
      return name;
    });

}  // namespace
