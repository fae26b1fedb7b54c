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

// Grouped point-to-point (Communicator::matches_in_issue_order: NCCL, where a send completes only
// while its receive runs and messages match in issue order). One message of a group: micro-batch
// `micro`'s activation from virtual stage `boundary` to boundary + 1, or its gradient back.
struct PipelineMessage {
  bool send;      // this rank sends it; else receives it
  bool gradient;  // the gradient from boundary + 1 back to boundary; else the activation
  int boundary;   // between virtual stages boundary and boundary + 1
  int micro;
  int peer;       // the other pipeline rank
  bool operator==(const PipelineMessage&) const = default;
  // The virtual stage this rank plays in it: the sender's end of an activation and the
  // receiver's of a gradient are `boundary`, the other ends boundary + 1.
  int virtual_stage() const { return send == gradient ? boundary + 1 : boundary; }
};

// The order of messages within a group, the same on both sides of each message: activations
// before gradients, then by boundary and micro-batch.
bool exchange_order(const PipelineMessage& x, const PipelineMessage& y);

// The groups this rank exchanges around its schedule's actions: element i before action i, the
// last after every action (size actions + 1; empty groups are skipped). A group holds the sends
// of the actions since the group before and the receives of the actions up to the next group:
//   gpipe, 1f1b: a group before every action (Megatron's send_forward_recv_backward and
//     send_backward_recv_forward in 1F1B's steady state);
//   interleaved: one group per forward-backward pair of the steady state (Megatron's
//     send_forward_backward_recv_forward_backward; its warm-up counts the extra step), so the
//     pair's backward gets its gradient before the forward runs and the forward's output leaves
//     with the backward's input gradient. Grouping those steps apart deadlocks.
// Within a group the messages are ordered by (activation before gradient, boundary, micro) on
// both sides, so a pair of ranks lists its messages alike. Chunks > 1 need the interleaved
// schedule (std::invalid_argument otherwise).
std::vector<std::vector<PipelineMessage>> pipeline_exchanges(PipelineSchedule kind, int stages,
                                                             int stage, int micro,
                                                             int chunks = 1);

// Runs every rank's groups against the others under NCCL's rule: a group completes once the
// peer of each of its messages has posted the group that holds the counterpart, and the n-th
// message one rank sends another meets the n-th that rank receives from it. True when every
// group completes and every message meets its own counterpart (same boundary, micro-batch and
// kind); false on a deadlock or a mismatch.
bool exchanges_complete(PipelineSchedule kind, int stages, int micro, int chunks = 1);
// The same for any groups: groups[rank][i] is rank's i-th group (empty ones are skipped).
bool groups_complete(const std::vector<std::vector<std::vector<PipelineMessage>>>& groups);

}  // namespace colossal::parallel
