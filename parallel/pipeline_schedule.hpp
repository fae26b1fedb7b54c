// Pipeline schedules as pure functions: the ordered forwards and backwards one stage runs per
// optimizer step, for `stages` stages and `micro` micro-batches per step.
//
//   gpipe: every forward, then every backward (all micro-batches in flight on every stage).
//   1f1b:  stages - stage - 1 warm-up forwards, then one forward and one backward alternately,
//          then the remaining backwards: stage s holds at most stages - s micro-batches.
//
// Neighbouring stages run matching orders (a micro-batch's forward leaves stage s before stage s+1
// needs it; its gradient comes back before stage s needs it), so blocking receives with
// non-blocking sends never deadlock.
#pragma once

#include <string>
#include <vector>

namespace colossal::parallel {

struct PipelineAction {
  bool forward;
  int micro;
  bool operator==(const PipelineAction&) const = default;
};

std::vector<PipelineAction> pipeline_schedule(const std::string& kind, int stages, int stage,
                                              int micro);

// The most micro-batches whose activations a stage holds at once under `actions`.
int peak_in_flight(const std::vector<PipelineAction>& actions);

// Blocks per stage: the first given counts, or balanced by predicted time per stage (FLOPs of a
// block against the last stage's extra final layernorm and LM head), leftover blocks going to
// the later stages (the first stage keeps the most micro-batches in flight under 1F1B).
// `block_flops` and `head_flops` are per token.
std::vector<int> balance_stages(int layers, int stages, double block_flops, double head_flops);

}  // namespace colossal::parallel
