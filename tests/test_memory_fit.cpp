// Memory up front (apps/memory_fit.hpp): a node's ranks are priced by the cost model before
// anything is allocated; a layout that does not fit is refused with its plan, what the node has,
// and the one-key changes that would fit, each checked against the same prediction.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/memory_fit.hpp"
#include "apps/trainer.hpp"
#include "io/config.hpp"

using namespace colossal;

namespace {

// Activations dominate (micro-batch 16 of 256 tokens, 4 layers): halving the micro-batch or
// recomputing activations saves most of the memory.
io::Config config(const std::string& model = "layers: 4, hidden: 64, heads: 4",
                  const std::string& train = "seq_len: 256, global_batch: 32, micro_batch: 16",
                  const std::string& extra = "") {
  return io::parse_config("model: {" + model + ", vocab: 256, max_seq: 256}\n"
                          "data: {path: /nonexistent/train.txt}\n"
                          "train: {steps: 2, " + train + "}\n" + extra,
                          "memfit.yaml");
}

double need(const io::Config& c, const std::vector<int>& ranks) {
  double bytes = 0.0;
  for (int r : ranks) bytes += apps::rank_memory(c, r).total() + apps::kRuntimeBytesPerRank;
  return bytes;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(MemoryFit, ALayoutThatFitsPasses) {
  const io::Config c = config();
  const double bytes = need(c, {0});
  EXPECT_EQ(apps::memory_shortfall(c, {0}, bytes, "n0"), "");
  EXPECT_EQ(apps::memory_shortfall(c, {0}, 0.0, "n0"), "") << "unknown memory is not checked";
}

TEST(MemoryFit, ShortfallNamesThePlanAndTheNearestChangesThatFit) {
  const io::Config c = config();
  const double bytes = need(c, {0});
  const double half_batch = need(io::parse_config(c.text, c.source, {"train.micro_batch=8"}), {0});
  const double sqrt_policy =
      need(io::parse_config(c.text, c.source, {"checkpointing.policy=sqrt"}), {0});
  ASSERT_LT(half_batch, bytes);
  ASSERT_LT(sqrt_policy, bytes);
  // Room for the halved micro-batch and for sqrt checkpointing, not for the config as written.
  const double available = std::max(half_batch, sqrt_policy) * 1.001;
  ASSERT_LT(available, bytes);
  const std::string message = apps::memory_shortfall(c, {0}, available, "n0", "MemAvailable");
  EXPECT_TRUE(has(message, "need " + core::format_bytes(bytes))) << message;
  EXPECT_TRUE(has(message, "has " + core::format_bytes(available) + " (MemAvailable)")) << message;
  EXPECT_TRUE(has(message, "nothing was allocated")) << message;
  EXPECT_TRUE(has(message, "activations")) << message;  // the plan, by category
  EXPECT_TRUE(has(message, "--set train.micro_batch=8 (" + core::format_bytes(half_batch) + ")"))
      << message;
  EXPECT_TRUE(has(message, "--set checkpointing.policy=sqrt (" +
                               core::format_bytes(sqrt_policy) + ")"))
      << message;
  EXPECT_TRUE(has(message, "colossal_plan memfit.yaml --gpus 1")) << message;
  // One rank has no gradient group to shard over, so ZeRO is never offered.
  EXPECT_FALSE(has(message, "parallel.zero.stage")) << message;
}

// Long sequences: the attention's probabilities are most of the activations, and the fused
// attention, which keeps one value per row of them, is offered (not where it is on already).
TEST(MemoryFit, FusedAttentionIsOfferedWhenTheProbabilitiesDominate) {
  const io::Config c = config("layers: 2, hidden: 64, heads: 8",
                              "seq_len: 256, global_batch: 16, micro_batch: 16");
  const double bytes = need(c, {0});
  const double fused =
      need(io::parse_config(c.text, c.source, {"model.fused_attention=true"}), {0});
  // 2 layers of (16, 8, 256, 256) probabilities: 64 MiB of the activations
  ASSERT_LT(fused, bytes - 60 * 1048576.0);
  const std::string message = apps::memory_shortfall(c, {0}, fused * 1.001, "n0");
  EXPECT_TRUE(has(message, "--set model.fused_attention=true (" + core::format_bytes(fused) + ")"))
      << message;
  const io::Config on = io::parse_config(c.text, c.source, {"model.fused_attention=true"});
  EXPECT_FALSE(has(apps::memory_shortfall(on, {0}, fused * 0.5, "n0"), "fused_attention=true"));
}

TEST(MemoryFit, RanksOfANodeAddUpAndZeroIsOfferedWhenItShards) {
  const io::Config c = config("layers: 4, hidden: 256, heads: 4",
                              "seq_len: 16, global_batch: 16, micro_batch: 4", "parallel: {data: 4}\n");
  const std::vector<int> node{0, 1, 2, 3};
  const double bytes = need(c, node);
  EXPECT_NEAR(bytes, 4 * need(c, {0}), 1.0);
  EXPECT_EQ(apps::memory_shortfall(c, node, bytes, "n0"), "");
  EXPECT_EQ(apps::memory_shortfall(c, {0, 1}, bytes / 2 + 1, "n0"), "") << "two of four ranks";
  // Parameters and AdamW dominate (tiny activations): only sharding the states fits.
  const double stage1 = need(io::parse_config(c.text, c.source, {"parallel.zero.stage=1"}), node);
  ASSERT_LT(stage1, bytes);
  const std::string message = apps::memory_shortfall(c, node, stage1 * 1.0001, "n0");
  EXPECT_TRUE(has(message, "the 4 ranks of this layout on node n0")) << message;
  EXPECT_TRUE(has(message, "--set parallel.zero.stage=1 (" + core::format_bytes(stage1) + ")"))
      << message;
}

TEST(MemoryFit, NothingFitsSaysSo) {
  const io::Config c = config();
  const std::string message = apps::memory_shortfall(c, {0}, 1024.0, "n0");
  EXPECT_TRUE(has(message, "No change of checkpointing.policy, model.fused_attention, "
                           "parallel.zero.stage or train.micro_batch alone fits"))
      << message;
  EXPECT_FALSE(has(message, "--set")) << message;
}

TEST(MemoryFit, AvailableMemoryComesFromTheEnvironmentOrMeminfo) {
  std::string source;
  setenv("COLOSSAL_HOST_MEMORY_BYTES", "123456789", 1);
  EXPECT_EQ(apps::host_available_bytes(&source), 123456789.0);
  EXPECT_EQ(source, "COLOSSAL_HOST_MEMORY_BYTES");
  for (const char* bad : {"abc", "-5", "0", "12GB"}) {
    setenv("COLOSSAL_HOST_MEMORY_BYTES", bad, 1);
    try {
      apps::host_available_bytes(&source);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_TRUE(has(e.what(), std::string("COLOSSAL_HOST_MEMORY_BYTES='") + bad + "'")) << e.what();
    }
  }
  unsetenv("COLOSSAL_HOST_MEMORY_BYTES");
  const double meminfo = apps::host_available_bytes(&source);
  EXPECT_GT(meminfo, 16.0 * 1024 * 1024) << "this machine has more than 16 MiB available";
  EXPECT_EQ(source, "MemAvailable in /proc/meminfo");
}

TEST(MemoryFit, ADeviceBuildChecksTheGpuForAllButTheOffloadedBytes) {
  const io::Config c = config("layers: 4, hidden: 256, heads: 4",
                              "seq_len: 16, global_batch: 16, micro_batch: 4",
                              "parallel: {data: 2, zero: {stage: 1, offload: {optimizer: true}}}\n");
  const planner::MemoryPrediction m = apps::rank_memory(c, 0);
  const double offloaded = m[core::MemCategory::offloaded];
  ASSERT_GT(offloaded, 0.0);
  EXPECT_EQ(apps::pool_bytes(m, apps::MemoryPool::host, false), m.total());
  EXPECT_EQ(apps::pool_bytes(m, apps::MemoryPool::device, false), 0.0);
  EXPECT_EQ(apps::pool_bytes(m, apps::MemoryPool::host, true), offloaded);
  EXPECT_EQ(apps::pool_bytes(m, apps::MemoryPool::device, true), m.total() - offloaded);
  // Two ranks sharing one GPU, each with room beside its plan for cuBLAS, NCCL and operands.
  const double on_gpu = 2 * (m.total() - offloaded + apps::kDeviceRuntimeBytesPerRank);
  using apps::MemoryPool;
  EXPECT_EQ(apps::memory_shortfall(c, {0, 1}, on_gpu, "n0 GPU 0", "free", MemoryPool::device,
                                   true),
            "");
  const std::string message = apps::memory_shortfall(c, {0, 1}, on_gpu * 0.99, "n0 GPU 0",
                                                     "free", MemoryPool::device, true);
  EXPECT_TRUE(has(message, "on node n0 GPU 0 need " + core::format_bytes(on_gpu))) << message;
  EXPECT_FALSE(has(message, "for the runtime")) << message;
  EXPECT_TRUE(has(message, "(plus 512.0 MiB a rank kept free for cuBLAS, NCCL")) << message;
  // The plan printed is the device's: the offloaded bytes are the host's.
  EXPECT_FALSE(has(message, "offloaded")) << message;
  EXPECT_TRUE(has(message, "(total " + core::format_bytes(m.total() - offloaded) + ")"))
      << message;
  // The host holds only the offloaded moments (plus the runtime) on a device build.
  EXPECT_EQ(apps::memory_shortfall(c, {0, 1}, 2 * (offloaded + apps::kRuntimeBytesPerRank), "n0",
                                   "MemAvailable", MemoryPool::host, true),
            "");
}

// colossal_eval / colossal_generate (inference): the parameters and one block's activations, no
// gradients or moments. A node too small to train a layout may still evaluate it; where it is
// too small for that too, the changes offered are inference's (ZeRO-3's sharded parameters, the
// micro-batch), never a checkpointing policy (inference keeps one block already).
TEST(MemoryFit, InferenceIsPricedWithoutTrainingState) {
  // Parameters dominate: many wide blocks (ZeRO-3 gathers two at a time), short sequences.
  const io::Config c = config("layers: 16, hidden: 256, heads: 4",
                              "seq_len: 16, global_batch: 16, micro_batch: 4",
                              "parallel: {data: 2}\n");
  const planner::MemoryPrediction infer = apps::rank_memory(c, 0, true);
  const planner::MemoryPrediction train = apps::rank_memory(c, 0);
  using core::MemCategory;
  EXPECT_EQ(infer[MemCategory::gradients], 0.0);
  EXPECT_EQ(infer[MemCategory::optimizer], 0.0);
  EXPECT_EQ(infer[MemCategory::parameters], train[MemCategory::parameters]);
  EXPECT_LT(infer[MemCategory::activations], train[MemCategory::activations]);
  const double inference_need = 2 * (infer.total() + apps::kRuntimeBytesPerRank);
  ASSERT_LT(inference_need, need(c, {0, 1}));
  EXPECT_EQ(apps::memory_shortfall(c, {0, 1}, inference_need, "n0", "MemAvailable",
                                   apps::MemoryPool::host, false, {.inference = true}),
            "");
  EXPECT_NE(apps::memory_shortfall(c, {0, 1}, inference_need, "n0"), "");

  // Too little for whole parameters on both ranks: ZeRO-3 shards them.
  const io::Config zero3 = io::parse_config(c.text, c.source, {"parallel.zero.stage=3"});
  const double sharded = 2 * (apps::rank_memory(zero3, 0, true).total() +
                              apps::kRuntimeBytesPerRank);
  ASSERT_LT(sharded, inference_need);
  const double available = (sharded + inference_need) / 2;
  const std::string message = apps::memory_shortfall(
      c, {0, 1}, available, "n0", "MemAvailable", apps::MemoryPool::host, false,
      {.inference = true});
  EXPECT_TRUE(has(message, "need " + core::format_bytes(inference_need))) << message;
  EXPECT_TRUE(has(message, "--set parallel.zero.stage=3 (" + core::format_bytes(sharded) + ")"))
      << message;
  EXPECT_FALSE(has(message, "checkpointing.policy")) << message;
  EXPECT_FALSE(has(message, "parallel.zero.stage=1")) << message;
  EXPECT_FALSE(has(message, "colossal_plan")) << message;
}

// 2d / 2.5d / 3d sample and score eval.choices in a one-rank 1d trainer of the whole model on
// world rank 0 (apps::one_rank_config): the node holding rank 0 is priced with it, the larger of
// the sampler (micro-batch 1) and the scorer (train.micro_batch rows), and the message says so;
// a node without rank 0, a run that neither samples nor scores, and 1d are not.
TEST(MemoryFit, GridRankZeroAlsoHoldsTheWholeModelItSamplesAndScoresWith) {
  using apps::MemoryPool;
  const std::string model = "layers: 4, hidden: 64, heads: 4";
  const std::string train = "seq_len: 256, global_batch: 32, micro_batch: 16";
  const std::string grid = "parallel: {tensor: {size: 4, mode: 2d}}\n";
  const io::Config sampling = config(model, train, grid + "sample: {tokens: 50}\n");
  const double sampler =
      apps::rank_memory(apps::one_rank_config(sampling, 1), 0, /*inference=*/true).total();
  EXPECT_EQ(apps::whole_model_bytes(sampling, MemoryPool::host, false), sampler);
  ASSERT_GT(sampler, apps::rank_memory(sampling, 0).bytes[0]) << "the whole model's parameters";

  const std::vector<int> node{0, 1, 2, 3};
  const double bytes = need(sampling, node) + sampler;
  EXPECT_EQ(apps::memory_shortfall(sampling, node, bytes, "n0"), "");
  const std::string message = apps::memory_shortfall(sampling, node, bytes * 0.999, "n0");
  EXPECT_TRUE(has(message, "need " + core::format_bytes(bytes))) << message;
  EXPECT_TRUE(has(message, "world rank 0 builds the whole model in a one-rank trainer to sample "
                           "or score eval.choices (" + core::format_bytes(sampler)))
      << message;
  EXPECT_EQ(apps::memory_shortfall(sampling, {1, 2, 3}, need(sampling, {1, 2, 3}), "n1"), "");

  const io::Config quiet = config(model, train, grid);  // sample.tokens 0, no choices
  EXPECT_EQ(apps::whole_model_bytes(quiet, MemoryPool::host, false), 0.0);
  // colossal_generate (inference, samples) builds the sampler whatever sample.tokens says.
  EXPECT_EQ(apps::whole_model_bytes(quiet, MemoryPool::host, false,
                                    {.inference = true, .samples = true}),
            sampler);
  const io::Config scoring = config(model, train, grid + "eval: {choices: /x/choices.jsonl}\n");
  const double scorer =
      apps::rank_memory(apps::one_rank_config(scoring, 16), 0, /*inference=*/true).total();
  ASSERT_GT(scorer, sampler) << "16 rows a forward";
  EXPECT_EQ(apps::whole_model_bytes(scoring, MemoryPool::host, false), scorer);
  // An inference program prices what its caller says it does, not the config's keys:
  // colossal_eval scoring (--choices or eval.choices), colossal_generate sampling.
  EXPECT_EQ(apps::whole_model_bytes(quiet, MemoryPool::host, false,
                                    {.inference = true, .scores = true}),
            scorer);
  EXPECT_EQ(apps::whole_model_bytes(scoring, MemoryPool::host, false,
                                    {.inference = true, .samples = true}),
            sampler);
  const io::Config one_d = config(model, train, "sample: {tokens: 50}\n");
  EXPECT_EQ(apps::whole_model_bytes(one_d, MemoryPool::host, false), 0.0);
}
