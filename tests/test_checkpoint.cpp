// Checkpoints and resume: N steps straight equal k steps, a stop, a checkpoint and N-k resumed
// steps, bitwise on the same layout and within fp32 tolerance across layouts; a damaged newest
// checkpoint is skipped for the one before; a checkpoint of another model is refused.
#include <gtest/gtest.h>
#include <mpi.h>

#include <hdf5.h>

#include <csignal>
#include <filesystem>
#include <cmath>
#include <fstream>

#include "apps/trainer.hpp"
#include "io/checkpoint.hpp"
#include "io/config.hpp"
#include "metrics_h5.hpp"
#include "parallel/mpi_communicator.hpp"
#include "train_parity.hpp"

using namespace colossal;

namespace {

struct Layout {
  int data = 1, tensor = 1, pipeline = 1, stage = 0, sequence = 1;
  std::string name() const {
    return "dp" + std::to_string(data) + "tp" + std::to_string(tensor) + "pp" +
           std::to_string(pipeline) + "sp" + std::to_string(sequence) + "z" + std::to_string(stage);
  }
};

io::Config config(const std::string& data, const std::string& dir, const Layout& l,
                  const std::string& extra = "", const std::string& arch = "gpt2") {
  const std::string text =
      "model: {arch: " + arch + (arch == "llama" ? ", kv_heads: 2" : "") +
      ", layers: 2, hidden: 32, heads: 4, ffn_hidden: 64, vocab: 200,"
      " max_seq: 16, vocab_multiple: 16}\n"
      "data: {path: " + data + "}\n"
      "train: {steps: 10, seq_len: 16, global_batch: 8, micro_batch: 2,\n"
      "        optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, warmup: 2}}\n"
      "parallel: {data: " + std::to_string(l.data) + ", tensor: {size: " +
      std::to_string(l.tensor) + "}, pipeline: {size: " + std::to_string(l.pipeline) +
      "}, sequence: " + std::to_string(l.sequence) + ", zero: {stage: " +
      std::to_string(l.stage) + "}}\n"
      "eval: {every: 0}\nsample: {tokens: 0}\nlog: {every: 100, dir: " + dir + "}\n" + extra;
  return io::parse_config(text, "test");
}

std::string fresh_dir(parallel::Communicator& world, const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("colossal_ckpt_" + name);
  if (world.rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world.barrier();
  return dir.string();
}

// Trains with checkpoint.every = 3 and stops (as on SIGUSR1) after `stop_at` steps. One rank is
// signalled, the last (SIGTERM may reach only one): every rank stops and names the signal.
apps::TrainSummary train_and_stop(const io::Config& c, parallel::Communicator& world, int stop_at) {
  apps::Trainer trainer(c, nullptr, &world);
  trainer.set_step_callback([&](int64_t done) {
    if (done == stop_at && world.rank() == world.size() - 1) apps::request_stop(SIGUSR1);
  });
  const apps::TrainSummary s = trainer.train();
  apps::request_stop(0);
  return s;
}

TEST(Checkpoint, ResumesBitwiseOnTheSameLayoutAndSkipsADamagedOne) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const Layout layout{world.size(), 1, 1, world.size() > 1 ? 1 : 0};
  const std::string dir = fresh_dir(world, "same" + std::to_string(world.size()));
  const std::string every = "checkpoint: {every: 3, keep: 3, resume: auto}\n";

  apps::Trainer straight(config(data, dir + "/straight", layout), nullptr, &world);
  const apps::TrainSummary all = straight.train();
  const std::vector<float> final_weights = straight.logical_parameters();

  const apps::TrainSummary first = train_and_stop(config(data, dir + "/run", layout, every), world, 5);
  EXPECT_TRUE(first.stopped);
  EXPECT_EQ(first.stop_signal, SIGUSR1) << "rank " << world.rank();
  EXPECT_EQ(first.steps, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(first.losses[i], all.losses[i]) << "step " << i + 1;
  const auto saved = io::list_checkpoints(dir + "/run/checkpoints");
  ASSERT_EQ(saved.size(), 2u);  // after steps 3 and 5 (the stop)
  EXPECT_EQ(std::filesystem::path(saved[0]).filename(), "ckpt-5.h5");

  {
    apps::Trainer resumed(config(data, dir + "/run", layout, every), nullptr, &world);
    const apps::TrainSummary rest = resumed.train();
    EXPECT_EQ(rest.first_step, 5);
    ASSERT_EQ(rest.losses.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(rest.losses[i], all.losses[5 + i]) << "step " << 6 + i << ": not bitwise";
    }
    EXPECT_EQ(resumed.logical_parameters(), final_weights) << "weights not bitwise equal";
  }
  // The resumed run kept checkpoints 6, 9 and 10 (keep: 3). Damage the newest: the next resume
  // warns, takes the one before and repeats step 10 exactly.
  if (world.rank() == 0) {
    const auto kept = io::list_checkpoints(dir + "/run/checkpoints");
    ASSERT_EQ(kept.size(), 3u);
    std::filesystem::resize_file(kept[0], std::filesystem::file_size(kept[0]) / 2);
  }
  world.barrier();
  apps::Trainer again(config(data, dir + "/run", layout, every), nullptr, &world);
  const apps::TrainSummary last = again.train();
  EXPECT_EQ(last.first_step, 9);
  ASSERT_EQ(last.losses.size(), 1u);
  EXPECT_EQ(last.losses[0], all.losses[9]);

  // The attention's algorithm is not another model: the checkpoint resumes under the fused one
  // (model.fused_attention: auto may choose otherwise on a requeued job's node).
  {
    io::Config fused = config(data, dir + "/run", layout, every);
    fused.model.fused_attention = true;
    fused.train.steps = 11;
    fused.text = io::to_yaml(fused);
    apps::Trainer resumed(fused, nullptr, &world);
    const apps::TrainSummary one = resumed.train();
    EXPECT_EQ(one.first_step, 10);
    ASSERT_EQ(one.losses.size(), 1u);
    EXPECT_TRUE(std::isfinite(one.losses[0]));
  }
  // A checkpoint of another model is refused, naming the keys that differ.
  io::Config other = config(data, dir + "/run", layout, every);
  other.model.ffn_hidden = 128;
  other.text.replace(other.text.find("ffn_hidden: 64"), 14, "ffn_hidden: 128");
  apps::Trainer wrong(other, nullptr, &world);
  try {
    wrong.train();
    FAIL() << "resumed a checkpoint of another model";
  } catch (const apps::DataFileError& e) {  // exit 3, with the key and both values
    const std::string what = e.what();
    EXPECT_NE(what.find("was written for another model (model.ffn_hidden 64 there, 128 here)"),
              std::string::npos) << what;
  }
}

// A checkpoint whose tensor bytes were changed fails its checksums and is skipped; an unwritable
// checkpoint.dir is an error on every rank and leaves nothing behind.
TEST(Checkpoint, ACorruptedTensorIsSkippedAndAnUnwritableDirectoryStopsEveryRank) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const std::string dir = fresh_dir(world, "corrupt" + std::to_string(world.size()));
  const Layout layout{world.size(), 1, 1, 0};
  const std::string every = "checkpoint: {every: 2, keep: 5, resume: auto}\n";
  io::Config c = config(data, dir + "/run", layout, every);
  c.train.steps = 4;
  { apps::Trainer(c, nullptr, &world).train(); }
  if (world.rank() == 0) {
    // Overwrite 16 bytes in the middle of one tensor of the newest checkpoint, in place.
    const std::string path = dir + "/run/checkpoints/ckpt-4.h5";
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    const hid_t dset = H5Dopen2(file, "model/transformer.h.1.mlp.c_fc.weight", H5P_DEFAULT);
    const haddr_t offset = H5Dget_offset(dset);
    H5Dclose(dset);
    H5Fclose(file);
    ASSERT_NE(offset, HADDR_UNDEF);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(offset + 64));
    f.write("corrupted bytes!", 16);
  }
  world.barrier();
  c.train.steps = 6;
  apps::Trainer resumed(c, nullptr, &world);
  EXPECT_EQ(resumed.train().first_step, 2) << "the damaged ckpt-4 must be skipped";

