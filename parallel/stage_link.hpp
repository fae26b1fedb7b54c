// The link between one model chunk's virtual stage and its neighbours in the pipeline, planned
// once and used for every micro-batch (after Cabana's halo plan: neighbours, paired tags and
// buffers in the constructor; the exchanges after).
//
// Virtual stage v of V lives on pipeline rank v % P (P = pipeline ranks); it receives its input
// from v - 1 (the previous rank) and its output gradient from v + 1 (the next rank). Messages
// between virtual stages b and b + 1 for micro-batch i carry tag 2 * (i * V + b) forwards and
// that + 1 backwards, so every message of a step has its own tag.
//
// Scatter-gather (Megatron): when every tensor rank holds the whole boundary activation
// (replicated: no sequence_split), each sends only its 1/t part to its peer on the neighbouring
// stage and the receivers all-gather the parts over the tensor group. Under sequence_split the
// boundary is already this rank's rows: pass no tensor group.
//
// Buffers live in the pipeline communicator's memory space. Sends are non-blocking; a slot's
// sends complete before its buffers are written again (wait_forward_send before the forward
// that overwrites the slot's output; the input-gradient send copies into the link's own buffer
// for the slot, after waiting for that slot's previous one).
//
// Grouped (the pipeline communicator matches_in_issue_order: NCCL): no tags and no sends left
// in flight. The executor exchanges each schedule step's messages as one group
// (pipeline_exchanges) built from the transfers below, which complete before the next action;
// the input gradient still goes through the slot's buffer, because the model receives its next
// output gradient into the buffer it leaves the input gradient in, possibly in the same group
// (one buffer would do; one per slot keeps the memory the planner predicts without knowing the
// transport).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "parallel/communicator.hpp"

namespace colossal::parallel {

struct StageLinkOptions {
  Communicator* pipeline = nullptr;  // one rank per pipeline stage
  Communicator* tensor = nullptr;    // scatter-gather over it; nullptr: whole boundaries
  int virtual_stage = 0;             // this chunk's: chunk * pipeline size + pipeline rank
  int virtual_stages = 1;
  std::size_t floats = 0;            // boundary floats of one micro-batch (this rank's)
  int slots = 1;                     // micro-batches in flight at once
};

class StageLink {
 public:
  // Allocates the input-gradient send buffers (slots x floats, counted as temporaries; none on
  // the first virtual stage). Throws std::invalid_argument naming the option that is out of range.
  StageLink(const StageLinkOptions& options, core::MemoryTracker& tracker);
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;
  StageLink(StageLink&&) = default;
  StageLink& operator=(StageLink&&) = default;
  ~StageLink();

  // The tag of micro-batch `micro`'s activation from virtual stage b to b + 1, and of its
  // gradient from b + 1 back to b.
  static int forward_tag(int micro, int b, int virtual_stages) {
    return 2 * (micro * virtual_stages + b);
  }
  static int backward_tag(int micro, int b, int virtual_stages) {
    return forward_tag(micro, b, virtual_stages) + 1;
  }

  bool first() const { return virtual_stage_ == 0; }
  bool last() const { return virtual_stage_ + 1 == virtual_stages_; }
  int previous_rank() const;
  int next_rank() const;
  std::size_t floats() const { return floats_; }
  int slots() const { return int(forward_sends_.size()); }
  // {offset, count} of the part of a boundary of `floats` this rank sends.
  std::pair<std::size_t, std::size_t> part(std::size_t floats) const;

  // Training (tagged by micro-batch). Blocking receives; sends started without waiting.
  void receive_input(float* input, int micro);                    // from the previous stage
  void wait_forward_send(int slot);                               // the slot's output is free
  void start_output_send(const float* output, int micro, int slot);   // to the next stage
  void receive_output_gradient(float* gradient, int micro);       // from the next stage
  // Copies this rank's part of `gradient` into the slot's buffer (after that slot's previous
  // send completed) and starts sending it to the previous stage.
  void start_input_gradient_send(const float* gradient, int micro, int slot);
  void wait_slot(int slot);  // both of the slot's pending sends
  void wait_all();

  // Evaluation and sampling: one forward of `floats` boundary floats, tag 0, blocking (not
  // grouped: the executor groups those messages itself).
  void receive_activation(float* input, std::size_t floats);
  void send_activation(const float* output, std::size_t floats);

  // Grouped point-to-point (grouped()): this rank's part of a boundary as one transfer of a
  // group on pipeline(); after the group, gather() all-gathers a received boundary's parts over
  // the tensor group (scatter-gather; nothing otherwise).
  bool grouped() const { return grouped_; }
  Communicator& pipeline() const { return *pipeline_; }
  int virtual_stage() const { return virtual_stage_; }
  PeerTransfer output_send(const float* output, std::size_t floats) const;    // to the next stage
  PeerTransfer input_receive(float* input, std::size_t floats) const;         // from the previous
  PeerTransfer output_gradient_receive(float* gradient) const;                // from the next
  // Copies this rank's part of `gradient` into the slot's buffer and sends that copy.
  PeerTransfer input_gradient_send(const float* gradient, int slot);          // to the previous
  void gather(float* boundary, std::size_t floats);

 private:
  void receive(float* buffer, std::size_t floats, int source, int tag);

  Communicator* pipeline_;
  bool grouped_;
  Communicator* tensor_;
  int virtual_stage_, virtual_stages_;
  std::size_t floats_;
  std::vector<std::unique_ptr<PendingCollective>> forward_sends_, backward_sends_;
  core::DeviceArray<float> gradient_sends_;  // input gradients on their way back, per slot
};

}  // namespace colossal::parallel
