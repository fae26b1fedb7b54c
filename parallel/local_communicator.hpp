// A communicator of one rank that needs no MPI: every collective is the identity (or a copy).
// Single-process runs and unit tests use it, so the trainer has one code path for any world size.
#pragma once

#include "parallel/communicator.hpp"

namespace colossal::parallel {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  MemorySpace memory_space() const override { return MemorySpace::host; }

 private:
  void do_all_reduce_sum(std::span<float>) override {}
  void do_all_reduce_max(std::span<float>) override {}
  void do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void do_all_gather(std::span<const float> input, std::span<float> output) override;
  void do_broadcast(std::span<float>, int) override {}
  void do_broadcast_bytes(std::span<std::byte>, int) override {}
  double do_all_reduce_sum_value(double value) override { return value; }
  void do_send(std::span<const float>, int, int) override;
  void do_recv(std::span<float>, int, int) override;
  void do_send_recv(std::span<const float> send_buffer, int, std::span<float> recv_buffer, int,
                    int) override;
  void do_barrier() override {}
  std::unique_ptr<Communicator> do_split(int, int) const override;
};

}  // namespace colossal::parallel
