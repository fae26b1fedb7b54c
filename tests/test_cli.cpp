// The programs as a user runs them: exit codes and messages for bad input (also under mpirun, where
// every rank must exit without hanging), and a short end-to-end run with its outputs.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "io/choice_file.hpp"
#include "io/hdf5_file.hpp"
#include "metrics_h5.hpp"
#include "run_program.hpp"
#include "io/metrics.hpp"

namespace {

using colossal::test::bin;
using colossal::test::Result;
using colossal::test::run;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    // A folder per ctest shard (GTEST_SHARD_INDEX): the shards run side by side.
    const char* shard = std::getenv("GTEST_SHARD_INDEX");
    dir = (std::filesystem::temp_directory_path() /
           ("colossal_cli" + std::string(shard ? "-shard" + std::string(shard) : ""))).string();
    std::filesystem::create_directories(dir);
    std::string text;
    for (int i = 0; i < 3000; ++i) text.push_back("the quick brown fox. "[i % 21]);
    std::ofstream(dir + "/data.txt") << text;
  }
  // A valid tiny config, with `extra` lines appended (YAML allows later keys only once, so tests
  // put variations in --set instead).
  std::string write_config(const std::string& name, const std::string& body = "") {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << (body.empty() ? default_body() : body);
    return path;
  }
  std::string default_body() const {
    return "model: {layers: 1, hidden: 16, heads: 2, vocab: 256, max_seq: 16}\n"
           "data: {path: " + dir + "/data.txt, val_path: " + dir + "/data.txt, val_windows: 4}\n"
           "train: {steps: 3, seq_len: 16, global_batch: 4, micro_batch: 2}\n"
           "eval: {every: 0}\n"
           "log: {every: 1, dir: " + dir + "/run}\n"
           "sample: {prompt: the, tokens: 8}\n";
  }
  std::string dir;
};

TEST_F(Cli, HelpOnEveryProgram) {
  for (const char* p : {"colossal_train", "colossal_eval", "colossal_generate", "colossal_plan"}) {
    const Result r = run(bin(p) + " --help");
    EXPECT_EQ(r.code, 0) << p;
    EXPECT_NE(r.output.find("usage: " + std::string(p)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("--set KEY=VALUE"), std::string::npos) << r.output;
  }
  // The benchmark takes no config; its flags are checked (an unknown --case printed an empty
  // table and exited 0).
  Result r = run(bin("colossal_bench") + " --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[--precision P]"), std::string::npos) << r.output;
  r = run(bin("colossal_bench") + " --case Tiny");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--case 'Tiny' is not a case (gpt2-124m, quickstart, tiny)"),
            std::string::npos)
      << r.output;
}

// colossal_plan describes a layout of 8 tensor ranks from one process.
TEST_F(Cli, PlanProfilesALayoutWithoutItsRanks) {
  const std::string config = write_config("plan.yaml");
  Result r = run(bin("colossal_plan") + " " + config +
                 " --profile --set parallel.tensor.size=2");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* part : {"tensor 2", "h.0.attn.qkv", "all_reduce(tp)", "lm_head", "total"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  r = run(bin("colossal_plan") + " " + config + " --profile --stage 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--stage: '3' must be an integer in [0, 0]"), std::string::npos)
      << r.output;
  // For a GPU, the schedule under checkpointing.memory_budget counts what the GPU's model holds
  // beyond the host's (the bf16 weights' copy, the 2048-row logits chunk): its memory stays
  // within the budget (3.3 GiB: it was solved for the host's and came to 4.00 GiB).
  const std::string gpt2 = write_config(
      "gpt2-budget.yaml", "model: {preset: gpt2-124m}\n"
                          "train: {seq_len: 1024, global_batch: 4, micro_batch: 4}\n"
                          "checkpointing: {policy: rotor, memory_budget: 3.3}\n");
  r = run(bin("colossal_plan") + " " + gpt2 + " --profile --hardware h100 --precision bf16");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::size_t total = r.output.find("(total ");
  ASSERT_NE(total, std::string::npos) << r.output;
  EXPECT_EQ(r.output.substr(total + 7 + r.output.substr(total + 7).find(' '), 5), " GiB)")
      << r.output;
  EXPECT_LE(std::stod(r.output.substr(total + 7)), 3.3) << r.output;
}

// The joint planner from the command line: a search for 8 devices of a GPU preset, its JSON, the
// config it writes (which colossal_train runs on the planned ranks), --evaluate of the config's
// own layout, a model that fits nowhere, and a calibration file that --hardware reads back.
TEST_F(Cli, PlanSearchesEvaluatesAndEmitsAConfigThatTrains) {
  const std::string config = write_config("search.yaml");
  Result r = run(bin("colossal_plan") + " " + config + " --gpus 8 --hardware a100-80g --top 3");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* part : {"searched", "layouts for 8 devices", "best:", "#2:", "lost by",
                           "as config blocks:", "parallel:"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  r = run(bin("colossal_plan") + " " + config + " --gpus 8 --hardware a100-80g --json");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* key : {"\"layout\"", "\"tensor\":", "\"zero_stage\":", "\"step_time_s\":",
                          "\"tflops_per_device\":", "\"mfu\":", "\"memory_bytes_per_device\":"}) {
    EXPECT_NE(r.output.find(key), std::string::npos) << key << "\n" << r.output;
  }
  // Two host ranks: the emitted config runs under mpirun -np 2 and trains.
  const std::string planned = dir + "/planned.yaml";
  r = run(bin("colossal_plan") + " " + config + " --gpus 2 --emit-yaml " + planned);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(planned));
  r = run("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 " +
          bin("colossal_train") + " " + planned + " --set sample.tokens=0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("== summary =="), std::string::npos) << r.output;
  // --evaluate scores the config's own layout; --json too.
  r = run(bin("colossal_plan") + " " + config + " --evaluate --set parallel.data=2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("the config's layout on 2 x host"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("data 2 x tensor 1"), std::string::npos) << r.output;
  // The config's gradient buckets are priced: smaller buckets, more all-reduce latencies.
  auto step_time = [&](const std::string& bucket_mb) {
    const Result j = run(bin("colossal_plan") + " " + config +
                         " --evaluate --json --set parallel.data=2 --set parallel.bucket_mb=" + bucket_mb);
    EXPECT_EQ(j.code, 0) << j.output;
    const std::size_t at = j.output.find("\"step_time_s\": ");
    return at == std::string::npos ? 0.0 : std::stod(j.output.substr(at + 15));
  };
  const double one_bucket = step_time("1e6"), small_buckets = step_time("0.001");
  EXPECT_GT(one_bucket, 0.0);
  EXPECT_GT(small_buckets, one_bucket);
  // Nothing fits (opt-13b would, with ZeRO-3 offloading 63/64 of its parameters): exit 2 with
  // the least memory and the closest layout.
  const std::string big = write_config(
      "big.yaml", "model: {preset: opt-66b}\ndata: {path: " + dir +
                      "/data.txt}\ntrain: {seq_len: 2048, global_batch: 8, micro_batch: 1}\n");
  r = run(bin("colossal_plan") + " " + big + " --gpus 2 --hardware v100");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no layout of 2 devices fits"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the closest needs"), std::string::npos) << r.output;
  // Bad flags.
  r = run(bin("colossal_plan") + " " + config + " --gpus zero");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--gpus: 'zero' must be an integer"), std::string::npos) << r.output;
  r = run(bin("colossal_plan") + " " + config + " --hardware tpu-v9");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("neither a preset"), std::string::npos) << r.output;
}

TEST_F(Cli, CalibrateWritesAHardwareFileThatPlansRead) {
  const std::string hw = dir + "/hw.yaml";
  // An --out it cannot write stops every rank before measuring (rank 1 waited in the link's
  // ping-pong for a rank 0 that had stopped alone).
  Result r = run("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 mpirun "
                 "-np 2 --oversubscribe " + bin("colossal_plan") + " --calibrate --out " + dir +
                 "/data.txt/hw.yaml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--out: cannot write '" + dir + "/data.txt/hw.yaml'"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("GEMM curve"), std::string::npos) << "measured first: " << r.output;
  r = run(bin("colossal_plan") + " --calibrate --out " + hw);
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(hw));
  // Each phase says what it measured as it ends; the file has the attention grids (3 x 3 each)
  // that the planner prices each attention's shape with.
  for (const char* phase : {"  GEMM curve, 7 linear layers", "  attention, 3 forms",
                            "  layernorm, GELU and AdamW"}) {
    EXPECT_NE(r.output.find(phase), std::string::npos) << phase << "\n" << r.output;
  }
  for (const char* curve : {"\nattention_curve:", "\nfused_attention_curve:",
                            "\nfused_attention_bf16_curve:"}) {
    const std::size_t at = r.output.find(curve);
    ASSERT_NE(at, std::string::npos) << curve << "\n" << r.output;
    const std::size_t end = r.output.find("\n", r.output.find("  - [2048, 128, ", at));
    ASSERT_NE(end, std::string::npos) << curve << ": no T = 2048, head width 128 point";
    int points = 0;
    for (std::size_t i = r.output.find("\n  - [", at); i < end;
         i = r.output.find("\n  - [", i + 1)) {
      ++points;
    }
    EXPECT_EQ(points, 9) << curve << "\n" << r.output;
  }
  // The bf16 products were measured too (the backend train.precision: bf16 would use): the
  // planner scales the fp32 curve by their rate.
  const auto bf16_at = r.output.find("bf16_tflops: ");
  ASSERT_NE(bf16_at, std::string::npos) << r.output;
  EXPECT_GT(std::stod(r.output.substr(bf16_at + 13)), 0.0) << r.output;
  const std::string config = write_config("calibrated.yaml");
  r = run(bin("colossal_plan") + " " + config + " --profile --set hardware.file=" + hw);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("calibrated by colossal_plan --calibrate"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("predicted step:"), std::string::npos) << r.output;
  std::ofstream(hw) << "name: broken\nfp32_tflops: fast\n";
  r = run(bin("colossal_plan") + " " + config + " --profile --set hardware.file=" + hw);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("fp32_tflops must be a number"), std::string::npos) << r.output;
}

