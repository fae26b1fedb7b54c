#include "core/parameter_store.hpp"

#include <stdexcept>
#include <string>

#include "core/kokkos_compat.hpp"
#include "core/optimizer.hpp"

namespace colossal::core {

FullParameterStore::FullParameterStore(std::vector<ParamUnit> units, std::size_t flat_size,
                                       MemoryTracker& tracker, bool gradients)
    : ParameterStore(std::move(units), flat_size),
      params_(tracker, MemCategory::parameters, flat_size),
      grads_(tracker, MemCategory::gradients, gradients ? flat_size : 0),
      has_gradients_(gradients) {}

float* FullParameterStore::gradients(int unit) {
  if (!has_gradients_) {
    throw std::logic_error("an inference parameter store holds no gradients (unit " +
                           std::to_string(unit) + " asked for them)");
  }
  return grads_.data() + units()[unit].begin;
}

float* host_writable_params(ParameterStore& store) {
  if (device_memory_v<Kokkos::DefaultExecutionSpace>) return nullptr;
  auto* full = dynamic_cast<FullParameterStore*>(&store);
  return full != nullptr ? full->full_params() : nullptr;
}

void FullParameterStore::gradients_done(int unit) {
  // The hook orders what it starts after the kernels (zero::GradientSync::gradients_ready).
  if (gradients_ready_) gradients_ready_(units()[unit].begin);
}

void FullParameterStore::zero_gradients() {
  if (has_gradients_) zero(grads_.data(), grads_.size());
}

}  // namespace colossal::core
