// NcclCommunicator on GPUs. Built only with CUDA; every test skips (on all ranks alike) unless
// each process on a node has a CUDA device of its own, so no GPU is ever required.
#include <Kokkos_Core.hpp>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "parallel/nccl_communicator.hpp"

namespace colossal::parallel {
namespace {

// True on every rank iff every rank sees at least as many devices as ranks share its node.
bool gpus_for_every_rank(const MpiCommunicator& world) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world.native(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  int ok = devices >= node_size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world.native());
  return ok == 1;
}

// A device buffer, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(reinterpret_cast<void**>(&data_), n_ * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMalloc failed");
    }
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::span<float> span() { return {data_, n_}; }
  void upload(const std::vector<float>& host) {
    ASSERT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> download() const {
    std::vector<float> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  std::size_t n_;
  float* data_ = nullptr;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world = make_world_communicator();
    if (!gpus_for_every_rank(*world)) GTEST_SKIP() << "no CUDA device for every rank";
    comm = make_nccl_communicator(*world);
  }
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }

  std::unique_ptr<MpiCommunicator> world;
  std::unique_ptr<NcclCommunicator> comm;
};

TEST_F(NcclCommunicatorTest, Identity) {
  EXPECT_EQ(comm->rank(), world->rank());
  EXPECT_EQ(comm->size(), world->size());
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->memory_space(), MemorySpace::device);
}

TEST_F(NcclCommunicatorTest, AllReduceReduceScatterAllGather) {
  const std::size_t c = 1000;
  const std::size_t n = c * static_cast<std::size_t>(size());
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(rank()) + static_cast<float>(i % 100);
  const float sum_of_ranks = static_cast<float>(size() * (size() - 1) / 2);

  DeviceBuffer buffer(n);
  buffer.upload(host);
  comm->all_reduce_sum(buffer.span());
  std::vector<float> reduced = buffer.download();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(reduced[i], sum_of_ranks + static_cast<float>(size()) * static_cast<float>(i % 100));
  }

  buffer.upload(host);
  DeviceBuffer block(c);
  comm->reduce_scatter_sum(buffer.span(), block.span());
  const std::vector<float> mine = block.download();
  for (std::size_t k = 0; k < c; ++k) {
    const std::size_t i = static_cast<std::size_t>(rank()) * c + k;
    ASSERT_EQ(mine[k], sum_of_ranks + static_cast<float>(size()) * static_cast<float>(i % 100));
  }

  DeviceBuffer gathered(n);
  comm->all_gather(block.span(), gathered.span());
  EXPECT_EQ(gathered.download(), reduced);

  const double p = size();
  EXPECT_DOUBLE_EQ(comm->stats().all_reduce.wire_bytes, size() == 1 ? 0.0 : 2.0 * (p - 1) / p * n * 4);
  EXPECT_EQ(comm->stats().reduce_scatter.payload_bytes, n * 4);
  EXPECT_EQ(comm->stats().all_gather.payload_bytes, n * 4);
}

// One buffer in host memory and one on the device: neither NCCL nor a non-CUDA-aware MPI can
// take the call, so it is refused (every rank alike), never handed to MPI with a device pointer.
TEST_F(NcclCommunicatorTest, RefusesAHostBufferBesideADeviceOne) {
  const std::size_t c = 8;
  std::vector<float> host(c * static_cast<std::size_t>(size()), 1.0f);
  DeviceBuffer block(c);
  try {
    comm->reduce_scatter_sum(std::span<const float>(host), block.span());
    ADD_FAILURE() << "a host input beside a device output was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter_sum"), std::string::npos) << e.what();
  }
  DeviceBuffer whole(c * static_cast<std::size_t>(size()));
  std::vector<float> mine(c, 1.0f);
  EXPECT_THROW(comm->all_gather(std::span<const float>(mine), whole.span()),
               std::invalid_argument);
  // Both on the host still goes to MPI, as before.
  std::vector<float> sums(c, float(rank()));
  comm->all_reduce_sum(std::span<float>(sums));
  EXPECT_EQ(sums[0], float(size() * (size() - 1) / 2));
}

