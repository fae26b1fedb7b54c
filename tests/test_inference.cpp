// apps::Trainer's inference mode (colossal_eval, colossal_generate) on one rank and under the
// parallel layouts (mpirun -np 1/2/4): a training trainer trains two steps and writes its model
// file; an inference trainer of the same config reads it (load_weights) and
// - evaluates the training trainer's validation loss exactly, and samples its greedy text,
//   which is also one rank's;
// - as colossal_generate's trainer (apps::sampling_config, the KV cache), samples the training
//   trainer's greedy text from its logits (1e-5 of the largest), where the training trainer
//   runs the whole window for every token, also past the window, and tracks its plan exactly;
// - holds no gradients and no optimizer state, and tracks, category by category, exactly what
//   the memory plan of inference predicts for its rank (apps::rank_memory(..., true), which the
//   start-up check compares with the node's memory), less than the training trainer;
// - reads only the elements its layout holds from the file (no rank reads the whole model when
//   its layout shards it);
// - refuses to train, resume or checkpoint.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "apps/layout.hpp"
#include "apps/memory_fit.hpp"
#include "apps/on_root.hpp"
#include "apps/trainer.hpp"
#include "io/config.hpp"
#include "io/init_from.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"

using namespace colossal;

namespace {

struct Case {
  int ranks;
  std::string arch;
  std::string parallel;  // the parallel: block's body
  std::string name;
  bool shards = false;   // the layout splits the parameters: no rank reads the whole file
};

io::Config config(const std::string& data, const Case& c) {
  const std::string text =
      "model: {arch: " + c.arch + (c.arch == "llama" ? ", kv_heads: 2" : "") +
      ", layers: 4, hidden: 32, heads: 4, ffn_hidden: 64, vocab: 200, max_seq: 32,"
      " vocab_multiple: 16}\n"
      "data: {path: " + data + ", val_path: " + data + ", val_windows: 16}\n"
      "train: {steps: 2, seq_len: 32, global_batch: 8, micro_batch: 2,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 1}}\n"
      "parallel: {" + c.parallel + "}\n"
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_inference_" + c.name)).string() +
      "}\n";
  return io::parse_config(text, "test");
}

// apps::on_root: rank 0's result reaches every rank; an error there (thrown, or set) is thrown
// on every rank as the given type, with the context before what was thrown; the work runs on
// the root alone.
TEST(OnRoot, ResultsAndErrorsReachEveryRank) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  int runs = 0;
  const std::string got = apps::on_root<apps::CollectiveError>(world, "ctx: ", [&](auto&) {
    ++runs;
    return std::string("rank ") + std::to_string(world.rank()) + " decided";
  });
  EXPECT_EQ(got, "rank 0 decided");
  EXPECT_EQ(runs, world.rank() == 0 ? 1 : 0);
  try {
    apps::on_root<apps::DataFileError>(world, "model.init_from: ", [&](auto&) -> std::string {
      throw std::runtime_error("no such file");
    });
    ADD_FAILURE() << "no error on rank " << world.rank();
  } catch (const apps::DataFileError& e) {
    EXPECT_STREQ(e.what(), "model.init_from: no such file");
  }
  try {
    apps::on_root<apps::CollectiveError>(world, "ignored: ", [&](std::string& error) {
      error = "log.dir: cannot write";
      return std::string("unused");
    });
    ADD_FAILURE() << "no error on rank " << world.rank();
  } catch (const apps::CollectiveError& e) {
    EXPECT_STREQ(e.what(), "log.dir: cannot write");
  }
  // The last rank as the root.
  const int last = world.size() - 1;
  EXPECT_EQ(apps::on_root<apps::CollectiveError>(
                world, "", [&](auto&) { return std::to_string(world.rank()); }, last),
            std::to_string(last));
}

// Multiple-choice examples cut from the training text (bytes): contexts of 1 to 19 bytes (and
// one of 45, longer than the window of 32, which is cut), 2 to 5 completions of 1 to 8 bytes
// each, the right one (the text's continuation) at the label.
std::vector<io::ChoiceExample> choice_examples(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto bytes = [&](std::size_t at, std::size_t n) {
    std::vector<int32_t> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<unsigned char>(text[at + i]));
    return out;
  };
  std::vector<io::ChoiceExample> examples;
  for (int e = 0; e < 7; ++e) {
    io::ChoiceExample ex;
    ex.index = 100 + e;
    const std::size_t at = 211 * std::size_t(e) + 40, context = e == 3 ? 45 : 1 + 3 * e;
    const int completions = 2 + e % 4;
    ex.label = e % completions;
    ex.context = bytes(at, context);
    for (int c = 0; c < completions; ++c) {
      const std::size_t n = 1 + std::size_t(e + 3 * c) % 8;
      ex.completions.push_back(c == ex.label ? bytes(at + context, n)
                                             : bytes(1500 + 97 * std::size_t(7 * e + c), n));
    }
    examples.push_back(std::move(ex));
  }
  return examples;
}

