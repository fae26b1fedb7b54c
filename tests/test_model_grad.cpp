// The whole model's gradient against finite differences, for both architectures: every parameter
// tensor is probed, so a mistake in any layer, in the residual wiring or in the tied head shows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/host_threads.hpp"
#include "core/model.hpp"
#include "core/rng.hpp"
#include "grad_check.hpp"

using namespace colossal;
using namespace colossal::core;

namespace {

ModelSpec tiny(Arch arch) { return model_spec(arch, 2, 8, 2, 12, 11, 6); }

// The tests that read a model's buffers directly (host builds only) skip in a Kokkos CUDA build;
// the first two copy through test::to_host / DeviceTokens and run on the GPU there, with cuBLAS.
class ModelGradient : public ::testing::TestWithParam<Arch> {};

TEST_P(ModelGradient, EveryTensorMatchesFiniteDifferences) {
  const ModelSpec spec = tiny(GetParam());
  const int B = 2, T = 5;
  MemoryTracker tracker;
  auto gemm = make_default_gemm();
  Model model(spec, B, T, tracker, *gemm);
  // Larger than the 0.02 init so that every gradient is well above float rounding.
  test::from_host(model.params(), test::random_vector(model.flat_size(), 7, 0.5f));
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1};
  EXPECT_EQ(test::check_model_gradient(model, tokens, targets, B, T), 0);
}

TEST_P(ModelGradient, MicroBatchesAccumulateToTheFullBatchGradient) {
  const ModelSpec spec = tiny(GetParam());
  const int T = 5;
  MemoryTracker tracker;
  auto gemm = make_default_gemm();
  Model model(spec, 2, T, tracker, *gemm);
  model.init_parameters(3);
  const test::DeviceTokens batch({1, 4, 4, 9, 0, 10, 3, 2, 2, 7}, {4, 4, 9, 0, 10, 3, 2, 2, 7, 1});
  model.zero_grad();
  model.forward(batch.tokens(), batch.targets(), 2, 1.0f);
  model.backward(batch.tokens(), 2);
  const std::vector<float> full = test::to_host(model.grads(), model.flat_size());
  model.zero_grad();
  for (int b = 0; b < 2; ++b) {
    model.forward(batch.tokens(b * T), batch.targets(b * T), 1, 1.0f);
    model.backward(batch.tokens(b * T), 1);
  }
  const std::vector<float> split = test::to_host(model.grads(), model.flat_size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_NEAR(split[i], full[i], 1e-5 + 1e-4 * std::abs(full[i])) << i;
  }
}

TEST(ModelGradient, FusedAttentionModelMatchesDenseAndFiniteDifferences) {
  if (!test::host_memory()) GTEST_SKIP();
  const int B = 2, T = 5;
  ModelSpec dense_spec = tiny(Arch::gpt2), fused_spec = dense_spec;
  fused_spec.fused_attention = true;
  MemoryTracker tracker;
  auto gemm = make_host_gemm();
  Model dense(dense_spec, B, T, tracker, *gemm), fused(fused_spec, B, T, tracker, *gemm);
  const auto values = test::random_vector(dense.flat_size(), 9, 0.5f);
  std::copy(values.begin(), values.end(), dense.params());
  std::copy(values.begin(), values.end(), fused.params());
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1};
  dense.zero_grad();
  fused.zero_grad();
  const double a = dense.forward(tokens.data(), targets.data(), B, 1.0f);
  const double b = fused.forward(tokens.data(), targets.data(), B, 1.0f);
  EXPECT_NEAR(a, b, 1e-5 * a);
  dense.backward(tokens.data(), B);
  fused.backward(tokens.data(), B);
  for (std::size_t i = 0; i < dense.flat_size(); ++i) {
    ASSERT_NEAR(fused.grads()[i], dense.grads()[i], 1e-4 + 1e-3 * std::abs(dense.grads()[i])) << i;
  }
  EXPECT_LT(fused.activation_bytes(), dense.activation_bytes());
}

