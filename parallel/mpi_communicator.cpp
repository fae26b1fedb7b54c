#include "parallel/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/bf16.hpp"

#ifdef COLOSSAL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace colossal::parallel {

namespace {

// MPI-3 counts are int; buffers beyond that must be bucketed by the caller.
int mpi_count(std::size_t count, const char* what) {
  if (count > static_cast<std::size_t>(INT_MAX)) {
    throw std::invalid_argument(std::string("colossal::parallel: ") + what + ": " +
                                std::to_string(count) +
                                " elements exceed INT_MAX (MPI counts are int); split the "
                                "buffer into buckets of at most INT_MAX elements");
  }
  return static_cast<int>(count);
}

// MPI takes non-const pointers in some implementations' older signatures; the data is not written.
void* send_ptr(const void* p) { return const_cast<void*>(p); }

// MPI's in-place reduce-scatter leaves the result at the start of the buffer; this moves it to
// the rank's block (block 0 and block r > 0 never overlap), with cudaMemcpy where the buffer is
// device memory (a CUDA-aware MPI's), else with memmove (host memory, or no CUDA device at all).
void move_block(void* to, const void* from, std::size_t bytes) {
  if (to == from || bytes == 0) return;
#ifdef COLOSSAL_HAVE_CUDA
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, to) == cudaSuccess &&
      (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged)) {
    const cudaError_t e = cudaMemcpy(to, from, bytes, cudaMemcpyDefault);
    if (e != cudaSuccess) {
      throw std::runtime_error(std::string("colossal::parallel: moving a reduce-scatter's block "
                                           "in device memory: ") + cudaGetErrorString(e));
    }
    return;
  }
  static_cast<void>(cudaGetLastError());  // a host pointer, or no device: not an error here
#endif
  std::memmove(to, from, bytes);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm parent) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!initialised || finalised) {
    throw std::logic_error(
        "colossal::parallel: MpiCommunicator created while MPI is not running (MPI must be "
        "initialised and not yet finalised); call MPI_Init first and destroy communicators before "
        "MPI_Finalize");
  }
  const int code = MPI_Comm_dup(parent, &comm_);
  if (code != MPI_SUCCESS) {
    comm_ = MPI_COMM_NULL;
    check(code, "MPI_Comm_dup");
  }
  init_from_comm();
}

MpiCommunicator::MpiCommunicator(Adopt, MPI_Comm owned) : comm_(owned) { init_from_comm(); }

namespace {
// COLOSSAL_TEST_GROUPED_P2P=1: NCCL's point-to-point rule on MPI (matches_in_issue_order).
bool grouped_p2p_from_env() {
  const char* v = std::getenv("COLOSSAL_TEST_GROUPED_P2P");
  return v != nullptr && std::string_view(v) == "1";
}
// The one tag of exchange(): its messages match in issue order, as NCCL's do.
constexpr int kExchangeTag = 32767;  // the MPI standard's guaranteed minimum of MPI_TAG_UB
}  // namespace

void MpiCommunicator::init_from_comm() {
  in_issue_order_ = grouped_p2p_from_env();
  try {
    // Errors on our duplicate come back as codes, which check() turns into exceptions.
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Comm ring = MPI_COMM_NULL;
    check(MPI_Comm_dup(comm_, &ring), "MPI_Comm_dup");
    ring_shared_ = std::make_shared<detail::RingShared>(ring);  // owns it from here
    check(MPI_Comm_set_errhandler(ring, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    void* attribute = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attribute, &found), "MPI_Comm_get_attr(MPI_TAG_UB)");
    if (found) tag_upper_bound_ = *static_cast<int*>(attribute);
  } catch (...) {
    // The destructor does not run when a constructor throws (the ring's duplicate goes with
    // ring_shared_).
    ring_shared_.reset();
    MPI_Comm_free(&comm_);
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalised) return;
  // Nothing useful to do with an error in a destructor. The rings' duplicate is freed by the
  // last of ring_shared_'s owners: a started reduce-scatter still in flight keeps posting its
  // steps on it until its owner waits.
  MPI_Comm_free(&comm_);
}

