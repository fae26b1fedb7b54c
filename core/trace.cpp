#include "core/trace.hpp"

#include <cstdio>
#include <stdexcept>
#include <utility>

#include <Kokkos_Core.hpp>

namespace colossal::core {

TraceRecorder::Span::Span(TraceRecorder* recorder, const char* name, const char* category,
                          int micro, int chunk)
    : recorder_(recorder != nullptr && recorder->enabled() ? recorder : nullptr), name_(name),
      category_(category), micro_(micro), chunk_(chunk),
      begin_us_(recorder_ != nullptr ? recorder_->now_us() : 0.0) {}

TraceRecorder::Span::~Span() {
  if (recorder_ == nullptr) return;  // no names built, nothing kept
  Kokkos::fence();  // the span's kernels done, not just launched (a GPU queues them)
  std::string name = name_;
  if (micro_ >= 0) {
    if (chunk_ >= 0) name += std::to_string(chunk_) + ".";
    name += std::to_string(micro_);
  }
  recorder_->record(std::move(name), category_, begin_us_, recorder_->now_us() - begin_us_);
}

bool TraceRecorder::open(const std::string& file) {
  file_ = file;
  if (file.empty()) return true;
  std::FILE* f = std::fopen(file.c_str(), "w");
  if (f == nullptr) return false;
  std::fclose(f);
  return true;
}

double TraceRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
      .count();
}

void TraceRecorder::record(std::string name, const char* category, double begin_us,
                           double duration_us) {
  events_.push_back({std::move(name), category, begin_us, duration_us});
}

void TraceRecorder::write(int pid, const std::string& process_name) const {
  if (!enabled()) return;
  std::FILE* f = std::fopen(file_.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write the trace '" + file_ + "'");
  std::fprintf(f, "{\"traceEvents\": [\n");
  std::fprintf(f,
               "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
               "{\"name\": \"%s\"}}",
               pid, process_name.c_str());
  for (const Event& e : events_) {
    std::fprintf(f,
                 ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.1f, "
                 "\"dur\": %.1f, \"pid\": %d, \"tid\": 0}",
                 e.name.c_str(), e.category, e.begin_us, e.duration_us, pid);
  }
  std::fprintf(f, "\n]}\n");
  if (std::fclose(f) != 0) throw std::runtime_error("cannot write the trace '" + file_ + "'");
}

}  // namespace colossal::core
