#include "apps/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/gemm.hpp"
#include "core/host_threads.hpp"
#include "core/kernels.hpp"
#include "core/layers.hpp"
#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/optimizer.hpp"

namespace colossal::apps {

namespace {
using Clock = std::chrono::steady_clock;

// Seconds per call of `work`, after one warm-up call: the fastest of 5 rounds, each repeating it
// until a fifth of `min_seconds` has passed. A rate is what the host can do; a round that another
// process interrupted says less about it than the fastest (one-pass averages measured a GEMM size
// at 0.6 GFLOP/s next to 130 on a busy host, and the planner then avoided that size).
template <class F>
double seconds_per_call(F&& work, double min_seconds = 0.25) {
  work();
  Kokkos::fence();
  double best = 0.0;
  for (int round = 0; round < 5; ++round) {
    int calls = 0;
    const auto start = Clock::now();
    double elapsed = 0.0;
    do {
      work();
      Kokkos::fence();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    } while (elapsed < min_seconds / 5);
    if (round == 0 || elapsed / calls < best) best = elapsed / calls;
  }
  return best;
}

// Values that are neither zero nor denormal, so every kernel runs its normal path.
void fill(core::DeviceArray<float>& a, float scale) {
  std::vector<float> host(a.size());
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = scale * float((i * 7919) % 1000) / 1000.0f;
  core::copy_to_device(a.data(), host.data(), host.size() * sizeof(float));
}

double total_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024.0;
    meminfo.ignore(256, '\n');
  }
  return 0.0;
}
}  // namespace