void MpiCommunicator::check(int code, const char* call) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw std::runtime_error("colossal::parallel: " + std::string(call) + " failed: " +
                           std::string(text, static_cast<std::size_t>(length)) +
                           " (MPI error " + std::to_string(code) + ", rank " +
                           std::to_string(rank_) + " of " + std::to_string(size_) + ")");
}

int MpiCommunicator::checked_tag(int tag) const {
  if (tag > tag_upper_bound_) {
    throw std::invalid_argument("colossal::parallel: MPI tag " + std::to_string(tag) +
                                " exceeds MPI_TAG_UB = " + std::to_string(tag_upper_bound_) +
                                " (the MPI library rejects it); use a smaller tag");
  }
  return tag;
}

void MpiCommunicator::do_all_reduce_sum(std::span<float> buffer) {
  check(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), mpi_count(buffer.size(), "all_reduce_sum"),
                      MPI_FLOAT, MPI_SUM, comm_),
        "MPI_Allreduce");
}

void MpiCommunicator::do_all_reduce_max(std::span<float> buffer) {
  check(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), mpi_count(buffer.size(), "all_reduce_max"),
                      MPI_FLOAT, MPI_MAX, comm_),
        "MPI_Allreduce");
}

namespace {
// A non-blocking MPI operation behind PendingCollective. MPI makes progress inside MPI calls, so
// callers poke test() while they compute.
class MpiPending final : public PendingCollective {
 public:
  explicit MpiPending(MPI_Request request) : request_(request) {}
  ~MpiPending() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      throw std::runtime_error("MPI_Test failed on a non-blocking operation");
    }
    return done != 0;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL && MPI_Wait(&request_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      throw std::runtime_error("MPI_Wait failed on a non-blocking operation");
    }
  }

 private:
  MPI_Request request_;
};

// A collective that ran to completion before its start_* call returned.
std::unique_ptr<PendingCollective> completed() {
  return std::make_unique<MpiPending>(MPI_REQUEST_NULL);
}
}  // namespace

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_send(std::span<const float> buffer,
                                                                  int dest, int tag) {
  if (in_issue_order_) {
    // NCCL has no started send outside a group: its start_send is the blocking send, which
    // returns once the peer's receive has taken the message (MPI_Ssend's rule), so a send posted
    // before its receive deadlocks there, where MPI's eager protocol would hide it.
    do_send(buffer, dest, tag);
    return completed();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Isend(buffer.data(), mpi_count(buffer.size(), "send"), MPI_FLOAT, dest, tag, comm_,
                  &request),
        "MPI_Isend");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_all_reduce_sum(
    std::span<float> buffer) {
  if (device_buffers_) {  // blocking: see set_device_buffers
    do_all_reduce_sum(buffer);
    return completed();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), mpi_count(buffer.size(), "all_reduce_sum"),
                       MPI_FLOAT, MPI_SUM, comm_, &request),
        "MPI_Iallreduce");
  return std::make_unique<MpiPending>(request);
}

namespace {
// The bf16 sum as an MPI reduction: every partial sum in fp32, rounded to bf16 (nearest even).
void bf16_sum(void* in, void* inout, int* count, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *count; ++i) {
    b[i] = core::bf16_bits(core::bf16_value(a[i]) + core::bf16_value(b[i]));
  }
}

// Created once, after MPI_Init (the first bf16 sum); MPI_Finalize releases it.
MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    if (MPI_Op_create(&bf16_sum, /*commute=*/1, &created) != MPI_SUCCESS) {
      throw std::runtime_error("colossal::parallel: MPI_Op_create of the bf16 sum failed");
    }
    return created;
  }();
  return op;
}
}  // namespace

