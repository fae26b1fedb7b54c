// The one translation unit that instantiates the device (Kokkos::Cuda) forms of the header
// kernels; every other unit sees them `extern template`. See COLOSSAL_DEVICE_INSTANCE in
// core/kokkos_compat.hpp for why. In a build without CUDA this unit is empty.
#define COLOSSAL_DEVICE_KERNELS_INSTANTIATE

#include "core/adamw_team.hpp"
#include "core/attention_team.hpp"
#include "core/decode_kernels.hpp"
#include "core/grid_kernels_team.hpp"
#include "core/kernels.hpp"
#include "core/kernels_team.hpp"
#include "core/llama_kernels.hpp"
#include "core/llama_kernels_team.hpp"
#include "core/memory.hpp"
