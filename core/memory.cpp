#include "core/memory.hpp"

#include <sys/mman.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>
#endif

namespace colossal::core {

const char* category_name(MemCategory category) {
  switch (category) {
    case MemCategory::parameters: return "params";
    case MemCategory::gradients: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::temporaries: return "temporaries";
    case MemCategory::data: return "data";
    case MemCategory::offloaded: return "offloaded (host)";
    default: return "?";
  }
}

void MemoryTracker::on_alloc(MemCategory category, std::size_t bytes) {
  const auto i = index(category);
  current_[i] += bytes;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  current_total_ += bytes;
  if (current_total_ > peak_total_) peak_total_ = current_total_;
}

void MemoryTracker::on_free(MemCategory category, std::size_t bytes) {
  current_[index(category)] -= bytes;
  current_total_ -= bytes;
}

std::string format_number(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
}

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1024.0 * 1024 * 1024) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  } else if (bytes >= 1024.0 * 1024) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  }
  return buf;
}

std::string MemoryTracker::summary() const {
  std::ostringstream out;
  for (std::size_t i = 0; i < kCount; ++i) {
    if (peak_[i] == 0) continue;
    if (out.tellp() > 0) out << ", ";
    out << category_name(static_cast<MemCategory>(i)) << " " << format_bytes(double(peak_[i]));
  }
  out << " (peak total " << format_bytes(double(peak_total_)) << ")";
  return out.str();
}

std::string MemoryTracker::out_of_memory_report(MemCategory category, std::size_t bytes,
                                                const std::string& why) const {
  const bool host = category == MemCategory::offloaded ||
                    std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>;
  std::ostringstream out;
  out << "out of " << (host ? "host" : "device") << " memory: " << format_bytes(double(bytes))
      << " more of " << category_name(category) << " could not be allocated (" << why << ").\n"
      << "  tracked now: ";
  auto entry = [&](std::size_t i, double b) {
    out << category_name(MemCategory(i)) << " " << format_bytes(b) << ", ";
  };
  for (std::size_t i = 0; i < kCount; ++i) {
    if (current_[i] > 0) entry(i, double(current_[i]));
  }
  out << "total " << format_bytes(double(current_total_)) << "\n";
  if (has_plan_) {
    // The category furthest past its plan, counting the request.
    out << "  memory plan: ";
    double planned = 0.0, worst = -1e300;
    std::size_t grew = index(category);
    for (std::size_t i = 0; i < kCount; ++i) {
      planned += plan_[i];
      if (plan_[i] > 0) entry(i, plan_[i]);
      const double would = double(current_[i]) + (i == index(category) ? double(bytes) : 0.0);
      if (would - plan_[i] > worst) {
        worst = would - plan_[i];
        grew = i;
      }
    }
    out << "total " << format_bytes(planned) << "\n";
    if (worst > 0) {
      out << "  " << category_name(MemCategory(grew)) << " grew past the plan: "
          << format_bytes(plan_[grew] + worst) << " against " << format_bytes(plan_[grew])
          << " planned\n";
    } else {
      out << "  every category is within the plan: something outside the tracker (a library's "
             "workspace, another process, a limit on this one such as ulimit -v or a cgroup) "
             "holds the rest\n";
    }
  }
  out << "  to need less: a smaller train.micro_batch, checkpointing.policy: full (or rotor with "
         "checkpointing.memory_budget), a higher parallel.zero.stage, or "
         "parallel.zero.offload.policy: auto; colossal_train --memory-plan shows the plan";
  return out.str();
}

namespace {
constexpr bool kHostMemory =
    std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>;
constexpr std::size_t kHugePage = 2u << 20;
}  // namespace

namespace detail {
void* allocate_bytes(std::size_t bytes, bool host) {
#ifdef KOKKOS_ENABLE_CUDA
  // Offloaded state beside a GPU: pinned (page-locked) host memory, so its copies to and from the
  // device are DMA at the link's full rate instead of staged through a pageable bounce buffer.
  if (host && !kHostMemory) {
    return Kokkos::kokkos_malloc<Kokkos::CudaHostPinnedSpace>("colossal::offloaded", bytes);
  }
#endif
  if (kHostMemory || host) {
    const std::size_t alignment = bytes >= kHugePage ? kHugePage : 64;
    void* ptr = nullptr;
    if (posix_memalign(&ptr, alignment, (bytes + alignment - 1) / alignment * alignment) != 0) {
      throw std::bad_alloc();
    }
    if (bytes >= kHugePage) madvise(ptr, bytes, MADV_HUGEPAGE);  // advisory: ignore failure
    return ptr;
  }
  return Kokkos::kokkos_malloc<Kokkos::DefaultExecutionSpace::memory_space>("colossal", bytes);
}

void allocation_failed(MemoryTracker& tracker, MemCategory category, std::size_t bytes,
                       const char* why) {
  throw OutOfMemory(tracker.out_of_memory_report(category, bytes, why));
}

void free_bytes(void* ptr, std::size_t /*bytes*/, bool host) {
#ifdef KOKKOS_ENABLE_CUDA
  if (host && !kHostMemory) {
    Kokkos::kokkos_free<Kokkos::CudaHostPinnedSpace>(ptr);
    return;
  }
#endif
  if (kHostMemory || host) {
    std::free(ptr);
  } else {
    Kokkos::kokkos_free<Kokkos::DefaultExecutionSpace::memory_space>(ptr);
  }
}
}  // namespace detail

