// The communicator choice end to end: colossal_train under mpirun prints the transport once on
// rank 0, refuses parallel.comm: nccl on a CPU build on every rank, and trains bitwise alike
// through the staged path (COLOSSAL_TEST_STAGED_COMM=1: every float buffer goes through the
// staging copies, host memory standing in for the device) and plain MPI. And the start-up
// decision of parallel.zero.offload.policy: auto for made-up device sizes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/metrics_h5.hpp"
#include "tests/run_program.hpp"

namespace {

using colossal::test::bin;
using colossal::test::Result;
using colossal::test::run;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class CommRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = (std::filesystem::temp_directory_path() / "colossal_comm_run").string();
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::string text;
    for (int i = 0; i < 6000; ++i) text.push_back("the quick brown fox jumps. "[i % 27]);
    std::ofstream(dir + "/data.txt") << text;
    config = dir + "/c.yaml";
    std::ofstream(config)
        << "model: {layers: 2, hidden: 16, heads: 2, vocab: 256, max_seq: 16}\n"
           "data: {path: " + dir + "/data.txt}\n"
           "train: {steps: 4, seq_len: 16, global_batch: 8, micro_batch: 2}\n"
           "eval: {every: 0}\n"
           "log: {every: 1}\n"
           "sample: {tokens: 0}\n";
  }
  Result train(int ranks, const std::string& env, const std::string& sets) {
    return run(env + " OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 240 "
               "mpirun -np " + std::to_string(ranks) + " --oversubscribe " +
               bin("colossal_train") + " " + config + " " + sets);
  }
  // Trains the layout with plain MPI and forced staging; the losses must be bitwise alike.
  void expect_staged_like_plain(int ranks, const std::string& layout, const std::string& name) {
    const Result plain = train(ranks, "", layout + " --set log.dir=" + dir + "/" + name + "-mpi");
    ASSERT_EQ(plain.code, 0) << plain.output;
    EXPECT_EQ(count(plain.output, "comm: host MPI"), 1u) << plain.output;
    const Result staged = train(ranks, "COLOSSAL_TEST_STAGED_COMM=1",
                                layout + " --set log.dir=" + dir + "/" + name + "-staged");
    ASSERT_EQ(staged.code, 0) << staged.output;
    EXPECT_EQ(count(staged.output, "comm: MPI through pinned host staging (forced by "
                                   "COLOSSAL_TEST_STAGED_COMM=1"),
              1u)
        << staged.output;
    const auto a = metrics(dir + "/" + name + "-mpi");
    const auto b = metrics(dir + "/" + name + "-staged");
    ASSERT_EQ(a.at("loss").size(), 4u) << name;
    ASSERT_EQ(b.at("loss").size(), 4u) << name;
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(a.at("loss")[i], b.at("loss")[i]) << name << " step " << i + 1;
      EXPECT_EQ(a.at("grad_norm")[i], b.at("grad_norm")[i]) << name << " step " << i + 1;
    }
  }
  // The run's metrics: metrics.h5, or metrics.csv (the 2d/2.5d/3d loop writes only that, with
  // 9 significant digits: a float's value exactly).
  static std::map<std::string, std::vector<double>> metrics(const std::string& run_dir) {
    if (std::filesystem::exists(run_dir + "/metrics.h5")) {
      return colossal::test::read_metrics_h5(run_dir + "/metrics.h5");
    }
    std::ifstream in(run_dir + "/metrics.csv");
    std::string line;
    std::getline(in, line);
    std::vector<std::string> names;
    std::stringstream header(line);
    for (std::string n; std::getline(header, n, ',');) names.push_back(n);
    std::map<std::string, std::vector<double>> columns;
    while (std::getline(in, line)) {
      std::stringstream row(line);
      std::string v;
      for (std::size_t i = 0; i < names.size() && std::getline(row, v, ','); ++i) {
        columns[names[i]].push_back(std::stod(v));
      }
    }
    return columns;
  }
  std::string dir, config;
};

TEST_F(CommRun, TrainerPrintsTheChoiceOnceAndRefusesNcclOnACpuBuild) {
  Result r = train(2, "", "--set parallel.data=2 --set log.dir=" + dir + "/auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "comm: host MPI (parallel.comm: auto, this build keeps buffers in "
                            "host memory)\n"),
            1u)
      << r.output;
  r = train(2, "", "--set parallel.data=2 --set parallel.comm=mpi --set log.dir=" + dir + "/mpi");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(count(r.output, "comm: host MPI (parallel.comm: mpi, "), 1u) << r.output;
  r = train(2, "", "--set parallel.data=2 --set parallel.comm=nccl --set log.dir=" + dir + "/n");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.comm: nccl cannot work: NCCL needs a CUDA build"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << "every rank stops alike: "
                                                           << r.output;
  r = train(2, "", "--set parallel.data=2 --set parallel.comm=gloo");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.comm: invalid value 'gloo'"), std::string::npos) << r.output;
}

