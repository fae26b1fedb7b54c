#include "parallel/staged_communicator.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <stdexcept>
#include <utility>

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>

#include "parallel/nccl_communicator.hpp"
#endif

namespace colossal::parallel {

// Free buffers by capacity; a lease takes the smallest one that fits, else allocates one.
struct StagedCommunicator::Pool {
  StagingOps ops;
  StagingStats stats;
  struct Buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<Buffer> free;

  explicit Pool(StagingOps o) : ops(std::move(o)) {}
  ~Pool() {
    for (Buffer& b : free) ops.release(b.data);
  }
  Buffer take(std::size_t bytes) {
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->bytes >= bytes && (best == free.end() || it->bytes < best->bytes)) best = it;
    }
    if (best != free.end()) {
      const Buffer b = *best;
      free.erase(best);
      return b;
    }
    // Round up so that slightly different sizes in one step share buffers.
    const std::size_t size = std::max<std::size_t>(4096, std::bit_ceil(bytes));
    void* data = ops.allocate(size);
    if (data == nullptr) {
      throw std::runtime_error("colossal::parallel: staging buffer allocation of " +
                               std::to_string(size) + " bytes failed (" + ops.name + ")");
    }
    ++stats.allocations;
    stats.allocated_bytes += size;
    return {data, size};
  }
  void give(Buffer b) { free.push_back(b); }

  template <class T>
  void to_host(T* host, const T* device, std::size_t n) {
    if (n == 0) return;
    ops.to_host(host, device, n * sizeof(T));
    ++stats.copies_to_host;
    stats.bytes_to_host += n * sizeof(T);
  }
  template <class T>
  void to_device(T* device, const T* host, std::size_t n) {
    if (n == 0) return;
    ops.to_device(device, host, n * sizeof(T));
    ++stats.copies_to_device;
    stats.bytes_to_device += n * sizeof(T);
  }
};

class StagedCommunicator::Lease {
 public:
  Lease(std::shared_ptr<Pool> pool, std::size_t floats)
      : pool_(std::move(pool)), buffer_(pool_->take(floats * sizeof(float))), floats_(floats) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { pool_->give(buffer_); }
  std::span<float> span() const { return {static_cast<float*>(buffer_.data), floats_}; }
  // The same buffer as `n` elements of T (n * sizeof(T) <= the bytes leased).
  template <class T>
  std::span<T> as(std::size_t n) const {
    return {static_cast<T*>(buffer_.data), n};
  }

 private:
  std::shared_ptr<Pool> pool_;
  Pool::Buffer buffer_;
  std::size_t floats_;
};

namespace {

bool on_device(const StagingOps& ops, const void* p, std::size_t n) {
  return n > 0 && ops.is_device(p);
}

// A started MPI operation and the staging lease it reads or writes; `finish` runs once, after
// completion (the copy back of an all-reduce).
class StagedPending final : public PendingCollective {
 public:
  StagedPending(std::unique_ptr<PendingCollective> inner,
                std::unique_ptr<StagedCommunicator::Lease> lease, std::function<void()> finish)
      : lease_(std::move(lease)), inner_(std::move(inner)), finish_(std::move(finish)) {}
  ~StagedPending() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {  // cannot throw from a destructor; the inner handle reported it
      }
    }
  }
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    complete();
    return true;
  }
  void wait() override {
    if (done_) return;
    inner_->wait();
    complete();
  }

 private:
  void complete() {
    done_ = true;
    if (finish_) finish_();
    lease_.reset();
  }
  // The lease first: destroyed after the inner handle, whose destructor waits for the MPI
  // operation that still uses the leased buffer (when wait() threw in ~StagedPending).
  std::unique_ptr<StagedCommunicator::Lease> lease_;
  std::unique_ptr<PendingCollective> inner_;
  std::function<void()> finish_;
  bool done_ = false;
};

}  // namespace

StagingOps host_staging_ops() {
  StagingOps ops;
  ops.name = "host stand-in";
  ops.is_device = [](const void*) { return true; };
  ops.allocate = [](std::size_t bytes) -> void* { return ::operator new(bytes); };
  ops.release = [](void* p) { ::operator delete(p); };
  ops.to_host = [](void* host, const void* device, std::size_t bytes) {
    std::memcpy(host, device, bytes);
  };
  ops.to_device = [](void* device, const void* host, std::size_t bytes) {
    std::memcpy(device, host, bytes);
  };
  return ops;
}

