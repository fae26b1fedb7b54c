// colossal_bench: the GEMM ceiling at a model's shapes and our training throughput against it.
// Prints one table; run it through bench/run_bench.sh to put PyTorch beside it in the same run.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/gemm.hpp"
#include "core/kernels.hpp"
#include "core/layers.hpp"
#include "core/memory.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"

using namespace colossal::core;
using Clock = std::chrono::steady_clock;

namespace {

struct Case {
  std::string name;
  ModelSpec spec;
  int batch, seq_len;
};

ModelSpec small_gpt(int layers, int hidden, int heads, int max_seq) {
  return model_spec(Arch::gpt2, layers, hidden, heads, 4 * hidden, 256, max_seq);
}

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Whether arrays live in device memory (a Kokkos CUDA build): then operands are device arrays,
// the clock is read after a fence, and the host-only tables are refused.
constexpr bool kDevice = device_memory_v<Kokkos::DefaultExecutionSpace>;

// An operand of `count` floats, all `value`, in the default execution space's memory.
DeviceArray<float> filled(MemoryTracker& tracker, std::size_t count, float value) {
  DeviceArray<float> a(tracker, MemCategory::temporaries, count);
  a.fill(value);
  return a;
}

// FLOP-weighted sgemm rate over the forward GEMMs of one block and the LM head (the shapes the
// training step spends its time in), after a warm-up call each.
double gemm_ceiling(Gemm& gemm, const Case& c, int repeats) {
  const int N = c.batch * c.seq_len, C = c.spec.hidden, F = c.spec.ffn_hidden, V = c.spec.vocab;
  const int shapes[5][2] = {{C, 3 * C}, {C, C}, {C, F}, {F, C}, {C, V}};
  double flops = 0, time = 0;
  MemoryTracker tracker;
  for (const auto& s : shapes) {
    DeviceArray<float> a = filled(tracker, std::size_t(N) * s[0], 0.01f),
                       b = filled(tracker, std::size_t(s[0]) * s[1], 0.02f),
                       out = filled(tracker, std::size_t(N) * s[1], 0.0f);
    gemm.gemm(Trans::N, Trans::N, N, s[1], s[0], 1.0f, a.data(), s[0], b.data(), s[1], 0.0f,
              out.data(), s[1]);
    Kokkos::fence();
    const auto t0 = Clock::now();
    for (int r = 0; r < repeats; ++r) {
      gemm.gemm(Trans::N, Trans::N, N, s[1], s[0], 1.0f, a.data(), s[0], b.data(), s[1], 0.0f,
                out.data(), s[1]);
    }
    Kokkos::fence();
    time += seconds(t0);
    flops += 2.0 * N * s[0] * s[1] * repeats;
  }
  return flops / time;
}

// GFLOP/s of one product, best of `repeats` after a warm-up call.
double gemm_rate(Gemm& gemm, Trans ta, Trans tb, int M, int N, int K, int repeats) {
  MemoryTracker tracker;
  DeviceArray<float> a = filled(tracker, std::size_t(M) * K, 0.01f),
                     b = filled(tracker, std::size_t(K) * N, 0.02f),
                     out = filled(tracker, std::size_t(M) * N, 0.0f);
  const int lda = ta == Trans::N ? K : M, ldb = tb == Trans::N ? N : K;
  double best = 1e300;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = Clock::now();
    gemm.gemm(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, out.data(), N);
    Kokkos::fence();
    if (r > 0) best = std::min(best, seconds(t0));
  }
  return 2.0 * M * N * K / best / 1e9;
}

// A backend by its table name: a host backend or "cublas" (host arrays staged through the GPU),
// optionally with "-bf16" (bf16 operands, fp32 sums).
std::unique_ptr<Gemm> named_gemm(const std::string& name) {
  if (name == "cublas-tf32") return make_default_gemm("cublas", GemmPrecision::fp32, true);
  const bool bf16 = name.size() > 5 && name.substr(name.size() - 5) == "-bf16";
  return make_default_gemm(bf16 ? name.substr(0, name.size() - 5) : name,
                           bf16 ? GemmPrecision::bf16 : GemmPrecision::fp32);
}

