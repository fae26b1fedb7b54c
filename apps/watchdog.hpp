// A watchdog for a training job: a thread that ends the process when the run makes no progress
// (no step, validation batch or checkpoint finished) for `seconds`. A rank whose peer died or hung
// inside a collective would otherwise wait forever; ending it with an error lets mpirun / srun end
// the job, and `checkpoint.resume: auto` continues from the last checkpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace colossal::apps {

class Watchdog {
 public:
  // seconds <= 0: no thread, progress() does nothing.
  Watchdog(double seconds, int rank);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The run moved on (step < 0: the step is unchanged); `where` says where it is, for the message
  // if it never finishes.
  void progress(int64_t step, const char* where);

 private:
  void watch();
  double seconds_;
  int rank_;
  std::atomic<int64_t> last_ns_{0};
  std::atomic<int64_t> step_{0};
  std::atomic<const char*> where_{"starting"};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace colossal::apps