TEST_F(Cli, MissingConfigFileAndNoConfigAreUsageErrors) {
  Result r = run(bin("colossal_train") + " " + dir + "/nope.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("nope.yaml"), std::string::npos) << r.output;
  r = run(bin("colossal_train"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("no config file given"), std::string::npos) << r.output;
  r = run(bin("colossal_train") + " " + write_config("ok.yaml") + " --bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("unknown option '--bogus'"), std::string::npos) << r.output;
}

TEST_F(Cli, ConfigErrorsNameKeyAndFix) {
  std::string body = default_body();
  body.replace(body.find("steps: 3"), 8, "stepz: 3");
  Result r = run(bin("colossal_train") + " " + write_config("typo.yaml", body));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("train.stepz"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean"), std::string::npos) << r.output;
  r = run(bin("colossal_train") + " " + write_config("ok.yaml") + " --set model.heads=3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("heads"), std::string::npos) << r.output;
}

TEST_F(Cli, DataErrorsNameTheKey) {
  Result r = run(bin("colossal_train") + " " + write_config("ok.yaml") + " --set data.path=" + dir +
                 "/missing.bin");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("data.path: cannot open"), std::string::npos) << r.output;
  std::ofstream(dir + "/short.txt") << "too short";
  r = run(bin("colossal_train") + " " + write_config("ok.yaml") + " --set data.val_path=" + dir +
          "/short.txt");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("data.val_path"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fewer than"), std::string::npos) << r.output;
  // Starting weights that are not there, or not weights, are a bad model file too (exit 3),
  // and the key is named once.
  for (const char* program : {"colossal_train", "colossal_eval"}) {
    r = run(bin(program) + " " + write_config("ok.yaml") + " --set model.init_from=" + dir +
            "/nothing.h5");
    EXPECT_EQ(r.code, 3) << program << r.output;
    EXPECT_NE(r.output.find("error: model.init_from: '" + dir + "/nothing.h5' does not exist"),
              std::string::npos) << program << r.output;
  }
  r = run(bin("colossal_eval") + " " + write_config("ok.yaml") + " --set model.init_from=" + dir +
          "/short.txt");
  EXPECT_EQ(r.code, 3) << r.output;
}

// Planning reads no data: colossal_plan takes a config without data.path, which colossal_train
// refuses, naming the key.
TEST_F(Cli, PlanNeedsNoDataButTrainingDoes) {
  std::string body = default_body();
  body.erase(body.find("data: {"), body.find("\n", body.find("data: {")) + 1 - body.find("data: {"));
  ASSERT_EQ(body.find("data"), std::string::npos) << body;
  const std::string config = write_config("nodata.yaml", body);
  Result r = run(bin("colossal_plan") + " " + config + " --profile");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("total"), std::string::npos) << r.output;
  const std::string planned = dir + "/nodata-planned.yaml";
  r = run(bin("colossal_plan") + " " + config + " --gpus 2 --emit-yaml " + planned);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(planned)) << r.output;
  r = run(bin("colossal_train") + " " + config);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("data.path: missing required key"), std::string::npos) << r.output;
  // A GPU cluster's config (parallel.comm: nccl) plans on a login node's CPU build too; only
  // running it there is refused.
  r = run(bin("colossal_plan") + " " + config + " --set parallel.comm=nccl --hardware h100" +
          " --gpus 8");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("searched "), std::string::npos) << r.output;
}

// A log.dir that cannot be created stops every rank, naming log.dir and the path.
TEST_F(Cli, AnUncreatableLogDirStopsEveryRank) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const Result r = run(mpirun + bin("colossal_train") + " " + write_config("ok.yaml") +
                       " --set parallel.data=2 --set log.dir=" + dir + "/data.txt/run");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("log.dir: cannot create or write '" + dir + "/data.txt/run'"),
            std::string::npos) << r.output;
  // A metrics file only rank 0 writes and cannot create (here a folder in the way; a full disk
  // alike) stops the other rank too, which waited for it in the first step's collectives.
  const std::string blocked = dir + "/blocked";
  std::filesystem::remove_all(blocked);
  std::filesystem::create_directories(blocked + "/metrics.h5.tmp/in-the-way");
  const Result m = run(mpirun + bin("colossal_train") + " " + write_config("ok.yaml") +
                       " --set parallel.data=2 --set log.dir=" + blocked);
  EXPECT_EQ(m.code, 1) << m.output;
  EXPECT_NE(m.output.find("error: log.dir: HDF5: creating '" + blocked + "/metrics.h5.tmp'"),
            std::string::npos) << m.output;
  // checkpoint.dir too, before the first step, not at the first checkpoint a thousand steps on.
  const std::string run_dir = dir + "/ckptdir";
  std::filesystem::remove_all(run_dir);
  const Result c = run(mpirun + bin("colossal_train") + " " + write_config("ok.yaml") +
                       " --set parallel.data=2 --set checkpoint.every=1000 --set log.dir=" +
                       run_dir + " --set checkpoint.dir=" + dir + "/data.txt/ckpt");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.code, 124) << "timed out: a rank hung";
  EXPECT_NE(c.output.find("checkpoint.dir: cannot create or write '" + dir + "/data.txt/ckpt'"),
            std::string::npos) << c.output;
  EXPECT_EQ(c.output.find("| loss "), std::string::npos) << "trained before failing: " << c.output;
  // The default checkpoint.dir is checked, not left behind empty in a run that writes none.
  const Result ok = run(bin("colossal_train") + " " + write_config("ok.yaml") + " --set log.dir=" +
                        run_dir + " --set train.steps=1 --set sample.tokens=0");
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/checkpoints"));
}

// log.save_model: false ends the run with its metrics and no model file; the export, which
// converts that file, is refused beside it with both keys named.
TEST_F(Cli, SaveModelFalseWritesOnlyTheMetrics) {
  Result r = run(bin("colossal_train") + " " + write_config("ok.yaml") +
                 " --set log.save_model=false --set log.dir=" + dir + "/nomodel");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/nomodel/model.h5"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/nomodel/metrics.csv"));
  std::ifstream finished(dir + "/nomodel/finished");  // what the sbatch scripts and sweeps read
  std::string line;
  ASSERT_TRUE(std::getline(finished, line)) << "no log.dir/finished";
  EXPECT_EQ(line, "step 3");
  EXPECT_NE(r.output.find("no model file (log.save_model: false)"), std::string::npos) << r.output;
  r = run(bin("colossal_train") + " " + write_config("ok.yaml") +
          " --set log.save_model=false --set log.export_hf=true --set log.dir=" + dir + "/nohf");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("log.export_hf: true needs the model file, but log.save_model is false"),
            std::string::npos)
      << r.output;
}

TEST_F(Cli, BadInputUnderMpirunExitsEveryRankWithoutHanging) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 4 "
      "--oversubscribe ";
  Result r = run(mpirun + bin("colossal_train") + " " + dir + "/nope.yaml");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("nope.yaml"), std::string::npos) << r.output;
  r = run(mpirun + bin("colossal_train") + " " + write_config("ok.yaml"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("4 ranks were started"), std::string::npos) << r.output;
}

// A layout the node cannot hold stops before anything is allocated, on every rank, with the memory
// plan and the one-key changes that would fit (apps/memory_fit.hpp); --memory-plan still reports.
TEST_F(Cli, ALayoutTooBigForTheNodeStopsBeforeAllocating) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  // About 150 GiB a rank of parameters and AdamW state: more than any machine this runs on.
  const std::string huge = " --set parallel.data=2 --set train.micro_batch=1 --set model.layers=48"
                           " --set model.hidden=4096 --set model.heads=32";
  const std::string config = write_config("huge.yaml");
  std::filesystem::remove_all(dir + "/run");
  Result r = run(mpirun + bin("colossal_train") + " " + config + huge);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("memory: the 2 ranks of this layout on node"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("nothing was allocated"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optimizer 72."), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("alone fits"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/run/metrics.csv")) << "a step ran";
  r = run(mpirun + bin("colossal_train") + " " + config + huge + " --memory-plan");
  EXPECT_EQ(r.code, 0) << r.output;
  // One rank told it has 1 MiB: the tiny config's smaller micro-batch does not fit either, and
  // the message says where the number came from.
  r = run("COLOSSAL_HOST_MEMORY_BYTES=1048576 " + bin("colossal_train") + " " + config);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("has 1.0 MiB (COLOSSAL_HOST_MEMORY_BYTES)"), std::string::npos)
      << r.output;
  // A value that is not a number of bytes is refused on every rank, not ignored.
  r = run("COLOSSAL_HOST_MEMORY_BYTES=12GB " + mpirun + bin("colossal_train") + " " + config +
          " --set parallel.data=2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("COLOSSAL_HOST_MEMORY_BYTES='12GB' is not a positive number"),
            std::string::npos)
      << r.output;
}