// The host backends that load here, with oneDNN's bf16 GEMM and the bf16 emulation over OpenBLAS
// (both rounding their operands in every call) where the CPU has bf16 units, and cuBLAS in fp32
// and bf16 where a GPU is visible. In a Kokkos CUDA build: cuBLAS on device arrays in fp32, TF32
// and bf16 (operands rounded on the device in every call, as for activations; the held
// parameters are rounded once per forward).
std::vector<std::string> table_backends() {
  if (kDevice) return {"cublas", "cublas-tf32", "cublas-bf16"};
  std::vector<std::string> names = host_gemm_backends();
  try {
    make_native_bf16_gemm();
    names.push_back("onednn-bf16");
    names.push_back("openblas-bf16");
  } catch (const std::exception&) {
  }
  try {
    named_gemm("cublas");
    names.push_back("cublas");
    names.push_back("cublas-bf16");
  } catch (const std::exception&) {
  }
  return names;
}

// The training step's GEMMs of one block and the LM head (forward, input gradient, weight
// gradient), each timed with every host backend; the last column is the FLOP-weighted total.
void gemm_backend_table(const Case& c, int repeats) {
  const int R = c.batch * c.seq_len, C = c.spec.hidden, F = c.spec.ffn_hidden, V = c.spec.vocab;
  struct Shape { const char* name; Trans ta, tb; int M, N, K; };
  const Shape shapes[] = {
      {"qkv fwd", Trans::N, Trans::N, R, 3 * C, C},  {"qkv dX", Trans::N, Trans::T, R, C, 3 * C},
      {"qkv dW", Trans::T, Trans::N, C, 3 * C, R},   {"proj fwd", Trans::N, Trans::N, R, C, C},
      {"fc fwd", Trans::N, Trans::N, R, F, C},       {"fc dX", Trans::N, Trans::T, R, C, F},
      {"fc dW", Trans::T, Trans::N, C, F, R},        {"fc2 fwd", Trans::N, Trans::N, R, C, F},
      {"fc2 dX", Trans::N, Trans::T, R, F, C},       {"fc2 dW", Trans::T, Trans::N, F, C, R},
      {"head fwd", Trans::N, Trans::T, R, V, C},     {"head dX", Trans::N, Trans::N, R, C, V},
      {"head dW", Trans::T, Trans::N, V, C, R},
      {"attn QK^T", Trans::N, Trans::T, c.seq_len, c.seq_len, C / c.spec.heads},
      {"attn PV", Trans::N, Trans::N, c.seq_len, C / c.spec.heads, c.seq_len}};
  const std::vector<std::string> names = table_backends();
  std::vector<std::unique_ptr<Gemm>> backends;
  std::printf("%s: GFLOP/s per training GEMM shape (M x N x K), best of %d\n%-10s %18s",
              c.name.c_str(), repeats, "shape", "M x N x K");
  for (const auto& n : names) {
    backends.push_back(named_gemm(n));
    std::printf(" %11s", n.c_str());
  }
  std::printf(" %11s\n", "best");
  std::vector<double> time(names.size(), 0.0);
  double best_time = 0.0;
  for (const Shape& s : shapes) {
    const double flops = 2.0 * s.M * s.N * s.K;
    char dims[32];
    std::snprintf(dims, sizeof dims, "%dx%dx%d", s.M, s.N, s.K);
    std::printf("%-10s %18s", s.name, dims);
    double best = 0.0;
    for (std::size_t b = 0; b < names.size(); ++b) {
      const double rate = gemm_rate(*backends[b], s.ta, s.tb, s.M, s.N, s.K, repeats);
      time[b] += flops / rate;
      best = std::max(best, rate);
      std::printf(" %11.1f", rate);
    }
    best_time += flops / best;
    std::printf(" %11.1f\n", best);
  }
  double total = 0.0;
  for (const Shape& s : shapes) total += 2.0 * s.M * s.N * s.K;
  std::printf("%-10s %18s", "weighted", "");
  for (double t : time) std::printf(" %11.1f", total / t);
  std::printf(" %11.1f\n\n", total / best_time);
}

// Milliseconds of f's best of n calls after a warm-up one, each between fences (device work
// done; nothing on the host).
template <class F>
double best_of(int n, F&& f) {
  double best = 1e300;
  for (int r = 0; r <= n; ++r) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    f();
    Kokkos::fence();
    if (r > 0) best = std::min(best, seconds(t0));
  }
  return best * 1e3;
}

