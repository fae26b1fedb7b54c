// StagedCommunicator with host memory standing in for the device: every collective and
// point-to-point call the trainer uses gives bitwise what plain MPI gives on the same values, the
// copies and their bytes are as expected (device buffers staged once each way, host buffers not
// at all), and the staging buffers are reused, not allocated per call. Runs at any rank count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "parallel/mpi_communicator.hpp"
#include "parallel/staged_communicator.hpp"

namespace colossal::parallel {
namespace {

// "Device memory": the buffers registered here; everything else is host memory.
struct FakeDevice {
  std::vector<std::pair<const char*, const char*>> ranges;
  std::uint64_t to_host_calls = 0, to_device_calls = 0;
  template <class T>
  void add(const std::vector<T>& v) {
    const char* b = reinterpret_cast<const char*>(v.data());
    ranges.emplace_back(b, b + v.size() * sizeof(T));
  }
  bool contains(const void* p) const {
    const char* c = static_cast<const char*>(p);
    for (auto [b, e] : ranges) {
      if (c >= b && c < e) return true;
    }
    return false;
  }
};

StagingOps counting_ops(const std::shared_ptr<FakeDevice>& dev) {
  StagingOps ops = host_staging_ops();
  ops.name = "test device";
  ops.is_device = [dev](const void* p) { return dev->contains(p); };
  auto to_host = ops.to_host, to_device = ops.to_device;
  ops.to_host = [dev, to_host](void* h, const void* d, std::size_t bytes) {
    EXPECT_TRUE(dev->contains(d));
    EXPECT_FALSE(dev->contains(h));
    ++dev->to_host_calls;
    to_host(h, d, bytes);
  };
  ops.to_device = [dev, to_device](void* d, const void* h, std::size_t bytes) {
    EXPECT_TRUE(dev->contains(d));
    EXPECT_FALSE(dev->contains(h));
    ++dev->to_device_calls;
    to_device(d, h, bytes);
  };
  return ops;
}

// Values whose sums depend on the order of addition, so "bitwise" means something.
std::vector<float> values(std::size_t n, int rank, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = float(std::sin(1.37 * rank + 0.011 * double(i) + salt) * 1e3 + 1.0 / (1.0 + i));
  }
  return v;
}

void expect_bitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

class Staged : public ::testing::Test {
 protected:
  void SetUp() override {
    plain = make_world_communicator();
    dev = std::make_shared<FakeDevice>();
    staged = std::make_unique<StagedCommunicator>(make_world_communicator(), counting_ops(dev));
  }
  int rank() const { return plain->rank(); }
  int size() const { return plain->size(); }
  std::vector<float>& device(std::vector<float> v) {
    held.push_back(std::make_unique<std::vector<float>>(std::move(v)));
    dev->add(*held.back());
    return *held.back();
  }
  std::unique_ptr<MpiCommunicator> plain;
  std::shared_ptr<FakeDevice> dev;
  std::unique_ptr<StagedCommunicator> staged;
  std::vector<std::unique_ptr<std::vector<float>>> held;
};

TEST_F(Staged, AllReduceSumAndMaxMatchMpiAndStageOnceEachWay) {
  const std::size_t n = 10007;
  std::vector<float> want = values(n, rank(), 1);
  std::vector<float>& got = device(want);
  plain->all_reduce_sum(want);
  staged->all_reduce_sum(got);
  expect_bitwise(got, want, "all_reduce_sum");
  // One rank: an in-place sum is the buffer itself and nothing is staged (Communicator).
  const StagingStats& s = staged->staging_stats();
  const std::size_t once = size() > 1 ? 1u : 0u;
  EXPECT_EQ(s.copies_to_host, once);
  EXPECT_EQ(s.copies_to_device, once);
  EXPECT_EQ(s.bytes_to_host, once * n * 4);
  EXPECT_EQ(s.bytes_to_device, once * n * 4);
  EXPECT_EQ(dev->to_host_calls, once);
  std::vector<float> want_max = values(n, rank(), 2);
  std::vector<float>& got_max = device(want_max);
  plain->all_reduce_max(want_max);
  staged->all_reduce_max(got_max);
  expect_bitwise(got_max, want_max, "all_reduce_max");
  // The communicator's own counters are those of the call, as for every backend.
  EXPECT_EQ(staged->stats().all_reduce.calls, 2u);
  EXPECT_EQ(staged->stats().all_reduce.payload_bytes, 2 * n * 4);
  EXPECT_EQ(staged->backend(), "staged-mpi");
  EXPECT_EQ(staged->memory_space(), MemorySpace::device);
}

TEST_F(Staged, HostBuffersAreNotStaged) {
  std::vector<float> want = values(999, rank(), 3), got = want;
  plain->all_reduce_sum(want);
  staged->all_reduce_sum(got);  // not registered: host memory
  expect_bitwise(got, want, "host all_reduce_sum");
  std::vector<float> shard(5), full = values(5 * std::size_t(size()), rank(), 4);
  staged->reduce_scatter_sum(full, shard);
  EXPECT_EQ(staged->staging_stats().copies_to_host, 0u);
  EXPECT_EQ(staged->staging_stats().copies_to_device, 0u);
  EXPECT_EQ(staged->staging_stats().allocations, 0u);
}

TEST_F(Staged, ReduceScatterMatchesMpiInPlaceAndNot) {
  const std::size_t c = 1031, p = std::size_t(size());
  // Not in place: device input, device output.
  std::vector<float> in = values(p * c, rank(), 5), want(c);
  plain->reduce_scatter_sum(in, want);
  std::vector<float>& din = device(in);
  std::vector<float>& dout = device(std::vector<float>(c));
  staged->reduce_scatter_sum(din, dout);
  expect_bitwise(dout, want, "reduce_scatter_sum");
  EXPECT_EQ(staged->staging_stats().bytes_to_host, p * c * 4);
  EXPECT_EQ(staged->staging_stats().bytes_to_device, c * 4);
  // In place: the output is block rank() of the input (ZeRO's gradient buffer).
  std::vector<float> whole = values(p * c, rank(), 6);
  std::vector<float>& dwhole = device(whole);
  const std::size_t at = std::size_t(rank()) * c;
  plain->reduce_scatter_sum(whole, std::span<float>(whole).subspan(at, c));
  staged->reduce_scatter_sum(dwhole, std::span<float>(dwhole).subspan(at, c));
  const std::vector<float> a(whole.begin() + at, whole.begin() + at + c);
  const std::vector<float> b(dwhole.begin() + at, dwhole.begin() + at + c);
  expect_bitwise(b, a, "in-place reduce_scatter_sum");
  // Mixed: device input, host output (and the reverse) stage only the device side.
  std::vector<float> host_out(c);
  const auto before = staged->staging_stats();
  staged->reduce_scatter_sum(device(in), host_out);
  expect_bitwise(host_out, want, "device -> host reduce_scatter_sum");
  EXPECT_EQ(staged->staging_stats().bytes_to_host - before.bytes_to_host, p * c * 4);
  EXPECT_EQ(staged->staging_stats().copies_to_device, before.copies_to_device);
}

TEST_F(Staged, AllGatherMatchesMpiInPlaceAndNot) {
  const std::size_t c = 517, p = std::size_t(size());
  const std::vector<float> mine = values(c, rank(), 7);
  std::vector<float> want(p * c);
  plain->all_gather(mine, want);
  std::vector<float>& dmine = device(mine);
  std::vector<float>& dout = device(std::vector<float>(p * c));
  staged->all_gather(dmine, dout);
  expect_bitwise(dout, want, "all_gather");
  // In place: this rank's block already sits in the output (ZeRO-3's parameter gather).
  std::vector<float> whole(p * c, -1.0f);
  std::copy(mine.begin(), mine.end(), whole.begin() + std::ptrdiff_t(rank() * c));
  std::vector<float>& dwhole = device(whole);
  staged->all_gather(std::span<const float>(dwhole).subspan(std::size_t(rank()) * c, c), dwhole);
  expect_bitwise(dwhole, want, "in-place all_gather");
  // A host input gathered into a device output.
  std::vector<float>& dout2 = device(std::vector<float>(p * c));
  staged->all_gather(mine, dout2);
  expect_bitwise(dout2, want, "host -> device all_gather");
}

TEST_F(Staged, BroadcastCopiesOutOnTheRootAndInElsewhere) {
  const int root = size() - 1;
  std::vector<float> want = values(777, rank(), 8);
  std::vector<float>& got = device(want);
  plain->broadcast(want, root);
  staged->broadcast(got, root);
  expect_bitwise(got, want, "broadcast");
  const StagingStats& s = staged->staging_stats();
  const bool several = size() > 1;  // one rank: the buffer is already the root's
  EXPECT_EQ(s.copies_to_host, several && rank() == root ? 1u : 0u);
  EXPECT_EQ(s.copies_to_device, several && rank() != root ? 1u : 0u);
  // Control-plane broadcasts stay in host memory.
  std::string text = rank() == 0 ? "plan text" : "";
  staged->broadcast_string(text, 0);
  EXPECT_EQ(text, "plan text");
  EXPECT_DOUBLE_EQ(staged->all_reduce_sum_value(1.5), 1.5 * size());
}

// The stage link's pattern: a non-blocking send whose buffer is overwritten at once, a blocking
// receive from the previous rank, and the ring shift of ring attention.
TEST_F(Staged, PointToPointAsTheStageLinkUsesIt) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  std::vector<float>& out = device(values(333, rank(), 9));
  std::vector<float>& in = device(std::vector<float>(333));
  auto pending = staged->start_send(out, next, 4);
  std::fill(out.begin(), out.end(), 0.0f);  // the staged copy was taken: the slot is free
  staged->recv(in, prev, 4);
  pending->wait();
  expect_bitwise(in, values(333, prev, 9), "start_send / recv");
  // Blocking send and receive, ordered to not deadlock.
  std::vector<float>& a = device(values(64, rank(), 10));
  std::vector<float>& b = device(std::vector<float>(64));
  if (rank() % 2 == 0) {
    staged->send(a, next, 1);
    staged->recv(b, prev, 1);
  } else {
    staged->recv(b, prev, 1);
    staged->send(a, next, 1);
  }
  expect_bitwise(b, values(64, prev, 10), "send / recv");
  std::vector<float>& c = device(std::vector<float>(64));
  staged->send_recv(a, next, c, prev, 2);
  expect_bitwise(c, values(64, prev, 10), "send_recv");
}