#ifdef COLOSSAL_HAVE_CUDA
namespace {

void check_cuda(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  throw std::runtime_error(std::string("colossal::parallel: staged MPI: ") + call + " failed: " +
                           cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

struct CudaStream {
  cudaStream_t stream = nullptr;
  CudaStream() {
    // A blocking stream: it waits for the legacy default stream's work (the kernels that wrote
    // the buffer) before each copy starts.
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamDefault), "cudaStreamCreate");
  }
  ~CudaStream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  void copy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind) const {
    check_cuda(cudaMemcpyAsync(to, from, bytes, kind, stream), "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace

StagingOps cuda_staging_ops() {
  auto stream = std::make_shared<CudaStream>();
  StagingOps ops;
  ops.name = "cuda pinned";
  ops.is_device = [](const void* p) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();  // an unregistered host pointer on old runtimes
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice;  // managed memory is host-accessible
  };
  ops.allocate = [](std::size_t bytes) -> void* {
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    return p;
  };
  ops.release = [](void* p) { cudaFreeHost(p); };
  ops.to_host = [stream](void* host, const void* device, std::size_t bytes) {
    stream->copy(host, device, bytes, cudaMemcpyDeviceToHost);
  };
  ops.to_device = [stream](void* device, const void* host, std::size_t bytes) {
    stream->copy(device, host, bytes, cudaMemcpyHostToDevice);
  };
  return ops;
}
#endif

StagedCommunicator::StagedCommunicator(std::unique_ptr<MpiCommunicator> host, StagingOps ops)
    : host_(std::move(host)), pool_(std::make_shared<Pool>(std::move(ops))) {
  if (!host_) throw std::invalid_argument("StagedCommunicator: null MPI communicator");
}

StagedCommunicator::~StagedCommunicator() = default;

const StagingStats& StagedCommunicator::staging_stats() const { return pool_->stats; }
const StagingOps& StagedCommunicator::ops() const { return pool_->ops; }

template <class F>
void StagedCommunicator::staged_in_place(std::span<float> buffer, F&& call) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    call(buffer);
    return;
  }
  Lease lease(pool_, buffer.size());
  pool_->to_host(lease.span().data(), buffer.data(), buffer.size());
  call(lease.span());
  pool_->to_device(buffer.data(), lease.span().data(), buffer.size());
}

void StagedCommunicator::do_all_reduce_sum(std::span<float> buffer) {
  staged_in_place(buffer, [&](std::span<float> b) { host_->all_reduce_sum(b); });
}

void StagedCommunicator::do_all_reduce_max(std::span<float> buffer) {
  staged_in_place(buffer, [&](std::span<float> b) { host_->all_reduce_max(b); });
}

namespace {
// A started in-place operation on a device buffer: copied into a leased host buffer, started
// there by `start`, and elements [at, at + count) copied back once it completes.
template <class T, class Start>
std::unique_ptr<PendingCollective> start_staged(
    const std::shared_ptr<StagedCommunicator::Pool>& pool, std::span<T> buffer, Start&& start,
    std::size_t at, std::size_t count) {
  auto lease = std::make_unique<StagedCommunicator::Lease>(
      pool, (buffer.size() * sizeof(T) + sizeof(float) - 1) / sizeof(float));
  const std::span<T> staged = lease->template as<T>(buffer.size());
  pool->to_host(staged.data(), buffer.data(), buffer.size());
  auto inner = start(staged);
  return std::make_unique<StagedPending>(std::move(inner), std::move(lease),
                                         [pool, buffer, staged, at, count] {
                                           pool->to_device(buffer.data() + at,
                                                           staged.data() + at, count);
                                         });
}
}  // namespace

std::unique_ptr<PendingCollective> StagedCommunicator::do_start_all_reduce_sum(
    std::span<float> buffer) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    return host_->start_all_reduce_sum(buffer);
  }
  return start_staged(
      pool_, buffer, [&](std::span<float> b) { return host_->start_all_reduce_sum(b); }, 0,
      buffer.size());
}

std::unique_ptr<PendingCollective> StagedCommunicator::do_start_all_reduce_sum_bf16(
    std::span<std::uint16_t> buffer) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    return host_->start_all_reduce_sum_bf16(buffer);
  }
  return start_staged(
      pool_, buffer,
      [&](std::span<std::uint16_t> b) { return host_->start_all_reduce_sum_bf16(b); }, 0,
      buffer.size());
}