planner::HardwareSpec calibrate_host(parallel::Communicator& world,
                                     const std::string& gemm_backend) {
  planner::HardwareSpec h;
  h.name = "host (calibrated by colossal_plan --calibrate)";
  h.threads = core::HostThreads::shared().size();
  h.devices_per_node = std::max(1, core::available_cores() / std::max(1, h.threads));
  h.memory_bytes = total_memory_bytes() / h.devices_per_node;
  h.gemm_efficiency = 1.0;
  core::MemoryTracker tracker;
  auto gemm = core::make_default_gemm(gemm_backend);
  // GEMM: achieved FLOP/s against the FLOPs of one call, from attention-sized to MLP-sized.
  struct Shape { int M, N, K; };
  const Shape shapes[] = {{64, 64, 64},     {128, 128, 128},  {256, 256, 256},
                          {512, 768, 768},  {1024, 768, 768}, {1024, 3072, 768},
                          {2048, 2048, 2048}};
  core::DeviceArray<float> A(tracker, core::MemCategory::temporaries, 2048 * 3072),
      Bm(tracker, core::MemCategory::temporaries, 3072 * 2048),
      Cm(tracker, core::MemCategory::temporaries, 2048 * 3072);
  fill(A, 1.0f);
  fill(Bm, 0.5f);
  for (const Shape& s : shapes) {
    const double flops = 2.0 * s.M * s.N * s.K;
    const double t = seconds_per_call([&] {
      gemm->gemm(core::Trans::N, core::Trans::N, s.M, s.N, s.K, 1.0f, A.data(), s.K, Bm.data(),
                 s.N, 0.0f, Cm.data(), s.N);
    }, flops > 1e9 ? 0.5 : 0.2);
    h.gemm_curve.emplace_back(flops, flops / t);
  }
  h.fp32_flops = 0.0;
  for (const auto& point : h.gemm_curve) h.fp32_flops = std::max(h.fp32_flops, point.second);
  // Attention, forward + backward, counted as the step graph counts it (12 * pairs * head width).
  {
    const int B = 1, T = 512, C = 256, H = 4, hd = C / H;
    const double pairs = double(B) * H * T * T;
    core::DeviceArray<float> qkv(tracker, core::MemCategory::temporaries, B * T * 3 * C),
        att(tracker, core::MemCategory::temporaries, std::size_t(B) * H * T * T),
        atty(tracker, core::MemCategory::temporaries, B * T * C),
        dqkv(tracker, core::MemCategory::temporaries, B * T * 3 * C),
        datt(tracker, core::MemCategory::temporaries, std::size_t(H) * T * T),
        work(tracker, core::MemCategory::temporaries, core::fused_attention_work_floats());
    fill(qkv, 0.1f);
    fill(atty, 0.1f);
    const double dense = seconds_per_call([&] {
      core::attention_forward(*gemm, att.data(), atty.data(), qkv.data(), B, T, C, H);
      core::attention_backward(*gemm, dqkv.data(), datt.data(), atty.data(), qkv.data(), att.data(),
                               B, T, C, H);
    });
    h.attention_flops = 12.0 * pairs * hd / dense;
    const double fused = seconds_per_call([&] {
      core::fused_attention_forward(*gemm, att.data(), atty.data(), qkv.data(), work.data(), B, T,
                                    C, H);
      core::fused_attention_backward(*gemm, dqkv.data(), atty.data(), atty.data(), qkv.data(),
                                     att.data(), work.data(), B, T, C, H);
    });
    h.fused_attention_flops = 12.0 * pairs * hd / fused;
  }
  // Memory-bound work: layernorm (forward bytes 2NC, forward + backward counted as 3x) and GELU
  // (forward bytes 2NF, counted 3.5x with its recomputation in backward).
  {
    const int64_t N = 2048;
    const int C = 768, F = 3072;
    core::DeviceArray<float> x(tracker, core::MemCategory::temporaries, N * F),
        y(tracker, core::MemCategory::temporaries, N * F),
        dy(tracker, core::MemCategory::temporaries, N * F),
        stats(tracker, core::MemCategory::temporaries, 2 * N),
        w(tracker, core::MemCategory::temporaries, 2 * C), dw(tracker, core::MemCategory::temporaries, 2 * C);
    fill(x, 1.0f);
    fill(dy, 0.01f);
    fill(w, 1.0f);
    const double t = seconds_per_call([&] {
      core::kernels::layernorm_forward(y.data(), stats.data(), stats.data() + N, x.data(), w.data(),
                                 w.data() + C, N, C, 1e-5f);
      core::kernels::layernorm_backward(x.data() + N * C, dw.data(), dw.data() + C, dy.data(), x.data(),
                                  w.data(), stats.data(), stats.data() + N, N, C);
      core::kernels::gelu_forward(y.data(), x.data(), N * F);
      core::kernels::gelu_backward(dy.data(), x.data(), dy.data(), N * F);
    });
    const double counted = 3.0 * 4.0 * 2 * N * C + 3.5 * 4.0 * 2 * N * F;
    h.memory_bandwidth = counted / t;
  }
  // AdamW: 28 bytes per parameter (read p, g, m, v; write p, m, v).
  {
    const std::size_t n = std::size_t(1) << 22;
    std::vector<core::ParamSpec> table(1);
    table[0].name = "calibration";
    table[0].count = n;
    table[0].shape = {int64_t(n)};
    table[0].local_shape = {int64_t(n)};
    table[0].role = core::ParamRole::weight;
    core::AdamW adamw(table, n, tracker);
    core::DeviceArray<float> p(tracker, core::MemCategory::temporaries, n),
        g(tracker, core::MemCategory::temporaries, n);
    fill(p, 0.1f);
    fill(g, 0.01f);
    int64_t step = 0;
    const double t = seconds_per_call([&] {
      adamw.update(p.data(), g.data(), core::AdamWParams{}, ++step, 1.0f);
    });
    h.optimizer_bandwidth = 28.0 * double(n) / t;
  }
  // The link between two ranks of this node: ping-pong of 1 float (latency) and 4 Mi floats.
  if (world.size() >= 2) {
    auto round_trip = [&](std::size_t floats) {
      std::vector<float> buffer(floats, 1.0f);
      const int me = world.rank();
      return seconds_per_call([&] {
        if (me == 0) {
          world.send(buffer, 1, 7);
          world.recv(buffer, 1, 8);
        } else if (me == 1) {
          world.recv(buffer, 0, 7);
          world.send(buffer, 0, 8);
        }
      }, 0.0) ;
    };
    // Every rank runs the same number of calls: fixed counts rather than a time limit.
    double small = 0.0, large = 0.0;
    for (int i = 0; i < 200; ++i) small += round_trip(1);
    for (int i = 0; i < 10; ++i) large += round_trip(std::size_t(1) << 22);
    small /= 200;
    large /= 10;
    h.intra_node.latency_s = small / 2;
    h.intra_node.bandwidth_Bps = 4.0 * double(std::size_t(1) << 22) / (large / 2 - small / 2);
  } else {
    const std::size_t n = std::size_t(1) << 24;
    std::vector<char> a(n, 1), b(n, 0);
    const double t = seconds_per_call([&] { std::memcpy(b.data(), a.data(), n); });
    h.intra_node = {2e-6, double(n) / t};  // latency: a typical shared-memory MPI message
  }
  h.inter_node = h.intra_node;  // one node: nothing else to measure
  return h;
}

}  // namespace colossal::apps
