// Host GEMM backends. OpenBLAS is linked (cblas); BLIS and oneDNN are loaded at run time with
// dlopen(RTLD_LOCAL) when their shared libraries are installed, so one binary offers all three
// without link-time symbol clashes: BLIS also exports cblas_* and sgemm_, and with RTLD_LOCAL
// neither its nor OpenBLAS's copies can interpose on the other. BLIS is called through its own
// typed API (bli_sgemm), not its cblas layer, whose sgemm_ call could bind to OpenBLAS's.
#include <cblas.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/gemm.hpp"
#include "core/dnnl_matmul.hpp"
#include "core/gemm_stable.hpp"
#include "core/host_threads.hpp"
#include "core/shared_library.hpp"

namespace colossal::core {
namespace {

int g_blas_threads = 1;

CBLAS_TRANSPOSE to_cblas(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

// Products of fewer FLOPs than this (an attention head's scores at short T: 128x128x32 is 1
// MFLOP) gain little from a multithreaded GEMM, whose threads synchronise on every call: a batch
// of them runs one product per host thread, each single-threaded.
constexpr double kSmallProductFlops = 8.0e6;

// product(i) for every i in [0, batch): in order, on the GEMM's own threads, when each product has
// `flops` >= kSmallProductFlops (or there is one host thread or one product); else spread over
// the host threads, each calling set_threads(1) first (set_threads(g_blas_threads) after).
template <class Product, class SetThreads>
void run_batch(int batch, double flops, const Product& product, const SetThreads& set_threads) {
  HostThreads& pool = HostThreads::shared();
  if (pool.size() == 1 || batch < 2 || flops >= kSmallProductFlops) {
    for (int i = 0; i < batch; ++i) product(std::size_t(i));
    return;
  }
  pool.run(
      std::size_t(batch),
      [&](std::size_t, std::size_t begin, std::size_t end) {
        set_threads(1);
        for (std::size_t i = begin; i < end; ++i) product(i);
      },
      /*grain=*/1, /*align=*/1);
  set_threads(g_blas_threads);
}

// Every backend's batched product is a loop of single products: large ones use the GEMM's own
// threads, small ones are spread over the host threads.
class LoopedBatchGemm : public Gemm {
 public:
  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    run_batch(
        batch, 2.0 * M * N * K,
        [&](std::size_t i) {
          gemm(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
               C + i * stride_c, ldc);
        },
        [&](int threads) { set_calling_thread_threads(threads); });
  }

 protected:
  // Threads of the GEMMs this thread calls from now on (OpenBLAS's and BLIS's setting is global,
  // OpenMP's, used by oneDNN, per thread).
  virtual void set_calling_thread_threads(int threads) = 0;
};

class OpenBlasGemm final : public LoopedBatchGemm {
 public:
  std::string name() const override { return "openblas"; }
  void set_calling_thread_threads(int threads) override { openblas_set_num_threads(threads); }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    if (M == 1 && N > 0 && K > 0) {
      // One row (incremental decoding's products): a matrix-vector product reads B once, where
      // OpenBLAS 0.3.21's sgemm packs all of B first (gpt2-124m's decoding spent 71% of its time
      // in the packing). C = op(A) op(B) as y = op(B)^T x; A's row has stride 1, or lda as a
      // column. y is zeroed first when beta is 0, so that nothing of what C held survives.
      const int incx = ta == Trans::N ? 1 : lda;
      if (beta == 0.0f) std::fill(C, C + N, 0.0f);
      if (tb == Trans::N) {  // B (K, N): y = B^T x
        cblas_sgemv(CblasRowMajor, CblasTrans, K, N, alpha, B, ldb, A, incx, beta, C, 1);
      } else {  // B (N, K): y = B x
        cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, alpha, B, ldb, A, incx, beta, C, 1);
      }
      return;
    }
    cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
  }
};

// BLIS's typed API (blis.h): trans_t is an enum where transposition is bit 3; dim_t and inc_t
// are 64-bit integers in Debian's build (BLIS_INT_TYPE_SIZE 64). Row-major C = op(A) op(B) is
// expressed with row strides ld and column strides 1.
constexpr int kBlisNoTranspose = 0x0, kBlisTranspose = 0x8;
using BlisSgemm = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*,
                           int64_t, int64_t, const float*, int64_t, int64_t, const float*, float*,
                           int64_t, int64_t);
