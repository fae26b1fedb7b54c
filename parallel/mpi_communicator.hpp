// Communicator over MPI with host buffers. Owns a duplicated MPI_Comm (so library traffic never
// matches user traffic on the parent) and frees it on destruction. Reduce-scatters run as a ring
// of point-to-point steps (mpi_communicator.cpp) rather than MPI_Reduce_scatter_block. Errors on
// the duplicate are returned rather than fatal, and every return code is checked: a failure
// throws std::runtime_error naming the MPI call, the MPI error string and the rank.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "parallel/communicator.hpp"

namespace colossal::parallel {

namespace detail {
class RingShared;  // the reduce-scatter rings' scratch and the operations in flight
}  // namespace detail

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `parent` (collective over it). MPI must be initialised.
  explicit MpiCommunicator(MPI_Comm parent);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  MemorySpace memory_space() const override {
    return device_buffers_ ? MemorySpace::device : MemorySpace::host;
  }

  // The owned communicator, for interop (e.g. bootstrapping NCCL, parallel HDF5). Still owned here.
  MPI_Comm native() const { return comm_; }
  // Float buffers in device memory, handed to a CUDA-aware MPI (parallel.comm's cuda_aware_mpi
  // transport): reduce-scatters then go through MPI's own collective, which can read them,
  // instead of the ring, whose adds run on the host; and every start_* collective runs MPI's
  // blocking form and returns it completed, because a CUDA-aware Open MPI takes device pointers
  // in point-to-point calls and blocking collectives only (its reductions stage device buffers
  // in host memory there; the non-blocking ones would add on the device pointers on the host).
  // Sends stay non-blocking. split() passes it on.
  void set_device_buffers(bool on) { device_buffers_ = on; }
  // NCCL's point-to-point rule on the host, for tests (COLOSSAL_TEST_GROUPED_P2P=1 at
  // construction, or this): exchange() sends synchronously on one tag, send() and start_send()
  // block until the peer's receive has the message (MPI_Ssend), and the pipeline groups its
  // messages as under NCCL. split() passes it on.
  bool matches_in_issue_order() const override { return in_issue_order_; }
  void set_matches_in_issue_order(bool on) { in_issue_order_ = on; }

 private:
  struct Adopt {};
  MpiCommunicator(Adopt, MPI_Comm owned);  // takes ownership of a communicator made by split
  void init_from_comm();

  void do_all_reduce_sum(std::span<float> buffer) override;
  void do_all_reduce_max(std::span<float> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum(std::span<float> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  void do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void do_all_gather(std::span<const float> input, std::span<float> output) override;
  std::unique_ptr<PendingCollective> do_start_all_gather(std::span<const float> input,
                                                         std::span<float> output) override;
  std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum(std::span<const float> input,
                                                                 std::span<float> output) override;
  void do_broadcast(std::span<float> buffer, int root) override;
  void do_broadcast_bytes(std::span<std::byte> buffer, int root) override;
  double do_all_reduce_sum_value(double value) override;
  void do_send(std::span<const float> buffer, int dest, int tag) override;
  std::unique_ptr<PendingCollective> do_start_send(std::span<const float> buffer, int dest,
                                                   int tag) override;
  void do_recv(std::span<float> buffer, int source, int tag) override;
  void do_send_recv(std::span<const float> send_buffer, int dest, std::span<float> recv_buffer,
                    int source, int tag) override;
  void do_exchange(std::span<const PeerTransfer> transfers) override;
  void do_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key) const override;

  void check(int code, const char* call) const;
  int checked_tag(int tag) const;

  // The reduce-scatters' ring: point-to-point messages on a duplicate of comm_ of their own (so
  // they never match a caller's sends and receives), each operation's under a tag of its own
  // (every rank starts the collectives in the same order, so the counts agree).
  int next_ring_tag();

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool device_buffers_ = false;
  bool in_issue_order_ = false;
  std::shared_ptr<detail::RingShared> ring_shared_;  // owns the rings' duplicate of comm_
  unsigned ring_calls_ = 0;
  int rank_ = 0;
  int size_ = 1;
  int tag_upper_bound_ = 32767;  // the MPI standard's guaranteed minimum of MPI_TAG_UB
  // do_exchange's, reused between groups.
  std::vector<int> exchange_counts_;
  std::vector<MPI_Request> exchange_requests_;
  std::vector<MPI_Status> exchange_statuses_;
};

// A duplicate of MPI_COMM_WORLD. The returned object must be destroyed before MPI_Finalize.
std::unique_ptr<MpiCommunicator> make_world_communicator();

}  // namespace colossal::parallel
