#include "parallel/communicator.hpp"

#include "core/kokkos_compat.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace colossal::parallel {

void Communicator::fence_kernels_unless_ordered() const {
  if (!orders_after_kernels()) core::fence_kernels();
}

namespace {

std::string describe(const Communicator& comm) {
  return std::string(comm.backend()) + " communicator, rank " + std::to_string(comm.rank()) +
         " of " + std::to_string(comm.size());
}

[[noreturn]] void fail(const Communicator& comm, const std::string& message) {
  throw std::invalid_argument("colossal::parallel: " + message + " [" + describe(comm) + "]");
}

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  // std::less gives a total order on unrelated pointers, unlike the built-in <.
  const auto* a0 = static_cast<const std::byte*>(a);
  const auto* b0 = static_cast<const std::byte*>(b);
  return std::less<>{}(a0, b0 + b_bytes) && std::less<>{}(b0, a0 + a_bytes);
}

constexpr std::uint64_t kFloatBytes = sizeof(float);

}  // namespace

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
    case CollectiveKind::barrier: return "barrier";
  }
  return "unknown";
}

double ring_wire_bytes(CollectiveKind kind, double payload_bytes, int ranks) {
  if (ranks < 1) throw std::invalid_argument("ring_wire_bytes: ranks must be >= 1");
  const double p = ranks;
  switch (kind) {
    case CollectiveKind::send:
    case CollectiveKind::recv: return payload_bytes;
    case CollectiveKind::barrier: return 0.0;
    default: break;
  }
  if (ranks == 1) return 0.0;
  switch (kind) {
    case CollectiveKind::all_reduce: return 2.0 * (p - 1.0) / p * payload_bytes;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather: return (p - 1.0) / p * payload_bytes;
    case CollectiveKind::broadcast: return payload_bytes;
    default: return 0.0;
  }
}

const OpStats& CommStats::operator[](CollectiveKind kind) const {
  switch (kind) {
    case CollectiveKind::all_reduce: return all_reduce;
    case CollectiveKind::reduce_scatter: return reduce_scatter;
    case CollectiveKind::all_gather: return all_gather;
    case CollectiveKind::broadcast: return broadcast;
    case CollectiveKind::send: return send;
    case CollectiveKind::recv: return recv;
    case CollectiveKind::barrier: return barrier;
  }
  throw std::invalid_argument("CommStats: unknown collective kind");
}

OpStats& CommStats::operator[](CollectiveKind kind) {
  return const_cast<OpStats&>(std::as_const(*this)[kind]);
}

std::uint64_t CommStats::total_calls() const {
  return all_reduce.calls + reduce_scatter.calls + all_gather.calls + broadcast.calls + send.calls +
         recv.calls + barrier.calls;
}

std::uint64_t CommStats::total_payload_bytes() const {
  return all_reduce.payload_bytes + reduce_scatter.payload_bytes + all_gather.payload_bytes +
         broadcast.payload_bytes + send.payload_bytes + recv.payload_bytes;
}

double CommStats::total_wire_bytes() const {
  return all_reduce.wire_bytes + reduce_scatter.wire_bytes + all_gather.wire_bytes +
         broadcast.wire_bytes + send.wire_bytes + recv.wire_bytes;
}

void Communicator::record(CollectiveKind kind, std::uint64_t payload_bytes) {
  OpStats& op = stats_[kind];
  op.calls += 1;
  op.payload_bytes += payload_bytes;
  op.wire_bytes += ring_wire_bytes(kind, static_cast<double>(payload_bytes), size());
}

void Communicator::check_rank(const char* what, const char* role, int peer) const {
  if (peer < 0 || peer >= size()) {
    fail(*this, std::string(what) + ": " + role + " " + std::to_string(peer) +
                    " is not a rank of this communicator (ranks are 0.." +
                    std::to_string(size() - 1) + "); pass a rank of this communicator");
  }
}