std::unique_ptr<PendingCollective> StagedCommunicator::do_start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t> buffer) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    return host_->start_reduce_scatter_sum_bf16(buffer);
  }
  // Only this rank's block comes back.
  const std::size_t c = buffer.size() / std::size_t(size());
  return start_staged(
      pool_, buffer,
      [&](std::span<std::uint16_t> b) { return host_->start_reduce_scatter_sum_bf16(b); },
      std::size_t(rank()) * c, c);
}

void StagedCommunicator::do_reduce_scatter_sum(std::span<const float> input,
                                               std::span<float> output) {
  const std::size_t c = output.size();
  const bool in_place = input.data() + std::size_t(rank()) * c == output.data();
  const bool dev_in = on_device(pool_->ops, input.data(), input.size());
  const bool dev_out = on_device(pool_->ops, output.data(), c);
  if (!dev_in && !dev_out) return host_->reduce_scatter_sum(input, output);
  if (in_place) {  // input (hence output) on the device: the same in-place call on the host copy
    Lease lease(pool_, input.size());
    const std::span<float> in = lease.span();
    pool_->to_host(in.data(), input.data(), input.size());
    const std::span<float> out = in.subspan(std::size_t(rank()) * c, c);
    host_->reduce_scatter_sum(in, out);
    pool_->to_device(output.data(), out.data(), c);
    return;
  }
  Lease lease(pool_, (dev_in ? input.size() : 0) + (dev_out ? c : 0));
  std::span<float> space = lease.span();
  std::span<const float> in = input;
  if (dev_in) {
    pool_->to_host(space.data(), input.data(), input.size());
    in = space.first(input.size());
    space = space.subspan(input.size());
  }
  const std::span<float> out = dev_out ? space.first(c) : output;
  host_->reduce_scatter_sum(in, out);
  if (dev_out) pool_->to_device(output.data(), out.data(), c);
}

void StagedCommunicator::do_all_gather(std::span<const float> input, std::span<float> output) {
  const std::size_t c = input.size();
  const bool in_place = output.data() + std::size_t(rank()) * c == input.data();
  const bool dev_in = on_device(pool_->ops, input.data(), c);
  const bool dev_out = on_device(pool_->ops, output.data(), output.size());
  if (!dev_in && !dev_out) return host_->all_gather(input, output);
  if (in_place) {
    Lease lease(pool_, output.size());
    const std::span<float> out = lease.span();
    const std::span<float> mine = out.subspan(std::size_t(rank()) * c, c);
    pool_->to_host(mine.data(), input.data(), c);
    host_->all_gather(mine, out);
    pool_->to_device(output.data(), out.data(), output.size());
    return;
  }
  Lease lease(pool_, (dev_in ? c : 0) + (dev_out ? output.size() : 0));
  std::span<float> space = lease.span();
  std::span<const float> in = input;
  if (dev_in) {
    pool_->to_host(space.data(), input.data(), c);
    in = space.first(c);
    space = space.subspan(c);
  }
  const std::span<float> out = dev_out ? space.first(output.size()) : output;
  host_->all_gather(in, out);
  if (dev_out) pool_->to_device(output.data(), out.data(), output.size());
}

void StagedCommunicator::do_broadcast(std::span<float> buffer, int root) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) return host_->broadcast(buffer, root);
  Lease lease(pool_, buffer.size());
  const std::span<float> b = lease.span();
  if (rank() == root) pool_->to_host(b.data(), buffer.data(), buffer.size());
  host_->broadcast(b, root);
  if (rank() != root) pool_->to_device(buffer.data(), b.data(), buffer.size());
}

void StagedCommunicator::do_broadcast_bytes(std::span<std::byte> buffer, int root) {
  host_->broadcast_bytes(buffer, root);  // control plane: host memory
}

double StagedCommunicator::do_all_reduce_sum_value(double value) {
  return host_->all_reduce_sum_value(value);
}

void StagedCommunicator::do_send(std::span<const float> buffer, int dest, int tag) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) return host_->send(buffer, dest, tag);
  Lease lease(pool_, buffer.size());
  pool_->to_host(lease.span().data(), buffer.data(), buffer.size());
  host_->send(lease.span(), dest, tag);
}

