#include "parallel/pipeline_executor.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace colossal::parallel {

PipelineExecutor::PipelineExecutor(std::vector<Chunk> chunks, std::vector<PipelineAction> schedule,
                                   core::Profiler* profiler, core::TraceRecorder* trace)
    : chunks_(std::move(chunks)), schedule_(std::move(schedule)), profiler_(profiler),
      trace_(trace), in_flight_(chunks_.size(), 0) {
  for (const Chunk& chunk : chunks_) {
    if (chunk.stage == nullptr || chunk.link == nullptr) {
      throw std::invalid_argument("PipelineExecutor: a chunk without its stage or link");
    }
  }
  for (const PipelineAction& action : schedule_) {
    if (action.chunk < 0 || std::size_t(action.chunk) >= chunks_.size()) {
      throw std::invalid_argument("PipelineExecutor: the schedule names chunk " +
                                  std::to_string(action.chunk) + " but " +
                                  std::to_string(chunks_.size()) + " chunk(s) were given");
    }
  }
}

double PipelineExecutor::run_step() {
  using core::Profiler;
  using Span = core::TraceRecorder::Span;
  // Span names carry the chunk only when there are several ("F1.3", else "F3").
  const bool named_chunks = chunks_.size() > 1;
  double loss = 0.0;
  std::fill(in_flight_.begin(), in_flight_.end(), 0);
  for (const PipelineAction& action : schedule_) {
    PipelineStage& stage = *chunks_[std::size_t(action.chunk)].stage;
    StageLink& link = *chunks_[std::size_t(action.chunk)].link;
    const int micro = action.micro, slot = micro % link.slots();
    const int chunk = named_chunks ? action.chunk : -1;
    if (action.forward) {
      stage.load(micro, slot);
      {
        Profiler::Scope scope(profiler_, core::WorkKind::communication);
        link.wait_forward_send(slot);
        if (!link.first()) {
          Span span(trace_, "recv F", "receive", micro, chunk);
          link.receive_input(stage.stage_input(slot), micro);
        }
      }
      {
        Span span(trace_, "F", "forward", micro, chunk);
        loss += stage.forward(micro, slot);
      }
      if (!link.last()) link.start_output_send(stage.stage_output(slot), micro, slot);
      ++stats_.forwards;
      stats_.peak_in_flight =
          std::max(stats_.peak_in_flight, ++in_flight_[std::size_t(action.chunk)]);
    } else {
      if (!link.last()) {
        Profiler::Scope scope(profiler_, core::WorkKind::communication);
        Span span(trace_, "recv B", "receive", micro, chunk);
        link.receive_output_gradient(stage.output_gradient(), micro);
      }
      stage.before_backward(micro);
      {
        Span span(trace_, "B", "backward", micro, chunk);
        stage.backward(micro, slot);
      }
      stage.after_backward(micro);
      if (!link.first()) {
        Profiler::Scope scope(profiler_, core::WorkKind::communication);
        link.start_input_gradient_send(stage.input_gradient(), micro, slot);
      }
      ++stats_.backwards;
      --in_flight_[std::size_t(action.chunk)];
    }
  }
  {
    Span span(trace_, "wait sends", "send");
    for (const Chunk& chunk : chunks_) chunk.link->wait_all();
  }
  return loss;
}

double PipelineExecutor::forward_only(int batch) {
  double loss = 0.0;
  for (const Chunk& chunk : chunks_) {
    PipelineStage& stage = *chunk.stage;
    const std::size_t floats = stage.boundary_floats(batch);
    if (!chunk.link->first()) chunk.link->receive_activation(stage.stage_input(0), floats);
    loss += stage.forward_only(batch);
    if (!chunk.link->last()) chunk.link->send_activation(stage.stage_output(0), floats);
  }
  return loss;
}

}  // namespace colossal::parallel
