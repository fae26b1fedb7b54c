// Byte-accurate memory accounting and the owning arrays every tensor is carved from.
//
// Every allocation of the model, optimizer and trainer goes through a DeviceArray registered with a
// MemoryTracker, so measured peaks can be compared with the symbolic prediction. Arrays are
// allocated once, up front; nothing in the step loop allocates.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/kokkos_compat.hpp"

namespace colossal::core {

// `offloaded` is host memory holding state that would otherwise live on the device (ZeRO offload);
// on a host-only build it is ordinary memory, counted apart so the split stays visible.
enum class MemCategory : int {
  parameters, gradients, optimizer, activations, temporaries, data, offloaded, count
};

const char* category_name(MemCategory category);

class MemoryTracker {
 public:
  void on_alloc(MemCategory category, std::size_t bytes);
  void on_free(MemCategory category, std::size_t bytes);
  std::size_t current(MemCategory category) const { return current_[index(category)]; }
  std::size_t peak(MemCategory category) const { return peak_[index(category)]; }
  std::size_t current_total() const { return current_total_; }
  std::size_t peak_total() const { return peak_total_; }
  // A one-line breakdown such as "params 474.7 MiB, grads 474.7 MiB, ...".
  std::string summary() const;
  // Dry run: arrays created against this tracker are counted but never allocated (their data()
  // is null), so a layout's memory per rank can be measured without the memory (--memory-plan).
  void set_dry_run(bool dry) { dry_run_ = dry; }
  bool dry_run() const { return dry_run_; }
  // The memory plan (the cost model's bytes per category for this rank), which an allocation
  // that fails mid-run is reported against.
  void set_plan(const std::array<double, static_cast<std::size_t>(MemCategory::count)>& bytes) {
    plan_ = bytes;
    has_plan_ = true;
  }
  // What to say when `bytes` more of `category` could not be allocated: the request, what is
  // tracked now, the plan, the category that grew past it most, and which keys lower memory.
  std::string out_of_memory_report(MemCategory category, std::size_t bytes,
                                   const std::string& why) const;

 private:
  static std::size_t index(MemCategory c) { return static_cast<std::size_t>(c); }
  static constexpr std::size_t kCount = static_cast<std::size_t>(MemCategory::count);
  std::array<std::size_t, kCount> current_{};
  std::array<std::size_t, kCount> peak_{};
  std::size_t current_total_ = 0;
  bool dry_run_ = false;
  std::size_t peak_total_ = 0;
  std::array<double, kCount> plan_{};
  bool has_plan_ = false;
};

// An allocation the tracker counted failed (device or host out of memory): what() is the
// tracker's out_of_memory_report.
class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string format_bytes(double bytes);
// The shortest text that reads back as `value` (std::to_chars): 0.5, 0.015625, 1, 1e-05.
std::string format_number(double value);

namespace detail {
// Memory of the default execution space. On the host it is 2 MiB aligned and advised for huge pages:
// a fresh 4 KiB page costs ~13 us to touch on these machines, so big arrays want few, large pages.
void* allocate_bytes(std::size_t bytes, bool host);
// Throws OutOfMemory for a failed allocation of `bytes` of `category` (not counted).
[[noreturn]] void allocation_failed(MemoryTracker& tracker, MemCategory category,
                                    std::size_t bytes, const char* why);
void free_bytes(void* ptr, std::size_t bytes, bool host);
}  // namespace detail

// A tracked, owning, zero-initialised array of T in the default execution space's memory, or in
// host memory for the `offloaded` category.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(MemoryTracker& tracker, MemCategory category, std::size_t count)
      : tracker_(&tracker), category_(category), count_(count) {
    if (count_ == 0) return;
    if (tracker.dry_run()) {
      tracker_->on_alloc(category_, bytes());
      counted_only_ = true;
      return;
    }
    try {
      data_ = static_cast<T*>(detail::allocate_bytes(bytes(), on_host()));
    } catch (const std::exception& e) {  // std::bad_alloc; Kokkos' RawMemoryAllocationFailure
      detail::allocation_failed(tracker, category_, bytes(), e.what());
    }
    tracker_->on_alloc(category_, bytes());  // counted once it exists: a failure leaves no peak
    if (on_host()) {
      std::fill(data_, data_ + count_, T{});
    } else {
      fill(T{});
    }
  }
  ~DeviceArray() { release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept { swap(other); }
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      release();
      swap(other);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  bool on_host() const { return category_ == MemCategory::offloaded; }

  void fill(T value);  // every element; out of line, so `extern template` holds (below)

 private:
  void release() {
    if (data_ != nullptr || counted_only_) {
      if (data_ != nullptr) detail::free_bytes(data_, bytes(), on_host());
      tracker_->on_free(category_, bytes());
      data_ = nullptr;
      counted_only_ = false;
    }
  }
  void swap(DeviceArray& o) noexcept {
    std::swap(tracker_, o.tracker_);
    std::swap(category_, o.category_);
    std::swap(count_, o.count_);
    std::swap(counted_only_, o.counted_only_);
    std::swap(data_, o.data_);
  }
  MemoryTracker* tracker_ = nullptr;
  MemCategory category_ = MemCategory::temporaries;
  std::size_t count_ = 0;
  T* data_ = nullptr;
  bool counted_only_ = false;  // dry run: counted by the tracker, never allocated
};

template <typename T>
void DeviceArray<T>::fill(T value) {
  T* p = data_;
  Kokkos::parallel_for("colossal::core::fill", Kokkos::RangePolicy<>(0, count_),
                       KOKKOS_LAMBDA(std::size_t i) { p[i] = value; });
  fence_kernels();
}

#ifdef KOKKOS_ENABLE_CUDA  // one instance, core/device_kernels.cpp (core/kokkos_compat.hpp)
COLOSSAL_DEVICE_INSTANCE void DeviceArray<float>::fill(float);
COLOSSAL_DEVICE_INSTANCE void DeviceArray<int32_t>::fill(int32_t);
COLOSSAL_DEVICE_INSTANCE void DeviceArray<std::uint16_t>::fill(std::uint16_t);
#endif

// Copies between host memory and DeviceArray memory (plain memcpy when the default space is host).
void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes);
void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes);

