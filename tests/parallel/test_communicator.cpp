// MpiCommunicator: collectives against closed forms, split groups, point-to-point rings and the
// byte counters against the formulas of parallel/communicator.hpp. Runs at any rank count.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/bf16.hpp"
#include "parallel/mpi_communicator.hpp"

namespace colossal::parallel {
namespace {

constexpr double kFloat = sizeof(float);

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override { comm = make_world_communicator(); }
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  double p() const { return static_cast<double>(comm->size()); }
  // Sum of 0..p-1.
  float sum_of_ranks() const { return static_cast<float>(size() * (size() - 1) / 2); }

  std::unique_ptr<MpiCommunicator> comm;
};

TEST_F(MpiCommunicatorTest, DuplicatesWorld) {
  int world_rank = -1;
  int world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(rank(), world_rank);
  EXPECT_EQ(size(), world_size);
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->memory_space(), MemorySpace::host);
  int compare = MPI_UNEQUAL;
  MPI_Comm_compare(comm->native(), MPI_COMM_WORLD, &compare);
  EXPECT_EQ(compare, MPI_CONGRUENT);  // same group, a different context: a real duplicate
}

TEST_F(MpiCommunicatorTest, AllReduceSumMatchesClosedForm) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 18}) {
    std::vector<float> buffer(n);
    for (std::size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(rank()) + static_cast<float>(i % 1000);
    comm->all_reduce_sum(buffer);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(buffer[i], sum_of_ranks() + static_cast<float>(size()) * static_cast<float>(i % 1000))
          << "n=" << n << " i=" << i;
    }
  }
}

TEST_F(MpiCommunicatorTest, AllReduceCountsBytes) {
  const std::size_t n = 1000;
  std::vector<float> buffer(n, 1.0f);
  comm->all_reduce_sum(buffer);
  comm->all_reduce_sum(buffer);
  const OpStats& s = comm->stats().all_reduce;
  EXPECT_EQ(s.calls, 2u);
  EXPECT_EQ(s.payload_bytes, 2u * n * sizeof(float));
  EXPECT_DOUBLE_EQ(s.wire_bytes, 2.0 * (2.0 * (p() - 1.0) / p() * n * kFloat));
  EXPECT_EQ(comm->stats().total_calls(), 2u);
  EXPECT_EQ(comm->stats().total_payload_bytes(), 2u * n * sizeof(float));
  comm->reset_stats();
  EXPECT_EQ(comm->stats().total_calls(), 0u);
  EXPECT_EQ(comm->stats().all_reduce.payload_bytes, 0u);
  EXPECT_EQ(comm->stats().total_wire_bytes(), 0.0);
}

TEST_F(MpiCommunicatorTest, ReduceScatterSumMatchesClosedForm) {
  const std::size_t c = 37;
  const std::size_t n = c * static_cast<std::size_t>(size());
  std::vector<float> input(n);
  for (std::size_t j = 0; j < n; ++j) input[j] = static_cast<float>(rank() * 1000) + static_cast<float>(j);
  std::vector<float> output(c, -1.0f);
  comm->reduce_scatter_sum(input, output);
  for (std::size_t k = 0; k < c; ++k) {
    const float j = static_cast<float>(static_cast<std::size_t>(rank()) * c + k);
    EXPECT_EQ(output[k], 1000.0f * sum_of_ranks() + static_cast<float>(size()) * j) << "k=" << k;
  }
  const OpStats& s = comm->stats().reduce_scatter;
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.payload_bytes, n * sizeof(float));
  EXPECT_DOUBLE_EQ(s.wire_bytes, (p() - 1.0) * c * kFloat);
}

TEST_F(MpiCommunicatorTest, ReduceScatterRejectsBadSizesOnEveryRank) {
  std::vector<float> input(static_cast<std::size_t>(size()) * 4 + 1);
  std::vector<float> output(4);
  EXPECT_THROW(comm->reduce_scatter_sum(input, output), std::invalid_argument);
  // Overlapping, but not in place (in place is output == block rank() of input).
  std::vector<float> both(static_cast<std::size_t>(size()) * 4 + 1);
  const auto whole = std::span<const float>(both).first(static_cast<std::size_t>(size()) * 4);
  EXPECT_THROW(comm->reduce_scatter_sum(whole, std::span<float>(both).subspan(1, 4)),
               std::invalid_argument);
  EXPECT_EQ(comm->stats().reduce_scatter.calls, 0u);
}

