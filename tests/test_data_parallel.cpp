// Data parallelism and ZeRO stages 0-3 (with optimizer and parameter offload, and a share of the
// optimizer state offloaded) train the same model as one rank: per-step losses and final
// weights against a single-process run of the same config, plus the per-rank memory and the bytes
// each stage moves, against their closed forms.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "apps/memory_fit.hpp"
#include "apps/trainer.hpp"
#include "core/host_threads.hpp"
#include "core/optimizer.hpp"
#include "io/config.hpp"
#include "parallel/local_device.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"
#include "zero/sharded_store.hpp"

using namespace colossal;

namespace {

std::string shared_data(parallel::Communicator& world) {
  return test::shared_training_text(world, "colossal_dp_data.txt", 12345, 7, "the ");
}

// `run` names the log directory: single-rank references run on every rank at once, so each needs
// its own.
io::Config config(const std::string& data, const std::string& arch, int dp, int stage,
                  const std::string& run = "dp", bool offload = false, bool offload_params = false,
                  bool bf16_reduce = false, double offload_fraction = 1.0,
                  double params_fraction = 1.0) {
  const std::string text =
      "model: {arch: " + arch + (arch == "llama" ? ", kv_heads: 2, ffn_hidden: 96" : "") +
      ", layers: 2, hidden: 32, heads: 4, vocab: 256, max_seq: 16}\n"
      "data: {path: " + data + "}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 8, micro_batch: 2,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
      "parallel: {data: " + std::to_string(dp) + ", zero: {stage: " + std::to_string(stage) +
      ", offload: {optimizer: " + (offload ? "true" : "false") +
      ", params: " + (offload_params ? "true" : "false") +
      (offload_fraction < 1.0 ? ", optimizer_fraction: " + std::to_string(offload_fraction)
                              : std::string()) +
      (params_fraction < 1.0 ? ", params_fraction: " + std::to_string(params_fraction)
                             : std::string()) +
      "}}, bucket_mb: 0.01" +
      (bf16_reduce ? ", grad_reduce: bf16" : "") + "}\n"
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " +
      (std::filesystem::temp_directory_path() / ("colossal_" + run)).string() + "}\n";
  return io::parse_config(text, "test");
}

struct Param {
  std::string arch;
  int stage;
  bool offload = false;
  bool offload_params = false;
  bool bf16_reduce = false;  // parallel.grad_reduce: bf16
  double offload_fraction = 1.0;  // parallel.zero.offload.optimizer_fraction
  double params_fraction = 1.0;   // parallel.zero.offload.params_fraction
};

class DataParallel : public ::testing::TestWithParam<Param> {};

TEST_P(DataParallel, TrainsTheSingleRankModel) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size();
  const std::string data = shared_data(world);
  const auto [arch, stage, offload, offload_params, bf16_reduce, fraction, params_fraction] =
      GetParam();
  // Gradients summed in bf16 (8 bits of mantissa) on several ranks follow the fp32 run closely,
  // not to fp32 rounding.
  const bool rounded = bf16_reduce && dp > 1;
  const double loss_tolerance = rounded ? 2e-4 : 1e-5;

  apps::Trainer reference(config(data, arch, 1, 0, "reference" + std::to_string(world.rank())),
                          nullptr);
  const apps::TrainSummary expected = reference.train();