// On the Serial backend the element-wise kernels and the bf16 rounding are spread over the host
// threads; every index runs alone, so a step's loss and gradient are bitwise the same on 1 and on
// 3 threads. The model is large enough for every kernel to split over 3 threads (rows >= 3 x 16,
// elements >= 3 x 16384, column blocks of 32 >= 3).
TEST_P(ModelGradient, BitwiseTheSameOnAnyNumberOfHostThreads) {
  if (!test::host_memory()) GTEST_SKIP() << "host threads run the host build's kernels";
  const ModelSpec spec = model_spec(GetParam(), 2, 128, 4, 512, 300, 64);
  const int B = 4, T = 64;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 37) % 300, targets[i] = (i * 53 + 1) % 300;
  const int previous = HostThreads::shared().size();
  auto run = [&](int threads, bool bf16) {
    HostThreads::resize_shared(threads);
    set_blas_threads(1);  // the GEMMs' own threads are OpenBLAS's business, not this test's
    MemoryTracker tracker;
    std::unique_ptr<Gemm> gemm =
        make_default_gemm("openblas", bf16 ? GemmPrecision::bf16 : GemmPrecision::fp32);
    Model model(spec, B, T, tracker, *gemm);
    model.init_parameters(5);
    model.zero_grad();
    const double loss = model.forward(tokens.data(), targets.data(), B, 1.0f / (B * T));
    model.backward(tokens.data(), B);
    std::vector<float> out(model.grads(), model.grads() + model.flat_size());
    out.push_back(float(loss));
    return out;
  };
  for (bool bf16 : {false, true}) {
    const auto one = run(1, bf16), three = run(3, bf16);
    ASSERT_EQ(one.size(), three.size());
    for (std::size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(one[i], three[i]) << i << " bf16 " << bf16;
    }
  }
  HostThreads::resize_shared(previous);
}

// oneDNN's bf16 GEMM converts the parameters once per forward (Gemm::hold_stable) instead of in
// every product (the emulation ignores the hold). Against the same backend converting every
// operand every time (a wrapper that drops hold_stable), steps whose weights change between
// them (an update after each backward, an evaluation forward after the update) give bitwise the
// same losses and gradients: a stale copy of the weights would differ from the first update on.
class NoHold final : public Gemm {
 public:
  explicit NoHold(Gemm& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    inner_.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t sa, const float* B, int ldb, int64_t sb, float beta,
                            float* C, int ldc, int64_t sc, int batch) override {
    inner_.gemm_strided_batched(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                                batch);
  }

 private:
  Gemm& inner_;
};

TEST_P(ModelGradient, Bf16HeldWeightsGiveTheStepsOfConvertingEveryProduct) {
  if (!test::host_memory()) GTEST_SKIP() << "this test reads model buffers on the host";
  const ModelSpec spec = tiny(GetParam());
  const int B = 2, T = 5, steps = 3;
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1};
  std::vector<std::pair<std::string, std::unique_ptr<Gemm>>> backends;
  backends.emplace_back("emulated", make_bf16_gemm(make_host_gemm()));
  try {
    backends.emplace_back("native", make_native_bf16_gemm());
  } catch (const std::exception& e) {
    std::printf("no native bf16 GEMM here (%s): the emulation only\n", e.what());
  }
  for (auto& [name, backend] : backends) {
    SCOPED_TRACE(name);
    auto run = [&](Gemm& gemm) {
      MemoryTracker tracker;
      Model model(spec, B, T, tracker, gemm);
      model.init_parameters(11);
      std::vector<float> out;
      for (int step = 0; step < steps; ++step) {
        model.zero_grad();
        out.push_back(float(model.forward(tokens.data(), targets.data(), B, 1.0f / (B * T))));
        model.backward(tokens.data(), B);
        out.insert(out.end(), model.grads(), model.grads() + model.flat_size());
        float* params = model.params();
        for (std::size_t i = 0; i < model.flat_size(); ++i) params[i] -= model.grads()[i];
        out.push_back(float(model.forward(tokens.data(), targets.data(), B, 0.0f)));
      }
      return out;
    };
    const std::size_t before = backend->stable_conversions();
    const auto held = run(*backend);
    // One conversion a forward where the backend keeps a copy (native), none where it does not.
    EXPECT_EQ(backend->stable_conversions() - before, name == "native" ? 2u * steps : 0u);
    NoHold converting(*backend);
    const auto each = run(converting);
    ASSERT_EQ(held.size(), each.size());
    for (std::size_t i = 0; i < held.size(); ++i) ASSERT_EQ(held[i], each[i]) << i;
    EXPECT_NE(held[0], held[held.size() - 1]);  // the updates changed the loss
  }
}