TEST_F(MpiCommunicatorTest, ReduceScatterInPlaceLeavesTheBlockInPlace) {
  const std::size_t c = 6;
  std::vector<float> buffer(c * static_cast<std::size_t>(size()));
  for (std::size_t j = 0; j < buffer.size(); ++j) buffer[j] = float(rank() + 1) * float(j);
  const std::span<float> mine = std::span<float>(buffer).subspan(std::size_t(rank()) * c, c);
  comm->reduce_scatter_sum(buffer, mine);
  const float ranks_sum = float(size()) * float(size() + 1) / 2.0f;
  for (std::size_t k = 0; k < c; ++k) {
    EXPECT_EQ(mine[k], ranks_sum * float(std::size_t(rank()) * c + k)) << "k=" << k;
  }
  EXPECT_EQ(comm->stats().reduce_scatter.calls, 1u);
}

TEST_F(MpiCommunicatorTest, AllGatherMatchesClosedForm) {
  const std::size_t c = 5;
  std::vector<float> input(c);
  for (std::size_t k = 0; k < c; ++k) input[k] = static_cast<float>(rank() * 100) + static_cast<float>(k);
  std::vector<float> output(c * static_cast<std::size_t>(size()), -1.0f);
  comm->all_gather(input, output);
  for (int r = 0; r < size(); ++r) {
    for (std::size_t k = 0; k < c; ++k) {
      EXPECT_EQ(output[static_cast<std::size_t>(r) * c + k], static_cast<float>(r * 100) + static_cast<float>(k));
    }
  }
  const OpStats& s = comm->stats().all_gather;
  EXPECT_EQ(s.calls, 1u);
  EXPECT_EQ(s.payload_bytes, output.size() * sizeof(float));
  EXPECT_DOUBLE_EQ(s.wire_bytes, (p() - 1.0) * c * kFloat);
}

TEST_F(MpiCommunicatorTest, AllGatherInPlace) {
  const std::size_t c = 3;
  std::vector<float> buffer(c * static_cast<std::size_t>(size()), -1.0f);
  std::span<float> mine = std::span<float>(buffer).subspan(static_cast<std::size_t>(rank()) * c, c);
  for (std::size_t k = 0; k < c; ++k) mine[k] = static_cast<float>(rank() * 10) + static_cast<float>(k);
  comm->all_gather(mine, buffer);
  for (std::size_t i = 0; i < buffer.size(); ++i) {
    EXPECT_EQ(buffer[i], static_cast<float>(static_cast<int>(i / c) * 10) + static_cast<float>(i % c));
  }
}

TEST_F(MpiCommunicatorTest, AllGatherRejectsBadSizes) {
  std::vector<float> input(3);
  std::vector<float> output(3 * static_cast<std::size_t>(size()) + 1);
  EXPECT_THROW(comm->all_gather(input, output), std::invalid_argument);
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  const std::size_t n = 17;
  for (int root = 0; root < size(); ++root) {
    std::vector<float> buffer(n, -1.0f);
    if (rank() == root) std::iota(buffer.begin(), buffer.end(), static_cast<float>(root * 100));
    comm->broadcast(buffer, root);
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(buffer[i], static_cast<float>(root * 100 + static_cast<int>(i)));
  }
  const OpStats& s = comm->stats().broadcast;
  EXPECT_EQ(s.calls, static_cast<std::uint64_t>(size()));
  EXPECT_EQ(s.payload_bytes, static_cast<std::uint64_t>(size()) * n * sizeof(float));
  EXPECT_DOUBLE_EQ(s.wire_bytes, size() == 1 ? 0.0 : p() * n * kFloat);
}

TEST_F(MpiCommunicatorTest, BroadcastRejectsBadRoot) {
  std::vector<float> buffer(4);
  EXPECT_THROW(comm->broadcast(buffer, size()), std::invalid_argument);
  EXPECT_THROW(comm->broadcast(buffer, -1), std::invalid_argument);
  EXPECT_EQ(comm->stats().broadcast.calls, 0u);
}

TEST_F(MpiCommunicatorTest, BroadcastStringAndValues) {
  const int root = size() - 1;
  for (const std::string& sent : {std::string(), std::string("model:\n  arch: gpt2\n"), std::string(100000, 'x')}) {
    std::string text = rank() == root ? sent : std::string("stale text on a non-root rank");
    comm->reset_stats();
    comm->broadcast_string(text, root);
    EXPECT_EQ(text, sent);
    // A length header (8 bytes) then the characters: two counted broadcasts.
    EXPECT_EQ(comm->stats().broadcast.calls, 2u);
    EXPECT_EQ(comm->stats().broadcast.payload_bytes, 8u + sent.size());
  }
  struct Seeds {
    std::uint64_t seed;
    int steps;
    double lr;
  } value{0, 0, 0.0};
  if (rank() == 0) value = {1234, 2000, 3.0e-4};
  comm->broadcast_value(value, 0);
  EXPECT_EQ(value.seed, 1234u);
  EXPECT_EQ(value.steps, 2000);
  EXPECT_EQ(value.lr, 3.0e-4);
}