  apps::Trainer trainer(
      config(data, arch, dp, stage, "dp", offload, offload_params, bf16_reduce, fraction,
             params_fraction),
      nullptr, &world);
  EXPECT_NE(trainer.plan().find("mesh: {data: " + std::to_string(dp) + ","), std::string::npos)
      << trainer.plan();
  EXPECT_NE(trainer.plan().find("zero: {stage: " + std::to_string(stage) + ","), std::string::npos);
  parallel::Communicator& group = trainer.data_parallel();
  group.reset_stats();
  const apps::TrainSummary got = trainer.train();

  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], expected.losses[i], loss_tolerance * std::abs(expected.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_LT(got.losses.back(), got.losses.front() - 0.5) << "the run must actually learn";
  // Final weights: the logical (Hugging Face) tensors of both runs, whatever their layouts.
  const uint64_t gathers_before = group.stats().all_gather.calls;
  const std::vector<float> weights = trainer.logical_parameters();  // collective under ZeRO-3
  const uint64_t gather_calls = group.stats().all_gather.calls - gathers_before;
  const std::vector<float> want = reference.logical_parameters();
  ASSERT_EQ(weights.size(), want.size());
  double worst = 0, distance = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(weights[i]) - double(want[i]);
    worst = std::max(worst, std::abs(d));
    distance += d * d;
    norm += double(want[i]) * double(want[i]);
  }
  if (!rounded) {
    EXPECT_LT(worst, 1e-5);
  } else {
    // AdamW divides by sqrt(v): a near-zero gradient's element can move by lr per step whatever
    // its size, so a few elements differ by up to 10 steps x lr. The whole weight vector stays
    // within a few bf16 roundings (2^-9 = 2e-3) of the fp32 run's, relative L2 (measured on 2
    // and 4 ranks: gpt2 4.9e-4 to 7.3e-4, opt 1.9e-3 to 3.1e-3), and does differ.
    const double relative = std::sqrt(distance / norm);
    EXPECT_LT(relative, 5e-3) << "largest element difference " << worst;
    EXPECT_GT(relative, 1e-7);
  }

  // Memory per rank against the closed forms. Units are padded to dp*16 floats; P is the padded
  // flat size, S = P/dp the shard, U0 the embedding unit, W the widest other unit.
  const auto& units = trainer.model().units();
  const std::size_t P = trainer.model().flat_size();
  EXPECT_EQ(P % (std::size_t(dp) * 16), 0u);
  for (const auto& u : units) EXPECT_EQ(u.size() % (std::size_t(dp) * 16), 0u);
  const std::size_t S = P / dp, U0 = units[0].size();
  std::size_t W = 0;
  for (std::size_t u = 1; u < units.size(); ++u) W = std::max(W, units[u].size());
  const auto& mem = trainer.memory();
  std::size_t params = P, grads = P, optimizer = 2 * (stage == 0 ? P : S), offloaded = 0;
  if (stage >= 2) grads = S + (dp > 1 ? U0 + 2 * W : 0);  // two block buffers: reduce + fill
  // bf16 on the wire: a 2-byte copy of what is in flight, the flat buffer at stages 0-1; at 2-3
  // unit 0's and one block's, freeing the fp32 work buffer at once (no spare block buffer).
  std::size_t wire_halves = 0;
  if (rounded) {
    wire_halves = stage >= 2 ? U0 + W : P;
    if (stage >= 2) grads -= W;
  }
  // Parameter offload: the shard's last HP states live on the host (all at params_fraction 1).
  const std::size_t HP = offload_params ? core::offloaded_states(S, params_fraction) : 0;
  if (params_fraction < 1.0) {
    EXPECT_GT(HP, 0u);
    EXPECT_LT(HP, S) << "a fraction must split the shard";
    EXPECT_EQ(dynamic_cast<zero::ShardedParameterStore&>(trainer.model().store())
                  .host_param_states(),
              HP);
  }
  if (stage == 3) {  // the shard, the work buffers and the prefetch buffer (several ranks or
                     // parameter offload)
    params = (S - HP) + (dp > 1 || offload_params ? U0 + 2 * W : 0);
  }
  // Offloaded: the shard's last H states keep their moments, gradients and parameters on the
  // host; the others' moments stay on the device (all of them move at fraction 1).
  const std::size_t H = offload ? core::offloaded_states(S, fraction) : 0;
  if (fraction < 1.0) {
    EXPECT_GT(H, 0u);
    EXPECT_LT(H, S) << "a fraction must split the shard";
    EXPECT_EQ(trainer.optimizer().offloaded_states(), H);
  }
  if (offload) {
    optimizer = 2 * (S - H);
    offloaded = 4 * H;  // moments, gradient shard, parameter shard (host copy or home)
  }
  EXPECT_EQ(mem.current(core::MemCategory::parameters), 4 * params);
  EXPECT_EQ(mem.current(core::MemCategory::gradients), 4 * grads + 2 * wire_halves);
  EXPECT_EQ(mem.current(core::MemCategory::optimizer), 4 * optimizer);
  EXPECT_EQ(mem.current(core::MemCategory::offloaded), 4 * offloaded);

  // Bytes per step on the data-parallel communicator (payload convention of CommStats). Every
  // step all-reduces the loss (one double); stages 2-3 also the squared norm.
  const auto& stats = group.stats();
  const uint64_t steps = 10, micro = 8 / (2 * dp), bytes = P * 4;
  const uint64_t grad_bytes = P * (rounded ? 2 : 4);  // a reduction's payload
  const uint64_t unit_count = units.size();
  if (offload) {
    const auto& off = trainer.optimizer().offload_stats();
    const uint64_t shard_bytes = 4 * S;
    // Stages 2-3: a unit's offloaded gradients went down during the last backward as soon as
    // its reduction completed (no pipeline or sequence split here changes them after backward):
    // on one rank every unit's; on several all but the two reductions still in flight when
    // backward ended, the embeddings' (unit 0) and the first block's (unit 1), which come down
    // in the step.
    uint64_t early = 0;
    for (std::size_t u = dp > 1 ? 2 : 0; u < units.size(); ++u) {
      const std::size_t begin = units[u].begin / dp, end = begin + units[u].size() / dp;
      early += 4 * (end - std::min(end, std::max(begin, S - H)));
    }
    EXPECT_EQ(off.early_to_host_bytes, stage >= 2 ? steps * early : 0u);
    if (stage >= 2 && dp > 1 && H == S) {
      EXPECT_LT(early, 4 * H);
    }
    if (offload_params) {
      // Gradient shard and the device part of the parameter shard down each step, that part
      // back up; every gather (2 per micro-batch, 1 for the weights gathered at the end of
      // train, 1 for the snapshot above) uploads the host part of this rank's slice of the unit,
      // but backward's skips the embeddings (the LM head ran its backward in forward).
      auto uploaded = [&](std::size_t u) {  // bytes: slice u's states at or past S - HP
        const std::size_t begin = units[u].begin / dp, end = begin + units[u].size() / dp;
        return uint64_t(4 * (end - std::min(end, std::max(begin, S - HP))));
      };
      uint64_t every_unit = 0;
      for (std::size_t u = 0; u < units.size(); ++u) every_unit += uploaded(u);
      if (params_fraction == 1.0) {
        EXPECT_EQ(every_unit, shard_bytes);
      }
      EXPECT_EQ(off.to_host_bytes, steps * (shard_bytes + 4 * (S - HP)));
      // Gathers served by the unit still in its buffer upload nothing: each backward's first
      // (the final layernorm's unit, which forward gathered last) and each micro-batch's first
      // block after the first of a step (the backward before gathered it last).
      const std::size_t last = units.size() - 1;
      EXPECT_EQ(off.to_device_bytes,
                (steps * 2 * micro + 1 + 1) * every_unit - steps * micro * uploaded(0) -
                    steps * (micro * uploaded(last) + (micro - 1) * uploaded(1)) +
                    steps * 4 * (S - HP));
    } else {
      // Only the offloaded states' gradients and parameters travel.
      EXPECT_EQ(off.to_host_bytes, steps * 2 * 4 * H);
      EXPECT_EQ(off.to_device_bytes, steps * 4 * H);
    }
  }
  if (stage == 3 && (dp > 1 || offload_params)) {
    // Every block unit but the first of each pass (forward from unit 1 up, backward from the
    // final layernorm's unit down) arrives prefetched (gathered, or with parameter offload
    // uploaded, ahead), and no prefetch is wasted: the bytes above and below are those of
    // gathering each unit once per use.
    // And none is gathered twice in a row: backward's first unit and a micro-batch's first
    // block after the first (the parameters unchanged since) are served from their buffer.
    auto& store = dynamic_cast<zero::ShardedParameterStore&>(trainer.model().store());
    EXPECT_GE(store.prefetch_hits(), steps * micro * 2 * (unit_count - 2));
    EXPECT_EQ(store.prefetch_misses(), 0u);
    EXPECT_EQ(store.reused_gathers(), steps * (2 * micro - 1));
  }
  if (dp == 1) {
    // One rank moves nothing: only the scalar all-reduces are called.
    EXPECT_EQ(stats.total_wire_bytes(), 0.0) << "one rank communicates nothing";
    EXPECT_EQ(stats.total_calls(), steps * (stage >= 2 ? 2 : 1));
    EXPECT_EQ(stats.reduce_scatter.calls + stats.all_gather.calls, 0u);
    return;
  }
  EXPECT_EQ(gather_calls, stage == 3 ? unit_count : 0u);
  const double f = double(dp - 1) / dp;  // ring: (p-1)/p of the payload per rank
  if (stage < 2) {
    EXPECT_EQ(stats.all_reduce.payload_bytes, steps * (grad_bytes + 8));
    EXPECT_EQ(stats.all_reduce.calls, steps * (trainer.gradient_sync().buckets().size() + 1));
    EXPECT_EQ(stats.reduce_scatter.calls, 0u);
    EXPECT_EQ(stats.all_gather.payload_bytes, stage == 1 ? steps * bytes : 0u);
    EXPECT_GT(trainer.gradient_sync().buckets().size(), 1u)
        << "bucket_mb 0.01 must give several buckets";
    // Buckets of the last blocks start reducing while backward still runs the earlier ones.
    EXPECT_GT(trainer.gradient_sync().buckets_started_early(), steps);
    // An all-reduce moves 2(p-1)/p of its payload per rank.
    EXPECT_NEAR(stats.all_reduce.wire_bytes, 2 * f * steps * (grad_bytes + 8), 1.0);
  } else {
    // Every micro-batch reduce-scatters every unit's gradients once.
    EXPECT_EQ(stats.reduce_scatter.payload_bytes, steps * micro * grad_bytes);
    EXPECT_EQ(stats.reduce_scatter.calls, steps * micro * unit_count);
    EXPECT_NEAR(stats.reduce_scatter.wire_bytes, f * steps * micro * grad_bytes, 1.0);
    EXPECT_EQ(stats.all_reduce.payload_bytes, steps * 16);
    // Stage 2: one in-place all-gather per unit after the update. Stage 3: every unit gathered
    // before its forward and again before its backward, plus once when train() saves the model
    // (and once more here, counted above in the snapshot).
    // Backward leaves the embedding unit out of its gathers: the embedding's gradient needs no
    // parameters, and the LM head ran its backward in forward (ActivationSizes::
    // head_in_forward), while the tied embeddings were gathered for it.
    // Nor the units still in their buffer (above): backward's first, a later micro-batch's
    // first block.
    const uint64_t embedding_skips = steps * micro * 4 * uint64_t(U0);
    const uint64_t reused =
        steps * 4 * (micro * uint64_t(units.back().size()) + (micro - 1) * uint64_t(units[1].size()));
    const uint64_t gathered = stage == 2 ? steps * bytes
                                         : (steps * 2 * micro + 1 + 1) * bytes - embedding_skips -
                                               reused;
    EXPECT_EQ(stats.all_gather.payload_bytes, gathered);
    EXPECT_NEAR(stats.all_gather.wire_bytes, f * gathered, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    StagesAndArchitectures, DataParallel,
    ::testing::Values(Param{"gpt2", 0}, Param{"gpt2", 1}, Param{"gpt2", 2}, Param{"gpt2", 3},
                      Param{"opt", 0}, Param{"opt", 1}, Param{"opt", 2}, Param{"opt", 3},
                      Param{"gpt2", 1, true}, Param{"gpt2", 2, true}, Param{"gpt2", 3, true},
                      Param{"gpt2", 3, true, true}, Param{"opt", 1, true}, Param{"opt", 2, true},
                      Param{"opt", 3, true}, Param{"opt", 3, true, true}, Param{"llama", 0},
                      Param{"llama", 1}, Param{"llama", 2}, Param{"llama", 3},
                      Param{"gpt2", 0, false, false, true}, Param{"gpt2", 1, false, false, true},
                      Param{"gpt2", 2, false, false, true}, Param{"gpt2", 3, false, false, true},
                      Param{"opt", 3, true, true, true}, Param{"opt", 0, false, false, true},
                      // A share of the optimizer state offloaded; at stage 2 the split falls
                      // inside a unit's slice.
                      Param{"gpt2", 1, true, false, false, 0.5},
                      Param{"gpt2", 2, true, false, false, 0.3},
                      Param{"opt", 3, true, false, false, 0.5},
                      // A share of the parameter shard offloaded (the rest on the device).
                      Param{"gpt2", 3, true, true, false, 1.0, 0.5},
                      Param{"opt", 3, true, true, false, 1.0, 0.2}),
    [](const auto& info) {
      return info.param.arch + "_zero" + std::to_string(info.param.stage) +
             (info.param.offload ? "_offload" : "") + (info.param.offload_params ? "_params" : "") +
             (info.param.bf16_reduce ? "_bf16reduce" : "") +
             (info.param.offload_fraction < 1.0
                  ? "_share" + std::to_string(int(info.param.offload_fraction * 100))
                  : "") +
             (info.param.params_fraction < 1.0
                  ? "_paramshare" + std::to_string(int(info.param.params_fraction * 100))
                  : "");
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

// MFU's peak is the whole job's: the sum of every rank's (a run of n ranks at one device's
// speed each would otherwise report n times its MFU), a GPU shared by ranks counted once, a CPU
// rank's from the rate per core rank 0 measured and this rank's cores.
TEST(DataParallelConfig, MfuPeakIsTheSumOverTheRanks) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  io::Config config;
  config.hardware.peak_tflops = 2.5;
  EXPECT_EQ(apps::job_peak_flops(config, world).flops, 2.5e12 * world.size());
  config.hardware.peak_tflops = 0;
  config.hardware.preset = "h100";
  config.hardware.gemm = "cublas";
  // Each rank's share of its GPU (1 without one), summed: the GPUs the job uses.
  const double gpus = world.all_reduce_sum_value(1.0 / parallel::ranks_sharing_this_gpu());
  EXPECT_DOUBLE_EQ(apps::job_peak_flops(config, world).flops, 494e12 * gpus);
  config.hardware.gemm = "openblas";
  if (apps::device_resident_build()) return;
  const apps::JobPeak peak = apps::job_peak_flops(config, world);
  if (peak.per_core == 0) return;  // nothing measured (a CUDA-compiled build)
  EXPECT_DOUBLE_EQ(peak.flops, world.all_reduce_sum_value(apps::cpu_rank_peak(
                                   peak.per_core, core::current_thread_plan(), false, 1.0)));
  // Every rank got rank 0's rate.
  EXPECT_EQ(world.all_reduce_sum_value(peak.per_core), peak.per_core * world.size());
}

}  // namespace

namespace {
// The sharded store's final listener (ZeRO-Offload's gradient copies during backward): in the
// final pass each unit the sync allows is reported once, after its reduction completed, with this
// rank's summed slice; other units and earlier micro-batches are not, and zero_gradients() starts
// a new generation. Backward's order: unit 0 open throughout, the blocks from the last down.
TEST(ShardedStoreFinal, ReportsEachFinishedUnitOnceWithItsSum) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size(), rank = world.rank();
  const std::size_t q = std::size_t(dp) * 16;
  const std::vector<core::ParamUnit> units = {{0, 2 * q}, {2 * q, 5 * q}, {5 * q, 6 * q},
                                              {6 * q, 9 * q}};
  for (const int stage : {2, 3}) {
    core::MemoryTracker tracker;
    zero::ShardedParameterStore store(units, 9 * q, stage, world, tracker);
    store.set_final_units({true, true, false, true});
    std::vector<std::pair<int, std::vector<float>>> heard;
    std::vector<int> during(units.size(), -1);  // 1: reported during backward, 0: after it
    store.set_final_listener([&](int unit, const float* slice, bool during_backward) {
      std::vector<float> values(store.slice_size(unit));
      core::copy_to_host(values.data(), slice, values.size() * sizeof(float));
      heard.emplace_back(unit, std::move(values));
      during[std::size_t(unit)] = during_backward ? 1 : 0;
    });
    store.zero_gradients();
    const uint64_t generation = store.gradient_generation();
    // Rank r adds (r + 1) * (micro + 1) * (element + 1) to each element of a unit.
    auto add = [&](float* grads, std::size_t n, int micro) {
      std::vector<float> host(n);
      core::copy_to_host(host.data(), grads, n * sizeof(float));
      for (std::size_t e = 0; e < n; ++e) host[e] += float((rank + 1) * (micro + 1) * (e + 1));
      core::copy_to_device(grads, host.data(), n * sizeof(float));
    };
    for (int micro = 0; micro < 2; ++micro) {
      store.set_final_pass(micro == 1);
      float* embeddings = store.gradients(0);
      for (int u = 3; u >= 1; --u) {
        add(store.gradients(u), units[u].size(), micro);
        store.gradients_done(u);
      }
      add(embeddings, units[0].size(), micro);
      store.gradients_done(0);
      store.set_final_pass(false);
      if (micro == 0) {
        EXPECT_TRUE(heard.empty()) << "stage " << stage;
      }
    }
    store.grad_shard();  // completes the reductions still in flight
    std::vector<int> order;
    for (const auto& [unit, values] : heard) order.push_back(unit);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(order, (std::vector<int>{0, 1, 3})) << "stage " << stage;
    // One rank: each unit as backward finishes it. Several: unit 3's reduction completed while
    // backward went on; the embeddings' and unit 1's were still in flight when it ended.
    EXPECT_EQ(during, (dp == 1 ? std::vector<int>{1, 1, -1, 1} : std::vector<int>{0, 0, -1, 1}))
        << "stage " << stage;
    // Element e of the unit summed over ranks and both micro-batches: (1 + 2) x dp(dp+1)/2 x
    // (e + 1); this rank's slice starts at rank x slice.
    const float ranks = float(dp * (dp + 1) / 2);
    for (const auto& [unit, values] : heard) {
      const std::size_t s = store.slice_size(unit);
      ASSERT_EQ(values.size(), units[unit].size() / dp);
      for (std::size_t i = 0; i < s; ++i) {
        ASSERT_EQ(values[i], 3 * ranks * float(rank * s + i + 1)) << unit << " " << i;
      }
    }
    store.zero_gradients();
    EXPECT_EQ(store.gradient_generation(), generation + 1);
  }
}
}  // namespace