// A store that keeps its buffers whole but shows none (as ZeRO-3's sharded one): the model then
// holds nothing for its forward and backward, only the gathered LM head for its logits' chunks.
class NoWholeStore final : public FullParameterStore {
 public:
  using FullParameterStore::FullParameterStore;
  float* full_params() override { return nullptr; }
  float* full_grads() override { return nullptr; }
  bool keeps_whole() const override { return false; }
  float* params() { return FullParameterStore::full_params(); }
  float* grads() { return FullParameterStore::full_grads(); }
};

// The micro-batches of one step keep the weights' bf16 copy of the first one
// (StageModel::parameters_unchanged), and a store without whole buffers holds the LM head for its
// chunks: steps of two micro-batches each (an update after them, an evaluation forward after the
// update) give bitwise the losses and gradients of converting every product, with one conversion
// per step's training forwards (whole buffers) or per forward (the head alone).
TEST_P(ModelGradient, Bf16WeightsKeptOverMicroBatchesGiveTheStepsOfConvertingEveryProduct) {
  if (!test::host_memory()) GTEST_SKIP() << "this test reads model buffers on the host";
  std::unique_ptr<Gemm> backend;
  try {
    backend = make_native_bf16_gemm();
  } catch (const std::exception& e) {
    GTEST_SKIP() << "no native bf16 GEMM here: " << e.what();
  }
  const ModelSpec spec = tiny(GetParam());
  const int B = 2, T = 5, steps = 3;
  const std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7, 5, 5, 8, 1, 0, 6, 2, 9, 3, 3};
  const std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1, 5, 8, 1, 0, 6, 2, 9, 3, 3, 4};
  for (const bool whole : {true, false}) {
    SCOPED_TRACE(whole ? "whole buffers" : "no whole buffers");
    auto run = [&](Gemm& gemm) {
      MemoryTracker tracker;
      const std::size_t multiple = 16;
      const auto table = parameter_table(spec, multiple, TensorSplit{}, StageRange{});
      auto units = parameter_units(table, multiple);
      const std::size_t flat = units.back().end;
      NoWholeStore store(std::move(units), flat, tracker);
      ModelOptions options;
      options.unit_multiple = multiple;
      if (!whole) options.store = &store;
      Model model(spec, B, T, tracker, gemm, options);
      model.init_parameters(11);
      float* params = whole ? model.params() : store.params();
      const float* grads = whole ? model.grads() : store.grads();
      std::vector<float> out;
      for (int step = 0; step < steps; ++step) {
        model.zero_grad();
        for (int micro = 0; micro < 2; ++micro) {
          if (micro > 0) model.parameters_unchanged();
          const std::size_t at = std::size_t(micro) * B * T;
          out.push_back(float(model.forward(tokens.data() + at, targets.data() + at, B,
                                            1.0f / (2 * B * T))));
          model.backward(tokens.data() + at, B);
        }
        out.insert(out.end(), grads, grads + model.flat_size());
        for (std::size_t i = 0; i < model.flat_size(); ++i) params[i] -= grads[i];
        out.push_back(float(model.forward(tokens.data(), targets.data(), B, 0.0f)));
      }
      return out;
    };
    const std::size_t before = backend->stable_conversions();
    const auto kept = run(*backend);
    // Whole: micro-batch 0's forward and the evaluation's; the head alone: every forward's.
    EXPECT_EQ(backend->stable_conversions() - before, (whole ? 2u : 3u) * steps);
    NoHold converting(*backend);
    const auto each = run(converting);
    ASSERT_EQ(kept.size(), each.size());
    for (std::size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(kept[i], each[i]) << i;
    EXPECT_NE(kept[0], kept[kept.size() - 1]);  // the updates changed the loss
  }
}