  // checkpoint.dir under a regular file cannot be created: every rank stops before its first
  // step, not at the first checkpoint.
  io::Config bad = config(data, dir + "/bad", layout, "checkpoint: {every: 1}\n");
  bad.checkpoint.dir = data + "/checkpoints";
  bad.train.steps = 2;
  apps::Trainer trainer(bad, nullptr, &world);
  int64_t steps_run = 0;
  trainer.set_step_callback([&](int64_t) { ++steps_run; });
  try {
    trainer.train();
    FAIL() << "wrote a checkpoint into " << bad.checkpoint.dir;
  } catch (const apps::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.dir: cannot create or write '" + data +
                                         "/checkpoints'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(steps_run, 0);
}

// Save under one layout, resume under another: the checkpoint holds logical tensors.
// checkpoint.resume: PATH continues that file's run bitwise (train.steps the total); the
// fine-tune resets make a new run from its weights: both resets equal a fresh run started from
// those weights, and what is not reset goes on (the LR at the checkpoint's step, or the moments).
// A missing or damaged file, and a log.dir that cannot be created, stop every rank, named.
TEST(Checkpoint, ResumesFromAFileAndFineTunesWithResets) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const std::string dir = fresh_dir(world, "file" + std::to_string(world.size()));
  const Layout layout{world.size(), 1, 1, world.size() > 1 ? 1 : 0};
  const auto run = [&](const std::string& name, const std::string& extra, int64_t steps,
                       const std::vector<std::string>& sets = {}) {
    io::Config c = config(data, dir + "/" + name, layout, extra);
    if (!sets.empty()) c = io::parse_config(c.text, "test", sets);  // as --set would
    c.train.steps = steps;
    return apps::Trainer(c, nullptr, &world).train();
  };
  const auto lrs = [&](const std::string& name) {
    std::vector<double> lr;
    if (world.rank() == 0) lr = test::read_metrics_h5(dir + "/" + name + "/metrics.h5")["lr"];
    return lr;
  };
  // The straight 10-step run, checkpointed after steps 4 and 8 (and 10).
  const apps::TrainSummary all = run("straight", "checkpoint: {every: 4, keep: 5}\n", 10);
  const std::string ckpt4 = dir + "/straight/checkpoints/ckpt-4.h5";

