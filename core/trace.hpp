// Spans of work on this process's timeline, written as Chrome trace-event JSON
// (chrome://tracing, Perfetto): `colossal_train --trace FILE`. Off until a file is set; a span
// of a disabled recorder costs one branch and builds no name. A recorded span ends with a fence
// of the Kokkos execution space, so on a GPU it covers its kernels' run, not their launch (and
// the traced steps lose the overlap of communication with kernels that untraced ones have).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace colossal::core {

class TraceRecorder {
 public:
  struct Event {
    std::string name;
    const char* category;  // a string literal ("forward", "receive", ...)
    double begin_us, duration_us;
  };

  // One span, from construction to destruction. With micro >= 0 the name gets the micro-batch
  // appended ("F3"), with chunk >= 0 as well the model chunk before it ("F1.3").
  class Span {
   public:
    Span(TraceRecorder* recorder, const char* name, const char* category, int micro = -1,
         int chunk = -1);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    TraceRecorder* recorder_;
    const char* name_;
    const char* category_;
    int micro_, chunk_;
    double begin_us_;
  };

  // Records from now on, for `file`, which is created (emptied) here so that an unwritable
  // path fails before any work: false when it cannot be written. An empty file records nothing.
  bool open(const std::string& file);
  bool enabled() const { return !file_.empty(); }
  const std::string& file() const { return file_; }
  // Microseconds since the recorder was made.
  double now_us() const;
  void record(std::string name, const char* category, double begin_us, double duration_us);
  const std::vector<Event>& events() const { return events_; }
  // Writes every event to file() as one process `pid` named `process_name` (a metadata event),
  // each span a complete ("X") event on thread 0. Throws std::runtime_error naming the file when
  // it cannot be written; nothing happens when not enabled.
  void write(int pid, const std::string& process_name) const;

 private:
  std::string file_;
  std::vector<Event> events_;
  std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
};

}  // namespace colossal::core
