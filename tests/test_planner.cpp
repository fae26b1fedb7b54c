// The joint planner: the pipeline partition and the search's pruning against brute force, the
// unfittable-model report, the plan round trip through YAML overrides, and the predictions for
// the published Megatron-LM runs (Narayanan et al. 2021, Tables 1 and 2) on the a100-80g preset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#include "core/optimizer.hpp"
#include "io/config.hpp"
#include "parallel/stage_partition.hpp"
#include "planner/search.hpp"

using namespace colossal;

namespace {

// Every contiguous partition of n blocks into `stages` non-empty stages, the slowest stage's cost.
double brute_partition(const std::vector<double>& cost, int stages, double first, double last) {
  const int n = int(cost.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> cuts;
  std::function<void(int, int)> rec = [&](int start, int stage) {
    if (stage == stages - 1) {
      double worst = 0.0, acc = 0.0;
      int b = 0;
      std::vector<int> bounds = cuts;
      bounds.push_back(n);
      for (int s = 0; s < stages; ++s) {
        acc = 0.0;
        for (int i = b; i < bounds[std::size_t(s)]; ++i) acc += cost[std::size_t(i)];
        if (s == 0) acc += first;
        if (s == stages - 1) acc += last;
        worst = std::max(worst, acc);
        b = bounds[std::size_t(s)];
      }
      best = std::min(best, worst);
      return;
    }
    for (int c = start + 1; c <= n - (stages - 1 - stage); ++c) {
      cuts.push_back(c);
      rec(c, stage + 1);
      cuts.pop_back();
    }
  };
  rec(0, 0);
  return best;
}

TEST(Partition, MatchesBruteForceOnRandomCosts) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + trial % 10, stages = 1 + (trial / 10) % n;
    std::vector<double> cost(static_cast<std::size_t>(n), 0.0);
    for (double& c : cost) c = u(rng);
    const double first = trial % 3 == 0 ? u(rng) : 0.0, last = trial % 2 == 0 ? u(rng) : 0.0;
    const std::vector<int> counts = parallel::partition_stages(cost, stages, first, last);
    ASSERT_EQ(int(counts.size()), stages);
    double worst = 0.0;
    int b = 0;
    for (int s = 0; s < stages; ++s) {
      ASSERT_GE(counts[std::size_t(s)], 1);
      double acc = s == 0 ? first : 0.0;
      for (int i = 0; i < counts[std::size_t(s)]; ++i) acc += cost[std::size_t(b + i)];
      if (s == stages - 1) acc += last;
      worst = std::max(worst, acc);
      b += counts[std::size_t(s)];
    }
    ASSERT_EQ(b, n);
    EXPECT_NEAR(worst, brute_partition(cost, stages, first, last), 1e-12) << "trial " << trial;
  }
  // Uniform blocks and a heavy head: the last stage gets fewer blocks.
  const std::vector<int> counts = parallel::partition_stages(std::vector<double>(12, 1.0), 4, 0.0, 2.0);
  EXPECT_EQ(counts, (std::vector<int>{3, 3, 4, 2}));
  EXPECT_THROW(parallel::partition_stages(std::vector<double>(3, 1.0), 4, 0, 0), std::invalid_argument);
}

// The bounds only skip layouts that cannot win: the pruned search keeps the same best plans as
// costing every layout, on small models and clusters (GPT-2 and OPT shapes, 8 and 16 devices,
// memory tight enough that checkpointing and ZeRO matter).
TEST(Search, PruningKeepsTheBestPlans) {
  const core::ModelSpec specs[] = {core::model_spec(core::Arch::gpt2, 8, 512, 8, 2048, 8000, 512),
                                   core::model_spec(core::Arch::opt, 6, 768, 12, 3072, 8000, 512)};
  for (const core::ModelSpec& spec : specs) {
    for (int devices : {8, 16}) {
      for (double memory_gib : {40.0, 0.35}) {
        planner::Cluster cluster{planner::hardware_preset("a100-40g"), devices};
        cluster.hw.memory_bytes = memory_gib * 1024 * 1024 * 1024;
        planner::SearchOptions all;
        all.prune = false;
        all.top = 3;
        planner::SearchOptions pruned = all;
        pruned.prune = true;
        const auto a = planner::search_plans(spec, 64, 512, false, cluster, all);
        const auto b = planner::search_plans(spec, 64, 512, false, cluster, pruned);
        ASSERT_EQ(a.best.size(), b.best.size()) << devices << " " << memory_gib;
        for (std::size_t i = 0; i < a.best.size(); ++i) {
          EXPECT_DOUBLE_EQ(a.best[i].step_time, b.best[i].step_time) << i;
        }
        EXPECT_EQ(a.pruned, 0u);
        EXPECT_LE(b.evaluated, a.evaluated);
        std::printf("%s on %d devices, %.2f GiB: %zu layouts, %zu costed with pruning (%zu without); "
                    "best %.4f s\n", core::arch_name(spec.arch), devices, memory_gib, a.candidates,
                    b.evaluated, a.evaluated, a.best.empty() ? 0.0 : a.best.front().step_time);
      }
    }
  }
}

// The search of a 16 x 128-token batch on `cluster` with and without pruning: the same best plans
// (the unpruned search returned, for more checks).
planner::SearchResult expect_pruning_keeps_the_best(const core::ModelSpec& spec,
                                                    const planner::Cluster& cluster) {
  planner::SearchOptions all, pruned;
  all.prune = false;
  all.tensor_modes = pruned.tensor_modes = false;
  const auto a = planner::search_plans(spec, 16, 128, false, cluster, all);
  const auto b = planner::search_plans(spec, 16, 128, false, cluster, pruned);
  EXPECT_FALSE(a.best.empty());
  EXPECT_EQ(a.best.size(), b.best.size());
  for (std::size_t i = 0; i < std::min(a.best.size(), b.best.size()); ++i) {
    EXPECT_DOUBLE_EQ(a.best[i].step_time, b.best[i].step_time) << i;
  }
  return a;
}

// Eight one-thread ranks on two cores (mpirun --oversubscribe): a plan's step is the busy
// thread-seconds of all ranks over the cores, pruning still keeps the best plans,
// and 1F1B needs a micro-batch per stage, as the config does.
// A device count no layout splits (5 for a model of 4 layers, 8 heads and 16 sequences) is
// explained by the rules with the model's numbers and the nearest counts that have layouts,
// instead of "fits in ... (0 layouts tried); the closest needs 0.0 KiB" with an empty plan.
TEST(Search, ACountNoLayoutSplitsNamesTheRulesAndTheNearestCounts) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 256, 128);
  planner::Cluster cluster{planner::hardware_preset("h100"), 5};
  const planner::SearchResult result = planner::search_plans(spec, 16, 128, false, cluster);
  ASSERT_EQ(result.candidates, 0u);
  const std::string why = planner::why_no_layout(spec, 16, 128, false, cluster);
  EXPECT_NE(why.find("no layout splits 5 devices"), std::string::npos) << why;
  EXPECT_NE(why.find("train.global_batch (16)"), std::string::npos) << why;
  EXPECT_NE(why.find("model.layers (4)"), std::string::npos) << why;
  // 4 = data 4; 6 = tensor 2 x pipeline 3: both searched for real.
  EXPECT_NE(why.find("; 4 or 6 devices have layouts"), std::string::npos) << why;
  for (int g : {4, 6}) {
    cluster.devices = g;
    EXPECT_GT(planner::search_plans(spec, 16, 128, false, cluster).candidates, 0u) << g;
  }
}