using BlisSetThreads = void (*)(int64_t);

class BlisGemm final : public LoopedBatchGemm {
 public:
  BlisGemm()
      : lib_({"libblis.so.4", "libblis.so"}),
        sgemm_(lib_.loaded() ? lib_.symbol<BlisSgemm>("bli_sgemm") : nullptr) {
    if (!lib_.loaded()) {
      throw std::runtime_error("GEMM backend blis: libblis.so.4 not found (Debian: apt-get "
                               "install libblis4-openmp)");
    }
    set_threads_ = lib_.symbol<BlisSetThreads>("bli_thread_set_num_threads");
    set_threads_(g_blas_threads);
  }
  std::string name() const override { return "blis"; }
  bool runs_on_openmp() const override { return true; }  // Debian's libblis4-openmp
  void set_calling_thread_threads(int threads) override { set_threads_(threads); }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    sgemm_(ta == Trans::N ? kBlisNoTranspose : kBlisTranspose,
           tb == Trans::N ? kBlisNoTranspose : kBlisTranspose, M, N, K, &alpha, A, lda, 1, B, ldb,
           1, &beta, C, ldc, 1);
  }

 private:
  SharedLibrary lib_;
  BlisSgemm sgemm_;
  BlisSetThreads set_threads_ = nullptr;
};

// oneDNN's C API: dnnl_sgemm is row-major with 'N'/'T' characters and returns a status (0 = ok).
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);
using OmpSetThreads = void (*)(int);

class OneDnnGemm final : public LoopedBatchGemm {
 public:
  OneDnnGemm()
      : lib_({"libdnnl.so.2", "libdnnl.so.3", "libdnnl.so"}),
        sgemm_(lib_.loaded() ? lib_.symbol<DnnlSgemm>("dnnl_sgemm") : nullptr) {
    if (!lib_.loaded()) {
      throw std::runtime_error("GEMM backend onednn: libdnnl.so.2 not found (Debian: apt-get "
                               "install libdnnl2)");
    }
    // oneDNN's CPU threads are OpenMP's (libgomp, a dependency of libdnnl found through it).
    set_threads_ = lib_.symbol<OmpSetThreads>("omp_set_num_threads");
    set_threads_(g_blas_threads);
  }
  std::string name() const override { return "onednn"; }
  bool runs_on_openmp() const override { return true; }
  void set_calling_thread_threads(int threads) override { set_threads_(threads); }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    const int status = sgemm_(ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T', M, N, K,
                              alpha, A, lda, B, ldb, beta, C, ldc);
    if (status != 0) {
      throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(status));
    }
  }

 private:
  SharedLibrary lib_;
  DnnlSgemm sgemm_;
  OmpSetThreads set_threads_ = nullptr;
};

// The CPU's bf16 arithmetic, from CPUID: AVX512-BF16 (leaf 7, sub-leaf 1, EAX bit 5) and AMX-BF16
// (leaf 7, sub-leaf 0, EDX bit 22). oneDNN asks the kernel for the AMX tile state itself.
struct Bf16Hardware {
  bool avx512_bf16 = false, amx_bf16 = false;
  bool any() const { return avx512_bf16 || amx_bf16; }
};
Bf16Hardware bf16_hardware() {
  Bf16Hardware hw;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) {
    hw.amx_bf16 = (d >> 22) & 1u;
    if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0) hw.avx512_bf16 = (a >> 5) & 1u;
  }
#endif
  return hw;
}

// oneDNN's bf16 GEMM (dnnl_gemm_bf16bf16f32: row-major, bf16 operands, fp32 C and sums), on the
// CPU's AVX512-BF16 or AMX units. Operands are rounded to bf16 by to_bf16_bits (round to nearest
// even, as the emulation does), so the result is the emulated one up to the order of the fp32
// sums. A batch converts its two operand spans once, then runs its products like every backend.
using DnnlGemmBf16 = int (*)(char, char, int64_t, int64_t, int64_t, float, const std::uint16_t*,
                             int64_t, const std::uint16_t*, int64_t, float, float*, int64_t);