// train.precision: bf16 on the host saves the activations that only products read (norm
// outputs, q/k/v, unfused attention's output) in bf16 (ModelOptions::bf16_operands). Those
// products round them to bf16 anyway, so for gpt2, opt (fused attention too) and llama, with
// every activation kept, with segments recomputed and with selective recompute, the steps
// (losses, gradients, an evaluation after each update) are bitwise those of fp32 storage, on the
// emulation and on oneDNN where it runs, in half those tensors' memory.
TEST(ModelBf16Operands, StepsEqualFp32StorageInLessMemory) {
  if (!test::host_memory()) GTEST_SKIP() << "bf16 norm outputs are host-only";
  const int B = 2, T = 5, steps = 2;
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1};
  std::vector<std::pair<std::string, std::unique_ptr<Gemm>>> backends;
  backends.emplace_back("emulated", make_bf16_gemm(make_host_gemm()));
  try {
    backends.emplace_back("native", make_native_bf16_gemm());
  } catch (const std::exception& e) {
    std::printf("no native bf16 GEMM here (%s): the emulation only\n", e.what());
  }
  ModelSpec fused = tiny(Arch::gpt2);
  fused.fused_attention = true;
  const std::vector<std::pair<std::string, ModelSpec>> specs = {
      {"gpt2", tiny(Arch::gpt2)},
      {"opt", tiny(Arch::opt)},
      {"gpt2 fused", fused},
      {"llama", llama_spec(2, 16, 4, 2, 12, 11, 8, 10000.0, 1e-5, false)}};
  struct Schedule {
    std::vector<Keep> keep;
    bool selective = false;
    std::string name;
  };
  const std::vector<Schedule> schedules = {
      {{}, false, "all kept"},
      {{Keep::input, Keep::none, Keep::input, Keep::none}, false, "recomputed"},
      {{}, true, "selective"}};
  for (auto& [backend_name, gemm] : backends) {
    for (const auto& [spec_name, spec] : specs) {
      for (const auto& [keep, selective, schedule_name] : schedules) {
        SCOPED_TRACE(backend_name + ", " + spec_name + ", " + schedule_name);
        struct Run {
          std::vector<float> out, logits;
          std::size_t bytes = 0;
          ActivationSizes sizes;
        };
        auto run = [&](bool bf16_operands) {
          MemoryTracker tracker;
          Model model(spec, B, T, tracker, *gemm,
                      ModelOptions{.keep = keep, .selective = selective,
                                   .bf16_operands = bf16_operands});
          model.init_parameters(5);
          Run r;
          r.bytes = model.activation_bytes() + model.temporary_bytes();
          r.sizes = model.activations().sizes;
          for (int step = 0; step < steps; ++step) {
            model.zero_grad();
            r.out.push_back(
                float(model.forward(tokens.data(), targets.data(), B, 1.0f / (B * T))));
            model.backward(tokens.data(), B);
            r.out.insert(r.out.end(), model.grads(), model.grads() + model.flat_size());
            float* params = model.params();
            for (std::size_t i = 0; i < model.flat_size(); ++i) params[i] -= model.grads()[i];
            r.out.push_back(float(model.forward(tokens.data(), targets.data(), B, 0.0f)));
          }
          r.logits.resize(std::size_t(spec.vocab));  // of the evaluation: what sampling reads
          model.gather_logits(7, r.logits.data());
          return r;
        };
        const Run fp32 = run(false), bf16 = run(true);
        // bf16 recomputes the row's logits from ln_f (one row, another product shape).
        for (std::size_t v = 0; v < fp32.logits.size(); ++v) {
          EXPECT_NEAR(bf16.logits[v], fp32.logits[v], 1e-5 * (1 + std::abs(fp32.logits[v]))) << v;
        }
        ASSERT_EQ(fp32.out.size(), bf16.out.size());
        for (std::size_t i = 0; i < fp32.out.size(); ++i) ASSERT_EQ(fp32.out[i], bf16.out[i]) << i;
        EXPECT_NE(fp32.out.front(), fp32.out.back());  // the updates changed the loss
        const std::size_t n = std::size_t(B) * T * spec.hidden;
        const ActivationSizes& z = bf16.sizes;
        EXPECT_FALSE(fp32.sizes.bf16_norms || fp32.sizes.bf16_qkv || fp32.sizes.bf16_atty);
        EXPECT_TRUE(z.bf16_norms && z.bf16_qkv);
        EXPECT_TRUE(z.head_in_forward && fp32.sizes.head_in_forward);
        // The head keeps the input gradient of its rows, never the logits, in either storage;
        // bf16 adds the bf16 patterns of one chunk of the logits' gradient.
        EXPECT_EQ(z.logits, n);
        EXPECT_EQ(z.logits_chunk, fp32.sizes.logits_chunk) << "fewer rows than a chunk: all rows";
        EXPECT_EQ(z.logits_chunk_bf16, (z.logits_chunk + 1) / 2);
        EXPECT_EQ(fp32.sizes.logits_chunk_bf16, 0u);
        EXPECT_EQ(z.bf16_atty, !spec.fused_attention);
        EXPECT_EQ(fp32.sizes.ln1, n);
        EXPECT_EQ(z.ln1 + z.ln2 + z.lnf + z.qkv, 6 * n / 2);
        EXPECT_EQ(z.atty, spec.fused_attention ? n : n / 2);
        if (keep.empty() && !selective) {
          // Every block's ln1, ln2, qkv (and atty), and lnf in half; the logits' gradient in half
          // against a chunk of fp32 logits.
          const std::size_t block = (5 + (spec.fused_attention ? 0 : 1)) * n / 2;
          EXPECT_EQ(fp32.bytes - bf16.bytes,
                    (spec.layers * block + n / 2 - z.logits_chunk_bf16) * 4);
        }
      }
    }
  }
}