TEST(Search, RanksSharingCoresAddTheirWork) {
  constexpr auto none = core::CheckpointPolicy::none;
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 256, 128);
  planner::HardwareSpec hw = planner::scaled_to_threads(planner::hardware_preset("host"), 1);
  planner::Cluster shared{hw, 8, 2}, own{hw, 8, 0};
  EXPECT_TRUE(shared.oversubscribed());
  EXPECT_FALSE(own.oversubscribed());
  planner::RunLayout run;
  run.global_batch = 16;
  run.micro_batch = 2;
  run.seq_len = 128;
  run.data = 8;
  double alone = planner::evaluate_plan(spec, run, own, none).step_time;
  EXPECT_NEAR(planner::evaluate_plan(spec, run, shared, none).step_time, 8 * alone / 2, 1e-12);
  run.data = 2;
  run.pipeline = 4;
  const planner::Plan piped = planner::evaluate_plan(spec, run, shared, none);
  ASSERT_TRUE(piped.fits) << piped.why;
  double work = 0.0;
  for (int r = 0; r < 4; ++r) {
    work += 2 * planner::busy_seconds(planner::predict_time(spec, planner::rank_layout(piped.run, r), hw));
  }
  EXPECT_NEAR(piped.step_time, work / 2, 1e-12);
  EXPECT_GT(piped.time.shared_cores, 0.0);
  run.micro_batch = 4;  // 2 micro-batches per rank for 4 stages
  EXPECT_NE(planner::evaluate_plan(spec, run, shared, none).why.find("1f1b needs"),
            std::string::npos);
  expect_pruning_keeps_the_best(spec, shared);
}

// The same ranks pinned round-robin (as colossal_train pins them): data-parallel replicas on a
// core run one after the other, and a pipeline's bubble is left to the ranks it does not stall
// (planner::pinned_step). Measured on 2 cores, 4 ranks: data 2 x pipeline 2 0.32 s, a 4-stage
// pipeline 0.36 s, data 4 with ZeRO 2 0.34 s; the bound that counts bubbles as busy predicted the
// two pipelines at 0.43 s and 0.50 s.
TEST(Search, PinnedRanksAreSimulated) {
  constexpr auto none = core::CheckpointPolicy::none;
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 256, 128);
  planner::HardwareSpec hw = planner::scaled_to_threads(planner::hardware_preset("host"), 1);
  planner::Cluster pinned{hw, 4, 2, true}, bounded{hw, 4, 2, false}, own{hw, 4, 0};
  planner::RunLayout run;
  run.global_batch = 16;
  run.micro_batch = 4;
  run.seq_len = 128;
  run.data = 4;
  const double alone = planner::evaluate_plan(spec, run, own, none).step_time;
  EXPECT_NEAR(planner::evaluate_plan(spec, run, pinned, none).step_time, 2 * alone, 1e-9 * alone);
  run.data = 2;
  run.pipeline = 2;
  const planner::Plan two = planner::evaluate_plan(spec, run, pinned, none);
  ASSERT_TRUE(two.fits) << two.why;
  EXPECT_GT(two.time.shared_cores, 0.0);
  EXPECT_LT(two.step_time, planner::evaluate_plan(spec, run, bounded, none).step_time);
  run.data = 1;
  run.pipeline = 4;
  const planner::Plan four = planner::evaluate_plan(spec, run, pinned, none);
  ASSERT_TRUE(four.fits) << four.why;
  EXPECT_GT(four.step_time, 1.1 * two.step_time);
  // Pruning by the dedicated-core bound stays exact: the simulation never goes below it.
  const planner::SearchResult a = expect_pruning_keeps_the_best(spec, pinned);
  EXPECT_NE(planner::format_search(a, pinned).find("pinned round-robin"), std::string::npos);
}

// A model that cannot fit under any layout: no plan, and the closest one says how much it needs.
// SearchOptions::bf16_weight_copy (colossal_train's bf16 on cuBLAS or oneDNN): every layout
// costs the weights' 2-byte copy, so on a device with room for the plan but not for the copy
// the search checkpoints activations to make room (or finds that nothing fits) where without it
// everything stays kept.
TEST(Search, CountsTheBf16WeightCopyWhereTheGemmKeepsOne) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 8000, 128);
  planner::Cluster cluster{planner::hardware_preset("a100-40g"), 1};
  planner::SearchOptions options;
  options.micro_batches = {4};
  options.zero = options.offload = options.tensor_modes = false;
  const auto plain = planner::search_plans(spec, 4, 128, false, cluster, options);
  options.bf16_weight_copy = true;
  const auto copying = planner::search_plans(spec, 4, 128, false, cluster, options);
  ASSERT_FALSE(plain.best.empty());
  ASSERT_FALSE(copying.best.empty());
  const planner::Plan& a = plain.best.front();
  const planner::Plan& b = copying.best.front();
  EXPECT_TRUE(b.run.bf16_weight_copy);
  EXPECT_EQ(a.policy, core::CheckpointPolicy::none);
  EXPECT_EQ(b.policy, core::CheckpointPolicy::none);
  const double copy = 2.0 * a.memory[core::MemCategory::parameters] / 4;  // one rank: whole
  EXPECT_EQ(b.memory.device() - a.memory.device(), copy);

  cluster.hw.memory_bytes = a.memory.device() + copy / 2;
  options.bf16_weight_copy = false;
  const auto roomy = planner::search_plans(spec, 4, 128, false, cluster, options);
  ASSERT_FALSE(roomy.best.empty());
  EXPECT_EQ(roomy.best.front().policy, core::CheckpointPolicy::none);
  options.bf16_weight_copy = true;
  const auto tight = planner::search_plans(spec, 4, 128, false, cluster, options);
  ASSERT_FALSE(tight.best.empty());
  EXPECT_EQ(tight.best.front().policy, core::CheckpointPolicy::rotor);
  EXPECT_LE(tight.best.front().memory.device(), cluster.hw.memory_bytes);
}