  // Continue from the file: steps 5..10 bitwise (another log.dir, nothing to find there).
  const apps::TrainSummary rest = run("continued", "checkpoint: {resume: " + ckpt4 + "}\n", 10);
  EXPECT_EQ(rest.first_step, 4);
  ASSERT_EQ(rest.losses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(rest.losses[i], all.losses[4 + i]) << "step " << 5 + i << ": not bitwise";
  }
  if (world.rank() == 0) {
    const std::vector<double> straight = lrs("straight"), continued = lrs("continued");
    ASSERT_EQ(continued.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(continued[i], straight[4 + i]) << "lr, step " << 5 + i;
  }

  // Both resets: the same as a fresh 6-step run whose initial weights are step 4's.
  const std::string tune = "checkpoint: {resume: " + ckpt4 + "}\n";
  const apps::TrainSummary both =
      run("both", tune, 6, {"train.reset_optimizer=true", "train.reset_schedule=true"});
  // Nothing left to train: four/model.h5 is ckpt-4's weights, as the run ends with them.
  EXPECT_TRUE(run("four", tune, 4).losses.empty());
  io::Config fresh_config = config(data, dir + "/fresh", layout);
  fresh_config.train.steps = 6;
  apps::Trainer fresh(fresh_config, nullptr, &world);
  fresh.load_weights(dir + "/four/model.h5");
  const apps::TrainSummary from_weights = fresh.train();
  EXPECT_EQ(both.first_step, 0);
  ASSERT_EQ(both.losses.size(), 6u);
  ASSERT_EQ(from_weights.losses.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(both.losses[i], from_weights.losses[i]) << "fine-tune step " << i + 1;
  }
  EXPECT_NE(both.losses[0], all.losses[0]) << "the fine-tune did not start from step 4's weights";

  // reset_optimizer alone: fresh moments, but the LR goes on from step 4 along a schedule over
  // 4 + 6 steps (the straight run's). reset_schedule alone: the restored moments, the LR from 0.
  const apps::TrainSummary moments_reset =
      run("optimizer", tune, 6, {"train.reset_optimizer=true"});
  const apps::TrainSummary schedule_reset =
      run("schedule", tune, 6, {"train.reset_schedule=true"});
  EXPECT_EQ(moments_reset.losses[0], both.losses[0]);  // same weights, same first batch
  EXPECT_EQ(schedule_reset.losses[0], both.losses[0]);
  EXPECT_NE(moments_reset.losses[1], both.losses[1]) << "the LR was not the continued one";
  EXPECT_NE(schedule_reset.losses[1], both.losses[1]) << "the moments were not restored";
  if (world.rank() == 0) {
    const std::vector<double> straight = lrs("straight"), optimizer = lrs("optimizer"),
                              schedule = lrs("schedule"), both_lr = lrs("both");
    ASSERT_EQ(optimizer.size(), 6u);
    ASSERT_EQ(schedule.size(), 6u);
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(optimizer[i], straight[4 + i]) << "continued lr, fine-tune step " << i + 1;
      EXPECT_EQ(schedule[i], both_lr[i]) << "restarted lr, fine-tune step " << i + 1;
    }
    EXPECT_LT(schedule[0], schedule[1]);  // warm-up again
  }
  // An interrupted fine-tune continues on its own curve: each single-reset fine-tune again, with
  // checkpoints, then continued from its own ckpt-2 (no reset keys: that file's run goes on)
  // equals the uninterrupted one bitwise, LR included (the continued schedule's offset and the
  // AdamW updates from before the fine-tune's step 0 are in its checkpoints).
  for (const std::string reset : {"optimizer", "schedule"}) {
    SCOPED_TRACE(reset);
    const apps::TrainSummary& whole = reset == "optimizer" ? moments_reset : schedule_reset;
    const std::string name = reset + "_ck";
    const apps::TrainSummary again =
        run(name, "checkpoint: {resume: " + ckpt4 + ", every: 2, keep: 5}\n", 6,
            {"train.reset_" + reset + "=true"});
    ASSERT_EQ(again.losses.size(), 6u);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(again.losses[i], whole.losses[i]) << i;
    const std::string ckpt2 = dir + "/" + name + "/checkpoints/ckpt-2.h5";
    const apps::TrainSummary rest2 =
        run(name + "_rest", "checkpoint: {resume: " + ckpt2 + "}\n", 6);
    EXPECT_EQ(rest2.first_step, 2);
    ASSERT_EQ(rest2.losses.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(rest2.losses[i], whole.losses[2 + i]) << "fine-tune step " << 3 + i;
    }
    if (world.rank() == 0) {
      const std::vector<double> a = lrs(reset), b = lrs(name + "_rest");
      ASSERT_EQ(b.size(), 4u);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(b[i], a[2 + i]) << "lr, fine-tune step " << 3 + i;
    }
  }

