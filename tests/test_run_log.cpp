// apps::RunLog without a trainer: the rows of metrics.csv and metrics.h5, their continuation on a
// resume, the progress line's cadence and numbers, and the summary's losses and throughput.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/memory_fit.hpp"
#include "apps/run_log.hpp"
#include "apps/trainer.hpp"
#include "core/cpu_peak.hpp"
#include "core/host_threads.hpp"
#include "parallel/local_communicator.hpp"
#include "io/config.hpp"
#include "io/hdf5_file.hpp"
#include "metrics_h5.hpp"
#include "io/metrics.hpp"

using namespace colossal;

namespace {

constexpr double kTokens = 1000.0;       // tokens per step
constexpr double kFlopsPerToken = 600.0;
constexpr double kPeak = 1.0e7;          // FLOP/s

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("colossal_run_log_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

io::Config config_for(const std::string& dir, int64_t steps, int64_t every) {
  std::ofstream(dir + "/data.txt") << std::string(4000, 'a');
  return io::parse_config(
      "model: {arch: gpt2, layers: 2, hidden: 32, heads: 4, vocab: 256, max_seq: 16}\n"
      "data: {path: " + dir + "/data.txt}\n"
      "train: {steps: " + std::to_string(steps) + ", seq_len: 16, global_batch: 8, "
      "micro_batch: 4}\n"
      "log: {every: " + std::to_string(every) + ", dir: " + dir + "/run}\n",
      "test");
}

apps::RunLogOptions options(const core::MemoryTracker& memory, bool writer = true,
                            int64_t first_step = 0, std::FILE* log = nullptr) {
  return apps::RunLogOptions{.writer = writer,
                             .first_step = first_step,
                             .log = log,
                             .tokens_per_step = kTokens,
                             .flops_per_token = kFlopsPerToken,
                             .peak_flops = kPeak,
                             .memory = &memory};
}

apps::StepRecord step_record(double loss, double seconds, double val_loss = std::nan("")) {
  return apps::StepRecord{.loss = loss, .lr = 1.0e-3, .grad_norm = 0.75, .seconds = seconds,
                          .val_loss = val_loss};
}

// Everything written to `file` so far.
std::string text_of(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) text.append(buf, n);
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}


double read_h5_attribute(const std::string& path, const std::string& name) {
  io::H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose, "open " + path);
  io::H5Handle attribute(H5Aopen(file.get(), name.c_str(), H5P_DEFAULT), H5Aclose, name);
  double value = 0.0;
  EXPECT_GE(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value), 0);
  return value;
}

// CSV cells keep 9 significant digits.
void expect_close(double got, double want, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what << ": " << got;
  } else {
    EXPECT_NEAR(got, want, 1e-8 * std::fabs(want)) << what;
  }
}

}  // namespace

// A NaN is "nan" whatever its sign bit (printf wrote the skipped step's loss as "-nan").
TEST(RunLog, MetricsCsvWritesEveryNanAsNan) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "colossal_nan_metrics.csv").string();
  {
    io::MetricsCsv csv(path, {"step", "loss", "val_loss"});
    csv.row({3, -std::numeric_limits<double>::quiet_NaN(), std::nan("")});
    csv.row({4, 1.5, std::numeric_limits<double>::infinity()});
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "step,loss,val_loss\n3,nan,nan\n4,1.5,inf\n");
  std::filesystem::remove(path);
}

// A row a crash cut short (the last line without its newline, or a line with fewer cells) is
// dropped before a resumed run appends: "1" + the next row made a row of step 116.
TEST(RunLog, MetricsCsvDropsRowsCutShortBeforeAppending) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "colossal_cut_metrics.csv").string();
  for (const char* cut : {"3,1", "3,1\n4,2,0.5\n5,2.5"}) {
    std::ofstream(path) << "step,loss,lr\n1,3,0.5\n2,2,0.5\n" << cut;
    {
      io::MetricsCsv csv(path, {"step", "loss", "lr"}, /*append=*/true, /*resume_step=*/4);
      EXPECT_TRUE(csv.row({3, 1.5, 0.25}));
    }
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string want = std::string(cut).size() == 3
                                 ? "step,loss,lr\n1,3,0.5\n2,2,0.5\n3,1.5,0.25\n"
                                 : "step,loss,lr\n1,3,0.5\n2,2,0.5\n4,2,0.5\n3,1.5,0.25\n";
    EXPECT_EQ(text.str(), want) << cut;
  }
  std::filesystem::remove(path);
}