// What this process waits in (current_collective_wait): set around every blocking call and every
// wait on a started one, the previous one restored after (a staged call waits in its host MPI's).
// Plain atomics: the watchdog thread reads them while the owner writes; a torn mix of two waits in
// its message is harmless.
namespace {
std::atomic<int> g_wait_kind{-1};
std::atomic<std::uint64_t> g_wait_bytes{0};
std::atomic<int> g_wait_ranks{0};
std::atomic<const char*> g_wait_backend{""};
std::atomic<std::int64_t> g_wait_since_ns{0};

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Communicator::WaitScope::WaitScope(const Communicator& comm, CollectiveKind kind,
                                   std::uint64_t payload_bytes)
    : WaitScope(kind, payload_bytes, comm.size(), comm.backend().data()) {}

Communicator::WaitScope::WaitScope(CollectiveKind kind, std::uint64_t payload_bytes, int ranks,
                                   const char* backend)
    : kind_(g_wait_kind.load()),
      bytes_(g_wait_bytes.load()),
      ranks_(g_wait_ranks.load()),
      backend_(g_wait_backend.load()),
      since_ns_(g_wait_since_ns.load()) {
  g_wait_since_ns = steady_ns();
  g_wait_bytes = payload_bytes;
  g_wait_ranks = ranks;
  g_wait_backend = backend;
  g_wait_kind = int(kind);
}

Communicator::WaitScope::~WaitScope() {
  g_wait_kind = kind_;
  g_wait_bytes = bytes_;
  g_wait_ranks = ranks_;
  g_wait_backend = backend_;
  g_wait_since_ns = since_ns_;
}

std::optional<CollectiveWait> current_collective_wait() {
  const int kind = g_wait_kind.load();
  if (kind < 0) return std::nullopt;
  return CollectiveWait{CollectiveKind(kind), g_wait_bytes.load(), g_wait_ranks.load(),
                        g_wait_backend.load(),
                        double(steady_ns() - g_wait_since_ns.load()) * 1e-9};
}

std::string describe(const CollectiveWait& wait) {
  char text[160];
  std::snprintf(text, sizeof text, "waiting %.0f s in %s of %.3g MB over %d ranks (%s)",
                wait.seconds, collective_name(wait.kind), double(wait.payload_bytes) / 1e6,
                wait.ranks, wait.backend);
  return text;
}

namespace {
struct AbortHooks {
  std::mutex mutex;
  int next = 0;
  std::vector<std::tuple<int, std::string, std::function<void()>>> hooks;
};
AbortHooks& abort_hooks() {
  static AbortHooks* hooks = new AbortHooks;  // never destroyed: a hook may outlive exit's order
  return *hooks;
}
}  // namespace

int register_abort_hook(std::string what, std::function<void()> hook) {
  AbortHooks& all = abort_hooks();
  std::lock_guard<std::mutex> lock(all.mutex);
  const int id = all.next++;
  all.hooks.emplace_back(id, std::move(what), std::move(hook));
  return id;
}

void unregister_abort_hook(int id) {
  AbortHooks& all = abort_hooks();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::erase_if(all.hooks, [id](const auto& h) { return std::get<0>(h) == id; });
}

std::vector<std::string> run_abort_hooks() {
  AbortHooks& all = abort_hooks();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::vector<std::string> ran;
  // Newest first: the communicators made last (a layout's groups, after the world's) are the
  // ones a step waits in, so a stuck one is freed before any older abort can take long.
  for (auto it = all.hooks.rbegin(); it != all.hooks.rend(); ++it) {
    auto& [id, what, hook] = *it;
    try {
      hook();
      ran.push_back(what);
    } catch (const std::exception& e) {
      ran.push_back(what + " (failed: " + e.what() + ")");
    }
  }
  all.hooks.clear();
  return ran;
}

namespace {
// A started collective whose wait (or the destructor's) is recorded as the process's wait.
class TrackedPending final : public PendingCollective {
 public:
  TrackedPending(std::unique_ptr<PendingCollective> inner, CollectiveKind kind,
                 std::uint64_t bytes, int ranks, const char* backend)
      : inner_(std::move(inner)), kind_(kind), bytes_(bytes), ranks_(ranks), backend_(backend) {}
  ~TrackedPending() override {
    if (done_) return;
    const Communicator::WaitScope waiting(kind_, bytes_, ranks_, backend_);
    inner_.reset();  // an unfinished one waits in its destructor
  }
  bool test() override { return done_ = done_ || inner_->test(); }
  void wait() override {
    if (done_) return;
    const Communicator::WaitScope waiting(kind_, bytes_, ranks_, backend_);
    inner_->wait();
    done_ = true;
  }