class OneDnnBf16Gemm final : public MixedOperandGemm {
 public:
  OneDnnBf16Gemm()
      : lib_({"libdnnl.so.2", "libdnnl.so.3", "libdnnl.so"}),
        gemm_(lib_.loaded() ? lib_.symbol<DnnlGemmBf16>("dnnl_gemm_bf16bf16f32") : nullptr),
        hw_(bf16_hardware()) {
    if (!lib_.loaded()) {
      throw std::runtime_error("bf16 GEMM: libdnnl.so.2 not found (Debian: apt-get install "
                               "libdnnl2)");
    }
    if (!hw_.any()) {
      throw std::runtime_error("bf16 GEMM: this CPU has neither AVX512-BF16 nor AMX-BF16");
    }
    set_threads_ = lib_.symbol<OmpSetThreads>("omp_set_num_threads");
    set_threads_(g_blas_threads);
  }
  std::string name() const override {
    return std::string("onednn bf16 (") + (hw_.amx_bf16 ? "AMX-BF16" : "AVX512-BF16") + ")";
  }
  bool runs_on_openmp() const override { return true; }
  // A bf16 operand goes to oneDNN as it is; an fp32 one is converted (or served from the held
  // copy). A batch converts its two operand spans once, then runs its products.
  void gemm_mixed_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, GemmOperand A,
                          int lda, int64_t stride_a, GemmOperand B, int ldb, int64_t stride_b,
                          float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    const auto spans =
        copied_operand_spans("bf16 GEMM", ta, tb, M, N, K, lda, stride_a, ldb, stride_b, batch);
    if (!spans) return;
    const std::uint16_t* a = bits(a_, A, spans->a);
    const std::uint16_t* b = bits(b_, B, spans->b);
    if (matmul_ != nullptr && K > 0 &&
        matmul_->run(ta, tb, M, N, K, alpha, a, lda, stride_a, b, ldb, stride_b, beta, C, ldc,
                     stride_c, batch)) {
      return;
    }
    run_batch(
        batch, 2.0 * M * N * K,
        [&](std::size_t i) {
          const int status = gemm_(ta == Trans::N ? 'N' : 'T', tb == Trans::N ? 'N' : 'T', M, N,
                                   K, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                                   C + i * stride_c, ldc);
          if (status != 0) {
            throw std::runtime_error("dnnl_gemm_bf16bf16f32 failed with status " +
                                     std::to_string(status));
          }
        },
        set_threads_);
  }

  void hold_stable(const float* begin, std::size_t n, bool unchanged) override {
    stable_.hold(begin, n, unchanged);
  }
  bool keeps_stable_copy() const override { return true; }
  void set_stable_storage(std::uint16_t* storage, std::size_t capacity) override {
    stable_.use_storage(storage, capacity);
  }
  std::size_t stable_conversions() const override { return stable_.conversions(); }

 private:
  // The bf16 patterns of `span` values of an operand: its own when it is bf16, else converted.
  const std::uint16_t* bits(std::vector<std::uint16_t>& scratch, GemmOperand from,
                            std::size_t span) {
    return from.bf16 != nullptr ? from.bf16 : stable_.get(scratch, from.f32, span, to_bf16_bits);
  }
  SharedLibrary lib_;
  DnnlGemmBf16 gemm_;
  Bf16Hardware hw_;
  // oneDNN's matmul primitives, where this build has its headers; else dnnl_gemm_bf16bf16f32.
  std::unique_ptr<DnnlMatmul> matmul_ = DnnlMatmul::create(lib_, DnnlMatmul::Operands::bf16);
  OmpSetThreads set_threads_ = nullptr;
  std::vector<std::uint16_t> a_, b_;  // the bf16 bits of other operands, grown to the largest
  StableOperands<std::uint16_t> stable_;
};

