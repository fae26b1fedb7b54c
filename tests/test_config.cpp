// Config parsing: values, presets, --set overrides, the to_yaml round trip, and one test per
// class of bad input, each checking that the message names the key, the line and what to do.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "io/config.hpp"

namespace colossal::io {
namespace {

// A complete config; line numbers matter to the error tests below.
const char* kFullConfig = R"(model:
  arch: opt
  layers: 4
  hidden: 128
  heads: 8
  ffn_hidden: 256
  vocab: 256
  max_seq: 512
data:
  path: data/train.txt
  val_path: data/val.txt
  val_windows: 16
train:
  steps: 50
  seq_len: 64
  global_batch: 16
  micro_batch: 2
  seed: 7
  precision: fp32
  optimizer:
    lr: 1.0e-3
    min_lr: 1.0e-4
    warmup: 5
    betas: [0.8, 0.99]
    eps: 1.0e-6
    weight_decay: 0.01
    grad_clip: 0.5
  on_nonfinite: skip
hardware:
  preset: host
  peak_tflops: 2.5
eval:
  every: 25
log:
  every: 5
  dir: runs/test
sample:
  prompt: "Once upon"
  tokens: 32
  temperature: 0.7
  top_k: 40
  top_p: 0.9
  stop_tokens: [10, 46]
)";

// The smallest valid config: a preset and the data path.
const char* kMinimal = "model:\n  preset: gpt2-124m\ndata:\n  path: data/train.bin\n";

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not found in:\n  " << text;
}

// The ConfigError message for `yaml`, or a test failure when it parses.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << yaml;
  return "";
}

// Checks that `message` contains every one of `parts`.
void expect_all(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) EXPECT_TRUE(Contains(message, part));
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.model_preset, b.model_preset);
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.layers, b.model.layers);
  EXPECT_EQ(a.model.hidden, b.model.hidden);
  EXPECT_EQ(a.model.heads, b.model.heads);
  EXPECT_EQ(a.model.ffn_hidden, b.model.ffn_hidden);
  EXPECT_EQ(a.model.vocab, b.model.vocab);
  EXPECT_EQ(a.model.max_seq, b.model.max_seq);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.data.val_path, b.data.val_path);
  EXPECT_EQ(a.data.val_windows, b.data.val_windows);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.seq_len, b.train.seq_len);
  EXPECT_EQ(a.train.global_batch, b.train.global_batch);
  EXPECT_EQ(a.train.micro_batch, b.train.micro_batch);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.precision, b.train.precision);
  EXPECT_EQ(a.train.tf32, b.train.tf32);
  EXPECT_EQ(a.train.on_nonfinite, b.train.on_nonfinite);
  const OptimizerConfig &oa = a.train.optimizer, &ob = b.train.optimizer;
  // Exact comparisons on purpose: to_yaml writes the shortest text that reads back bit-exact.
  EXPECT_EQ(oa.lr, ob.lr);
  EXPECT_EQ(oa.min_lr, ob.min_lr);
  EXPECT_EQ(oa.warmup, ob.warmup);
  EXPECT_EQ(oa.beta1, ob.beta1);
  EXPECT_EQ(oa.beta2, ob.beta2);
  EXPECT_EQ(oa.eps, ob.eps);
  EXPECT_EQ(oa.weight_decay, ob.weight_decay);
  EXPECT_EQ(oa.grad_clip, ob.grad_clip);
  EXPECT_EQ(a.hardware.preset, b.hardware.preset);
  EXPECT_EQ(a.hardware.peak_tflops, b.hardware.peak_tflops);
  EXPECT_EQ(a.eval.every, b.eval.every);
  EXPECT_EQ(a.log.every, b.log.every);
  EXPECT_EQ(a.log.dir, b.log.dir);
  EXPECT_EQ(a.sample.prompt, b.sample.prompt);
  EXPECT_EQ(a.sample.tokens, b.sample.tokens);
  EXPECT_EQ(a.sample.temperature, b.sample.temperature);
  EXPECT_EQ(a.sample.top_k, b.sample.top_k);
  EXPECT_EQ(a.sample.top_p, b.sample.top_p);
  EXPECT_EQ(a.sample.stop_tokens, b.sample.stop_tokens);
  EXPECT_EQ(a.text, b.text);
}

// ---- valid input --------------------------------------------------------------------------------

TEST(Config, FullConfigParsesWithExpectedValues) {
  const Config c = parse_config(kFullConfig, "full.yaml");
  EXPECT_EQ(c.source, "full.yaml");
  EXPECT_TRUE(c.model_preset.empty());
  EXPECT_EQ(c.model.arch, core::Arch::opt);
  EXPECT_EQ(c.model.layers, 4);
  EXPECT_EQ(c.model.hidden, 128);
  EXPECT_EQ(c.model.heads, 8);
  EXPECT_EQ(c.model.ffn_hidden, 256);
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.max_seq, 512);
  EXPECT_EQ(c.data.path, "data/train.txt");
  EXPECT_EQ(c.data.val_path, "data/val.txt");
  EXPECT_EQ(c.data.val_windows, 16);
  EXPECT_EQ(c.train.steps, 50);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.train.global_batch, 16);
  EXPECT_EQ(c.train.micro_batch, 2);
  EXPECT_EQ(c.accumulation_steps(), 8);
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.train.precision, core::GemmPrecision::fp32);
  EXPECT_DOUBLE_EQ(c.train.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.train.optimizer.min_lr, 1e-4);
  EXPECT_EQ(c.train.optimizer.warmup, 5);
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.train.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.train.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.train.optimizer.grad_clip, 0.5);
  EXPECT_EQ(c.train.on_nonfinite, OnNonfinite::skip);
  EXPECT_EQ(c.hardware.preset, "host");
  EXPECT_DOUBLE_EQ(c.hardware.peak_tflops, 2.5);
  EXPECT_EQ(c.eval.every, 25);
  EXPECT_EQ(c.log.every, 5);
  EXPECT_EQ(c.log.dir, "runs/test");
  EXPECT_EQ(c.sample.prompt, "Once upon");
  EXPECT_EQ(c.sample.tokens, 32);
  EXPECT_DOUBLE_EQ(c.sample.temperature, 0.7);
  EXPECT_EQ(c.sample.top_k, 40);
  EXPECT_DOUBLE_EQ(c.sample.top_p, 0.9);
  EXPECT_EQ(c.sample.stop_tokens, (std::vector<int>{10, 46}));
  EXPECT_EQ(c.text, to_yaml(c));
}

