#include "core/profiler.hpp"

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

std::string Profiler::table(int steps, double step_seconds) const {
  std::string out;
  char line[160];
  std::snprintf(line, sizeof line, "%-38s %12s %8s\n", "work", "ms per step", "share");
  out += line;
  for (int k = 0; k < kKinds; ++k) {
    const double per_step = seconds_[k] / steps;
    std::snprintf(line, sizeof line, "%-38s %12.1f %7.1f%%\n",
                  work_kind_name(static_cast<WorkKind>(k)), 1e3 * per_step,
                  100.0 * per_step / step_seconds);
    out += line;
  }
  const double other = step_seconds - total() / steps;
  std::snprintf(line, sizeof line, "%-38s %12.1f %7.1f%%\n%-38s %12.1f\n", "other (untimed)",
                1e3 * other, 100.0 * other / step_seconds, "step", 1e3 * step_seconds);
  out += line;
  return out;
}

}  // namespace colossal::core
