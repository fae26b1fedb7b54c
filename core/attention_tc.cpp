// The tensor-core attention's device kernels (core/attention_tc.hpp): a CUDA block runs a phase's
// elements over its threads and the products on WMMA. Compiled only by CUDA builds (Kokkos on
// CUDA, nvcc_wrapper); elsewhere the entry points say that no device is there.
#include "core/attention_tc.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)
#include <cuda_runtime.h>
#include <mma.h>
#endif

namespace colossal::core::tc {

#if defined(KOKKOS_ENABLE_CUDA) && defined(__CUDACC__)

namespace {

struct DeviceBlock {
  template <class F>
  __host__ __device__ void each(int n, F&& f) const {
#ifdef __CUDA_ARCH__
    for (int e = int(threadIdx.x); e < n; e += int(blockDim.x)) f(e);
#else
    (void)n;
    (void)f;
#endif
  }
  __host__ __device__ void sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
  // HostBlock::gemm's product, the 16 x 16 output tiles dealt to the warps.
  template <bool TransA, bool TransB>
  __host__ __device__ void gemm(int M, int N, int K, const std::uint16_t* A, int lda,
                                const std::uint16_t* B, int ldb, float* C, int ldc,
                                bool accumulate) const {
#ifdef __CUDA_ARCH__
    namespace w = nvcuda::wmma;
    using LayoutA = std::conditional_t<TransA, w::col_major, w::row_major>;
    using LayoutB = std::conditional_t<TransB, w::col_major, w::row_major>;
    const auto* a16 = reinterpret_cast<const __nv_bfloat16*>(A);
    const auto* b16 = reinterpret_cast<const __nv_bfloat16*>(B);
    __syncwarp();  // the warp reconverged after the phase before, for the .aligned WMMA calls
    const int warp = int(threadIdx.x) / 32, warps = int(blockDim.x) / 32;
    const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
    for (int tile = warp; tile < tiles; tile += warps) {
      const int i0 = (tile / tiles_n) * 16, j0 = (tile % tiles_n) * 16;
      w::fragment<w::accumulator, 16, 16, 16, float> c;
      if (accumulate) {
        w::load_matrix_sync(c, C + i0 * ldc + j0, unsigned(ldc), w::mem_row_major);
      } else {
        w::fill_fragment(c, 0.0f);
      }
      for (int k0 = 0; k0 < K; k0 += 16) {
        w::fragment<w::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa;
        w::fragment<w::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
        w::load_matrix_sync(fa, TransA ? a16 + k0 * lda + i0 : a16 + i0 * lda + k0, unsigned(lda));
        w::load_matrix_sync(fb, TransB ? b16 + j0 * ldb + k0 : b16 + k0 * ldb + j0, unsigned(ldb));
        w::mma_sync(c, fa, fb, c);
      }
      w::store_matrix_sync(C + i0 * ldc + j0, c, unsigned(ldc), w::mem_row_major);
    }
#else
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc;
    (void)accumulate;
#endif
  }
};

__global__ void __launch_bounds__(kTcThreads, 2) forward_kernel(TcArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  forward_block(DeviceBlock{}, a, smem, int(blockIdx.x));
}
__global__ void __launch_bounds__(kTcThreads) dkv_kernel(TcArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  dkv_block(DeviceBlock{}, a, smem, int(blockIdx.x));
}
__global__ void __launch_bounds__(kTcThreads) dq_kernel(TcArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  dq_block(DeviceBlock{}, a, smem, int(blockIdx.x));
}

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("tensor-core attention: ") + what + ": " +
                             cudaGetErrorString(error));
  }
}

int optin_shared_bytes(int device) {
  int bytes = 0;
  check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  return bytes;
}

std::size_t largest_bytes(int tile, int hs) {
  const std::size_t f = TcLayout(TcKernel::forward, tile, hs).bytes;
  const std::size_t kv = TcLayout(TcKernel::dkv, tile, hs).bytes;
  const std::size_t q = TcLayout(TcKernel::dq, tile, hs).bytes;
  return std::max(f, std::max(kv, q));
}

