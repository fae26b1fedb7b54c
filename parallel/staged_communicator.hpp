// Communicator that runs device buffers through pinned host staging over an MpiCommunicator:
// for every float buffer in device memory it copies the data into a host staging buffer, calls
// MPI on the host copy, and copies the result back. Host buffers go to MPI untouched. It is the
// transport for device buffers when MPI is not CUDA-aware and NCCL cannot be used (several ranks
// sharing one GPU: parallel/comm_choice.hpp).
//
// The copies are injectable (`StagingOps`): the CUDA build uses cudaMemcpyAsync on the
// communicator's own stream into cudaHostAlloc'd (pinned) buffers (`cuda_staging_ops`); tests and
// the CPU build's test switch use host memory standing in for the device (`host_staging_ops`).
// Staging buffers come from a pool: each call leases one large enough and returns it when done,
// so after the first calls of a step no buffer is allocated again (`StagingStats::allocations`).
// Non-blocking sends and all-reduces keep their lease until they complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

namespace colossal::parallel {

struct StagingOps {
  std::string name;                                   // "cuda pinned", "host stand-in"
  std::function<bool(const void*)> is_device;         // does this pointer need staging?
  std::function<void*(std::size_t bytes)> allocate;   // a (pinned) host buffer
  std::function<void(void*)> release;
  // Copies that have completed when they return (ordered after the work that produced `from`).
  std::function<void(void* host, const void* device, std::size_t bytes)> to_host;
  std::function<void(void* device, const void* host, std::size_t bytes)> to_device;
};

// Every pointer counts as device memory and the copies are std::memcpy: the staged path with host
// memory standing in for the device.
StagingOps host_staging_ops();
#ifdef COLOSSAL_HAVE_CUDA
// cudaPointerGetAttributes decides; cudaHostAlloc buffers; cudaMemcpyAsync on a blocking stream
// of the current device (ordered after the legacy default stream's kernels), then synchronised.
StagingOps cuda_staging_ops();
#endif

struct StagingStats {
  std::uint64_t copies_to_host = 0, copies_to_device = 0;
  std::uint64_t bytes_to_host = 0, bytes_to_device = 0;
  std::uint64_t allocations = 0;      // staging buffers allocated (the pool only grows)
  std::uint64_t allocated_bytes = 0;  // their total size
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<MpiCommunicator> host, StagingOps ops);
  ~StagedCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string_view backend() const override { return "staged-mpi"; }
  MemorySpace memory_space() const override { return MemorySpace::device; }

  const MpiCommunicator& host() const { return *host_; }
  bool matches_in_issue_order() const override { return host_->matches_in_issue_order(); }
  const StagingStats& staging_stats() const;
  const StagingOps& ops() const;

  struct Pool;    // the staging buffers, shared with leases of unfinished operations
  class Lease;    // one leased buffer, returned to the pool on destruction

 private:
  void do_all_reduce_sum(std::span<float> buffer) override;
  void do_all_reduce_max(std::span<float> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum(std::span<float> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  void do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void do_all_gather(std::span<const float> input, std::span<float> output) override;
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

  template <class F>
  void staged_in_place(std::span<float> buffer, F&& call);

  std::unique_ptr<MpiCommunicator> host_;
  std::shared_ptr<Pool> pool_;
};

// The MPI communicator under any communicator this folder makes (itself, a staged one's host
// side), or null (a LocalCommunicator, NCCL): what parallel HDF5 opens files over.
const MpiCommunicator* mpi_of(const Communicator* comm);

}  // namespace colossal::parallel