namespace detail {
// What a communicator's reduce-scatter rings share: their scratch, kept between operations (a
// fresh allocation of a few hundred KB per call is a fresh mmap, whose page faults made ZeRO-2's
// per-unit reductions 3% of a step slower than MPI's own), and the operations in flight, which
// every test() and wait() advances together: a rank waiting on one ring keeps forwarding the
// others' partial sums, so ranks may complete their operations in different orders (as MPI's
// non-blocking collectives allow) without one waiting on a step its neighbour never posts.
// Shared with the operations, so it outlives a communicator destroyed first; it owns the rings'
// duplicate communicator for the same reason (a ring of 3 or more ranks posts its later steps
// when the earlier ones arrive, which must not be on a freed communicator).
class RingShared {
 public:
  explicit RingShared(MPI_Comm comm) : comm_(comm) {}
  RingShared(const RingShared&) = delete;
  RingShared& operator=(const RingShared&) = delete;
  ~RingShared() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (!finalised && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MPI_Comm comm() const { return comm_; }
  class Op {
   public:
    virtual ~Op() = default;
    // Completes the steps whose messages have arrived and posts the next; never blocks.
    virtual void advance_arrived() = 0;
  };
  struct Buffer {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
  };
  // The smallest kept buffer that holds `bytes`, else a new one.
  Buffer take(std::size_t bytes) {
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      const bool fits = free_[i].bytes >= bytes;
      if (fits && (best == free_.size() || free_[i].bytes < free_[best].bytes)) best = i;
    }
    if (best == free_.size()) {
      return Buffer{std::unique_ptr<std::byte[]>(new std::byte[bytes]), bytes};
    }
    Buffer b = std::move(free_[best]);
    free_.erase(free_.begin() + std::ptrdiff_t(best));
    return b;
  }
  void give(Buffer b) {
    if (b.data) free_.push_back(std::move(b));
  }
  void enlist(Op* op) { active_.push_back(op); }
  void delist(Op* op) {
    active_.erase(std::remove(active_.begin(), active_.end(), op), active_.end());
  }
  void advance_all() {
    const std::vector<Op*> now = active_;  // an advance may finish its op, which stays listed
    for (Op* op : now) op->advance_arrived();
  }

 private:
  MPI_Comm comm_;
  std::vector<Buffer> free_;
  std::vector<Op*> active_;
};
}  // namespace detail

