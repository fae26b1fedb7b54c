// Time per kind of work in the training step, for `colossal_train --profile-steps N`: shows where
// the next bottleneck is. Off by default; a disabled scope costs one branch. Scopes fence the
// Kokkos execution space when they open and when they close, so device kernels are timed, not
// just launched, and work queued before a scope (outside any, or a collective still running) is
// not billed to it. The profiled steps lose the overlap of kernels with communication that the
// other steps have.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

namespace colossal::core {

enum class WorkKind : int {
  gemm, attention, layernorm, activation, embedding, loss, optimizer, communication, data, count
};

const char* work_kind_name(WorkKind kind);
// A short identifier ("gemm", "attention", ...) for column names such as time_gemm_seconds.
const char* work_kind_key(WorkKind kind);

class Profiler {
 public:
  static constexpr int kKinds = static_cast<int>(WorkKind::count);

  class Scope {
   public:
    Scope(Profiler* profiler, WorkKind kind) : profiler_(profiler), kind_(kind) {
      if (!active()) return;
      Kokkos::fence();
      start_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (!active()) return;
      Kokkos::fence();
      profiler_->seconds_[static_cast<int>(kind_)] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    bool active() const { return profiler_ != nullptr && profiler_->enabled_; }
    Profiler* profiler_;
    WorkKind kind_;
    std::chrono::steady_clock::time_point start_;
  };

  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  void reset() { seconds_.fill(0.0); }
  double seconds(WorkKind kind) const { return seconds_[static_cast<int>(kind)]; }
  double total() const;
  // A table: kind, seconds per step, share of the measured step time. With `predicted` (the
  // cost model's seconds per step by kind, kKinds of them and then the untimed rest; negative
  // where it predicts none) and the predicted step, a column of predictions and the measured
  // time against each.
  std::string table(int steps, double step_seconds, const std::vector<double>& predicted = {},
                    double predicted_step = 0.0) const;

 private:
  bool enabled_ = false;
  std::array<double, kKinds> seconds_{};
};

}  // namespace colossal::core