// A group with a device send, a host send and a device receive: the device buffers are staged
// once each way (the send down, the receive up), the host one goes as it is.
TEST_F(Staged, ExchangeStagesOnlyItsDeviceBuffers) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank() + 1) % size(), prev = (rank() + size() - 1) % size();
  const std::vector<float>& out = device(values(300, rank(), 5));
  const std::vector<float> host_out = values(7, rank(), 6);
  std::vector<float>& in = device(std::vector<float>(300));
  std::vector<float> host_in(7);
  const std::vector<PeerTransfer> group = {PeerTransfer::send(out.data(), 300, next),
                                           PeerTransfer::send(host_out.data(), 7, next),
                                           PeerTransfer::recv(in.data(), 300, prev),
                                           PeerTransfer::recv(host_in.data(), 7, prev)};
  staged->exchange(group);
  expect_bitwise(in, values(300, prev, 5), "device receive");
  expect_bitwise(host_in, values(7, prev, 6), "host receive");
  EXPECT_EQ(dev->to_host_calls, 1u);
  EXPECT_EQ(dev->to_device_calls, 1u);
  EXPECT_EQ(staged->stats().send.payload_bytes, 307u * sizeof(float));
  EXPECT_EQ(staged->stats().recv.payload_bytes, 307u * sizeof(float));
}

