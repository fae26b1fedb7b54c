// Compiled only when COLOSSAL_HAVE_CUDA (see parallel/CMakeLists.txt).
#include "parallel/nccl_communicator.hpp"
#include "parallel/staged_communicator.hpp"

#include "core/memory.hpp"
#include "parallel/local_device.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace colossal::parallel {

namespace {

std::string where(int rank, int size, int device) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size) + ", CUDA device " +
         std::to_string(device);
}

std::runtime_error cuda_error(cudaError_t error, const std::string& call, const std::string& at) {
  return std::runtime_error("colossal::parallel: " + call + " failed: " + cudaGetErrorName(error) +
                            ": " + cudaGetErrorString(error) + " (" + at + ")");
}

// NCCL reads only device memory. A float buffer in host memory (a std::vector the trainer
// gathers for a file, say) goes to the MPI communicator the NCCL one keeps for its control plane.
bool in_host_memory(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged;
}

// Whether a call's buffers are in host memory (MPI takes the call) rather than on the device
// (NCCL does). A mix is refused: the MPI here need not be CUDA-aware (Debian's Open MPI 4.1 is
// not), so it must never be handed the device buffer, and NCCL cannot read the host one.
bool on_host(std::initializer_list<const void*> pointers, const char* call) {
  int host = 0, device = 0;
  for (const void* p : pointers) {
    if (p != nullptr) ++(in_host_memory(p) ? host : device);
  }
  if (host > 0 && device > 0) {
    throw std::invalid_argument(std::string("colossal::parallel: ") + call + " was given " +
                                std::to_string(host) + " buffer(s) in host memory and " +
                                std::to_string(device) + " in device memory; the NCCL "
                                "communicator takes all on the device (NCCL) or all on the host "
                                "(its MPI control plane)");
  }
  return host > 0;
}

}  // namespace

