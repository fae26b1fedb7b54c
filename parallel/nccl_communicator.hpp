// Communicator over NCCL with CUDA device buffers, on one device per process.
//
// Available only when the build has CUDA (COLOSSAL_HAVE_CUDA; colossal::parallel then compiles
// nccl_communicator.cpp). The header needs no CUDA include path: the NCCL communicator and the
// CUDA stream are held through their forward-declared handle types.
//
// Bootstrap: rank 0 of an MPI communicator creates the ncclUniqueId and broadcasts it over MPI;
// every rank then joins with ncclCommInitRank. The NcclCommunicator keeps its own duplicate of
// that MPI communicator for the control plane (byte/string broadcasts live in host memory) and
// for split(), which splits the MPI communicator and bootstraps a new NCCL communicator on it.
//
// Semantics are those of Communicator: float buffers are device pointers; each call enqueues on
// the communicator's own stream and synchronises it before returning, so results are ready and
// errors (ncclResult_t, cudaError_t, and NCCL's asynchronous errors) surface as
// std::runtime_error at the call that caused them. Every wait polls the stream or event and
// NCCL's asynchronous error together (NCCL's documented error handling): on an error it aborts
// the communicator (ncclCommAbort) and throws, naming the call. Each communicator also registers
// its abort with parallel::register_abort_hook, which the training watchdog runs before it ends a
// rank that made no progress, so the peers' pending operations fail too instead of hanging. The started forms (start_all_reduce_sum,
// start_all_gather, start_reduce_scatter_sum) enqueue the same way and return at once with an
// event recorded after the collective: test() queries it, wait() synchronises on it and then
// checks NCCL's asynchronous error, so the collective runs on its stream beside the kernels the
// caller launches meanwhile. Every collective on device buffers is ordered after the kernels
// queued on Kokkos' stream by an event its stream waits for (core::order_after_kernels), so
// callers need not fence before one (orders_after_kernels()); the host does not wait for them. Tags are accepted and ignored: NCCL matches point-to-point messages in
// issue order per pair of ranks. A float buffer in host memory (by cudaPointerGetAttributes) goes
// to the MPI control-plane communicator instead, so callers that mix device buffers with host
// vectors work on every transport.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

#include "parallel/communicator.hpp"
#include "parallel/mpi_communicator.hpp"

struct ncclComm;    // ncclComm_t   == ncclComm*
struct CUstream_st; // cudaStream_t == CUstream_st*

namespace colossal::parallel {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: one NCCL rank per MPI rank, same rank numbers, on CUDA `device`.
  NcclCommunicator(const MpiCommunicator& bootstrap, int device);
  ~NcclCommunicator() override;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string_view backend() const override { return "nccl"; }
  MemorySpace memory_space() const override { return MemorySpace::device; }
  bool orders_after_kernels() const override { return true; }
  bool matches_in_issue_order() const override { return true; }
  void* transport_stream() const override { return stream_; }

  int device() const { return device_; }
  const MpiCommunicator& host() const { return host_; }  // the control plane's communicator
  CUstream_st* stream() const { return stream_; }  // a cudaStream_t

 private:
  void do_all_reduce_sum(std::span<float> buffer) override;
  void do_all_reduce_max(std::span<float> buffer) override;
  void do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) override;
  void do_all_gather(std::span<const float> input, std::span<float> output) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum(std::span<float> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_reduce_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum_bf16(
      std::span<std::uint16_t> buffer) override;
  std::unique_ptr<PendingCollective> do_start_all_gather(std::span<const float> input,
                                                         std::span<float> output) override;
  std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum(std::span<const float> input,
                                                                 std::span<float> output) override;
  void do_broadcast(std::span<float> buffer, int root) override;
  void do_broadcast_bytes(std::span<std::byte> buffer, int root) override;
  double do_all_reduce_sum_value(double value) override;
  void do_send(std::span<const float> buffer, int dest, int tag) override;
  void do_recv(std::span<float> buffer, int source, int tag) override;
  void do_send_recv(std::span<const float> send_buffer, int dest, std::span<float> recv_buffer,
                    int source, int tag) override;
  void do_exchange(std::span<const PeerTransfer> transfers) override;
  void do_barrier() override;
  std::unique_ptr<Communicator> do_split(int color, int key) const override;

  void synchronize(const char* what);
  // Waits until `query` (a cudaStreamQuery or cudaEventQuery, as an int) says done, asking NCCL
  // for an asynchronous error meanwhile: a peer that died or a network failure ends the wait
  // with NCCL's error (this communicator aborted) instead of a hang. `what` names the call.
  void await(const std::function<int()>& query, const char* what);
  // ncclCommAbort, once (the watchdog's hook, or await on an asynchronous error).
  void abort();
  // An event recorded on the stream after the collective just enqueued, behind PendingCollective.
  std::unique_ptr<PendingCollective> pending(const char* what);
  void check_nccl(int result, const char* call) const;
  // Throws (naming `call`) once the communicator was aborted: it may not be used again.
  void check_open(const char* call) const;
  // Before enqueuing `call` on device buffers: check_open, then the stream ordered after the
  // kernels queued on Kokkos' stream (core::order_after_kernels).
  void enter(const char* call);
  void check_cuda(int error, const char* call) const;

  MpiCommunicator host_;
  int device_ = 0;
  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  // ncclCommAbort frees the communicator, and the watchdog may call it from its thread: abort()
  // holds this mutex, and so does every use of comm_ while a wait polls (re-checking aborted_
  // under it), so no call reads a freed communicator. An enqueue checks aborted_ first; one that
  // races an abort from the watchdog ends with the process, which the watchdog ends at once.
  mutable std::mutex comm_mutex_;
  std::atomic<bool> aborted_{false};
  int abort_hook_ = -1;  // parallel::register_abort_hook's id
};

// The CUDA device this process should use: its rank on its node (parallel::node_local_rank: the
// launcher's OMPI_COMM_WORLD_LOCAL_RANK, ..., SLURM_LOCALID when they number the node's ranks
// 0..n-1, else its rank among the processes of `world` on the same node), modulo the number of
// visible devices. Collective over `world`. Throws if no device is visible.
int node_local_device(const MpiCommunicator& world);

// An NcclCommunicator over the ranks of `world`, each process on node_local_device(world).
std::unique_ptr<NcclCommunicator> make_nccl_communicator(const MpiCommunicator& world);

}  // namespace colossal::parallel