// model.fused_attention: auto is decided at start-up, alike on every rank: the faster by the
// cost model where both fit, the fused one where a device of
// hardware.device_memory_gib holds only its plan (on one rank and on two), and the dense one
// under ring attention.
TEST_F(Cli, FusedAttentionAutoIsDecidedAtStartUp) {
  const std::string config = write_config(
      "auto_attention.yaml",
      "model: {layers: 1, hidden: 32, heads: 4, vocab: 256, max_seq: 1024, fused_attention: auto}\n"
      "data: {path: " + dir + "/data.txt}\n"
      "train: {steps: 2, seq_len: 1024, global_batch: 8, micro_batch: 4}\n"
      "eval: {every: 0}\nlog: {every: 1, dir: " + dir + "/run}\nsample: {tokens: 0}\n");
  const std::string train = bin("colossal_train") + " " + config;
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  auto peak = [&](const std::string& fused) {  // --memory-plan's bytes of the largest rank
    const Result r = run(train + " --memory-plan --set model.fused_attention=" + fused);
    EXPECT_EQ(r.code, 0) << r.output;
    const std::size_t at = r.output.find(" bytes)\n");
    if (at == std::string::npos) return -1.0;
    const std::size_t open = r.output.rfind('(', at);
    return std::stod(r.output.substr(open + 1, at - open - 1));
  };
  const double dense = peak("false"), fused = peak("true");
  ASSERT_GT(dense, fused + 64.0 * 1024 * 1024) << "the probabilities: 4 x 4 x 1024^2 floats";
  // Both fit: the faster by the host preset's rates (a tie: the smaller), and the model runs it.
  Result r = run(train);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string decided = "attention (model.fused_attention: auto): ";
  const std::size_t at = r.output.find(decided);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string word = r.output.substr(at + decided.size(), 5);
  ASSERT_TRUE(word == "dense" || word == "fused") << r.output;
  EXPECT_NE(r.output.find("\nattention: " + word), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("does not fit"), std::string::npos) << r.output;
  // ZeRO on one rank shards nothing but runs: it is costed like any layout.
  r = run(train + " --set parallel.zero.stage=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(decided + word + " (predicted"), std::string::npos) << r.output;
  char cap[64];
  std::snprintf(cap, sizeof cap, " --set hardware.device_memory_gib=%.6f",
                (dense + fused) / 2 / (1024.0 * 1024 * 1024));
  for (const std::string& launch : {std::string(), mpirun}) {
    r = run(launch + train + cap + (launch.empty() ? "" : " --set parallel.data=2"));
    ASSERT_EQ(r.code, 0) << r.output;
    const std::string line = "attention (model.fused_attention: auto): fused (predicted";
    const std::size_t at = r.output.find(line);
    EXPECT_NE(at, std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(line, at + 1), std::string::npos) << "printed by rank 0 only";
    EXPECT_NE(r.output.find("does not fit"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\nattention: fused"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("== summary =="), std::string::npos) << r.output;
  }
  r = run(mpirun + train + " --set parallel.sequence=2 --set train.global_batch=4" + cap);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("attention (model.fused_attention: auto): dense (ring attention "
                          "(parallel.sequence 2)"),
            std::string::npos)
      << r.output;
}

// A hardware preset far from this machine's speed (an H200's rates for a CPU run) is named at the
// end of the run with the command that measures this machine instead.
TEST_F(Cli, AFarOffPresetPointsToCalibration) {
  const Result r = run(bin("colossal_train") + " " + write_config("preset.yaml") +
                       " --set hardware.preset=h200");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("cost model: hardware.preset h200 is off by more than half here; "
                          "'colossal_plan --calibrate --out hw.yaml'"),
            std::string::npos)
      << r.output;
}

// --memory-plan with ZeRO offload also names the largest rank's bytes without its offloaded
// (pinned host) ones: what a GPU holds, which offload.policy: auto and its caps are about.
TEST_F(Cli, MemoryPlanNamesTheBytesLeftOnTheDevice) {
  const std::string config = write_config("offload_plan.yaml");
  auto bytes = [](const std::string& out, const std::string& tail) -> double {
    const std::size_t at = out.find(tail);
    if (at == std::string::npos) return -1.0;
    const std::size_t open = out.rfind('(', at);
    return std::stod(out.substr(open + 1, at - open - 1));
  };
  Result r = run(bin("colossal_train") + " " + config + " --memory-plan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("without its offloaded"), std::string::npos) << r.output;
  const double kept = bytes(r.output, " bytes)\n");
  r = run(bin("colossal_train") + " " + config +
          " --set parallel.zero.stage=3 --set parallel.zero.offload.optimizer=true"
          " --set parallel.zero.offload.params=true --memory-plan");
  ASSERT_EQ(r.code, 0) << r.output;
  const double total = bytes(r.output, " bytes)\n"),
               device = bytes(r.output, " bytes) without its offloaded (host) bytes");
  ASSERT_GT(device, 0.0) << r.output;
  EXPECT_LT(device, total);
  EXPECT_LT(device, kept) << "offloading everything leaves less on the device";
}

// colossal_plan prices bf16 as colossal_train runs it (fp32 weights and optimizer, bf16
// operands): its --evaluate, its --precision bf16 and the trainer's --memory-plan agree to the
// byte. It priced Megatron's 2-byte storage before (137.3 MiB against 172.4 at the quickstart).
TEST_F(Cli, PlanPricesBf16AsTheTrainerRunsIt) {
  const std::string config = write_config("bf16_plan.yaml");
  const Result trained =
      run(bin("colossal_train") + " " + config + " --set train.precision=bf16 --memory-plan");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::size_t at = trained.output.find("memory plan (rank 0): ");
  ASSERT_NE(at, std::string::npos) << trained.output;
  // "params X, grads Y, ... (peak total Z)": the categories, the same words in both programs.
  const std::string categories =
      trained.output.substr(at + 22, trained.output.find(" (peak total", at) - at - 22);
  for (const std::string how : {" --set train.precision=bf16", " --precision bf16"}) {
    const Result planned = run(bin("colossal_plan") + " " + config + how + " --evaluate");
    ASSERT_EQ(planned.code, 0) << planned.output;
    EXPECT_NE(planned.output.find("memory per device " + categories), std::string::npos)
        << how << "\ntrainer: " << categories << "\n" << planned.output;
  }
}

// parallel.tensor.mode 2d under mpirun -np 4: it trains, writes the model file, the end-of-run
// sample and a checkpoint that one rank in 1d resumes, and --memory-plan predicts its tracked
// peak; --profile-steps prints its table, --trace writes every rank's spans and --eval-only
// prints the validation loss the run ended with.
TEST_F(Cli, TensorMode2dRunsUnderMpirunWithProfileTraceAndEvalOnly) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 4 "
      "--oversubscribe ";
  const std::string grid = " --set parallel.tensor.size=4 --set parallel.tensor.mode=2d";
  const std::string config = write_config("ok.yaml");
  Result r = run(mpirun + bin("colossal_train") + " " + config + grid +
                 " --set checkpoint.every=1000 --set log.dir=" + dir + "/md");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::size_t val = r.output.find("val loss ");
  ASSERT_NE(val, std::string::npos) << r.output;
  const std::string val_line = r.output.substr(val, r.output.find('\n', val) - val);
  // The sample is what colossal_generate makes of the written weights (prompt, tokens,
  // temperature 0.8 and train.seed 1234 as the config has them).
  const std::string header = "sample (8 tokens after \"the\"):\n";
  const std::size_t sample_at = r.output.find(header);
  ASSERT_NE(sample_at, std::string::npos) << r.output;
  const std::string sample = r.output.substr(sample_at + header.size(), 3 + 8);  // "the" + 8
  EXPECT_EQ(sample.substr(0, 3), "the");
  const Result generated = run(bin("colossal_generate") + " " + config + grid +
                               " --set parallel.tensor.size=1 --set parallel.tensor.mode=1d"
                               " --weights " + dir + "/md/model.h5 --prompt the --tokens 8"
                               " --temperature 0.8 --seed 1234");
  ASSERT_EQ(generated.code, 0) << generated.output;
  EXPECT_NE(generated.output.find(sample), std::string::npos)
      << "trainer: '" << sample << "'\n" << generated.output;
  const std::size_t at = r.output.find("tracked peak ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string peak = r.output.substr(at + 13, r.output.find(',', at) - at - 13);
  EXPECT_NE(r.output.find("mode: 2d}  # 2 x 2 grid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tensor-parallel traffic (rank 0):"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/md/model.h5"));
  // The last step's checkpoint; resumed by one rank in 1d, with nothing left to train.
  EXPECT_NE(r.output.find("checkpoint " + dir + "/md/checkpoints/ckpt-"), std::string::npos)
      << r.output;
  r = run(bin("colossal_train") + " " + config + " --set sample.tokens=0 --set log.dir=" + dir +
          "/md --set checkpoint.resume=auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir + "/md/checkpoints/ckpt-"), std::string::npos)
      << r.output;
  // --memory-plan allocates nothing and names the tracked peak the run had.
  r = run(mpirun + bin("colossal_train") + " " + config + grid + " --memory-plan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("memory plan (every rank, 2d): "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("largest rank needs " + peak + " ("), std::string::npos)
      << peak << "\n" << r.output;
  // Activation checkpointing (full: each block recomputed) trains the same run, bitwise: the
  // same final validation loss; its --memory-plan (a dry-run trainer) is its tracked peak.
  const std::string full = " --set checkpointing.policy=full";
  r = run(mpirun + bin("colossal_train") + " " + config + grid + full + " --set log.dir=" + dir +
          "/md_full");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("activation checkpointing: full"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(val_line), std::string::npos) << val_line << "\n" << r.output;
  const std::size_t full_at = r.output.find("tracked peak ");
  ASSERT_NE(full_at, std::string::npos) << r.output;
  const std::string full_peak =
      r.output.substr(full_at + 13, r.output.find(',', full_at) - full_at - 13);
  EXPECT_NE(full_peak, peak) << "checkpointing moved no memory";
  r = run(mpirun + bin("colossal_train") + " " + config + grid + full + " --memory-plan");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("largest rank needs " + full_peak + " ("), std::string::npos)
      << full_peak << "\n" << r.output;
  // --profile-steps, --trace and --eval-only run on the shared trainer as in 1d.
  r = run(mpirun + bin("colossal_train") + " " + config + grid + " --profile-steps 2" +
          " --set log.dir=" + dir + "/md_profile");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* kind : {"profile of 2 steps", "GEMM", "attention", "layernorm", "optimizer",
                           "communication", "ms per step", "predicted ms"}) {
    EXPECT_NE(r.output.find(kind), std::string::npos) << kind << "\n" << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/md_profile/model.h5")) << "a profile writes none";
  r = run(mpirun + bin("colossal_train") + " " + config + grid + " --trace " + dir + "/trace2d" +
          " --set log.dir=" + dir + "/md_trace");
  ASSERT_EQ(r.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(dir + "/trace2d.rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(in) << "no trace for rank " << rank;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.rfind("{\"traceEvents\": [", 0), 0u);
    auto count = [&](const std::string& what) {
      std::size_t n = 0;
      for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    // 3 steps x 2 micro-batches, each forward and backward once on every rank of the grid.
    EXPECT_EQ(count("\"cat\": \"forward\""), 6u) << text;
    EXPECT_EQ(count("\"cat\": \"backward\""), 6u);
    EXPECT_EQ(count("\"cat\": \"optimizer\""), 3u);
  }
  // --eval-only on the trained weights prints the validation loss the run ended with.
  r = run(mpirun + bin("colossal_train") + " " + config + grid + " --eval-only --weights " + dir +
          "/md/model.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(val_line), std::string::npos) << val_line << "\n" << r.output;
  EXPECT_EQ(r.output.find("validation: "), std::string::npos) << "4 windows are 2 micro-batches";
  // 5 windows are not whole micro-batches of 2: the one left out is said, once.
  r = run(mpirun + bin("colossal_train") + " " + config + grid + " --set data.val_windows=5" +
          " --eval-only --weights " + dir + "/md/model.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("validation: 4 of 5 windows (2d evaluates whole micro-batches of 2 per "
                          "replica), so its val loss is not a 1d run's or colossal_eval's"),
            std::string::npos)
      << r.output;
}

// hardware.gemm: cublas where it cannot run (no CUDA build, or no GPU visible) stops every rank
// with the key named and a host backend to use instead, without hanging.
TEST_F(Cli, CublasWithoutAGpuIsRefusedOnEveryRank) {
  const Result r = run(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe " + bin("colossal_train") + " " + write_config("ok.yaml") +
      " --set parallel.data=2 --set hardware.gemm=cublas --set train.precision=bf16 --set "
      "log.dir=" + dir + "/cublas");
  if (r.code == 0) GTEST_SKIP() << "a GPU is visible here: cublas runs";
  EXPECT_NE(r.code, 124) << "timed out: a rank hung";
  EXPECT_NE(r.output.find("hardware.gemm"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("openblas"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/cublas/model.h5"));
}

// Two ranks started on one core (taskset, mpirun not binding them elsewhere): the start-up says
// they take turns and pins them there, and the cost model's step includes the wait for the
// shared core (planner::pinned_step; with COLOSSAL_PIN_RANKS=0, planner::share_cores).
TEST_F(Cli, RanksSharingOneCoreAreToldAndPriced) {
  if (run("taskset -c 0 true").code != 0) GTEST_SKIP() << "no taskset here";
  const auto wait_for_cores = [](const Result& r) {
    const std::string key = "waiting for shared cores ";
    const std::size_t at = r.output.find(key);
    return at == std::string::npos ? -1.0 : std::stod(r.output.substr(at + key.size()));
  };
  const std::string command =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 taskset -c 0 mpirun "
      "-np 2 --oversubscribe --bind-to none " + bin("colossal_train") + " " + write_config("ok.yaml") +
      " --set parallel.data=2 --set sample.tokens=0 --set log.dir=" + dir + "/shared";
  Result r = run(command);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("threads: oversubscribed, 2 ranks x 1 thread(s) take turns on 1 core;"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ranks pinned round-robin to the cores (no binding was given): this "
                          "node's ranks on cores 0 0;"),
            std::string::npos) << r.output;
  EXPECT_GT(wait_for_cores(r), 0.0) << r.output;
  r = run("COLOSSAL_PIN_RANKS=0 " + command);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("ranks pinned"), std::string::npos) << r.output;
  EXPECT_GT(wait_for_cores(r), 0.0) << r.output;
}

// Four unbound ranks on two cores: pinned alternately, so each pipeline stage's two data
// replicas run on different cores; ranks bound by mpirun are left where they are.
TEST_F(Cli, RanksOutnumberingTheCoresArePinnedRoundRobin) {
  // taskset keeps the CPUs that exist: on one CPU "-c 0,1" runs on one.
  if (run("test \"$(taskset -c 0,1 nproc)\" = 2").code != 0) GTEST_SKIP() << "fewer than 2 cores";
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 taskset -c 0,1 mpirun "
      "-np 4 --oversubscribe ";
  const std::string config = write_config("ok.yaml");
  const std::string args = " " + config +
                           " --set parallel.data=2 --set parallel.pipeline.size=2 "
                           "--set model.layers=2 --set train.micro_batch=1 --set sample.tokens=0 "
                           "--set log.dir=" + dir + "/pinned";
  Result r = run(mpirun + "--bind-to none " + bin("colossal_train") + args);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("this node's ranks on cores 0 1 0 1;"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("from one core each: more ranks than cores, pinned round-robin"),
            std::string::npos) << r.output;
  r = run(mpirun + "--bind-to core:overload-allowed " + bin("colossal_train") + args);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("ranks pinned"), std::string::npos) << r.output;
}

TEST_F(Cli, DataParallelRunUnderMpirunAndItsBadInput) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config("ok.yaml");
  Result r = run(mpirun + bin("colossal_train") + " " + config +
                 " --set parallel.data=2 --set parallel.zero.stage=1 --set log.dir=" + dir + "/dp");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("parallel: 2 data-parallel ranks, ZeRO stage 1"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("== summary =="), r.output.rfind("== summary ==")) << "rank 0 reports alone";
  EXPECT_TRUE(std::filesystem::exists(dir + "/dp/model.h5"));
  r = run(mpirun + bin("colossal_train") + " " + config + " --set parallel.data=2");
  EXPECT_EQ(r.code, 0) << r.output;
  r = run(mpirun + bin("colossal_train") + " " + config + " --set parallel.data=4 --set train.global_batch=8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("needs 4 ranks but 2 ranks were started"), std::string::npos) << r.output;
  for (const char* bad : {"parallel.zero.stage=4", "parallel.zero.stage=-1", "parallel.bucket_mb=0",
                          "parallel.zero.offload.optimizer=true", "parallel.zero.offload.params=true"}) {
    r = run(mpirun + bin("colossal_train") + " " + config + " --set parallel.data=2 --set " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
  }
  r = run(mpirun + bin("colossal_train") + " " + config +
          " --set parallel.data=2 --set train.global_batch=6 --set train.micro_batch=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("parallel.data * train.micro_batch"), std::string::npos) << r.output;
  // Parameter offload needs the host optimizer too.
  r = run(mpirun + bin("colossal_train") + " " + config +
          " --set parallel.data=2 --set parallel.zero.stage=3 --set parallel.zero.offload.params=true");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("parallel.zero.offload.optimizer: true"), std::string::npos) << r.output;
}

// Tensor parallelism end to end: a tp2 run writes the logical model (one rank evaluates it to the
// same loss), and greedy generation under tp2 (full-vocabulary logits gathered from the two
// vocabulary halves) continues the prompt exactly as one rank does, with the KV cache as
// without it.
TEST_F(Cli, TensorParallelRunSavesTheLogicalModelAndGeneratesAlike) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config("tp.yaml");
  const std::string tp2 = " --set parallel.tensor.size=2 --set model.vocab_multiple=100";
  Result r = run(mpirun + bin("colossal_train") + " " + config + tp2 + " --set log.dir=" + dir +
                 "/tp");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 tensor-parallel ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("vocabulary padded to 400"), std::string::npos) << r.output;
  const std::size_t at = r.output.find("val loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double trained = std::stod(r.output.substr(at + 9));
  const std::string weights = dir + "/tp/model.h5";
  r = run(bin("colossal_eval") + " " + config + " --weights " + weights);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NEAR(std::stod(r.output.substr(r.output.find("val loss ") + 9)), trained, 1e-5 * trained);
  const std::string gen = " --weights " + weights + " --prompt the --tokens 12 --temperature 0";
  const Result one = run(bin("colossal_generate") + " " + config + gen);
  ASSERT_EQ(one.code, 0) << one.output;
  // The text on stdout; the summary line on stderr (under mpirun the two streams are forwarded
  // apart, so the line may come first): the output without it is the text.
  const auto text_of = [](const Result& r) {
    const std::size_t at = r.output.find("colossal_generate: 12 tokens in ");
    if (at == std::string::npos) return r.output;
    return r.output.substr(0, at) + r.output.substr(r.output.find('\n', at) + 1);
  };
  EXPECT_NE(one.output.find("\ncolossal_generate: 12 tokens in "), std::string::npos)
      << one.output;
  EXPECT_NE(one.output.find(" tokens/s; KV cache over the train.seq_len window)"),
            std::string::npos)
      << one.output;
  const std::string text = text_of(one);
  EXPECT_EQ(text.rfind("the", 0), 0u) << one.output;
  // Without the cache every token is a forward over the whole window: the same text.
  const Result whole = run(bin("colossal_generate") + " " + config + gen + " --no-cache");
  ASSERT_EQ(whole.code, 0) << whole.output;
  EXPECT_NE(whole.output.find("--no-cache: each a forward over the train.seq_len window)"),
            std::string::npos)
      << whole.output;
  EXPECT_EQ(text_of(whole), text) << whole.output;
  const Result two = run(mpirun + bin("colossal_generate") + " " + config + gen + tp2);
  ASSERT_EQ(two.code, 0) << two.output;
  EXPECT_EQ(text_of(two), text) << two.output;
  // Ring self-attention: the last prompt position's logits come from the rank holding it.
  const Result ring = run(mpirun + bin("colossal_generate") + " " + config + gen +
                          " --set parallel.sequence=2");
  ASSERT_EQ(ring.code, 0) << ring.output;
  EXPECT_EQ(text_of(ring), text) << ring.output;
  // Sampling controls: top_k 1 is greedy at any temperature; a drawn stop token ends the text
  // (and is printed); --samples prints independent texts after a line of dashes.
  const std::string weighted = " --weights " + weights + " --prompt the --tokens 12";
  const Result top1 =
      run(bin("colossal_generate") + " " + config + weighted + " --temperature 5 --top-k 1");
  ASSERT_EQ(top1.code, 0) << top1.output;
  EXPECT_EQ(text_of(top1), text) << top1.output;
  ASSERT_GT(text.size(), 4u);
  const Result stopped = run(bin("colossal_generate") + " " + config + gen + " --stop-token " +
                             std::to_string(int(static_cast<unsigned char>(text[3]))));
  ASSERT_EQ(stopped.code, 0) << stopped.output;
  EXPECT_EQ(stopped.output.rfind(text.substr(0, 4) + "\n", 0), 0u) << stopped.output;
  EXPECT_NE(stopped.output.find("colossal_generate: 1 token in "), std::string::npos)
      << stopped.output;
  EXPECT_NE(stopped.output.find("a stop token (--stop-token) ended the text early"),
            std::string::npos)
      << stopped.output;
  const Result two_texts = run(bin("colossal_generate") + " " + config + weighted +
                               " --temperature 1 --top-p 0.9 --samples 2 --seed 3");
  ASSERT_EQ(two_texts.code, 0) << two_texts.output;
  const std::size_t dashes = two_texts.output.find("\n---------------\nthe");
  EXPECT_EQ(two_texts.output.rfind("the", 0), 0u) << two_texts.output;
  EXPECT_NE(dashes, std::string::npos) << two_texts.output;
  EXPECT_NE(two_texts.output.find("colossal_generate: 24 tokens (2 samples) in "),
            std::string::npos)
      << two_texts.output;
  // The texts without colossal_generate's summary lines (stderr: anywhere under mpirun).
  const auto texts_of = [](const Result& r) {
    std::string out;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("colossal_generate: ", 0) != 0) out += line + "\n";
    }
    return out;
  };
  // Under tensor parallelism every rank draws world rank 0's token, so the ranks stop together,
  // with one rank's texts.
  const std::string stop_sets = weighted + " --temperature 1 --top-p 0.9 --samples 2 --seed 3" +
                                " --stop-token " +
                                std::to_string(int(static_cast<unsigned char>(text[3])));
  const Result one_stopped = run(bin("colossal_generate") + " " + config + stop_sets);
  ASSERT_EQ(one_stopped.code, 0) << one_stopped.output;
  const Result two_stopped = run(mpirun + bin("colossal_generate") + " " + config + stop_sets +
                                 tp2);
  ASSERT_EQ(two_stopped.code, 0) << two_stopped.output;
  EXPECT_NE(two_stopped.output.find("\n---------------\nthe"), std::string::npos)
      << two_stopped.output;
  EXPECT_EQ(texts_of(two_stopped), texts_of(one_stopped)) << two_stopped.output;
  // The 2d grid samples on rank 0 alone: a bad stop token is refused on every rank (no hang).
  const std::string four =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 4 "
      "--oversubscribe ";
  r = run(four + bin("colossal_generate") + " " + config + weighted +
          " --set parallel.tensor.size=4 --set parallel.tensor.mode=2d --samples 2"
          " --stop-token 300");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--stop-token: token 300 is outside"), std::string::npos) << r.output;
  // ... and samples every text there, the same as one rank's.
  const Result grid_texts = run(four + bin("colossal_generate") + " " + config + weighted +
                                " --set parallel.tensor.size=4 --set parallel.tensor.mode=2d"
                                " --temperature 1 --top-p 0.9 --samples 2 --seed 3");
  ASSERT_EQ(grid_texts.code, 0) << grid_texts.output;
  EXPECT_NE(grid_texts.output.find("colossal_generate: 24 tokens (2 samples) in "),
            std::string::npos)
      << grid_texts.output;
  EXPECT_EQ(texts_of(grid_texts), texts_of(two_texts)) << grid_texts.output;
  r = run(bin("colossal_generate") + " " + config + gen + " --top-p 1.5");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--top-p: '1.5' is outside (0, 1]"), std::string::npos) << r.output;
  r = run(bin("colossal_generate") + " " + config + gen + " --stop-token 10,300");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--stop-token: token 300 is outside the model's vocabulary"),
            std::string::npos)
      << r.output;
  // 4 ranks for tensor 2 x data 1: the message names every size and the fix.
  r = run(mpirun + bin("colossal_train") + " " + config + tp2 + " --set parallel.data=2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("x parallel.tensor.size = 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("needs 4 ranks but 2 ranks were started"), std::string::npos) << r.output;
}

// Pipeline end to end: two stages train with a trace per rank (forward and backward spans of
// every micro-batch), and a stage that fails mid-step takes every rank down with an error
// instead of leaving the other stage waiting for its activations.
TEST_F(Cli, PipelineRunTracesEachRankAndAFailedStageStopsTheJob) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config(
      "pp.yaml",
      "model: {layers: 2, hidden: 16, heads: 2, vocab: 256, max_seq: 16}\n"
      "data: {path: " + dir + "/data.txt, val_path: " + dir + "/data.txt, val_windows: 4}\n"
      "train: {steps: 3, seq_len: 16, global_batch: 4, micro_batch: 2}\n"
      "parallel: {pipeline: {size: 2, schedule: 1f1b}}\n"
      "eval: {every: 0}\nlog: {every: 1, dir: " + dir + "/pp}\nsample: {prompt: the, tokens: 4}\n");
  Result r = run(mpirun + bin("colossal_train") + " " + config + " --trace " + dir + "/trace");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 pipeline stages (1f1b schedule; blocks per stage [1, 1]"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir + "/trace.rank" + std::to_string(rank) + ".json");
    ASSERT_TRUE(in) << "no trace for rank " << rank;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.rfind("{\"traceEvents\": [", 0), 0u);
    auto count = [&](const std::string& what) {
      std::size_t n = 0;
      for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
      return n;
    };
    // 3 steps x 2 micro-batches, each forward and backward once on each stage.
    EXPECT_EQ(count("\"cat\": \"forward\""), 6u) << text;
    EXPECT_EQ(count("\"cat\": \"backward\""), 6u);
    EXPECT_EQ(count("\"cat\": \"optimizer\""), 3u);
    EXPECT_EQ(count("\"cat\": \"receive\""), 6u) << "stage 0 receives gradients, 1 activations";
  }
  // An unwritable trace path fails before training, on every rank, without hanging.
  r = run(mpirun + bin("colossal_train") + " " + config + " --trace " + dir + "/no/such/dir/t");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--trace: cannot write"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step      1/"), std::string::npos) << "trained before failing";
  r = run("COLOSSAL_INJECT_FAILURE=1:2 " + mpirun + bin("colossal_train") + " " + config);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: a stage hung waiting for the failed one";
  EXPECT_NE(r.output.find("injected failure on pipeline stage 1 at step 2"), std::string::npos)
      << r.output;
}

// Slurm pre-emption: SIGUSR1 to mpirun (which forwards it to every rank) finishes the step,
// writes a checkpoint and exits 0; the resumed run continues from it and appends to metrics.csv.
TEST_F(Cli, SignalWritesACheckpointAndResumeContinues) {
  const std::string mpi =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config("sig.yaml");
  const std::string run_dir = dir + "/sig";
  std::filesystem::remove_all(run_dir);
  const std::string args = " --set parallel.data=2 --set train.steps=100000 --set log.dir=" +
                           run_dir + " --set checkpoint.resume=auto";
  // mpirun in the background (no `timeout` in between, so $! is mpirun, which forwards SIGUSR1 to
  // the ranks); a guard kills it after 120 s. Wait for a few steps of metrics, then signal it.
  const std::string script =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " +
      bin("colossal_train") + " " + config + args + " > " + dir + "/sig.out 2>&1 & pid=$!; "
      "(sleep 120; kill -KILL $pid) > /dev/null 2>&1 & guard=$!; "
      "for i in $(seq 600); do n=$(wc -l < " + run_dir + "/metrics.csv 2>/dev/null || echo 0); "
      "[ \"$n\" -gt 5 ] && break; sleep 0.1; done; kill -USR1 $pid; wait $pid; rc=$?; "
      "kill $guard 2> /dev/null; cat " + dir + "/sig.out; exit $rc";
  Result r = run(script);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped at step"), std::string::npos) << r.output;
  const std::size_t at = r.output.find("stopped at step ");
  ASSERT_NE(at, std::string::npos);
  const long stopped = std::stol(r.output.substr(at + 16));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/ckpt-" + std::to_string(stopped) +
                                      ".h5"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/latest"));
  // Resume for two more steps (a shorter run: the schedule changes, the model does not).
  r = run(mpi + bin("colossal_train") + " " + config + args + " --set train.steps=" +
          std::to_string(stopped + 2));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + run_dir + "/checkpoints/ckpt-" +
                          std::to_string(stopped) + ".h5 at step " + std::to_string(stopped)),
            std::string::npos)
      << r.output;
  std::ifstream metrics(run_dir + "/metrics.csv");
  std::string line;
  int header = 0, rows = 0;
  while (std::getline(metrics, line)) (line.rfind("step,", 0) == 0 ? header : rows)++;
  EXPECT_EQ(header, 1) << "appended without a second header";
  EXPECT_EQ(rows, stopped + 2);
}