// SearchOptions::bf16_products (colossal_train's bf16): the 1d layouts save the activations
// that only products read in bf16, as the trainer does, so their plans need less activation
// memory than fp32 storage (or the same, where core::stage_activations stores none in bf16);
// the grids keep fp32 arrays (their models store no bf16).
TEST(Search, Bf16OperandsShrinkThe1dActivationsOnly) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 8000, 128);
  planner::Cluster cluster{planner::hardware_preset("a100-40g"), 4};
  planner::SearchOptions options;
  options.micro_batches = {4};
  options.zero = options.offload = false;
  options.top = 1000;
  options.prune = false;
  const auto fp32 = planner::search_plans(spec, 16, 128, false, cluster, options);
  options.bf16_products = true;
  const auto bf16 = planner::search_plans(spec, 16, 128, false, cluster, options);
  ASSERT_EQ(fp32.best.size(), bf16.best.size());
  int compared_1d = 0, compared_grid = 0;
  for (const planner::Plan& b : bf16.best) {
    const bool grid = b.run.tensor_mode != core::TensorMode::d1;
    EXPECT_EQ(b.run.bf16_operands, !grid);
    for (const planner::Plan& a : fp32.best) {  // the same layout stored in fp32
      if (a.run.tensor_mode != b.run.tensor_mode || a.run.tensor != b.run.tensor ||
          a.run.data != b.run.data || a.run.schedule != b.run.schedule || a.run.pipeline != b.run.pipeline ||
          a.run.sequence != b.run.sequence || a.run.sequence_split != b.run.sequence_split ||
          a.run.chunks != b.run.chunks || a.run.depth != b.run.depth || a.policy != b.policy ||
          a.fused_attention != b.fused_attention) {
        continue;
      }
      const auto activations = core::MemCategory::activations;
      if (grid) {
        EXPECT_EQ(b.memory[activations], a.memory[activations]);
        ++compared_grid;
      } else {
        // (some layouts store nothing in bf16: core::stage_activations decides for both)
        EXPECT_LE(b.memory[activations], a.memory[activations]) << planner::format_plan(b);
        if (b.memory[activations] < a.memory[activations]) ++compared_1d;
      }
    }
  }
  EXPECT_GT(compared_1d, 0);
  EXPECT_GT(compared_grid, 0);
}

TEST(Search, NothingFitsReportsTheClosest) {
  const core::ModelSpec spec = *core::find_preset("opt-13b");
  planner::Cluster cluster{planner::hardware_preset("a100-40g"), 2};
  cluster.hw.memory_bytes = 8.0 * 1024 * 1024 * 1024;
  const auto r = planner::search_plans(spec, 8, 2048, true, cluster);
  EXPECT_TRUE(r.best.empty());
  EXPECT_GT(r.closest.memory.device(), cluster.hw.memory_bytes);
  EXPECT_FALSE(r.closest.why.empty());
  EXPECT_GT(r.infeasible, 0u);
}

// One GPU (ZeRO-Offload on one device): a model whose optimizer states alone cannot leave enough
// room is planned at ZeRO 3 with every optimizer chunk and the fewest 64ths of the parameter
// shard on the host (as offload.policy: auto moves them), and the plan's words carry that share.
// One GPU, an 8-block gpt2 at ZeRO 3 with its optimizer state offloaded: activations small
// against the state, so no recomputation saves it.
planner::RunLayout one_gpu_zero3_offload() {
  planner::RunLayout one;
  one.global_batch = 1;
  one.micro_batch = 1;
  one.seq_len = 128;
  one.layers = {8};
  one.zero_stage = 3;
  one.offload_optimizer = true;
  return one;
}

// Every plan of one micro-batch size kept, none pruned, 1d only: what the one-GPU cases compare.
planner::SearchOptions every_one_gpu_plan() {
  planner::SearchOptions options;
  options.top = 50;
  options.prune = false;
  options.micro_batches = {1};
  options.tensor_modes = false;
  return options;
}

TEST(Search, OneGpuOffloadsTheParameterShardsTheMemoryNeeds) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 8, 768, 12, 3072, 50304, 1024);
  planner::Cluster cluster{planner::hardware_preset("h200"), 1};
  planner::RunLayout one = one_gpu_zero3_offload();
  const double optimizer = planner::evaluate_plan(spec, one, cluster).memory.device();
  one.offload_params = true;
  const double both = planner::evaluate_plan(spec, one, cluster).memory.device();
  ASSERT_LT(both, optimizer);
  cluster.hw.memory_bytes = both + 0.3 * (optimizer - both);
  planner::SearchOptions options = every_one_gpu_plan();
  const auto r = planner::search_plans(spec, 1, 128, false, cluster, options);
  ASSERT_FALSE(r.best.empty()) << "nothing fits: " << planner::format_plan(r.closest);
  const planner::Plan& p = r.best.front();
  EXPECT_EQ(p.run.zero_stage, 3);
  EXPECT_TRUE(p.run.offload_optimizer);
  EXPECT_EQ(p.run.offload_fraction, 1.0);
  ASSERT_TRUE(p.run.offload_params) << planner::format_plan(p);
  const int chunks = int(std::lround(p.run.offload_params_fraction * core::kOffloadChunks));
  EXPECT_GT(chunks, 1);
  EXPECT_LT(chunks, core::kOffloadChunks);
  planner::RunLayout fewer = p.run;
  fewer.offload_params_fraction = double(chunks - 1) / core::kOffloadChunks;
  EXPECT_FALSE(planner::evaluate_plan(spec, fewer, cluster).fits);
  EXPECT_NE(planner::format_plan(p).find(" + offload + params " + std::to_string(chunks) + "/64"),
            std::string::npos) << planner::format_plan(p);
  int carried = 0;
  for (const std::string& word : planner::plan_overrides(p)) {
    if (word == "parallel.zero.offload.params=true") ++carried;
    const std::string key = "parallel.zero.offload.params_fraction=";
    if (word.rfind(key, 0) == 0 && std::stod(word.substr(key.size())) == chunks / 64.0) ++carried;
  }
  EXPECT_EQ(carried, 2) << planner::format_plan(p);
  EXPECT_NE(planner::plan_yaml(p).find("params: true, params_fraction: "), std::string::npos)
      << planner::plan_yaml(p);
  EXPECT_NE(planner::plan_json(p).find("\"offload_params\": true"), std::string::npos);
  // Without offload the search has nothing to offer this device.
  options.offload = false;
  EXPECT_TRUE(planner::search_plans(spec, 1, 128, false, cluster, options).best.empty());
}