// A full disk: the row stays in memory and row() says so (the run warns and goes on).
TEST(RunLog, MetricsCsvKeepsWhatAFullDiskRefuses) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  io::MetricsCsv csv("/dev/full", {"step", "loss"});
  EXPECT_FALSE(csv.row({1, 2.5}));
  EXPECT_NE(csv.error().find("No space left"), std::string::npos) << csv.error();
}

TEST(RunLog, WritesOneRowPerStepToMetricsCsvAndMetricsH5) {
  const std::string dir = temp_dir("rows");
  const io::Config config = config_for(dir, 3, 10);
  core::MemoryTracker memory;
  memory.on_alloc(core::MemCategory::parameters, 4096);
  memory.on_alloc(core::MemCategory::activations, 1024);
  {
    apps::RunLog log(config, options(memory));
    log.set_attribute("parameters", 1234.0);
    log.record(0, step_record(5.0, 0.5));
    log.record(1, apps::StepRecord{.loss = 4.0, .lr = 2.0e-3, .grad_norm = 1.5, .seconds = 0.25,
                                   .val_loss = 4.5});
    apps::StepRecord profiled = step_record(3.0, 0.2);
    profiled.work_seconds.emplace();
    for (int k = 0; k < core::Profiler::kKinds; ++k) (*profiled.work_seconds)[k] = 0.01 * k;
    log.record(2, profiled);
  }
  const std::string run = dir + "/run";
  std::ifstream resolved(run + "/config.yaml");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(resolved), {}), config.text);

  const io::CsvTable csv = io::read_metrics_csv(run + "/metrics.csv");
  EXPECT_EQ(csv.columns, (std::vector<std::string>{"step", "loss", "lr", "grad_norm",
                                                   "tokens_per_s", "mfu", "step_seconds",
                                                   "val_loss", "peak_tracked_bytes"}));
  ASSERT_EQ(csv.rows.size(), 3u);
  const std::vector<double> second{2.0, 4.0, 2.0e-3, 1.5, kTokens / 0.25,
                                   kFlopsPerToken * kTokens / 0.25 / kPeak, 0.25, 4.5, 5120.0};
  for (std::size_t c = 0; c < second.size(); ++c) {
    expect_close(csv.rows[1][c], second[c], "row 2, " + csv.columns[c]);
  }
  expect_close(csv.rows[0][7], std::nan(""), "row 1 val_loss");
  expect_close(csv.rows[2][0], 3.0, "row 3 step");

  const std::string h5_path = run + "/metrics.h5";
  const auto h5 = colossal::test::read_metrics_h5(h5_path);
  EXPECT_EQ(h5.size(), apps::metrics_h5_columns().size());
  for (const std::string& name : apps::metrics_h5_columns()) {
    ASSERT_TRUE(h5.count(name)) << name;
    EXPECT_EQ(h5.at(name).size(), 3u) << name;
  }
  for (std::size_t c = 0; c < csv.columns.size(); ++c) {
    for (std::size_t r = 0; r < 3; ++r) {
      expect_close(h5.at(csv.columns[c])[r], csv.rows[r][c], "h5 " + csv.columns[c]);
    }
  }
  EXPECT_EQ(h5.at("memory_params_bytes"), (std::vector<double>{4096, 4096, 4096}));
  EXPECT_EQ(h5.at("memory_activations_bytes"), (std::vector<double>{1024, 1024, 1024}));
  EXPECT_EQ(h5.at("memory_grads_bytes"), (std::vector<double>{0, 0, 0}));
  // Time per kind of work only for the profiled step.
  const std::string second_kind =
      std::string("time_") + core::work_kind_key(core::WorkKind(1)) + "_seconds";
  EXPECT_TRUE(std::isnan(h5.at(second_kind)[0]));
  EXPECT_TRUE(std::isnan(h5.at(second_kind)[1]));
  EXPECT_DOUBLE_EQ(h5.at(second_kind)[2], 0.01);
  EXPECT_EQ(read_h5_attribute(h5_path, "tokens_per_step"), kTokens);
  EXPECT_EQ(read_h5_attribute(h5_path, "peak_flops"), kPeak);
  EXPECT_EQ(read_h5_attribute(h5_path, "parameters"), 1234.0);
}