TEST_F(MpiCommunicatorTest, SendRecvRing) {
  if (size() < 2) GTEST_SKIP() << "a blocking ring needs two ranks";
  const std::size_t n = 64;
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  std::vector<float> out(n, static_cast<float>(rank()));
  std::vector<float> in(n, -1.0f);
  // Even ranks send first, odd ranks receive first: no cycle of blocked senders.
  if (rank() % 2 == 0) {
    comm->send(out, next, 7);
    comm->recv(in, prev, 7);
  } else {
    comm->recv(in, prev, 7);
    comm->send(out, next, 7);
  }
  for (float v : in) EXPECT_EQ(v, static_cast<float>(prev));
  EXPECT_EQ(comm->stats().send.calls, 1u);
  EXPECT_EQ(comm->stats().recv.calls, 1u);
  EXPECT_EQ(comm->stats().send.payload_bytes, n * sizeof(float));
  EXPECT_EQ(comm->stats().recv.payload_bytes, n * sizeof(float));
  EXPECT_DOUBLE_EQ(comm->stats().send.wire_bytes, n * kFloat);
}

TEST_F(MpiCommunicatorTest, SendRecvShiftAroundTheRing) {
  // After p shifts every value has visited every rank and come home; the running sum is the
  // sum of ranks. Works at p == 1 (a rank exchanging with itself).
  const int next = (rank() + 1) % size();
  const int prev = (rank() + size() - 1) % size();
  std::vector<float> block(8, static_cast<float>(rank()));
  std::vector<float> incoming(8);
  float seen = 0.0f;
  for (int step = 0; step < size(); ++step) {
    seen += block[0];
    comm->send_recv(block, next, incoming, prev, step);
    std::swap(block, incoming);
  }
  EXPECT_EQ(seen, sum_of_ranks());
  EXPECT_EQ(block[0], static_cast<float>(rank()));
  EXPECT_EQ(comm->stats().send.calls, static_cast<std::uint64_t>(size()));
  EXPECT_EQ(comm->stats().recv.payload_bytes, static_cast<std::uint64_t>(size()) * 8 * sizeof(float));
}

TEST_F(MpiCommunicatorTest, RecvOfWrongSizeIsAnError) {
  if (size() < 2) GTEST_SKIP() << "needs a sender and a receiver";
  if (rank() == 0) {
    std::vector<float> out(3, 1.0f);
    comm->send(out, 1, 3);
  } else if (rank() == 1) {
    std::vector<float> in(4);
    EXPECT_THROW(comm->recv(in, 0, 3), std::runtime_error);
  }
  comm->barrier();
}

TEST_F(MpiCommunicatorTest, PointToPointRejectsBadArguments) {
  std::vector<float> buffer(2);
  EXPECT_THROW(comm->send(buffer, size(), 0), std::invalid_argument);
  EXPECT_THROW(comm->recv(buffer, -1, 0), std::invalid_argument);
  EXPECT_THROW(comm->send(buffer, 0, -5), std::invalid_argument);
  EXPECT_THROW(comm->send_recv(buffer, 0, buffer, 0, 0), std::invalid_argument);  // overlap
}

// A group in which every rank sends to both neighbours (two messages to the next) before it
// receives, matched in issue order on both sides. Under NCCL's rule (synchronous sends) separate
// blocking calls in this order would deadlock; the group may not. A second group follows the
// first on the same pairs, as the pipeline's steps do. On two ranks next == prev: the three
// messages each way then match in the order listed, so both sides list them alike.
TEST_F(MpiCommunicatorTest, ExchangeMatchesInIssueOrderWithoutDeadlock) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  for (bool nccl_rule : {false, true}) {
    SCOPED_TRACE(nccl_rule ? "synchronous sends (NCCL's rule)" : "MPI's buffered sends");
    comm->set_matches_in_issue_order(nccl_rule);
    EXPECT_EQ(comm->matches_in_issue_order(), nccl_rule);
    EXPECT_EQ(comm->split(0, rank())->matches_in_issue_order(), nccl_rule) << "split keeps it";
    const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
    const std::size_t n = 1 << 16;  // past Open MPI's eager limit: a send waits for its receive
    for (int round = 0; round < 2; ++round) {
      const float base = float(100 * round);
      std::vector<float> first(n, base + float(rank())), second(3, base - float(rank()));
      std::vector<float> back(5, base + 0.5f * float(rank()));
      std::vector<float> got_first(n), got_second(3), got_back(5);
      std::vector<PeerTransfer> group = {PeerTransfer::send(first.data(), n, next),
                                         PeerTransfer::send(second.data(), 3, next),
                                         PeerTransfer::send(back.data(), 5, prev)};
      if (size() == 2) {  // the peer's n, 3, 5 in that order
        group.push_back(PeerTransfer::recv(got_first.data(), n, prev));
        group.push_back(PeerTransfer::recv(got_second.data(), 3, prev));
        group.push_back(PeerTransfer::recv(got_back.data(), 5, next));
      } else {  // any order across peers; per peer, the order sent
        group.push_back(PeerTransfer::recv(got_back.data(), 5, next));
        group.push_back(PeerTransfer::recv(got_first.data(), n, prev));
        group.push_back(PeerTransfer::recv(got_second.data(), 3, prev));
      }
      comm->reset_stats();
      comm->exchange(group);
      EXPECT_EQ(got_first, std::vector<float>(n, base + float(prev)));
      EXPECT_EQ(got_second, std::vector<float>(3, base - float(prev)));
      EXPECT_EQ(got_back, std::vector<float>(5, base + 0.5f * float(next)));
      EXPECT_EQ(comm->stats().send.calls, 3u);
      EXPECT_EQ(comm->stats().recv.calls, 3u);
      EXPECT_EQ(comm->stats().recv.payload_bytes, (n + 8) * sizeof(float));
    }
  }
  comm->set_matches_in_issue_order(false);
}