// Per shape, the fastest of the available backends: the first product of each shape is run by
// every backend (best of two runs) and the winner serves that shape from then on. The first
// backend is the preferred one (oneDNN): another replaces it only when more than 10% faster, as
// single timings on a busy node are noisy and the preferred one was faster in every measured
// step (BLIS won isolated timings of some small shapes and lost the step: quickstart fp32 8970
// against 9300 tokens/s with oneDNN alone). With beta == 0 the trials write C itself (the last
// product overwrites it); with beta != 0 each runs on a scratch copy of C, except that a C over
// kMaxTunedBytes is not tuned (the preferred backend takes it): the LM head's weight gradient's
// copy raised gpt2-124m's peak RSS by 220 MB. Different backends round differently, so results
// are not bitwise reproducible from one run to the next; fixed backends are.
class AutoGemm final : public Gemm {
 public:
  explicit AutoGemm(std::vector<std::unique_ptr<Gemm>> backends)
      : backends_(std::move(backends)), wins_(backends_.size(), 0) {}
  bool runs_on_openmp() const override { return backends_.front()->runs_on_openmp(); }
  std::string name() const override {
    std::string s = "auto (";
    for (std::size_t b = 0; b < backends_.size(); ++b) {
      s += (b ? ", " : "") + backends_[b]->name() + " " + std::to_string(wins_[b]);
    }
    return s + " shapes)";
  }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    const Key key{ta, tb, M, N, K, lda, ldb, ldc, beta == 0.0f};
    auto it = choice_.find(key);
    if (it == choice_.end()) {
      it = choice_.emplace(key, tune(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)).first;
      ++wins_[it->second];
    }
    backends_[it->second]->gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  // The first product picks the shape's backend (tuning it if new); that backend runs the rest,
  // so the tuner's map is never touched from the host threads.
  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    if (batch < 1) return;
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const Key key{ta, tb, M, N, K, lda, ldb, ldc, beta == 0.0f};
    backends_[choice_.at(key)]->gemm_strided_batched(
        ta, tb, M, N, K, alpha, A + stride_a, lda, stride_a, B + stride_b, ldb, stride_b, beta,
        C + stride_c, ldc, stride_c, batch - 1);
  }

 private:
  using Key = std::tuple<Trans, Trans, int, int, int, int, int, int, bool>;
  static constexpr std::size_t kMaxTunedBytes = std::size_t(32) << 20;
  static constexpr double kMargin = 0.9;  // another backend must take under 0.9x the time

  std::size_t tune(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return 0;
    const std::size_t c_floats = std::size_t(M - 1) * ldc + N;
    const bool in_place = beta == 0.0f;
    if (!in_place && c_floats * sizeof(float) > kMaxTunedBytes) return 0;
    float* out = C;
    if (!in_place) {
      scratch_.resize(c_floats);
      out = scratch_.data();
    }
    std::size_t best = 0;
    double best_seconds = 1e300;
    for (std::size_t b = 0; b < backends_.size(); ++b) {
      double seconds = 1e300;
      for (int run = 0; run < 2; ++run) {
        if (!in_place) std::memcpy(out, C, c_floats * sizeof(float));
        const auto t0 = std::chrono::steady_clock::now();
        backends_[b]->gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, out, ldc);
        seconds = std::min(seconds, std::chrono::duration<double>(
                                        std::chrono::steady_clock::now() - t0).count());
      }
      if (b == 0 || seconds < kMargin * best_seconds) best_seconds = seconds, best = b;
    }
    scratch_ = {};
    return best;
  }
  std::vector<std::unique_ptr<Gemm>> backends_;
  std::vector<int> wins_;
  std::map<Key, std::size_t> choice_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::string> host_gemm_backends() {
  std::vector<std::string> out{"openblas"};
  for (const char* name : {"blis", "onednn"}) {
    try {
      make_host_gemm(name);
      out.push_back(name);
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::unique_ptr<Gemm> make_host_gemm(const std::string& backend) {
  if (backend == "openblas") return std::make_unique<OpenBlasGemm>();
  if (backend == "blis") return std::make_unique<BlisGemm>();
  if (backend == "onednn") return std::make_unique<OneDnnGemm>();
  if (backend == "auto") {  // the OpenMP backends if any loads, else OpenBLAS
    std::vector<std::unique_ptr<Gemm>> openmp;
    for (const std::string& name : host_gemm_backends()) {
      if (name != "openblas") openmp.push_back(make_host_gemm(name));
    }
    if (openmp.empty()) openmp.push_back(make_host_gemm("openblas"));
    // oneDNN first: the preferred backend that others must beat by a margin.
    std::stable_partition(openmp.begin(), openmp.end(),
                          [](const auto& g) { return g->name() == "onednn"; });
    return std::make_unique<AutoGemm>(std::move(openmp));
  }
  throw std::runtime_error("unknown host GEMM backend '" + backend +
                           "' (allowed: openblas, blis, onednn, auto)");
}

std::string host_bf16_hardware() {
  const Bf16Hardware hw = bf16_hardware();
  if (hw.amx_bf16 && hw.avx512_bf16) return "AMX-BF16, AVX512-BF16";
  if (hw.amx_bf16) return "AMX-BF16";
  return hw.avx512_bf16 ? "AVX512-BF16" : "";
}

std::unique_ptr<Gemm> make_native_bf16_gemm() { return std::make_unique<OneDnnBf16Gemm>(); }

namespace {
// The host backends whose bf16 products run on oneDNN where it loads (else the emulation).
bool tries_native_bf16(const std::string& backend) {
  return backend == "auto" || backend == "onednn";
}
}  // namespace

std::unique_ptr<Gemm> make_host_bf16_gemm(const std::string& backend) {
  std::string why;  // why bf16 is emulated, for the name the start-up line prints
  if (tries_native_bf16(backend)) {
    try {
      return make_native_bf16_gemm();
    } catch (const std::exception& e) {
      why = e.what();
      if (why.rfind("bf16 GEMM: ", 0) == 0) why = why.substr(11);
    }
  } else if (!host_bf16_hardware().empty()) {
    why = "hardware.gemm: " + backend + "; auto or onednn runs bf16 on this CPU's " +
          host_bf16_hardware();
  } else {
    why = "this CPU has neither AVX512-BF16 nor AMX-BF16";
  }
  return make_bf16_gemm(make_host_gemm(backend), why);
}

void set_blas_threads(int threads) {
  g_blas_threads = threads < 1 ? 1 : threads;
  openblas_set_num_threads(g_blas_threads);
}

std::unique_ptr<Gemm> make_default_gemm(const std::string& backend, GemmPrecision precision,
                                        bool tf32) {
  const bool bf16 = precision == GemmPrecision::bf16;
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>) {
    if (backend == "cublas") {
#ifdef COLOSSAL_HAVE_CUDA
      HostThreads::set_team(HostTeam::own);
      return make_cublas_host_gemm(precision, tf32);
#else
      throw std::runtime_error(
          "hardware.gemm: cublas needs a build with CUDA (this one has none); reconfigure with "
          "-DCOLOSSAL_ENABLE_CUDA=ON on a machine with the CUDA toolkit, or choose openblas, "
          "blis, onednn or auto");
#endif
    }
    std::unique_ptr<Gemm> gemm = bf16 ? make_host_bf16_gemm(backend) : make_host_gemm(backend);
    HostThreads::set_team(gemm->runs_on_openmp() ? HostTeam::openmp : HostTeam::own);
    return gemm;
  } else {
#ifdef COLOSSAL_HAVE_CUDA
    return make_cublas_gemm(precision, tf32);
#else
    (void)backend;
    (void)bf16;
    (void)tf32;
    throw std::runtime_error(
        "Kokkos runs on a device but colossal was built without CUDA; reconfigure with "
        "-DCOLOSSAL_ENABLE_CUDA=ON");
#endif
  }
}

bool default_gemm_keeps_copy(const std::string& backend, GemmPrecision precision) {
  if (precision != GemmPrecision::bf16) return false;
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>) {
    // As make_default_gemm chooses: oneDNN's bf16 (auto, onednn) where it loads and the CPU has
    // the units; the emulation and cuBLAS on staged host arrays hold nothing.
    if (!tries_native_bf16(backend)) return false;
    static const bool native = [] {
      try {
        make_native_bf16_gemm();
        return true;
      } catch (const std::exception&) {
        return false;
      }
    }();
    return native;
  } else {
    (void)backend;
    return true;  // cuBLAS rounding on the device
  }
}

}  // namespace colossal::core
