#include "parallel/pipeline_executor.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace colossal::parallel {

PipelineExecutor::PipelineExecutor(std::vector<Chunk> chunks, std::vector<PipelineAction> schedule,
                                   core::Profiler* profiler, core::TraceRecorder* trace,
                                   std::vector<std::vector<PipelineMessage>> exchanges)
    : chunks_(std::move(chunks)), schedule_(std::move(schedule)), exchanges_(std::move(exchanges)),
      grouped_(false), profiler_(profiler), trace_(trace), in_flight_(chunks_.size(), 0) {
  for (const Chunk& chunk : chunks_) {
    if (chunk.stage == nullptr || chunk.link == nullptr) {
      throw std::invalid_argument("PipelineExecutor: a chunk without its stage or link");
    }
    if (chunk.link->grouped() != chunks_.front().link->grouped()) {
      throw std::invalid_argument("PipelineExecutor: the chunks' links disagree on grouping");
    }
  }
  for (const PipelineAction& action : schedule_) {
    if (action.chunk < 0 || std::size_t(action.chunk) >= chunks_.size()) {
      throw std::invalid_argument("PipelineExecutor: the schedule names chunk " +
                                  std::to_string(action.chunk) + " but " +
                                  std::to_string(chunks_.size()) + " chunk(s) were given");
    }
  }
  grouped_ = !chunks_.empty() && chunks_.front().link->grouped();
  if (grouped_ && exchanges_.size() != schedule_.size() + 1) {
    throw std::invalid_argument(
        "PipelineExecutor: the pipeline communicator (" +
        std::string(chunks_.front().link->pipeline().backend()) +
        ") matches messages in issue order, so the schedule's " +
        std::to_string(schedule_.size() + 1) + " exchange groups (pipeline_exchanges) are needed; " +
        std::to_string(exchanges_.size()) + " were given");
  }
  for (const auto& group : exchanges_) {
    for (const PipelineMessage& m : group) (void)chunk_at(m.virtual_stage());
  }
}

const PipelineExecutor::Chunk& PipelineExecutor::chunk_at(int virtual_stage) const {
  for (const Chunk& chunk : chunks_) {
    if (chunk.link->virtual_stage() == virtual_stage) return chunk;
  }
  throw std::invalid_argument("PipelineExecutor: an exchange names virtual stage " +
                              std::to_string(virtual_stage) + ", which no chunk of this rank is");
}

double PipelineExecutor::forward(const PipelineAction& action) {
  using Span = core::TraceRecorder::Span;
  PipelineStage& stage = *chunks_[std::size_t(action.chunk)].stage;
  const int slot = action.micro % chunks_[std::size_t(action.chunk)].link->slots();
  double loss = 0.0;
  {
    Span span(trace_, "F", "forward", action.micro, chunks_.size() > 1 ? action.chunk : -1);
    loss = stage.forward(action.micro, slot);
  }
  ++stats_.forwards;
  stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_[std::size_t(action.chunk)]);
  return loss;
}

void PipelineExecutor::backward(const PipelineAction& action) {
  using Span = core::TraceRecorder::Span;
  PipelineStage& stage = *chunks_[std::size_t(action.chunk)].stage;
  const int slot = action.micro % chunks_[std::size_t(action.chunk)].link->slots();
  stage.before_backward(action.micro);
  {
    Span span(trace_, "B", "backward", action.micro, chunks_.size() > 1 ? action.chunk : -1);
    stage.backward(action.micro, slot);
  }
  stage.after_backward(action.micro);
  ++stats_.backwards;
  --in_flight_[std::size_t(action.chunk)];
}

// One group: each message's buffer is its chunk's (the virtual stage this rank plays in it).
void PipelineExecutor::exchange(const std::vector<PipelineMessage>& group) {
  if (group.empty()) return;
  core::Profiler::Scope scope(profiler_, core::WorkKind::communication);
  const bool receives = std::any_of(group.begin(), group.end(),
                                    [](const PipelineMessage& m) { return !m.send; });
  core::TraceRecorder::Span span(trace_, "exchange", receives ? "receive" : "send");
  std::vector<PeerTransfer>& transfers = transfers_;  // kept between groups: no allocation
  std::vector<std::pair<StageLink*, float*>>& received = received_;
  transfers.clear();
  received.clear();
  const StageLink* gradient_sent = nullptr;
  for (const PipelineMessage& m : group) {
    const Chunk& chunk = chunk_at(m.virtual_stage());
    PipelineStage& stage = *chunk.stage;
    StageLink& link = *chunk.link;
    const int slot = m.micro % link.slots();
    if (!m.gradient && m.send) {
      transfers.push_back(link.output_send(stage.stage_output(slot), link.floats()));
    } else if (!m.gradient) {
      float* input = stage.stage_input(slot);
      transfers.push_back(link.input_receive(input, link.floats()));
      received.emplace_back(&link, input);
    } else if (m.send) {
      if (gradient_sent == &link) {  // the model has one buffer for it (pipeline_exchanges: never)
        throw std::logic_error("PipelineExecutor: two input gradients of one chunk in one group");
      }
      gradient_sent = &link;
      transfers.push_back(link.input_gradient_send(stage.input_gradient(), slot));
    } else {
      float* gradient = stage.output_gradient();
      transfers.push_back(link.output_gradient_receive(gradient));
      received.emplace_back(&link, gradient);
    }
  }
  chunks_.front().link->pipeline().exchange(transfers);
  for (auto [link, buffer] : received) link->gather(buffer, link->floats());
}