// Started collectives (ZeRO-3's prefetch, ZeRO-2/3's gradient reduction, the data-parallel
// buckets): enqueued on NCCL's stream and completed through their event, equal to the blocking
// ones, with blocking collectives issued while they are in flight.
TEST_F(NcclCommunicatorTest, StartedCollectivesMatchTheBlockingOnes) {
  const std::size_t c = 4099;
  const std::size_t n = c * static_cast<std::size_t>(size());
  std::vector<float> host(n), mine(c);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(rank() + 1) * float(i % 13);
  for (std::size_t k = 0; k < c; ++k) mine[k] = float(rank() * 10000) + float(k);
  DeviceBuffer started(n), blocking(n), block(c), gathered(n), gathered_blocking(n);
  started.upload(host);
  blocking.upload(host);
  block.upload(mine);
  DeviceBuffer scattered(n), scattered_block(c);
  scattered.upload(host);
  auto reduce = comm->start_all_reduce_sum(started.span());
  auto gather = comm->start_all_gather(block.span(), gathered.span());
  auto scatter = comm->start_reduce_scatter_sum(
      scattered.span(), scattered.span().subspan(static_cast<std::size_t>(rank()) * c, c));
  comm->all_reduce_sum(blocking.span());
  comm->all_gather(block.span(), gathered_blocking.span());
  comm->reduce_scatter_sum(blocking.span(), scattered_block.span());  // of the reduced buffer
  scatter->wait();
  gather->wait();
  reduce->wait();
  // In place, this rank's block of the sum; the blocking one scattered the already-summed
  // buffer, so it is p times that.
  const std::vector<float> summed = scattered.download(), twice = scattered_block.download();
  for (std::size_t k = 0; k < c; ++k) {
    ASSERT_EQ(summed[static_cast<std::size_t>(rank()) * c + k] * float(size()), twice[k]) << k;
  }
  EXPECT_TRUE(reduce->test());
  EXPECT_EQ(started.download(), blocking.download());
  const std::vector<float> got = gathered.download();
  EXPECT_EQ(got, gathered_blocking.download());
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], float((i / c) * 10000 + i % c)) << i;
  EXPECT_EQ(comm->stats().all_gather.calls, 2u);
  EXPECT_EQ(comm->stats().all_reduce.calls, 2u);
}

#ifdef KOKKOS_ENABLE_CUDA
// A slow kernel on Kokkos' stream (each element a long dependent loop), with no fence after it.
// A free function: nvcc's device lambdas may not live in a test's private TestBody.
void write_slowly(float* out, std::size_t n, float base) {
  Kokkos::parallel_for("write_slowly", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::size_t i) {
    float v = float(i % 3);  // a start the compiler cannot see, converging to 2 all the same
    for (int k = 0; k < 4000; ++k) v = v * 0.5f + 1.0f;
    out[i] = base + v + float(i % 7);
  });
}
#endif

// Collectives wait on the device for the kernels queued before them (an event NCCL's stream
// waits for), not on the host: an all-gather of what a kernel is still writing, with no fence
// in between, gathers what the kernel wrote.
TEST_F(NcclCommunicatorTest, OrdersItselfAfterTheKernels) {
  EXPECT_TRUE(comm->orders_after_kernels());
#ifdef KOKKOS_ENABLE_CUDA
  if constexpr (!std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>) {
    GTEST_SKIP() << "Kokkos runs its kernels on the host in this build";
  }
  // Kokkos is initialised on the first GPU by this test's main; one rank keeps both on it (a
  // decision every rank takes alike, so no rank waits in a collective another skipped).
  if (size() > 1) GTEST_SKIP() << "the kernel's GPU is rank 0's only";
  const std::size_t c = std::size_t(1) << 22;
  const std::size_t n = c * static_cast<std::size_t>(size());
  DeviceBuffer block(c), gathered(n);
  write_slowly(block.span().data(), c, float(rank() * 10));
  comm->all_gather(block.span(), gathered.span());
  const std::vector<float> got = gathered.download();
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], float((i / c) * 10) + 2.0f + float((i % c) % 7)) << i;
  }
#else
  GTEST_SKIP() << "Kokkos without CUDA in this build";
#endif
}