TEST_F(MpiCommunicatorTest, ExchangeWithItselfAndBadPeersAndSizes) {
  std::vector<float> buffer(4, float(rank() + 1)), got(4);
  comm->set_matches_in_issue_order(true);  // a synchronous send to itself, received in the group
  const std::vector<PeerTransfer> to_self = {PeerTransfer::send(buffer.data(), 4, rank()),
                                             PeerTransfer::recv(got.data(), 4, rank())};
  comm->exchange(to_self);
  comm->set_matches_in_issue_order(false);
  EXPECT_EQ(got, buffer);
  const std::vector<PeerTransfer> outside = {PeerTransfer::recv(buffer.data(), 4, size())};
  EXPECT_THROW(comm->exchange(outside), std::invalid_argument);
  comm->exchange({});  // nothing to do
  // A receive over a buffer another transfer of the group reads: refused before anything moves.
  const std::vector<PeerTransfer> overlapping = {PeerTransfer::send(buffer.data() + 2, 2, rank()),
                                                 PeerTransfer::recv(buffer.data(), 3, rank())};
  EXPECT_THROW(comm->exchange(overlapping), std::invalid_argument);
  if (size() < 2) return;
  // Rank 0 sends 3 floats where rank 1 expects 4: an error on the receiver that names both.
  if (rank() == 0) {
    const std::vector<PeerTransfer> send = {PeerTransfer::send(buffer.data(), 3, 1)};
    comm->exchange(send);
  } else if (rank() == 1) {
    const std::vector<PeerTransfer> recv = {PeerTransfer::recv(buffer.data(), 4, 0)};
    try {
      comm->exchange(recv);
      ADD_FAILURE() << "a message of the wrong size was accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("expected 4 floats from rank 0"), std::string::npos)
          << e.what();
    }
  }
  comm->barrier();
}

TEST_F(MpiCommunicatorTest, BarrierCountsCalls) {
  comm->barrier();
  comm->barrier();
  EXPECT_EQ(comm->stats().barrier.calls, 2u);
  EXPECT_EQ(comm->stats().total_payload_bytes(), 0u);
}

TEST_F(MpiCommunicatorTest, SplitByParityReversed) {
  // Key -rank reverses the order inside each group.
  const std::unique_ptr<Communicator> half = comm->split(rank() % 2, -rank());
  const int members = (size() + 1 - rank() % 2) / 2;  // ranks with my parity
  ASSERT_EQ(half->size(), members);
  EXPECT_EQ(half->rank(), members - 1 - rank() / 2);
  EXPECT_EQ(half->backend(), "mpi");

  float value = static_cast<float>(rank());
  half->all_reduce_sum(std::span<float>(&value, 1));
  float expected = 0.0f;
  for (int r = rank() % 2; r < size(); r += 2) expected += static_cast<float>(r);
  EXPECT_EQ(value, expected);
  // The counters belong to the communicator that moved the data.
  EXPECT_EQ(half->stats().all_reduce.calls, 1u);
  EXPECT_EQ(comm->stats().all_reduce.calls, 0u);
}

TEST_F(MpiCommunicatorTest, SplitOfSplitAndSingletons) {
  const std::unique_ptr<Communicator> alone = comm->split(rank(), 0);
  EXPECT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->rank(), 0);
  std::vector<float> buffer{static_cast<float>(rank())};
  alone->all_reduce_sum(buffer);
  EXPECT_EQ(buffer[0], static_cast<float>(rank()));
  EXPECT_EQ(alone->stats().all_reduce.wire_bytes, 0.0);  // nothing moves on one rank

  const std::unique_ptr<Communicator> all = comm->split(0, rank());
  const std::unique_ptr<Communicator> again = all->split(0, rank());
  EXPECT_EQ(again->size(), size());
  EXPECT_EQ(again->rank(), rank());
  EXPECT_THROW(comm->split(-1, 0), std::invalid_argument);
}