// A finished run submitted again with resume: auto trains nothing and says so (it printed
// 0 tokens/s losses of 0 and an MFU in the millions); a checkpoint past train.steps is an error
// naming both keys; --weights outside --eval-only is refused, not ignored.
TEST_F(Cli, ResumingAFinishedRunTrainsNothingAndSaysSo) {
  const std::string config = write_config("again.yaml");
  const std::string run_dir = dir + "/again";
  std::filesystem::remove_all(run_dir);
  const std::string args = " --set log.dir=" + run_dir + " --set checkpoint.every=2" +
                           " --set checkpoint.resume=auto --set sample.tokens=0";
  Result r = run(bin("colossal_train") + " " + config + args + " --set train.steps=4");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(bin("colossal_train") + " " + config + args + " --set train.steps=4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing left to train"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no step run: the checkpoint was at step 4 = train.steps"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("MFU "), std::string::npos) << "an MFU of no step: " << r.output;
  EXPECT_EQ(r.output.find("throughput"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/finished"));
  r = run(bin("colossal_train") + " " + config + args + " --set train.steps=3");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("checkpoint.resume: the checkpoint is at step 4, past train.steps: "
                          "3; set train.steps >= 4"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/finished")) << "a refused resume unfinished it";
  r = run(bin("colossal_train") + " " + config + " --weights " + run_dir + "/model.h5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--weights is read with --eval-only only; to train from a model file, "
                          "set model.init_from"),
            std::string::npos)
      << r.output;
}

// A rank killed mid-run (SIGKILL, as a node failure would): the job ends with an error instead of
// hanging, the checkpoint directory holds intact checkpoints, and resume: auto continues.
TEST_F(Cli, AKilledRankEndsTheJobAndResumeContinuesFromTheLastCheckpoint) {
  const std::string config = write_config("kill.yaml");
  const std::string run_dir = dir + "/kill";
  std::filesystem::remove_all(run_dir);
  const std::string args = " --set parallel.data=2 --set train.steps=100000 --set log.dir=" +
                           run_dir + " --set checkpoint.every=3 --set checkpoint.resume=auto";
  // Kill the first rank (a child of mpirun, found through /proc) after some steps; a guard kills
  // mpirun after 120 s and leaves a file saying so.
  const std::string script =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " +
      bin("colossal_train") + " " + config + args + " > " + dir + "/kill.out 2>&1 & pid=$!; "
      "(sleep 120; touch " + dir + "/kill.hung; kill -KILL $pid) > /dev/null 2>&1 & guard=$!; "
      "for i in $(seq 600); do n=$(wc -l < " + run_dir + "/metrics.csv 2>/dev/null || echo 0); "
      "[ \"$n\" -gt 8 ] && break; sleep 0.1; done; "
      "for p in /proc/[0-9]*; do [ \"$(cut -d' ' -f4 $p/stat 2>/dev/null)\" = \"$pid\" ] && "
      "{ kill -KILL ${p#/proc/}; break; }; done; "
      "wait $pid; rc=$?; kill $guard 2> /dev/null; exit $rc";
  std::filesystem::remove(dir + "/kill.hung");
  Result r = run(script);
  EXPECT_NE(r.code, 0) << "the job must fail when a rank dies";
  EXPECT_FALSE(std::filesystem::exists(dir + "/kill.hung"))
      << "the surviving rank hung until the guard killed mpirun";
  // The kill may land during a checkpoint write: its temporary file may remain, but every
  // ckpt-*.h5 is whole and `latest` names one of them.
  int checkpoints = 0;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/checkpoints")) {
    if (entry.path().extension() == ".h5") ++checkpoints;
  }
  EXPECT_GE(checkpoints, 1);
  // Resume: from the newest intact checkpoint, two more steps.
  std::ifstream latest(run_dir + "/checkpoints/latest");
  std::string name;
  latest >> name;
  const long step = std::stol(name.substr(5));  // ckpt-<step>.h5
  r = run("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
          "--oversubscribe " + bin("colossal_train") + " " + config + args +
          " --set train.steps=" + std::to_string(step + 2));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + run_dir + "/checkpoints/" + name), std::string::npos)
      << r.output;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/checkpoints")) {
    EXPECT_NE(entry.path().extension(), ".tmp") << "a stale temporary file survived the resume";
  }
}