double PipelineExecutor::run_step() {
  using core::Profiler;
  using Span = core::TraceRecorder::Span;
  double loss = 0.0;
  std::fill(in_flight_.begin(), in_flight_.end(), 0);
  if (grouped_) {
    for (std::size_t i = 0; i < schedule_.size(); ++i) {
      const PipelineAction& action = schedule_[i];
      const Chunk& chunk = chunks_[std::size_t(action.chunk)];
      if (action.forward) chunk.stage->load(action.micro, action.micro % chunk.link->slots());
      exchange(exchanges_[i]);
      if (action.forward) {
        loss += forward(action);
      } else {
        backward(action);
      }
    }
    exchange(exchanges_.back());
    return loss;
  }
  // Span names carry the chunk only when there are several ("F1.3", else "F3").
  const bool named_chunks = chunks_.size() > 1;
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
      loss += forward(action);
      if (!link.last()) link.start_output_send(stage.stage_output(slot), micro, slot);
    } else {
      if (!link.last()) {
        Profiler::Scope scope(profiler_, core::WorkKind::communication);
        Span span(trace_, "recv B", "receive", micro, chunk);
        link.receive_output_gradient(stage.output_gradient(), micro);
      }
      backward(action);
      if (!link.first()) {
        Profiler::Scope scope(profiler_, core::WorkKind::communication);
        link.start_input_gradient_send(stage.input_gradient(), micro, slot);
      }
    }
  }
  {
    Span span(trace_, "wait sends", "send");
    for (const Chunk& chunk : chunks_) chunk.link->wait_all();
  }
  return loss;
}

template <class Floats, class Input, class Run, class Output>
void PipelineExecutor::forward_pass(const Floats& floats, const Input& input, const Run& run,
                                    const Output& output) {
  if (grouped_) {
    // gpipe's forward groups: a chunk's output leaves with the next chunk's input receive, which
    // is this rank's own message when the pipeline has one rank.
    std::vector<PeerTransfer>& group = transfers_;
    group.clear();
    for (const Chunk& chunk : chunks_) {
      PipelineStage& stage = *chunk.stage;
      const std::size_t n = floats(stage);
      if (!chunk.link->first()) group.push_back(chunk.link->input_receive(input(stage), n));
      chunk.link->pipeline().exchange(group);
      if (!chunk.link->first()) chunk.link->gather(input(stage), n);
      group.clear();
      run(stage);
      if (!chunk.link->last()) group.push_back(chunk.link->output_send(output(stage), n));
    }
    if (!chunks_.empty()) chunks_.front().link->pipeline().exchange(group);
    return;
  }
  for (const Chunk& chunk : chunks_) {
    PipelineStage& stage = *chunk.stage;
    const std::size_t n = floats(stage);
    if (!chunk.link->first()) chunk.link->receive_activation(input(stage), n);
    run(stage);
    if (!chunk.link->last()) chunk.link->send_activation(output(stage), n);
  }
}

double PipelineExecutor::forward_only(int batch) {
  double loss = 0.0;
  forward_pass([&](PipelineStage& s) { return s.boundary_floats(batch); },
               [](PipelineStage& s) { return s.stage_input(0); },
               [&](PipelineStage& s) { loss += s.forward_only(batch); },
               [](PipelineStage& s) { return s.stage_output(0); });
  return loss;
}

void PipelineExecutor::decode(int rows, int position) {
  forward_pass([&](PipelineStage& s) { return s.decode_floats(rows); },
               [](PipelineStage& s) { return s.decode_input(); },
               [&](PipelineStage& s) { s.decode(rows, position); },
               [](PipelineStage& s) { return s.decode_output(); });
}

void PipelineStage::decode(int /*rows*/, int /*position*/) {
  throw std::logic_error("this pipeline stage has no incremental decoding");
}

}  // namespace colossal::parallel