TEST(RingWireBytes, Formulas) {
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::all_reduce, 800.0, 4), 2.0 * 3.0 / 4.0 * 800.0);
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::reduce_scatter, 800.0, 8), 7.0 / 8.0 * 800.0);
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::all_gather, 800.0, 2), 400.0);
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::broadcast, 800.0, 2), 800.0);
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::send, 800.0, 1), 800.0);
  EXPECT_DOUBLE_EQ(ring_wire_bytes(CollectiveKind::barrier, 800.0, 8), 0.0);
  for (CollectiveKind kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                              CollectiveKind::all_gather, CollectiveKind::broadcast}) {
    EXPECT_EQ(ring_wire_bytes(kind, 800.0, 1), 0.0) << collective_name(kind);
  }
  EXPECT_THROW(ring_wire_bytes(CollectiveKind::all_reduce, 1.0, 0), std::invalid_argument);
}

}  // namespace
}  // namespace colossal::parallel

TEST(NonBlocking, StartedAllReduceMatchesTheBlockingOneAndIsCounted) {
  auto world = colossal::parallel::make_world_communicator();
  const int p = world->size();
  std::vector<float> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) a[i] = b[i] = float(world->rank() + 1) * float(i % 7);
  world->reset_stats();
  auto pending = world->start_all_reduce_sum(a);
  world->all_reduce_sum(b);  // another collective while the first is in flight
  pending->wait();
  EXPECT_TRUE(pending->test());
  const float ranks_sum = float(p * (p + 1) / 2);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(a[i], ranks_sum * float(i % 7)) << i;
    ASSERT_EQ(a[i], b[i]);
  }
  EXPECT_EQ(world->stats().all_reduce.calls, 2u);
  EXPECT_EQ(world->stats().all_reduce.payload_bytes, 2u * 1000 * 4);
}

// ZeRO-3's prefetch: an all-gather started (in place and into a separate buffer), a blocking
// one of other buffers while it is in flight, then completed; both equal the blocking result and
// are counted; bad sizes are refused before anything starts.
TEST(NonBlocking, StartedAllGatherMatchesTheBlockingOneAndIsCounted) {
  auto world = colossal::parallel::make_world_communicator();
  const std::size_t p = std::size_t(world->size()), r = std::size_t(world->rank()), c = 257;
  std::vector<float> mine(c), apart(c * p, -1.0f), in_place(c * p, -1.0f), blocking(c * p);
  for (std::size_t k = 0; k < c; ++k) mine[k] = float(r * 1000 + k);
  std::copy(mine.begin(), mine.end(), in_place.begin() + std::ptrdiff_t(r * c));
  world->reset_stats();
  auto first = world->start_all_gather(mine, apart);
  auto second = world->start_all_gather(std::span<const float>(in_place).subspan(r * c, c),
                                        in_place);
  world->all_gather(mine, blocking);
  second->wait();
  first->wait();
  EXPECT_TRUE(first->test());
  for (std::size_t i = 0; i < c * p; ++i) {
    ASSERT_EQ(blocking[i], float((i / c) * 1000 + i % c)) << i;
    ASSERT_EQ(apart[i], blocking[i]) << i;
    ASSERT_EQ(in_place[i], blocking[i]) << i;
  }
  EXPECT_EQ(world->stats().all_gather.calls, 3u);
  EXPECT_EQ(world->stats().all_gather.payload_bytes, 3u * c * p * 4);
  std::vector<float> wrong(c * p + 1);
  EXPECT_THROW(world->start_all_gather(mine, wrong), std::invalid_argument);
}

// ZeRO-2/3's overlapped gradient reduction: a reduce-scatter started in place (the result moves
// to block rank() when it completes) and one into a separate buffer, with a blocking one of
// other buffers in flight meanwhile; both equal the blocking result and are counted.
TEST(NonBlocking, StartedReduceScatterMatchesTheBlockingOneInPlaceAndApart) {
  auto world = colossal::parallel::make_world_communicator();
  const std::size_t p = std::size_t(world->size()), r = std::size_t(world->rank()), c = 131;
  std::vector<float> input(c * p);
  for (std::size_t i = 0; i < c * p; ++i) input[i] = float(r + 1) * float(i % 17);
  std::vector<float> in_place = input, apart(c, -1.0f), blocking(c);
  world->reset_stats();
  auto first = world->start_reduce_scatter_sum(in_place, std::span<float>(in_place).subspan(r * c, c));
  auto second = world->start_reduce_scatter_sum(input, apart);
  world->reduce_scatter_sum(input, blocking);
  second->wait();
  while (!first->test()) {
  }
  const float ranks = float(p * (p + 1) / 2);
  for (std::size_t k = 0; k < c; ++k) {
    ASSERT_EQ(blocking[k], ranks * float((r * c + k) % 17)) << k;
    ASSERT_EQ(apart[k], blocking[k]) << k;
    ASSERT_EQ(in_place[r * c + k], blocking[k]) << k;
  }
  EXPECT_EQ(world->stats().reduce_scatter.calls, 3u);
  EXPECT_EQ(world->stats().reduce_scatter.payload_bytes, 3u * c * p * 4);
  std::vector<float> wrong(c + 1);
  EXPECT_THROW(world->start_reduce_scatter_sum(input, wrong), std::invalid_argument);
}