// The attention probabilities in bf16 too (ModelOptions::bf16_probabilities) are not exact: the
// softmax backward reads them element-wise. Its gradients stay within bf16's precision of fp32
// storage's (and of the unrounded probabilities' through a few updates), in half the
// probabilities' memory; fused attention (no probabilities) is unchanged.
TEST(ModelBf16Operands, Bf16ProbabilitiesStayWithinBf16Precision) {
  if (!test::host_memory()) GTEST_SKIP() << "bf16 activations are host-only";
  const int B = 2, T = 5;
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  std::vector<int32_t> targets = {4, 4, 9, 0, 10, 3, 2, 2, 7, 1};
  auto gemm = make_bf16_gemm(make_host_gemm());
  for (Arch arch : {Arch::gpt2, Arch::opt}) {
    SCOPED_TRACE(arch_name(arch));
    const ModelSpec spec = tiny(arch);
    auto run = [&](bool probabilities, std::size_t& att_floats) {
      MemoryTracker tracker;
      Model model(spec, B, T, tracker, *gemm,
                  ModelOptions{.bf16_operands = true, .bf16_probabilities = probabilities});
      model.init_parameters(5);
      att_floats = model.activations().sizes.att;
      std::vector<float> out;
      for (int step = 0; step < 3; ++step) {
        model.zero_grad();
        out.push_back(float(model.forward(tokens.data(), targets.data(), B, 1.0f / (B * T))));
        model.backward(tokens.data(), B);
        out.insert(out.end(), model.grads(), model.grads() + model.flat_size());
        float* params = model.params();
        for (std::size_t i = 0; i < model.flat_size(); ++i) params[i] -= model.grads()[i];
      }
      return out;
    };
    std::size_t att32 = 0, att16 = 0;
    const auto want = run(false, att32), got = run(true, att16);
    ASSERT_EQ(want.size(), got.size());
    double worst = 0.0, largest = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, double(std::abs(got[i] - want[i])));
      largest = std::max(largest, double(std::abs(want[i])));
    }
    std::printf("%s: bf16 probabilities, largest difference %.3g of %.3g\n", arch_name(arch),
                worst, largest);
    EXPECT_LT(worst, 1e-2 * largest);
    EXPECT_GT(worst, 0.0) << "the probabilities were rounded";
    EXPECT_EQ(att16, att32 / 2);
  }
}