TEST_F(NcclCommunicatorTest, BroadcastAndStrings) {
  std::vector<float> host(64);
  std::iota(host.begin(), host.end(), rank() == 0 ? 0.0f : 1000.0f);
  DeviceBuffer buffer(host.size());
  buffer.upload(host);
  comm->broadcast(buffer.span(), 0);
  std::vector<float> expected(64);
  std::iota(expected.begin(), expected.end(), 0.0f);
  EXPECT_EQ(buffer.download(), expected);

  std::string text = rank() == size() - 1 ? "plan: tp=2" : "";
  comm->broadcast_string(text, size() - 1);
  EXPECT_EQ(text, "plan: tp=2");
}

TEST_F(NcclCommunicatorTest, SendRecvShiftAndSplit) {
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  DeviceBuffer out(16);
  DeviceBuffer in(16);
  out.upload(std::vector<float>(16, static_cast<float>(rank())));
  comm->send_recv(out.span(), next, in.span(), prev, 0);
  EXPECT_EQ(in.download(), std::vector<float>(16, static_cast<float>(prev)));

  const std::unique_ptr<Communicator> alone = comm->split(rank(), 0);
  EXPECT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->backend(), "nccl");
  alone->all_reduce_sum(out.span());
  EXPECT_EQ(out.download(), std::vector<float>(16, static_cast<float>(rank())));
  comm->barrier();
}

// The pipeline's messages: one group per schedule step (exchange). Every rank sends 16 MB to
// the next rank and to the previous one and receives from both in the same group, the pattern of
// 1F1B's steady state, where separate ncclSend/ncclRecv calls would wait on each other. Two
// messages to one peer in one group match in the order listed. On one rank every message is to
// itself (a pipeline rank's interleaved chunks), which NCCL allows within a group.
TEST_F(NcclCommunicatorTest, ExchangeGroupsSendsWithTheReceivesTheyWaitFor) {
  ASSERT_TRUE(comm->matches_in_issue_order());
  const std::size_t n = std::size_t(1) << 22;
  DeviceBuffer to_next(n), to_prev(n), from_prev(n), from_next(n);
  to_next.upload(std::vector<float>(n, static_cast<float>(rank() + 1)));
  to_prev.upload(std::vector<float>(n, static_cast<float>(-(rank() + 1))));
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  const std::vector<PeerTransfer> group = {
      PeerTransfer::send(to_next.span().data(), n, next),
      PeerTransfer::send(to_prev.span().data(), n, prev),
      PeerTransfer::recv(from_prev.span().data(), n, prev),
      PeerTransfer::recv(from_next.span().data(), n, next)};
  comm->reset_stats();
  comm->exchange(group);
  // With one or two ranks next == prev: the first message sent to it is the first received.
  EXPECT_EQ(from_prev.download(), std::vector<float>(n, static_cast<float>(prev + 1)));
  EXPECT_EQ(from_next.download(), std::vector<float>(n, static_cast<float>(-(next + 1))));
  EXPECT_EQ(comm->stats().send.payload_bytes, 2 * n * 4);
  EXPECT_EQ(comm->stats().recv.payload_bytes, 2 * n * 4);
}

// An empty transfer (an empty buffer's null pointer) beside device ones moves nothing: it is
// left out on every rank, not taken for host memory, which refused the group on one side while
// the peer posted it and waited.
TEST_F(NcclCommunicatorTest, ExchangeLeavesOutEmptyTransfers) {
  const std::size_t n = 1000;
  DeviceBuffer to_next(n), from_prev(n);
  to_next.upload(std::vector<float>(n, static_cast<float>(rank() + 1)));
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  const std::vector<PeerTransfer> group = {
      PeerTransfer::send(nullptr, 0, next), PeerTransfer::send(to_next.span().data(), n, next),
      PeerTransfer::recv(nullptr, 0, prev), PeerTransfer::recv(from_prev.span().data(), n, prev)};
  comm->exchange(group);
  EXPECT_EQ(from_prev.download(), std::vector<float>(n, static_cast<float>(prev + 1)));
  // Only empty transfers: nothing to do, no NCCL call.
  comm->exchange(std::vector<PeerTransfer>{PeerTransfer::recv(nullptr, 0, prev)});
}

}  // namespace
}  // namespace colossal::parallel