// The reduce-scatters run as a ring of point-to-point steps on a communicator of their own,
// each operation under its own tag: several in flight complete in any order, a different one on
// each rank, beside the caller's own messages on the same communicator and tag, and an in-place
// call leaves the other blocks of its buffer as they were. Integer values: every sum exact.
TEST(NonBlocking, ReduceScattersInFlightCompleteInAnyOrderBesideCallersMessages) {
  auto world = colossal::parallel::make_world_communicator();
  const std::size_t p = std::size_t(world->size()), r = std::size_t(world->rank());
  const std::size_t sizes[] = {1, 7, 64, 300, 4096, 33};
  std::vector<std::vector<float>> buffers;
  for (std::size_t j = 0; j < std::size(sizes); ++j) {
    std::vector<float> b(sizes[j] * p);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = float((r + 1) * (i % 13 + j));
    buffers.push_back(std::move(b));
  }
  const std::vector<std::vector<float>> before = buffers;
  std::vector<std::unique_ptr<colossal::parallel::PendingCollective>> started;
  for (std::size_t j = 0; j < buffers.size(); ++j) {
    const std::size_t c = sizes[j];
    started.push_back(world->start_reduce_scatter_sum(
        buffers[j], std::span<float>(buffers[j]).subspan(r * c, c)));
  }
  if (p >= 2) {  // the caller's messages, tag 0, around the ring while the rings are in flight
    std::vector<float> out(5, float(r)), in(5, -1.0f);
    world->send_recv(out, int((r + 1) % p), in, int((r + p - 1) % p), 0);
    EXPECT_EQ(in[0], float((r + p - 1) % p));
  }
  // Each rank completes them in its own order (rotated by rank, with polls of the others in
  // between): the rings advance together, so no rank waits on a step its neighbour has not
  // posted.
  for (std::size_t k = 0; k < started.size(); ++k) {
    started[(k + r) % started.size()]->test();
  }
  for (std::size_t k = 0; k < started.size(); ++k) {
    started[(started.size() - 1 - k + 2 * r) % started.size()]->wait();
  }
  const float ranks = float(p * (p + 1) / 2);
  for (std::size_t j = 0; j < buffers.size(); ++j) {
    const std::size_t c = sizes[j];
    for (std::size_t i = 0; i < c * p; ++i) {
      const bool mine = i / c == r;
      ASSERT_EQ(buffers[j][i], mine ? ranks * float(i % 13 + j) : before[j][i])
          << "buffer " << j << " element " << i << (mine ? " (this rank's block)" : "");
    }
  }
}

// A started reduce-scatter may outlive the communicator it came from: on 3 or more ranks its
// later steps are posted after the communicator is gone (on the rings' duplicate, which the
// operation keeps alive), and its sums are still right.
TEST(NonBlocking, StartedReduceScatterOutlivesItsCommunicator) {
  auto world = colossal::parallel::make_world_communicator();
  const std::size_t p = std::size_t(world->size()), r = std::size_t(world->rank()), c = 1000;
  std::vector<float> input(c * p), output(c, -1.0f);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = float((r + 1) * (i % 11));
  auto pending = world->start_reduce_scatter_sum(input, output);
  world.reset();
  pending->wait();
  pending.reset();
  const float ranks = float(p * (p + 1) / 2);
  for (std::size_t k = 0; k < c; ++k) ASSERT_EQ(output[k], ranks * float((r * c + k) % 11)) << k;
}

