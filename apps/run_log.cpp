#include "apps/run_log.hpp"

#include <cstdarg>
#include <filesystem>
#include <stdexcept>

#include "io/metrics.hpp"

namespace colossal::apps {

namespace {

// "1.5s", "3m07s", "2h05m": the progress line's ETA.
std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  } else {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  }
  return buf;
}

const std::vector<std::string> kCsvColumns{"step",         "loss",         "lr",
                                           "grad_norm",    "tokens_per_s", "mfu",
                                           "step_seconds", "val_loss",     "peak_tracked_bytes"};

const std::vector<std::string> kChoiceColumns{"step",           "accuracy_per_token",
                                              "accuracy_total", "examples",
                                              "seconds"};

}  // namespace

std::string memory_key(core::MemCategory category) {
  const std::string name = core::category_name(category);
  return name.substr(0, name.find(' '));
}

std::vector<std::string> metrics_h5_columns() {
  std::vector<std::string> columns{"step",         "loss",         "val_loss",
                                   "lr",           "grad_norm",    "tokens_per_s",
                                   "mfu",          "step_seconds", "peak_tracked_bytes"};
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    columns.push_back("memory_" + memory_key(core::MemCategory(c)) + "_bytes");
  }
  for (int k = 0; k < core::Profiler::kKinds; ++k) {
    columns.push_back(std::string("time_") + core::work_kind_key(core::WorkKind(k)) + "_seconds");
  }
  return columns;
}

RunLog::RunLog(const io::Config& config, const RunLogOptions& options)
    : config_(config), options_(options), start_(std::chrono::steady_clock::now()) {
  if (options_.memory == nullptr) {
    throw std::invalid_argument("RunLog: options.memory must name the run's memory tracker");
  }
  if (!options_.writer) return;
  std::filesystem::create_directories(config_.log.dir);
  if (options_.write_config) {
    // The resolved config beside the metrics: what this run was, reusable as a config file.
    const std::string path = config_.log.dir + "/config.yaml";
    std::FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("cannot write '" + path + "'; check log.dir");
    std::fwrite(config_.text.data(), 1, config_.text.size(), f);
    std::fclose(f);
  }
  // A resumed run appends, after dropping the rows of steps trained after its checkpoint.
  const int64_t first = options_.first_step;
  const int64_t resume_step = first > 0 ? first : -1;
  const std::string csv_path = config_.log.dir + "/metrics.csv";
  csv_ = std::make_unique<io::MetricsCsv>(csv_path, kCsvColumns, /*append=*/first > 0,
                                          resume_step);
  // One row per scoring of eval.choices (docs/metrics-format.md), continued as metrics.csv is.
  // Without the key, an earlier run's file is removed (a fresh start) or cut back to the
  // checkpoint (a resume), so it never shows passes this run's history does not have.
  const std::string choices_path = config_.log.dir + "/choices.csv";
  if (!config_.eval.choices.empty()) {
    choices_csv_ = std::make_unique<io::MetricsCsv>(choices_path, kChoiceColumns, first > 0,
                                                    resume_step);
  } else if (std::filesystem::exists(choices_path)) {
    if (first > 0) {
      io::MetricsCsv(choices_path, kChoiceColumns, true, resume_step);  // drops the later rows
    } else {
      std::filesystem::remove(choices_path);
    }
  }
  if (!options_.write_h5) return;
  h5_ = std::make_unique<io::MetricsH5>(config_.log.dir + "/metrics.h5", metrics_h5_columns(),
                                        resume_step, csv_path);
  if (!h5_->note().empty()) print("metrics: %s\n", h5_->note().c_str());
  h5_->set_attribute("config", config_.text);
  h5_->set_attribute("peak_flops", options_.peak_flops);
  h5_->set_attribute("tokens_per_step", options_.tokens_per_step);
}

RunLog::~RunLog() = default;

void RunLog::set_attribute(const std::string& name, double value) {
  if (h5_) h5_->set_attribute(name, value);
}

void RunLog::set_attribute(const std::string& name, const std::string& value) {
  if (h5_) h5_->set_attribute(name, value);
}

void RunLog::start() { start_ = std::chrono::steady_clock::now(); }

void RunLog::print(const char* fmt, ...) const {
  if (options_.log == nullptr) return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(options_.log, fmt, args);
  va_end(args);
  std::fflush(options_.log);
}

