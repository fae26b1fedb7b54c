#include "parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace colossal::parallel {

std::vector<PipelineAction> pipeline_schedule(const std::string& kind, int stages, int stage,
                                              int micro) {
  if (stages < 1 || stage < 0 || stage >= stages || micro < 1) {
    throw std::invalid_argument("pipeline_schedule: stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + " with " + std::to_string(micro) +
                                " micro-batches");
  }
  std::vector<PipelineAction> actions;
  if (kind == "gpipe") {
    for (int i = 0; i < micro; ++i) actions.push_back({true, i});
    for (int i = 0; i < micro; ++i) actions.push_back({false, i});
    return actions;
  }
  if (kind != "1f1b") throw std::invalid_argument("unknown pipeline schedule '" + kind + "'");
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
  int now = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    now += a.forward ? 1 : -1;
    peak = std::max(peak, now);
  }
  return peak;
}

std::vector<int> balance_stages(int layers, int stages, double block_flops, double head_flops) {
  if (stages < 1 || stages > layers) {
    throw std::invalid_argument(std::to_string(stages) + " pipeline stages for " +
                                std::to_string(layers) + " layers");
  }
  if (stages == 1) return {layers};
  // Choose the last stage's block count; spread the rest evenly over the others. Among equally
  // slow choices, the one with the fewest blocks on the first stage, then on the last.
  int best_last = 1, best_first = 0;
  double best_cost = 0.0;
  for (int last = 1; last <= layers - (stages - 1); ++last) {
    const int rest = layers - last;
    const int widest = (rest + stages - 2) / (stages - 1), first = rest / (stages - 1);
    const double cost = std::max(last * block_flops + head_flops, widest * block_flops);
    if (last == 1 || cost < best_cost || (cost == best_cost && first < best_first)) {
      best_cost = cost;
      best_last = last;
      best_first = first;
    }
  }
  std::vector<int> counts(stages, 0);
  counts.back() = best_last;
  const int rest = layers - best_last, others = stages - 1;
  for (int s = 0; s < others; ++s) {
    counts[s] = rest / others + (s >= others - rest % others ? 1 : 0);
  }
  return counts;
}

}  // namespace colossal::parallel
