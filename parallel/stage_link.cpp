#include "parallel/stage_link.hpp"

#include <stdexcept>
#include <string>

#include "core/kernels.hpp"
#include "core/kokkos_compat.hpp"

namespace colossal::parallel {

StageLink::StageLink(const StageLinkOptions& options, core::MemoryTracker& tracker)
    : pipeline_(options.pipeline), grouped_(options.pipeline != nullptr &&
                                           options.pipeline->matches_in_issue_order()),
      tensor_(options.tensor), virtual_stage_(options.virtual_stage),
      virtual_stages_(options.virtual_stages), floats_(options.floats) {
  if (pipeline_ == nullptr) {
    throw std::invalid_argument("StageLink: no pipeline communicator (every link needs one)");
  }
  if (virtual_stages_ < 1 || virtual_stages_ % pipeline_->size() != 0) {
    throw std::invalid_argument("StageLink: virtual_stages = " + std::to_string(virtual_stages_) +
                                " is not a positive multiple of the " +
                                std::to_string(pipeline_->size()) + " pipeline ranks");
  }
  if (virtual_stage_ < 0 || virtual_stage_ >= virtual_stages_ ||
      virtual_stage_ % pipeline_->size() != pipeline_->rank()) {
    throw std::invalid_argument("StageLink: virtual_stage = " + std::to_string(virtual_stage_) +
                                " is not one of pipeline rank " +
                                std::to_string(pipeline_->rank()) + "'s (chunk * " +
                                std::to_string(pipeline_->size()) + " + rank)");
  }
  if (options.slots < 1) {
    throw std::invalid_argument("StageLink: slots = " + std::to_string(options.slots) +
                                " (a stage holds at least one micro-batch)");
  }
  if (tensor_ != nullptr && tensor_->size() == 1) tensor_ = nullptr;
  forward_sends_.resize(std::size_t(options.slots));
  backward_sends_.resize(std::size_t(options.slots));
  if (!first()) {
    gradient_sends_ = core::DeviceArray<float>(tracker, core::MemCategory::temporaries,
                                               floats_ * std::size_t(options.slots));
  }
}

StageLink::~StageLink() {
  // A send in flight reads the buffers: complete it before they go (the handles wait too, but
  // after gradient_sends_ would be freed otherwise).
  for (auto* sends : {&forward_sends_, &backward_sends_}) sends->clear();
}

int StageLink::previous_rank() const {
  return (pipeline_->rank() + pipeline_->size() - 1) % pipeline_->size();
}
int StageLink::next_rank() const { return (pipeline_->rank() + 1) % pipeline_->size(); }

std::pair<std::size_t, std::size_t> StageLink::part(std::size_t floats) const {
  if (tensor_ == nullptr) return {0, floats};
  const std::size_t share = floats / std::size_t(tensor_->size());
  return {share * std::size_t(tensor_->rank()), share};
}

void StageLink::receive(float* buffer, std::size_t floats, int source, int tag) {
  // The buffer may still be read by kernels queued for an earlier micro-batch (the backward's
  // running gradient, a slot's input): the communicators order the receive after them.
  const auto [offset, count] = part(floats);
  pipeline_->recv({buffer + offset, count}, source, tag);
  gather(buffer, floats);
}

void StageLink::receive_input(float* input, int micro) {
  receive(input, floats_, previous_rank(), forward_tag(micro, virtual_stage_ - 1, virtual_stages_));
}

void StageLink::wait_forward_send(int slot) {
  auto& pending = forward_sends_[std::size_t(slot)];
  if (pending) pending->wait();
  pending.reset();
}

void StageLink::start_output_send(const float* output, int micro, int slot) {
  core::fence_kernels();  // the forward's kernels have written the output
  const auto [offset, count] = part(floats_);
  forward_sends_[std::size_t(slot)] = pipeline_->start_send(
      {output + offset, count}, next_rank(), forward_tag(micro, virtual_stage_, virtual_stages_));
}

void StageLink::receive_output_gradient(float* gradient, int micro) {
  receive(gradient, floats_, next_rank(), backward_tag(micro, virtual_stage_, virtual_stages_));
}

void StageLink::start_input_gradient_send(const float* gradient, int micro, int slot) {
  auto& pending = backward_sends_[std::size_t(slot)];
  if (pending) pending->wait();
  const auto [offset, count] = part(floats_);
  float* out = gradient_sends_.data() + std::size_t(slot) * count;
  core::kernels::copy(out, gradient + offset, int64_t(count));
  core::fence_kernels();
  pending = pipeline_->start_send({out, count}, previous_rank(),
                                  backward_tag(micro, virtual_stage_ - 1, virtual_stages_));
}

void StageLink::wait_slot(int slot) {
  for (auto* sends : {&forward_sends_, &backward_sends_}) {
    auto& pending = (*sends)[std::size_t(slot)];
    if (pending) pending->wait();
    pending.reset();
  }
}

void StageLink::wait_all() {
  for (auto* sends : {&forward_sends_, &backward_sends_}) {
    for (auto& pending : *sends) {
      if (pending) pending->wait();
      pending.reset();
    }
  }
}

void StageLink::receive_activation(float* input, std::size_t floats) {
  receive(input, floats, previous_rank(), 0);
}

void StageLink::send_activation(const float* output, std::size_t floats) {
  core::fence_kernels();
  const auto [offset, count] = part(floats);
  pipeline_->send({output + offset, count}, next_rank(), 0);
}

PeerTransfer StageLink::output_send(const float* output, std::size_t floats) const {
  const auto [offset, count] = part(floats);
  return PeerTransfer::send(output + offset, count, next_rank());
}

PeerTransfer StageLink::input_receive(float* input, std::size_t floats) const {
  const auto [offset, count] = part(floats);
  return PeerTransfer::recv(input + offset, count, previous_rank());
}

PeerTransfer StageLink::output_gradient_receive(float* gradient) const {
  const auto [offset, count] = part(floats_);
  return PeerTransfer::recv(gradient + offset, count, next_rank());
}

PeerTransfer StageLink::input_gradient_send(const float* gradient, int slot) {
  const auto [offset, count] = part(floats_);
  float* out = gradient_sends_.data() + std::size_t(slot) * count;
  core::kernels::copy(out, gradient + offset, int64_t(count));
  // The group orders itself after the copy (Communicator::exchange).
  return PeerTransfer::send(out, count, previous_rank());
}

void StageLink::gather(float* boundary, std::size_t floats) {
  const auto [offset, count] = part(floats);
  if (count != floats) tensor_->all_gather({boundary + offset, count}, {boundary, floats});
}

}  // namespace colossal::parallel