namespace {
// Stage 3's gathers under full recomputation (checkpointing.policy: full): backward runs each
// block's forward again right before its backward, so a block is gathered twice in a row.
// Forward prefetches each next unit, backward's first unit and every block's second gather are
// served from the buffer, and no prefetch is wasted: each block is uploaded (parameter offload)
// or gathered once per pass, as without recomputation. Every gather returns the unit's values.
TEST(ShardedStorePrefetch, FullRecomputationGathersEachBlockOncePerPass) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size();
  const std::size_t q = std::size_t(dp) * 16;
  // Embeddings, four blocks, the final layernorm's unit.
  const std::vector<core::ParamUnit> units = {{0, 2 * q},      {2 * q, 5 * q},  {5 * q, 8 * q},
                                              {8 * q, 11 * q}, {11 * q, 14 * q}, {14 * q, 15 * q}};
  const int last = int(units.size()) - 1;
  for (const double offload : {0.0, 1.0, 0.5}) {
    if (dp == 1 && offload == 0.0) continue;  // one rank without offload gathers nothing
    SCOPED_TRACE("params offloaded " + std::to_string(offload));
    core::MemoryTracker tracker;
    zero::ShardedParameterStore store(units, 15 * q, 3, world, tracker, offload);
    for (int u = 0; u <= last; ++u) {  // parameter i of the flat buffer is i
      float* w = store.begin_write(u);
      std::vector<float> values(units[u].size());
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(units[u].begin + i);
      core::copy_to_device(w, values.data(), values.size() * sizeof(float));
      store.commit(u);
    }
    const uint64_t uploaded_before = store.uploaded_bytes();
    auto use = [&](int u) {
      const float* p = store.gather(u);
      std::vector<float> got(units[u].size());
      core::copy_to_host(got.data(), p, got.size() * sizeof(float));
      for (std::size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], float(units[u].begin + i)) << "unit " << u << " element " << i;
      }
      store.release(u);
    };
    const int micro = 3;
    for (int m = 0; m < micro; ++m) {
      for (int u = 0; u <= last; ++u) use(u);  // forward
      use(last);                               // backward: the final layernorm
      for (int u = last - 1; u >= 1; --u) {
        use(u);  // its forward again
        use(u);  // its backward
      }
    }
    const uint64_t blocks = uint64_t(last);  // units 1 .. last
    EXPECT_EQ(store.prefetch_misses(), 0u);
    // Forward: units 2 .. last prefetched; backward: every block's recomputed forward.
    EXPECT_EQ(store.prefetch_hits(), micro * ((blocks - 1) + (blocks - 1)));
    // Backward's first unit, each block's backward, and each micro-batch's first block after
    // the first (the backward before gathered it last).
    EXPECT_EQ(store.reused_gathers(), micro * (1 + (blocks - 1)) + (micro - 1));
    if (offload > 0.0) {
      // Once per pass: forward uploads every unit, backward every block but the last unit; minus
      // the first block of every micro-batch after the first.
      // Backward, ending on block 1 gathered twice, turns up again and prefetches block 2 for
      // the next forward: after the last micro-batch one block's upload waits for the step,
      // which drops it.
      const std::size_t S = 15 * q / std::size_t(dp), HP = store.host_param_states();
      auto host_bytes = [&](int u) {
        const std::size_t begin = units[u].begin / dp, end = begin + units[u].size() / dp;
        return uint64_t(4 * (end - std::min(end, std::max(begin, S - HP))));
      };
      uint64_t forward = 0, backward = 0;
      for (int u = 0; u <= last; ++u) forward += host_bytes(u);
      for (int u = 1; u < last; ++u) backward += host_bytes(u);
      EXPECT_EQ(store.uploaded_bytes() - uploaded_before,
                micro * (forward + backward) - (micro - 1) * host_bytes(1) + host_bytes(2));
    }
    store.param_shard();  // the step: the parameters change
    EXPECT_EQ(store.prefetch_misses(), 1u) << "the next forward's block 2, dropped";
  }
}
}  // namespace