// The offloaded bytes of a node's ranks share its host memory: a plan that moves more there than
// the node has does not fit, and the fewest parameter chunks the device needs are also the least
// the host must hold, so when those do not fit nothing does. A CPU rank counts them against its
// own memory instead.
TEST(Search, HostMemoryBoundsWhatANodeOffloads) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 8, 768, 12, 3072, 50304, 1024);
  planner::Cluster cluster{planner::hardware_preset("h200"), 1};
  EXPECT_EQ(cluster.hw.host_memory_bytes, 2048.0 * 1024 * 1024 * 1024);
  planner::RunLayout one = one_gpu_zero3_offload();
  const double optimizer = planner::evaluate_plan(spec, one, cluster).memory.device();
  one.offload_params = true;
  const planner::Plan all = planner::evaluate_plan(spec, one, cluster);
  ASSERT_TRUE(all.fits);
  EXPECT_EQ(all.host_bytes, all.memory[core::MemCategory::offloaded]) << "one rank on the node";
  EXPECT_NE(planner::format_plan(all).find("host memory per node (its ranks' offloaded bytes): " +
                                           core::format_bytes(all.host_bytes)),
            std::string::npos)
      << planner::format_plan(all);
  EXPECT_NE(planner::plan_json(all).find("\"host_bytes_per_node\": "), std::string::npos);

  cluster.hw.memory_bytes = all.memory.device() + 0.3 * (optimizer - all.memory.device());
  const planner::SearchOptions options = every_one_gpu_plan();
  const auto roomy = planner::search_plans(spec, 1, 128, false, cluster, options);
  ASSERT_FALSE(roomy.best.empty());
  const planner::Plan& p = roomy.best.front();
  ASSERT_TRUE(p.run.offload_params);
  ASSERT_GT(p.host_bytes, 0.0);
  // Just enough host memory for that plan: it stays; a little less: nothing fits, and the
  // closest plan says the host is why.
  cluster.hw.host_memory_bytes = p.host_bytes;
  const auto tight = planner::search_plans(spec, 1, 128, false, cluster, options);
  ASSERT_FALSE(tight.best.empty());
  EXPECT_EQ(tight.best.front().run.offload_params_fraction, p.run.offload_params_fraction);
  cluster.hw.host_memory_bytes = 0.99 * p.host_bytes;
  const auto none = planner::search_plans(spec, 1, 128, false, cluster, options);
  EXPECT_TRUE(none.best.empty()) << planner::format_plan(none.best.front());
  EXPECT_TRUE(none.closest.device_fits);
  EXPECT_FALSE(none.closest.fits);
  EXPECT_NE(none.closest.why.find("offload " + core::format_bytes(none.closest.host_bytes) +
                                  " to the host, which has " +
                                  core::format_bytes(cluster.hw.host_memory_bytes)),
            std::string::npos)
      << none.closest.why;
  cluster.hw.host_memory_bytes = 0.0;  // unknown: not checked
  EXPECT_FALSE(planner::search_plans(spec, 1, 128, false, cluster, options).best.empty());

  // A device that needs half the optimizer state moved, beside a host that cannot hold all of
  // it: the plan moves the fewest chunks the device needs, which the host can.
  planner::RunLayout z1 = one;
  z1.zero_stage = 1;
  z1.offload_params = false;
  const planner::Plan moved = planner::evaluate_plan(spec, z1, cluster);
  z1.offload_optimizer = false;
  z1.zero_stage = 0;
  const double kept = planner::evaluate_plan(spec, z1, cluster).memory.device();
  cluster.hw.memory_bytes = moved.memory.device() + 0.5 * (kept - moved.memory.device());
  cluster.hw.host_memory_bytes = 0.75 * moved.host_bytes;
  const auto part = planner::search_plans(spec, 1, 128, false, cluster, options);
  ASSERT_FALSE(part.best.empty()) << planner::format_plan(part.closest) << part.closest.why;
  const planner::Plan& some = part.best.front();
  EXPECT_TRUE(some.run.offload_optimizer);
  EXPECT_FALSE(some.run.offload_params);
  EXPECT_LT(some.run.offload_fraction, 1.0) << planner::format_plan(some);
  EXPECT_LE(some.host_bytes, cluster.hw.host_memory_bytes);

  // Eight ranks of one node offload eight ranks' bytes.
  planner::Cluster node{planner::hardware_preset("h200"), 8};
  planner::RunLayout dp8 = one;
  dp8.data = 8;
  dp8.global_batch = 8;
  const planner::Plan eight = planner::evaluate_plan(spec, dp8, node);
  ASSERT_TRUE(eight.fits) << eight.why;
  EXPECT_DOUBLE_EQ(eight.host_bytes, 8 * eight.memory[core::MemCategory::offloaded]);
  node.hw.host_memory_bytes = 7.5 * eight.memory[core::MemCategory::offloaded];
  const planner::Plan over = planner::evaluate_plan(spec, dp8, node);
  EXPECT_FALSE(over.fits);
  EXPECT_TRUE(over.device_fits);
  EXPECT_NE(over.why.find("its 8 rank(s) per node offload"), std::string::npos) << over.why;

  // A CPU rank: the offloaded bytes are its own memory's.
  planner::Cluster cpu{planner::hardware_preset("host"), 1};
  const planner::Plan host = planner::evaluate_plan(spec, one, cpu);
  EXPECT_EQ(host.host_bytes, 0.0);
  EXPECT_EQ(host.memory.against(cpu.hw), host.memory.total());
}

// A stage that fits only with offload (the memory needs it) is also planned with the fewest 64ths
// of each shard's optimizer state on the host: on a GPU node the device's share updates beside
// the host's, so that plan is faster than offloading everything, and one chunk fewer would not
// fit. Its --set words carry the share.
TEST(Search, OffloadTheFewestChunksTheMemoryNeeds) {
  // One block of three heads: no pipeline or tensor split, so data and sequence ranks with ZeRO
  // are what fits; the embedding dominates the optimizer state.
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 1, 768, 3, 3072, 50304, 1024);
  planner::Cluster cluster{planner::hardware_preset("h200"), 2};
  planner::RunLayout dp2;
  dp2.global_batch = 8;
  dp2.micro_batch = 4;
  dp2.seq_len = 1024;
  dp2.data = 2;
  dp2.zero_stage = 1;
  dp2.layers = {1};
  const double kept = planner::evaluate_plan(spec, dp2, cluster).memory.device();
  dp2.offload_optimizer = true;
  const double moved = planner::evaluate_plan(spec, dp2, cluster).memory.device();
  ASSERT_LT(moved, kept);
  cluster.hw.memory_bytes = moved + 0.3 * (kept - moved);
  planner::SearchOptions options;
  options.top = 200;
  options.prune = false;
  options.micro_batches = {4};  // a smaller one would fit without offload
  const auto r = planner::search_plans(spec, 8, 1024, false, cluster, options);
  int partial = 0;
  for (const planner::Plan& p : r.best) {
    if (!p.run.offload_optimizer || p.run.offload_fraction >= 1.0) continue;
    ++partial;
    const int chunks = int(std::lround(p.run.offload_fraction * core::kOffloadChunks));
    EXPECT_GT(chunks, 1);
    EXPECT_LT(chunks, core::kOffloadChunks);
    planner::RunLayout run = p.run;
    run.offload_fraction = 1.0;
    const planner::Plan all = planner::evaluate_plan(spec, run, cluster);
    ASSERT_TRUE(all.fits);
    EXPECT_LT(p.step_time, all.step_time) << planner::format_plan(p);
    std::printf("  ZeRO %d, %d of 64 chunks offloaded: %.4f s predicted, all of them %.4f s\n",
                p.run.zero_stage, chunks, p.step_time, all.step_time);
    run.offload_fraction = double(chunks - 1) / core::kOffloadChunks;
    EXPECT_FALSE(planner::evaluate_plan(spec, run, cluster).fits) << planner::format_plan(p);
    EXPECT_NE(planner::format_plan(p).find(" + offload " + std::to_string(chunks) + "/64"),
              std::string::npos) << planner::format_plan(p);
    bool carried = false;
    const std::string key = "parallel.zero.offload.optimizer_fraction=";
    for (const std::string& word : planner::plan_overrides(p)) {
      if (word.rfind(key, 0) == 0) carried = std::stod(word.substr(key.size())) == chunks / 64.0;
    }
    EXPECT_TRUE(carried) << planner::format_plan(p);
  }
  EXPECT_GT(partial, 0) << "no plan offloads a share among " << r.best.size() << " ("
                        << r.candidates << " candidates, memory " << kept << " / " << moved
                        << ")" << (r.best.empty() ? r.closest.why : planner::format_plan(r.best[0]));
}