// Each completion's loss the long way, on one rank: generate() of the context and the
// completion's first j tokens, and -log softmax of token j from the logits it sampled from
// (the whole-window forward and a host log-softmax in double).
std::vector<double> reference_choice_losses(apps::Trainer& trainer,
                                            const std::vector<io::ChoiceExample>& examples) {
  std::vector<double> out;
  for (const io::ChoiceExample& ex : examples) {
    for (const auto& completion : ex.completions) {
      std::vector<int32_t> prefix = ex.context;
      double sum = 0.0;
      for (const int32_t token : completion) {
        trainer.generate(std::string(prefix.begin(), prefix.end()), 1, 0.0, 1);
        const std::vector<float>& logits = trainer.last_logits();
        double high = -1e300, norm = 0.0;
        for (const float l : logits) high = std::max(high, double(l));
        for (const float l : logits) norm += std::exp(double(l) - high);
        sum += high + std::log(norm) - double(logits[std::size_t(token)]);
        prefix.push_back(token);
      }
      out.push_back(sum);
    }
  }
  return out;
}

// The scores of two runs, completion by completion, within `tolerance` relative.
void expect_close_scores(const std::vector<double>& got, const std::vector<double>& want,
                         double tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double gap = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    worst = std::max(worst, gap);
    EXPECT_LE(gap, tolerance) << what << ": completion " << i << " scored " << got[i]
                              << ", want " << want[i];
  }
  std::printf("%s: %zu completion losses, largest relative gap %.3g\n", what.c_str(),
              got.size(), worst);
}

// ChoiceScores' choices: the least loss per token and the least total loss, ties to the first.
TEST(ChoiceScores, ChoosesTheLeastLossPerTokenAndInTotal) {
  apps::ChoiceScores s;
  s.first = {0, 3, 5};
  s.labels = {0, 1};
  s.loss = {6.0, 4.0, 4.0, 2.0, 2.0};
  s.tokens = {3, 1, 4, 2, 2};
  using apps::ChoiceMeasure;
  EXPECT_EQ(s.best(0, ChoiceMeasure::per_token), 2);  // 2.0, 4.0, 1.0 per token
  EXPECT_EQ(s.best(0, ChoiceMeasure::total), 1);      // 6, 4, 4: the first of the tie
  EXPECT_EQ(s.best(1, ChoiceMeasure::per_token), 0);  // a tie: the first
  EXPECT_EQ(s.best(1, ChoiceMeasure::total), 0);
  EXPECT_EQ(s.right(ChoiceMeasure::per_token), 0);
  EXPECT_EQ(s.right(ChoiceMeasure::total), 0);
  s.labels = {2, 0};
  EXPECT_EQ(s.right(ChoiceMeasure::per_token), 2);
  EXPECT_EQ(s.right(ChoiceMeasure::total), 1);
  EXPECT_DOUBLE_EQ(s.accuracy(ChoiceMeasure::per_token), 1.0);
  EXPECT_DOUBLE_EQ(s.accuracy(ChoiceMeasure::total), 0.5);
}

class Inference : public ::testing::TestWithParam<Case> {};

