// The collectives a tensor-parallel model needs from its group, as an interface so that core/
// stays free of MPI (parallel::CommunicatorGroup implements it over a Communicator).
#pragma once

#include <cstddef>

namespace colossal::core {

class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place over the group, on device buffers.
  virtual void all_reduce_sum(float* data, std::size_t n) = 0;
  virtual void all_reduce_max(float* data, std::size_t n) = 0;
  // output (size() * n floats) <- every rank's n floats in rank order.
  virtual void all_gather(const float* input, std::size_t n, float* output) = 0;
  // output (n / size() floats) <- block rank() of the sum over ranks of input (n floats).
  virtual void reduce_scatter(const float* input, std::size_t n, float* output) = 0;
  // In place: every rank's n floats become root's.
  virtual void broadcast(float* data, std::size_t n, int root) = 0;
  // Sends n floats to `dest` and receives n from `source` at once (a ring shift).
  virtual void send_recv(const float* send, std::size_t n, int dest, float* recv, int source) = 0;
};

}  // namespace colossal::core