NcclCommunicator::NcclCommunicator(const MpiCommunicator& bootstrap, int device)
    : host_(bootstrap.native()), device_(device) {
  // Local set-up first, then agree over MPI that every rank succeeded: a rank that fails alone
  // would otherwise leave the others waiting in ncclCommInitRank forever.
  ncclUniqueId id{};
  std::string local_error;
  try {
    // NCCL_COMM_BLOCKING=0 wins over the config's blocking (NCCL reads it last) and makes calls
    // return ncclInProgress before they complete, which nothing here expects.
    if (const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
        blocking != nullptr && std::string(blocking) == "0") {
      throw std::runtime_error("colossal::parallel: NCCL_COMM_BLOCKING=0 is set: non-blocking "
                               "NCCL communicators are not supported (" +
                               where(rank(), size(), device_) + "); unset it or set it to 1");
    }
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (host_.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  float failed = local_error.empty() ? 0.0f : 1.0f;
  host_.all_reduce_sum(std::span<float>(&failed, 1));
  if (failed > 0.0f) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (!local_error.empty()) throw std::runtime_error(local_error);
    throw std::runtime_error("colossal::parallel: NCCL set-up failed on " +
                             std::to_string(static_cast<int>(failed)) +
                             " other rank(s) (see their messages); this rank (" +
                             where(rank(), size(), device_) + ") stops with them");
  }
  host_.broadcast_bytes(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
  // Every rank holds the id before any blocks in ncclCommInitRankConfig, which makes no MPI
  // calls: an MPI whose broadcast returns early on some ranks (deferred collective progress, as
  // with HCOLL) would otherwise never deliver it to the others.
  host_.barrier();
  // Blocking (NCCL's default, said outright; NCCL_COMM_BLOCKING=0 was refused above): every
  // call here expects NCCL's result on return.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  const ncclResult_t init = ncclCommInitRankConfig(&comm_, size(), id, rank(), &config);
  if (init != ncclSuccess) {
    comm_ = nullptr;
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
    check_nccl(init, "ncclCommInitRankConfig");
  }
  abort_hook_ = register_abort_hook(
      "NCCL communicator of " + std::to_string(size()) + " ranks (" +
          where(rank(), size(), device_) + ")",
      [this] { abort(); });
}

NcclCommunicator::~NcclCommunicator() {
  // First, so the watchdog can no longer abort it. Errors cannot be reported from a destructor;
  // teardown is best effort.
  if (abort_hook_ >= 0) unregister_abort_hook(abort_hook_);
  cudaSetDevice(device_);
  // Not while an exception unwinds (perhaps this rank's alone: out of memory, a bad file):
  // ncclCommDestroy finalizes, which waits for the communicator to be quiescent across its
  // ranks, and the others are not destroying theirs; the rank would hang here instead of
  // reaching the MPI_Abort that ends the job (apps/cli.cpp). ncclCommAbort is no way out: on
  // recent NCCL it too waits for the node's other ranks to abort (NVIDIA/nccl#863). The
  // communicator is kept until the process ends, which an error does soon.
  if (comm_ != nullptr && !aborted_ && std::uncaught_exceptions() == 0) ncclCommDestroy(comm_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclCommunicator::abort() {
  std::lock_guard<std::mutex> lock(comm_mutex_);
  if (comm_ == nullptr || aborted_.exchange(true)) return;
  ncclCommAbort(comm_);  // frees it: nothing may use comm_ after this
}

void NcclCommunicator::check_open(const char* call) const {
  if (!aborted_) return;
  throw std::runtime_error("colossal::parallel: " + std::string(call) + " on an NCCL "
                           "communicator that was aborted (ncclCommAbort) (" +
                           where(rank(), size(), device_) +
                           "): the job must end; restart with checkpoint.resume: auto");
}

void NcclCommunicator::enter(const char* call) {
  check_open(call);
  core::order_after_kernels(stream_);
}

void NcclCommunicator::check_nccl(int result, const char* call) const {
  const auto code = static_cast<ncclResult_t>(result);
  if (code == ncclSuccess) return;
  std::string detail = ncclGetErrorString(code);
  const char* last = nullptr;
  {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    if (!aborted_ && comm_ != nullptr) last = ncclGetLastError(comm_);
  }
  if (last != nullptr && *last != '\0') detail += std::string("; ") + last;
  throw std::runtime_error("colossal::parallel: " + std::string(call) + " failed: " + detail +
                           " (" + where(rank(), size(), device_) + ")" +
                           (aborted_ ? "; the communicator was aborted (ncclCommAbort): the job "
                                       "must end; restart with checkpoint.resume: auto"
                                     : ""));
}

void NcclCommunicator::await(const std::function<int()>& query, const char* what) {
  // NCCL's asynchronous error, or ncclSuccess; under the mutex, throwing once aborted.
  auto async_error = [&](std::string* detail) {
    std::lock_guard<std::mutex> lock(comm_mutex_);
    check_open(what);
    ncclResult_t async = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm_, &async);
    if (asked != ncclSuccess) async = asked;
    if (async != ncclSuccess && async != ncclInProgress && detail != nullptr) {
      const char* last = ncclGetLastError(comm_);  // NCCL's words, before an abort frees it
      *detail = std::string(ncclGetErrorString(async)) +
                (last != nullptr && *last != '\0' ? std::string("; ") + last : std::string());
    }
    return async;
  };
  // Poll: spin (yielding) for the first thousand queries, a short collective's time, then sleep
  // 20 us between them, so a long wait leaves the core to the rank's other threads.
  for (int polls = 0;; ++polls) {
    check_open(what);
    const auto state = static_cast<cudaError_t>(query());
    if (state == cudaSuccess) break;
    if (state != cudaErrorNotReady) check_cuda(state, what);
    std::string detail;
    const ncclResult_t async = async_error(&detail);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort();
      throw std::runtime_error("colossal::parallel: " + std::string(what) +
                               " failed asynchronously: " + detail + " (" +
                               where(rank(), size(), device_) +
                               "); a peer may have died or lost its network. This communicator "
                               "was aborted (ncclCommAbort); restart with checkpoint.resume: "
                               "auto");
    }
    if (polls < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  std::string detail;
  const ncclResult_t async = async_error(&detail);
  if (async != ncclSuccess && async != ncclInProgress) {
    throw std::runtime_error("colossal::parallel: " + std::string(what) + " failed: " + detail +
                             " (" + where(rank(), size(), device_) + ")");
  }
}

void NcclCommunicator::check_cuda(int error, const char* call) const {
  const auto code = static_cast<cudaError_t>(error);
  if (code != cudaSuccess) throw cuda_error(code, call, where(rank(), size(), device_));
}

void NcclCommunicator::synchronize(const char* what) {
  CUstream_st* stream = stream_;
  await([stream] { return int(cudaStreamQuery(stream)); }, what);
}

void NcclCommunicator::do_all_reduce_sum(std::span<float> buffer) {
  if (on_host({buffer.data()}, "all_reduce_sum")) return host_.all_reduce_sum(buffer);
  enter("ncclAllReduce");
  check_nccl(ncclAllReduce(buffer.data(), buffer.data(), buffer.size(), ncclFloat32, ncclSum, comm_,
                           stream_),
             "ncclAllReduce");
  synchronize("ncclAllReduce");
}

void NcclCommunicator::do_all_reduce_max(std::span<float> buffer) {
  if (on_host({buffer.data()}, "all_reduce_max")) return host_.all_reduce_max(buffer);
  enter("ncclAllReduce");
  check_nccl(ncclAllReduce(buffer.data(), buffer.data(), buffer.size(), ncclFloat32, ncclMax, comm_,
                           stream_),
             "ncclAllReduce");
  synchronize("ncclAllReduce");
}

void NcclCommunicator::do_reduce_scatter_sum(std::span<const float> input,
                                             std::span<float> output) {
  if (on_host({input.data(), output.data()}, "reduce_scatter_sum")) {
    return host_.reduce_scatter_sum(input, output);
  }
  // NCCL is in place when output == input + rank * output.size(), exactly our in-place form.
  enter("ncclReduceScatter");
  check_nccl(ncclReduceScatter(input.data(), output.data(), output.size(), ncclFloat32, ncclSum,
                               comm_, stream_),
             "ncclReduceScatter");
  synchronize("ncclReduceScatter");
}

void NcclCommunicator::do_all_gather(std::span<const float> input, std::span<float> output) {
  if (on_host({input.data(), output.data()}, "all_gather")) return host_.all_gather(input, output);
  // NCCL is in place when input == output + rank * input.size(), exactly our in-place form.
  enter("ncclAllGather");
  check_nccl(ncclAllGather(input.data(), output.data(), input.size(), ncclFloat32, comm_, stream_),
             "ncclAllGather");
  synchronize("ncclAllGather");
}

namespace {
// A started NCCL collective: the event recorded after it on the communicator's stream. test()
// queries the event; wait() polls it and NCCL's asynchronous error (NcclCommunicator::await), so
// a peer that died ends the wait with NCCL's error instead of a hang. It calls back into its
// communicator, so it must not outlive it (the trainer's chunks, which hold them, go first).
class NcclPending final : public PendingCollective {
 public:
  using Await = std::function<void(const std::function<int()>&)>;
  NcclPending(cudaEvent_t event, Await await) : event_(event), await_(std::move(await)) {}
  ~NcclPending() override {
    // Dropped unwaited (an exception unwinding the step): waited as wait() does, so a peer that
    // died ends it with the communicator aborted instead of a hang outside the watchdog's
    // reach (cudaEventSynchronize would block for good); a destructor cannot report the error.
    try {
      wait();
    } catch (...) {
    }
  }
  bool test() override {
    if (event_ == nullptr) return true;
    const cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) return false;
    wait();
    return true;
  }
  void wait() override {
    if (event_ == nullptr) return;
    cudaEvent_t event = event_;
    struct Release {  // the event is destroyed however the wait ends
      cudaEvent_t& event;
      ~Release() {
        cudaEventDestroy(event);
        event = nullptr;
      }
    } release{event_};
    await_([event] { return int(cudaEventQuery(event)); });
  }

 private:
  cudaEvent_t event_;
  Await await_;
};
}  // namespace

std::unique_ptr<PendingCollective> NcclCommunicator::pending(const char* what) {
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t recorded = cudaEventRecord(event, stream_);
  if (recorded != cudaSuccess) {
    cudaEventDestroy(event);
    check_cuda(recorded, "cudaEventRecord");
  }
  return std::make_unique<NcclPending>(
      event, [this, what](const std::function<int()>& query) { await(query, what); });
}

std::unique_ptr<PendingCollective> NcclCommunicator::do_start_all_reduce_sum(
    std::span<float> buffer) {
  if (on_host({buffer.data()}, "start_all_reduce_sum")) return host_.start_all_reduce_sum(buffer);
  enter("ncclAllReduce");
  check_nccl(ncclAllReduce(buffer.data(), buffer.data(), buffer.size(), ncclFloat32, ncclSum, comm_,
                           stream_),
             "ncclAllReduce");
  return pending("ncclAllReduce");
}

// NCCL's bf16 sum adds in fp32 and rounds each partial sum to bf16, as the MPI backend's op does.
std::unique_ptr<PendingCollective> NcclCommunicator::do_start_all_reduce_sum_bf16(
    std::span<std::uint16_t> buffer) {
  if (on_host({buffer.data()}, "start_all_reduce_sum_bf16")) {
    return host_.start_all_reduce_sum_bf16(buffer);
  }
  enter("ncclAllReduce");
  check_nccl(ncclAllReduce(buffer.data(), buffer.data(), buffer.size(), ncclBfloat16, ncclSum,
                           comm_, stream_),
             "ncclAllReduce");
  return pending("ncclAllReduce");
}

std::unique_ptr<PendingCollective> NcclCommunicator::do_start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t> buffer) {
  if (on_host({buffer.data()}, "start_reduce_scatter_sum_bf16")) {
    return host_.start_reduce_scatter_sum_bf16(buffer);
  }
  const std::size_t c = buffer.size() / std::size_t(size());
  enter("ncclReduceScatter");
  check_nccl(ncclReduceScatter(buffer.data(), buffer.data() + std::size_t(rank()) * c, c,
                               ncclBfloat16, ncclSum, comm_, stream_),
             "ncclReduceScatter");
  return pending("ncclReduceScatter");
}

std::unique_ptr<PendingCollective> NcclCommunicator::do_start_reduce_scatter_sum(
    std::span<const float> input, std::span<float> output) {
  if (on_host({input.data(), output.data()}, "start_reduce_scatter_sum")) {
    return host_.start_reduce_scatter_sum(input, output);
  }
  enter("ncclReduceScatter");
  check_nccl(ncclReduceScatter(input.data(), output.data(), output.size(), ncclFloat32, ncclSum,
                               comm_, stream_),
             "ncclReduceScatter");
  return pending("ncclReduceScatter");
}

std::unique_ptr<PendingCollective> NcclCommunicator::do_start_all_gather(
    std::span<const float> input, std::span<float> output) {
  if (on_host({input.data(), output.data()}, "start_all_gather")) {
    return host_.start_all_gather(input, output);
  }
  enter("ncclAllGather");
  check_nccl(ncclAllGather(input.data(), output.data(), input.size(), ncclFloat32, comm_, stream_),
             "ncclAllGather");
  return pending("ncclAllGather");
}

void NcclCommunicator::do_broadcast(std::span<float> buffer, int root) {
  if (on_host({buffer.data()}, "broadcast")) return host_.broadcast(buffer, root);
  enter("ncclBroadcast");
  check_nccl(ncclBroadcast(buffer.data(), buffer.data(), buffer.size(), ncclFloat32, root, comm_,
                           stream_),
             "ncclBroadcast");
  synchronize("ncclBroadcast");
}

void NcclCommunicator::do_broadcast_bytes(std::span<std::byte> buffer, int root) {
  host_.broadcast_bytes(buffer, root);  // control plane: host memory
}

double NcclCommunicator::do_all_reduce_sum_value(double value) {
  return host_.all_reduce_sum_value(value);  // control plane: host memory
}

void NcclCommunicator::do_send(std::span<const float> buffer, int dest, int tag) {
  if (on_host({buffer.data()}, "send")) return host_.send(buffer, dest, tag);
  enter("ncclSend");
  check_nccl(ncclSend(buffer.data(), buffer.size(), ncclFloat32, dest, comm_, stream_), "ncclSend");
  synchronize("ncclSend");
}

void NcclCommunicator::do_recv(std::span<float> buffer, int source, int tag) {
  if (on_host({buffer.data()}, "recv")) return host_.recv(buffer, source, tag);
  enter("ncclRecv");
  check_nccl(ncclRecv(buffer.data(), buffer.size(), ncclFloat32, source, comm_, stream_),
             "ncclRecv");
  synchronize("ncclRecv");
}

void NcclCommunicator::do_send_recv(std::span<const float> send_buffer, int dest,
                                    std::span<float> recv_buffer, int source, int tag) {
  if (on_host({send_buffer.data(), recv_buffer.data()}, "send_recv")) {
    return host_.send_recv(send_buffer, dest, recv_buffer, source, tag);
  }
  enter("ncclGroupStart");
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  const ncclResult_t sent =
      ncclSend(send_buffer.data(), send_buffer.size(), ncclFloat32, dest, comm_, stream_);
  const ncclResult_t received =
      ncclRecv(recv_buffer.data(), recv_buffer.size(), ncclFloat32, source, comm_, stream_);
  const ncclResult_t ended = ncclGroupEnd();  // always close the group, even after an error
  check_nccl(sent, "ncclSend");
  check_nccl(received, "ncclRecv");
  check_nccl(ended, "ncclGroupEnd");
  synchronize("ncclSend/ncclRecv");
}

// One NCCL group: its sends and receives progress together on the stream, so two ranks that
// each send to the other before receiving (a pipeline's neighbours in their steady state) never
// wait on each other's send. Messages between two ranks match in the order issued.
void NcclCommunicator::do_exchange(std::span<const PeerTransfer> transfers) {
  // Empty transfers move nothing: they count as neither host nor device (an empty buffer's null
  // pointer would count as host memory and make one rank refuse a group that its peer goes on
  // to post) and are not posted. Their sizes come from the same code on every rank.
  std::size_t moving = 0, on_host = 0;
  for (const PeerTransfer& t : transfers) {
    if (t.count == 0) continue;
    ++moving;
    on_host += in_host_memory(t.data) ? 1 : 0;
  }
  if (moving == 0) return;
  if (on_host == moving) return host_.exchange(transfers);
  if (on_host > 0) {
    // Half of a group over MPI and half over NCCL would split the peers' matching.
    throw std::invalid_argument("colossal::parallel: exchange mixes host and device buffers (" +
                                std::to_string(on_host) + " of " + std::to_string(moving) +
                                " on the host); a group's buffers must all be on one side");
  }
  enter("ncclGroupStart");
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t first_error = ncclSuccess;
  const char* failed = nullptr;
  for (const PeerTransfer& t : transfers) {
    if (t.count == 0) continue;
    const ncclResult_t r = t.is_send()
                               ? ncclSend(t.data, t.count, ncclFloat32, t.peer, comm_, stream_)
                               : ncclRecv(t.data, t.count, ncclFloat32, t.peer, comm_, stream_);
    if (r != ncclSuccess && first_error == ncclSuccess) {
      first_error = r;
      failed = t.is_send() ? "ncclSend" : "ncclRecv";
    }
  }
  const ncclResult_t ended = ncclGroupEnd();  // always close the group, even after an error
  if (failed != nullptr) check_nccl(first_error, failed);
  check_nccl(ended, "ncclGroupEnd");
  synchronize("ncclSend/ncclRecv group");
}

void NcclCommunicator::do_barrier() {
  // Every NCCL call above has completed on its stream by the time it returns, so a host barrier
  // is a barrier for the device work too.
  host_.barrier();
}

std::unique_ptr<Communicator> NcclCommunicator::do_split(int color, int key) const {
  const std::unique_ptr<Communicator> part = host_.split(color, key);
  return std::make_unique<NcclCommunicator>(dynamic_cast<const MpiCommunicator&>(*part), device_);
}

int node_local_device(const MpiCommunicator& world) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL,
                          &node) != MPI_SUCCESS) {
    throw std::runtime_error("colossal::parallel: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed "
                             "while choosing a CUDA device");
  }
  // The launcher's word (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, srun's SLURM_LOCALID) when it is
  // sound on this node, else the rank in the node (the rule select_local_device follows).
  int local_rank = 0;
  try {
    local_rank = node_local_rank(node).rank;
  } catch (...) {
    MPI_Comm_free(&node);
    throw;
  }
  MPI_Comm_free(&node);
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    throw std::runtime_error(
        "colossal::parallel: no CUDA device is visible to rank " + std::to_string(world.rank()) +
        (error != cudaSuccess ? std::string(" (cudaGetDeviceCount: ") + cudaGetErrorString(error) + ")"
                              : std::string()) +
        " (the NCCL communicator needs one GPU per process); run on a GPU node or use the MPI "
        "communicator");
  }
  return local_rank % devices;
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(const MpiCommunicator& world) {
  return std::make_unique<NcclCommunicator>(world, node_local_device(world));
}

}  // namespace colossal::parallel