// A rank killed half-way through writing a checkpoint (the writer, rank 0): the job ends with an
// error, the half-written file is never taken for a checkpoint, `latest` still names the previous
// one, and resume: auto continues from it (removing the leftover).
TEST_F(Cli, AKillDuringACheckpointWriteLeavesThePreviousCheckpoint) {
  const std::string config = write_config("killwrite.yaml");
  const std::string run_dir = dir + "/killwrite";
  std::filesystem::remove_all(run_dir);
  const std::string args = " --set parallel.data=2 --set train.steps=8 --set log.dir=" + run_dir +
                           " --set checkpoint.every=2 --set checkpoint.resume=auto";
  const std::string mpi =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe " + bin("colossal_train") + " " + config + args;
  Result r = run("COLOSSAL_INJECT_KILL_IN_CHECKPOINT=4 " + mpi);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, 124) << "the surviving rank hung until timeout ended it\n" << r.output;
  const std::string ckpt = run_dir + "/checkpoints";
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/ckpt-2.h5"));
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/ckpt-4.h5")) << "a half-written checkpoint";
  std::ifstream latest(ckpt + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "ckpt-2.h5");
  r = run(mpi);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + ckpt + "/ckpt-2.h5"), std::string::npos) << r.output;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) {
    EXPECT_NE(entry.path().extension(), ".tmp") << "the half-written file survived the resume";
  }
}

