// The CPU's peak arithmetic, for MFU on the host: measured, since the clock a core reaches
// under load (its boost) is known to no file a process can read in a VM, and since the same
// binary runs on AVX2 laptops, AVX-512 servers and AMX Xeons.
#pragma once

#include <string>

namespace colossal::core {

class HostThreads;

struct CpuPeak {
  // fp32 FLOP/s of the threads measured together: independent multiply-adds on the widest
  // vectors the CPU has (AVX-512, else AVX2 with FMA, else 16-byte vectors), 2 FLOPs each,
  // each thread's best of kTrials trials of 20 ms after one to warm up. 0 where nothing was
  // measured (a CUDA-compiled build, whose products run on the GPU).
  double fp32_flops = 0.0;
  double best_thread = 0.0;  // the fastest thread's share of it: one core's rate, all cores busy
  int threads = 0;  // the threads that ran side by side (fewer than asked where a team is capped)
  std::string vectors;  // "AVX-512", "AVX2", "128-bit", or "" when not measured
};

constexpr int kTrials = 8;
constexpr double kTrialSeconds = 0.02;
// How long a measurement takes: the warm-up and kTrials trials.
constexpr double kMeasureSeconds = (kTrials + 1) * kTrialSeconds;

// Measures the peak of `threads`'s threads together, each on its own part, as they run the
// step's kernels (kMeasureSeconds; call from the main thread, outside a job).
CpuPeak measure_cpu_peak(HostThreads& threads);

// The bf16 units' peak over the fp32 one, for CPU bf16 units named as host_bf16_hardware()
// names them (by the vendors' numbers per core and cycle): 16 with AMX-BF16 (1024 FLOPs against
// 2 x 16 fp32 FMAs), 2 with AVX512-BF16 (two products summed into each fp32 lane), 1 without
// either (bf16 products then run on the fp32 units).
double bf16_peak_multiple(const std::string& bf16_hardware);

}  // namespace colossal::core
