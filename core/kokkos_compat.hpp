// Differences between Debian's Kokkos 3.4 and Kokkos 4.x that our kernels touch.
#pragma once

#include <Kokkos_Core.hpp>

namespace colossal::core {
// Math functions moved from Kokkos::Experimental to Kokkos in 3.7.
#if KOKKOS_VERSION >= 30700
namespace kmath = ::Kokkos;
#else
namespace kmath = ::Kokkos::Experimental;
#endif

// True when ExecSpace's memory cannot be read by the host (CUDA's device memory): the kernels
// then take their device (team) forms, chosen at compile time, so host builds never compile them.
template <class ExecSpace>
inline constexpr bool device_memory_v =
    !Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
}  // namespace colossal::core