namespace {
// A reduce-scatter as a ring of p - 1 point-to-point steps (the bandwidth-optimal algorithm the
// cost model and the wire-byte counts assume): at step s rank r sends the partial sum of block
// (r - s - 1) mod p to rank r + 1 and receives that of block (r - s - 2) mod p from rank r - 1,
// adding its own input to it; after the last step it holds block r summed over every rank.
// Open MPI 4.1's MPI_Reduce_scatter_block, whatever its tuned algorithm, ran 5-10x slower than
// this on 2 ranks of one node for 1-16 MB (2-4x on 4), slower than MPI_Allreduce of the whole
// buffer, and the sequence-split tensor layouts and ZeRO 2-3 reduce-scatter every block.
// Each block's sum runs around the ring in a fixed order: on 2 ranks a + b, as any sum of two.
// The input's other blocks are only read, so an in-place call leaves them as they were. Started
// (non-blocking), each step is posted when the one before it has arrived, which any test() or
// wait() of the communicator's rings sees (MPI progresses messages inside MPI calls, so callers
// poke test() while they compute). Host buffers only (the adds run on the host).
template <class T>
class RingReduceScatter final : public PendingCollective, public detail::RingShared::Op {
 public:
  RingReduceScatter(std::shared_ptr<detail::RingShared> shared, MPI_Datatype type, int rank,
                    int size, int tag, const T* input, T* output, std::size_t count)
      : shared_(std::move(shared)), comm_(shared_->comm()), type_(type), rank_(rank), size_(size), tag_(tag),
        input_(input), output_(output), count_(count) {
    if (size_ == 1) {
      if (output_ != input_) std::memmove(output_, input_, count_ * sizeof(T));
      return;
    }
    // Two ranks send only their input; more also forward a partial sum (cur_).
    tmp_ = shared_->take(count_ * sizeof(T));
    if (size_ > 2) cur_ = shared_->take(count_ * sizeof(T));
    try {
      post(0);
    } catch (...) {
      // A receive may be posted into the scratch: never hand it back (the run ends here anyway).
      static_cast<void>(tmp_.data.release());
      static_cast<void>(cur_.data.release());
      throw;
    }
    shared_->enlist(this);
  }
  ~RingReduceScatter() override {
    bool clean = true;
    try {
      wait();
    } catch (...) {  // a destructor cannot report it; the operation's owner waits first
      clean = false;
    }
    shared_->delist(this);
    if (!clean) {  // requests may still be active on the scratch: keep it out of the pool
      static_cast<void>(tmp_.data.release());
      static_cast<void>(cur_.data.release());
      return;
    }
    shared_->give(std::move(cur_));
    shared_->give(std::move(tmp_));
  }
  bool test() override {
    if (done()) return true;
    shared_->advance_all();
    return done();
  }
  void wait() override {
    while (!done()) shared_->advance_all();
  }
  void advance_arrived() override {
    while (!done()) {
      int arrived = 0;
      check(MPI_Testall(2, requests_, &arrived, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (arrived == 0) return;
      advance();
    }
  }

 private:
  bool done() const { return step_ >= size_ - 1; }
  std::size_t block(int s, int shift) const {  // (rank - s - shift) mod size, times count
    return std::size_t(((rank_ - s - shift) % size_ + size_) % size_) * count_;
  }
  T* cur() const { return reinterpret_cast<T*>(cur_.data.get()); }
  T* tmp() const { return reinterpret_cast<T*>(tmp_.data.get()); }
  void post(int s) {
    const T* send = s == 0 ? input_ + block(0, 1) : cur();
    const int n = mpi_count(count_, "reduce_scatter_sum");
    check(MPI_Irecv(tmp(), n, type_, (rank_ + size_ - 1) % size_, tag_, comm_, &requests_[0]),
          "MPI_Irecv");
    check(MPI_Isend(send_ptr(send), n, type_, (rank_ + 1) % size_, tag_, comm_, &requests_[1]),
          "MPI_Isend");
  }
  // Step step_ has arrived: add this rank's input to it, into the output after the last step.
  void advance() {
    const T* mine = input_ + block(step_, 2);
    T* into = step_ == size_ - 2 ? output_ : tmp();
    const T* received = tmp();
    for (std::size_t i = 0; i < count_; ++i) into[i] = add(mine[i], received[i]);
    std::swap(cur_, tmp_);
    if (++step_ < size_ - 1) post(step_);
  }
  static T add(T a, T b) {
    if constexpr (std::is_same_v<T, std::uint16_t>) {
      return core::bf16_bits(core::bf16_value(a) + core::bf16_value(b));  // bf16_sum's rule
    } else {
      return a + b;
    }
  }
  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
    throw std::runtime_error("colossal::parallel: " + std::string(call) +
                             " failed in a ring reduce-scatter: " +
                             std::string(text, static_cast<std::size_t>(length)) + " (MPI error " +
                             std::to_string(code) + ", rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + ")");
  }

  std::shared_ptr<detail::RingShared> shared_;
  MPI_Comm comm_;
  MPI_Datatype type_;
  int rank_, size_, tag_;
  const T* input_;
  T* output_;
  std::size_t count_;
  int step_ = 0;
  detail::RingShared::Buffer cur_, tmp_;  // the partial sum sent, the one received
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};
}  // namespace

int MpiCommunicator::next_ring_tag() {
  return int(ring_calls_++ % (unsigned(tag_upper_bound_) + 1));
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_all_reduce_sum_bf16(
    std::span<std::uint16_t> buffer) {
  const int count = mpi_count(buffer.size(), "all_reduce_sum_bf16");
  if (device_buffers_) {  // blocking: see set_device_buffers
    check(MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_UINT16_T, bf16_sum_op(), comm_),
          "MPI_Allreduce");
    return completed();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(), count, MPI_UINT16_T, bf16_sum_op(), comm_,
                       &request),
        "MPI_Iallreduce");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t> buffer) {
  const std::size_t c = buffer.size() / std::size_t(size());
  const int count = mpi_count(c, "reduce_scatter_sum_bf16");
  if (device_buffers_) {  // blocking (set_device_buffers); the result moves to block rank()
    check(MPI_Reduce_scatter_block(MPI_IN_PLACE, buffer.data(), count, MPI_UINT16_T,
                                   bf16_sum_op(), comm_),
          "MPI_Reduce_scatter_block");
    move_block(buffer.data() + std::size_t(rank()) * c, buffer.data(),
               c * sizeof(std::uint16_t));
    return completed();
  }
  return std::make_unique<RingReduceScatter<std::uint16_t>>(
      ring_shared_, MPI_UINT16_T, rank(), size(), next_ring_tag(), buffer.data(),
      buffer.data() + std::size_t(rank()) * c, c);
}