  // A missing file and a damaged one are errors naming the key and the path: a bad config
  // value (exit 2) and a bad file (exit 3, apps::DataFileError).
  const auto error_of = [&](const std::string& name, const std::string& extra) {
    try {
      run(name, extra, 6);
    } catch (const io::ConfigError& e) {
      return "config: " + std::string(e.what());
    } catch (const apps::DataFileError& e) {
      return "file: " + std::string(e.what());
    }
    ADD_FAILURE() << name << ": no error";
    return std::string();
  };
  const std::string missing = dir + "/straight/checkpoints/ckpt-5.h5";
  std::string what = error_of("missing", "checkpoint: {resume: " + missing + "}\n");
  EXPECT_EQ(what.find("config: checkpoint.resume: '" + missing + "' is not a checkpoint file (no "
                      "such file"), 0u) << what;
  what = error_of("typo", "checkpoint: {resume: auot}\n");
  EXPECT_EQ(what.find("config: "), 0u) << what;
  EXPECT_NE(what.find("did you mean 'auto'?"), std::string::npos) << what;
  const std::string damaged = dir + "/damaged.h5";
  if (world.rank() == 0) {
    std::filesystem::copy_file(ckpt4, damaged);
    std::filesystem::resize_file(damaged, std::filesystem::file_size(damaged) / 2);
  }
  world.barrier();
  what = error_of("damaged", "checkpoint: {resume: " + damaged + "}\n");
  EXPECT_EQ(what.find("file: checkpoint.resume: cannot read checkpoint file '" + damaged + "'"),
            0u) << what;
  // log.dir under a regular file cannot be created: every rank fails, naming it.
  io::Config bad = config(data, data + "/run", layout);
  bad.train.steps = 1;
  try {
    apps::Trainer(bad, nullptr, &world).train();
    ADD_FAILURE() << "trained into " << bad.log.dir;
  } catch (const apps::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("log.dir: cannot create or write '" + data + "/run'"),
              std::string::npos) << e.what();
  }
}

