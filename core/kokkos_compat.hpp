// Differences between Debian's Kokkos 3.4 and Kokkos 4.x that our kernels touch.
#pragma once

#include <Kokkos_Core.hpp>

#include <type_traits>

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

// True where the kernels take their device (team) forms: on the device, and on a threaded host
// space (OpenMP) too in a build configured with COLOSSAL_HOST_TEAM_KERNELS=ON (the `openmp`
// preset), which runs the model, its 2D/3D layouts and LLaMA through the team forms on real
// thread teams, so their dispatch, arguments and races are checked on a CPU
// (scripts/check_team_kernels.sh). Kokkos::Serial keeps the host forms: the tests' reference.
// Memory questions (who may read a pointer, chunk sizes, cuBLAS) stay with device_memory_v.
#ifdef COLOSSAL_HOST_TEAM_KERNELS
inline constexpr bool kHostTeamKernels = true;
#else
inline constexpr bool kHostTeamKernels = false;
#endif
template <class ExecSpace>
inline constexpr bool is_serial_v =
#ifdef KOKKOS_ENABLE_SERIAL
    std::is_same_v<ExecSpace, Kokkos::Serial>;
#else
    false;
#endif
template <class ExecSpace>
inline constexpr bool team_kernels_v =
    device_memory_v<ExecSpace> || (kHostTeamKernels && !is_serial_v<ExecSpace>);

// Waits for this rank's kernels: those of the default execution space instance, and cuBLAS, which
// runs on its stream (core/gemm_cublas.cpp). Not for a collective in flight on its own stream
// (NCCL's is non-blocking): Kokkos::fence() in Kokkos 3.4 is cudaDeviceSynchronize and would
// wait for those too, so a started reduce-scatter or gather could never overlap the next unit's
// kernels. Every fence inside the step (before a collective reads a buffer, before the host reads
// one, at unit boundaries) is this one; timings (the profiler, calibration) keep the global one.
// The staged transport's copy stream is a blocking one, ordered after these kernels anyway.
inline void fence_kernels() { Kokkos::DefaultExecutionSpace().fence(); }
}  // namespace colossal::core

// Kernel templates whose KOKKOS_LAMBDA runs on a CUDA device are instantiated for Kokkos::Cuda in
// one translation unit, core/device_kernels.cpp, and declared `extern template` everywhere else
// (the lists at the end of the kernel headers). Why: nvcc keeps a __host__ __device__ lambda's
// type-erasure pointers (__nv_hdl_helper's fp_copier, fp_deleter) in each translation unit's
// unnamed namespace, while the kernel functions and Kokkos' launch code that copy the lambda are
// merged across translation units by the linker. A copy made by one unit's merged code then calls
// another unit's pointer that nothing set: a jump to address 0, seen on an H200 in colossal_train
// (kernels::copy under pipeline parallelism, team::column_sums in the bias gradient) while the
// same kernels ran in the benchmark and the unit tests. One instance per kernel, one unit.
#ifdef KOKKOS_ENABLE_CUDA
#ifdef COLOSSAL_DEVICE_KERNELS_INSTANTIATE
#define COLOSSAL_DEVICE_INSTANCE template
#else
#define COLOSSAL_DEVICE_INSTANCE extern template
#endif
#endif
