#include "core/parameter_store.hpp"

#include "core/kokkos_compat.hpp"
#include "core/optimizer.hpp"

namespace colossal::core {

FullParameterStore::FullParameterStore(std::vector<ParamUnit> units, std::size_t flat_size,
                                       MemoryTracker& tracker)
    : ParameterStore(std::move(units), flat_size),
      params_(tracker, MemCategory::parameters, flat_size),
      grads_(tracker, MemCategory::gradients, flat_size) {}

void FullParameterStore::gradients_done(int unit) {
  // The hook orders what it starts after the kernels (zero::GradientSync::gradients_ready).
  if (gradients_ready_) gradients_ready_(units()[unit].begin);
}

void FullParameterStore::zero_gradients() { zero(grads_.data(), grads_.size()); }

}  // namespace colossal::core