void resumes_under_another_layout(const std::string& arch) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const std::string dir = fresh_dir(world, arch + "layout" + std::to_string(world.size()));
  // 2 ranks: tp2 -> dp2 with ZeRO-3. 4 ranks: tp2 x dp2 with ZeRO-2 -> pp2 x dp2 with ZeRO-1.
  const Layout before = world.size() == 2 ? Layout{1, 2, 1, 0} : Layout{2, 2, 1, 2};
  const Layout after = world.size() == 2 ? Layout{2, 1, 1, 3} : Layout{2, 1, 2, 1};
  const std::string every = "checkpoint: {every: 4, resume: auto}\n";

  apps::Trainer reference(
      config(data, dir + "/ref" + std::to_string(world.rank()), Layout{}, "", arch), nullptr);
  const apps::TrainSummary all = reference.train();

  train_and_stop(config(data, dir + "/run", before, every, arch), world, 6);
  apps::Trainer resumed(config(data, dir + "/run", after, every, arch), nullptr, &world);
  const apps::TrainSummary rest = resumed.train();
  EXPECT_EQ(rest.first_step, 6);
  ASSERT_EQ(rest.losses.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(rest.losses[i], all.losses[6 + i], 1e-5 * all.losses[6 + i]) << "step " << 7 + i;
  }
  test::expect_same_weights(resumed, reference);
}

TEST(Checkpoint, ResumesUnderAnotherLayout) { resumes_under_another_layout("gpt2"); }

// ZeRO-3 with every optimizer chunk and half of each parameter shard on the host: a checkpoint
// taken there resumes under tensor parallelism, and one taken under tensor parallelism resumes
// into it, with the losses of one uninterrupted rank (moments and parameters go through the
// logical checkpoint wherever they live; the host shard's device copy is refreshed on load).
TEST(Checkpoint, ResumesAcrossPartialParameterOffload) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const std::string every = "checkpoint: {every: 4, resume: auto}\n";
  auto offloaded = [&](const std::string& dir) {
    io::Config c = config(data, dir, Layout{2, 1, 1, 3}, every);
    c.parallel.offload_optimizer = true;
    c.parallel.offload_params = true;
    c.parallel.offload_params_fraction = 0.5;
    return c;
  };
  const std::string dir = fresh_dir(world, "params_half");
  apps::Trainer reference(config(data, dir + "/ref" + std::to_string(world.rank()), Layout{}),
                          nullptr);
  const apps::TrainSummary all = reference.train();
  for (const bool into : {false, true}) {
    const std::string run = dir + (into ? "/into" : "/out_of");
    const io::Config tensor = config(data, run, Layout{1, 2, 1, 0}, every);
    train_and_stop(into ? tensor : offloaded(run), world, 6);
    apps::Trainer resumed(into ? offloaded(run) : tensor, nullptr, &world);
    const apps::TrainSummary rest = resumed.train();
    EXPECT_EQ(rest.first_step, 6);
    ASSERT_EQ(rest.losses.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(rest.losses[i], all.losses[6 + i], 1e-5 * all.losses[6 + i])
          << (into ? "into" : "out of") << " offload, step " << 7 + i;
    }
    test::expect_same_weights(resumed, reference);
  }
}

