#include "core/profiler.hpp"

#include <algorithm>
#include <cstdio>

namespace colossal::core {

const char* work_kind_name(WorkKind kind) {
  switch (kind) {
    case WorkKind::gemm: return "GEMM (linear layers, LM head)";
    case WorkKind::attention: return "attention (scores, softmax, values)";
    case WorkKind::layernorm: return "layernorm";
    case WorkKind::activation: return "GELU / ReLU";
    case WorkKind::embedding: return "embedding";
    case WorkKind::loss: return "softmax cross-entropy";
    case WorkKind::optimizer: return "optimizer (norm, AdamW, zeroing)";
    case WorkKind::communication: return "communication";
    case WorkKind::data: return "data (sampling, upload)";
    default: return "?";
  }
}

const char* work_kind_key(WorkKind kind) {
  switch (kind) {
    case WorkKind::gemm: return "gemm";
    case WorkKind::attention: return "attention";
    case WorkKind::layernorm: return "layernorm";
    case WorkKind::activation: return "activation";
    case WorkKind::embedding: return "embedding";
    case WorkKind::loss: return "loss";
    case WorkKind::optimizer: return "optimizer";
    case WorkKind::communication: return "communication";
    case WorkKind::data: return "data";
    default: return "unknown";
  }
}

double Profiler::total() const {
  double t = 0.0;
  for (double s : seconds_) t += s;
  return t;
}

std::string Profiler::table(int steps, double step_seconds, const std::vector<double>& predicted,
                            double predicted_step) const {
  const bool with = predicted.size() == std::size_t(kKinds) + 1;
  std::string out;
  char line[200];
  // The prediction and how far off it is, as the summary's cost-model line has it (predicted
  // over measured): "-20%" where the cost model said 20% less time than the kind took; "-"
  // where it predicts nothing (negative) or under 10 us (rounding).
  auto against = [&](double measured, double expected) -> std::string {
    char cell[64];
    if (expected < 0) {
      std::snprintf(cell, sizeof cell, "%11s %6s", "-", "-");
    } else if (expected < 1e-5 || measured <= 0) {
      std::snprintf(cell, sizeof cell, "%11.1f %6s", 1e3 * expected, "-");
    } else {
      std::snprintf(cell, sizeof cell, "%11.1f %+5.0f%%", 1e3 * expected,
                    100.0 * (expected / measured - 1.0));
    }
    return "  " + std::string(cell);
  };
  std::snprintf(line, sizeof line, "%-38s %12s %8s%s\n", "work", "ms per step", "share",
                with ? "   predicted ms    off" : "");
  out += line;
  for (int k = 0; k < kKinds; ++k) {
    const double per_step = seconds_[k] / steps;
    std::snprintf(line, sizeof line, "%-38s %12.1f %7.1f%%%s\n",
                  work_kind_name(static_cast<WorkKind>(k)), 1e3 * per_step,
                  100.0 * per_step / step_seconds,
                  with ? against(per_step, predicted[k]).c_str() : "");
    out += line;
  }
  const double other = step_seconds - total() / steps;
  std::snprintf(line, sizeof line, "%-38s %12.1f %7.1f%%%s\n", "other (untimed)", 1e3 * other,
                100.0 * other / step_seconds, with ? against(other, predicted[kKinds]).c_str() : "");
  out += line;
  std::snprintf(line, sizeof line, "%-38s %12.1f %8s%s\n", "step", 1e3 * step_seconds, "",
                with ? against(step_seconds, predicted_step).c_str() : "");
  out += line;
  return out;
}

}  // namespace colossal::core