namespace {
// Stage 3 under checkpointed segments (every_k 2, sqrt, full: the model recomputes a segment's
// blocks upward, then runs their backward downward): the model tells the store the order of its
// backward's gathers, so every block unit's gather but the first of each pass is served by a
// prefetch or from its buffer, none is wasted (the step's last backward prefetches nothing for a
// next forward that the step precedes), and the losses are the single-rank run's.
TEST(ZeroThreePrefetch, CheckpointedSegmentsWasteNoPrefetch) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size();
  const std::string data = shared_data(world);
  for (const std::string policy : {"full", "every_k", "sqrt"}) {
    SCOPED_TRACE(policy);
    auto with = [&](const io::Config& c) {
      std::vector<std::string> sets{"model.layers=4", "train.steps=3",
                                    "checkpointing.policy=" + policy};
      if (policy == "every_k") sets.push_back("checkpointing.every=2");
      return io::parse_config(c.text, "test", sets);
    };
    apps::Trainer reference(
        with(config(data, "gpt2", 1, 0, "reference" + std::to_string(world.rank()))), nullptr);
    const apps::TrainSummary expected = reference.train();
    // One rank prefetches only what it uploads (parameter offload).
    apps::Trainer trainer(
        with(config(data, "gpt2", dp, 3, "dp", /*offload=*/dp == 1, /*offload_params=*/dp == 1)),
        nullptr, &world);
    const apps::TrainSummary got = trainer.train();
    ASSERT_EQ(got.losses.size(), expected.losses.size());
    for (std::size_t i = 0; i < got.losses.size(); ++i) {
      EXPECT_NEAR(got.losses[i], expected.losses[i], 1e-5 * std::abs(expected.losses[i]));
    }
    auto& store = dynamic_cast<zero::ShardedParameterStore&>(trainer.model().store());
    std::printf("  %s on %d rank(s): %llu prefetched, %llu kept, %llu wasted\n", policy.c_str(),
                dp, (unsigned long long)store.prefetch_hits(),
                (unsigned long long)store.reused_gathers(),
                (unsigned long long)store.prefetch_misses());
    EXPECT_EQ(store.prefetch_misses(), 0u);
    // Every gather of a block unit is served ahead or from its buffer but the first block's
    // after each update (3 steps) and after the last (the weights read at the end of train()).
    EXPECT_EQ(store.prefetch_hits() + store.reused_gathers(), store.block_gathers() - (3 + 1));
    // The gathers that move a unit are the ones the cost model counts: per micro-batch forward's
    // five (4 blocks and the final unit; the first block kept after the first micro-batch) and
    // backward's blocks as core::backward_block_transfers counts them (the final unit kept
    // since forward), and the five of the weights read at the end.
    const auto& model = dynamic_cast<const core::Model&>(trainer.model());
    const uint64_t m = 8 / (2 * dp);
    const uint64_t backward =
        uint64_t(core::backward_block_transfers(model.activations().keep, -1));
    if (policy == "full") {
      EXPECT_EQ(backward, 4u) << "whole-block recomputation gathers each block once";
    } else {
      EXPECT_GT(backward, 4u) << "recomputed segments of two blocks gather blocks again";
    }
    EXPECT_EQ(store.block_gathers() - store.reused_gathers(),
              3 * (m * 5 - (m - 1) + m * backward) + 5);
  }
}

