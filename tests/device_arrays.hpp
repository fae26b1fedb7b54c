// Host <-> device copies of std::vectors for the tests that run kernels on a GPU (a Kokkos CUDA
// build, where these binaries start only with a GPU visible).
#pragma once

#include <vector>

#include <Kokkos_Core.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
namespace colossal::test {

using Dev = Kokkos::Cuda;

template <class T>
Kokkos::View<T*, Dev::memory_space> to_device(const std::vector<T>& h) {
  Kokkos::View<T*, Dev::memory_space> d("colossal::test::device", h.size());
  Kokkos::deep_copy(d, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                           h.data(), h.size()));
  return d;
}

template <class T>
std::vector<T> to_host(const Kokkos::View<T*, Dev::memory_space>& d) {
  std::vector<T> h(d.extent(0));
  Kokkos::deep_copy(
      Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(h.data(), h.size()), d);
  return h;
}

}  // namespace colossal::test
#endif  // KOKKOS_ENABLE_CUDA