// The LM head, its cross-entropy and its backward run in forward a chunk of rows at a time
// (ActivationSizes::head_in_forward). 2 x 150 = 300 rows in chunks of 7 (42 of them and one of
// 6) train as one chunk of all 300 does, in fp32 and in bf16 storage, with the emulated and the
// native bf16 GEMM and fp32's: only the weight gradient's summation order differs. The logits
// are never whole: a chunk of them, and the head's input gradient in their place.
TEST(ModelHeadInForward, ChunkedLogitsTrainAsWholeOnes) {
  if (!test::host_memory()) GTEST_SKIP() << "bf16 activations are host-only";
  const ModelSpec spec = model_spec(Arch::gpt2, 1, 16, 2, 32, 40, 160);
  const int B = 2, T = 150;
  const std::size_t V = std::size_t(padded_vocab(spec, 1)), rows = std::size_t(B) * T;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = (i * 7 + 3) % spec.vocab;
    targets[i] = (i * 13 + 1) % spec.vocab;
  }
  struct Backend {
    std::string name;
    std::unique_ptr<Gemm> gemm;
    bool bf16_operands;
  };
  std::vector<Backend> backends;
  backends.push_back({"fp32", make_host_gemm(), false});
  backends.push_back({"emulated bf16", make_bf16_gemm(make_host_gemm()), true});
  try {
    backends.push_back({"native bf16", make_native_bf16_gemm(), true});
  } catch (const std::exception&) {  // the emulation only
  }
  for (auto& [name, gemm, bf16_operands] : backends) {
    SCOPED_TRACE(name);
    auto run = [&](std::size_t chunk_rows) {
      MemoryTracker tracker;
      Model model(spec, B, T, tracker, *gemm,
                  ModelOptions{.bf16_operands = bf16_operands, .logits_chunk_rows = chunk_rows});
      model.init_parameters(9);
      const ActivationSizes& s = model.activations().sizes;
      EXPECT_TRUE(s.head_in_forward);
      EXPECT_EQ(model.activations().logits, rows * std::size_t(spec.hidden));
      EXPECT_EQ(V, 40u);
      EXPECT_EQ(s.logits_ld, 64u) << "rows of 40 logits are 64 floats apart (aligned)";
      EXPECT_EQ(s.logits_chunk, std::min(chunk_rows, rows) * s.logits_ld);
      EXPECT_EQ(s.logits_chunk_bf16, bf16_operands ? (s.logits_chunk + 1) / 2 : 0u);
      std::vector<float> out;
      for (int step = 0; step < 2; ++step) {
        model.zero_grad();
        out.push_back(float(model.forward(tokens.data(), targets.data(), B, 1.0f / (B * T))));
        model.backward(tokens.data(), B);
        out.insert(out.end(), model.grads(), model.grads() + model.flat_size());
        float* params = model.params();
        for (std::size_t i = 0; i < model.flat_size(); ++i) params[i] -= 0.5f * model.grads()[i];
      }
      out.push_back(float(model.forward(tokens.data(), targets.data(), B, 0.0f)));
      return out;
    };
    const auto want = run(rows), got = run(7);
    ASSERT_EQ(want.size(), got.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, double(std::abs(got[i] - want[i])));
    }
    std::printf("%s: chunks of 7 rows against one of 300: largest difference %.3g\n",
                name.c_str(), worst);
    // fp32: the weight gradient's order of summation alone. bf16: a weight one fp32 ulp apart
    // after the first update may round to the neighbouring bf16 in the second step's products.
    EXPECT_LT(worst, bf16_operands ? 1e-5 : 1e-6);
    EXPECT_NE(want.front(), want.back()) << "the updates changed the loss";
  }
}

// A training forward runs the head's backward, so the model insists on the pairing: a second
// training forward of a slot before its backward, or a backward without one, is a caller's bug
// that would double or miss the head's gradient; both throw and say so.
TEST(ModelHeadInForward, TrainingForwardAndBackwardPair) {
  const ModelSpec spec = tiny(Arch::gpt2);
  const int B = 2, T = 5;
  std::vector<int32_t> tokens = {1, 4, 4, 9, 0, 10, 3, 2, 2, 7};
  MemoryTracker tracker;
  auto gemm = make_host_gemm();
  Model model(spec, B, T, tracker, *gemm);
  model.init_parameters(3);
  DeviceArray<int32_t> t(tracker, MemCategory::data, tokens.size());
  copy_to_device(t.data(), tokens.data(), tokens.size() * sizeof(int32_t));
  EXPECT_THROW(model.backward(t.data(), B), std::logic_error);
  model.forward(t.data(), t.data(), B, 0.1f);
  try {
    model.forward(t.data(), t.data(), B, 0.1f);
    ADD_FAILURE() << "a second training forward before backward did not throw";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("before its backward"), std::string::npos) << e.what();
  }
  model.backward(t.data(), B);
  model.forward(t.data(), t.data(), B, 0.1f);  // paired again
  model.backward(t.data(), B);
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, ModelGradient,
                         ::testing::Values(Arch::gpt2, Arch::opt),
                         [](const auto& info) { return std::string(arch_name(info.param)); });

