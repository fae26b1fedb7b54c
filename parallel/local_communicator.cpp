#include "parallel/local_communicator.hpp"

#include <algorithm>
#include <stdexcept>

namespace colossal::parallel {

void LocalCommunicator::do_reduce_scatter_sum(std::span<const float> input,
                                              std::span<float> output) {
  if (input.data() != output.data()) std::copy(input.begin(), input.end(), output.begin());
}

void LocalCommunicator::do_all_gather(std::span<const float> input, std::span<float> output) {
  if (input.data() != output.data()) std::copy(input.begin(), input.end(), output.begin());
}

// With one rank, the only peer is this rank; a blocking send to itself could never be matched.
void LocalCommunicator::do_send(std::span<const float>, int, int) {
  throw std::logic_error("LocalCommunicator: send to self would block forever");
}

void LocalCommunicator::do_recv(std::span<float>, int, int) {
  throw std::logic_error("LocalCommunicator: recv from self would block forever");
}

void LocalCommunicator::do_send_recv(std::span<const float> send_buffer, int,
                                     std::span<float> recv_buffer, int, int) {
  std::copy(send_buffer.begin(), send_buffer.end(), recv_buffer.begin());
}

std::unique_ptr<Communicator> LocalCommunicator::do_split(int, int) const {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace colossal::parallel