 private:
  std::unique_ptr<PendingCollective> inner_;
  CollectiveKind kind_;
  std::uint64_t bytes_;
  int ranks_;
  const char* backend_;
  bool done_ = false;
};
}  // namespace

Communicator::WaitScope Communicator::counted(CollectiveKind kind, std::uint64_t payload_bytes) {
  record(kind, payload_bytes);
  return WaitScope(*this, kind, payload_bytes);
}

std::unique_ptr<PendingCollective> Communicator::started(
    std::unique_ptr<PendingCollective> pending, CollectiveKind kind, std::uint64_t payload_bytes) {
  record(kind, payload_bytes);
  return std::make_unique<TrackedPending>(std::move(pending), kind, payload_bytes, size(),
                                          backend().data());
}

// On a communicator of one rank the in-place collectives (sum, max, broadcast, and reduce-scatter
// or all-gather in place) leave the buffer as it is: no transport is called, so a one-rank run on
// a GPU stages nothing through the host. Bytes are still counted, as the call asked for them.
//
// Every call that hands float buffers to the transport first orders it after the kernels that
// may still write or read them (fence_kernels_unless_ordered): callers need no fence of their own.
void Communicator::all_reduce_sum(std::span<float> buffer) {
  const WaitScope waiting = counted(CollectiveKind::all_reduce, buffer.size() * kFloatBytes);
  if (size() == 1) return;
  fence_kernels_unless_ordered();
  do_all_reduce_sum(buffer);
}

void Communicator::all_reduce_max(std::span<float> buffer) {
  const WaitScope waiting = counted(CollectiveKind::all_reduce, buffer.size() * kFloatBytes);
  if (size() == 1) return;
  fence_kernels_unless_ordered();
  do_all_reduce_max(buffer);
}

namespace {
class CompletedCollective final : public PendingCollective {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// A started collective with input and output buffers: the backend's started form on several
// ranks; on one, the copy the collective amounts to (none in place), completed at once.
template <class Start, class Copy>
std::unique_ptr<PendingCollective> start_or_copy(const Communicator& comm, bool in_place,
                                                 Start&& start, Copy&& copy) {
  if (comm.size() > 1 || !in_place) comm.fence_kernels_unless_ordered();
  if (comm.size() > 1) return start();
  if (!in_place) copy();
  return std::make_unique<CompletedCollective>();
}
}  // namespace

double Communicator::all_reduce_sum_value(double value) {
  const WaitScope waiting = counted(CollectiveKind::all_reduce, sizeof(double));
  return do_all_reduce_sum_value(value);
}

std::unique_ptr<PendingCollective> Communicator::start_all_reduce_sum(std::span<float> buffer) {
  auto pending = start_or_copy(
      *this, true, [&] { return do_start_all_reduce_sum(buffer); }, [] {});
  return started(std::move(pending), CollectiveKind::all_reduce, buffer.size() * kFloatBytes);
}

std::unique_ptr<PendingCollective> Communicator::start_all_reduce_sum_bf16(
    std::span<std::uint16_t> buffer) {
  auto pending = start_or_copy(
      *this, true, [&] { return do_start_all_reduce_sum_bf16(buffer); }, [] {});
  return started(std::move(pending), CollectiveKind::all_reduce,
                 buffer.size() * sizeof(std::uint16_t));
}

std::unique_ptr<PendingCollective> Communicator::start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t> buffer) {
  if (buffer.size() % static_cast<std::size_t>(size()) != 0) {
    fail(*this, "reduce_scatter_sum_bf16: " + std::to_string(buffer.size()) +
                    " elements are not a multiple of the " + std::to_string(size()) +
                    " ranks (each receives one block); pad the buffer to a multiple of size()");
  }
  auto pending = start_or_copy(
      *this, true, [&] { return do_start_reduce_scatter_sum_bf16(buffer); }, [] {});
  return started(std::move(pending), CollectiveKind::reduce_scatter,
                 buffer.size() * sizeof(std::uint16_t));
}

namespace {
[[noreturn]] void no_bf16_sums(const Communicator& comm) {
  throw std::logic_error("colossal::parallel: the " + std::string(comm.backend()) +
                         " communicator has no bf16 sums; set parallel.grad_reduce: fp32");
}
}  // namespace

std::unique_ptr<PendingCollective> Communicator::do_start_all_reduce_sum_bf16(
    std::span<std::uint16_t>) {
  no_bf16_sums(*this);
}

std::unique_ptr<PendingCollective> Communicator::do_start_reduce_scatter_sum_bf16(
    std::span<std::uint16_t>) {
  no_bf16_sums(*this);
}

std::unique_ptr<PendingCollective> Communicator::do_start_all_reduce_sum(std::span<float> buffer) {
  do_all_reduce_sum(buffer);
  return std::make_unique<CompletedCollective>();
}

// Validates a reduce-scatter's buffers (reduce_scatter_sum, start_reduce_scatter_sum); true when
// in place.
bool Communicator::check_reduce_scatter(std::span<const float> input,
                                        std::span<float> output) const {
  const std::size_t p = static_cast<std::size_t>(size());
  if (input.size() != p * output.size()) {
    fail(*this, "reduce_scatter_sum: input has " + std::to_string(input.size()) +
                    " floats but size() * output.size() = " + std::to_string(p * output.size()) +
                    " (each rank receives one block of output.size() floats); size the input as "
                    "size() * output.size()");
  }
  const bool in_place = output.data() == input.data() + std::size_t(rank()) * output.size();
  if (!in_place &&
      overlap(input.data(), input.size_bytes(), output.data(), output.size_bytes())) {
    fail(*this, "reduce_scatter_sum: input and output overlap other than in place (output = "
                "block rank() of input); use a separate output buffer");
  }
  return in_place;
}

void Communicator::reduce_scatter_sum(std::span<const float> input, std::span<float> output) {
  const bool in_place = check_reduce_scatter(input, output);
  const WaitScope waiting = counted(CollectiveKind::reduce_scatter, input.size() * kFloatBytes);
  if (size() == 1 && in_place) return;
  fence_kernels_unless_ordered();
  do_reduce_scatter_sum(input, output);
}

std::unique_ptr<PendingCollective> Communicator::start_reduce_scatter_sum(
    std::span<const float> input, std::span<float> output) {
  const bool in_place = check_reduce_scatter(input, output);
  auto pending = start_or_copy(
      *this, in_place, [&] { return do_start_reduce_scatter_sum(input, output); },
      [&] { do_reduce_scatter_sum(input, output); });
  return started(std::move(pending), CollectiveKind::reduce_scatter, input.size() * kFloatBytes);
}

std::unique_ptr<PendingCollective> Communicator::do_start_reduce_scatter_sum(
    std::span<const float> input, std::span<float> output) {
  do_reduce_scatter_sum(input, output);
  return std::make_unique<CompletedCollective>();
}

// Validates an all-gather's buffers (all_gather, start_all_gather); true when in place.
bool Communicator::check_all_gather(std::span<const float> input, std::span<float> output) const {
  const std::size_t p = static_cast<std::size_t>(size());
  if (output.size() != p * input.size()) {
    fail(*this, "all_gather: output has " + std::to_string(output.size()) +
                    " floats but size() * input.size() = " + std::to_string(p * input.size()) +
                    " (every rank contributes one block of input.size() floats); size the output "
                    "as size() * input.size()");
  }
  const bool in_place = input.data() == output.data() + static_cast<std::size_t>(rank()) * input.size();
  if (!in_place && overlap(input.data(), input.size_bytes(), output.data(), output.size_bytes())) {
    fail(*this, "all_gather: input overlaps output without being block rank() of it; pass "
                "output.subspan(rank() * n, n) as input for an in-place gather, or separate buffers");
  }
  return in_place;
}

void Communicator::all_gather(std::span<const float> input, std::span<float> output) {
  const bool in_place = check_all_gather(input, output);
  const WaitScope waiting = counted(CollectiveKind::all_gather, output.size() * kFloatBytes);
  if (size() == 1 && in_place) return;
  fence_kernels_unless_ordered();
  do_all_gather(input, output);
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather(std::span<const float> input,
                                                                  std::span<float> output) {
  const bool in_place = check_all_gather(input, output);
  auto pending = start_or_copy(
      *this, in_place, [&] { return do_start_all_gather(input, output); },
      [&] { do_all_gather(input, output); });
  return started(std::move(pending), CollectiveKind::all_gather, output.size() * kFloatBytes);
}

std::unique_ptr<PendingCollective> Communicator::do_start_all_gather(std::span<const float> input,
                                                                     std::span<float> output) {
  do_all_gather(input, output);
  return std::make_unique<CompletedCollective>();
}

void Communicator::broadcast(std::span<float> buffer, int root) {
  check_rank("broadcast", "root", root);
  const WaitScope waiting = counted(CollectiveKind::broadcast, buffer.size() * kFloatBytes);
  if (size() == 1) return;
  fence_kernels_unless_ordered();
  do_broadcast(buffer, root);
}

void Communicator::broadcast_bytes(std::span<std::byte> buffer, int root) {
  check_rank("broadcast_bytes", "root", root);
  const WaitScope waiting = counted(CollectiveKind::broadcast, buffer.size());
  do_broadcast_bytes(buffer, root);
}

void Communicator::broadcast_string(std::string& text, int root) {
  std::uint64_t length = text.size();
  broadcast_value(length, root);
  text.resize(static_cast<std::size_t>(length));
  broadcast_bytes(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
}

void Communicator::send(std::span<const float> buffer, int dest, int tag) {
  check_rank("send", "destination", dest);
  if (tag < 0) fail(*this, "send: tag " + std::to_string(tag) + " is negative; use a tag >= 0");
  const WaitScope waiting = counted(CollectiveKind::send, buffer.size() * kFloatBytes);
  fence_kernels_unless_ordered();
  do_send(buffer, dest, tag);
}

std::unique_ptr<PendingCollective> Communicator::start_send(std::span<const float> buffer, int dest,
                                                            int tag) {
  check_rank("send", "destination", dest);
  if (tag < 0) fail(*this, "send: tag " + std::to_string(tag) + " is negative; use a tag >= 0");
  fence_kernels_unless_ordered();
  auto pending = do_start_send(buffer, dest, tag);
  return started(std::move(pending), CollectiveKind::send, buffer.size() * kFloatBytes);
}

std::unique_ptr<PendingCollective> Communicator::do_start_send(std::span<const float> buffer,
                                                               int dest, int tag) {
  do_send(buffer, dest, tag);
  return std::make_unique<CompletedCollective>();
}

void Communicator::recv(std::span<float> buffer, int source, int tag) {
  check_rank("recv", "source", source);
  if (tag < 0) fail(*this, "recv: tag " + std::to_string(tag) + " is negative; use a tag >= 0");
  const WaitScope waiting = counted(CollectiveKind::recv, buffer.size() * kFloatBytes);
  fence_kernels_unless_ordered();
  do_recv(buffer, source, tag);
}

void Communicator::send_recv(std::span<const float> send_buffer, int dest,
                             std::span<float> recv_buffer, int source, int tag) {
  check_rank("send_recv", "destination", dest);
  check_rank("send_recv", "source", source);
  if (tag < 0) fail(*this, "send_recv: tag " + std::to_string(tag) + " is negative; use a tag >= 0");
  if (overlap(send_buffer.data(), send_buffer.size_bytes(), recv_buffer.data(),
              recv_buffer.size_bytes())) {
    fail(*this, "send_recv: send and receive buffers overlap; use separate buffers");
  }
  const WaitScope waiting = counted(CollectiveKind::recv, recv_buffer.size() * kFloatBytes);
  fence_kernels_unless_ordered();
  do_send_recv(send_buffer, dest, recv_buffer, source, tag);
  record(CollectiveKind::send, send_buffer.size() * kFloatBytes);
}

void Communicator::exchange(std::span<const PeerTransfer> transfers) {
  std::uint64_t sent = 0, received = 0;
  for (const PeerTransfer& t : transfers) {
    check_rank("exchange", t.is_send() ? "destination" : "source", t.peer);
    (t.is_send() ? sent : received) += t.count * kFloatBytes;
  }
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    for (std::size_t j = 0; j < transfers.size() && !transfers[i].is_send(); ++j) {
      if (j != i && overlap(transfers[i].data, transfers[i].count * kFloatBytes, transfers[j].data,
                            transfers[j].count * kFloatBytes)) {
        fail(*this, "exchange: the receive from rank " + std::to_string(transfers[i].peer) +
                        " overlaps another transfer's buffer of the group; give it its own");
      }
    }
  }
  if (transfers.empty()) return;
  const WaitScope waiting(*this, received > 0 ? CollectiveKind::recv : CollectiveKind::send,
                          received > 0 ? received : sent);
  fence_kernels_unless_ordered();
  do_exchange(transfers);
  for (const PeerTransfer& t : transfers) {
    record(t.is_send() ? CollectiveKind::send : CollectiveKind::recv, t.count * kFloatBytes);
  }
}

void Communicator::do_exchange(std::span<const PeerTransfer>) {
  throw std::logic_error("colossal::parallel: the " + std::string(backend()) +
                         " communicator has no grouped point-to-point (exchange)");
}

void Communicator::barrier() {
  const WaitScope waiting = counted(CollectiveKind::barrier, 0);
  do_barrier();
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) const {
  if (color < 0) {
    fail(*this, "split: color " + std::to_string(color) +
                    " is negative (every rank must land in a group); use a color >= 0");
  }
  return do_split(color, key);
}

}  // namespace colossal::parallel