// The grids (2d, 2.5d, 3d) run the fused attention at any head size (their q/k/v stay fp32):
// model.fused_attention: auto costs each grid shape with either attention even where the 1d
// shapes cannot run it (SearchOptions::fused_attention_1d), as the fixed layout with it is
// costed; with the key set to true the grids are searched too.
TEST(AttentionChoice, TheSearchCostsTheGridsWithTheFusedAttentionToo) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 2, 256, 4, 1024, 8000, 2048);
  core::ModelSpec fused_spec = spec;
  fused_spec.fused_attention = true;
  planner::Cluster cluster{planner::hardware_preset("h100"), 4};
  planner::SearchOptions options;
  options.micro_batches = {8};
  options.top = 1000;
  options.prune = false;
  options.try_fused_attention = true;
  options.fused_attention_1d = false;  // say the 1d shapes cannot run this head size
  auto count = [](const planner::SearchResult& r, bool grid, bool fused) {
    return std::count_if(r.best.begin(), r.best.end(), [&](const planner::Plan& p) {
      return (p.run.tensor_mode != core::TensorMode::d1) == grid && p.fused_attention == fused;
    });
  };
  const planner::SearchResult with = planner::search_plans(spec, 8, 2048, false, cluster, options);
  EXPECT_GT(count(with, true, true), 0);
  EXPECT_GT(count(with, true, false), 0);
  EXPECT_EQ(count(with, false, true), 0) << "1d shapes costed with an attention they cannot run";
  for (const planner::Plan& p : with.best) {
    if (p.run.tensor_mode == core::TensorMode::d1 || !p.fused_attention) continue;
    EXPECT_DOUBLE_EQ(planner::evaluate_plan(fused_spec, p.run, cluster).step_time, p.step_time)
        << planner::format_plan(p);
  }
  options.try_fused_attention = false;
  EXPECT_EQ(count(planner::search_plans(spec, 8, 2048, false, cluster, options), true, true), 0);
  const planner::SearchResult fixed =
      planner::search_plans(fused_spec, 8, 2048, false, cluster, options);
  EXPECT_GT(count(fixed, true, true), 0) << "model.fused_attention: true searched no grid";
}

// model.fused_attention: auto. A fixed layout takes the faster attention that fits, the fused one
// where only it fits, the smaller when neither does; ring attention stays dense. The search costs
// each 1d shape with either attention: never slower than without, the fused attention's plans
// where only they fit, and their overrides set the key colossal_train reads.
TEST(AttentionChoice, TheFasterAttentionThatFitsAndTheSearchTriesBoth) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 2, 256, 4, 1024, 8000, 2048);
  planner::Cluster cluster{planner::hardware_preset("h100"), 1};
  planner::RunLayout run;
  run.global_batch = 8;
  run.micro_batch = 8;
  run.seq_len = 2048;
  run.layers = {2};
  const auto none = std::optional(core::CheckpointPolicy::none);
  core::ModelSpec fused_spec = spec;
  fused_spec.fused_attention = true;
  const planner::Plan dense = planner::evaluate_plan(spec, run, cluster, none);
  const planner::Plan fused = planner::evaluate_plan(fused_spec, run, cluster, none);
  ASSERT_TRUE(dense.fits && fused.fits);
  EXPECT_FALSE(dense.fused_attention);
  EXPECT_TRUE(fused.fused_attention);
  const double dense_bytes = dense.memory.against(cluster.hw);
  const double fused_bytes = fused.memory.against(cluster.hw);
  // The (B,H,T,T) probabilities of two blocks: 8 x 4 x 2048^2 floats each, kept and in backward.
  ASSERT_GT(dense_bytes, fused_bytes + 2 * 8.0 * 4 * 2048 * 2048 * 4);

  planner::Plan other;
  planner::Plan chosen = planner::evaluate_attention_choice(spec, run, cluster, false, &other, none);
  EXPECT_EQ(chosen.fused_attention, fused.step_time < dense.step_time);
  EXPECT_DOUBLE_EQ(chosen.step_time, std::min(dense.step_time, fused.step_time));
  EXPECT_DOUBLE_EQ(other.step_time, std::max(dense.step_time, fused.step_time));
  // Room for the fused attention's plan only: it is taken, whatever its speed.
  planner::Cluster tight = cluster;
  tight.hw.memory_bytes = (dense_bytes + fused_bytes) / 2;
  chosen = planner::evaluate_attention_choice(spec, run, tight, false, &other, none);
  EXPECT_TRUE(chosen.fused_attention && chosen.fits) << planner::format_plan(chosen);
  EXPECT_FALSE(other.fits);
  EXPECT_FALSE(other.fused_attention);
  // Room for neither: the smaller (colossal_train's memory check then reports it).
  tight.hw.memory_bytes = fused_bytes / 2;
  chosen = planner::evaluate_attention_choice(spec, run, tight, false, nullptr, none);
  EXPECT_TRUE(chosen.fused_attention);
  EXPECT_FALSE(chosen.fits);
  // Where the build or the layout cannot run it: the dense attention, costed alone.
  tight.hw.memory_bytes = (dense_bytes + fused_bytes) / 2;
  chosen = planner::evaluate_attention_choice(spec, run, tight, true, &other, none);
  EXPECT_FALSE(chosen.fused_attention);
  EXPECT_EQ(other.step_time, 0.0);
  planner::RunLayout ring = run;
  ring.sequence = 2;
  planner::Cluster two = cluster;
  two.devices = 2;
  chosen = planner::evaluate_attention_choice(spec, ring, two, false, &other, none);
  EXPECT_FALSE(chosen.fused_attention);
  EXPECT_GT(chosen.step_time, 0.0) << chosen.why;
  EXPECT_EQ(other.step_time, 0.0) << "ring attention with the fused attention was costed";

  // The search, on a device where the dense attention's plan fits only by recomputing.
  planner::SearchOptions options;
  options.micro_batches = {8};
  options.top = 50;
  options.prune = false;
  options.try_fused_attention = true;
  planner::SearchOptions dense_only = options;
  dense_only.try_fused_attention = false;
  // Below the least the dense attention needs (every block recomputed), the fused one's plans
  // are all there is.
  const auto full = std::optional(core::CheckpointPolicy::full);
  const double dense_least = planner::evaluate_plan(spec, run, cluster, full).memory.against(cluster.hw);
  const double fused_least =
      planner::evaluate_plan(fused_spec, run, cluster, full).memory.against(cluster.hw);
  ASSERT_LT(fused_least, dense_least);
  for (const double memory :
       {4 * dense_bytes, (dense_bytes + fused_bytes) / 2, (dense_least + fused_least) / 2}) {
    planner::Cluster c = cluster;
    c.hw.memory_bytes = memory;
    const auto with = planner::search_plans(spec, 8, 2048, false, c, options);
    const auto without = planner::search_plans(spec, 8, 2048, false, c, dense_only);
    ASSERT_FALSE(with.best.empty());
    EXPECT_GT(with.candidates, without.candidates);
    if (memory < dense_least) {
      EXPECT_TRUE(without.best.empty()) << planner::format_plan(without.best.front());
      EXPECT_TRUE(with.best.front().fused_attention);
      std::printf("  %.2f GiB: only the fused attention fits: %.4f s\n",
                  memory / (1024.0 * 1024 * 1024), with.best.front().step_time);
      continue;
    }
    ASSERT_FALSE(without.best.empty());
    EXPECT_LE(with.best.front().step_time, without.best.front().step_time);
    int fused_plans = 0;
    for (const planner::Plan& p : with.best) {
      if (!p.fused_attention) continue;
      ++fused_plans;
      // Costed as the fixed layout with the fused attention is.
      EXPECT_DOUBLE_EQ(planner::evaluate_plan(fused_spec, p.run, c).step_time, p.step_time);
      EXPECT_EQ(p.run.sequence, 1) << "ring attention runs the dense attention only";
    }
    EXPECT_GT(fused_plans, 0);
    for (const planner::Plan& p : without.best) EXPECT_FALSE(p.fused_attention);
    std::printf("  %.2f GiB: best %s attention %.4f s, dense only %.4f s\n",
                memory / (1024.0 * 1024 * 1024), with.best.front().fused_attention ? "fused" : "dense",
                with.best.front().step_time, without.best.front().step_time);
  }
  // A fused plan's text, JSON, config blocks and overrides say so; the overrides set the key.
  EXPECT_NE(planner::format_plan(fused).find(" | fused attention"), std::string::npos);
  EXPECT_EQ(planner::format_plan(dense).find("fused attention"), std::string::npos);
  EXPECT_NE(planner::plan_json(fused).find("\"fused_attention\": true"), std::string::npos);
  EXPECT_NE(planner::plan_json(dense).find("\"fused_attention\": false"), std::string::npos);
  EXPECT_NE(planner::plan_yaml(fused).find("# and in model: fused_attention: true"),
            std::string::npos);
  auto config_with = [](const std::vector<std::string>& sets) {
    return io::parse_config(
        "model: {arch: gpt2, layers: 2, hidden: 256, heads: 4, ffn_hidden: 1024, vocab: 8000, "
        "max_seq: 2048, fused_attention: auto}\ndata: {path: d}\n"
        "train: {seq_len: 2048, global_batch: 8}\nsample: {tokens: 0}\n",
        "test", sets);
  };
  EXPECT_TRUE(config_with({}).fused_attention_auto);
  EXPECT_FALSE(config_with({}).model.fused_attention);
  for (const planner::Plan* p : {&dense, &fused}) {
    const io::Config c = config_with(planner::plan_overrides(*p));
    EXPECT_FALSE(c.fused_attention_auto);
    EXPECT_EQ(c.model.fused_attention, p->fused_attention);
  }
}

