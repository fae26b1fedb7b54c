#include <cblas.h>

#include <stdexcept>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "core/gemm.hpp"

namespace colossal::core {
namespace {

CBLAS_TRANSPOSE to_cblas(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

class HostGemm final : public Gemm {
 public:
  std::string name() const override { return "openblas"; }
  void gemm(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc) override {
    cblas_sgemm(CblasRowMajor, to_cblas(ta), to_cblas(tb), M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
  }
  void gemm_strided_batched(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A,
                            int lda, int64_t stride_a, const float* B, int ldb, int64_t stride_b,
                            float beta, float* C, int ldc, int64_t stride_c, int batch) override {
    for (int i = 0; i < batch; ++i) {
      gemm(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
           C + i * stride_c, ldc);
    }
  }
};

}  // namespace

std::unique_ptr<Gemm> make_host_gemm() { return std::make_unique<HostGemm>(); }

void set_blas_threads(int threads) { openblas_set_num_threads(threads < 1 ? 1 : threads); }

std::unique_ptr<Gemm> make_default_gemm() {
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>) {
    return make_host_gemm();
  } else {
#ifdef COLOSSAL_HAVE_CUDA
    return make_cublas_gemm();
#else
    throw std::runtime_error(
        "Kokkos runs on a device but colossal was built without CUDA; reconfigure with "
        "-DCOLOSSAL_ENABLE_CUDA=ON");
#endif
  }
}

}  // namespace colossal::core