// A pipeline stage that stops responding (a wedged node): the watchdog ends the job with an error
// instead of every rank waiting forever.
TEST_F(Cli, TheWatchdogEndsAJobThatStopsMakingProgress) {
  const std::string config = write_config("hang.yaml");
  const auto start = std::chrono::steady_clock::now();
  Result r = run("COLOSSAL_INJECT_HANG=1:3 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "timeout 120 mpirun -np 2 --oversubscribe " + bin("colossal_train") + " " + config +
                 " --set model.layers=2 --set parallel.pipeline.size=2 --set train.steps=20 "
                 "--set train.watchdog_seconds=3 --set log.dir=" + dir + "/hang");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, 124) << "nothing ended the hung job\n" << r.output;
  EXPECT_NE(r.output.find("watchdog: no progress for"), std::string::npos) << r.output;
  // The rank left waiting names the call its peer never joined.
  EXPECT_NE(r.output.find(" over 2 ranks (mpi)"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 100.0);
  r = run(bin("colossal_train") + " " + config + " --set train.watchdog_seconds=-1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("train.watchdog_seconds: -1 is out of range"), std::string::npos)
      << r.output;
}

// The Slurm scripts outside Slurm (the launcher replaced, the array task id given): a sweep point
// (line format and YAML grid) trains with its overrides into runs/<sweep>-<array job>/<task>, and
// summarize.sh (colossal_sweep summarize) tabulates it.
TEST_F(Cli, SweepScriptRunsAPointAndSummarizeCollectsIt) {
  const char* source = std::getenv("COLOSSAL_SOURCE_DIR");
  if (source == nullptr) GTEST_SKIP() << "COLOSSAL_SOURCE_DIR is not set (run through ctest)";
  const std::string config = write_config("sweep-base.yaml");
  std::ofstream(dir + "/tiny.sweep") << "base: " << config << "\n# two points\n"
                                     << "--set train.steps=2\n--set train.steps=3 --set train.seed=7\n";
  std::ofstream(dir + "/grid.yaml") << "base: " << config << "\nset: {train.steps: 2}\n"
                                    << "grid: {train.seed: [1, 2], train.optimizer.lr: [1.0e-3, 2.0e-3]}\n";
  std::filesystem::remove_all(dir + "/sweeps");
  const std::string env = "COLOSSAL_ROOT=" + std::string(source) + " COLOSSAL_BIN=" +
                          bin("colossal_train") + " COLOSSAL_LAUNCH= SLURM_ARRAY_JOB_ID=42 ";
  const std::string script = " bash " + std::string(source) + "/slurm/sweep.sbatch ";
  Result r = run(env + script + dir + "/tiny.sweep --count");
  EXPECT_EQ(r.output, "2\n");
  r = run(env + script + dir + "/grid.yaml --count");
  EXPECT_EQ(r.output, "4\n");
  r = run(env + "SLURM_ARRAY_TASK_ID=1 COLOSSAL_SWEEP_DIR=" + dir + "/sweeps/tiny-42" + script +
          dir + "/tiny.sweep");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("point 1 of " + dir + "/tiny.sweep: train.steps=3 train.seed=7"),
            std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/sweeps/tiny-42/1/model.h5"));
  // Grid point 3: seed 2, lr 2e-3 (the last key varies fastest).
  r = run(env + "SLURM_ARRAY_TASK_ID=3 COLOSSAL_SWEEP_DIR=" + dir + "/sweeps/grid-42" + script +
          dir + "/grid.yaml");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("train.steps=2 train.seed=2 train.optimizer.lr=2.0e-3"),
            std::string::npos) << r.output;
  r = run(env + "SLURM_ARRAY_TASK_ID=5" + script + dir + "/tiny.sweep");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("tiny.sweep has 2 points (indices 0-1); there is no point 5"),
            std::string::npos) << r.output;
  r = run("bash " + std::string(source) + "/slurm/summarize.sh " + dir + "/sweeps");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 runs; written to " + dir + "/sweeps/summary.csv"), std::string::npos)
      << r.output;
  std::ifstream summary(dir + "/sweeps/summary.csv");
  std::string header, row, row2;
  std::getline(summary, header);
  std::getline(summary, row);
  std::getline(summary, row2);
  EXPECT_EQ(header, "run,overrides,steps,final_loss,best_val_loss,best_choices_accuracy,"
                    "tokens_per_s,finished");
  EXPECT_EQ(row.rfind("grid-42/3,train.steps=2 train.seed=2 train.optimizer.lr=2.0e-3,2,", 0), 0u)
      << row;
  EXPECT_EQ(row2.rfind("tiny-42/1,train.steps=3 train.seed=7,3,", 0), 0u) << row2;
  EXPECT_EQ(row2.substr(row2.size() - 4), ",yes") << row2;
}

TEST_F(Cli, SweepProgramHelpAndErrors) {
  Result r = run(bin("colossal_sweep") + " --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("usage: colossal_sweep count FILE"), std::string::npos) << r.output;
  r = run(bin("colossal_sweep"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("no command given"), std::string::npos) << r.output;
  r = run(bin("colossal_sweep") + " point " + dir + "/x.yaml -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("INDEX '-1' must be a non-negative integer"), std::string::npos)
      << r.output;
  std::ofstream(dir + "/bad.yaml") << "base: " << write_config("b.yaml") << "\n"
                                   << "grid: {train.stepz: [1, 2]}\n";
  r = run(bin("colossal_sweep") + " count " + dir + "/bad.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("point 0 (train.stepz=1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("did you mean 'train.steps'?"), std::string::npos) << r.output;
  r = run(bin("colossal_sweep") + " summarize " + dir + "/nowhere");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("is not a directory"), std::string::npos) << r.output;
}

TEST_F(Cli, SlurmScriptsHaveHelpAndUsage) {
  const char* source = std::getenv("COLOSSAL_SOURCE_DIR");
  if (source == nullptr) GTEST_SKIP() << "COLOSSAL_SOURCE_DIR is not set (run through ctest)";
  for (const std::string script : {"train", "sweep", "plan"}) {
    const std::string path = std::string(source) + "/slurm/" + script + ".sbatch";
    Result r = run("bash " + path + " --help");
    EXPECT_EQ(r.code, 0) << script;
    EXPECT_NE(r.output.find("slurm/" + script + ".sbatch"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("#SBATCH --job-name"), std::string::npos) << r.output;
    r = run("bash " + path);
    EXPECT_EQ(r.code, 2) << script;
    EXPECT_NE(r.output.find(script + ".sbatch: usage: "), std::string::npos) << r.output;
  }
  // The summary wrapper too (bash's own ':?' message and exit 1 before).
  Result r = run("bash " + std::string(source) + "/slurm/summarize.sh --help");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("usage: slurm/summarize.sh DIR"), std::string::npos) << r.output;
  r = run("bash " + std::string(source) + "/slurm/summarize.sh");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("summarize.sh: usage: "), std::string::npos) << r.output;
  r = run("COLOSSAL_LAUNCH= COLOSSAL_BIN=" + bin("colossal_train") + " bash " +
          std::string(source) + "/slurm/train.sbatch " + dir + "/absent.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("config '" + dir + "/absent.yaml' does not exist"), std::string::npos)
      << r.output;
}

// In a Slurm job (the environment as srun leaves it) colossal_train reports the job and, unless
// --set log.dir is given, suffixes log.dir with the job id (array job and task for an array).
TEST_F(Cli, SlurmJobNamesTheRunDirectory) {
  const std::string config = write_config("slurm.yaml");
  for (const char* d : {"/run-901", "/run-900_4", "/explicit"}) std::filesystem::remove_all(dir + d);
  Result r = run("SLURM_JOB_ID=901 SLURM_JOB_NAME=tiny SLURM_STEP_ID=0 SLURM_LOCALID=0 " +
                 bin("colossal_train") + " " + config + " --set train.steps=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("slurm: job 901 'tiny', step 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("slurm: run directory " + dir + "/run-901 "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("local rank 0 (SLURM_LOCALID)"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run-901/metrics.csv"));
  r = run("SLURM_JOB_ID=905 SLURM_ARRAY_JOB_ID=900 SLURM_ARRAY_TASK_ID=4 " + bin("colossal_train") +
          " " + config + " --set train.steps=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/run-900_4/metrics.csv")) << r.output;
  r = run("SLURM_JOB_ID=906 " + bin("colossal_train") + " " + config +
          " --set train.steps=1 --set log.dir=" + dir + "/explicit");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("slurm: run directory"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/explicit/metrics.csv"));
}

// ZeRO-3 with both offloads end to end: every forward (validation over 3 windows split 2/1 between
// the ranks, the sample, the model file) gathers parameters collectively; the file it writes
// evaluates to the same loss on one rank.
TEST_F(Cli, ZeroStage3RunEvaluatesSamplesAndSavesCollectively) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config("z3.yaml");
  const std::string zero3 =
      " --set parallel.data=2 --set parallel.zero.stage=3 --set parallel.zero.offload.optimizer=true"
      " --set parallel.zero.offload.params=true --set data.val_windows=3 --set log.dir=" + dir + "/z3";
  Result r = run(mpirun + bin("colossal_train") + " " + config + zero3);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ZeRO stage 3, optimizer offloaded, parameters offloaded"),
            std::string::npos) << r.output;
  const std::size_t at = r.output.find("val loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double trained = std::stod(r.output.substr(at + 9));
  r = run(bin("colossal_eval") + " " + config + " --weights " + dir +
          "/z3/model.h5 --set data.val_windows=3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NEAR(std::stod(r.output.substr(r.output.find("val loss ") + 9)), trained, 1e-5 * trained)
      << r.output;
  // And the same file evaluated under ZeRO-3 on two ranks.
  r = run(mpirun + bin("colossal_eval") + " " + config + " --weights " + dir + "/z3/model.h5" +
          zero3);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NEAR(std::stod(r.output.substr(r.output.find("val loss ") + 9)), trained, 1e-5 * trained)
      << r.output;
  // Evaluating holds no gradients or optimizer state (apps::TrainerOptions::inference): the
  // memory plan of --eval-only has neither, and a node too small for it is told before anything
  // is allocated, with inference's changes (no checkpointing policy: it keeps one block).
  r = run(mpirun + bin("colossal_train") + " " + config + zero3 + " --memory-plan --eval-only");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("memory plan (rank 0): params"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("grads"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("optimizer"), std::string::npos) << r.output;
  r = run("COLOSSAL_HOST_MEMORY_BYTES=1e6 " + bin("colossal_eval") + " " + config +
          " --weights " + dir + "/z3/model.h5");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("nothing was allocated"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("checkpointing.policy"), std::string::npos) << r.output;
}

TEST_F(Cli, ProfileStepsPrintsTimePerKindOfWork) {
  const std::string config = write_config("ok.yaml");
  Result r = run(bin("colossal_train") + " " + config + " --profile-steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* kind : {"profile of 2 steps", "GEMM", "attention", "layernorm", "optimizer",
                           "communication", "ms per step", "predicted ms"}) {
    EXPECT_NE(r.output.find(kind), std::string::npos) << kind << "\n" << r.output;
  }
  // The start-up lines say which attention runs.
  EXPECT_NE(r.output.find("attention: dense, (B,H,T,T) probabilities kept"), std::string::npos)
      << r.output;
  r = run(bin("colossal_train") + " " + config +
          " --profile-steps 1 --set model.fused_attention=true");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("attention: fused (FlashAttention's tiles of 128 positions on the host"),
            std::string::npos)
      << r.output;
  for (const char* bad : {"0", "x", "3"}) {  // train.steps is 3: at most 2 after the warm-up
    r = run(bin("colossal_train") + " " + config + " --profile-steps " + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("--profile-steps"), std::string::npos) << r.output;
  }
  r = run(bin("colossal_eval") + " " + config);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("missing --weights"), std::string::npos) << r.output;
}

TEST_F(Cli, TrainEvaluateAndGenerateEndToEnd) {
  const std::string config = write_config("ok.yaml");
  Result r = run(bin("colossal_train") + " " + config + " --print-config");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("steps: 3"), std::string::npos) << r.output;

  r = run(bin("colossal_train") + " " + config);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step      3/3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tok/s"), std::string::npos);
  EXPECT_NE(r.output.find("== summary =="), std::string::npos);
  const auto val = r.output.find("val loss ");
  ASSERT_NE(val, std::string::npos) << r.output;
  const std::string val_line = r.output.substr(val, r.output.find('\n', val) - val);

  std::ifstream csv(dir + "/run/metrics.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("step,loss,lr,grad_norm,tokens_per_s", 0), 0u) << header;
  int rows = 0;
  for (std::string line; std::getline(csv, line);) ++rows;
  EXPECT_EQ(rows, 3);

  // The resolved config is written beside the metrics and trains the same run again.
  std::ifstream resolved(dir + "/run/config.yaml");
  std::stringstream resolved_text;
  resolved_text << resolved.rdbuf();
  EXPECT_NE(resolved_text.str().find("steps: 3"), std::string::npos) << resolved_text.str();
  r = run(bin("colossal_train") + " " + dir + "/run/config.yaml --print-config");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, resolved_text.str());

  const std::string weights = dir + "/run/model.h5";
  ASSERT_TRUE(std::filesystem::exists(weights));
  r = run(bin("colossal_eval") + " " + config + " --weights " + weights);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(val_line), std::string::npos) << r.output << " vs " << val_line;
  r = run(bin("colossal_train") + " " + config + " --eval-only --weights " + weights);
  EXPECT_NE(r.output.find(val_line), std::string::npos) << r.output;

  r = run(bin("colossal_generate") + " " + config + " --weights " + weights +
          " --prompt the --tokens 5 --temperature 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the", 0), 0u) << r.output;
  r = run(bin("colossal_eval") + " " + config + " --weights " + dir + "/data.txt");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("not an HDF5 file"), std::string::npos) << r.output;

  if (std::system("command -v h5ls > /dev/null 2>&1") == 0) {
    r = run("h5ls " + weights);
    EXPECT_NE(r.output.find("transformer.h.0.attn.c_attn.weight"), std::string::npos) << r.output;
  }
}

