// The one interface every collective in colossal goes through, over MPI (host buffers) or NCCL
// (device buffers).
//
// Buffers:
//   * float buffers live in memory_space(): host memory for MpiCommunicator, CUDA device memory
//     for NcclCommunicator. A std::span over device memory is only a (pointer, count) pair here;
//     it is never dereferenced on the host.
//   * byte and string broadcasts are control-plane data (config text, plan text, small integers)
//     and live in host memory on every backend.
//
// Every call is blocking: when it returns the result is in place (NCCL synchronises its stream).
// Every collective is collective over all ranks of the communicator, with the same sizes and root
// on every rank; argument errors are detected identically on every rank, so all ranks throw
// std::invalid_argument together instead of some of them hanging.
//
// Byte counting (CommStats). Each call is recorded under its kind with two numbers:
//   payload_bytes: the size of the logical buffer, the "size" of nccl-tests:
//       all_reduce_sum      n * 4                 (n = buffer.size(); n * 2 for the bf16 sum)
//       reduce_scatter_sum  p * c * 4             (the full input; c = output.size(); bf16: n * 2)
//       all_gather          p * c * 4             (the full output; c = input.size())
//       broadcast           n * sizeof(element)
//       send / recv         n * 4                 (send counted by the sender, recv by the receiver)
//   wire_bytes: the bytes each rank sends under the bandwidth-optimal (ring) algorithm, i.e.
//       payload_bytes times the nccl-tests "bus bandwidth" factor:
//       all_reduce_sum      2 * (p-1)/p * payload
//       reduce_scatter_sum      (p-1)/p * payload
//       all_gather              (p-1)/p * payload
//       broadcast           payload (pipelined chain: every rank forwards the buffer once)
//       send / recv         payload
//   With p == 1 no collective moves anything: wire_bytes is 0 (payload_bytes is still counted).
//   The same factors are exposed in `ring_wire_bytes` so the cost model uses the formulas the
//   counters use. barrier counts calls only. split() is set-up and is not counted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace colossal::parallel {

enum class MemorySpace { host, device };

enum class CollectiveKind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier };

const char* collective_name(CollectiveKind kind);

// Bytes one rank sends for a collective of `payload_bytes` over `ranks` ranks under the ring model
// above (the bus-bandwidth factor of nccl-tests). Shared by the counters and the cost model.
double ring_wire_bytes(CollectiveKind kind, double payload_bytes, int ranks);

struct OpStats {
  std::uint64_t calls = 0;
  std::uint64_t payload_bytes = 0;
  double wire_bytes = 0.0;
};

struct CommStats {
  OpStats all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier;

  const OpStats& operator[](CollectiveKind kind) const;
  OpStats& operator[](CollectiveKind kind);
  std::uint64_t total_calls() const;
  std::uint64_t total_payload_bytes() const;
  double total_wire_bytes() const;
};

// What this process is blocked in now: a collective or point-to-point call, or the wait on a
// started one (the watchdog names it when a run stops making progress). None outside them.
struct CollectiveWait {
  CollectiveKind kind;
  std::uint64_t payload_bytes;  // as CommStats counts them
  int ranks;                    // of the communicator
  const char* backend;          // "mpi" | "nccl" | "staged-mpi"
  double seconds;               // waited so far
};
std::optional<CollectiveWait> current_collective_wait();
// "waiting 12 s in all_reduce of 97.3 MB over 2 ranks (mpi)".
std::string describe(const CollectiveWait& wait);

// Transports that can be torn down from another thread when the job must end: each live
// NcclCommunicator registers its ncclCommAbort, which ends the operations still pending on it and
// closes its connections, so the peers' pending operations fail with NCCL's error instead of
// hanging until their own watchdogs fire. The watchdog runs them before it ends the process.
// register_abort_hook returns the id to unregister with (the owner's destructor); hooks run
// newest first (a layout's group communicators before the world's: a step waits in those), each
// once, under a lock that unregister waits on, so a hook never runs on
// a destroyed owner (a hook must therefore not register or unregister hooks itself, and one that
// hangs holds up its owners' destructors: the watchdog ends the process 10 s after it starts
// them). `what` names the hook in run_abort_hooks' report.
int register_abort_hook(std::string what, std::function<void()> hook);
void unregister_abort_hook(int id);
// Runs and forgets every registered hook (best effort: an exception is reported, not thrown);
// the names of those that ran, in the order they ran (newest first).
std::vector<std::string> run_abort_hooks();

// A collective in flight (from Communicator::start_all_reduce_sum, start_all_gather,
// start_reduce_scatter_sum, start_send). test() lets it progress and
// says whether it has completed; wait() completes it. Destroying an unfinished one waits for it.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// One send or receive of a point-to-point group (Communicator::exchange). `data` is read by a
// send and written by a receive; it lives in the communicator's memory_space().
struct PeerTransfer {
  enum class Direction : std::uint8_t { send, recv };
  Direction direction;
  int peer;
  float* data;
  std::size_t count;

