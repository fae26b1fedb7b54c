#include "apps/watchdog.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.hpp"

namespace colossal::apps {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Watchdog::Watchdog(double seconds, int rank) : seconds_(seconds), rank_(rank) {
  last_ns_ = now_ns();
  if (seconds_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Watchdog::progress(int64_t step, const char* where) {
  last_ns_ = now_ns();
  if (step >= 0) step_ = step;
  where_ = where;
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto tick = std::chrono::milliseconds(seconds_ < 10 ? 100 : 1000);
  while (!stop_cv_.wait_for(lock, tick, [this] { return stop_; })) {
    const double idle = double(now_ns() - last_ns_.load()) * 1e-9;
    if (idle < seconds_) continue;
    // The collective this rank is blocked in, if any (its peers never joined it).
    const auto wait = parallel::current_collective_wait();
    const std::string in = wait ? "; " + parallel::describe(*wait) : std::string();
    std::fprintf(stderr,
                 "colossal_train: error (rank %d): watchdog: no progress for %.0f s (step %lld, "
                 "%s%s; train.watchdog_seconds = %g): another rank may have died or hung in a "
                 "collective. Ending this rank so the job ends; restart with "
                 "checkpoint.resume: auto to continue from the last checkpoint\n",
                 rank_, idle, (long long)step_.load(), where_.load(), in.c_str(), seconds_);
    std::fflush(stderr);
    // Abort the transports that can be (NCCL: its peers' pending operations then fail with an
    // error rather than wait for their own watchdogs); a hook that hangs cannot keep the rank.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(1);
    }).detach();
    const std::vector<std::string> aborted = parallel::run_abort_hooks();
    for (const std::string& what : aborted) {
      std::fprintf(stderr, "colossal_train: rank %d: watchdog: aborted the %s\n", rank_,
                   what.c_str());
    }
    std::fflush(stderr);
    std::_Exit(1);  // no MPI call from this thread; mpirun / srun ends the other ranks
  }
}

}  // namespace colossal::apps