std::unique_ptr<PendingCollective> StagedCommunicator::do_start_send(std::span<const float> buffer,
                                                                     int dest, int tag) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    return host_->start_send(buffer, dest, tag);
  }
  // The lease lives until the send completes: the caller may reuse `buffer` at once.
  auto lease = std::make_unique<Lease>(pool_, buffer.size());
  pool_->to_host(lease->span().data(), buffer.data(), buffer.size());
  auto inner = host_->start_send(lease->span(), dest, tag);
  return std::make_unique<StagedPending>(std::move(inner), std::move(lease), nullptr);
}

void StagedCommunicator::do_recv(std::span<float> buffer, int source, int tag) {
  if (!on_device(pool_->ops, buffer.data(), buffer.size())) {
    return host_->recv(buffer, source, tag);
  }
  Lease lease(pool_, buffer.size());
  host_->recv(lease.span(), source, tag);
  pool_->to_device(buffer.data(), lease.span().data(), buffer.size());
}

void StagedCommunicator::do_send_recv(std::span<const float> send_buffer, int dest,
                                      std::span<float> recv_buffer, int source, int tag) {
  const bool dev_send = on_device(pool_->ops, send_buffer.data(), send_buffer.size());
  const bool dev_recv = on_device(pool_->ops, recv_buffer.data(), recv_buffer.size());
  if (!dev_send && !dev_recv) {
    return host_->send_recv(send_buffer, dest, recv_buffer, source, tag);
  }
  Lease lease(pool_, (dev_send ? send_buffer.size() : 0) + (dev_recv ? recv_buffer.size() : 0));
  std::span<float> space = lease.span();
  std::span<const float> out = send_buffer;
  if (dev_send) {
    pool_->to_host(space.data(), send_buffer.data(), send_buffer.size());
    out = space.first(send_buffer.size());
    space = space.subspan(send_buffer.size());
  }
  const std::span<float> in = dev_recv ? space.first(recv_buffer.size()) : recv_buffer;
  host_->send_recv(out, dest, in, source, tag);
  if (dev_recv) pool_->to_device(recv_buffer.data(), in.data(), recv_buffer.size());
}

// The group's device buffers staged in one lease: sends copied down first, the host group, then
// the receives copied up.
void StagedCommunicator::do_exchange(std::span<const PeerTransfer> transfers) {
  std::size_t staged = 0;
  for (const PeerTransfer& t : transfers) {
    if (on_device(pool_->ops, t.data, t.count)) staged += t.count;
  }
  Lease lease(pool_, staged);
  std::span<float> space = lease.span();
  std::vector<PeerTransfer> host(transfers.begin(), transfers.end());
  for (PeerTransfer& t : host) {
    if (!on_device(pool_->ops, t.data, t.count)) continue;
    float* copy = space.data();
    space = space.subspan(t.count);
    if (t.is_send()) pool_->to_host(copy, t.data, t.count);
    t.data = copy;
  }
  host_->exchange(host);
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (!host[i].is_send() && host[i].data != transfers[i].data) {
      pool_->to_device(transfers[i].data, host[i].data, host[i].count);
    }
  }
}

void StagedCommunicator::do_barrier() { host_->barrier(); }

std::unique_ptr<Communicator> StagedCommunicator::do_split(int color, int key) const {
  std::unique_ptr<Communicator> part = host_->split(color, key);
  auto* mpi = dynamic_cast<MpiCommunicator*>(part.get());
  if (mpi == nullptr) throw std::logic_error("StagedCommunicator: MPI split gave another backend");
  part.release();
  // The part gets its own pool (its buffers are leased independently) over the same copy ops.
  return std::make_unique<StagedCommunicator>(std::unique_ptr<MpiCommunicator>(mpi), pool_->ops);
}

const MpiCommunicator* mpi_of(const Communicator* comm) {
  if (comm == nullptr) return nullptr;
  if (const auto* mpi = dynamic_cast<const MpiCommunicator*>(comm)) return mpi;
  if (const auto* staged = dynamic_cast<const StagedCommunicator*>(comm)) return &staged->host();
#ifdef COLOSSAL_HAVE_CUDA
  if (const auto* nccl = dynamic_cast<const NcclCommunicator*>(comm)) return &nccl->host();
#endif
  return nullptr;
}

}  // namespace colossal::parallel