void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;  // an empty part's pointer may be null (memcpy's arguments may not)
  if constexpr (kHostMemory) {
    std::memcpy(device_dst, host_src, bytes);
  } else {
    using Dev = Kokkos::View<char*, Kokkos::DefaultExecutionSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using Host = Kokkos::View<const char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    // On Kokkos' stream, after its kernels, and waited for there: the deep_copy without an
    // execution space fences the whole device (Kokkos 3.4), collectives in flight included.
    const Kokkos::DefaultExecutionSpace exec;
    Kokkos::deep_copy(exec, Dev(static_cast<char*>(device_dst), bytes),
                      Host(static_cast<const char*>(host_src), bytes));
    exec.fence();
  }
}

void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes == 0) return;  // as copy_to_device
  if constexpr (kHostMemory) {
    std::memcpy(host_dst, device_src, bytes);
  } else {
    using Dev = Kokkos::View<const char*, Kokkos::DefaultExecutionSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using Host = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    const Kokkos::DefaultExecutionSpace exec;  // as copy_to_device: Kokkos' stream only
    Kokkos::deep_copy(exec, Host(static_cast<char*>(host_dst), bytes),
                      Dev(static_cast<const char*>(device_src), bytes));
    exec.fence();
  }
}

#ifdef KOKKOS_ENABLE_CUDA
namespace {
void check_cuda(cudaError_t error, const char* call, const char* who) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("colossal::core::") + who + ": " + call + " failed: " +
                             cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
  }
}
}  // namespace

CopyQueue::CopyQueue() {
  if constexpr (!kHostMemory) {
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate",
               "CopyQueue");
    stream_ = stream;
  }
}

CopyQueue::~CopyQueue() {
  if (stream_ == nullptr) return;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // best effort: cannot report here
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CopyQueue::follow_kernels() {
  if (stream_ != nullptr) {
    order_after_kernels(stream_);
  } else {
    fence_kernels();  // the copies are done when queued: the kernels must be done first
  }
}

void CopyQueue::precede(void* stream) {
  if (stream_ == nullptr) return;
  if (event_ == nullptr) {
    cudaEvent_t event = nullptr;
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate",
               "CopyQueue");
    event_ = event;
  }
  const cudaStream_t target =
      stream != nullptr ? static_cast<cudaStream_t>(stream) : Kokkos::Cuda().cuda_stream();
  // A wait already enqueued keeps the state the event had when it was enqueued.
  cudaError_t error = cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                      static_cast<cudaStream_t>(stream_));
  if (error == cudaSuccess) error = cudaStreamWaitEvent(target, static_cast<cudaEvent_t>(event_), 0);
  check_cuda(error, "cudaEventRecord / cudaStreamWaitEvent", "CopyQueue");
}

void CopyQueue::to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if (bytes == 0) return;  // as copy_to_device
  if (stream_ == nullptr) return (void)std::memcpy(host_dst, device_src, bytes);
  check_cuda(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost,
                             static_cast<cudaStream_t>(stream_)),
             "cudaMemcpyAsync to the host", "CopyQueue");
}

void CopyQueue::to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;  // as copy_to_device
  if (stream_ == nullptr) return (void)std::memcpy(device_dst, host_src, bytes);
  check_cuda(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(stream_)),
             "cudaMemcpyAsync to the device", "CopyQueue");
}

void CopyQueue::wait() {
  if (stream_ != nullptr) {
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
               "cudaStreamSynchronize", "CopyQueue");
  }
}

void order_after_kernels(void* stream) {
  if constexpr (kHostMemory) {
    fence_kernels();
  } else {
    // One event per thread, recorded again for each call: a wait already enqueued keeps the
    // state the event had when it was enqueued.
    thread_local struct Event {
      cudaEvent_t event = nullptr;
      ~Event() {
        if (event != nullptr) cudaEventDestroy(event);
      }
    } kernels_done;
    if (kernels_done.event == nullptr) {
      check_cuda(cudaEventCreateWithFlags(&kernels_done.event, cudaEventDisableTiming),
                 "cudaEventCreate", "order_after_kernels");
    }
    cudaError_t error = cudaEventRecord(kernels_done.event, Kokkos::Cuda().cuda_stream());
    if (error == cudaSuccess) {
      error = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), kernels_done.event, 0);
    }
    check_cuda(error, "cudaEventRecord / cudaStreamWaitEvent", "order_after_kernels");
  }
}
#else
CopyQueue::CopyQueue() {
  const char* v = std::getenv("COLOSSAL_DEFER_COPIES");
  defer_ = v != nullptr && std::strcmp(v, "1") == 0;
}
CopyQueue::~CopyQueue() { run_deferred(); }
void CopyQueue::copy_or_defer(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;  // as copy_to_device
  if (defer_) {
    deferred_.push_back({dst, src, bytes});
  } else {
    std::memcpy(dst, src, bytes);
  }
}
void CopyQueue::run_deferred() {
  for (const Deferred& d : deferred_) std::memcpy(d.dst, d.src, d.bytes);  // in queue order
  deferred_.clear();
}
void CopyQueue::to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  copy_or_defer(host_dst, device_src, bytes);
}
void CopyQueue::to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  copy_or_defer(device_dst, host_src, bytes);
}
void CopyQueue::wait() { run_deferred(); }
// The kernels run when called here: those queued so far are done before any later copy runs.
void CopyQueue::follow_kernels() { fence_kernels(); }
void CopyQueue::precede(void* /*stream*/) { run_deferred(); }
void order_after_kernels(void* /*stream*/) { fence_kernels(); }
#endif

std::size_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
  }
  return 0;
}

std::size_t device_used_bytes() {
#ifdef KOKKOS_ENABLE_CUDA
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();  // clear it: the next CUDA call must not see this one's error
    return 0;
  }
  return total_bytes - free_bytes;
#else
  return 0;
#endif
}

}  // namespace colossal::core
