// core::TensorGroup over a Communicator: the tensor-parallel model's collectives.
#pragma once

#include "core/tensor_group.hpp"
#include "parallel/communicator.hpp"

namespace colossal::parallel {

class CommunicatorGroup final : public core::TensorGroup {
 public:
  explicit CommunicatorGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_sum(float* data, std::size_t n) override { comm_.all_reduce_sum({data, n}); }
  void all_reduce_max(float* data, std::size_t n) override { comm_.all_reduce_max({data, n}); }
  void all_gather(const float* input, std::size_t n, float* output) override {
    comm_.all_gather({input, n}, {output, n * std::size_t(comm_.size())});
  }
  void reduce_scatter(const float* input, std::size_t n, float* output) override {
    comm_.reduce_scatter_sum({input, n}, {output, n / std::size_t(comm_.size())});
  }
  void broadcast(float* data, std::size_t n, int root) override {
    comm_.broadcast({data, n}, root);
  }
  void send_recv(const float* send, std::size_t n, int dest, float* recv, int source) override {
    comm_.send_recv({send, n}, dest, {recv, n}, source, /*tag=*/7);
  }
  Communicator& communicator() { return comm_; }

 private:
  Communicator& comm_;
};

}  // namespace colossal::parallel