// Host-device copies on a queue of their own beside the kernels (ZeRO offload's transfers). On a
// CUDA build it is a non-blocking stream: its copies run while Kokkos' stream computes, and they
// do not wait for the kernels queued there either (fence_kernels() first where a copy reads what
// they wrote); host memory must be pinned (the offloaded category) for a copy to be
// asynchronous. On a host build each copy is a memcpy, done at once. wait() returns when every
// copy queued so far is done.
//
// COLOSSAL_DEFER_COPIES=1 (a host build's check, not for production): each copy is done at the
// last moment a GPU's could be, the next wait(), precede() or the queue's end, so it reads its
// source and writes its destination then. A caller that reads a destination before waiting, or
// overwrites a source still queued, then computes wrong values on the host as it would at
// random on a GPU (tests/CMakeLists.txt runs the offload parity tests so: label defer).
class CopyQueue {
 public:
  CopyQueue();
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;
  void to_host(void* host_dst, const void* device_src, std::size_t bytes);
  void to_device(void* device_dst, const void* host_src, std::size_t bytes);
  void wait();
  // Ordering without the host waiting (a CUDA build). follow_kernels(): the copies queued from
  // now on wait for the kernels queued so far on Kokkos' stream (on a host build, where every
  // copy is done when queued, the host waits for those kernels). precede(stream): the work
  // queued from now on on `stream` (a cudaStream_t; null: Kokkos' stream) waits for the copies
  // queued so far (on a host build it does the deferred copies, if any).
  void follow_kernels();
  void precede(void* stream = nullptr);

 private:
  struct Deferred {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  void copy_or_defer(void* dst, const void* src, std::size_t bytes);
  void run_deferred();

  void* stream_ = nullptr;  // the cudaStream_t of a CUDA build
  void* event_ = nullptr;   // precede's cudaEvent_t, recorded again for each call
  bool defer_ = false;      // COLOSSAL_DEFER_COPIES (host builds)
  std::vector<Deferred> deferred_;
};

// Orders a CUDA stream (`stream`, a cudaStream_t) after the kernels queued so far on Kokkos'
// stream without the host waiting for them: an event recorded on Kokkos' stream that `stream`
// waits for. Where Kokkos has no CUDA stream (a host build) the host waits for the kernels
// instead (fence_kernels). The NCCL communicator runs it before each collective it enqueues, so
// its callers need no fence before handing it what the kernels wrote.
void order_after_kernels(void* stream);

// Peak resident set size of this process (VmHWM), in bytes; 0 where unknown.
std::size_t peak_rss_bytes();

// Bytes in use on the current GPU now (its total less its free memory, every process on it
// counted; cudaMemGetInfo, which does not wait for the device), in a build whose tensors live
// on a GPU; 0 elsewhere or where it cannot tell.
std::size_t device_used_bytes();

}  // namespace colossal::core