// metrics.h5 next to metrics.csv, one row per step through a crash and two resumes.
namespace {

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::fabs(a - b) <= 1e-8 * std::max(std::fabs(a), std::fabs(b));  // CSV keeps 9 digits
}

// Every CSV column equals the HDF5 column of the same name, row by row.
void expect_csv_matches_h5(const colossal::io::CsvTable& csv,
                           const std::map<std::string, std::vector<double>>& h5) {
  for (std::size_t c = 0; c < csv.columns.size(); ++c) {
    const std::string& name = csv.columns[c];
    ASSERT_TRUE(h5.count(name)) << name << " missing from metrics.h5";
    const auto& column = h5.at(name);
    ASSERT_EQ(column.size(), csv.rows.size()) << name;
    for (std::size_t r = 0; r < csv.rows.size(); ++r) {
      EXPECT_TRUE(same_value(column[r], csv.rows[r][c]))
          << name << " row " << r << ": h5 " << column[r] << ", csv " << csv.rows[r][c];
    }
  }
}
}  // namespace

TEST_F(Cli, MetricsH5HasOneRowPerStepThroughACrashAndResumes) {
  const std::string config = write_config("metrics.yaml");
  const std::string run_dir = dir + "/metrics";
  std::filesystem::remove_all(run_dir);
  const std::string train = bin("colossal_train") + " " + config + " --set log.dir=" + run_dir +
                            " --set checkpoint.every=3 --set checkpoint.resume=auto";
  Result r = run(train + " --set train.steps=5");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto first = colossal::io::read_metrics_csv(run_dir + "/metrics.csv");
  ASSERT_EQ(first.rows.size(), 5u);
  // A crash after step 5, before its checkpoint: the run resumes from step 3 and trains steps 4
  // and 5 again; their first rows go from both files.
  std::filesystem::remove(run_dir + "/checkpoints/ckpt-5.h5");
  r = run(train + " --set train.steps=7");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + run_dir + "/checkpoints/ckpt-3.h5"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dropped 2 rows after step 3"), std::string::npos) << r.output;
  const auto csv = colossal::io::read_metrics_csv(run_dir + "/metrics.csv");
  auto h5 = colossal::test::read_metrics_h5(run_dir + "/metrics.h5");
  ASSERT_EQ(csv.rows.size(), 7u);
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(csv.rows[i][0], double(i + 1)) << "step";
  // The resumed steps trained the same model on the same data: the same losses.
  for (std::size_t i = 3; i < 5; ++i) EXPECT_EQ(csv.rows[i][1], first.rows[i][1]) << "step " << i + 1;
  expect_csv_matches_h5(csv, h5);
  for (const auto& [name, column] : h5) {
    EXPECT_EQ(column.size(), 7u) << name;
    for (double v : column) {
      if (name.rfind("memory_params", 0) == 0) {
        EXPECT_GT(v, 0.0) << name;
      }
      if (name.rfind("time_", 0) == 0) {
        EXPECT_TRUE(std::isnan(v)) << name << " without a profiler";
      }
    }
  }
  for (const char* name : {"val_loss", "memory_activations_bytes", "memory_optimizer_bytes",
                           "time_gemm_seconds", "grad_norm", "mfu"}) {
    EXPECT_TRUE(h5.count(name)) << name;
  }

  // A metrics.h5 damaged beyond reading is moved aside and rebuilt from metrics.csv.
  std::filesystem::resize_file(run_dir + "/metrics.h5", 700);
  r = run(train + " --set train.steps=8");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("moved it to " + run_dir + "/metrics.h5.damaged; rebuilt 7 rows from " +
                          run_dir + "/metrics.csv"),
            std::string::npos)
      << r.output;
  h5 = colossal::test::read_metrics_h5(run_dir + "/metrics.h5");
  expect_csv_matches_h5(colossal::io::read_metrics_csv(run_dir + "/metrics.csv"), h5);
  ASSERT_EQ(h5.at("memory_params_bytes").size(), 8u);
  EXPECT_TRUE(std::isnan(h5.at("memory_params_bytes")[6])) << "not in metrics.csv";
  EXPECT_GT(h5.at("memory_params_bytes")[7], 0.0);
}

