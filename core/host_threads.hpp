// A small pool of host threads for the bandwidth-bound loops over all parameters (AdamW, the
// gradient norm, zeroing gradients) when Kokkos runs on the Serial backend (Debian's Kokkos 3.4):
// one core cannot saturate memory bandwidth, and those loops were a fifth of a 124M-parameter step
// while the second core waited. With a threaded Kokkos (OpenMP, CUDA) the kernels use Kokkos.
//
// Threads: COLOSSAL_HOST_THREADS, else OPENBLAS_NUM_THREADS, else the hardware concurrency; under
// mpirun with one rank per core, set either to 1.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

namespace colossal::core {

class HostThreads {
 public:
  explicit HostThreads(int threads);
  ~HostThreads();
  HostThreads(const HostThreads&) = delete;
  HostThreads& operator=(const HostThreads&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls part(begin, end) on contiguous parts of [0, n), one per thread (the caller takes the
  // first), and returns when all are done.
  void run(std::size_t n, const std::function<void(std::size_t, std::size_t)>& part);

  // The process's pool, sized from the environment on first use.
  static HostThreads& shared();

 private:
  void work(int index);
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::size_t, std::size_t)>* job_ = nullptr;
  std::size_t n_ = 0;
  unsigned generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// True when kernels run on the host's Serial backend, where HostThreads adds the parallelism.
constexpr bool kSerialHost = std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>;

}  // namespace colossal::core