// With device buffers (a CUDA-aware MPI) the reduce-scatters go through MPI's own collective,
// which can read them, and an in-place result moves to block rank() (cudaMemcpy for device
// memory, memmove here): the same sums as the ring, blocking and started, in place and apart,
// fp32 and bf16; split() passes the mode on.
TEST(NonBlocking, DeviceBufferModeReduceScattersThroughMpi) {
  auto ring = colossal::parallel::make_world_communicator();
  auto mpi = colossal::parallel::make_world_communicator();
  mpi->set_device_buffers(true);
  EXPECT_EQ(mpi->memory_space(), colossal::parallel::MemorySpace::device);
  EXPECT_EQ(mpi->split(0, mpi->rank())->memory_space(), colossal::parallel::MemorySpace::device);
  const std::size_t p = std::size_t(ring->size()), r = std::size_t(ring->rank()), c = 77;
  std::vector<float> input(c * p);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = float((r + 2) * (i % 11));
  std::vector<float> want(c), apart(c), started_apart(c);
  ring->reduce_scatter_sum(input, want);
  mpi->reduce_scatter_sum(input, apart);
  std::vector<float> in_place = input, started_in_place = input;
  mpi->reduce_scatter_sum(in_place, std::span<float>(in_place).subspan(r * c, c));
  mpi->start_reduce_scatter_sum(input, started_apart)->wait();
  mpi->start_reduce_scatter_sum(started_in_place,
                                std::span<float>(started_in_place).subspan(r * c, c))
      ->wait();
  for (std::size_t k = 0; k < c; ++k) {
    ASSERT_EQ(apart[k], want[k]) << k;
    ASSERT_EQ(in_place[r * c + k], want[k]) << k;
    ASSERT_EQ(started_apart[k], want[k]) << k;
    ASSERT_EQ(started_in_place[r * c + k], want[k]) << k;
  }
  if (p == 2) {  // bf16: each element exactly bf16(a + b) on two ranks, either way
    std::vector<std::uint16_t> a(c * p), b;
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = colossal::core::bf16_bits(float((r + 1) * (i % 7)) * 0.37f);
    }
    b = a;
    ring->start_reduce_scatter_sum_bf16(a)->wait();
    mpi->start_reduce_scatter_sum_bf16(b)->wait();
    for (std::size_t k = 0; k < c; ++k) ASSERT_EQ(a[r * c + k], b[r * c + k]) << k;
  }
}

// A CUDA-aware Open MPI takes device buffers in blocking collectives only, so in device-buffer
// mode every started collective has run to completion when start_* returns: its result is in
// the buffer before any test() or wait() (a non-blocking MPI collective would not have
// progressed yet), and test() says so at once.
TEST(NonBlocking, DeviceBufferModeStartsCompletedCollectives) {
  auto mpi = colossal::parallel::make_world_communicator();
  mpi->set_device_buffers(true);
  const std::size_t p = std::size_t(mpi->size()), r = std::size_t(mpi->rank()), c = 4099;
  const float ranks = float(p * (p + 1) / 2);
  std::vector<float> summed(c);
  for (std::size_t i = 0; i < c; ++i) summed[i] = float((r + 1) * (i % 5));
  auto all = mpi->start_all_reduce_sum(summed);
  for (std::size_t i = 0; i < c; ++i) ASSERT_EQ(summed[i], ranks * float(i % 5)) << i;
  EXPECT_TRUE(all->test());
  std::vector<float> mine(c, float(r + 1)), gathered(c * p, -1.0f);
  auto gather = mpi->start_all_gather(mine, gathered);
  for (std::size_t i = 0; i < c * p; ++i) ASSERT_EQ(gathered[i], float(i / c + 1)) << i;
  EXPECT_TRUE(gather->test());
  std::vector<float> input(c * p), output(c);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = float((r + 1) * (i % 3));
  auto scatter = mpi->start_reduce_scatter_sum(input, output);
  for (std::size_t k = 0; k < c; ++k) ASSERT_EQ(output[k], ranks * float((r * c + k) % 3)) << k;
  EXPECT_TRUE(scatter->test());
  std::vector<std::uint16_t> halves(c, colossal::core::bf16_bits(float(r + 1)));
  auto bf16 = mpi->start_all_reduce_sum_bf16(halves);
  for (std::size_t i = 0; i < c; ++i) ASSERT_EQ(colossal::core::bf16_value(halves[i]), ranks) << i;
  EXPECT_TRUE(bf16->test());
}

// Rank r's bf16 value at i: magnitudes spread over 2^-3..2^3 with 8 significant bits, so sums
// of two need rounding back to bf16 about half the time.
std::uint16_t bf16_input(std::size_t i, std::size_t r) {
  const float mantissa = 1.0f + float((i * 37 + r * 101) % 128) / 128.0f;
  const float sign = (i + r) % 3 == 0 ? -1.0f : 1.0f;
  return colossal::core::bf16_bits(sign * std::ldexp(mantissa, int((i + 2 * r) % 7) - 3));
}