TEST_F(Staged, StartedAllReduceLandsOnWait) {
  std::vector<float> want = values(4099, rank(), 11);
  std::vector<float>& got = device(want);
  // MPI's started sum (MPI_Iallreduce) may add in another order than the blocking one (it does on
  // 3 ranks): compare like with like.
  plain->start_all_reduce_sum(want)->wait();
  auto pending = staged->start_all_reduce_sum(got);
  pending->wait();
  expect_bitwise(got, want, "start_all_reduce_sum");
  EXPECT_EQ(staged->staging_stats().copies_to_device, size() > 1 ? 1u : 0u);
}

// parallel.grad_reduce: bf16 through staging: the same bits as the host MPI sums; the all-reduce
// copies the buffer each way, the reduce-scatter brings back only this rank's block.
TEST_F(Staged, Bf16SumsMatchMpiAndBringBackTheirBlock) {
  const std::size_t c = 1001, n = c * std::size_t(size()), r = std::size_t(rank());
  std::vector<std::uint16_t> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits = 0;
    const float v = values(n, rank(), 13)[i];
    std::memcpy(&bits, &v, sizeof bits);
    want[i] = std::uint16_t(bits >> 16);  // a bf16 pattern (truncated: any pattern will do)
  }
  std::vector<std::uint16_t> want_block = want;
  auto on_device = std::make_unique<std::vector<std::uint16_t>>(want);
  auto block_on_device = std::make_unique<std::vector<std::uint16_t>>(want);
  dev->add(*on_device);
  dev->add(*block_on_device);
  plain->start_all_reduce_sum_bf16(want)->wait();
  plain->start_reduce_scatter_sum_bf16(want_block)->wait();
  staged->start_all_reduce_sum_bf16(*on_device)->wait();
  const StagingStats before = staged->staging_stats();
  staged->start_reduce_scatter_sum_bf16(*block_on_device)->wait();
  EXPECT_EQ(*on_device, want);
  for (std::size_t i = r * c; i < (r + 1) * c; ++i) {
    ASSERT_EQ((*block_on_device)[i], want_block[i]) << i;
  }
  const StagingStats& s = staged->staging_stats();
  if (size() > 1) {
    EXPECT_EQ(before.bytes_to_host, n * 2);
    EXPECT_EQ(before.bytes_to_device, n * 2);
    EXPECT_EQ(s.bytes_to_host - before.bytes_to_host, n * 2);
    EXPECT_EQ(s.bytes_to_device - before.bytes_to_device, c * 2);
  } else {
    EXPECT_EQ(s.copies_to_host + s.copies_to_device, 0u);  // one rank: nothing moves
  }
}