void launch(void (*kernel)(TcArgs), TcKernel which, const TcArgs& a, const char* name) {
  if (a.blocks() == 0) return;
  const std::size_t bytes = TcLayout(which, a.tile, a.C / a.H).bytes;
  // An error left by an earlier call would be reported as this launch's.
  const cudaError_t earlier = cudaGetLastError();
  if (earlier != cudaSuccess) {
    throw std::runtime_error(std::string("tensor-core attention: an earlier CUDA call failed "
                                         "before the ") + name + ": " +
                             cudaGetErrorString(earlier));
  }
  // The opt-in above 48 KiB, raised once per kernel and device (the attribute is the current
  // device's) to the most asked of it. A tile given by hand that the device cannot hold is
  // refused by name (the device's own choice, device_tile, always fits).
  struct DeviceLimits {
    int optin = -1;
    std::array<std::size_t, 3> allowed{};
  };
  static std::mutex mutex;
  static std::map<int, DeviceLimits> devices;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    DeviceLimits& limits = devices[device];
    if (limits.optin < 0) limits.optin = optin_shared_bytes(device);
    if (bytes > std::size_t(limits.optin)) {
      throw std::invalid_argument(
          std::string("tensor-core attention: ") + name + ": tile " + std::to_string(a.tile) +
          " at head size " + std::to_string(a.C / a.H) + " needs " + std::to_string(bytes) +
          " bytes of shared memory per block; this device offers " +
          std::to_string(limits.optin) + " (leave the tile to the device: 0)");
    }
    std::size_t& have = limits.allowed[std::size_t(which)];
    if (bytes > have) {
      check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
            name);
      have = bytes;
    }
  }
  kernel<<<a.blocks(), kTcThreads, bytes, Kokkos::Cuda().cuda_stream()>>>(a);
  check(cudaGetLastError(), name);
}

// The launch's arguments, its tile the device's choice unless given; check_tile refuses a head
// size or tile the kernels cannot take.
TcArgs args_for(int B, int T, int C, int H, int tile) {
  TcArgs a{.B = B, .T = T, .C = C, .H = H, .tile = tile > 0 ? tile : 64};
  check_tile(a);
  if (tile <= 0) a.tile = device_tile(C / H);
  return a;
}

}  // namespace

bool device_available() { return true; }

int device_tile(int hs) {
  static std::mutex mutex;
  static int device = -1, optin = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    int now = 0;
    check(cudaGetDevice(&now), "cudaGetDevice");
    if (now != device) {
      optin = optin_shared_bytes(now);
      device = now;
    }
  }
  for (int tile : {64, 32, 16}) {
    if (largest_bytes(tile, hs) <= std::size_t(optin)) return tile;
  }
  throw std::invalid_argument("tensor-core attention: head size " + std::to_string(hs) +
                              " needs more shared memory than the device offers (" +
                              std::to_string(optin) + " bytes per block)");
}

void device_forward(float* lse, float* atty, const std::uint16_t* qkv, int B, int T, int C, int H,
                    int tile) {
  TcArgs a = args_for(B, T, C, H, tile);
  a.qkv = qkv;
  a.vector_loads = tc_vector_loads(qkv, C);
  a.atty = atty;
  a.lse = lse;
  launch(forward_kernel, TcKernel::forward, a, "forward kernel");
}

void device_backward(float* dqkv, const float* datty, const float* atty,
                     const std::uint16_t* qkv, const float* lse, int B, int T, int C, int H,
                     int tile) {
  TcArgs a = args_for(B, T, C, H, tile);
  a.qkv = qkv;
  a.vector_loads = tc_vector_loads(qkv, C);
  a.atty = const_cast<float*>(atty);
  a.lse = const_cast<float*>(lse);
  a.datty = datty;
  a.dqkv = dqkv;
  launch(dkv_kernel, TcKernel::dkv, a, "dK/dV kernel");
  launch(dq_kernel, TcKernel::dq, a, "dQ kernel");
}

#else  // no CUDA

namespace {
[[noreturn]] void no_device() {
  throw std::logic_error(
      "tensor-core attention: this build has no CUDA device code (build with ./setup.sh --cuda)");
}
}  // namespace

bool device_available() { return false; }
int device_tile(int) { no_device(); }
void device_forward(float*, float*, const std::uint16_t*, int, int, int, int, int) { no_device(); }
void device_backward(float*, const float*, const float*, const std::uint16_t*, const float*, int,
                     int, int, int, int) {
  no_device();
}

#endif

}  // namespace colossal::core::tc
