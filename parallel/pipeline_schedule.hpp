// Pipeline schedules as pure functions: the ordered forwards and backwards one stage runs per
// optimizer step, for `stages` stages and `micro` micro-batches per step.
//
//   gpipe: every forward, then every backward (all micro-batches in flight on every stage).
//   1f1b:  stages - stage - 1 warm-up forwards, then one forward and one backward alternately,
//          then the remaining backwards: stage s holds at most stages - s micro-batches.
//   interleaved (Narayanan et al. 2021, Megatron's schedule): every rank holds `chunks` model
//          chunks, virtual stages chunk * stages + rank; forwards go through the chunks in groups
//          of `stages` micro-batches, warm-up (stages - rank - 1) * 2 + (chunks - 1) * stages,
//          then 1F1B over (chunk, micro-batch) pairs; the bubble shrinks by the chunk count.
//          Needs the micro-batch count to be a multiple of the stage count.
//
// Neighbouring stages run matching orders (a micro-batch's forward leaves stage s before stage s+1
// needs it; its gradient comes back before stage s needs it), so blocking receives with
// non-blocking sends never deadlock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace colossal::parallel {

// parallel.pipeline.schedule as a value, parsed once from the config (io/config.cpp); the names
// are the config's words, so plans, YAML and error texts read them back unchanged.
enum class PipelineSchedule : uint8_t { gpipe, one_f_one_b, interleaved };

// "gpipe", "1f1b", "interleaved".
inline const char* pipeline_schedule_name(PipelineSchedule kind) {
  switch (kind) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::interleaved: return "interleaved";
  }
  return "?";
}

// The schedule a name stands for; nullopt for any other text.
inline std::optional<PipelineSchedule> parse_pipeline_schedule(std::string_view name) {
  for (PipelineSchedule k : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b,
                             PipelineSchedule::interleaved}) {
    if (name == pipeline_schedule_name(k)) return k;
  }
  return std::nullopt;
}

struct PipelineAction {
  bool forward;
  int micro;
  int chunk = 0;  // model chunk on this rank (interleaved); virtual stage chunk * stages + rank
  bool operator==(const PipelineAction&) const = default;
};

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule kind, int stages, int stage,
                                              int micro, int chunks = 1);
// The same by name (tests, tools); an unknown name throws std::invalid_argument.
std::vector<PipelineAction> pipeline_schedule(std::string_view kind, int stages, int stage,
                                              int micro, int chunks = 1);

// Runs every rank's schedule against the others with blocking receives and non-blocking sends:
// true when all of them finish (no deadlock) and every dependency is met in order.
bool schedule_completes(PipelineSchedule kind, int stages, int micro, int chunks = 1);
bool schedule_completes(std::string_view kind, int stages, int micro, int chunks = 1);

// The most micro-batches whose activations a stage holds at once under `actions` (per chunk:
// the largest over the chunks).
int peak_in_flight(const std::vector<PipelineAction>& actions);

}  // namespace colossal::parallel