// colossal_report: the summary of a run, plots when matplotlib is there, and what to install
// when it is not.
TEST_F(Cli, ReportSummarizesARunAndNamesMissingPackages) {
  if (std::system("command -v python3 > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  const std::string run_dir = dir + "/report";
  std::filesystem::remove_all(run_dir);
  Result r = run(bin("colossal_train") + " " + write_config("report.yaml") + " --set log.dir=" +
                 run_dir + " --set train.steps=6 --set eval.every=2");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string report = bin("colossal_report");
  r = run(report + " " + run_dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* part : {"steps: 6 rows, steps 1 to 6", "train loss: first ", ", final ",
                           ", best ", "val loss: final ", "3 evaluations", "throughput: ",
                           "tokens/s over 5 steps", "memory: tracked peak "}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  if (r.output.find("(from metrics.h5)") != std::string::npos) {
    EXPECT_NE(r.output.find("predicted"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("params "), std::string::npos) << r.output;
  } else {
    EXPECT_NE(r.output.find("apt-get install python3-h5py"), std::string::npos) << r.output;
  }
  if (r.output.find("plots: ") != std::string::npos) {
    for (const char* png : {"/loss.png", "/throughput.png"}) {
      std::ifstream in(run_dir + png, std::ios::binary);
      char magic[4] = {};
      in.read(magic, 4);
      EXPECT_EQ(std::string(magic + 1, 3), "PNG") << png;
    }
  } else {
    EXPECT_NE(r.output.find("plots skipped: matplotlib is not installed; apt-get install "
                            "python3-matplotlib"),
              std::string::npos)
        << r.output;
  }
  // Without h5py and matplotlib: the summary from metrics.csv, and what to install.
  r = run("COLOSSAL_REPORT_WITHOUT=h5py,matplotlib " + report + " " + run_dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* part : {"(from metrics.csv)", "train loss: first ", "apt-get install python3-h5py",
                           "apt-get install python3-matplotlib"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  r = run(report + " --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("usage: colossal_report RUN_DIR"), std::string::npos) << r.output;
  r = run(report);
  EXPECT_EQ(r.code, 2) << r.output;
  r = run(report + " " + dir + "/no-such-run");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("run directory '" + dir + "/no-such-run' does not exist"),
            std::string::npos) << r.output;
  std::filesystem::remove_all(dir + "/empty-run");
  std::filesystem::create_directories(dir + "/empty-run");
  r = run(report + " " + dir + "/empty-run");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("has no metrics.h5 or metrics.csv"), std::string::npos) << r.output;
  std::ofstream(dir + "/empty-run/metrics.csv") << "step,loss,lr\n";
  r = run(report + " " + dir + "/empty-run");
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.output.find("has no rows yet"), std::string::npos) << r.output;
}

}  // namespace

namespace {

// Five examples of the text "the quick brown fox. " (the tests' data): the right completion
// continues it, at label e % 3.
std::vector<colossal::io::ChoiceExample> quick_fox_choices() {
  const auto ids = [](const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); };
  std::vector<colossal::io::ChoiceExample> examples;
  const std::vector<std::string> contexts = {"the quick", "brown", "fox. the", "the", "quick b"};
  const std::vector<std::string> rights = {" brown", " fox.", " quick", " quick brown", "rown"};
  for (std::size_t e = 0; e < contexts.size(); ++e) {
    colossal::io::ChoiceExample ex;
    ex.index = int(e);
    ex.label = int(e % 3);
    ex.context = ids(contexts[e]);
    std::vector<std::string> options = {"xq zz", "k", " ownbr qq"};
    options.insert(options.begin() + ex.label, rights[e]);
    for (const auto& o : options) ex.completions.push_back(ids(o));
    examples.push_back(ex);
  }
  return examples;
}

std::vector<double> column(const colossal::io::CsvTable& table, const std::string& name) {
  std::vector<double> out;
  const auto at = std::find(table.columns.begin(), table.columns.end(), name);
  if (at == table.columns.end()) {
    ADD_FAILURE() << "no column " << name;
    return out;
  }
  for (const auto& row : table.rows) out.push_back(row[std::size_t(at - table.columns.begin())]);
  return out;
}

// The rows of colossal_eval --choices-out: each completion's loss, keyed by "example,completion".
std::map<std::string, double> choice_rows(const std::string& path, int* chosen = nullptr) {
  const colossal::io::CsvTable table = colossal::io::read_metrics_csv(path);
  EXPECT_EQ(table.columns,
            (std::vector<std::string>{"example", "index", "label", "completion", "tokens", "loss",
                                      "loss_per_token", "chosen_per_token", "chosen_total"}));
  std::map<std::string, double> rows;
  for (const std::vector<double>& f : table.rows) {
    const auto finite = [](double v) { return std::isfinite(v); };
    if (f.size() != 9 || !std::all_of(f.begin(), f.end(), finite)) {
      ADD_FAILURE() << "a row of " << path << " without 9 numbers";
      continue;
    }
    rows[std::to_string(int(f[0])) + "," + std::to_string(int(f[3]))] = f[5];
    EXPECT_NEAR(f[6], f[5] / f[4], 1e-6 * f[5]);
    if (chosen != nullptr) *chosen += int(f[7]);
  }
  return rows;
}

void write_choices(const std::string& path,
                   const std::vector<colossal::io::ChoiceExample>& examples) {
  const std::vector<uint8_t> bytes = colossal::io::encode_choice_file(examples);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

}  // namespace

// colossal_eval --choices: a multiple-choice file scored on one rank, then the same scores under
// data and tensor parallelism on two ranks; the accuracy line and the per-completion rows; bad
// files and flags stop every rank with the key and what to do.
TEST_F(Cli, EvalScoresMultipleChoiceFiles) {
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 2 "
      "--oversubscribe ";
  const std::string config = write_config("choices.yaml");
  Result r = run(bin("colossal_train") + " " + config + " --set log.dir=" + dir + "/choices");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string weights = " --weights " + dir + "/choices/model.h5";
  std::vector<colossal::io::ChoiceExample> examples = quick_fox_choices();
  const std::string file = dir + "/choices.bin";
  write_choices(file, examples);
  r = run(bin("colossal_eval") + " " + config + weights + " --choices " + file +
          " --choices-out " + dir + "/one.csv");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("val loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("choices " + file + ": 5 examples, 20 completions"), std::string::npos)
      << r.output;
  const std::size_t at = r.output.find("choices accuracy ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string accuracy = r.output.substr(at, r.output.find('\n', at) - at);
  int chosen = 0;
  const std::map<std::string, double> one = choice_rows(dir + "/one.csv", &chosen);
  EXPECT_EQ(one.size(), 20u);
  EXPECT_EQ(chosen, 5);  // one completion chosen per example
  for (const std::string layout : {"--set parallel.data=2", "--set parallel.tensor.size=2"}) {
    r = run(mpirun + bin("colossal_eval") + " " + config + weights + " " + layout +
            " --choices " + file + " --choices-out " + dir + "/two.csv");
    ASSERT_EQ(r.code, 0) << layout << "\n" << r.output;
    EXPECT_NE(r.output.find(accuracy), std::string::npos) << layout << "\n" << r.output;
    const std::map<std::string, double> two = choice_rows(dir + "/two.csv");
    ASSERT_EQ(two.size(), one.size()) << layout;
    for (const auto& [key, loss] : one) {
      EXPECT_NEAR(two.at(key), loss, 1e-5 * loss) << layout << ": " << key;
    }
  }
  // Bad input: the flag without the file, a file of another kind, a missing file (every rank
  // exits with the message, no hang), a completion longer than the window.
  r = run(mpirun + bin("colossal_eval") + " " + config + weights + " --set parallel.data=2" +
          " --choices " + file + " --choices-out " + dir + "/no-such-dir/rows.csv");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("--choices-out: cannot write '" + dir + "/no-such-dir/rows.csv.tmp'"),
            std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/no-such-dir"));
  r = run(bin("colossal_eval") + " " + config + weights + " --choices-out " + dir + "/x.csv");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--choices-out needs --choices FILE"), std::string::npos) << r.output;
  r = run(mpirun + bin("colossal_eval") + " " + config + weights + " --set parallel.data=2" +
          " --choices " + dir + "/data.txt");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("--choices: '" + dir + "/data.txt' starts with"), std::string::npos)
      << r.output;
  r = run(mpirun + bin("colossal_eval") + " " + config + weights + " --set parallel.data=2" +
          " --choices " + dir + "/none.bin");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("cannot be opened"), std::string::npos) << r.output;
  const std::string longer = "a completion longer than the window";
  examples[2].completions[1].assign(longer.begin(), longer.end());
  write_choices(dir + "/long.bin", examples);
  r = run(bin("colossal_eval") + " " + config + weights + " --choices " + dir + "/long.bin");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("--choices: multiple-choice example 2 has a completion of 35 tokens, "
                          "longer than the window (train.seq_len = 16)"),
            std::string::npos) << r.output;
  // The config's eval.choices when --choices is not given.
  r = run(bin("colossal_eval") + " " + config + weights + " --set eval.choices=" + file);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(accuracy), std::string::npos) << r.output;
  // A 64-position model: its rows (at most 17 inputs) score in a window of 32 after the
  // validation pass in 64, on one rank and under tp2 alike; eval.choices_examples keeps the
  // first N of eval.choices.
  const std::string w64 = " --set model.max_seq=64 --set train.seq_len=64";
  r = run(bin("colossal_train") + " " + config + w64 + " --set log.dir=" + dir + "/choices64");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string weights64 = w64 + " --weights " + dir + "/choices64/model.h5";
  r = run(bin("colossal_eval") + " " + config + weights64 + " --choices " + file +
          " --choices-out " + dir + "/w64.csv");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("val loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("choices: scored in a window of 32 positions, enough for every row "
                          "(train.seq_len 64)"),
            std::string::npos) << r.output;
  const std::size_t at64 = r.output.find("choices accuracy ");
  ASSERT_NE(at64, std::string::npos) << r.output;
  const std::string accuracy64 = r.output.substr(at64, r.output.find('\n', at64) - at64);
  const std::map<std::string, double> w64_rows = choice_rows(dir + "/w64.csv");
  r = run(mpirun + bin("colossal_eval") + " " + config + weights64 +
          " --set parallel.tensor.size=2 --choices " + file + " --choices-out " + dir +
          "/w64tp.csv");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(accuracy64), std::string::npos) << r.output;
  for (const auto& [key, loss] : choice_rows(dir + "/w64tp.csv")) {
    EXPECT_NEAR(w64_rows.at(key), loss, 1e-5 * loss) << "tp2, window 32: " << key;
  }
  r = run(bin("colossal_eval") + " " + config + weights64 + " --set eval.choices=" + file +
          " --set eval.choices_examples=2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(": 2 examples, 8 completions"), std::string::npos) << r.output;
}

// eval.choices during training: scored with each validation pass, on one rank and under dp2 x
// pp2 alike; log.dir/choices.csv holds one row per pass, also after a resume (the rows after
// the checkpoint are dropped and scored again); a file that cannot be used stops the run
// before step 1.
TEST_F(Cli, TrainScoresEvalChoicesWithEachValidation) {
  const std::string config = write_config("train_choices.yaml");
  const std::string file = dir + "/train_choices.bin";
  write_choices(file, quick_fox_choices());
  const std::string every =
      " --set eval.every=2 --set train.steps=4 --set eval.choices=" + file;
  Result r = run(bin("colossal_train") + " " + config + every + " --set log.dir=" + dir + "/tc1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("step 2: choices accuracy "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(5 examples, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step 4: choices accuracy "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nchoices accuracy "), std::string::npos) << r.output;  // summary
  EXPECT_NE(r.output.find("metrics in " + dir + "/tc1/metrics.csv and " + dir +
                          "/tc1/choices.csv"),
            std::string::npos) << r.output;
  const auto one = colossal::io::read_metrics_csv(dir + "/tc1/choices.csv");
  ASSERT_EQ(column(one, "step"), (std::vector<double>{2, 4}));
  EXPECT_EQ(column(one, "examples"), (std::vector<double>{5, 5}));
  // --eval-only scores it too, as colossal_eval does.
  r = run(bin("colossal_train") + " " + config + every + " --set log.dir=" + dir +
          "/tc1e --eval-only --weights " + dir + "/tc1/model.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("val loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("per token, "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" total (eval.choices)"), std::string::npos) << r.output;
  char want[64];  // the accuracy of the trained model.h5: the run's last pass
  std::snprintf(want, sizeof want, "choices accuracy %.4f (",
                column(one, "accuracy_per_token").back());
  EXPECT_NE(r.output.find(want), std::string::npos) << want << "\n" << r.output;
  r = run(bin("colossal_report") + " " + dir + "/tc1 --no-plots");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("choices accuracy (eval.choices, 5 examples): final "),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(step 4), best "), std::string::npos) << r.output;
  const std::string mpirun =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 200 mpirun -np 4 "
      "--oversubscribe ";
  r = run(mpirun + bin("colossal_train") + " " + config + every + " --set log.dir=" + dir +
          "/tc4 --set parallel.data=2 --set parallel.pipeline.size=2 --set model.layers=2" +
          " --set train.micro_batch=1");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(bin("colossal_train") + " " + config + every + " --set log.dir=" + dir +
          "/tc2 --set model.layers=2 --set train.micro_batch=1");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto four = colossal::io::read_metrics_csv(dir + "/tc4/choices.csv");
  const auto two = colossal::io::read_metrics_csv(dir + "/tc2/choices.csv");
  EXPECT_EQ(column(four, "accuracy_per_token"), column(two, "accuracy_per_token"));
  EXPECT_EQ(column(four, "accuracy_total"), column(two, "accuracy_total"));
  // Resumed from step 2's checkpoint: step 4's row is dropped and written again, once.
  const std::string resume = " --set checkpoint.every=2 --set log.dir=" + dir + "/tcr";
  r = run(bin("colossal_train") + " " + config + every + resume);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(bin("colossal_train") + " " + config + every + resume +
          " --set checkpoint.resume=" + dir + "/tcr/checkpoints/ckpt-2.h5");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto resumed = colossal::io::read_metrics_csv(dir + "/tcr/choices.csv");
  EXPECT_EQ(column(resumed, "step"), (std::vector<double>{2, 4}));
  EXPECT_EQ(column(resumed, "accuracy_per_token"), column(one, "accuracy_per_token"));
  // A fresh run in the same log.dir without the key leaves no earlier passes behind.
  r = run(bin("colossal_train") + " " + config + " --set train.steps=1 --set log.dir=" + dir +
          "/tcr");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/tcr/choices.csv"));
  // Unusable files: before step 1, with the key.
  r = run(bin("colossal_train") + " " + config + " --set eval.choices=" + dir + "/none.bin");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("eval.choices: '" + dir + "/none.bin' cannot be opened"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  std::vector<colossal::io::ChoiceExample> long_one = quick_fox_choices();
  long_one[4].completions[0].assign(20, 'a');
  write_choices(dir + "/train_long.bin", long_one);
  r = run(bin("colossal_train") + " " + config + " --set eval.choices=" + dir +
          "/train_long.bin");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("eval.choices: multiple-choice example 4 has a completion of 20 "
                          "tokens"),
            std::string::npos) << r.output;
  // eval.choices_examples: the first N only.
  r = run(bin("colossal_train") + " " + config + every + " --set eval.choices_examples=2" +
          " --set log.dir=" + dir + "/tcn");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(2 examples, "), std::string::npos) << r.output;
}
