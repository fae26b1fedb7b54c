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
}  // namespace colossal::core