struct Published {
  double params_billion;
  int heads, hidden, layers, t, p, gpus, batch;
  double tflops_per_gpu;
};

// The A100 80 GB preset as Megatron-LM's executor ran on it: pipeline messages over NCCL
// point-to-point, device to device (ours stage them through the host under NCCL).
planner::HardwareSpec megatron_a100() {
  planner::HardwareSpec hw = planner::hardware_preset("a100-80g");
  hw.pipeline_staged = false;
  return hw;
}

std::vector<Published> megatron_table1() {
  const char* env = std::getenv("COLOSSAL_SOURCE_DIR");
  const std::string path = std::string(env ? env : ".") + "/tests/data/megatron_2021_table1.csv";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<Published> rows;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream f(line);
    Published r{};
    double pct = 0, agg = 0;
    f >> r.params_billion >> r.heads >> r.hidden >> r.layers >> r.t >> r.p >> r.gpus >> r.batch >>
        r.tflops_per_gpu >> pct >> agg;
    if (f) rows.push_back(r);
  }
  return rows;
}

core::ModelSpec gpt_of(const Published& r) {
  return core::model_spec(core::Arch::gpt2, r.layers, r.hidden, r.heads, 4 * r.hidden, 51200, 2048);
}

// Their Eq. 3: the FLOPs of an iteration with full recomputation.
double megatron_flops(const Published& r) {
  const double B = r.batch, s = 2048, l = r.layers, h = r.hidden, V = 51200;
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

planner::RunLayout published_layout(const Published& r) {
  planner::RunLayout run;
  run.global_batch = r.batch;
  run.micro_batch = 1;
  run.seq_len = 2048;
  run.bf16 = true;
  run.tensor = r.t;
  run.pipeline = r.p;
  run.data = r.gpus / (r.t * r.p);
  // Megatron-LM's DDP of 2021 all-reduced the whole gradient buffer in one call after backward
  // (megatron/model/distributed.py, allreduce_gradients): no buckets, one ring latency.
  run.bucket_mb = std::numeric_limits<double>::infinity();
  // Interleaved with the fewest chunks (2, else 3, ...) that divide each rank's blocks evenly.
  for (int v = 2; r.p > 1 && v <= 4; ++v) {
    if (r.layers % (v * r.p) == 0) {
      run.schedule = parallel::PipelineSchedule::interleaved;
      run.chunks = v;
      break;
    }
  }
  // Megatron-LM splits the blocks evenly; the first and last stages also carry the embedding and
  // the LM head.
  if (r.layers % (run.pipeline * run.chunks) == 0) {
    run.layers.assign(std::size_t(run.pipeline * run.chunks), r.layers / (run.pipeline * run.chunks));
  }
  return run;
}

TEST(Megatron2021, Table1PredictedTflopsPerGpu) {
  double sum = 0.0, worst = 0.0;
  const auto rows = megatron_table1();
  ASSERT_EQ(rows.size(), 10u);
  std::printf("%-8s %-14s %9s %9s %8s\n", "params", "layout", "predicted", "published", "error");
  for (const Published& r : rows) {
    const planner::Cluster cluster{megatron_a100(), r.gpus};
    const planner::RunLayout run = published_layout(r);
    const planner::Plan plan =
        planner::evaluate_plan(gpt_of(r), run, cluster, core::CheckpointPolicy::full);
    ASSERT_GT(plan.step_time, 0.0) << plan.why;
    const double predicted = megatron_flops(r) / plan.step_time / r.gpus / 1e12;
    const double error = predicted / r.tflops_per_gpu - 1.0;
    sum += std::abs(error);
    worst = std::max(worst, std::abs(error));
    char layout[64];
    std::snprintf(layout, sizeof layout, "t%d p%d d%d v%d", r.t, r.p, run.data, run.chunks);
    const planner::TimePrediction& t = plan.time;
    std::printf("%6.1fB  %-14s %9.1f %9.0f %+7.1f%%   step %.2f s: compute %.2f (recompute %.2f), "
                "tp %.2f, pp %.2f, bubble %.2f, dp %.2f\n",
                r.params_billion, layout, predicted, r.tflops_per_gpu, 100 * error, t.step,
                t.compute, t.recompute, t.tensor_comm, t.pipeline_comm, t.bubble, t.data_comm);
  }
  std::printf("mean |error| %.1f%%, max %.1f%%\n", 100 * sum / double(rows.size()), 100 * worst);
  // The aim: 5% mean and 10% max (Calculon reaches 3.65% mean on a comparable set); measured
  // 3.9% and 7.4% (the 7.5B row).
  EXPECT_LE(sum / double(rows.size()), 0.05);
  EXPECT_LE(worst, 0.10);
}

// The planner's own choice for each Table 1 cluster and batch is predicted at least as fast as
// the published layout (which it can represent: micro-batch 1, interleaved, recomputation).
TEST(Megatron2021, PlannerBeatsOrMatchesEachPublishedLayout) {
  for (const Published& r : megatron_table1()) {  // every row, up to 1T on 3072 GPUs (~6 s)
    const planner::Cluster cluster{megatron_a100(), r.gpus};
    const planner::Plan published =
        planner::evaluate_plan(gpt_of(r), published_layout(r), cluster,
                               core::CheckpointPolicy::full);
    planner::SearchOptions options;  // on the published layouts' basis: one gradient all-reduce
    options.bucket_mb = std::numeric_limits<double>::infinity();
    const planner::SearchResult found =
        planner::search_plans(gpt_of(r), r.batch, 2048, /*bf16=*/true, cluster, options);
    ASSERT_FALSE(found.best.empty()) << r.params_billion;
    const planner::Plan& best = found.best.front();
    std::printf("%6.1fB on %4d GPUs: published %.2f s/step, planner %.2f s (%+.1f%%) in %.2f s "
                "(%zu layouts, %zu costed): %s",
                r.params_billion, r.gpus, published.step_time, best.step_time,
                100.0 * (best.step_time / published.step_time - 1.0), found.seconds,
                found.candidates, found.evaluated, planner::format_plan(best).c_str());
    EXPECT_LE(best.step_time, published.step_time * (1 + 1e-9)) << r.params_billion;
  }
}

// Table 2: ZeRO-3 without model parallelism (or with t = 2) against PTD-P, GPT 174.6B
// (96 x 12288, 96 heads) and 529.6B (105 x 20480, 128 heads), global batch as published.
TEST(Megatron2021, Table2ZeroThreeAndPtdp) {
  struct Row {
    const char* scheme;
    double params;
    int t, p, gpus, batch, micro;
    double tflops;
  };
  const Row rows[] = {{"ZeRO-3", 174.6, 1, 1, 384, 1536, 4, 144},  {"ZeRO-3", 174.6, 2, 1, 768, 1536, 2, 88},
                      {"ZeRO-3", 174.6, 1, 1, 1536, 1536, 1, 44},  {"ZeRO-3", 529.6, 1, 1, 640, 2560, 4, 138},
                      {"ZeRO-3", 529.6, 2, 1, 1120, 2240, 2, 98},  {"ZeRO-3", 529.6, 1, 1, 2240, 2240, 1, 48},
                      {"PTD-P", 174.6, 8, 12, 384, 1536, 1, 153},  {"PTD-P", 174.6, 8, 12, 768, 1536, 1, 149},
                      {"PTD-P", 174.6, 8, 12, 1536, 1536, 1, 141}, {"PTD-P", 529.6, 8, 35, 560, 2240, 1, 171},
                      {"PTD-P", 529.6, 8, 35, 1120, 2240, 1, 167}, {"PTD-P", 529.6, 8, 35, 2240, 2240, 1, 159}};
  std::vector<double> zero3, ptdp;  // predicted TFLOP/s per GPU, in the rows' order
  for (const Row& r : rows) {
    const bool big = r.params > 500;
    Published pub{r.params, big ? 128 : 96, big ? 20480 : 12288, big ? 105 : 96, r.t, r.p, r.gpus,
                  r.batch, r.tflops};
    planner::RunLayout run = published_layout(pub);
    run.micro_batch = r.micro;
    if (r.p == 1) run.zero_stage = 3;
    const planner::Cluster cluster{megatron_a100(), r.gpus};
    const planner::Plan plan =
        planner::evaluate_plan(gpt_of(pub), run, cluster, core::CheckpointPolicy::full);
    ASSERT_GT(plan.step_time, 0.0) << plan.why;
    const double predicted = megatron_flops(pub) / plan.step_time / r.gpus / 1e12;
    std::printf("%-7s %6.1fB t%d p%-2d %4d GPUs micro %d: predicted %6.1f TFLOP/s per GPU, "
                "published %3.0f (%+.0f%%)%s\n",
                r.scheme, r.params, r.t, r.p, r.gpus, r.micro, predicted, r.tflops,
                100 * (predicted / r.tflops - 1), plan.fits ? "" : " (over memory)");
    EXPECT_GT(predicted, 0.0);
    if (r.p == 1) {
      zero3.push_back(predicted);
      // Their gathers and reduce-scatters run beside compute, half hidden (the GPU presets'
      // comm_overlap); all of it exposed predicted them 15-34% low.
      EXPECT_NEAR(predicted / r.tflops, 1.0, 0.25) << r.params << "B on " << r.gpus;
    } else {
      ptdp.push_back(predicted);
      EXPECT_NEAR(predicted / r.tflops, 1.0, 0.10) << r.params << "B on " << r.gpus;
    }
  }
  // ZeRO-3 rows are predicted 5-21% low, and as published: slower than PTD-P on each cluster
  // size, and losing per-GPU throughput as the cluster grows while PTD-P holds.
  ASSERT_EQ(zero3.size(), 6u);
  ASSERT_EQ(ptdp.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_LT(zero3[i], ptdp[i]) << i;
    if (i % 3 != 0) {
      EXPECT_LT(zero3[i], 0.8 * zero3[i - 1]) << i;
      EXPECT_GT(ptdp[i], 0.9 * ptdp[i - 1]) << i;
    }
  }
}

}  // namespace