TEST(Config, OmittedKeysTakeTheirDefaults) {
  const Config c = parse_config(kMinimal, "min.yaml");
  const Config defaults;
  EXPECT_EQ(c.train.steps, defaults.train.steps);
  EXPECT_EQ(c.train.seq_len, defaults.train.seq_len);
  EXPECT_EQ(c.train.optimizer.lr, defaults.train.optimizer.lr);
  EXPECT_EQ(c.train.optimizer.beta2, defaults.train.optimizer.beta2);
  EXPECT_EQ(c.train.on_nonfinite, OnNonfinite::stop);
  EXPECT_FALSE(c.train.tf32);  // fp32 products stay plain fp32 unless a config asks for TF32
  EXPECT_EQ(c.log.dir, defaults.log.dir);
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_EQ(c.sample.tokens, 0);
}

TEST(Config, PresetFillsDimsAndExplicitKeysOverride) {
  const Config plain = parse_config(kMinimal, "p.yaml");
  EXPECT_EQ(plain.model_preset, "gpt2-124m");
  EXPECT_EQ(plain.model.layers, 12);
  EXPECT_EQ(plain.model.hidden, 768);
  EXPECT_EQ(plain.model.ffn_hidden, 3072);
  EXPECT_EQ(plain.model.vocab, 50257);

  const Config c = parse_config(
      "model: {preset: opt-125m, layers: 2, vocab: 256}\ndata: {path: d.bin}\n", "p.yaml");
  EXPECT_EQ(c.model_preset, "opt-125m");
  EXPECT_EQ(c.model.arch, core::Arch::opt);  // the preset's arch
  EXPECT_EQ(c.model.layers, 2);              // explicit keys win
  EXPECT_EQ(c.model.vocab, 256);
  EXPECT_EQ(c.model.hidden, 768);  // the rest come from the preset
  EXPECT_EQ(c.model.max_seq, 2048);
}

TEST(Config, FfnHiddenDefaultsToFourTimesHidden) {
  const Config c = parse_config(
      "model: {layers: 2, hidden: 64, heads: 4, vocab: 256, max_seq: 128}\n"
      "data: {path: d.bin}\ntrain: {seq_len: 128}\n",
      "f.yaml");
  EXPECT_EQ(c.model.arch, core::Arch::gpt2);
  EXPECT_EQ(c.model.ffn_hidden, 256);
  // With a preset, overriding hidden moves the default ffn_hidden with it.
  const Config p = parse_config(
      "model: {preset: gpt2-124m, hidden: 512, heads: 8}\ndata: {path: d.bin}\n", "f.yaml");
  EXPECT_EQ(p.model.ffn_hidden, 2048);
}

TEST(Config, LoadConfigReadsAFile) {
  const auto path = std::filesystem::temp_directory_path() / "colossal_test_config.yaml";
  std::ofstream(path) << kFullConfig;
  const Config c = load_config(path.string(), {"train.steps=9"});
  EXPECT_EQ(c.source, path.string());
  EXPECT_EQ(c.train.steps, 9);
  std::ofstream(path) << "train:\n  steps: -3\n";
  try {
    load_config(path.string());
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    expect_all(e.what(), {path.string() + ":2:10: train.steps", "-3"});
  }
  std::filesystem::remove(path);
}

// ---- --set overrides ----------------------------------------------------------------------------

TEST(ConfigSet, OverridesAScalar) {
  const Config c = parse_config(kFullConfig, "s.yaml",
                                {"train.steps=2000", "log.dir=runs/x", "train.tf32=true"});
  EXPECT_EQ(c.train.steps, 2000);
  EXPECT_EQ(c.log.dir, "runs/x");
  EXPECT_TRUE(c.train.tf32);
  try {
    parse_config(kFullConfig, "s.yaml", {"train.tf32=yes"});
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("train.tf32: invalid value 'yes' (one of: false, true)"),
              std::string::npos)
        << e.what();
  }
}

// The grid modes run on the shared trainer, whose non-finite step handling covers them: skip is
// accepted with every tensor mode (tests/test_tensor_md.cpp trains 2d through skipped steps).
TEST(Config, GridTensorModesAcceptOnNonfiniteSkip) {
  for (const char* grid : {"{size: 4, mode: 2d}", "{size: 8, mode: 2.5d, depth: 2}",
                           "{size: 8, mode: 3d}"}) {
    const Config c = parse_config(std::string(kMinimal) + "train: {on_nonfinite: skip, "
                                  "micro_batch: 4, global_batch: 16}\nparallel: {tensor: " +
                                  grid + "}\n", "t.yaml");
    EXPECT_EQ(c.train.on_nonfinite, OnNonfinite::skip) << grid;
    EXPECT_NE(c.parallel.tensor_mode, core::TensorMode::d1) << grid;
    // Activation checkpointing runs in these modes too: every policy (whole blocks; selective
    // the attention probabilities).
    for (const char* policy : {"full", "sqrt", "every_k, every: 2", "manual, blocks: [1]",
                               "rotor, memory_budget: 4", "selective"}) {
      const Config k = parse_config(std::string(kMinimal) + "checkpointing: {policy: " + policy +
                                    "}\ntrain: {micro_batch: 4, global_batch: 16}\n"
                                    "parallel: {tensor: " + grid + "}\n", "t.yaml");
      EXPECT_NE(k.checkpointing.policy, core::CheckpointPolicy::none) << grid << " " << policy;
    }
  }
}

TEST(ConfigSet, OverridesNestedKeysAndCreatesSections) {
  // kMinimal has no train section: --set creates it.
  const Config c = parse_config(kMinimal, "s.yaml",
                                {"train.optimizer.lr=0.01", "train.optimizer.min_lr=0.001",
                                 "model.layers=3", "train.on_nonfinite = skip"});
  EXPECT_DOUBLE_EQ(c.train.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(c.train.optimizer.min_lr, 0.001);
  EXPECT_EQ(c.model.layers, 3);
  EXPECT_EQ(c.train.on_nonfinite, OnNonfinite::skip);
  // A whole section as a flow mapping; later overrides win.
  const Config s = parse_config(kMinimal, "s.yaml", {"eval={every: 7}", "eval.every=8"});
  EXPECT_EQ(s.eval.every, 8);
}

TEST(ConfigSet, OverridesAList) {
  const Config c = parse_config(kFullConfig, "s.yaml", {"train.optimizer.betas=[0.9,0.999]"});
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.train.optimizer.beta2, 0.999);
}

