// The run log: a training run's bookkeeping beside its step. Rank 0 writes log.dir/config.yaml and
// one row per step into log.dir/metrics.csv and metrics.h5 (docs/metrics-format.md), continuing
// both on a resume; the progress line is printed every log.every steps; and every rank tallies the
// losses, throughput and MFU that end up in the TrainSummary. A trainer's loop runs the step and
// hands the run log a StepRecord of it; nothing here touches the model.
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.hpp"
#include "core/profiler.hpp"
#include "io/config.hpp"

namespace colossal::io {
class MetricsCsv;
class MetricsH5;
}  // namespace colossal::io

namespace colossal::apps {

// What train() returns (every rank alike, files and sample apart).
struct TrainSummary {
  int64_t steps = 0;
  int64_t first_step = 0;          // where a resumed run started
  bool stopped = false;            // stopped early on request (checkpoint written)
  int stop_signal = 0;             // the signal that asked for it (on whichever rank)
  std::string checkpoint;          // the last checkpoint written, if any
  int64_t skipped_steps = 0;       // non-finite steps skipped (train.on_nonfinite: skip)
  std::vector<double> losses;      // mean training loss of every step (global batch)
  double first_loss = 0.0;
  double last_loss = 0.0;
  double val_loss = -1.0;          // < 0 when there is no validation data
  // eval.choices' last accuracy by least loss per token and by least total loss (< 0: none)
  double choice_accuracy = -1.0;
  double choice_accuracy_total = -1.0;
  double seconds = 0.0;
  double tokens_per_s = 0.0;       // over the steps after the first (which pays page faults)
  double mfu = 0.0;
  double peak_flops = 0.0;         // MFU's peak: the whole job's (apps::job_peak_flops)
  std::size_t peak_tracked_bytes = 0;
  std::size_t peak_rss_bytes = 0;
  // On a GPU: the most its used bytes grew over their value before the trainer started
  // (cudaMemGetInfo after each step, every process on the GPU counted), against the tracker's
  // peak; 0 on the host.
  std::size_t device_added_bytes = 0;
  // The cost model's prediction for this rank (planner/cost_model.hpp), to compare.
  double predicted_step_seconds = 0.0;
  double predicted_peak_bytes = 0.0;
  std::string model_path;
  std::string sample;
  int sample_tokens = 0;  // fewer than sample.tokens when a stop token ended it
  std::string profile;             // the --profile-steps table, when profiling
};

// One training step as the run log records it.
struct StepRecord {
  double loss = 0.0;       // mean loss of the global batch (NaN for a skipped step)
  double lr = 0.0;         // the learning rate the step used
  double grad_norm = 0.0;  // global gradient norm before clipping
  double seconds = 0.0;    // wall seconds of the step: no validation, checkpoint or logging
  double val_loss = std::nan("");  // validation loss after the step; NaN when it had none
  // eval.choices after the step (NaN when not scored): the accuracy by least loss per token
  // and by least total loss, the examples scored and the seconds it took.
  double choice_accuracy = std::nan("");
  double choice_accuracy_total = std::nan("");
  double choice_examples = std::nan("");
  double choice_seconds = std::nan("");
  // Seconds per kind of work (core::WorkKind order) when the profiler watched the step.
  std::optional<std::array<double, core::Profiler::kKinds>> work_seconds = std::nullopt;
};

struct RunLogOptions {
  bool writer = false;            // writes log.dir's files (rank 0); other ranks only tally
  int64_t first_step = 0;         // steps done before this run (a resume): the files continue
  std::FILE* log = nullptr;       // progress lines and notes (nullptr: silent)
  double tokens_per_step = 0.0;   // train.global_batch x train.seq_len
  double flops_per_token = 0.0;   // model FLOPs per token (core::flops_per_token)
  double peak_flops = 0.0;        // what MFU is measured against (apps::job_peak_flops)
  const core::MemoryTracker* memory = nullptr;  // whose peaks the rows and the line report
  // Switches to leave out metrics.h5, config.yaml and the line's ETA (the trainer keeps all).
  bool write_h5 = true;
  bool write_config = true;
  bool eta = true;
};

class RunLog {
 public:
  // On the writer: creates log.dir, writes config.yaml, opens metrics.csv and metrics.h5 (from
  // `first_step` > 0 on: continues them, dropping the rows of later steps) and prints what
  // opening metrics.h5 repaired. Throws std::runtime_error / io::H5Error when a file cannot be
  // written. The clock of TrainSummary::seconds starts here, or at start().
  RunLog(const io::Config& config, const RunLogOptions& options);
  ~RunLog();
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;

  // A root attribute of metrics.h5 (the writer's; nothing elsewhere or without metrics.h5).
  // The run log sets config, peak_flops and tokens_per_step itself.
  void set_attribute(const std::string& name, double value);
  void set_attribute(const std::string& name, const std::string& value);

  // The training steps start now (summary seconds count from here).
  void start();
  std::chrono::steady_clock::time_point start_time() const { return start_; }

  enum class Progress { when_due, never };
  // Step `step` (counted from 0) is done: its row in metrics.csv and metrics.h5 (a failed
  // metrics.h5 write warns once and is retried with the next row), its loss and seconds in the
  // tallies, and (when_due) the progress line after step 1, every log.every steps and after the
  // last step, with tokens/s and MFU over the steps since the previous line.
  void record(int64_t step, const StepRecord& record, Progress progress = Progress::when_due);

  // Fills steps (first_step + steps recorded), first_step, losses, first_loss, last_loss,
  // val_loss and choice_accuracy[_total] (the last recorded; -1 when none), seconds since
  // start, tokens_per_s and mfu (over the recorded steps after the first, which pays
  // first-touch page faults; over the whole time when only one was recorded) and
  // peak_tracked_bytes.
  void finish(TrainSummary& summary) const;

  int64_t recorded() const { return int64_t(losses_.size()); }

 private:
  void print(const char* fmt, ...) const;
  void write_rows(int64_t step, const StepRecord& record);

  io::Config config_;
  RunLogOptions options_;
  std::unique_ptr<io::MetricsCsv> csv_;
  std::unique_ptr<io::MetricsCsv> choices_csv_;  // log.dir/choices.csv, with eval.choices
  bool choices_failing_ = false;
  std::unique_ptr<io::MetricsH5> h5_;
  bool h5_failing_ = false;
  bool csv_failing_ = false;
  std::chrono::steady_clock::time_point start_;
  std::vector<double> losses_;
  double timed_seconds_ = 0.0;  // of the recorded steps after the first
  double window_seconds_ = 0.0;  // since the last progress line
  int64_t window_steps_ = 0;
  double val_loss_ = -1.0;
  double choice_accuracy_ = -1.0, choice_accuracy_total_ = -1.0;
};

// The columns of metrics.h5 (docs/metrics-format.md): metrics.csv's, then the tracked peak per
// memory category, then the seconds per kind of work (NaN unless the profiler runs).
std::vector<std::string> metrics_h5_columns();
// "params", "grads", ...: a memory category's name in metrics.h5's columns and attributes.
std::string memory_key(core::MemCategory category);

}  // namespace colossal::apps