namespace colossal {
// 2d, 2.5d and 3d grids join the search (data parallelism and pipeline stages on top), are
// costed with their own prediction (a pipelined grid by its largest and slowest stage), and a
// chosen one round-trips through the config as colossal_train runs it.
TEST(TensorModes, JoinTheSearchAndRoundTripThroughTheConfig) {
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 4, 256, 8, 1024, 256, 1024);
  planner::Cluster cluster{planner::hardware_preset("a100-80g"), 8};
  cluster.hw.devices_per_node = 8;
  planner::SearchOptions with, without;
  without.tensor_modes = false;
  with.top = without.top = 400;
  const auto a = planner::search_plans(spec, 32, 1024, false, cluster, with);
  const auto b = planner::search_plans(spec, 32, 1024, false, cluster, without);
  EXPECT_GT(a.candidates, b.candidates);
  int grids = 0, pipelined = 0, sharded = 0;
  const planner::Plan* grid_zero = nullptr;  // a grid plan with ZeRO 1 or 2 over its data ranks
  for (const planner::Plan& p : a.best) {
    if (p.run.tensor_mode == core::TensorMode::d1) continue;
    ++grids;
    EXPECT_TRUE(p.fits);
    EXPECT_GT(p.step_time, 0.0);
    EXPECT_TRUE(p.run.chunks == 1 ||
                p.run.schedule == parallel::PipelineSchedule::interleaved);
    // The grids' models run ZeRO 1-2, over their data ranks (offload alone on one).
    EXPECT_LE(p.run.zero_stage, 2);
    EXPECT_TRUE(p.run.zero_stage == 0 || p.run.data > 1 || p.run.offload_optimizer);
    if (p.run.zero_stage > 0) {
      ++sharded;
      if (grid_zero == nullptr) grid_zero = &p;
      // Costed as the fixed layout is.
      EXPECT_DOUBLE_EQ(planner::evaluate_plan(spec, p.run, cluster).step_time, p.step_time);
    }
    if (p.run.pipeline == 1) continue;
    ++pipelined;
    // The plan holds its largest stage's memory and its slowest stage's step.
    double largest = 0.0, slowest = 0.0;
    for (int stage = 0; stage < p.run.pipeline; ++stage) {
      const planner::RankLayout l = planner::rank_layout(p.run, stage);
      largest = std::max(largest, planner::predict_memory(spec, l).total());
      slowest = std::max(slowest, planner::predict_time(spec, l, cluster.hw).step);
      EXPECT_GT(planner::predict_time(spec, l, cluster.hw).bubble, 0.0);
    }
    EXPECT_DOUBLE_EQ(p.memory.total(), largest);
    EXPECT_DOUBLE_EQ(p.time.step, slowest);
    EXPECT_EQ(p.schedules.size(), std::size_t(p.run.pipeline));
  }
  EXPECT_GT(grids, 0) << "2d/2.5d/3d plans are costed and kept";
  EXPECT_GT(sharded, 0) << "2d/2.5d/3d plans with ZeRO over their data ranks are costed and kept";
  EXPECT_GT(pipelined, 0) << "grids with pipeline stages are costed and kept";
  // An explicit 3d layout: its overrides give a config colossal_train accepts and runs as 3d.
  planner::RunLayout run;
  run.global_batch = 32;
  run.micro_batch = 4;
  run.seq_len = 1024;
  run.tensor = 8;
  run.tensor_mode = core::TensorMode::d3;
  const planner::Plan p = planner::evaluate_plan(spec, run, cluster);
  ASSERT_TRUE(p.fits) << p.why;
  // The model above as a config, with a plan's overrides.
  auto config_with = [](const std::vector<std::string>& sets) {
    return io::parse_config(
        "model: {arch: gpt2, layers: 4, hidden: 256, heads: 8, ffn_hidden: 1024, vocab: 256, "
        "max_seq: 1024}\ndata: {path: d}\ntrain: {seq_len: 1024, global_batch: 32}\n"
        "sample: {tokens: 0}\n",
        "test", sets);
  };
  const io::Config c = config_with(planner::plan_overrides(p));
  EXPECT_EQ(c.parallel.tensor_mode, core::TensorMode::d3);
  if (grid_zero != nullptr) {  // its ZeRO stage reaches the config colossal_train reads
    const io::Config z = config_with(planner::plan_overrides(*grid_zero));
    EXPECT_EQ(z.parallel.tensor_mode, grid_zero->run.tensor_mode);
    EXPECT_EQ(z.parallel.zero_stage, grid_zero->run.zero_stage);
    EXPECT_EQ(z.parallel.data, grid_zero->run.data);
  }
  EXPECT_EQ(c.parallel.tensor, 8);
  EXPECT_EQ(c.train.micro_batch, 4);
  // A 2d grid on two pipeline stages: its overrides carry the stages and their blocks.
  {
    planner::RunLayout staged = run;
    staged.tensor = 4;
    staged.tensor_mode = core::TensorMode::d2;
    staged.pipeline = 2;
    const planner::Plan sp = planner::evaluate_plan(spec, staged, cluster);
    ASSERT_TRUE(sp.fits) << sp.why;
    const io::Config sc = config_with(planner::plan_overrides(sp));
    EXPECT_EQ(sc.parallel.tensor_mode, core::TensorMode::d2);
    EXPECT_EQ(sc.parallel.pipeline, 2);
    EXPECT_EQ(sc.parallel.pipeline_layers, (std::vector<int>{2, 2}));
  }
  EXPECT_NE(planner::plan_json(p).find("\"tensor_mode\": \"3d\""), std::string::npos);
  // Where keeping everything does not fit, auto checkpoints the grid's whole blocks with rotor
  // under the device memory, and the overrides carry it to a config colossal_train accepts.
  {
    planner::Cluster small = cluster;
    run.layers = {spec.layers};
    planner::RankLayout l = planner::rank_layout(run, 0);
    const double kept = planner::predict_memory(spec, l).total();
    l.keep = core::keep_blocks(spec.layers, {0, 1, 2, 3});
    const double full = planner::predict_memory(spec, l).total();
    ASSERT_LT(full, kept);
    small.hw.memory_bytes = (full + kept) / 2;
    const planner::Plan r = planner::evaluate_plan(spec, run, small);
    ASSERT_TRUE(r.fits) << r.why;
    EXPECT_EQ(r.policy, core::CheckpointPolicy::rotor);
    EXPECT_LE(r.memory.total(), small.hw.memory_bytes);
    EXPECT_GT(r.time.recompute, 0.0);
    ASSERT_EQ(r.schedules.size(), 1u);
    EXPECT_NE(r.schedules[0].find("every rank: rotor: I."), std::string::npos) << r.schedules[0];
    const io::Config rc = config_with(planner::plan_overrides(r));
    EXPECT_EQ(rc.checkpointing.policy, core::CheckpointPolicy::rotor);
    EXPECT_EQ(rc.parallel.tensor_mode, core::TensorMode::d3);
    // Below what recomputing every block needs: refused, with the least it needs.
    small.hw.memory_bytes = full / 2;
    const planner::Plan none_fits = planner::evaluate_plan(spec, run, small);
    EXPECT_FALSE(none_fits.fits);
    EXPECT_NE(none_fits.why.find("needs"), std::string::npos) << none_fits.why;
  }
  // A 2.5d layout that the grid cannot hold is refused with the reason.
  run.tensor_mode = core::TensorMode::d2_5;
  run.depth = 3;
  EXPECT_NE(planner::evaluate_plan(spec, run, cluster).why.find("not a 2.5d grid"),
            std::string::npos);
}
}  // namespace colossal
