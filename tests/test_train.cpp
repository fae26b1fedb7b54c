// End-to-end training on learnable synthetic data, model file round trips and failure handling.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include "apps/trainer.hpp"
#include "core/gemm.hpp"
#include "core/rng.hpp"
#include "io/config.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_file.hpp"
#include "io/hf_export.hpp"
#include "io/init_from.hpp"
#include "token_files.hpp"

using namespace colossal;

namespace {

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("colossal_train_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A periodic byte sequence: the next token is a function of the current one, so a model can drive
// the loss to zero.
std::string periodic_data(const std::string& dir) {
  std::string text;
  for (int i = 0; i < 4000; ++i) text.push_back("colossal!"[i % 9]);
  std::ofstream(dir + "/data.txt") << text;
  return dir + "/data.txt";
}

io::Config tiny_config(const std::string& dir, const std::string& arch, const std::string& extra = "") {
  const std::string data = periodic_data(dir);
  const std::string text =
      "model: {arch: " + arch + ", layers: 2, hidden: 32, heads: 4, vocab: 256, max_seq: 16}\n"
      "data: {path: " + data + ", val_path: " + data + ", val_windows: 20}\n"
      "train:\n  steps: 120\n  seq_len: 16\n  global_batch: 8\n  micro_batch: 4\n"
      "  optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, warmup: 10}\n" + extra +
      "eval: {every: 0}\nlog: {every: 1000, dir: " + dir + "/run}\n";
  return io::parse_config(text, "test");
}

class Training : public ::testing::TestWithParam<std::string> {};

TEST_P(Training, LearnsAPeriodicSequenceToNearZeroLoss) {
  const std::string dir = temp_dir("learn_" + GetParam());
  apps::Trainer trainer(tiny_config(dir, GetParam()), nullptr);
  const apps::TrainSummary s = trainer.train();
  EXPECT_GT(s.first_loss, 4.0);  // about ln(256) at initialisation
  EXPECT_LT(s.last_loss, 0.05);
  EXPECT_LT(s.val_loss, 0.05);
  EXPECT_TRUE(std::filesystem::exists(dir + "/run/metrics.csv"));
  EXPECT_TRUE(std::filesystem::exists(s.model_path));
  // Greedy continuation follows the period.
  EXPECT_EQ(trainer.generate("colo", 9, 0.0, 1), "ssal!colo");
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, Training, ::testing::Values("gpt2", "opt"));

// A prompt is text over byte data and token ids over a token file (colossal has no tokenizer):
// the bytes of "Hello" over a GPT-2 token file were sampled from as ids 72, 101, ... before.
TEST(Prompt, IsTextOverBytesAndIdsOverATokenFile) {
  const std::string dir = temp_dir("prompt");
  const std::string text = periodic_data(dir), ids = dir + "/data.bin";
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 4000; ++i) tokens.push_back(uint16_t(1000 + i % 9));
  test::write_llmc(ids, tokens);
  const io::TokenFile bytes(text, "data.path"), llmc(ids, "data.path");
  EXPECT_EQ(apps::prompt_tokens("co", bytes, 256, "k"), (std::vector<int32_t>{'c', 'o'}));
  EXPECT_EQ(apps::prompt_tokens("", bytes, 256, "k"), (std::vector<int32_t>{'\n'}));
  EXPECT_EQ(apps::prompt_tokens("50256 464,11", llmc, 50257, "k"),
            (std::vector<int32_t>{50256, 464, 11}));
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const io::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string hello = message([&] { apps::prompt_tokens("Hello", llmc, 50257, "--prompt"); });
  EXPECT_NE(hello.find("--prompt: 'Hello' is not token ids; " + ids + " holds a tokenizer's ids"),
            std::string::npos)
      << hello;
  EXPECT_NE(hello.find("scripts/tokenize.py --encode"), std::string::npos) << hello;
  EXPECT_NE(message([&] { apps::prompt_tokens("", llmc, 50257, "k"); }).find("is not token ids"),
            std::string::npos);
  EXPECT_NE(message([&] { apps::prompt_tokens("12x", llmc, 50257, "k"); }).find("not token ids"),
            std::string::npos);
  EXPECT_NE(message([&] { apps::prompt_tokens("50257", llmc, 50257, "sample.prompt"); })
                .find("sample.prompt: token 50257 is outside the model's vocabulary "
                      "(model.vocab: 50257)"),
            std::string::npos);
  EXPECT_NE(message([&] { apps::prompt_tokens("caf\xc3\xa9", bytes, 128, "k"); })
                .find("k: byte 195 is outside"),
            std::string::npos);

  // A run over the token file (the period 1000 .. 1008 in ids): a text sample.prompt is refused
  // before the first step, not after training; a model trained on it continues an id prompt.
  const std::string ids_config =
      "model: {layers: 2, hidden: 32, heads: 4, vocab: 1024, max_seq: 16}\n"
      "data: {path: " + ids + "}\ntrain:\n  steps: 120\n  seq_len: 16\n  global_batch: 8\n"
      "  micro_batch: 4\n  optimizer: {lr: 1.0e-2, min_lr: 1.0e-3, warmup: 10}\n"
      "eval: {every: 0}\nlog: {every: 1000, dir: " + dir + "/run}\n";
  {
    apps::Trainer refused(io::parse_config(ids_config + "sample: {prompt: the, tokens: 4}\n",
                                           "test"),
                          nullptr);
    int64_t steps = 0;
    refused.set_step_callback([&](int64_t) { ++steps; });
    EXPECT_THROW(refused.train(), io::ConfigError);
    EXPECT_EQ(steps, 0);
  }
  // sample.stop_tokens ends the end-of-run sample at the first one drawn (which it includes).
  apps::Trainer trainer(
      io::parse_config(ids_config +
                           "sample: {prompt: '1001', tokens: 6, temperature: 0.01, "
                           "stop_tokens: [7, 1004]}\n",
                       "test"),
      nullptr);
  const apps::TrainSummary s = trainer.train();
  EXPECT_LT(s.last_loss, 0.05);
  EXPECT_EQ(s.sample, " 1002 1003 1004");
  EXPECT_EQ(s.sample_tokens, 3);
  EXPECT_EQ(trainer.generate("1006 1007", 4, 0.0, 1), " 1008 1000 1001 1002");
  EXPECT_EQ(trainer.generated(), 4);
  apps::Sampling greedy_to_1000;
  greedy_to_1000.temperature = 0.0;
  greedy_to_1000.stop_tokens = {1000};
  EXPECT_EQ(trainer.generate("1006 1007", 4, greedy_to_1000), " 1008 1000");
  EXPECT_EQ(trainer.generated(), 2);

  // Stop tokens the data cannot produce are refused, naming the key.
  EXPECT_NE(message([&] { apps::check_stop_tokens({5, 1024}, llmc, 1024, "--stop-token"); })
                .find("--stop-token: token 1024 is outside the model's vocabulary "
                      "(model.vocab: 1024)"),
            std::string::npos);
  EXPECT_NE(message([&] { apps::check_stop_tokens({10, 300}, bytes, 512, "sample.stop_tokens"); })
                .find("sample.stop_tokens: token 300 is never drawn: " + text +
                      " is text, whose tokens are bytes (0 to 255)"),
            std::string::npos);
  EXPECT_EQ(message([&] { apps::check_stop_tokens({10, 255}, bytes, 512, "k"); }), "accepted");
  apps::Sampling bad;
  bad.stop_tokens = {2000};  // named by where they came from: the config's key by default
  EXPECT_NE(message([&] { trainer.generate("1001", 2, bad, "--prompt"); })
                .find("sample.stop_tokens: token 2000 is outside"),
            std::string::npos);
  bad.stop_key = "--stop-token";
  EXPECT_NE(message([&] { trainer.generate("1001", 2, bad, "--prompt"); })
                .find("--stop-token: token 2000 is outside"),
            std::string::npos);
}

// llm.c's llama-3 token files (uint32 tokens, for vocabularies above 65536) train exactly as the
// same ids in a uint16 file: the same windows, the same losses, bit for bit.
TEST(Training, Uint32TokenFilesTrainAsTheirUint16Twins) {
  const std::string dir = temp_dir("uint32");
  std::vector<uint16_t> narrow;
  std::vector<uint32_t> wide;
  for (int i = 0; i < 3000; ++i) {
    narrow.push_back(uint16_t(1000 + (i * 7) % 23));
    wide.push_back(narrow.back());
  }
  test::write_llmc(dir + "/narrow.bin", narrow);
  test::write_llmc32(dir + "/wide.bin", wide);
  std::vector<double> losses[2];
  for (int w = 0; w < 2; ++w) {
    const std::string data = dir + (w ? "/wide.bin" : "/narrow.bin");
    const std::string text =
        "model: {layers: 2, hidden: 32, heads: 4, vocab: 1024, max_seq: 16}\n"
        "data: {path: " + data + ", val_path: " + data + ", val_windows: 8}\n"
        "train: {steps: 4, seq_len: 16, global_batch: 4, micro_batch: 2}\n"
        "eval: {every: 0}\nlog: {every: 1000, dir: " + dir + "/run" + std::to_string(w) + "}\n";
    apps::Trainer trainer(io::parse_config(text, "test"), nullptr);
    const apps::TrainSummary s = trainer.train();
    losses[w] = s.losses;
    losses[w].push_back(s.val_loss);
  }
  ASSERT_EQ(losses[0].size(), 5u);
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_GT(losses[0][0], 6.0);  // about ln(1024)
}

// apps::sample_token: the draw is softmax(logits / temperature) walked in id order with the
// seed's i-th number (so texts sampled before top_k / top_p existed are unchanged), and the cuts
// keep exactly the tokens they name, renormalised.
TEST(Sampling, DrawsFromTheSoftmaxCutToTopKAndTopP) {
  const std::vector<double> p = {0.10, 0.40, 0.05, 0.25, 0.20};  // by id
  std::vector<float> logits(p.size());
  auto draw = [&](const apps::Sampling& how, int i, int candidates = 5) {
    for (std::size_t j = 0; j < p.size(); ++j) logits[j] = float(std::log(p[j]) * 0.5);
    return apps::sample_token(logits, candidates, how, i);
  };
  apps::Sampling how;
  how.temperature = 0.5;  // logits are log(p) / 2: the softmax at 0.5 is p again
  how.seed = 77;
  constexpr int kDraws = 20000;
  // Without a cut: the id where the running sum of p first reaches u (the i-th draw's number).
  for (int i = 0; i < 2000; ++i) {
    const double u = core::word_to_unit(
        core::random_words(77, core::hash_name("colossal.sample"), i).v[0]);
    double acc = 0.0;
    int expected = 0;
    for (; expected < 4; ++expected) {
      acc += p[expected];
      if (acc >= u) break;
    }
    // Off by one only where u falls within float rounding of a boundary.
    if (std::abs(acc - u) > 1e-6) {
      ASSERT_EQ(draw(how, i), expected) << "draw " << i;
    }
  }
  // Frequencies of each cut against its renormalised probabilities.
  auto frequencies = [&](const apps::Sampling& h, int candidates = 5) {
    std::vector<double> f(p.size(), 0.0);
    for (int i = 0; i < kDraws; ++i) f[draw(h, i, candidates)] += 1.0 / kDraws;
    return f;
  };
  auto expect_near = [](const std::vector<double>& f, const std::vector<double>& want) {
    for (std::size_t j = 0; j < want.size(); ++j) {
      if (want[j] == 0.0) {
        EXPECT_EQ(f[j], 0.0) << "id " << j;  // never drawn
      } else {
        EXPECT_NEAR(f[j], want[j], 0.015) << "id " << j;
      }
    }
  };
  expect_near(frequencies(how), p);
  apps::Sampling k2 = how;
  k2.top_k = 2;  // ids 1 and 3
  expect_near(frequencies(k2), {0, 0.40 / 0.65, 0, 0.25 / 0.65, 0});
  apps::Sampling p07 = how;
  p07.top_p = 0.7;  // 0.40 + 0.25 < 0.7: id 4 (0.20) too
  expect_near(frequencies(p07), {0, 0.40 / 0.85, 0, 0.25 / 0.85, 0.20 / 0.85});
  apps::Sampling k3p05 = how;
  k3p05.top_k = 3;  // ids 1, 3, 4 (mass 0.85); then half of it: 0.40 < 0.425, so ids 1 and 3
  k3p05.top_p = 0.5;
  expect_near(frequencies(k3p05), {0, 0.40 / 0.65, 0, 0.25 / 0.65, 0});
  apps::Sampling k2p06 = how;
  k2p06.top_k = 2;  // ids 1 and 3 (mass 0.65), renormalised: 0.40 / 0.65 >= 0.6, so id 1 alone
  k2p06.top_p = 0.6;
  expect_near(frequencies(k2p06), {0, 1, 0, 0, 0});
  apps::Sampling p03 = how;
  p03.top_p = 0.3;  // the likeliest alone
  expect_near(frequencies(p03), {0, 1, 0, 0, 0});
  apps::Sampling k1 = how;
  k1.top_k = 1;
  k1.temperature = 100.0;  // nearly uniform, but cut to the likeliest
  expect_near(frequencies(k1), {0, 1, 0, 0, 0});
  // Candidates: over byte data only the first 256 ids; here the first 3 (ids 0, 1, 2).
  expect_near(frequencies(how, 3), {0.10 / 0.55, 0.40 / 0.55, 0.05 / 0.55, 0, 0});
  // Another stream of the same seed: other draws, the same distribution.
  apps::Sampling other = how;
  other.stream = 1;
  int same = 0;
  for (int i = 0; i < 200; ++i) same += draw(other, i) == draw(how, i);
  EXPECT_LT(same, 150);
  expect_near(frequencies(other), p);
  // Temperature 0: the likeliest, whatever the cuts.
  apps::Sampling greedy = k2;
  greedy.temperature = 0.0;
  EXPECT_EQ(draw(greedy, 0), 1);
}

TEST(Training, FusedAttentionTrainsTheSameModel) {
  const std::string dir = temp_dir("fused");
  io::Config dense = tiny_config(dir, "opt");
  dense.train.steps = 8;
  io::Config fused = dense;
  fused.model.fused_attention = true;
  apps::Trainer a(dense, nullptr), b(fused, nullptr);
  const auto sa = a.train(), sb = b.train();
  for (std::size_t i = 0; i < sa.losses.size(); ++i) {
    EXPECT_NEAR(sb.losses[i], sa.losses[i], 1e-4 * sa.losses[i]) << "step " << i + 1;
  }
}

// train.precision: bf16 rounds every product's operands to bfloat16: the run follows fp32's
// curve within bf16 noise (2^-8 relative per operand) and still learns, but is not fp32 bitwise.
TEST(Training, Bf16ProductsFollowTheFp32Curve) {
  const std::string dir = temp_dir("bf16");
  io::Config fp32 = tiny_config(dir, "gpt2");
  fp32.train.steps = 60;
  io::Config bf16 = fp32;
  bf16.train.precision = core::GemmPrecision::bf16;
  apps::Trainer a(fp32, nullptr), b(bf16, nullptr);
  const auto sa = a.train(), sb = b.train();
  ASSERT_EQ(sa.losses.size(), sb.losses.size());
  EXPECT_NE(sa.losses[0], sb.losses[0]);
  EXPECT_NEAR(sb.losses[0], sa.losses[0], 2e-3 * sa.losses[0]);
  // Close while the weights are close; this tiny model at lr 1e-2 spikes near step 16, after
  // which the two runs are different trajectories: compare the plateau they reach.
  for (std::size_t i = 0; i < 12; ++i) {
    EXPECT_NEAR(sb.losses[i], sa.losses[i], 0.01 * sa.losses[i]) << "step " << i + 1;
  }
  double tail_a = 0, tail_b = 0;
  for (std::size_t i = sa.losses.size() - 10; i < sa.losses.size(); ++i) {
    tail_a += sa.losses[i] / 10, tail_b += sb.losses[i] / 10;
  }
  EXPECT_NEAR(tail_b, tail_a, 0.15 * tail_a);
  EXPECT_LT(sb.last_loss, 0.15 * sb.first_loss);
}

// train.precision: bf16 on oneDNN converts the weights to bf16 once per step, into tracked
// memory that the plan predicts (2 bytes per float: the whole flat buffer, or under ZeRO-3 the
// LM head), and a step's later micro-batches and an evaluation's later batches read that copy
// while it is current: two accumulated micro-batches train the one batch's model, both follow
// the emulation (no copy, measured within 7e-6 relative over these 6 steps), and the evaluation
// equals a fresh trainer's of the saved weights (a copy kept across an update, by a forward
// promising unchanged weights when they were not, fails them).
TEST(Training, Bf16WeightCopyIsPlannedAndFollowsTheUpdates) {
  if (!core::default_gemm_keeps_copy("onednn", core::GemmPrecision::bf16)) {
    GTEST_SKIP() << "no native bf16 GEMM here (libdnnl2 and AVX512-BF16 or AMX-BF16)";
  }
  for (const int stage : {0, 3}) {
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    const std::string dir = temp_dir("bf16_copy" + std::to_string(stage));
    const std::string zero = "parallel: {zero: {stage: " + std::to_string(stage) + "}}\n";
    io::Config accumulated = tiny_config(dir, "gpt2", "hardware: {gemm: onednn}\n" + zero);
    accumulated.train.precision = core::GemmPrecision::bf16;
    accumulated.train.steps = 6;
    io::Config one_batch = accumulated;
    one_batch.train.micro_batch = 8;
    one_batch.log.dir = dir + "/one_batch";  // each run its own model file
    io::Config emulated = accumulated;
    emulated.hardware.gemm = "openblas";  // no copy: the same numerics, rounded per product
    emulated.log.dir = dir + "/emulated";

    apps::Trainer a(accumulated, nullptr), b(one_batch, nullptr), e(emulated, nullptr);
    const apps::TrainSummary sa = a.train(), sb = b.train(), se = e.train();
    ASSERT_EQ(sa.losses.size(), sb.losses.size());
    for (std::size_t i = 0; i < sa.losses.size(); ++i) {
      EXPECT_NEAR(sa.losses[i], sb.losses[i], 1e-4 * sb.losses[i]) << "step " << i + 1;
      EXPECT_NEAR(sa.losses[i], se.losses[i], 1e-4 * se.losses[i]) << "step " << i + 1;
    }
    EXPECT_LT(sa.losses.back(), sa.losses.front() - 0.5);  // the updates moved the weights
    const double evaluated = a.evaluate();
    apps::Trainer fresh(accumulated, nullptr);
    fresh.load_weights(sa.model_path);
    EXPECT_EQ(fresh.evaluate(), evaluated);

    // Planned as tracked, and exactly the copy more than the emulation's temporaries.
    EXPECT_EQ(sa.predicted_peak_bytes, double(sa.peak_tracked_bytes));
    EXPECT_EQ(se.predicted_peak_bytes, double(se.peak_tracked_bytes));
    const std::size_t held = stage == 3 ? a.model().local_vocab() * std::size_t(32)
                                        : a.model().flat_size();
    EXPECT_EQ(a.memory().peak(core::MemCategory::temporaries),
              e.memory().peak(core::MemCategory::temporaries) + 2 * held);
  }
}

TEST(Training, SameSeedSameLossesAndAccumulationMatchesOneBigBatch) {
  const std::string dir = temp_dir("repeat");
  io::Config a = tiny_config(dir, "gpt2");
  a.train.steps = 5;
  apps::Trainer t1(a, nullptr), t2(a, nullptr);
  EXPECT_EQ(t1.train().last_loss, t2.train().last_loss);  // bitwise: deterministic kernels
  io::Config b = a;
  b.train.micro_batch = 8;  // one micro-batch instead of two accumulated
  apps::Trainer t3(b, nullptr);
  apps::Trainer t4(a, nullptr);
  EXPECT_NEAR(t3.train().last_loss, t4.train().last_loss, 1e-4);
}

TEST(Training, ModelFileRoundTripsAndIsCheckedOnLoad) {
  const std::string dir = temp_dir("roundtrip");
  io::Config c = tiny_config(dir, "opt");
  c.train.steps = 10;
  apps::Trainer trained(c, nullptr);
  const auto s = trained.train();
  apps::Trainer fresh(c, nullptr);
  const double before = fresh.evaluate();
  fresh.load_weights(s.model_path);
  EXPECT_EQ(fresh.evaluate(), trained.evaluate());
  EXPECT_NE(before, fresh.evaluate());
  // A file of a different model is refused with the dataset, both shapes and the key to set.
  io::Config other = c;
  other.model.hidden = 64;
  apps::Trainer mismatched(other, nullptr);
  try {
    mismatched.load_weights(s.model_path);
    FAIL() << "expected a shape error";
  } catch (const io::H5Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape ["), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("; set model.hidden: " +
                                         std::to_string(c.model.hidden) + " to match the file"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(s.model_path + ".tmp"));
}

// A LLaMA's rotary base and RMSNorm epsilon change no tensor's shape: a model file is checked
// against the config it carries (evaluated with 10000 instead of its 5000 it was silently off).
TEST(Training, ModelFileOfALlamaKeepsItsRotaryBaseAndEpsilon) {
  const std::string dir = temp_dir("llama_numerics");
  io::Config c = tiny_config(dir, "llama");
  c.train.steps = 2;
  c.model.rope_theta = 5000.0;
  c.model.rms_eps = 1e-6;
  c.model.rope_scaling = core::RopeScaling{4.0, 1.0, 4.0, 8};  // Llama 3's, within seq_len 16
  c.text = io::to_yaml(c);
  apps::Trainer trained(c, nullptr);
  const auto s = trained.train();
  apps::Trainer same(c, nullptr);
  same.load_weights(s.model_path);
  EXPECT_EQ(same.evaluate(), trained.evaluate());
  {
    // The scaling changes the model's numbers (so the check below guards something real).
    io::Config unscaled = c;
    unscaled.model.rope_scaling = core::RopeScaling{};
    apps::Trainer plain(unscaled, nullptr);
    plain.set_logical_parameters(trained.logical_parameters());
    EXPECT_GT(std::abs(plain.evaluate() - trained.evaluate()), 1e-6);  // measured 4.9e-5
  }
  // The Hugging Face export writes the scaling as rope_scaling, which reads back (the import).
  io::export_model_file(s.model_path, dir + "/hf", io::kDefaultHfShardBytes);
  const core::ModelSpec exported = io::spec_from_hf_config(dir + "/hf");
  EXPECT_EQ(exported.rope_scaling.factor, 4.0);
  EXPECT_EQ(exported.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(exported.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(exported.rope_scaling.original_max_seq, 8);
  EXPECT_EQ(exported.rope_theta, 5000.0);
  for (const auto& [theta, eps, factor, want] :
       {std::tuple{10000.0, 1e-6, 4.0, "was trained with model.rope_theta 5000 but the config "
                                       "has 10000; set model.rope_theta: 5000"},
        std::tuple{5000.0, 1e-5, 4.0, "was trained with model.rms_eps 1e-06 but the config has "
                                      "1e-05; set model.rms_eps: 1e-06"},
        std::tuple{5000.0, 1e-6, 1.0, "was trained with model.rope_factor 4 but the config has "
                                      "1; set model.rope_factor: 4"},
        std::tuple{1000.0, 1e-6, 1.0, "was trained with model.rope_theta 5000 but the config "
                                      "has 1000, model.rope_factor 4 but the config has 1; set "
                                      "model.rope_theta: 5000, model.rope_factor: 4"}}) {
    io::Config other = c;
    other.model.rope_theta = theta;
    other.model.rms_eps = eps;
    other.model.rope_scaling.factor = factor;
    apps::Trainer mismatched(other, nullptr);
    try {
      mismatched.load_weights(s.model_path);
      ADD_FAILURE() << "loaded with other numerics: " << want;
    } catch (const io::H5Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  // A training checkpoint is not a model file, and the error says where it goes.
  c.checkpoint.every = 1;
  c.log.dir = dir + "/ckpt";
  c.text = io::to_yaml(c);
  apps::Trainer checkpointed(c, nullptr);
  checkpointed.train();
  try {
    same.load_weights(dir + "/ckpt/checkpoints/ckpt-2.h5");
    ADD_FAILURE() << "a checkpoint was read as a model file";
  } catch (const io::H5Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a training checkpoint, not a model file"),
              std::string::npos) << e.what();
  }
}

// Checkpoints numbered after a run's first step are another run's: a fresh start in a used
// log.dir moves them aside (the retention kept the newest by step, so it deleted the new run's
// own, and resume: auto then continued the old run), and auto continues the new run.
TEST(Training, AFreshRunSetsAsideAnotherRunsLaterCheckpoints) {
  const std::string dir = temp_dir("set_aside");
  io::Config c = tiny_config(dir, "gpt2");
  c.train.steps = 6;
  c.checkpoint.every = 2;
  c.checkpoint.keep = 3;
  c.text = io::to_yaml(c);
  apps::Trainer(c, nullptr).train();
  const std::string ckpts = dir + "/run/checkpoints";
  ASSERT_EQ(io::list_checkpoints(ckpts).size(), 3u);
  io::Config fresh = c;
  fresh.train.steps = 3;
  fresh.text = io::to_yaml(fresh);
  apps::Trainer(fresh, nullptr).train();
  std::vector<std::string> names;
  for (const std::string& p : io::list_checkpoints(ckpts))
    names.push_back(std::filesystem::path(p).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt-3.h5", "ckpt-2.h5"}));
  int folders = 0, moved = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ckpts)) {
    if (!entry.is_directory()) continue;
    ++folders;
    EXPECT_EQ(entry.path().filename().string().rfind("superseded-at-step0-", 0), 0u)
        << entry.path();
    moved += int(io::list_checkpoints(entry.path().string()).size());
  }
  EXPECT_EQ(folders, 1);
  EXPECT_EQ(moved, 3) << "the earlier run's ckpt-2, 4 and 6, nothing deleted";
  io::Config resumed = c;
  resumed.train.steps = 5;
  resumed.checkpoint.resume = io::ResumeMode::automatic;
  resumed.text = io::to_yaml(resumed);
  EXPECT_EQ(apps::Trainer(resumed, nullptr).train().first_step, 3);
}

// A disk without room for a checkpoint is found before HDF5 writes to it (HDF5 left its file open
// after a failed flush, and every rank crashed closing it at MPI_Finalize).
TEST(Training, ACheckpointWithoutRoomOnTheDiskIsAnErrorBeforeWriting) {
  const std::string dir = temp_dir("disk_full");
  io::Config c = tiny_config(dir, "gpt2");
  c.train.steps = 2;
  c.checkpoint.every = 1;
  c.text = io::to_yaml(c);
  setenv("COLOSSAL_TEST_CHECKPOINT_FREE_BYTES", "100000", 1);
  std::string what;
  try {
    apps::Trainer(c, nullptr).train();
  } catch (const std::exception& e) {
    what = e.what();
  }
  unsetenv("COLOSSAL_TEST_CHECKPOINT_FREE_BYTES");
  const std::string said = "checkpoint.dir '" + dir + "/run/checkpoints' has 97.7 KiB free but a "
                           "checkpoint takes about ";
  ASSERT_NE(what.find(said), std::string::npos) << what;
  // Less than a MiB, more than the 100000 bytes free.
  const std::string size = what.substr(what.find(said) + said.size());
  EXPECT_EQ(size.find(" KiB (parameters"), std::string(size, 0, size.find(' ')).size()) << what;
  EXPECT_GT(std::stod(size), 97.7) << what;
  EXPECT_TRUE(io::list_checkpoints(dir + "/run/checkpoints").empty());
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/run/checkpoints"))
    ADD_FAILURE() << "left behind: " << entry.path();
}

TEST(Training, NonFiniteLossStopsOrSkipsAsConfigured) {
  const std::string dir = temp_dir("nonfinite");
  io::Config c = tiny_config(dir, "gpt2");
  c.train.steps = 4;
  c.train.optimizer.lr = 1e30;
  c.train.optimizer.min_lr = 1e29;
  c.train.optimizer.warmup = 0;
  c.train.optimizer.grad_clip = 0;
  apps::Trainer stop(c, nullptr);
  try {
    stop.train();
    FAIL() << "expected a non-finite error";
  } catch (const apps::NonFiniteError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train.on_nonfinite"), std::string::npos) << what;
    // The state before the bad step is checkpointed, so the run can resume from it.
    EXPECT_NE(what.find("holds the state before it"), std::string::npos) << what;
    EXPECT_FALSE(io::list_checkpoints(dir + "/run/checkpoints").empty());
  }
  c.train.on_nonfinite = io::OnNonfinite::skip;
  apps::Trainer skip(c, nullptr);
  const auto s = skip.train();
  EXPECT_GT(s.skipped_steps, 0);
  EXPECT_EQ(s.steps, 4);
}

}  // namespace

namespace {
// --memory-plan: a dry-run trainer counts exactly the bytes a real one allocates, category by
// category, without allocating them.
TEST(MemoryPlan, CountsWhatTheRealRunAllocates) {
  const std::string dir = temp_dir("memory_plan");
  const io::Config config = tiny_config(dir, "gpt2");
  apps::Trainer plan(config, nullptr, nullptr, apps::TrainerOptions{.memory_plan = true});
  apps::Trainer real(config, nullptr);
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    const auto category = core::MemCategory(c);
    EXPECT_EQ(plan.memory().current(category), real.memory().current(category))
        << core::category_name(category);
  }
  EXPECT_GT(plan.memory().peak_total(), 0u);
  EXPECT_EQ(plan.memory().peak_total(), real.memory().peak_total());
  EXPECT_EQ(plan.model().store().full_params(), nullptr) << "a plan allocates nothing";
  EXPECT_NE(real.model().store().full_params(), nullptr);
}
}  // namespace

namespace {
// Activation checkpointing changes memory, not results: recomputing blocks in backward gives
// bitwise the same losses and weights, and frees their activations.
TEST(Recompute, SameTrainingWithLessActivationMemory) {
  const std::string dir = temp_dir("recompute");
  io::Config keep = tiny_config(dir, "gpt2");
  keep.train.steps = 6;
  io::Config again = keep;
  again.checkpointing.policy = core::CheckpointPolicy::full;  // every block keeps only its input
  apps::Trainer a(keep, nullptr), b(again, nullptr);
  const apps::TrainSummary sa = a.train(), sb = b.train();
  ASSERT_EQ(sa.losses.size(), sb.losses.size());
  for (std::size_t i = 0; i < sa.losses.size(); ++i) EXPECT_EQ(sa.losses[i], sb.losses[i]) << i;
  EXPECT_EQ(a.logical_parameters(), b.logical_parameters());
  const std::size_t kept = a.memory().current(core::MemCategory::activations);
  const std::size_t recomputed = b.memory().current(core::MemCategory::activations);
  EXPECT_LT(recomputed, kept / 2) << "the blocks' activations must be freed";
  io::Config one = keep;
  one.checkpointing.policy = core::CheckpointPolicy::manual;
  one.checkpointing.blocks = {1};
  apps::Trainer c(one, nullptr);
  EXPECT_EQ(c.train().losses, sa.losses);
}
}  // namespace