TEST(ConfigSet, UnknownKeyIsAnErrorWithSuggestion) {
  const std::string message = error_of(kMinimal, {"train.stesp=5"});
  expect_all(message, {"--set 'train.stesp=5'", "train.stesp", "unknown key",
                       "did you mean 'train.steps'?"});
  // A known name in the wrong section is found by its last part.
  expect_all(error_of(kMinimal, {"train.lr=0.1"}), {"did you mean 'train.optimizer.lr'?"});
}

TEST(ConfigSet, BadValuesAndSyntaxNameTheOverride) {
  expect_all(error_of(kMinimal, {"train.steps=abc"}),
             {"--set 'train.steps=abc': train.steps: expected an integer, got 'abc'"});
  expect_all(error_of(kMinimal, {"train.optimizer.betas=[0.9,"}),
             {"--set 'train.optimizer.betas=[0.9,'", "not valid YAML"});
  expect_all(error_of(kMinimal, {"train.steps"}),
             {"--set 'train.steps'", "missing '='", "key=value"});
}

// Llama 3's rotary scaling: the four keys, and an empty band between the wavelengths refused.
TEST(ConfigSet, RopeScalingKeys) {
  const Config c = parse_config(kMinimal, "m.yaml",
                                {"model.rope_factor=32", "model.rope_low_freq_factor=1",
                                 "model.rope_high_freq_factor=4",
                                 "model.rope_original_max_seq=8192"});
  EXPECT_EQ(c.model.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.model.rope_scaling.original_max_seq, 8192);
  EXPECT_EQ(parse_config(to_yaml(c), "again").model.rope_scaling.high_freq_factor, 4.0);
  EXPECT_FALSE(parse_config(kMinimal, "m.yaml").model.rope_scaling.scaled());
  expect_all(error_of(kMinimal, {"model.rope_factor=8", "model.rope_low_freq_factor=4"}),
             {"model.rope_low_freq_factor: 4.0 with model.rope_high_freq_factor 4.0",
              "so low < high"});
  expect_all(error_of(kMinimal, {"model.rope_factor=0.5"}),
             {"model.rope_factor: 0.5 is out of range"});
}

// sample.stop_tokens: ids of the model's vocabulary only.
TEST(ConfigSet, StopTokensAreTheModelsIds) {
  expect_all(error_of(kMinimal, {"sample.stop_tokens=[50256, 50257]"}),
             {"sample.stop_tokens: token 50257 with model.vocab 50257",
              "list ids below 50257"});
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", {"sample.stop_tokens=[50256]"}).sample.stop_tokens,
            std::vector<int>{50256});
}

// log.save_model: a choice of false/true; false beside log.export_hf: true is refused by name.
TEST(ConfigSet, SaveModelValuesAndTheExportThatNeedsIt) {
  expect_all(error_of(kMinimal, {"log.save_model=maybe"}),
             {"log.save_model", "maybe", "false", "true"});
  expect_all(error_of(kMinimal, {"log.save_model=false", "log.export_hf=true"}),
             {"log.export_hf: true needs the model file, but log.save_model is false",
              "set log.save_model: true, or log.export_hf: false"});
}

// ---- one test per class of bad input ------------------------------------------------------------

TEST(ConfigError, UnknownKeySuggestsTheClosest) {
  const std::string message = error_of("data: {path: d.bin}\ntrain:\n  stpes: 10\n");
  expect_all(message, {"test.yaml:3:3: train.stpes: unknown key", "keys of train: steps",
                       "did you mean 'train.steps'?"});
  // Nothing close: no guess, a pointer to the documentation instead.
  expect_all(error_of("data: {path: d.bin}\ntrain:\n  zzzzzzzz: 1\n"),
             {"train.zzzzzzzz", "configs/README.md"});
}

TEST(ConfigError, UnknownSectionSuggestsTheClosest) {
  const std::string message = error_of(std::string(kMinimal) + "trian:\n  steps: 3\n");
  expect_all(message, {"test.yaml:5:1: trian: unknown section",
                       "sections: model, data, train, parallel, checkpointing, hardware, eval, log, checkpoint, sample",
                       "did you mean 'train'?"});
}

TEST(ConfigError, WrongTypeNamesTheValue) {
  expect_all(error_of(std::string(kMinimal) + "train:\n  steps: abc\n"),
             {"test.yaml:6:10: train.steps: expected an integer, got 'abc'", "an integer >= 1",
              "for example train.steps: 1000"});
  expect_all(error_of(std::string(kMinimal) + "train:\n  steps: 1.5\n"), {"got '1.5'"});
  expect_all(error_of(std::string(kMinimal) + "train:\n  optimizer: {lr: fast}\n"),
             {"test.yaml:6:19: train.optimizer.lr: expected a finite number, got 'fast'"});
  expect_all(error_of(std::string(kMinimal) + "train:\n  optimizer: {betas: 0.9}\n"),
             {"train.optimizer.betas: expected a list of two numbers, got '0.9'"});
  expect_all(error_of(std::string(kMinimal) + "eval: 5\n"),
             {"test.yaml:5:7: eval: expected a mapping of keys, got '5'", "keys of eval: every"});
}

