#include "parallel/mpi_communicator.hpp"

#include <climits>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/bf16.hpp"

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

void MpiCommunicator::init_from_comm() {
  try {
    // Errors on our duplicate come back as codes, which check() turns into exceptions.
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    void* attribute = nullptr;
    int found = 0;
    check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attribute, &found), "MPI_Comm_get_attr(MPI_TAG_UB)");
    if (found) tag_upper_bound_ = *static_cast<int*>(attribute);
  } catch (...) {
    MPI_Comm_free(&comm_);  // the destructor does not run when a constructor throws
    throw;
  }
}

MpiCommunicator::~MpiCommunicator() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Comm_free(&comm_);  // nothing useful to do with an error in a destructor
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
// MPI_Iallreduce behind PendingCollective. MPI makes progress inside MPI calls, so callers poke
// test() while they compute.
// `then` (optional) runs once, when the operation is seen complete (an in-place reduce-scatter
// moves its block into place).
class MpiPending final : public PendingCollective {
 public:
  explicit MpiPending(MPI_Request request, std::function<void()> then = {})
      : request_(request), then_(std::move(then)) {}
  ~MpiPending() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    finish();
  }
  bool test() override {
    if (request_ != MPI_REQUEST_NULL) {
      int done = 0;
      if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        throw std::runtime_error("MPI_Test failed on a non-blocking operation");
      }
      if (done == 0) return false;
    }
    finish();
    return true;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL && MPI_Wait(&request_, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      throw std::runtime_error("MPI_Wait failed on a non-blocking operation");
    }
    finish();
  }

 private:
  void finish() {
    if (!then_) return;
    auto then = std::move(then_);
    then_ = nullptr;
    then();
  }
  MPI_Request request_;
  std::function<void()> then_;
};
}  // namespace

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_send(std::span<const float> buffer,
                                                                  int dest, int tag) {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Isend(buffer.data(), mpi_count(buffer.size(), "send"), MPI_FLOAT, dest, tag, comm_,
                  &request),
        "MPI_Isend");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_all_reduce_sum(
    std::span<float> buffer) {
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

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_all_reduce_sum_bf16(
    std::span<std::uint16_t> buffer) {
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, buffer.data(),
                       mpi_count(buffer.size(), "all_reduce_sum_bf16"), MPI_UINT16_T,
                       bf16_sum_op(), comm_, &request),
        "MPI_Iallreduce");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t> buffer) {
  const std::size_t c = buffer.size() / std::size_t(size());
  const int count = mpi_count(c, "reduce_scatter_sum_bf16");
  MPI_Request request = MPI_REQUEST_NULL;
  // MPI's in-place form leaves the result at the start of the buffer: it moves to block rank()
  // once the operation completes.
  check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buffer.data(), count, MPI_UINT16_T, bf16_sum_op(),
                                  comm_, &request),
        "MPI_Ireduce_scatter_block");
  if (rank() == 0) return std::make_unique<MpiPending>(request);
  return std::make_unique<MpiPending>(request, [buffer, c, r = std::size_t(rank())] {
    std::memmove(buffer.data() + r * c, buffer.data(), c * sizeof(std::uint16_t));
  });
}

void MpiCommunicator::do_reduce_scatter_sum(std::span<const float> input, std::span<float> output) {
  const int count = mpi_count(output.size(), "reduce_scatter_sum");
  const std::size_t block = std::size_t(rank()) * output.size();
  if (output.data() == input.data() + block) {
    // MPI's in-place form leaves the result at the start of the buffer: move it to block rank().
    float* whole = output.data() - block;
    check(MPI_Reduce_scatter_block(MPI_IN_PLACE, whole, count, MPI_FLOAT, MPI_SUM, comm_),
          "MPI_Reduce_scatter_block");
    if (block != 0) std::memmove(output.data(), whole, output.size_bytes());
    return;
  }
  check(MPI_Reduce_scatter_block(send_ptr(input.data()), output.data(), count, MPI_FLOAT, MPI_SUM,
                                 comm_),
        "MPI_Reduce_scatter_block");
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
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Iallgather(send_ptr(send), count, MPI_FLOAT, output.data(), count, MPI_FLOAT, comm_,
                       &request),
        "MPI_Iallgather");
  return std::make_unique<MpiPending>(request);
}

std::unique_ptr<PendingCollective> MpiCommunicator::do_start_reduce_scatter_sum(
    std::span<const float> input, std::span<float> output) {
  const int count = mpi_count(output.size(), "reduce_scatter_sum");
  const std::size_t block = std::size_t(rank()) * output.size();
  MPI_Request request = MPI_REQUEST_NULL;
  if (output.data() == input.data() + block) {
    // As the blocking form: MPI leaves the result at the start of the buffer; it moves to block
    // rank() once the operation completes.
    float* whole = output.data() - block;
    check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, whole, count, MPI_FLOAT, MPI_SUM, comm_,
                                    &request),
          "MPI_Ireduce_scatter_block");
    if (block == 0) return std::make_unique<MpiPending>(request);
    return std::make_unique<MpiPending>(
        request, [whole, output] { std::memmove(output.data(), whole, output.size_bytes()); });
  }
  check(MPI_Ireduce_scatter_block(send_ptr(input.data()), output.data(), count, MPI_FLOAT, MPI_SUM,
                                  comm_, &request),
        "MPI_Ireduce_scatter_block");
  return std::make_unique<MpiPending>(request);
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
  check(MPI_Send(send_ptr(buffer.data()), mpi_count(buffer.size(), "send"), MPI_FLOAT, dest,
                 checked_tag(tag), comm_),
        "MPI_Send");
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

void MpiCommunicator::do_barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

std::unique_ptr<Communicator> MpiCommunicator::do_split(int color, int key) const {
  MPI_Comm part = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");
  return std::unique_ptr<Communicator>(new MpiCommunicator(Adopt{}, part));
}

std::unique_ptr<MpiCommunicator> make_world_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
}

}  // namespace colossal::parallel