TEST_F(Staged, StagingBuffersAreReusedAcrossCalls) {
  std::vector<float>& grads = device(values(20000, rank(), 12));
  std::vector<float>& shard = device(std::vector<float>(20000 / 4));
  for (int step = 0; step < 3; ++step) {
    staged->all_reduce_sum(grads);
    staged->all_gather(std::span<const float>(shard).first(100),
                       std::span<float>(grads).first(100 * std::size_t(size())));
    auto p = staged->start_all_reduce_sum(std::span<float>(grads).first(5000));
    p->wait();
  }
  const auto after_warm_up = staged->staging_stats().allocations;
  EXPECT_GE(after_warm_up, 1u);
  for (int step = 0; step < 10; ++step) {
    staged->all_reduce_sum(grads);
    staged->all_gather(std::span<const float>(shard).first(100),
                       std::span<float>(grads).first(100 * std::size_t(size())));
    auto p = staged->start_all_reduce_sum(std::span<float>(grads).first(5000));
    p->wait();
  }
  EXPECT_EQ(staged->staging_stats().allocations, after_warm_up);
  // One rank stages only the gather, which is not in place; the in-place sums are no-ops.
  EXPECT_EQ(staged->staging_stats().copies_to_host, 13u * (size() > 1 ? 3u : 1u));
}

TEST_F(Staged, SplitGivesStagedGroupsAndMpiOfFindsTheHostSide) {
  auto half = staged->split(rank() % 2, rank());
  ASSERT_NE(dynamic_cast<StagedCommunicator*>(half.get()), nullptr);
  EXPECT_EQ(half->backend(), "staged-mpi");
  std::vector<float>& v = device(std::vector<float>(10, float(rank())));
  half->all_reduce_sum(v);
  float want = 0;
  for (int r = rank() % 2; r < size(); r += 2) want += float(r);
  for (float x : v) EXPECT_EQ(x, want);
  ASSERT_NE(mpi_of(staged.get()), nullptr);
  EXPECT_EQ(mpi_of(staged.get()), &staged->host());
  EXPECT_EQ(mpi_of(plain.get()), plain.get());
  EXPECT_EQ(mpi_of(nullptr), nullptr);
}

}  // namespace
}  // namespace colossal::parallel