// Causal attention of gpt2-124m's shape (12 heads of 64) at several sequence lengths, forward +
// backward: the dense path (stores B*H*T*T probabilities) against the tiled fused path at several
// tile sizes; milliseconds per call and the bytes each keeps between forward and backward.
void attention_table(Gemm& gemm) {
  const int C = 768, H = 12, tokens = 4096;
  std::printf("attention fwd+bwd, %d heads of %d, %d tokens per call: ms (activation MiB kept)\n",
              H, C / H, tokens);
  std::printf("%6s %4s %18s %18s %18s %18s\n", "T", "B", "dense", "fused tile 64",
              "fused tile 128", "fused tile 256");
  for (int T : {128, 256, 512, 1024, 2048}) {
    const int B = std::max(1, tokens / T);
    const std::size_t BT = std::size_t(B) * T;
    std::vector<float> qkv(BT * 3 * C), y(BT * C), dy(BT * C), dqkv(BT * 3 * C);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = float((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float((i * 104729) % 1000) * 1e-3f - 0.5f;
    std::printf("%6d %4d", T, B);
    {
      std::vector<float> att(BT * H * T), datt(std::size_t(H) * T * T);
      const double ms = best_of(2, [&] {
        attention_forward(gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
        attention_backward(gemm, dqkv.data(), datt.data(), dy.data(), qkv.data(), att.data(), B, T,
                           C, H);
      });
      std::printf(" %9.1f (%6.0f)", ms, double(att.size()) * 4 / 1048576.0);
    }
    for (int tile : {64, 128, 256}) {
      std::vector<float> lse(BT * H), work(fused_attention_work_floats(tile));
      const double ms = best_of(2, [&] {
        fused_attention_forward(gemm, lse.data(), y.data(), qkv.data(), work.data(), B, T, C, H,
                                tile);
        fused_attention_backward(gemm, dqkv.data(), dy.data(), y.data(), qkv.data(), lse.data(),
                                 work.data(), B, T, C, H, tile);
      });
      std::printf(" %9.1f (%6.2f)", ms, double(lse.size()) * 4 / 1048576.0);
    }
    std::printf("\n");
  }
}

// The device's forms at gpt2-124m's heads, 16384 tokens per call (a B=16, T=1024 step's):
// the dense path in fp32 (cuBLAS, B*H*T*T probabilities kept), the fused path in fp32 (Kokkos
// teams) and with q/k/v in bf16 (tensor cores, core/attention_tc.hpp). Milliseconds per forward
// + backward, the bytes kept between them, and the causal FLOP rate of the fused bf16 form
// (forward 2 products, backward 5, over the T(T+1)/2 query-key pairs).
void device_attention_table(Gemm& gemm) {
  const int C = 768, H = 12, hd = C / H, tokens = 16384;
  std::printf("attention fwd+bwd on the GPU, %d heads of %d, %d tokens per call: ms "
              "(activation MiB kept)\n", H, hd, tokens);
  std::printf("%6s %4s %18s %18s %18s %16s\n", "T", "B", "dense fp32", "fused fp32 teams",
              "fused bf16 tc", "tc TFLOP/s");
  MemoryTracker tracker;
  for (int T : {256, 512, 1024, 2048, 4096}) {
    const int B = std::max(1, tokens / T);
    const std::size_t BT = std::size_t(B) * T;
    std::vector<float> host(BT * 3 * C);
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = float((i * 7919) % 1000) * 2e-3f - 1.0f;
    std::vector<std::uint16_t> host16(host.size());
    to_bf16_bits(host.data(), host16.data(), host.size());
    DeviceArray<float> qkv(tracker, MemCategory::temporaries, host.size()),
        qkv16(tracker, MemCategory::temporaries, (host.size() + 1) / 2),
        y(tracker, MemCategory::temporaries, BT * C), dy(tracker, MemCategory::temporaries, BT * C),
        dqkv(tracker, MemCategory::temporaries, BT * 3 * C),
        lse(tracker, MemCategory::temporaries, BT * H);
    copy_to_device(qkv.data(), host.data(), host.size() * 4);
    copy_to_device(qkv16.data(), host16.data(), host16.size() * 2);
    copy_to_device(dy.data(), host.data(), BT * C * 4);
    const auto* q16 = reinterpret_cast<const std::uint16_t*>(qkv16.data());
    std::printf("%6d %4d", T, B);
    {
      const std::size_t att_floats = BT * H * T;
      try {
        DeviceArray<float> att(tracker, MemCategory::temporaries, att_floats),
            datt(tracker, MemCategory::temporaries, std::size_t(H) * T * T);
        const double ms = best_of(3, [&] {
          attention_forward(gemm, att.data(), y.data(), qkv.data(), B, T, C, H);
          attention_backward(gemm, dqkv.data(), datt.data(), dy.data(), qkv.data(), att.data(), B,
                             T, C, H);
        });
        std::printf(" %9.2f (%6.0f)", ms, double(att_floats) * 4 / 1048576.0);
      } catch (const std::exception&) {
        std::printf(" %18s", "out of memory");
      }
    }
    const double team_ms = best_of(3, [&] {
      model_fused_attention_forward(gemm, lse.data(), y.data(), qkv.data(), nullptr, B, T, C, H);
      model_fused_attention_backward(gemm, dqkv.data(), dy.data(), y.data(), qkv.data(),
                                     lse.data(), nullptr, B, T, C, H);
    });
    std::printf(" %9.2f (%6.2f)", team_ms, double(BT * H) * 4 / 1048576.0);
    const double tc_ms = best_of(3, [&] {
      model_fused_attention_forward(gemm, lse.data(), y.data(), q16, nullptr, B, T, C, H);
      model_fused_attention_backward(gemm, dqkv.data(), dy.data(), y.data(), q16, lse.data(),
                                     nullptr, B, T, C, H);
    });
    const double flops = 7.0 * 2.0 * double(B) * H * (double(T) * (T + 1) / 2) * hd;
    std::printf(" %9.2f (%6.2f) %16.1f\n", tc_ms, double(BT * H) * 4 / 1048576.0,
                flops / (tc_ms * 1e-3) / 1e12);
    std::fflush(stdout);
  }
}

struct TrainRate {
  double tokens_per_s, flops_per_s;
  std::size_t tracked_bytes;
};

// The trainer's step without data loading: zero grads, forward + backward, global norm, clipped
// AdamW. Two warm-up steps pay the first touch of every buffer. bf16 saves the activations only
// products read (and the probabilities) in bf16, as colossal_train does.
TrainRate train_rate(Gemm& gemm, const Case& c, int steps, bool bf16) {
  MemoryTracker tracker;
  Model model(c.spec, c.batch, c.seq_len, tracker, gemm,
              ModelOptions{.bf16_operands = bf16, .bf16_probabilities = bf16});
  model.init_parameters(1234);
  AdamW optimizer(model.parameters(), model.flat_size(), tracker);
  DeviceArray<int32_t> tokens(tracker, MemCategory::data, std::size_t(c.batch) * c.seq_len);
  DeviceArray<int32_t> targets(tracker, MemCategory::data, std::size_t(c.batch) * c.seq_len);
  std::vector<int32_t> host(tokens.size());
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = int32_t((i * 7919) % c.spec.vocab);
  copy_to_device(tokens.data(), host.data(), host.size() * 4);
  copy_to_device(targets.data(), host.data(), host.size() * 4);
  const AdamWParams hp{3e-4, 0.9, 0.95, 1e-8, 0.1};
  const float scale = 1.0f / float(c.batch * c.seq_len);
  auto step = [&](int64_t s) {
    model.zero_grad();
    model.forward(tokens.data(), targets.data(), c.batch, scale);
    model.backward(tokens.data(), c.batch);
    const double norm = std::sqrt(sum_of_squares(model.grads(), model.flat_size()));
    optimizer.update(model.params(), model.grads(), hp, s, float(clip_coefficient(norm, 1.0)));
  };
  step(1);
  step(2);
  const auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) step(3 + s);
  Kokkos::fence();
  const double t = seconds(t0) / steps;
  const double per_step = double(c.batch) * c.seq_len;
  return {per_step / t, flops_per_token(c.spec, c.seq_len) * per_step / t, tracker.peak_total()};
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, threads = 0, batch = 0, seq_len = 0;
  double peak_tflops = kDevice ? 989.0 : 0.0;
  bool table = false, attention = false, tf32 = false, fused = false;
  std::string backend = "openblas", precision = "fp32";
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help")) {
      std::printf(
          "usage: colossal_bench [--steps N] [--case NAME ...] [--gemm NAME] [--precision P]\n"
          "                      [--threads N] [--batch B] [--seq-len T] [--peak-tflops F] [--tf32]\n"
          "                      [--fused-attention] [--gemm-table | --attention]\n\n"
          "For each case (gpt2-124m B=4 T=256, quickstart B=16 T=128, tiny B=8 T=128) prints the\n"
          "sgemm ceiling at the model's GEMM shapes, our training tokens/s, achieved GFLOP/s\n"
          "(FLOPs per token = 6N + 12 L T d, N = 12 L d^2 + 13 L d + 2 d + V d) and its share of the\n"
          "ceiling, and the tracked memory peak. Run through bench/run_bench.sh to compare with\n"
          "PyTorch in the same run.\n\n"
          "  --gemm NAME    GEMM backend: openblas (default), blis, onednn, auto, or cublas\n"
          "                 (CUDA builds: host arrays multiplied on the GPU)\n"
          "  --precision P  fp32 (default) or bf16 (operands rounded to bfloat16, fp32 sums:\n"
          "                 tensor cores with cublas; on the host oneDNN's AVX512-BF16 /\n"
          "                 AMX kernels where the CPU has them, else emulated)\n"
          "  --threads N    GEMM threads (default: OPENBLAS_NUM_THREADS, else 1)\n"
          "  --tf32         fp32 products on a GPU's TF32 tensor cores (train.tf32)\n"
          "  --batch B, --seq-len T\n"
          "                 every case's micro-batch and sequence length instead of its own\n"
          "                 (T at most the case's max_seq, 1024 for gpt2-124m)\n"
          "  --peak-tflops F\n"
          "                 adds an MFU column: model FLOP/s over F TFLOP/s (default 989, the\n"
          "                 H100/H200's dense bf16 peak, in Kokkos CUDA builds; none on the host)\n"
          "                 In a Kokkos CUDA build every array is on the GPU and the products run\n"
          "                 on cuBLAS; --gemm-table times cuBLAS fp32, TF32 and bf16 there,\n"
          "                 and --attention times the device's attention forms.\n"
          "  --gemm-table   instead, each case's training GEMM shapes timed with every host\n"
          "                 backend that loads here and cuBLAS fp32/bf16 where a GPU is visible\n"
          "                 (GFLOP/s, transfers included), the table behind hardware.gemm\n"
          "  --fused-attention\n"
          "                 train with model.fused_attention: true (on a GPU: the tensor-core\n"
          "                 attention in bf16, the Kokkos teams' in fp32)\n"
          "  --attention    instead, dense against tiled fused causal attention (fwd + bwd) at\n"
          "                 T = 128..2048, gpt2-124m's heads, 4096 tokens per call; on a GPU\n"
          "                 the dense fp32, fused fp32 (teams) and fused bf16 (tensor cores)\n"
          "                 forms at T = 256..4096, 16384 tokens per call\n");
      return 0;
    }
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--case") && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else if (!std::strcmp(argv[i], "--gemm") && i + 1 < argc) {
      backend = argv[++i];
    } else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc) {
      precision = argv[++i];
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) {
      batch = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seq-len") && i + 1 < argc) {
      seq_len = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--peak-tflops") && i + 1 < argc) {
      peak_tflops = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--tf32")) {
      tf32 = true;
    } else if (!std::strcmp(argv[i], "--gemm-table")) {
      table = true;
    } else if (!std::strcmp(argv[i], "--attention")) {
      attention = true;
    } else if (!std::strcmp(argv[i], "--fused-attention")) {
      fused = true;
    } else {
      std::fprintf(stderr, "colossal_bench: unknown argument '%s'; see --help\n", argv[i]);
      return 2;
    }
  }
  if (steps < 1 || batch < 0 || seq_len < 0 || peak_tflops < 0) {
    std::fprintf(stderr, "colossal_bench: --steps must be >= 1 and --batch, --seq-len, "
                         "--peak-tflops >= 0; see --help\n");
    return 2;
  }
  int kokkos_argc = 1;  // our flags are not Kokkos's (it would claim --threads)
  Kokkos::ScopeGuard kokkos(kokkos_argc, argv);
  if (threads < 1) {
    const char* env = std::getenv("OPENBLAS_NUM_THREADS");
    threads = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 1;
  }
  set_blas_threads(threads);
  std::unique_ptr<Gemm> gemm;
  try {
    gemm = make_default_gemm(backend, gemm_precision(precision), tf32);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossal_bench: --gemm %s --precision %s: %s\n", backend.c_str(),
                 precision.c_str(), e.what());
    return 2;
  }
  std::vector<Case> cases = {{"gpt2-124m", *find_preset("gpt2-124m"), 4, 256},
                             {"quickstart", small_gpt(4, 256, 8, 128), 16, 128},
                             {"tiny", small_gpt(4, 256, 4, 128), 8, 128}};
  for (const std::string& name : only) {
    if (std::none_of(cases.begin(), cases.end(), [&](const Case& c) { return c.name == name; })) {
      std::fprintf(stderr, "colossal_bench: --case '%s' is not a case (gpt2-124m, quickstart, "
                   "tiny); see --help\n", name.c_str());
      return 2;
    }
  }
  for (Case& c : cases) {
    c.spec.fused_attention = fused;
    if (batch > 0) c.batch = batch;
    if (seq_len > 0) {
      if (seq_len > c.spec.max_seq) {
        if (!only.empty() &&
            std::find(only.begin(), only.end(), c.name) == only.end()) continue;
        std::fprintf(stderr, "colossal_bench: --seq-len %d is above %s's max_seq %d\n", seq_len,
                     c.name.c_str(), c.spec.max_seq);
        return 2;
      }
      c.seq_len = seq_len;
    }
  }
  if (attention) {
    if (kDevice) {
      device_attention_table(*gemm);
    } else {
      attention_table(*gemm);
    }
    return 0;
  }
  if (table) {
    if (kDevice) std::printf("GEMM GFLOP/s on device arrays (bf16: both operands rounded in the call)\n");
    for (const auto& c : cases) {
      if (only.empty() || std::find(only.begin(), only.end(), c.name) != only.end()) {
        gemm_backend_table(c, 3);
      }
    }
    return 0;
  }
  std::printf("gemm %s, %d thread(s), arrays in %s memory\n", gemm->name().c_str(), threads,
              kDevice ? "device" : "host");
  std::printf("%-11s %9s %9s %11s %10s %9s %11s %12s%s\n", "case", "params", "B x T",
              "sgemm GF/s", "tokens/s", "GFLOP/s", "of ceiling", "tracked mem",
              peak_tflops > 0 ? "      MFU" : "");
  for (const auto& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
    // The ceiling on a backend of its own, gone before training: what it converted or tuned
    // for its arrays (a bf16 copy of the LM head's fp32 weight, 77 MB at gpt2-124m) is not
    // the training run's, whose peak RSS run_bench.sh compares.
    auto fresh = [&] { return make_default_gemm(backend, gemm_precision(precision), tf32); };
    const double ceiling = gemm_ceiling(*fresh(), c, 3);
    const bool bf16 = gemm_precision(precision) == GemmPrecision::bf16;
    const TrainRate r = train_rate(*fresh(), c, steps, bf16);
    char shape[32];
    std::snprintf(shape, sizeof shape, "%dx%d", c.batch, c.seq_len);
    std::printf("%-11s %8.1fM %9s %11.1f %10.1f %9.1f %10.1f%% %12s", c.name.c_str(),
                parameter_count(c.spec) / 1e6, shape, ceiling / 1e9, r.tokens_per_s,
                r.flops_per_s / 1e9, 100.0 * r.flops_per_s / ceiling,
                format_bytes(double(r.tracked_bytes)).c_str());
    if (peak_tflops > 0) std::printf(" %8.1f%%", 100.0 * r.flops_per_s / (peak_tflops * 1e12));
    std::printf("\nRESULT peer=colossal preset=%s precision=%s%s%s B=%d T=%d tokens_per_s=%.2f\n",
                c.name.c_str(), precision.c_str(), tf32 ? "+tf32" : "",
                fused ? " attention=fused" : "", c.batch, c.seq_len, r.tokens_per_s);
    std::fflush(stdout);
  }
  std::printf("peak RSS %s\n", format_bytes(double(peak_rss_bytes())).c_str());
  return 0;
}
