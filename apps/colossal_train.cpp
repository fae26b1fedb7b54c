// colossal_train: trains a GPT-2/OPT model from a YAML experiment config.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <vector>
#include <string>

#include "apps/cli.hpp"
#include "apps/layout.hpp"
#include "apps/memory_fit.hpp"
#include "apps/offload_policy.hpp"
#include "core/host_threads.hpp"
#include "apps/trainer.hpp"
#include "planner/cost_model.hpp"
#include "planner/search.hpp"
#include "core/memory.hpp"

using namespace colossal;

namespace {
// SIGTERM (scancel, pre-emption) and SIGUSR1 (#SBATCH --signal=USR1@120): finish the step,
// write a checkpoint, exit 0.
extern "C" void on_stop_signal(int signal) { apps::request_stop(signal); }

// --memory-plan's report (rank 0): whose memory `summary` is, and the largest rank's bytes, and
// where ZeRO offloads some to the host, the largest rank's bytes without them (what a GPU holds).
// `rows`: whose memory (e.g. "rank 0") and its summary, one line each.
void print_memory_plan(std::FILE* log,
                       const std::vector<std::pair<std::string, std::string>>& rows,
                       double largest, double largest_not_offloaded) {
  for (const auto& [whose, summary] : rows) {
    std::fprintf(log, "memory plan (%s): %s\n", whose.c_str(), summary.c_str());
  }
  std::fprintf(log, "memory plan: largest rank needs %s (%.0f bytes)\n",
               colossal::core::format_bytes(largest).c_str(), largest);
  if (largest_not_offloaded < largest) {
    std::fprintf(log,
                 "memory plan: largest rank needs %s (%.0f bytes) without its offloaded "
                 "(host) bytes, the device's part on a GPU\n",
                 colossal::core::format_bytes(largest_not_offloaded).c_str(),
                 largest_not_offloaded);
  }
}

void print_outputs(std::FILE* log, const colossal::io::Config& config,
                   const colossal::apps::TrainSummary& s);

// The end-of-run summary (rank 0), for every tensor mode.
void print_summary(std::FILE* log, const colossal::io::Config& config,
                   const colossal::apps::TrainSummary& s) {
  using namespace colossal;
  if (s.stopped) {  // on request: no model file, the checkpoint to continue from
    std::fprintf(log, "\n== stopped ==\nsteps %lld to %lld in %.1fs; checkpoint %s\n",
                 (long long)s.first_step, (long long)s.steps, s.seconds, s.checkpoint.c_str());
    return;
  }
  std::fprintf(log, "\n== summary ==\n");
  if (s.steps == s.first_step) {  // resumed at train.steps: no step, so no rate or loss to show
    std::fprintf(log, "no step run: the checkpoint was at step %lld = train.steps\n",
                 (long long)s.steps);
    if (s.val_loss >= 0) std::fprintf(log, "val loss %.6g\n", s.val_loss);
    print_outputs(log, config, s);
    return;
  }
  std::fprintf(log, "steps %lld in %.1fs (%lld skipped) | train loss %.4f -> %.4f\n",
               (long long)s.steps, s.seconds, (long long)s.skipped_steps, s.first_loss,
               s.last_loss);
  if (s.val_loss >= 0) std::fprintf(log, "val loss %.6g\n", s.val_loss);
  if (s.choice_accuracy >= 0) {
    std::fprintf(log, "choices accuracy %.4f per token, %.4f total (eval.choices)\n",
                 s.choice_accuracy, s.choice_accuracy_total);
  }
  std::fprintf(log, "throughput %.0f tokens/s | MFU %.1f%% of %.2f TFLOP/s\n", s.tokens_per_s,
               100.0 * s.mfu, s.peak_flops / 1e12);
  std::fprintf(log, "memory: tracked peak %s, process peak RSS %s\n",
               core::format_bytes(double(s.peak_tracked_bytes)).c_str(),
               core::format_bytes(double(s.peak_rss_bytes)).c_str());
  if (s.device_added_bytes > 0) {
    // What the libraries and the allocator take beside the tracked arrays (the CUDA context is
    // in the baseline): the share of the device a plan must leave free.
    const double added = double(s.device_added_bytes), tracked = double(s.peak_tracked_bytes);
    std::fprintf(log,
                 "device memory: this run added %s at most (cudaMemGetInfo after each step, every "
                 "process on the GPU counted), %s of it outside this rank's tracker (cuBLAS and "
                 "NCCL workspaces, the GEMMs' rounding scratch, the allocator's slack; where "
                 "ranks share the GPU, also the others' arrays)\n",
                 core::format_bytes(added).c_str(),
                 core::format_bytes(added > tracked ? added - tracked : 0.0).c_str());
  }
  const double step_s =
      s.tokens_per_s > 0 ? double(config.train.global_batch) * config.train.seq_len / s.tokens_per_s
                         : 0.0;
  if (s.predicted_step_seconds > 0) {  // the cost model covers the 1d layouts
    std::fprintf(log,
                 "cost model (rank 0): step %.3f s predicted, %.3f s measured (%+.0f%%); "
                 "memory %s predicted, %s tracked\n",
                 s.predicted_step_seconds, step_s,
                 step_s > 0 ? 100.0 * (s.predicted_step_seconds / step_s - 1.0) : 0.0,
                 core::format_bytes(s.predicted_peak_bytes).c_str(),
                 core::format_bytes(double(s.peak_tracked_bytes)).c_str());
    // A preset is some other machine's rates: say how to get this one's, which the planner's
    // choices (parallel.mode: auto, model.fused_attention: auto, rotor) then use.
    if (config.hardware.file.empty() && step_s > 0 &&
        std::abs(s.predicted_step_seconds / step_s - 1.0) > 0.5) {
      std::fprintf(log,
                   "cost model: hardware.preset %s is off by more than half here; "
                   "'colossal_plan --calibrate --out hw.yaml' measures this machine in under a "
                   "minute, and hardware.file: hw.yaml makes the planner's choices with its "
                   "rates\n",
                   config.hardware.preset.c_str());
    }
  }
  print_outputs(log, config, s);
}

// The summary's last lines: where the model and metrics are, and the sample.
void print_outputs(std::FILE* log, const colossal::io::Config& config,
                   const colossal::apps::TrainSummary& s) {
  const std::string choices =
      config.eval.choices.empty() ? "" : " and " + config.log.dir + "/choices.csv";
  if (s.model_path.empty()) {
    std::fprintf(log, "no model file (log.save_model: false); metrics in %s/metrics.csv%s\n",
                 config.log.dir.c_str(), choices.c_str());
  } else {
    std::fprintf(log, "model written to %s; metrics in %s/metrics.csv%s\n",
                 s.model_path.c_str(), config.log.dir.c_str(), choices.c_str());
  }
  if (!s.sample.empty()) {
    std::fprintf(log, "sample (%d tokens after \"%s\"%s):\n", s.sample_tokens,
                 config.sample.prompt.c_str(),
                 s.sample_tokens < config.sample.tokens ? ", ended by a stop token" : "");
    std::string text = config.sample.prompt + s.sample;
    if (text.empty() || text.back() != '\n') text += '\n';  // ended by a newline stop token
    std::fwrite(text.data(), 1, text.size(), log);
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
  apps::ProgramInfo info{
      "colossal_train",
      "usage: colossal_train CONFIG [--set KEY=VALUE ...] [--print-config]\n"
      "                      [--eval-only --weights MODEL.h5]\n\n"
      "Trains the model the config describes with AdamW on its token data. Prints a progress line\n"
      "every log.every steps, validates every eval.every steps, writes log.dir/metrics.csv and the\n"
      "final weights to log.dir/model.h5 (HDF5, Hugging Face names), then a summary.\n"
      "Checkpoints every checkpoint.every steps; on SIGTERM or SIGUSR1 it finishes the step,\n"
      "writes a checkpoint and exits 0; checkpoint.resume: auto continues from the newest.\n"
      "In a Slurm job (SLURM_JOB_ID set) it prints the job, step, node and task, and unless\n"
      "--set log.dir=DIR is given the run directory is log.dir + '-<job id>' (an array task:\n"
      "'-<array job id>_<task id>'), the same after a requeue. The GPU (CUDA builds) is the local\n"
      "rank (SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK) modulo the visible devices.\n\n"
      "Program options:\n"
      "  --eval-only            do not train: print the validation loss of --weights (and its\n"
      "                         eval.choices accuracy, when set)\n"
      "  --weights FILE         model file to evaluate (with --eval-only)\n"
      "  --profile-steps N      run 1 + N steps and print the time per kind of work (GEMM,\n"
      "                         attention, layernorm, optimizer, communication, ...) of the last N;\n"
      "                         no model file is written\n"
      "  --trace FILE           write Chrome trace-event JSON of every step's forward, backward,\n"
      "                         send, receive, gradient reduction and optimizer spans (FILE on\n"
      "                         one rank, FILE.rankN.json per rank otherwise; open in Perfetto)\n"
      "  --memory-plan          allocate nothing and train nothing: print the memory every rank\n"
      "                         of this layout would allocate, by category, and exit (every buffer\n"
      "                         is allocated once at start-up, so this is the run's tracked peak);\n"
      "                         with --eval-only, what evaluating needs (no gradients, no AdamW)\n",
      {"--weights", "--profile-steps", "--trace"},
      {"--eval-only", "--memory-plan"},
      /*print_threads=*/true};
  info.slurm_run_dir = true;
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    std::FILE* log = inv.rank == 0 ? stdout : nullptr;
    if (inv.has("--weights") && !inv.has("--eval-only")) {
      throw apps::UsageError("--weights is read with --eval-only only; to train from a model "
                             "file, set model.init_from: MODEL.h5 (or a Hugging Face folder)");
    }
    if (inv.config.parallel.mode == io::ParallelMode::automatic) {
      std::string report;
      inv.config = apps::plan_automatically(inv.config, *inv.world,
                                            core::HostThreads::shared().size(), &report);
      if (log) {
        std::fprintf(log, "parallel.mode: auto: planned for %d rank(s)\n%s", inv.world_size,
                     report.c_str());
      }
    }
    // model.fused_attention: auto on a fixed layout (parallel.mode: auto has decided it).
    inv.config = apps::plan_attention(inv.config, *inv.world, core::HostThreads::shared().size(),
                                      log);
    // --eval-only runs an inference trainer (the parameters and a forward's activations: no
    // gradients or optimizer state), and its memory plan is that one's. Its weights are
    // --weights': a model.init_from is not read first.
    const bool eval_only = inv.has("--eval-only");
    if (eval_only) inv.config.model_init_from.clear();
    // parallel.zero.offload.policy: auto decides the offload flags from the memory plan of a
    // training step (not evaluation's, which holds no optimizer state to offload).
    try {
      if (!eval_only) inv.config = apps::apply_offload_policy(inv.config, log);
    } catch (const std::invalid_argument& e) {
      throw apps::CollectiveError(e.what());  // decided alike on every rank
    }
    // Before anything is allocated: does every node hold its ranks' memory plan?
    // (--eval-only scores eval.choices, no sample: a grid's world rank 0 builds a whole-model
    // scorer for them, which the check counts.)
    if (!inv.has("--memory-plan")) {
      apps::check_memory_fits(inv.config, {.inference = eval_only,
                                           .scores = eval_only && !inv.config.eval.choices.empty()});
    }
    if (inv.config.parallel.tensor_mode != core::TensorMode::d1) {
      // 2d / 2.5d / 3d run on the same trainer as 1d (below).
      if (inv.has("--memory-plan")) {
        // Every rank of a grid (of one pipeline stage) holds the same bytes; the closed forms,
        // with the checkpoint schedule's dropped blocks and arena, equal the tracker
        // (tests/test_tensor_md.cpp), so nothing is allocated.
        if (log == nullptr) return 0;
        const auto& p = inv.config.parallel;
        const std::string mode = core::tensor_mode_name(p.tensor_mode);
        const int per_stage = p.data * p.tensor * p.sequence;  // the mesh: the stage outermost
        std::vector<std::pair<std::string, std::string>> rows;
        double largest = 0.0, device = 0.0;
        for (int stage = 0; stage < p.pipeline; ++stage) {
          const planner::MemoryPrediction m =
              apps::rank_memory(inv.config, per_stage * stage, eval_only);
          largest = std::max(largest, m.total());
          device = std::max(device, m.device());
          rows.emplace_back("every rank" +
                                (p.pipeline > 1 ? " of pipeline stage " + std::to_string(stage)
                                                : std::string()) +
                                ", " + mode,
                            m.format());
        }
        print_memory_plan(log, rows, largest, device);
        return 0;
      }
    }
    if (inv.has("--memory-plan")) {
      apps::Trainer plan(inv.config, nullptr, inv.world,
                         apps::TrainerOptions{.memory_plan = true, .inference = eval_only});
      // Ranks differ (tensor and ZeRO shards, sequence chunks): report the largest.
      // The offloaded (pinned host) bytes are allocated once, at start-up: without them the
      // peak is the device's.
      // The largest of every rank's total and device bytes: one max over MPI_COMM_WORLD (the
      // world communicator has no double max; its scalar sums took two calls a rank).
      const double mine = double(plan.memory().peak_total());
      const double offloaded = double(plan.memory().peak(core::MemCategory::offloaded));
      double largest[2] = {mine, mine - offloaded};
      MPI_Allreduce(MPI_IN_PLACE, largest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (log) print_memory_plan(log, {{"rank 0", plan.memory().summary()}}, largest[0], largest[1]);
      return 0;
    }
    apps::Trainer trainer(inv.config, log, inv.world, apps::TrainerOptions{.inference = eval_only});
    trainer.set_trace(inv.flag("--trace"));
    if (eval_only) {
      const std::string weights = inv.flag("--weights");
      if (weights.empty()) throw apps::UsageError("--eval-only needs --weights MODEL.h5");
      const bool choices = !inv.config.eval.choices.empty();
      const std::vector<io::ChoiceExample> examples =
          choices ? apps::load_choices(*inv.world, inv.config.eval.choices, "eval.choices",
                                       inv.config, inv.config.eval.choices_examples)
                  : std::vector<io::ChoiceExample>{};
      trainer.load_weights(weights);
      if (!choices || !inv.config.data.val_path.empty()) {
        const double loss = trainer.evaluate();  // collective: every rank evaluates
        if (log) std::fprintf(log, "val loss %.6g\n", loss);
      }
      if (choices) {  // eval.choices (in train.seq_len; colossal_eval fits a shorter window)
        const std::string line = apps::choice_accuracy_line(trainer.score_choices(examples));
        if (log) std::fprintf(log, "%s (eval.choices)\n", line.c_str());
      }
      return 0;
    }
    if (const std::string n = inv.flag("--profile-steps"); !n.empty()) {
      char* end = nullptr;
      const long steps = std::strtol(n.c_str(), &end, 10);
      if (end == n.c_str() || *end != '\0' || steps < 1 || steps >= inv.config.train.steps) {
        throw apps::UsageError("--profile-steps: '" + n + "' must be an integer in [1, " +
                                    std::to_string(inv.config.train.steps - 1) +
                                    "] (train.steps - 1; the first step is a warm-up)");
      }
      trainer.set_profile_steps(static_cast<int>(steps));
      trainer.train();
      return 0;
    }
    const apps::TrainSummary s = trainer.train();
    if (log) print_summary(log, inv.config, s);
    return 0;
  });
}