// train.on_nonfinite: skip leaves a step's early gradient copies (the final listener's) unused:
// the next step must not take them for its own. Two ZeRO-2 optimizers, one offloading, get the
// same gradients: a skipped step's (no update; its gradients of the other sign) and then one
// that updates, whose units are not final early (so only the generation tells the copies
// apart); both must reach the same parameters.
TEST(ShardedAdamWOffload, ASkippedStepsEarlyCopiesAreNotTakenForTheNext) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const int dp = world.size(), rank = world.rank();
  const core::ModelSpec spec = core::model_spec(core::Arch::gpt2, 2, 32, 4, 128, 64, 16);
  const auto table = core::parameter_table(spec, std::size_t(dp) * 16);
  const auto units = core::parameter_units(table, std::size_t(dp) * 16);
  const std::size_t flat = units.back().end;
  core::MemoryTracker t1, t2;
  zero::ShardedAdamW plain(table, units, flat, world, t1, {.stage = 2});
  zero::ShardedAdamW offload(table, units, flat, world, t2,
                             {.stage = 2, .offload_optimizer = true});
  std::vector<float> init(flat);
  for (std::size_t i = 0; i < flat; ++i) init[i] = 0.01f * float(i % 97) - 0.4f;
  auto backward = [&](zero::ShardedAdamW& opt, float sign, bool final) {
    auto& store = dynamic_cast<zero::ShardedParameterStore&>(opt.store());
    store.zero_gradients();
    store.set_final_pass(final);
    auto add = [&](float* grads, const core::ParamUnit& u) {
      std::vector<float> host(u.size());
      core::copy_to_host(host.data(), grads, host.size() * sizeof(float));
      for (std::size_t e = 0; e < host.size(); ++e) {
        host[e] += sign * float(rank + 1) * std::sin(0.37f * float(u.begin + e));
      }
      core::copy_to_device(grads, host.data(), host.size() * sizeof(float));
    };
    float* embeddings = store.gradients(0);
    for (int u = int(units.size()) - 1; u >= 1; --u) {
      add(store.gradients(u), units[std::size_t(u)]);
      store.gradients_done(u);
    }
    add(embeddings, units[0]);
    store.gradients_done(0);
    store.set_final_pass(false);
  };
  for (zero::ShardedAdamW* opt : {&plain, &offload}) {
    auto& store = dynamic_cast<zero::ShardedParameterStore&>(opt->store());
    store.set_final_units(std::vector<bool>(units.size(), true));
    core::copy_to_device(opt->store().full_params(), init.data(), flat * sizeof(float));
    backward(*opt, -100.0f, true);  // the skipped step: copies made, no update
    opt->skip_step();               // as the trainer does (waits for those copies)
    backward(*opt, 1.0f, false);    // the step that updates
    opt->step(core::AdamWParams{.lr = 1e-2}, 1, 1.0f);
  }
  EXPECT_GT(offload.offload_stats().early_to_host_bytes, 0u) << "the skipped step copied early";
  const std::vector<float> want = plain.owned_parameters(), got = offload.owned_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6) << i;
}
}  // namespace