  static PeerTransfer send(const float* data, std::size_t count, int peer) {
    return {Direction::send, peer, const_cast<float*>(data), count};
  }
  static PeerTransfer recv(float* data, std::size_t count, int peer) {
    return {Direction::recv, peer, data, count};
  }
  bool is_send() const { return direction == Direction::send; }
};

// Non-virtual public interface: the base class validates arguments and counts bytes once for all
// backends; a backend implements only the private do_* hooks.
class Communicator {
 public:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi" | "nccl" | "staged-mpi"
  virtual MemorySpace memory_space() const = 0;  // where float buffers must live
  // Whether the transport orders its collectives after the kernels queued on Kokkos' stream by
  // itself, without the host waiting (NCCL: core::order_after_kernels, an event its stream waits
  // for). Otherwise every call below that hands float buffers to the transport first waits for
  // those kernels (core::fence_kernels): fence_kernels_unless_ordered() does whichever this
  // transport needs, so callers never fence before a collective, send or receive.
  virtual bool orders_after_kernels() const { return false; }
  void fence_kernels_unless_ordered() const;
  // The CUDA stream (a cudaStream_t) the transport queues its work on, where it has one (NCCL):
  // work on other streams (copies) orders the transport after itself through it. Null for
  // transports the host drives (MPI, staged), which need such work complete before a call.
  virtual void* transport_stream() const { return nullptr; }

  // buffer <- sum over ranks of buffer (in place).
  void all_reduce_sum(std::span<float> buffer);
  // buffer <- element-wise maximum over ranks (counted as an all-reduce).
  void all_reduce_max(std::span<float> buffer);
  // The same, started without waiting, so it can overlap computation that does not touch
  // `buffer`; counted when started. Backends without non-blocking collectives complete it here.
  std::unique_ptr<PendingCollective> start_all_reduce_sum(std::span<float> buffer);
  // The gradient reductions of parallel.grad_reduce: bf16 (halved bytes on the wire): `buffer`
  // holds bf16 bit patterns (core/bf16.hpp) in memory_space(). Each partial sum is computed in
  // fp32 and rounded to bf16, nearest even (as NCCL's ncclBfloat16 sum), so on two ranks the
  // result is exactly bf16(a + b); on more it depends on the transport's reduction order. Started
  // without waiting and in place; counted as all_reduce / reduce_scatter of 2-byte elements.
  // buffer <- the bf16 sum over ranks.
  std::unique_ptr<PendingCollective> start_all_reduce_sum_bf16(std::span<std::uint16_t> buffer);
  // Block rank() of buffer <- block rank() of the bf16 sum over ranks (the other blocks are
  // clobbered); buffer.size() must be a multiple of size().
  std::unique_ptr<PendingCollective> start_reduce_scatter_sum_bf16(
      std::span<std::uint16_t> buffer);
  // output <- block rank() of the sum over ranks of input; input.size() == size() * output.size().
  // In place when output is exactly block rank() of input (input is then clobbered); otherwise
  // they must not overlap.
  void reduce_scatter_sum(std::span<const float> input, std::span<float> output);
  // The same, started without waiting (ZeRO-2/3 reduce a unit's gradients while backward runs
  // the next): neither buffer may be touched until the returned handle completes, and in place
  // the result is in block rank() only then; counted when started. Backends without
  // non-blocking collectives complete it here.
  std::unique_ptr<PendingCollective> start_reduce_scatter_sum(std::span<const float> input,
                                                              std::span<float> output);
  // output <- concatenation of every rank's input in rank order; output.size() == size() *
  // input.size(). In place when input is exactly block rank() of output.
  void all_gather(std::span<const float> input, std::span<float> output);
  // The same, started without waiting (ZeRO-3's prefetch of the next unit): neither buffer may
  // be touched until the returned handle completes; counted when started. Backends without
  // non-blocking collectives complete it here.
  std::unique_ptr<PendingCollective> start_all_gather(std::span<const float> input,
                                                      std::span<float> output);
  // buffer <- root's buffer.
  void broadcast(std::span<float> buffer, int root);
  // Host memory on every backend (see the top of this file).
  void broadcast_bytes(std::span<std::byte> buffer, int root);
  // text <- root's text, any length (a length header is broadcast first and counted too).
  void broadcast_string(std::string& text, int root);
  // Sum over ranks of a host scalar (a loss, a squared norm, a flag), in double on every backend:
  // control plane, like the byte broadcasts. Counted as an all-reduce of 8 bytes.
  double all_reduce_sum_value(double value);
  // value <- root's value, for small trivially copyable host values (counts, flags, seeds).
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void broadcast_value(T& value, int root) {
    broadcast_bytes(std::as_writable_bytes(std::span<T>(&value, 1)), root);
  }