TEST(ConfigError, OutOfRangeStatesTheBounds) {
  struct Case {
    std::string yaml, expected;
  };
  const std::string base = kMinimal;  // four lines, so the keys below start on line 5
  const std::vector<Case> cases = {
      {base + "train:\n  steps: 0\n",
       "test.yaml:6:10: train.steps: 0 is out of range (an integer >= 1)"},
      {base + "train:\n  micro_batch: -1\n",
       "test.yaml:6:16: train.micro_batch: -1 is out of range (an integer >= 1)"},
      {base + "train:\n  optimizer:\n    lr: 0\n",
       "test.yaml:7:9: train.optimizer.lr: 0 is out of range (a number > 0)"},
      {base + "sample:\n  top_p: 0\n",
       "test.yaml:6:10: sample.top_p: 0 is out of range (a number in (0, 1])"},
      {base + "sample:\n  top_k: -3\n",
       "test.yaml:6:10: sample.top_k: -3 is out of range (an integer >= 0)"},
      {base + "train:\n  optimizer:\n    betas: [0.9, 1.0]\n",
       "test.yaml:7:18: train.optimizer.betas: 1.0 is out of range (a list of two numbers, each "
       "in [0, 1))"},
      {"model: {preset: gpt2-124m, layers: 99999999999}\ndata: {path: d}\n",
       "test.yaml:1:36: model.layers: 99999999999 is out of range (an integer in [1, 1000])"},
      // Far beyond any model or batch: refused before the memory check spends minutes on them.
      {"model: {preset: gpt2-124m, layers: 100000000}\ndata: {path: d}\n",
       "model.layers: 100000000 is out of range (an integer in [1, 1000])"},
      {"model: {preset: gpt2-124m}\ndata: {path: d}\ntrain: {global_batch: 2000000000}\n",
       "train.global_batch: 2000000000 is out of range (an integer in [1, 1048576])"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    expect_all(error_of(c.yaml), {c.expected, "for example"});
  }
}

TEST(ConfigError, InvalidEnumListsTheAllowedValues) {
  expect_all(error_of(std::string(kMinimal) + "train:\n  on_nonfinite: stopp\n"),
             {"test.yaml:6:17: train.on_nonfinite: invalid value 'stopp'", "one of: stop, skip",
              "did you mean 'stop'?"});
  expect_all(error_of("model: {arch: bert, preset: gpt2-124m}\ndata: {path: d}\n"),
             {"test.yaml:1:15: model.arch: invalid value 'bert'", "one of: gpt2, opt"});
  expect_all(error_of(std::string(kMinimal) + "train:\n  precision: fp16\n"),
             {"test.yaml:6:14: train.precision: invalid value 'fp16'", "one of: fp32, bf16"});
}

TEST(ConfigError, InconsistentDimsNameBothKeys) {
  struct Case {
    std::string yaml;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"model: {preset: gpt2-124m, hidden: 770}\ndata: {path: d}\n",
       {"test.yaml:1:36: model.heads: model.hidden = 770 is not divisible by model.heads = 12",
        "such as 11 or 14"}},
      {std::string(kMinimal) + "train: {seq_len: 2048}\n",
       {"test.yaml:5:18: train.seq_len: 2048 is longer than model.max_seq = 1024",
        "train.seq_len <= 1024"}},
      {std::string(kMinimal) + "train: {global_batch: 30, micro_batch: 4}\n",
       {"test.yaml:5:23: train.global_batch: 30 is not a multiple of train.micro_batch = 4",
        "28 or 32"}},
      {std::string(kMinimal) + "train:\n  optimizer: {lr: 1.0e-3, min_lr: 0.01}\n",
       {"test.yaml:6:35: train.optimizer.min_lr: 0.01 is above train.optimizer.lr = 0.001",
        "min_lr <= 0.001"}},

      // gpt2-124m has 12 heads and ffn 3072: 5 divides neither; 4 and 6 divide both.
      {std::string(kMinimal) + "parallel: {tensor: {size: 5}}\n",
       {"parallel.tensor.size: 5 does not divide model.heads = 12", "set parallel.tensor.size to 4 or 6"}},
      {std::string(kMinimal) + "parallel: {tensor: {size: 8}}\n",
       {"parallel.tensor.size: 8 does not divide model.heads = 12", "to 6 or 12"}},
      {std::string(kMinimal) + "parallel: {tensor: {size: 2, mode: 2d}}\n",
       {"parallel.tensor.size: 2 is not a square q^2 with q >= 2 (mode 2d)",
        "set parallel.tensor.size to 4 or 9"}},
      {std::string(kMinimal) + "parallel: {tensor: {size: 12, mode: 2.5d, depth: 2}}\n",
       {"parallel.tensor.size: 12 is not q^2 x depth with q >= 2 (mode 2.5d, depth 2)",
        "to 8 or 18"}},
      {std::string(kMinimal) +
           "parallel: {data: 2, tensor: {size: 8, mode: 3d}, pipeline: {size: 2}, zero: {stage: 3}}\n",
       {"parallel.zero.stage: 3 with tensor mode 3d", "set it to 0, 1 or 2"}},
      {std::string(kMinimal) + "parallel: {data: 2, tensor: {size: 4, mode: 2d}, zero: {stage: 3}}\n",
       {"parallel.zero.stage: 3 with tensor mode 2d", "set it to 0, 1 or 2"}},
      {std::string(kMinimal) + "train: {micro_batch: 2}\nparallel: {tensor: {size: 8, mode: 3d}}\n",
       {"train.micro_batch: 2 is not a multiple of 4 (mode 3d, q = 2)", "set train.micro_batch to 4"}},
      {std::string(kMinimal) + "parallel: {tensor: {size: 4, depth: 2}}\n",
       {"parallel.tensor.depth: 2 with mode 1d", "set parallel.tensor.mode: 2.5d or depth: 1"}},
      {std::string(kMinimal) + "train: {seq_len: 250}\nparallel: {sequence: 4}\n",
       {"parallel.sequence: 4 does not divide train.seq_len = 250", "248 or 252"}},
      {std::string(kMinimal) + "checkpointing: {policy: manual, blocks: [3, 12]}\n",
       {"checkpointing.blocks: block 12 of a model with 12 layers", "below 12"}},
      {std::string(kMinimal) + "checkpointing: {policy: every_k, every: -1}\n",
       {"checkpointing.every: -1 is out of range"}},
      {std::string(kMinimal) + "checkpointing: {policy: every_k}\n",
       {"checkpointing.every: is needed by checkpointing.policy: every_k", "every: 2"}},
      {std::string(kMinimal) + "checkpointing: {policy: rotor}\n",
       {"checkpointing.memory_budget: is needed by checkpointing.policy: rotor",
        "--memory-plan"}},
      {std::string(kMinimal) + "checkpointing: {policy: manual}\n",
       {"checkpointing.blocks: is needed by checkpointing.policy: manual"}},
      {std::string(kMinimal) + "checkpointing: {policy: sqrt, blocks: [1]}\n",
       {"checkpointing.blocks: is set but checkpointing.policy is sqrt", "policy: manual"}},
      {std::string(kMinimal) + "checkpointing: {policy: full, memory_budget: 4}\n",
       {"checkpointing.memory_budget: is set but checkpointing.policy is full"}},
      {std::string(kMinimal) + "checkpointing: {policy: rotr}\n",
       {"checkpointing.policy", "did you mean 'rotor'?"}},
      {"model: {preset: gpt2-124m, vocab_multiple: 0}\ndata: {path: d}\n",
       {"model.vocab_multiple: 0 is out of range"}},
      {std::string(kMinimal) + "hardware: {host_memory_gib: -1}\n",
       {"hardware.host_memory_gib: -1 is out of range"}},
      {std::string(kMinimal) + "hardware: {host_memory_gib: lots}\n",
       {"hardware.host_memory_gib"}},
      {std::string(kMinimal) + "parallel: {pipeline: {size: 13}}\n",
       {"parallel.pipeline.size: 13 stages (size x chunks) for 12 layers", "at most 12"}},
      {std::string(kMinimal) + "parallel: {pipeline: {size: 2, chunks: 2}}\n",
       {"parallel.pipeline.chunks: 2 with schedule 1f1b", "schedule: interleaved"}},
      {std::string(kMinimal) + "train: {global_batch: 24, micro_batch: 8}\n"
       "parallel: {pipeline: {size: 2, chunks: 2, schedule: interleaved}}\n",
       {"interleaved with 3 micro-batches per step for 2 stages", "a multiple of 2"}},
      {std::string(kMinimal) + "parallel: {pipeline: {size: 2, layers: [5, 5]}}\n",
       {"parallel.pipeline.layers: 2 entries summing to 10 for 2 stages of 12 layers"}},
      {std::string(kMinimal) + "parallel: {pipeline: {size: 2, layers: [12, 0]}}\n",
       {"parallel.pipeline.layers: 0 is out of range"}},
      {std::string(kMinimal) + "train: {global_batch: 8, micro_batch: 4}\nparallel: {pipeline: {size: 4}}\n",
       {"parallel.pipeline.schedule: 1f1b with 2 micro-batches per step", "for 4 stages",
        "schedule: gpipe"}},
      {"model: {preset: gpt2-124m, fused_attention: true}\ndata: {path: d}\nparallel: {sequence: 2}\n",
       {"model.fused_attention: true with parallel.sequence = 2"}},
      {std::string(kMinimal) + "parallel: {tensor: {sequence_split: true}}\n",
       {"parallel.tensor.sequence_split: true with parallel.tensor.size = 1"}},
      {std::string(kMinimal) + "train: {seq_len: 250}\nparallel: {tensor: {size: 4, sequence_split: true}}\n",
       {"250 positions per sequence rank", "not divisible by parallel.tensor.size = 4", "multiple of 4"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    expect_all(error_of(c.yaml), c.expected);
  }
}

TEST(ConfigError, UnknownPresetListsPresets) {
  expect_all(error_of("model:\n  preset: gpt2-125m\ndata: {path: d}\n"),
             {"test.yaml:2:11: model.preset: unknown preset 'gpt2-125m'",
              "presets: gpt2-1.5b, gpt2-124m", "opt-175b", "did you mean 'gpt2-124m'?"});
}

TEST(ConfigError, MissingRequiredKeyIsNamed) {
  expect_all(error_of("model:\n  hidden: 64\n  heads: 4\ndata: {path: d}\n"),
             {"test.yaml:1:1: model.layers: missing required key",
              "required when model.preset is not set", "set model.preset to one of"});
  expect_all(error_of("model: {preset: gpt2-124m}\n"),
             {"test.yaml: data.path: missing required key", "add data: {path: data/train.bin}",
              "--set data.path=data/train.bin"});
  expect_all(error_of("model: {preset: gpt2-124m}\ndata: {path: ''}\n"),
             {"test.yaml:2:14: data.path: expected a non-empty string"});
}

TEST(ConfigError, YamlSyntaxErrorHasPosition) {
  expect_all(error_of("model: {preset: gpt2-124m\ndata: {path: d}\n"),
             {"test.yaml:2:", "YAML syntax error", "must be valid YAML"});
  expect_all(error_of("train:\n  steps: 1\n bad: 2\n"), {"test.yaml:3:2: YAML syntax error"});
}

TEST(ConfigError, MissingFileNamesThePath) {
  try {
    load_config("/nonexistent/dir/run.yaml");
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    expect_all(e.what(), {"/nonexistent/dir/run.yaml: config file: cannot be opened",
                          "No such file or directory", "check the path"});
  }
}

TEST(ConfigError, DuplicateKeyPointsAtBoth) {
  expect_all(error_of(std::string(kMinimal) + "train:\n  steps: 1\n  steps: 2\n"),
             {"test.yaml:7:3: train.steps: duplicate key", "first at line 6"});
}

// ---- serialisation ------------------------------------------------------------------------------

TEST(Config, ToYamlRoundTrips) {
  const Config full = parse_config(kFullConfig, "full.yaml");
  const Config again = parse_config(to_yaml(full), "full.yaml");
  expect_same(full, again);

  // Awkward strings and doubles that have no short decimal form.
  Config odd = parse_config(kMinimal, "min.yaml");
  odd.sample.prompt = "null: [x] \"quoted\"\nsecond line";
  odd.data.val_path = "123";
  odd.train.optimizer.lr = 1.0 / 3.0;
  odd.train.optimizer.min_lr = 1e-300;
  odd.train.seed = 9007199254740993ull;  // not representable as a double
  odd.text = to_yaml(odd);
  const Config back = parse_config(odd.text, "min.yaml");
  expect_same(odd, back);
  EXPECT_EQ(back.model_preset, "gpt2-124m");  // the preset name is kept
}

// parallel.tensor.mode is read once into core::TensorMode; to_yaml writes the config's word back.
TEST(Config, TensorModeParsesToTheEnumAndWritesItsName) {
  const std::vector<std::pair<std::string, core::TensorMode>> modes{
      {"1d", core::TensorMode::d1}, {"2d", core::TensorMode::d2},
      {"2.5d", core::TensorMode::d2_5}, {"3d", core::TensorMode::d3}};
  for (const auto& [name, mode] : modes) {
    EXPECT_EQ(core::parse_tensor_mode(name), mode) << name;
    EXPECT_EQ(core::tensor_mode_name(mode), name);
    // A manual layout of that mode on a config its grid accepts (2.5d: depth 2, 8 ranks).
    const std::string size = mode == core::TensorMode::d1   ? "2"
                             : mode == core::TensorMode::d2 ? "4"
                                                            : "8";
    const std::string depth = mode == core::TensorMode::d2_5 ? "2" : "1";
    const Config c = parse_config(std::string(kMinimal) +
                                      "train: {micro_batch: 4, global_batch: 32}\n"
                                      "parallel: {tensor: {size: " + size + ", mode: " + name +
                                      ", depth: " + depth + "}}\n",
                                  "mode.yaml");
    EXPECT_EQ(c.parallel.tensor_mode, mode) << name;
    EXPECT_TRUE(Contains(to_yaml(c), "mode: " + name));
    EXPECT_EQ(parse_config(to_yaml(c), "again.yaml").parallel.tensor_mode, mode) << name;
  }
  EXPECT_EQ(core::parse_tensor_mode("2D"), std::nullopt);
  EXPECT_EQ(core::parse_tensor_mode("4d"), std::nullopt);
}

// Every other closed set of words is read once into its enum too: each word gives its value, the
// value's name is the word, to_yaml writes the word back, and that text reads to the same value.
TEST(Config, ModeWordsParseToTheirEnumsAndWriteTheirNames) {
  auto expect_word = [](const std::string& yaml, const std::string& written, auto want,
                        auto get, const std::string& name) {
    SCOPED_TRACE(yaml);
    const Config c = parse_config(std::string(kMinimal) + yaml, "mode.yaml");
    EXPECT_EQ(get(c), want);
    EXPECT_EQ(name, written.substr(written.rfind(' ') + 1));
    EXPECT_TRUE(Contains(to_yaml(c), written));
    EXPECT_EQ(get(parse_config(to_yaml(c), "again.yaml")), want);
  };
  using parallel::PipelineSchedule;
  using ScheduleWord = std::tuple<std::string, PipelineSchedule, std::string>;
  for (auto [word, kind, extra] : std::vector<ScheduleWord>{
           {"gpipe", PipelineSchedule::gpipe, ""},
           {"1f1b", PipelineSchedule::one_f_one_b, ""},
           {"interleaved", PipelineSchedule::interleaved, ", chunks: 2"}}) {
    expect_word("parallel: {pipeline: {size: 2, schedule: " + word + extra + "}}\n",
                "schedule: " + word, kind,
                [](const Config& c) { return c.parallel.pipeline_schedule; },
                parallel::pipeline_schedule_name(kind));
    EXPECT_EQ(parallel::parse_pipeline_schedule(word), kind);
  }
  EXPECT_EQ(parallel::parse_pipeline_schedule("1F1B"), std::nullopt);
  using core::CheckpointPolicy;
  using PolicyWord = std::tuple<std::string, CheckpointPolicy, std::string>;
  for (auto [word, policy, extra] : std::vector<PolicyWord>{
           {"none", CheckpointPolicy::none, ""},
           {"full", CheckpointPolicy::full, ""},
           {"every_k", CheckpointPolicy::every_k, ", every: 2"},
           {"sqrt", CheckpointPolicy::sqrt, ""},
           {"rotor", CheckpointPolicy::rotor, ", memory_budget: 6"},
           {"selective", CheckpointPolicy::selective, ""},
           {"manual", CheckpointPolicy::manual, ", blocks: [0, 1]"}}) {
    expect_word("checkpointing: {policy: " + word + extra + "}\n", "policy: " + word, policy,
                [](const Config& c) { return c.checkpointing.policy; },
                core::checkpoint_policy_name(policy));
    EXPECT_EQ(core::parse_checkpoint_policy(word), policy);
  }
  EXPECT_EQ(core::parse_checkpoint_policy("auto"), std::nullopt);
  for (auto [word, precision] : std::vector<std::pair<std::string, core::GemmPrecision>>{
           {"fp32", core::GemmPrecision::fp32}, {"bf16", core::GemmPrecision::bf16}}) {
    expect_word("train: {precision: " + word + "}\n", "precision: " + word, precision,
                [](const Config& c) { return c.train.precision; }, core::to_string(precision));
  }
  for (auto [word, mode] : std::vector<std::pair<std::string, OnNonfinite>>{
           {"stop", OnNonfinite::stop}, {"skip", OnNonfinite::skip}}) {
    expect_word("train: {on_nonfinite: " + word + "}\n", "on_nonfinite: " + word, mode,
                [](const Config& c) { return c.train.on_nonfinite; }, on_nonfinite_name(mode));
    EXPECT_EQ(parse_on_nonfinite(word), mode);
  }
  for (auto [word, mode] : std::vector<std::pair<std::string, ParallelMode>>{
           {"manual", ParallelMode::manual}, {"auto", ParallelMode::automatic}}) {
    expect_word("parallel: {mode: " + word + "}\n", "mode: " + word, mode,
                [](const Config& c) { return c.parallel.mode; }, parallel_mode_name(mode));
    EXPECT_EQ(parse_parallel_mode(word), mode);
  }
  for (auto [word, mode] : std::vector<std::pair<std::string, ResumeMode>>{
           {"never", ResumeMode::never}, {"auto", ResumeMode::automatic}}) {
    expect_word("checkpoint: {resume: " + word + "}\n", "resume: " + word, mode,
                [](const Config& c) { return c.checkpoint.resume; }, resume_mode_name(mode));
    EXPECT_EQ(parse_resume_mode(word), mode);
  }
  EXPECT_EQ(parse_parallel_mode("automatic"), std::nullopt);
  EXPECT_EQ(parse_resume_mode("always"), std::nullopt);
  EXPECT_EQ(parse_on_nonfinite(""), std::nullopt);
}

// model.fused_attention: false, true or auto. auto leaves the model's flag off until
// colossal_train's start-up decides (apps/layout.hpp), reads back as auto, and is allowed where
// true is not (ring attention, the 2d grid: the decision is the dense attention there).
TEST(Config, FusedAttentionTakesAuto) {
  for (auto [word, fused, automatic] : std::vector<std::tuple<std::string, bool, bool>>{
           {"false", false, false}, {"true", true, false}, {"auto", false, true}}) {
    SCOPED_TRACE(word);
    const Config c =
        parse_config("model: {preset: gpt2-124m, fused_attention: " + word + "}\ndata: {path: d}\n",
                     "auto.yaml");
    EXPECT_EQ(c.model.fused_attention, fused);
    EXPECT_EQ(c.fused_attention_auto, automatic);
    EXPECT_TRUE(Contains(to_yaml(c), "fused_attention: " + word));
    const Config again = parse_config(to_yaml(c), "again.yaml");
    EXPECT_EQ(again.fused_attention_auto, automatic);
    EXPECT_EQ(again.model.fused_attention, fused);
  }
  const std::string automatic =
      "model: {preset: gpt2-124m, fused_attention: auto}\ndata: {path: d}\n";
  // --set true or false replaces auto.
  const Config set = parse_config(automatic, "auto.yaml", {"model.fused_attention=true"});
  EXPECT_FALSE(set.fused_attention_auto);
  EXPECT_TRUE(set.model.fused_attention);
  EXPECT_EQ(parse_config(automatic + "parallel: {sequence: 2}\n", "ring.yaml").parallel.sequence, 2);
  EXPECT_EQ(parse_config(automatic + "parallel: {tensor: {size: 4, mode: 2d}}\n", "grid.yaml")
                .parallel.tensor_mode,
            core::TensorMode::d2);
  try {
    parse_config("model: {preset: gpt2-124m, fused_attention: maybe}\ndata: {path: d}\n", "bad.yaml");
    ADD_FAILURE() << "accepted fused_attention: maybe";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(Contains(e.what(), "model.fused_attention: invalid value 'maybe'"));
    EXPECT_TRUE(Contains(e.what(), "one of: false, true, auto"));
  }
}

// checkpoint.resume takes a file besides its two words; the fine-tune resets need that file.
TEST(Config, ResumeTakesAFileAndTheResetsNeedOne) {
  const Config c = parse_config(std::string(kMinimal) +
                                    "checkpoint: {resume: runs/a/ckpt-4.h5}\n"
                                    "train: {reset_optimizer: true, reset_schedule: true}\n",
                                "resume.yaml");
  EXPECT_EQ(c.checkpoint.resume, ResumeMode::file);
  EXPECT_EQ(c.checkpoint.resume_path, "runs/a/ckpt-4.h5");
  EXPECT_TRUE(c.train.fine_tune.reset_optimizer);
  EXPECT_TRUE(c.train.fine_tune.reset_schedule);
  EXPECT_TRUE(Contains(c.text, "resume: \"runs/a/ckpt-4.h5\""));
  const Config again = parse_config(c.text, "again.yaml");
  EXPECT_EQ(again.checkpoint.resume, ResumeMode::file);
  EXPECT_EQ(again.checkpoint.resume_path, "runs/a/ckpt-4.h5");
  EXPECT_TRUE(again.train.fine_tune.reset_optimizer && again.train.fine_tune.reset_schedule);
  // A path that reads as a word of YAML stays a path; the words stay words.
  const Config odd = parse_config(kMinimal, "odd.yaml", {"checkpoint.resume=\"123\""});
  EXPECT_EQ(odd.checkpoint.resume, ResumeMode::file);
  EXPECT_EQ(parse_config(odd.text, "again.yaml").checkpoint.resume_path, "123");
  const Config word = parse_config(kMinimal, "word.yaml", {"checkpoint.resume=auto"});
  EXPECT_EQ(word.checkpoint.resume, ResumeMode::automatic);
  EXPECT_TRUE(word.checkpoint.resume_path.empty());
  EXPECT_TRUE(Contains(word.text, "resume: auto\n"));
  EXPECT_FALSE(Contains(word.text, "reset_optimizer: true"));
  // An empty value is not a file.
  expect_all(error_of(std::string(kMinimal) + "checkpoint: {resume: \"\"}\n"),
             {"checkpoint.resume", "non-empty"});
  // A fine-tune writes its own run from step 0: not into the checkpoint.dir of its source, whose
  // checkpoints (the source too) would be moved aside as numbered after its first step.
  expect_all(error_of(std::string(kMinimal) +
                      "log: {dir: runs/base}\ncheckpoint: {resume: runs/base/checkpoints/"
                      "ckpt-20.h5}\ntrain: {reset_schedule: true}\n"),
             {"checkpoint.resume", "'runs/base/checkpoints/ckpt-20.h5' is in this fine-tune's "
              "own checkpoint.dir", "give the fine-tune its own log.dir"});
  EXPECT_NO_THROW(parse_config(std::string(kMinimal) +
                                   "log: {dir: runs/tune}\ncheckpoint: {resume: runs/base/"
                                   "checkpoints/ckpt-20.h5}\ntrain: {reset_schedule: true}\n",
                               "ok.yaml"));
  // A reset with auto (or never) is refused, naming the key and what to set.
  expect_all(error_of(std::string(kMinimal) +
                      "checkpoint: {resume: auto}\ntrain: {reset_optimizer: true}\n"),
             {"test.yaml:", "train.reset_optimizer", "checkpoint.resume is auto",
              "set checkpoint.resume to the checkpoint file"});
  expect_all(error_of(std::string(kMinimal) + "train: {reset_schedule: true}\n"),
             {"train.reset_schedule", "checkpoint.resume is never"});
}

TEST(Config, ToYamlWritesEveryKey) {
  const std::string text = to_yaml(parse_config(kMinimal, "min.yaml"));
  for (const ConfigKeyInfo& key : config_schema()) {
    SCOPED_TRACE(key.key);
    // The last part of each dotted key appears as "name:" in the output.
    EXPECT_TRUE(Contains(text, key.key.substr(key.key.rfind('.') + 1) + ":"));
  }
}

TEST(Config, EveryKeyIsDocumentedInReadme) {
  const char* env = std::getenv("COLOSSAL_SOURCE_DIR");
  const std::filesystem::path root =
      env ? std::filesystem::path(env)
          : std::filesystem::path(__FILE__).parent_path().parent_path();
  std::ifstream in(root / "configs" / "README.md");
  ASSERT_TRUE(in) << "cannot read " << (root / "configs" / "README.md");
  std::stringstream readme;
  readme << in.rdbuf();
  for (const ConfigKeyInfo& key : config_schema())
    EXPECT_TRUE(Contains(readme.str(), "`" + key.key + "`"));
}

// ---- did_you_mean -------------------------------------------------------------------------------

TEST(DidYouMean, SuggestsTheClosestCloseEnoughKey) {
  const std::vector<std::string> keys = {"steps", "seq_len", "global_batch", "micro_batch"};
  EXPECT_EQ(did_you_mean("stpes", keys), "steps");     // transposition: 2 edits
  EXPECT_EQ(did_you_mean("step", keys), "steps");      // deletion
  EXPECT_EQ(did_you_mean("seqlen", keys), "seq_len");  // insertion
  EXPECT_EQ(did_you_mean("globl_bach", keys), "global_batch");
  EXPECT_EQ(did_you_mean("steps", keys), "steps");  // exact
  EXPECT_EQ(did_you_mean("optimizer", keys), "");   // nothing close
  EXPECT_EQ(did_you_mean("xyz", keys), "");
  EXPECT_EQ(did_you_mean("steps", {}), "");
  // Threshold: max(2, len/3) edits; a 12-letter key allows 4.
  EXPECT_EQ(did_you_mean("micro_bXXXXh", {"micro_batch"}), "micro_batch");
  EXPECT_EQ(did_you_mean("mXXXo_bXXXXh", {"micro_batch"}), "");
  // Ties go to the first candidate.
  EXPECT_EQ(did_you_mean("ab", {"ax", "xb"}), "ax");
}

}  // namespace
}  // namespace colossal::io