// LLaMA's tensors (Hugging Face names, untied lm_head split by vocabulary rows under tensor
// parallelism, grouped k/v) go through the same logical checkpoint.
TEST(Checkpoint, ResumesLlamaUnderAnotherLayout) { resumes_under_another_layout("llama"); }

// Per tensor, the relative L1 difference of two checkpoints' dataset values.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b,
                           const core::ParamSpec& p) {
  double diff = 0, size = 0;
  for (std::size_t i = p.offset; i < p.offset + p.count; ++i) {
    diff += std::abs(double(a[i]) - double(b[i]));
    size += std::abs(double(b[i]));
  }
  return size == 0 ? diff : diff / size;
}

// The collective save and load under each layout: the file holds the same datasets as one
// rank's (the parameters bitwise those the old gather path assembles, the moments within fp32
// rounding of one rank's), every rank reads only its part of it on resume, the same layout
// resumes bitwise, another layout and one rank resume with the same losses.
TEST(Checkpoint, CollectiveSavesMatchOneRankAndEachRankReadsOnlyItsPart) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() == 1) GTEST_SKIP() << "needs 2 or 4 ranks";
  const std::string data = test::shared_training_text(world, "colossal_ckpt_data.txt", 99);
  const std::string dir = fresh_dir(world, "collective" + std::to_string(world.size()));
  const std::string every = "checkpoint: {every: 4, keep: 3, resume: auto}\n";
  const std::vector<Layout> layouts =
      world.size() == 2
          ? std::vector<Layout>{{1, 2, 1, 0}, {1, 1, 2, 0}, {2, 1, 1, 3}, {1, 1, 1, 2, 2}}
          : std::vector<Layout>{{2, 2, 1, 2}, {2, 1, 2, 1}, {4, 1, 1, 3}, {1, 2, 2, 0},
                                {1, 2, 1, 3, 2}};
  io::Config one = config(data, dir + "/ref" + std::to_string(world.rank()), Layout{}, every);
  one.train.steps = 6;
  apps::Trainer reference(one, nullptr);
  const apps::TrainSummary all = reference.train();
  const auto table = reference.logical_table();
  const std::size_t floats = core::parameter_units(table, 16).back().end;
  std::size_t elements = 0;  // of every dataset together
  for (const auto& p : table) elements += 3 * p.count;
  std::vector<float> ref_params(floats), ref_m(floats), ref_v(floats);
  io::read_checkpoint(dir + "/ref" + std::to_string(world.rank()) + "/checkpoints/ckpt-4.h5",
                      table, ref_params, ref_m, ref_v);

  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const Layout& layout = layouts[i];
    SCOPED_TRACE(layout.name());
    const std::string run = dir + "/" + layout.name();
    std::vector<float> saved_params;
    {
      io::Config c = config(data, run, layout, every);
      c.train.steps = 6;  // the learning-rate schedule of the reference
      apps::Trainer trainer(c, nullptr, &world);
      trainer.set_step_callback([&](int64_t done) {
        if (done == 4 && world.rank() == 0) apps::request_stop(SIGUSR1);
      });
      trainer.train();
      apps::request_stop(0);
      saved_params = trainer.logical_parameters();  // the gather path, as a reference
    }
    const std::string ckpt = run + "/checkpoints/ckpt-4.h5";
    if (world.rank() == 0) {
      std::vector<float> params(floats), m(floats), v(floats);
      io::read_checkpoint(ckpt, table, params, m, v);  // integrity and every crc32 checked
      for (const auto& p : table) {
        EXPECT_TRUE(std::equal(params.begin() + p.offset, params.begin() + p.offset + p.count,
                               saved_params.begin() + p.offset))
            << p.name << ": not the trainer's parameters";
        EXPECT_LT(relative_difference(params, ref_params, p), 1e-4) << p.name;
        EXPECT_LT(relative_difference(m, ref_m, p), 1e-3) << p.name << "/m";
        EXPECT_LT(relative_difference(v, ref_v, p), 1e-3) << p.name << "/v";
      }
    }
    // Same layout: the resumed steps are bitwise those of a straight run, and no rank read more
    // than its part (every element is read by some rank; ZeRO-3 reads each exactly once).
    io::Config straight_config = config(data, run + "-straight", layout);
    straight_config.train.steps = 6;
    const apps::TrainSummary straight = apps::Trainer(straight_config, nullptr, &world).train();
    io::Config again = config(data, run, layout, every);
    again.train.steps = 6;
    const uint64_t before = io::checkpoint_elements_read();
    const apps::TrainSummary resumed = apps::Trainer(again, nullptr, &world).train();
    const double read = double(io::checkpoint_elements_read() - before);
    ASSERT_EQ(resumed.first_step, 4);
    ASSERT_EQ(resumed.losses.size(), 2u);
    EXPECT_EQ(resumed.losses[0], straight.losses[4]) << "not bitwise";
    EXPECT_EQ(resumed.losses[1], straight.losses[5]) << "not bitwise";
    EXPECT_LT(read, (world.size() == 4 ? 0.7 : 0.9) * double(elements))
        << "rank " << world.rank() << " read most of the file";
    const double total = world.all_reduce_sum_value(read);
    EXPECT_GE(total, double(elements));
    if (layout.stage == 3 && layout.data == world.size()) {
      EXPECT_EQ(total, double(elements)) << "ZeRO-3 ranks read disjoint parts";
    }
    if (layout.tensor == world.size()) {  // each its part, and the replicated tensors all
      double replicated = 0;
      for (const auto& p : core::parameter_table(one.model, 16, {layout.tensor, 0})) {
        if (p.shard.replicated()) replicated += 3.0 * double(p.count);
      }
      EXPECT_EQ(total, double(elements) + (layout.tensor - 1) * replicated);
    }
    // Another layout, and one rank, resume from a copy of the same checkpoint.
    const Layout& next = layouts[(i + 1) % layouts.size()];
    const std::string other = dir + "/" + layout.name() + "-as-" + next.name();
    if (world.rank() == 0) {
      std::filesystem::create_directories(other + "/checkpoints");
      std::filesystem::copy_file(ckpt, other + "/checkpoints/ckpt-4.h5");
      std::filesystem::create_directories(other + "-one/checkpoints");
      std::filesystem::copy_file(ckpt, other + "-one/checkpoints/ckpt-4.h5");
    }
    world.barrier();
    io::Config moved = config(data, other, next, every);
    moved.train.steps = 6;
    const apps::TrainSummary after = apps::Trainer(moved, nullptr, &world).train();
    ASSERT_EQ(after.losses.size(), 2u);
    for (int k = 0; k < 2; ++k) {
      EXPECT_NEAR(after.losses[k], all.losses[4 + k], 1e-5 * all.losses[4 + k])
          << "resumed as " << next.name() << ", step " << 5 + k;
    }
    if (world.rank() == 0) {
      io::Config alone = config(data, other + "-one", Layout{}, every);
      alone.train.steps = 6;
      const apps::TrainSummary single = apps::Trainer(alone, nullptr).train();
      ASSERT_EQ(single.losses.size(), 2u);
      for (int k = 0; k < 2; ++k) {
        EXPECT_NEAR(single.losses[k], all.losses[4 + k], 1e-5 * all.losses[4 + k])
            << "resumed on one rank, step " << 5 + k;
      }
    }
    world.barrier();
  }
}

}  // namespace
