#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace colossal::parallel {
namespace {

PipelineSchedule schedule_named(std::string_view kind) {
  const std::optional<PipelineSchedule> parsed = parse_pipeline_schedule(kind);
  if (!parsed) {
    throw std::invalid_argument("unknown pipeline schedule '" + std::string(kind) +
                                "' (allowed: gpipe, 1f1b, interleaved)");
  }
  return *parsed;
}

}  // namespace

std::vector<PipelineAction> pipeline_schedule(std::string_view kind, int stages, int stage,
                                              int micro, int chunks) {
  return pipeline_schedule(schedule_named(kind), stages, stage, micro, chunks);
}

bool schedule_completes(std::string_view kind, int stages, int micro, int chunks) {
  return schedule_completes(schedule_named(kind), stages, micro, chunks);
}

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule kind, int stages, int stage,
                                              int micro, int chunks) {
  if (stages < 1 || stage < 0 || stage >= stages || micro < 1 || chunks < 1) {
    throw std::invalid_argument("pipeline_schedule: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + " with " + std::to_string(micro) +
                                " micro-batches");
  }
  std::vector<PipelineAction> actions;
  if (kind == PipelineSchedule::gpipe) {
    for (int i = 0; i < micro; ++i) actions.push_back({true, i});
    for (int i = 0; i < micro; ++i) actions.push_back({false, i});
    return actions;
  }
  if (kind == PipelineSchedule::interleaved) {
    if (micro % stages != 0) {
      throw std::invalid_argument("the interleaved schedule needs the micro-batch count (" +
                                  std::to_string(micro) + ") to be a multiple of the stages (" +
                                  std::to_string(stages) + ")");
    }
    // The k-th forward (backward) of this rank: chunk and micro-batch.
    const int total = micro * chunks;
    auto forward = [&](int k) {
      return PipelineAction{true, (k / (stages * chunks)) * stages + k % stages,
                            (k / stages) % chunks};
    };
    auto backward = [&](int k) {
      return PipelineAction{false, (k / (stages * chunks)) * stages + k % stages,
                            chunks - 1 - (k / stages) % chunks};
    };
    const int warmup = micro == stages
                           ? total
                           : std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
    int f = 0, b = 0;
    for (; f < warmup; ++f) actions.push_back(forward(f));
    while (f < total) {
      actions.push_back(forward(f++));
      actions.push_back(backward(b++));
    }
    while (b < total) actions.push_back(backward(b++));
    return actions;
  }
  // 1f1b
  const int warmup = std::min(stages - stage - 1, micro);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) actions.push_back({true, next_forward});
  while (next_forward < micro) {
    actions.push_back({true, next_forward++});
    actions.push_back({false, next_backward++});
  }
  while (next_backward < micro) actions.push_back({false, next_backward++});
  return actions;
}

int peak_in_flight(const std::vector<PipelineAction>& actions) {
  std::vector<int> now, peak;
  for (const PipelineAction& a : actions) {
    if (a.chunk >= int(now.size())) {
      now.resize(a.chunk + 1, 0);
      peak.resize(a.chunk + 1, 0);
    }
    now[a.chunk] += a.forward ? 1 : -1;
    peak[a.chunk] = std::max(peak[a.chunk], now[a.chunk]);
  }
  return peak.empty() ? 0 : *std::max_element(peak.begin(), peak.end());
}

bool schedule_completes(PipelineSchedule kind, int stages, int micro, int chunks) {
  const int virtual_stages = stages * chunks;
  std::vector<std::vector<PipelineAction>> plans;
  for (int r = 0; r < stages; ++r) plans.push_back(pipeline_schedule(kind, stages, r, micro, chunks));
  // done_forward[v][i]: virtual stage v has sent micro-batch i's output; likewise backward.
  std::vector<std::vector<char>> done_forward(virtual_stages, std::vector<char>(micro, 0)),
      done_backward(virtual_stages, std::vector<char>(micro, 0));
  std::vector<std::size_t> next(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < stages; ++r) {
      while (next[r] < plans[r].size()) {
        const PipelineAction& a = plans[r][next[r]];
        const int v = a.chunk * stages + r;
        const bool ready = a.forward
                               ? (v == 0 || done_forward[v - 1][a.micro])
                               : done_forward[v][a.micro] &&
                                     (v == virtual_stages - 1 || done_backward[v + 1][a.micro]);
        if (!ready) break;  // a blocking receive
        (a.forward ? done_forward : done_backward)[v][a.micro] = 1;
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < stages; ++r) {
    if (next[r] != plans[r].size()) return false;
  }
  return true;
}

}  // namespace colossal::parallel