namespace colossal::io {
// The key diff a resumed run reports: nested keys by their full dotted name.
TEST(ConfigDiff, NamesEveryChangedKeyByItsDottedPath) {
  const Config a = parse_config(kMinimal, "a.yaml");
  const Config b = parse_config(
      std::string(kMinimal) + "parallel: {zero: {stage: 1}}\ntrain: {steps: 7}\n", "b.yaml");
  EXPECT_EQ(changed_keys(a.text, b.text),
            (std::vector<std::string>{"parallel.zero.stage", "train.steps"}));
  EXPECT_TRUE(changed_keys(a.text, a.text).empty());
  EXPECT_EQ(changed_keys("model: {hidden: 8}\n", "model: {hidden: 8, heads: 2}\n"),
            (std::vector<std::string>{"model.heads"}));
  // A checkpoint written before a key existed ran with its default: no change (a resume from
  // one failed on model.rope_factor's "unset there, 1.0 here"); another value is one.
  std::string old_text;
  {
    std::istringstream in(a.text);
    for (std::string line; std::getline(in, line);) {
      if (line.find("rope_factor") == std::string::npos &&
          line.find("rope_low_freq") == std::string::npos &&
          line.find("rope_high_freq") == std::string::npos &&
          line.find("rope_original") == std::string::npos &&
          line.find("top_k") == std::string::npos) {
        old_text += line + "\n";
      }
    }
  }
  ASSERT_NE(old_text, a.text);
  EXPECT_TRUE(changed_keys(old_text, a.text).empty()) << old_text;
  EXPECT_TRUE(changed_keys(a.text, old_text).empty());
  const Config scaled = parse_config(kMinimal, "s.yaml", {"model.rope_factor=8"});
  EXPECT_EQ(changed_keys(old_text, scaled.text), (std::vector<std::string>{"model.rope_factor"}));
}
// parallel.comm (parallel/comm_choice.hpp checks what the build and node allow at start-up).
TEST(ConfigComm, ParsesAndRejectsUnknownTransports) {
  EXPECT_EQ(parse_config(kMinimal, "test.yaml").parallel.comm, "auto");
  EXPECT_EQ(parse_config(std::string(kMinimal) + "parallel: {comm: nccl}\n", "test.yaml")
                .parallel.comm,
            "nccl");
  EXPECT_EQ(parse_config(std::string(kMinimal) + "parallel: {comm: mpi}\n", "test.yaml")
                .parallel.comm,
            "mpi");
  expect_all(error_of(std::string(kMinimal) + "parallel:\n  comm: gloo\n"),
             {"test.yaml:6:9: parallel.comm: invalid value 'gloo'", "one of: auto, nccl, mpi"});
  expect_all(error_of(kMinimal, {"parallel.comm=ncl"}),
             {"parallel.comm: invalid value 'ncl'", "one of: auto, nccl, mpi",
              "did you mean 'nccl'?"});
}

// parallel.grad_reduce: the precision of the data-parallel gradient sums on the wire.
TEST(ConfigGradReduce, ParsesAndRejectsOtherPrecisions) {
  EXPECT_FALSE(parse_config(kMinimal, "test.yaml").parallel.bf16_grad_reduce());
  EXPECT_TRUE(parse_config(std::string(kMinimal) + "parallel: {grad_reduce: bf16}\n", "test.yaml")
                  .parallel.bf16_grad_reduce());
  expect_all(error_of(std::string(kMinimal) + "parallel:\n  grad_reduce: fp16\n"),
             {"test.yaml:6:16: parallel.grad_reduce: invalid value 'fp16'", "one of: fp32, bf16"});
  expect_all(error_of(kMinimal, {"parallel.grad_reduce=bf61"}),
             {"parallel.grad_reduce: invalid value 'bf61'", "one of: fp32, bf16"});
}
}  // namespace colossal::io