TEST(RunLog, WithoutH5OrConfigWritesOnlyMetricsCsv) {
  const std::string dir = temp_dir("csv_only");
  core::MemoryTracker memory;
  apps::RunLogOptions csv_only = options(memory);
  csv_only.write_h5 = false;
  csv_only.write_config = false;
  {
    apps::RunLog log(config_for(dir, 2, 10), csv_only);
    log.set_attribute("parameters", 1.0);  // no metrics.h5: nothing to set
    log.record(0, step_record(5.0, 0.5));
  }
  EXPECT_EQ(io::read_metrics_csv(dir + "/run/metrics.csv").rows.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/metrics.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/config.yaml"));
}

TEST(RunLog, AResumedRunContinuesBothFilesAfterDroppingTheStepsPastItsCheckpoint) {
  const std::string dir = temp_dir("resume");
  core::MemoryTracker memory;
  {
    // Trained 5 steps, then crashed; its newest checkpoint holds step 3.
    apps::RunLog log(config_for(dir, 6, 10), options(memory));
    for (int64_t step = 0; step < 5; ++step) log.record(step, step_record(10.0 + step, 0.1));
  }
  {
    apps::RunLog log(config_for(dir, 6, 10), options(memory, true, /*first_step=*/3));
    for (int64_t step = 3; step < 6; ++step) log.record(step, step_record(20.0 + step, 0.1));
  }
  const std::string run = dir + "/run";
  std::ifstream in(run + "/metrics.csv");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  EXPECT_EQ(text.find("step,"), 0u);
  EXPECT_EQ(text.find("step,", 1), std::string::npos) << "one header:\n" << text;
  const io::CsvTable csv = io::read_metrics_csv(run + "/metrics.csv");
  const std::vector<double> steps{1, 2, 3, 4, 5, 6}, losses{10, 11, 12, 23, 24, 25};
  ASSERT_EQ(csv.rows.size(), 6u) << text;
  for (std::size_t r = 0; r < 6; ++r) {
    EXPECT_EQ(csv.rows[r][0], steps[r]);
    EXPECT_EQ(csv.rows[r][1], losses[r]) << "row " << r + 1;
  }
  const auto h5 = colossal::test::read_metrics_h5(run + "/metrics.h5");
  EXPECT_EQ(h5.at("step"), steps);
  EXPECT_EQ(h5.at("loss"), losses);

  {
    // A run that does not resume starts both files afresh.
    apps::RunLog log(config_for(dir, 6, 10), options(memory));
    log.record(0, step_record(7.0, 0.1));
  }
  EXPECT_EQ(io::read_metrics_csv(run + "/metrics.csv").rows.size(), 1u);
  EXPECT_EQ(colossal::test::read_metrics_h5(run + "/metrics.h5").at("loss"),
            std::vector<double>{7.0});
}

TEST(RunLog, PrintsTheProgressLineAfterStepOneEveryLogEveryStepsAndAtTheEnd) {
  const std::string dir = temp_dir("progress");
  core::MemoryTracker memory;
  memory.on_alloc(core::MemCategory::parameters, 5120);
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    apps::RunLog log(config_for(dir, 10, 4), options(memory, false, 0, out));
    // Steps 2-4 take 0.1, 0.2 and 0.3 s: the line after step 4 reports their mean, 0.2 s.
    const std::vector<double> seconds{0.5, 0.1, 0.2, 0.3, 1, 1, 1, 1, 2, 2};
    for (int64_t step = 0; step < 10; ++step) {
      log.record(step, step_record(2.5, seconds[std::size_t(step)]));
    }
  }
  const auto lines = lines_of(text_of(out));
  ASSERT_EQ(lines.size(), 4u) << text_of(out);
  EXPECT_EQ(lines[0], "step      1/10 | loss 2.5000 | lr 1.000e-03 | grad-norm 0.750 | 2000 tok/s"
                      " | MFU 12.0% | mem 5.0 KiB | ETA 4.5s");
  EXPECT_EQ(lines[1], "step      4/10 | loss 2.5000 | lr 1.000e-03 | grad-norm 0.750 | 5000 tok/s"
                      " | MFU 30.0% | mem 5.0 KiB | ETA 1.2s");
  EXPECT_EQ(lines[2].rfind("step      8/10 | ", 0), 0u) << lines[2];
  EXPECT_NE(lines[2].find("| 1000 tok/s | MFU 6.0% |"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3], "step     10/10 | loss 2.5000 | lr 1.000e-03 | grad-norm 0.750 | 500 tok/s"
                      " | MFU 3.0% | mem 5.0 KiB | ETA 0.0s");
  std::fclose(out);

  // log.every above train.steps: after the first and the last step only; without ETA the line
  // ends at mem; Progress::never prints nothing.
  out = std::tmpfile();
  {
    apps::RunLogOptions no_eta = options(memory, false, 0, out);
    no_eta.eta = false;
    apps::RunLog log(config_for(dir, 5, 1000), no_eta);
    log.record(0, step_record(2.5, 0.5), apps::RunLog::Progress::never);
    for (int64_t step = 1; step < 5; ++step) log.record(step, step_record(2.5, 0.5));
  }
  const auto quiet = lines_of(text_of(out));
  ASSERT_EQ(quiet.size(), 1u) << text_of(out);
  EXPECT_EQ(quiet[0], "step      5/5 | loss 2.5000 | lr 1.000e-03 | grad-norm 0.750 | 2000 tok/s"
                      " | MFU 12.0% | mem 5.0 KiB");
  std::fclose(out);
}

