// Runs one optimizer step's pipeline schedule (parallel/pipeline_schedule.hpp) over this rank's
// model chunks, whatever the model (Megatron-Core's get_forward_backward_func is the idea): the
// model is seen only through PipelineStage, the neighbours only through each chunk's StageLink.
//
// For each action, in schedule order:
//   forward  m: stage.load(m, slot); wait for the slot's previous output send; receive the input
//               (not on the first virtual stage); stage.forward(m, slot); start sending the output
//               (not on the last).
//   backward m: receive the output gradient (not on the last virtual stage);
//               stage.backward(m, slot); copy and start sending the input gradient (not on the
//               first).
// then waits for every send. Slot = m % slots. Receives block and sends do not; neighbouring
// stages run matching schedules, so this never deadlocks (parallel::schedule_completes).
//
// Grouped (the links are grouped(): NCCL, where a send waits for its receive and messages match
// in issue order): before each action, and after the last, the step's group of sends and
// receives (pipeline_exchanges) as one Communicator::exchange, then the receives' tensor
// all-gathers; the actions run with nothing in flight (parallel::exchanges_complete proves the
// groups deadlock-free). The host waits for each group, so the next action's kernels are
// queued once the group has completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/profiler.hpp"
#include "core/trace.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/stage_link.hpp"

namespace colossal::parallel {

// What the executor needs from one model chunk. Buffers are the model's, in the pipeline
// communicator's memory space; each slot holds one micro-batch's activations.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Before micro-batch `micro`'s forward into `slot`: load what it reads besides the stage input
  // (tokens, targets). Nothing by default.
  virtual void load(int /*micro*/, int /*slot*/) {}
  // Forward of `micro` into `slot`; returns its loss contribution (0 without the head).
  virtual double forward(int micro, int slot) = 0;
  // Backward of `micro` from `slot`'s activations (from output_gradient() without the head),
  // accumulating parameter gradients; leaves input_gradient() unless this chunk embeds.
  virtual void backward(int micro, int slot) = 0;
  // Around a backward, outside its trace span (e.g. gradient buckets overlap on the last one).
  virtual void before_backward(int /*micro*/) {}
  virtual void after_backward(int /*micro*/) {}
  // Evaluation and sampling: a forward without gradient of `batch` sequences in slot 0 (its own
  // tokens loaded by the stage); returns the mean loss with the head, else 0.
  virtual double forward_only(int batch) = 0;
  // Incremental decoding (sampling): `rows` new positions of one sequence from `position` on
  // through this chunk (core::Model::decode: its own tokens, when it embeds, loaded by the
  // stage), whole rows of decode_floats(rows) at its boundaries. Not supported by default.
  virtual void decode(int rows, int position);
  virtual std::size_t decode_floats(int /*rows*/) const { return 0; }
  virtual float* decode_input() { return nullptr; }
  virtual const float* decode_output() { return nullptr; }
  // Boundary floats of `batch` sequences on this rank.
  virtual std::size_t boundary_floats(int batch) const = 0;
  virtual float* stage_input(int slot) = 0;
  virtual const float* stage_output(int slot) = 0;
  virtual float* output_gradient() = 0;
  virtual const float* input_gradient() = 0;
};

struct PipelineStats {
  int64_t forwards = 0, backwards = 0;
  int peak_in_flight = 0;  // the most micro-batches one chunk held at once
};

class PipelineExecutor {
 public:
  struct Chunk {
    PipelineStage* stage;
    StageLink* link;  // built for this chunk's virtual stage
  };
  // `schedule` is this rank's (pipeline_schedule); chunk c of it runs on chunks[c]. Spans go to
  // `trace` and receive/send time to `profiler` (either may be null). Grouped links need the
  // schedule's `exchanges` (pipeline_exchanges; one more than the actions). Throws
  // std::invalid_argument when an action names a chunk that is not given, or the exchanges are
  // missing or do not fit the schedule.
  PipelineExecutor(std::vector<Chunk> chunks, std::vector<PipelineAction> schedule,
                   core::Profiler* profiler = nullptr, core::TraceRecorder* trace = nullptr,
                   std::vector<std::vector<PipelineMessage>> exchanges = {});

  // One step: every action of the schedule, then every send completed. Returns the sum of the
  // forwards' losses on this rank (0 unless a chunk has the head).
  double run_step();
  // One forward of `batch` sequences through every chunk (evaluation, sampling): each receives
  // its input (tag 0), runs, and passes its output on. Returns the loss sum of this rank's chunks.
  double forward_only(int batch);
  // The same for incremental decoding: `rows` positions from `position` on (PipelineStage::decode).
  void decode(int rows, int position);

  const PipelineStats& stats() const { return stats_; }
  const std::vector<PipelineAction>& schedule() const { return schedule_; }
  bool grouped() const { return grouped_; }

 private:
  // forward_only's and decode's pass: each chunk receives `floats(stage)` into `input(stage)`,
  // runs `run(stage)` and passes `output(stage)` on.
  template <class Floats, class Input, class Run, class Output>
  void forward_pass(const Floats& floats, const Input& input, const Run& run,
                    const Output& output);
  double forward(const PipelineAction& action);  // the action's compute, no messages
  void backward(const PipelineAction& action);
  void exchange(const std::vector<PipelineMessage>& group);  // one group (grouped)
  const Chunk& chunk_at(int virtual_stage) const;

  std::vector<Chunk> chunks_;
  std::vector<PipelineAction> schedule_;
  std::vector<std::vector<PipelineMessage>> exchanges_;
  bool grouped_;
  std::vector<PeerTransfer> transfers_;                 // exchange()'s, reused
  std::vector<std::pair<StageLink*, float*>> received_;
  core::Profiler* profiler_;
  core::TraceRecorder* trace_;
  PipelineStats stats_;
  std::vector<int> in_flight_;
};

}  // namespace colossal::parallel
