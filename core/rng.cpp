#include "core/rng.hpp"

namespace colossal::core {

void fill_normal(float* dst, std::size_t count, float std, uint64_t seed, uint64_t stream,
                 uint64_t first_index) {
  Kokkos::parallel_for(
      "colossal::core::fill_normal", Kokkos::RangePolicy<>(0, count), KOKKOS_LAMBDA(std::size_t i) {
        dst[i] = std * random_normal(seed, stream, first_index + i);
      });
  fence_kernels();
}

}  // namespace colossal::core
