#include "core/memory.hpp"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>
#include <type_traits>

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

namespace {
constexpr bool kHostMemory =
    std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>;
constexpr std::size_t kHugePage = 2u << 20;
}  // namespace

namespace detail {
void* allocate_bytes(std::size_t bytes, bool host) {
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

void free_bytes(void* ptr, std::size_t /*bytes*/, bool host) {
  if (kHostMemory || host) {
    std::free(ptr);
  } else {
    Kokkos::kokkos_free<Kokkos::DefaultExecutionSpace::memory_space>(ptr);
  }
}
}  // namespace detail

void copy_to_device(void* device_dst, const void* host_src, std::size_t bytes) {
  if constexpr (kHostMemory) {
    std::memcpy(device_dst, host_src, bytes);
  } else {
    using Dev = Kokkos::View<char*, Kokkos::DefaultExecutionSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using Host = Kokkos::View<const char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(Dev(static_cast<char*>(device_dst), bytes),
                      Host(static_cast<const char*>(host_src), bytes));
  }
}

void copy_to_host(void* host_dst, const void* device_src, std::size_t bytes) {
  if constexpr (kHostMemory) {
    std::memcpy(host_dst, device_src, bytes);
  } else {
    using Dev = Kokkos::View<const char*, Kokkos::DefaultExecutionSpace::memory_space,
                             Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    using Host = Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(Host(static_cast<char*>(host_dst), bytes),
                      Dev(static_cast<const char*>(device_src), bytes));
  }
}

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

}  // namespace colossal::core