TEST_F(CommRun, StagedDataParallelZero3TrainsBitwiseLikeMpi) {
  expect_staged_like_plain(2, "--set parallel.data=2 --set parallel.zero.stage=3", "dp2z3");
}

TEST_F(CommRun, StagedDataParallelBucketsTrainBitwiseLikeMpi) {
  expect_staged_like_plain(2, "--set parallel.data=2 --set parallel.bucket_mb=0.001", "dp2");
}

TEST_F(CommRun, StagedTensorAndPipelineTrainBitwiseLikeMpi) {
  expect_staged_like_plain(2, "--set parallel.tensor.size=2 "
                              "--set parallel.tensor.sequence_split=true", "tp2sp");
  expect_staged_like_plain(2, "--set parallel.pipeline.size=2 "
                              "--set parallel.pipeline.schedule=1f1b", "pp2");
  expect_staged_like_plain(2, "--set parallel.sequence=2", "sp2");
}

TEST_F(CommRun, StagedTensor2dOnFourRanksTrainsBitwiseLikeMpi) {
  expect_staged_like_plain(4, "--set parallel.tensor.size=4 --set parallel.tensor.mode=2d", "2d");
}

// offload.policy: auto at start-up: a device that holds the plan offloads nothing; one slightly
// smaller than the plan gets a few chunks of the optimizer states moved (and trains to the same
// losses: the host's AdamW and the device's are the same arithmetic); one
// smaller than anything the policy can reach stops every rank naming the device's categories.
TEST_F(CommRun, OffloadPolicyAutoDecidesFromTheMemoryPlan) {
  const std::string layout =
      "--set parallel.data=2 --set parallel.zero.stage=3 --set parallel.zero.offload.policy=auto ";
  Result r = train(2, "", layout + "--set hardware.device_memory_gib=4 --set log.dir=" + dir +
                              "/fits");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string said = "offload (parallel.zero.offload.policy: auto): ";
  EXPECT_EQ(count(r.output, said + "nothing to the host: the device holds "), 1u) << r.output;
  EXPECT_NE(r.output.find("offload_optimizer: false, offload_params: false"), std::string::npos);
  // The plan's device bytes, from the line: "... the device holds 1.23 KiB of 4.00 GiB".
  const auto at = r.output.find("the device holds ") + 17;
  const std::string unit = r.output.substr(r.output.find(' ', at) + 1, 3);
  ASSERT_TRUE(unit == "KiB" || unit == "MiB") << r.output;
  const double gib = std::stod(r.output.substr(at)) / (unit == "KiB" ? 1024.0 * 1024 : 1024.0);
  char smaller[64];
  std::snprintf(smaller, sizeof smaller, "%.12g", gib * 0.995);
  r = train(2, "", layout + "--set hardware.device_memory_gib=" + std::string(smaller) +
                       " --set log.dir=" + dir + "/opt");
  ASSERT_EQ(r.code, 0) << r.output;
  // 0.5% short: a few of the 64 chunks of each rank's optimizer state, not all of it.
  EXPECT_EQ(count(r.output, " of 64 chunks of each rank's optimizer states "
                            "(parallel.zero.offload.optimizer_fraction "), 1u) << r.output;
  EXPECT_EQ(count(r.output, said + "optimizer states to the host"), 0u) << r.output;
  EXPECT_NE(r.output.find("offload_optimizer: true, offload_params: false, optimizer_fraction: "),
            std::string::npos) << r.output;
  const auto a = colossal::test::read_metrics_h5(dir + "/fits/metrics.h5");
  const auto b = colossal::test::read_metrics_h5(dir + "/opt/metrics.h5");
  EXPECT_EQ(a.at("loss"), b.at("loss"));
  r = train(2, "", layout + "--set hardware.device_memory_gib=0.00001");
  EXPECT_NE(r.code, 0) << r.output;
  for (const char* part : {"does not fit on the device even with optimizer states and parameters "
                           "offloaded", "params ", "grads ", "activations ", "on a device of"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << ": " << r.output;
  }
  EXPECT_EQ(r.output.find("MPI_ABORT"), std::string::npos) << r.output;
}

}  // namespace
