#include "core/cpu_peak.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "core/host_threads.hpp"

namespace colossal::core {

double bf16_peak_multiple(const std::string& bf16_hardware) {
  if (bf16_hardware.find("AMX-BF16") != std::string::npos) return 16.0;
  if (bf16_hardware.find("AVX512-BF16") != std::string::npos) return 2.0;
  return 1.0;
}

// nvcc's front end crashed on arrays of GNU vectors here; a CUDA-compiled build multiplies on
// the GPU and takes its peak from the hardware spec, so it measures nothing.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define COLOSSAL_MEASURES_CPU_PEAK 1

namespace {

typedef float Floats512 __attribute__((vector_size(64)));
typedef float Floats256 __attribute__((vector_size(32)));
typedef float Floats128 __attribute__((vector_size(16)));

// `rounds` rounds of `Chains` independent multiply-adds on vectors of V (contracted into FMAs
// where the CPU has them: the project compiles with GCC's default -ffp-contract=fast); returns a
// sum of every chain so that none is optimised away. Chains in flight: 2 units x up to 6 cycles
// of latency, within the registers (16 with AVX-512's 32, 12 with AVX2's 16: 16 chains spilled
// three of them there and read 40% low).
template <class V, int Chains>
[[gnu::always_inline]] inline float multiply_adds(long rounds, float seed) {
  V chain[Chains];
  for (int i = 0; i < Chains; ++i) chain[i] = V{} + seed * float(i + 1);
  const V a = V{} + 0.999f, b = V{} + 1e-6f;
  for (long r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int i = 0; i < Chains; ++i) chain[i] = chain[i] * a + b;
  }
  V sum = chain[0];
  for (int i = 1; i < Chains; ++i) sum += chain[i];
  float out = 0.0f;
  for (int j = 0; j < int(sizeof(V) / sizeof(float)); ++j) out += sum[j];
  return out;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) float multiply_adds_512(long rounds, float seed) {
  return multiply_adds<Floats512, 16>(rounds, seed);
}
__attribute__((target("avx2,fma"))) float multiply_adds_256(long rounds, float seed) {
  return multiply_adds<Floats256, 12>(rounds, seed);
}
#endif
float multiply_adds_128(long rounds, float seed) {
  return multiply_adds<Floats128, 12>(rounds, seed);
}

struct Kernel {
  float (*run)(long, float) = multiply_adds_128;
  int lanes = 4;
  int chains = 12;
  const char* name = "128-bit";
};

Kernel widest_kernel() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {multiply_adds_512, 16, 16, "AVX-512"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {multiply_adds_256, 8, 12, "AVX2"};
  }
#endif
  return {};
}

// One thread's best rate over `trials` trials of about `seconds` each, after one trial that
// brings the core to its clock (and, on some CPUs, its wide units out of their low-power state).
// The best of several: a trial the scheduler cut into (another process, a rank waking) reads low.
// A fixed number, the same for every thread, so they all run for the same time, side by side: a
// thread that went on alone would have its core's sibling and the turbo clock to itself.
double thread_rate(const Kernel& kernel, int trials, double seconds) {
  using Clock = std::chrono::steady_clock;
  constexpr long kRounds = 1L << 13;
  const double flops_per_call = double(kRounds) * kernel.chains * kernel.lanes * 2.0;
  volatile float sink = 1e-3f;
  double best = 0.0;
  for (int t = 0; t <= trials; ++t) {
    const auto start = Clock::now();
    long calls = 0;
    double elapsed = 0.0;
    do {
      // The seed is read from the volatile each call, so no call can be hoisted out of the loop.
      sink = kernel.run(kRounds, sink) * 1e-9f + 1e-3f;
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < seconds);
    if (t > 0) best = std::max(best, flops_per_call * double(calls) / elapsed);
  }
  return best;
}

}  // namespace
#endif

CpuPeak measure_cpu_peak(HostThreads& threads) {
  CpuPeak peak;
#ifdef COLOSSAL_MEASURES_CPU_PEAK
  const Kernel kernel = widest_kernel();
  const auto parts = static_cast<std::size_t>(threads.size());
  std::vector<double> rates(parts, 0.0);
  std::vector<std::thread::id> ran_on(parts);
  // One item per thread: every thread measures at once, at the clock they reach together.
  threads.run(
      parts,
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          rates[i] = thread_rate(kernel, kTrials, kTrialSeconds);
          ran_on[i] = std::this_thread::get_id();
        }
      },
      1, 1);
  // Items that one thread ran one after the other were not measured side by side: count each
  // thread once (its best item), so a team smaller than asked for is not summed twice.
  std::vector<std::pair<std::thread::id, double>> by_thread;
  for (std::size_t i = 0; i < parts; ++i) {
    auto it = std::find_if(by_thread.begin(), by_thread.end(),
                           [&](const auto& t) { return t.first == ran_on[i]; });
    if (it == by_thread.end()) {
      by_thread.emplace_back(ran_on[i], rates[i]);
    } else {
      it->second = std::max(it->second, rates[i]);
    }
  }
  for (const auto& t : by_thread) {
    peak.fp32_flops += t.second;
    peak.best_thread = std::max(peak.best_thread, t.second);
  }
  peak.threads = int(by_thread.size());
  peak.vectors = kernel.name;
#else
  (void)threads;
#endif
  return peak;
}

}  // namespace colossal::core