TEST(RunLog, SummaryThroughputLeavesOutTheFirstStep) {
  const std::string dir = temp_dir("summary");
  core::MemoryTracker memory;
  memory.on_alloc(core::MemCategory::optimizer, 3000);
  apps::TrainSummary summary;
  {
    // Resumed after 2 steps, on a rank that writes nothing: the first step (page faults) takes
    // 10 s, the three after it 1 s together.
    apps::RunLog log(config_for(dir, 6, 10), options(memory, false, /*first_step=*/2));
    log.record(2, step_record(4.0, 10.0));
    log.record(3, step_record(3.5, 0.5, /*val_loss=*/3.75));
    log.record(4, step_record(3.0, 0.25));
    log.record(5, step_record(2.5, 0.25));
    EXPECT_EQ(log.recorded(), 4);
    log.finish(summary);
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/run")) << "only the writer writes";
  EXPECT_EQ(summary.first_step, 2);
  EXPECT_EQ(summary.steps, 6);
  EXPECT_EQ(summary.losses, (std::vector<double>{4.0, 3.5, 3.0, 2.5}));
  EXPECT_EQ(summary.first_loss, 4.0);
  EXPECT_EQ(summary.last_loss, 2.5);
  EXPECT_EQ(summary.val_loss, 3.75);
  EXPECT_DOUBLE_EQ(summary.tokens_per_s, 3.0 * kTokens / 1.0);
  EXPECT_DOUBLE_EQ(summary.mfu, 3.0 * kTokens * kFlopsPerToken / kPeak);
  EXPECT_EQ(summary.peak_tracked_bytes, 3000u);
  EXPECT_GE(summary.seconds, 0.0);

  // One step alone: throughput over the run's whole time; no validation: val_loss -1.
  apps::TrainSummary one;
  {
    apps::RunLog log(config_for(dir, 1, 10), options(memory, false));
    log.start();
    log.record(0, step_record(4.0, 10.0));
    log.finish(one);
  }
  EXPECT_EQ(one.steps, 1);
  EXPECT_GT(one.seconds, 0.0);
  EXPECT_EQ(one.tokens_per_s, kTokens / one.seconds);
  EXPECT_EQ(one.val_loss, -1.0);
}

TEST(RunLog, NeedsTheMemoryTracker) {
  const std::string dir = temp_dir("no_memory");
  apps::RunLogOptions none;
  EXPECT_THROW(apps::RunLog(config_for(dir, 1, 10), none), std::invalid_argument);
}

// MFU's peak (RunLogOptions::peak_flops, from apps::peak_flops): the preset's in the run's
// precision, a GPU's bf16 tensor-core peak for bf16 runs; hardware.peak_tflops wins.
TEST(RunLog, PeakFlopsFollowsThePrecision) {
  io::Config config;
  config.hardware.preset = "h100";
  EXPECT_EQ(apps::peak_flops(config), 494e12);
  config.train.precision = core::GemmPrecision::bf16;
  EXPECT_EQ(apps::peak_flops(config), 989e12);
  config.hardware.peak_tflops = 700;
  EXPECT_EQ(apps::peak_flops(config), 700e12);
}

// A CPU rank's peak counts the cores its threads run on at once at the measured rate per core:
// its threads, or its share of the node's cores when the node's threads outnumber them (more
// ranks than cores, or more threads than cores), times the bf16 units' multiple in a bf16 run
// whose products run on them.
TEST(RunLog, CpuRankPeakCountsEachCoreOnce) {
  core::ThreadPlan plan;
  plan.threads = 2;
  plan.local_ranks = 1;
  plan.node_cores = 2;
  EXPECT_EQ(apps::cpu_rank_peak(100e9, plan, false, 2.0), 200e9);
  EXPECT_EQ(apps::cpu_rank_peak(100e9, plan, true, 2.0), 400e9);
  EXPECT_EQ(apps::cpu_rank_peak(100e9, plan, true, 16.0), 3200e9);
  // 4 ranks of 1 thread on 2 cores (mpirun --oversubscribe): each runs half the time, so the
  // node's 4 ranks together count the 2 cores once.
  plan.threads = 1;
  plan.local_ranks = 4;
  EXPECT_EQ(4 * apps::cpu_rank_peak(100e9, plan, false, 2.0), 200e9);
  // 1 rank of 8 threads on 2 cores (COLOSSAL_HOST_THREADS=8): still 2 cores.
  plan.threads = 8;
  plan.local_ranks = 1;
  EXPECT_EQ(apps::cpu_rank_peak(100e9, plan, false, 2.0), 200e9);
  // 2 ranks of 3 threads on 4 cores: 2 cores each.
  plan.threads = 3;
  plan.local_ranks = 2;
  plan.node_cores = 4;
  EXPECT_EQ(apps::cpu_rank_peak(100e9, plan, false, 2.0), 200e9);
}

TEST(RunLog, Bf16PeakMultipleFollowsTheUnits) {
  EXPECT_EQ(core::bf16_peak_multiple("AMX-BF16, AVX512-BF16"), 16.0);
  EXPECT_EQ(core::bf16_peak_multiple("AMX-BF16"), 16.0);
  EXPECT_EQ(core::bf16_peak_multiple("AVX512-BF16"), 2.0);
  EXPECT_EQ(core::bf16_peak_multiple(""), 1.0);
}

// MFU's peak for the job (one rank here; test_data_parallel sums it over ranks): the setting,
// a GPU's from its preset where the products run there, else this CPU's as measured (once per
// process): the same in both precisions where bf16 is emulated on the fp32 units, times the
// bf16 units' multiple where oneDNN runs the products on them; and no more than the threads
// can do (at least 1 GFLOP/s a core, at most 16 FMA lanes x 2 units x 2 FLOPs at 10 GHz).
TEST(RunLog, JobPeakIsTheSettingTheGpuOrTheMeasuredCpu) {
  parallel::LocalCommunicator world;
  io::Config config;
  config.hardware.peak_tflops = 2.5;
  EXPECT_EQ(apps::job_peak_flops(config, world).flops, 2.5e12);
  config.hardware.peak_tflops = 0;
  config.hardware.preset = "h100";
  config.hardware.gemm = "cublas";
  EXPECT_EQ(apps::job_peak_flops(config, world).flops, 494e12);
  config.train.precision = core::GemmPrecision::bf16;
  EXPECT_EQ(apps::job_peak_flops(config, world).flops, 989e12);
  config.train.precision = core::GemmPrecision::fp32;
  config.hardware.gemm = "openblas";
  if (apps::device_resident_build()) GTEST_SKIP() << "the GPU's peak on a device build";
  const apps::JobPeak fp32 = apps::job_peak_flops(config, world);
  if (fp32.per_core == 0) GTEST_SKIP() << fp32.source;
  EXPECT_NE(fp32.source.find("measured"), std::string::npos) << fp32.source;
  const core::ThreadPlan plan = core::current_thread_plan();
  EXPECT_EQ(fp32.flops, apps::cpu_rank_peak(fp32.per_core, plan, false, 1.0));
  EXPECT_GE(fp32.per_core, 1e9);
  EXPECT_LE(fp32.per_core, 64 * 10e9);
  // The measurement itself: the fastest thread is a core's rate, between the threads' mean and
  // their total.
  const core::CpuPeak cpu = core::measure_cpu_peak(core::HostThreads::shared());
  ASSERT_GT(cpu.threads, 0);
  EXPECT_GE(cpu.best_thread, cpu.fp32_flops / cpu.threads);
  EXPECT_LE(cpu.best_thread, cpu.fp32_flops);
  config.train.precision = core::GemmPrecision::bf16;
  EXPECT_EQ(apps::job_peak_flops(config, world).flops, fp32.flops);  // emulated: fp32 units
  config.hardware.gemm = "onednn";
  if (core::default_gemm_keeps_copy("onednn", core::GemmPrecision::bf16)) {
    EXPECT_EQ(apps::job_peak_flops(config, world).flops,
              fp32.flops * core::bf16_peak_multiple(core::host_bf16_hardware()));
  }
}