TEST(ModelTable, HuggingFaceNamesShapesAndCounts) {
  const ModelSpec gpt2 = *find_preset("gpt2-124m");
  EXPECT_EQ(parameter_count(gpt2), 124439808u);  // GPT2LMHeadModel without the tied lm_head
  const auto table = parameter_table(gpt2);
  EXPECT_EQ(table.front().name, "transformer.wte.weight");
  bool found = false;
  for (const auto& p : table) {
    if (p.name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{768, 2304}));  // Conv1D [in, out]
      found = true;
    }
    EXPECT_EQ(p.offset % 16, 0u);
  }
  EXPECT_TRUE(found);
  const ModelSpec opt = *find_preset("opt-125m");
  EXPECT_EQ(parameter_count(opt), 125239296u);  // OPTForCausalLM without the tied lm_head
  for (const auto& p : parameter_table(opt)) {
    if (p.name == "model.decoder.layers.0.fc1.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{3072, 768}));  // nn.Linear [out, in]
    }
    if (p.name == "model.decoder.embed_positions.weight") {
      EXPECT_EQ(p.shape, (std::vector<int64_t>{2050, 768}));  // offset of 2
    }
  }
}

TEST(ModelTable, WeightDecayAndInitByRule) {
  const ModelSpec spec = *find_preset("gpt2-124m");
  for (const auto& p : parameter_table(spec)) {
    const bool matrix = p.shape.size() == 2;
    EXPECT_EQ(p.decay(), matrix) << p.name;
    if (p.name.find("c_proj.weight") != std::string::npos) {
      EXPECT_NEAR(p.init_std(spec.layers), 0.02 / std::sqrt(24.0), 1e-9) << p.name;
    }
  }
}

}  // namespace

// Units: the embeddings, each block, the final layernorm; contiguous, padded to the multiple,
// tiling the flat buffer. The padding changes offsets, never the model.
TEST(ParameterUnits, TileTheFlatBufferAndLeaveTheModelAlone) {
  if (!test::host_memory()) GTEST_SKIP() << "this test reads model buffers on the host";
  const ModelSpec spec = model_spec(Arch::opt, 3, 32, 4, 64, 50, 16);
  const auto table = parameter_table(spec, 48);
  const auto units = parameter_units(table, 48);
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(units.front().begin, 0u);
  for (std::size_t u = 0; u < units.size(); ++u) {
    EXPECT_EQ(units[u].size() % 48, 0u);
    if (u + 1 < units.size()) {
      EXPECT_EQ(units[u].end, units[u + 1].begin);
    }
  }
  for (const auto& p : table) {
    EXPECT_GE(p.offset, units[p.unit].begin) << p.name;
    EXPECT_LE(p.offset + p.count, units[p.unit].end) << p.name;
  }
  EXPECT_EQ(table.front().unit, 0);
  EXPECT_EQ(table.back().unit, 4);
  EXPECT_NE(table[2].name.find("layers.0."), std::string::npos);
  EXPECT_EQ(table[2].unit, 1);

  MemoryTracker tracker;
  auto gemm = make_host_gemm();
  Model narrow(spec, 2, 16, tracker, *gemm, {.unit_multiple = 16});
  Model wide(spec, 2, 16, tracker, *gemm, {.unit_multiple = 48});
  narrow.init_parameters(5);
  wide.init_parameters(5);
  std::vector<int32_t> tokens(32), targets(32);
  for (int i = 0; i < 32; ++i) {
    tokens[i] = (i * 7) % 50;
    targets[i] = (i * 11 + 3) % 50;
  }
  EXPECT_EQ(narrow.forward(tokens.data(), targets.data(), 2, 1.0f),
            wide.forward(tokens.data(), targets.data(), 2, 1.0f));
}