// ---- model.arch: llama (issue 25) ---------------------------------------------------------------

namespace colossal::io {
namespace {

TEST(LlamaConfig, KeysPresetsAndDefaults) {
  const Config c = parse_config(
      "model: {preset: llama2-70b}\ndata: {path: d}\ntrain: {seq_len: 1024}\n", "test.yaml");
  EXPECT_EQ(c.model.arch, core::Arch::llama);
  EXPECT_EQ(c.model.kv_heads, 8);
  EXPECT_EQ(c.model.ffn_hidden, 28672);  // the preset's width, not 4 * hidden
  EXPECT_FALSE(c.model.tied());
  const Config d = parse_config(
      "model: {arch: llama, layers: 2, hidden: 4096, heads: 32, kv_heads: 4, vocab: 256,"
      " max_seq: 64, rope_theta: 500000, rms_eps: 1.0e-6, tie_embeddings: true}\n"
      "data: {path: d}\ntrain: {seq_len: 64}\n",
      "test.yaml");
  EXPECT_EQ(d.model.ffn_hidden, 11008);  // LLaMA's rule: 8/3 * 4096 rounded up to 256
  EXPECT_DOUBLE_EQ(d.model.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(d.model.rms_eps, 1e-6);
  EXPECT_TRUE(d.model.tied());
  // The resolved config reads back the same.
  const Config again = parse_config(to_yaml(d), "again.yaml");
  EXPECT_EQ(again.model.kv_heads, 4);
  EXPECT_DOUBLE_EQ(again.model.rope_theta, 500000.0);
  EXPECT_TRUE(again.model.tie_embeddings);
}

TEST(LlamaConfig, ErrorsNameTheKeyTheValueAndTheRule) {
  const std::string base =
      "model: {arch: llama, layers: 2, hidden: 64, heads: 4, vocab: 256, max_seq: 64";
  const std::string rest = "}\ndata: {path: d}\ntrain: {seq_len: 64}\n";
  std::string e = error_of(base + ", kv_heads: 3" + rest);
  EXPECT_TRUE(Contains(e, "model.kv_heads: 3 does not divide model.heads = 4"));
  e = error_of(base + ", kv_heads: 2" + rest + "parallel: {tensor: {size: 4}}\n");
  EXPECT_TRUE(Contains(e, "parallel.tensor.size: 4 does not divide model.kv_heads = 2"));
  EXPECT_TRUE(Contains(e, "whole groups"));
  e = error_of(base + rest + "parallel: {tensor: {size: 4, mode: 2d}}\n");
  EXPECT_TRUE(Contains(e, "model.arch: llama with parallel.tensor.mode 2d"));
  EXPECT_TRUE(Contains(e, "set parallel.tensor.mode: 1d"));
  e = error_of(base + ", rope_theta: 0" + rest);
  EXPECT_TRUE(Contains(e, "model.rope_theta"));
}

}  // namespace
}  // namespace colossal::io