  // Blocking point-to-point. Tags must be >= 0; NCCL has no tags and matches in issue order per
  // pair of ranks, so code that must run on both backends never relies on tags to reorder.
  void send(std::span<const float> buffer, int dest, int tag);
  // The same, started without waiting (MPI_Isend): `buffer` must stay untouched until the
  // returned handle completes. Backends without non-blocking sends complete it here.
  std::unique_ptr<PendingCollective> start_send(std::span<const float> buffer, int dest, int tag);
  // Receives exactly buffer.size() floats; a message of another size is an error.
  void recv(std::span<float> buffer, int source, int tag);
  // send to dest and receive from source at once (a ring shift without deadlock).
  void send_recv(std::span<const float> send_buffer, int dest, std::span<float> recv_buffer,
                 int source, int tag);

  // A group of sends and receives that progress together and have all completed when it
  // returns (NCCL: one ncclGroupStart/ncclGroupEnd, so a send and a receive of the group never
  // wait on each other). No tags: messages between two ranks match in the order they are issued
  // (calls in order, and within a call in the order of `transfers`), on every backend, so the
  // two sides must list their messages alike. A receive gets exactly `count` floats: another
  // size is an error on MPI and undefined on NCCL, which cannot tell. A receive may not overlap
  // another transfer's buffer. Counted per transfer as send / recv. A rank may list itself (a
  // pipeline rank's chunks pass messages to each other).
  void exchange(std::span<const PeerTransfer> transfers);
  // Whether this transport's point-to-point traffic must go through exchange() in an order both
  // sides agree on: it neither buffers a send nor matches by tag (NCCL: an ncclSend completes
  // only while the peer's ncclRecv runs, and messages match in issue order). The pipeline then
  // exchanges each schedule step's messages as one group (parallel/pipeline_schedule.hpp). MPI
  // says so too under the test switch COLOSSAL_TEST_GROUPED_P2P=1, where its exchange() sends
  // synchronously (MPI_Issend: complete only once matched) on one tag, NCCL's rule on the host.
  virtual bool matches_in_issue_order() const { return false; }

  void barrier();

  // Collective: ranks with the same color form a new communicator, ordered by (key, old rank).
  // color must be >= 0 (every rank gets a group). The result has the same backend.
  std::unique_ptr<Communicator> split(int color, int key) const;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

  // Records a wait as the process's current one (current_collective_wait) for its lifetime, the
  // one before restored after.
  class WaitScope {
   public:
    WaitScope(const Communicator& comm, CollectiveKind kind, std::uint64_t payload_bytes);
    WaitScope(CollectiveKind kind, std::uint64_t payload_bytes, int ranks, const char* backend);
    ~WaitScope();
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    int kind_;
    std::uint64_t bytes_;
    int ranks_;
    const char* backend_;
    std::int64_t since_ns_;
  };

 private:
  virtual void do_all_reduce_sum(std::span<float> buffer) = 0;
  virtual void do_all_reduce_max(std::span<float> buffer) = 0;
  virtual std::unique_ptr<PendingCollective> do_start_all_reduce_sum(std::span<float> buffer);
  virtual void do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) = 0;
  virtual std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum(
      std::span<const float> input, std::span<float> output);
  // bf16 sums (size() > 1): a backend without them throws std::logic_error naming itself.
  virtual std::unique_ptr<PendingCollective> do_start_all_reduce_sum_bf16(
      std::span<std::uint16_t> buffer);
  virtual std::unique_ptr<PendingCollective> do_start_reduce_scatter_sum_bf16(
      std::span<std::uint16_t> buffer);
  virtual void do_all_gather(std::span<const float> input, std::span<float> output) = 0;
  virtual std::unique_ptr<PendingCollective> do_start_all_gather(std::span<const float> input,
                                                                 std::span<float> output);
  virtual void do_broadcast(std::span<float> buffer, int root) = 0;
  virtual void do_broadcast_bytes(std::span<std::byte> buffer, int root) = 0;
  virtual double do_all_reduce_sum_value(double value) = 0;
  virtual void do_send(std::span<const float> buffer, int dest, int tag) = 0;
  virtual std::unique_ptr<PendingCollective> do_start_send(std::span<const float> buffer,
                                                           int dest, int tag);
  virtual void do_recv(std::span<float> buffer, int source, int tag) = 0;
  virtual void do_send_recv(std::span<const float> send_buffer, int dest,
                            std::span<float> recv_buffer, int source, int tag) = 0;
  // A backend without grouped point-to-point throws std::logic_error naming itself.
  virtual void do_exchange(std::span<const PeerTransfer> transfers);
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key) const = 0;

  void record(CollectiveKind kind, std::uint64_t payload_bytes);
  // A call about to block: counted (record), and the process's wait for the scope's lifetime.
  WaitScope counted(CollectiveKind kind, std::uint64_t payload_bytes);
  // A call just started: counted, and returned with its wait recorded as the process's.
  std::unique_ptr<PendingCollective> started(std::unique_ptr<PendingCollective> pending,
                                             CollectiveKind kind, std::uint64_t payload_bytes);
  void check_rank(const char* what, const char* role, int peer) const;
  bool check_all_gather(std::span<const float> input, std::span<float> output) const;
  bool check_reduce_scatter(std::span<const float> input, std::span<float> output) const;

  CommStats stats_;
};

}  // namespace colossal::parallel