// parallel.grad_reduce: bf16. On two ranks both sums are exactly bf16(a + b); on more, each
// partial sum is rounded once (MPI picks the order), so the result is within p - 1 roundings
// (2^-8 relative of the sum of magnitudes) of the exact sum. The reduce-scatter leaves block
// rank() of the sum in place; both count 2 bytes an element.
TEST(NonBlocking, Bf16SumsRoundEachPartialSumAndCountTwoBytes) {
  auto world = colossal::parallel::make_world_communicator();
  const std::size_t p = std::size_t(world->size()), r = std::size_t(world->rank()), c = 257;
  const std::size_t n = c * p;
  std::vector<std::uint16_t> summed(n), scattered(n);
  for (std::size_t i = 0; i < n; ++i) summed[i] = scattered[i] = bf16_input(i, r);
  world->reset_stats();
  auto all = world->start_all_reduce_sum_bf16(summed);
  auto scatter = world->start_reduce_scatter_sum_bf16(scattered);
  all->wait();
  while (!scatter->test()) {
  }
  std::size_t rounded = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double exact = 0.0, magnitude = 0.0;
    for (std::size_t q = 0; q < p; ++q) {
      exact += colossal::core::bf16_value(bf16_input(i, q));
      magnitude += std::abs(colossal::core::bf16_value(bf16_input(i, q)));
    }
    const float got = colossal::core::bf16_value(summed[i]);
    if (p == 2) {
      const float a = colossal::core::bf16_value(bf16_input(i, 0)), b = colossal::core::bf16_value(bf16_input(i, 1));
      ASSERT_EQ(summed[i], colossal::core::bf16_bits(a + b)) << i;
    } else {
      ASSERT_LE(std::abs(got - exact), double(p - 1) * std::ldexp(magnitude, -8)) << i;
    }
    if (double(got) != exact) ++rounded;
    if (i / c == r) {  // this rank's block of the reduce-scatter
      const float block = colossal::core::bf16_value(scattered[i]);
      if (p <= 2) {
        ASSERT_EQ(scattered[i], summed[i]) << i;
      } else {
        ASSERT_LE(std::abs(block - exact), double(p - 1) * std::ldexp(magnitude, -8)) << i;
      }
    }
  }
  if (p > 1) {
    EXPECT_GT(rounded, n / 8) << "the inputs must exercise the rounding";
  }
  EXPECT_EQ(world->stats().all_reduce.payload_bytes, n * 2);
  EXPECT_EQ(world->stats().reduce_scatter.payload_bytes, n * 2);
  EXPECT_NEAR(world->stats().all_reduce.wire_bytes, 2.0 * double(p - 1) / double(p) * double(n * 2),
              1e-6);
  if (p > 1) {
    std::vector<std::uint16_t> ragged(n + 1);
    EXPECT_THROW(world->start_reduce_scatter_sum_bf16(ragged), std::invalid_argument);
  }
}

// The watchdog's view: while rank 0 waits in a collective its peers join late, the process's
// current wait names it (kind, bytes, ranks, backend); a started one's wait too; none after.
TEST(CollectiveWait, NamesTheCallThisRankIsBlockedIn) {
  auto world = colossal::parallel::make_world_communicator();
  using colossal::parallel::CollectiveKind;
  EXPECT_FALSE(colossal::parallel::current_collective_wait().has_value());
  if (world->size() < 2) GTEST_SKIP() << "needs a peer that joins late";
  std::vector<float> buffer(1000, 1.0f);
  for (const bool started : {false, true}) {
    std::atomic<bool> done{false};
    std::optional<colossal::parallel::CollectiveWait> seen;
    std::thread watcher;
    if (world->rank() == 0) {
      watcher = std::thread([&] {
        while (!done) {
          if (auto w = colossal::parallel::current_collective_wait()) seen = w;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      });
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    if (started) {
      world->start_all_reduce_sum(buffer)->wait();
    } else {
      world->all_reduce_sum(buffer);
    }
    if (world->rank() == 0) {
      done = true;
      watcher.join();
      ASSERT_TRUE(seen.has_value()) << started;
      EXPECT_EQ(seen->kind, CollectiveKind::all_reduce);
      EXPECT_EQ(seen->payload_bytes, 4000u);
      EXPECT_EQ(seen->ranks, world->size());
      EXPECT_STREQ(seen->backend, "mpi");
      const std::string text = colossal::parallel::describe(*seen);
      EXPECT_NE(text.find("in all_reduce of 0.004 MB over "), std::string::npos) << text;
    }
    EXPECT_FALSE(colossal::parallel::current_collective_wait().has_value());
  }
}

TEST(ScalarAllReduce, SumsDoublesExactlyAndCountsEightBytes) {
  auto world = colossal::parallel::make_world_communicator();
  const int p = world->size();
  world->reset_stats();
  // 1e-9 steps would vanish in a float sum next to 1e6; in double they survive.
  const double sum = world->all_reduce_sum_value(1e6 + 1e-9 * (world->rank() + 1));
  EXPECT_DOUBLE_EQ(sum, 1e6 * p + 1e-9 * p * (p + 1) / 2);
  EXPECT_EQ(world->stats().all_reduce.calls, 1u);
  EXPECT_EQ(world->stats().all_reduce.payload_bytes, 8u);
}