void MpiCommunicator::do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) {
  do_start_reduce_scatter_sum(input, output)->wait();  // the same ring, or MPI's collective
}

void MpiCommunicator::do_all_gather(std::span<const float> input, std::span<float> output) {
  const int count = mpi_count(input.size(), "all_gather");
  mpi_count(output.size(), "all_gather");
  const bool in_place = input.data() == output.data() + static_cast<std::size_t>(rank_) * input.size();
  const void* send = in_place ? MPI_IN_PLACE : input.data();
  check(MPI_Allgather(send_ptr(send), count, MPI_FLOAT, output.data(), count, MPI_FLOAT, comm_),
        "MPI_Allgather");
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_all_gather(
    std::span<const float> input, std::span<float> output) {
  const int count = mpi_count(input.size(), "all_gather");
  mpi_count(output.size(), "all_gather");
  const bool in_place = input.data() == output.data() + static_cast<std::size_t>(rank_) * input.size();
  const void* send = in_place ? MPI_IN_PLACE : input.data();
  if (device_buffers_) {  // blocking: see set_device_buffers
    check(MPI_Allgather(send_ptr(send), count, MPI_FLOAT, output.data(), count, MPI_FLOAT, comm_),
          "MPI_Allgather");
    return completed();
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(send_ptr(send), count, MPI_FLOAT, output.data(), count, MPI_FLOAT, comm_,
                       &request),
        "MPI_Iallgather");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_reduce_scatter_sum(
    std::span<const float> input, std::span<float> output) {
  const int count = mpi_count(output.size(), "reduce_scatter_sum");
  if (device_buffers_) {  // blocking: see set_device_buffers
    const std::size_t block = std::size_t(rank()) * output.size();
    if (output.data() == input.data() + block) {  // in place: MPI leaves it at the start
      float* whole = output.data() - block;
      check(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, count, MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
      move_block(output.data(), whole, output.size_bytes());
    } else {
      check(MPI_Reduce_scatter_block(send_ptr(input.data()), output.data(), count, MPI_FLOAT,
                                     MPI_SUM, comm_),
            "MPI_Reduce_scatter_block");
    }
    return completed();
  }
  return std::make_unique<RingReduceScatter<float>>(ring_shared_, MPI_FLOAT, rank(),
                                                    size(), next_ring_tag(), input.data(),
                                                    output.data(), output.size());
}

void MpiCommunicator::do_broadcast(std::span<float> buffer, int root) {
  check(MPI_Bcast(buffer.data(), mpi_count(buffer.size(), "broadcast"), MPI_FLOAT, root, comm_),
        "MPI_Bcast");
}

double MpiCommunicator::do_all_reduce_sum_value(double value) {
  check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm_), "MPI_Allreduce");
  return value;
}

void MpiCommunicator::do_broadcast_bytes(std::span<std::byte> buffer, int root) {
  check(MPI_Bcast(buffer.data(), mpi_count(buffer.size(), "broadcast_bytes"), MPI_BYTE, root, comm_),
        "MPI_Bcast");
}

void MpiCommunicator::do_send(std::span<const float> buffer, int dest, int tag) {
  // NCCL's send waits for the peer's receive whatever the size; MPI_Send may return at once.
  const auto send = in_issue_order_ ? MPI_Ssend : MPI_Send;
  check(send(send_ptr(buffer.data()), mpi_count(buffer.size(), "send"), MPI_FLOAT, dest,
             checked_tag(tag), comm_),
        in_issue_order_ ? "MPI_Ssend" : "MPI_Send");
}

void MpiCommunicator::do_recv(std::span<float> buffer, int source, int tag) {
  MPI_Status status;
  check(MPI_Recv(buffer.data(), mpi_count(buffer.size(), "recv"), MPI_FLOAT, source,
                 checked_tag(tag), comm_, &status),
        "MPI_Recv");
  int received = 0;
  check(MPI_Get_count(&status, MPI_FLOAT, &received), "MPI_Get_count");
  if (static_cast<std::size_t>(received) != buffer.size()) {
    throw std::runtime_error("colossal::parallel: recv expected " + std::to_string(buffer.size()) +
                             " floats from rank " + std::to_string(source) + " (tag " +
                             std::to_string(tag) + ") but the message holds " +
                             std::to_string(received) + "; sender and receiver must agree on sizes");
  }
}

void MpiCommunicator::do_send_recv(std::span<const float> send_buffer, int dest,
                                   std::span<float> recv_buffer, int source, int tag) {
  MPI_Status status;
  check(MPI_Sendrecv(send_ptr(send_buffer.data()), mpi_count(send_buffer.size(), "send_recv"),
                     MPI_FLOAT, dest, checked_tag(tag), recv_buffer.data(),
                     mpi_count(recv_buffer.size(), "send_recv"), MPI_FLOAT, source, tag, comm_,
                     &status),
        "MPI_Sendrecv");
  int received = 0;
  check(MPI_Get_count(&status, MPI_FLOAT, &received), "MPI_Get_count");
  if (static_cast<std::size_t>(received) != recv_buffer.size()) {
    throw std::runtime_error("colossal::parallel: send_recv expected " +
                             std::to_string(recv_buffer.size()) + " floats from rank " +
                             std::to_string(source) + " but the message holds " +
                             std::to_string(received) + "; sender and receiver must agree on sizes");
  }
}

// Every receive and send of the group posted at once on one tag (non-overtaking: the messages
// of a pair match in the order posted), then all completed. Under the test switch the sends are
// synchronous, so, as under NCCL, none completes before its receive is posted.
void MpiCommunicator::do_exchange(std::span<const PeerTransfer> transfers) {
  // Kept between calls (the pipeline exchanges a group every schedule step): no allocation.
  std::vector<int>& counts = exchange_counts_;
  std::vector<MPI_Request>& requests = exchange_requests_;
  std::vector<MPI_Status>& statuses = exchange_statuses_;
  counts.clear();  // every count checked before anything is posted
  for (const PeerTransfer& t : transfers) counts.push_back(mpi_count(t.count, "exchange"));
  requests.assign(transfers.size(), MPI_REQUEST_NULL);
  statuses.resize(transfers.size());
  // A failure to post leaves nothing pending on the caller's buffers: what was posted is
  // cancelled and completed before the error is thrown.
  auto post = [&](int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    for (MPI_Request& r : requests) {
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    }
    MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    check(code, call);
  };
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& t = transfers[i];
    if (!t.is_send()) {
      post(MPI_Irecv(t.data, counts[i], MPI_FLOAT, t.peer, kExchangeTag, comm_, &requests[i]),
           "MPI_Irecv");
    }
  }
  const auto isend = in_issue_order_ ? MPI_Issend : MPI_Isend;
  const char* isend_name = in_issue_order_ ? "MPI_Issend" : "MPI_Isend";
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& t = transfers[i];
    if (!t.is_send()) continue;
    post(isend(send_ptr(t.data), counts[i], MPI_FLOAT, t.peer, kExchangeTag, comm_, &requests[i]),
         isend_name);
  }
  check(MPI_Waitall(int(requests.size()), requests.data(), statuses.data()), "MPI_Waitall");
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    if (transfers[i].is_send()) continue;
    int received = 0;
    check(MPI_Get_count(&statuses[i], MPI_FLOAT, &received), "MPI_Get_count");
    if (static_cast<std::size_t>(received) != transfers[i].count) {
      throw std::runtime_error("colossal::parallel: exchange expected " +
                               std::to_string(transfers[i].count) + " floats from rank " +
                               std::to_string(transfers[i].peer) + " but the message holds " +
                               std::to_string(received) +
                               "; both sides must list the same messages in the same order");
    }
  }
}

void MpiCommunicator::do_barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key) const {
  MPI_Comm part = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");
  auto* child = new MpiCommunicator(Adopt{}, part);
  child->device_buffers_ = device_buffers_;
  child->in_issue_order_ = in_issue_order_;
  return std::unique_ptr<Communicator>(child);
}

std::unique_ptr<MpiCommunicator> make_world_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace colossal::parallel