TEST_P(Inference, EvaluatesTheTrainedModelWithoutTrainingState) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const Case c = GetParam();
  if (world.size() != c.ranks) GTEST_SKIP() << "layout needs " << c.ranks << " ranks";
  const std::string data = test::shared_training_text(world, "colossal_inference_data.txt", 77);
  const io::Config cfg = config(data, c);

  apps::Trainer trained(cfg, nullptr, &world);
  const apps::TrainSummary summary = trained.train();
  const double val = trained.evaluate();
  // Each token from a forward over the whole window; 40 tokens go past the window
  // (train.seq_len 32), which then moves.
  const std::string text = trained.generate("and ", 12, 0.0, 1);
  const std::vector<float> logits = trained.last_logits();
  const std::string long_text = trained.generate("and ", 40, 0.0, 1);
  const std::vector<float> long_logits = trained.last_logits();

  apps::Trainer infer(cfg, nullptr, &world, apps::TrainerOptions{.inference = true});
  ASSERT_TRUE(infer.inference());
  const uint64_t before = io::weights_elements_read();
  infer.load_weights(summary.model_path);
  const uint64_t read = io::weights_elements_read() - before;
  std::size_t logical = 0;
  for (const auto& p : infer.logical_table()) logical += std::size_t(p.count);
  if (c.shards) {
    EXPECT_LT(read, logical) << "a rank whose layout shards the model read all of it";
  } else {
    EXPECT_EQ(read, logical);
  }

  EXPECT_EQ(infer.evaluate(), val);
  EXPECT_EQ(infer.generate("and ", 12, 0.0, 1), text);
  // Multiple-choice scores: the training trainer's, exactly (the same forwards), and one
  // rank's within fp32 rounding; on one rank, the long way's (generate()'s logits).
  const std::vector<io::ChoiceExample> examples = choice_examples(data);
  const apps::ChoiceScores scores = trained.score_choices(examples);
  EXPECT_EQ(scores.cut, 1);
  EXPECT_EQ(infer.score_choices(examples).loss, scores.loss);
  {
    // Short rows (at most 15 inputs) score the same in colossal_eval's shorter window: 16
    // positions where 16 x the ring's ranks (x the tensor ranks under sequence_split) allow
    // it, else the config's 32.
    std::vector<io::ChoiceExample> short_rows = examples;
    short_rows.erase(short_rows.begin() + 3, short_rows.end());
    const io::Config window = apps::choice_window_config(cfg, short_rows);
    const int multiple =
        16 * cfg.parallel.sequence * (cfg.parallel.sequence_split ? cfg.parallel.tensor : 1);
    EXPECT_EQ(window.train.seq_len, multiple < 32 ? 16 : 32);
    const auto shorter = apps::inference_trainer(window, &world, summary.model_path);
    expect_close_scores(shorter->score_choices(short_rows).loss,
                        trained.score_choices(short_rows).loss, 1e-5,
                        c.name + " in a window of " + std::to_string(window.train.seq_len));
  }
  if (c.ranks == 1) {
    // Without the cut example (the long way moves its window token by token), and that one
    // against its context cut by hand.
    std::vector<io::ChoiceExample> uncut = examples;
    uncut.erase(uncut.begin() + 3);
    std::vector<double> want = scores.loss;
    want.erase(want.begin() + std::ptrdiff_t(scores.first[3]),
               want.begin() + std::ptrdiff_t(scores.first[4]));
    expect_close_scores(reference_choice_losses(trained, uncut), want, 1e-5,
                        c.name + " against generate()'s logits");
    io::ChoiceExample cut = examples[3];
    std::vector<double> cut_want(scores.loss.begin() + std::ptrdiff_t(scores.first[3]),
                                 scores.loss.begin() + std::ptrdiff_t(scores.first[4]));
    for (std::size_t k = 0; k < cut.completions.size(); ++k) {
      io::ChoiceExample one = cut;
      one.completions = {cut.completions[k], cut.completions[k]};
      one.label = 0;
      one.context.erase(one.context.begin(),
                        one.context.end() - std::ptrdiff_t(33 - cut.completions[k].size()));
      const apps::ChoiceScores by_hand = trained.score_choices({one});
      EXPECT_EQ(by_hand.cut, 0);
      // (the same row in another batch: the products' blocking may round it differently)
      EXPECT_NEAR(by_hand.loss[0], cut_want[k], 1e-6 * cut_want[k]) << "completion " << k;
    }
  }
  if (world.rank() == 0 && c.ranks > 1) {
    // And the layout's text is one rank's (the 2d / 2.5d / 3d layouts sample through a one-rank
    // trainer written from the gathered tensors; the others in their own layout).
    io::Config one = cfg;
    one.parallel = io::ParallelConfig{};
    apps::Trainer single(one, nullptr, nullptr, apps::TrainerOptions{.inference = true});
    single.load_weights(summary.model_path);
    EXPECT_EQ(single.generate("and ", 12, 0.0, 1), text);
    expect_close_scores(scores.loss, single.score_choices(examples).loss, 2e-5,
                        c.name + " against one rank");
  }

  // Nothing of training, and exactly the plan the start-up check compares with the node.
  using core::MemCategory;
  const core::MemoryTracker& m = infer.memory();
  EXPECT_EQ(m.peak(MemCategory::gradients), 0u);
  EXPECT_EQ(m.peak(MemCategory::optimizer), 0u);
  const planner::MemoryPrediction plan = apps::rank_memory(cfg, world.rank(), true);
  for (int k = 0; k < int(MemCategory::count); ++k) {
    const auto cat = MemCategory(k);
    EXPECT_EQ(plan[cat], double(m.peak(cat))) << core::category_name(cat) << ": plan "
                                              << plan.format() << ", tracked " << m.summary();
  }
  const double training = double(trained.memory().peak_total());
  std::printf("[rank %d] %s: inference %s | training peak %.0f bytes, inference %.0f (%.2fx)\n",
              world.rank(), c.name.c_str(), m.summary().c_str(), training,
              double(m.peak_total()), training / double(m.peak_total()));
  EXPECT_LT(double(m.peak_total()), 0.6 * training);

  EXPECT_THROW(infer.train(), std::logic_error);
  EXPECT_THROW(infer.resume(), std::logic_error);
  EXPECT_THROW(infer.save_checkpoint(1, 1, 1), std::logic_error);

  // colossal_generate's trainer: one sequence (apps::sampling_config) with the KV cache. The
  // logits of the last token sampled, one new position at a time and (past the window) the
  // window decoded again whole, are the whole-window forward's, and so is the greedy text.
  const io::Config sampling = apps::sampling_config(cfg);
  const auto sampler = apps::inference_trainer(sampling, &world, summary.model_path,
                                               {.decode = true, .samples = true});
  const auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) return false;
    double gap = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      gap = std::max(gap, double(std::abs(got[i] - want[i])));
      scale = std::max(scale, double(std::abs(want[i])));
    }
    std::printf("decoded logits: largest gap %.3g of %.3g\n", gap, scale);
    return gap <= 1e-5 * scale;
  };
  EXPECT_EQ(sampler->generate("and ", 12, 0.0, 1), text);
  if (!logits.empty()) {
    EXPECT_TRUE(close(sampler->last_logits(), logits));
  }
  EXPECT_EQ(sampler->generate("and ", 40, 0.0, 1), long_text);
  if (!long_logits.empty()) {
    EXPECT_TRUE(close(sampler->last_logits(), long_logits));
  }
  const core::MemoryTracker& sm = sampler->memory();
  const planner::MemoryPrediction sampling_plan =
      apps::rank_memory(sampling, world.rank(), true, true);
  for (int k = 0; k < int(MemCategory::count); ++k) {
    const auto cat = MemCategory(k);
    EXPECT_EQ(sampling_plan[cat], double(sm.peak(cat)))
        << "sampling, " << core::category_name(cat) << ": plan " << sampling_plan.format()
        << ", tracked " << sm.summary();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Inference,
    ::testing::Values(
        Case{1, "gpt2", "", "gpt2"},
        Case{1, "opt", "", "opt"},
        Case{1, "llama", "", "llama"},
        Case{1, "gpt2", "zero: {stage: 3, offload: {optimizer: true, params: true}}",
             "gpt2_zero3_offload"},
        Case{2, "gpt2", "data: 2, zero: {stage: 1}", "gpt2_dp2_zero1"},
        Case{2, "opt", "data: 2, zero: {stage: 3}", "opt_dp2_zero3", true},
        // Half of each parameter shard on the host: the load writes both parts.
        Case{2, "gpt2",
             "data: 2, zero: {stage: 3, offload: {optimizer: true, params: true, "
             "params_fraction: 0.5}}",
             "gpt2_dp2_zero3_half_offload", true},
        Case{2, "gpt2", "tensor: {size: 2, sequence_split: true}", "gpt2_tp2_split", true},
        Case{2, "llama", "tensor: {size: 2}", "llama_tp2", true},
        Case{2, "opt", "sequence: 2", "opt_sp2"},
        Case{2, "llama", "sequence: 2", "llama_sp2"},  // rotary positions of the whole window
        Case{2, "gpt2", "pipeline: {size: 2}", "gpt2_pp2", true},
        Case{4, "gpt2", "tensor: {size: 4, mode: 2d}", "gpt2_2d", true},
        Case{4, "opt", "data: 2, pipeline: {size: 2, schedule: interleaved, chunks: 2}",
             "opt_dp2_pp2_interleaved", true},
        Case{4, "gpt2", "data: 2, tensor: {size: 2}, zero: {stage: 3}", "gpt2_dp2_tp2_zero3",
             true},
        // Decoded rows between stages: scatter-gather over the tensor ranks, and whole rows
        // under sequence_split; ZeRO-3's gathers on two stages.
        Case{4, "gpt2", "tensor: {size: 2}, pipeline: {size: 2}", "gpt2_tp2_pp2", true},
        Case{4, "opt", "tensor: {size: 2, sequence_split: true}, pipeline: {size: 2}",
             "opt_tp2_split_pp2", true},
        Case{4, "llama", "data: 2, pipeline: {size: 2}, zero: {stage: 3}", "llama_dp2_pp2_zero3",
             true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