void RunLog::write_rows(int64_t step, const StepRecord& r) {
  if (!csv_) return;
  const core::MemoryTracker& memory = *options_.memory;
  const double tokens_per_s = options_.tokens_per_step / r.seconds;
  const double flops_per_step = options_.flops_per_token * options_.tokens_per_step;
  const double mfu = flops_per_step / r.seconds / options_.peak_flops;
  const double peak = double(memory.peak_total());
  // A failed write is said once, and again when the file takes the kept rows.
  const auto written = [&](bool ok, bool& failing, const std::string& path,
                           const std::string& error) {
    if (!ok && !failing) {
      print("warning: step %lld: cannot write %s (%s); keeping its rows for the next step\n",
            (long long)step + 1, path.c_str(), error.c_str());
    } else if (ok && failing) {
      print("step %lld: %s written again\n", (long long)step + 1, path.c_str());
    }
    failing = !ok;
  };
  const bool csv_ok = csv_->row({double(step + 1), r.loss, r.lr, r.grad_norm, tokens_per_s, mfu,
                                 r.seconds, r.val_loss, peak});
  written(csv_ok, csv_failing_, csv_->path(), csv_->error());
  if (choices_csv_ && !std::isnan(r.choice_accuracy)) {
    const bool ok = choices_csv_->row({double(step + 1), r.choice_accuracy,
                                       r.choice_accuracy_total, r.choice_examples,
                                       r.choice_seconds});
    written(ok, choices_failing_, choices_csv_->path(), choices_csv_->error());
  }
  if (!h5_) return;
  // The columns of metrics_h5_columns(), in order.
  std::vector<double> row{double(step + 1), r.loss,    r.val_loss, r.lr, r.grad_norm,
                          tokens_per_s,     mfu,       r.seconds,  peak};
  for (int c = 0; c < int(core::MemCategory::count); ++c) {
    row.push_back(double(memory.peak(core::MemCategory(c))));
  }
  for (int k = 0; k < core::Profiler::kKinds; ++k) {
    row.push_back(r.work_seconds ? (*r.work_seconds)[k] : std::nan(""));
  }
  const bool h5_ok = h5_->row(row);
  written(h5_ok, h5_failing_, h5_->path(), h5_->error());
}

void RunLog::record(int64_t step, const StepRecord& r, Progress progress) {
  if (!losses_.empty()) timed_seconds_ += r.seconds;
  losses_.push_back(r.loss);
  if (!std::isnan(r.val_loss)) val_loss_ = r.val_loss;
  if (!std::isnan(r.choice_accuracy)) {
    choice_accuracy_ = r.choice_accuracy;
    choice_accuracy_total_ = r.choice_accuracy_total;
  }
  window_seconds_ += r.seconds;
  ++window_steps_;
  write_rows(step, r);
  if (progress == Progress::never) return;
  const int64_t steps = config_.train.steps, every = config_.log.every;
  const bool last = step + 1 == steps;
  if (!((every > 0 && (step + 1) % every == 0) || last || step == 0)) return;
  const double avg = window_seconds_ / double(window_steps_);
  const double flops_per_step = options_.flops_per_token * options_.tokens_per_step;
  const std::string memory = core::format_bytes(double(options_.memory->peak_total()));
  const std::string eta =
      options_.eta ? " | ETA " + format_duration(avg * double(steps - step - 1)) : "";
  print("step %6lld/%lld | loss %.4f | lr %.3e | grad-norm %.3f | %.0f tok/s | MFU %.1f%% | "
        "mem %s%s\n",
        (long long)step + 1, (long long)steps, r.loss, r.lr, r.grad_norm,
        options_.tokens_per_step / avg, 100.0 * flops_per_step / avg / options_.peak_flops,
        memory.c_str(), eta.c_str());
  window_seconds_ = 0.0;
  window_steps_ = 0;
}

void RunLog::finish(TrainSummary& summary) const {
  summary.first_step = options_.first_step;
  summary.steps = options_.first_step + recorded();
  summary.losses = losses_;
  if (!losses_.empty()) {
    summary.first_loss = losses_.front();
    summary.last_loss = losses_.back();
  }
  summary.val_loss = val_loss_;
  summary.choice_accuracy = choice_accuracy_;
  summary.choice_accuracy_total = choice_accuracy_total_;
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double timed_steps = double(recorded() - 1);
  summary.tokens_per_s = timed_steps > 0    ? options_.tokens_per_step * timed_steps / timed_seconds_
                         : recorded() == 1 ? options_.tokens_per_step / summary.seconds
                                           : 0.0;  // no step run (a resume at train.steps)
  summary.mfu = summary.tokens_per_s * options_.flops_per_token / options_.peak_flops;
  summary.peak_flops = options_.peak_flops;
  summary.peak_tracked_bytes = options_.memory->peak_total();
}

}  // namespace colossal::apps
