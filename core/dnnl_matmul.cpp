#include "core/dnnl_matmul.hpp"

#include <cstdlib>
#include <string>

#include "core/host_threads.hpp"
#include "core/shared_library.hpp"

#ifdef COLOSSAL_HAVE_DNNL_MATMUL
#include <oneapi/dnnl/dnnl.h>

#include <bit>
#include <map>
#include <stdexcept>
#include <tuple>
#endif

namespace colossal::core {

#ifdef COLOSSAL_HAVE_DNNL_MATMUL
namespace {

// The C API's functions, looked up in the loaded library (their types from the headers).
struct DnnlApi {
#define COLOSSAL_DNNL_FN(name) decltype(&::name) name = nullptr
  COLOSSAL_DNNL_FN(dnnl_engine_create);
  COLOSSAL_DNNL_FN(dnnl_engine_destroy);
  COLOSSAL_DNNL_FN(dnnl_stream_create);
  COLOSSAL_DNNL_FN(dnnl_stream_wait);
  COLOSSAL_DNNL_FN(dnnl_stream_destroy);
  COLOSSAL_DNNL_FN(dnnl_memory_desc_init_by_strides);
  COLOSSAL_DNNL_FN(dnnl_matmul_desc_init);
  COLOSSAL_DNNL_FN(dnnl_primitive_attr_create);
  COLOSSAL_DNNL_FN(dnnl_primitive_attr_destroy);
  COLOSSAL_DNNL_FN(dnnl_primitive_attr_set_output_scales);
  COLOSSAL_DNNL_FN(dnnl_primitive_attr_set_post_ops);
  COLOSSAL_DNNL_FN(dnnl_post_ops_create);
  COLOSSAL_DNNL_FN(dnnl_post_ops_destroy);
  COLOSSAL_DNNL_FN(dnnl_post_ops_append_sum);
  COLOSSAL_DNNL_FN(dnnl_primitive_desc_create);
  COLOSSAL_DNNL_FN(dnnl_primitive_desc_destroy);
  COLOSSAL_DNNL_FN(dnnl_primitive_create);
  COLOSSAL_DNNL_FN(dnnl_primitive_destroy);
  COLOSSAL_DNNL_FN(dnnl_primitive_execute);
  COLOSSAL_DNNL_FN(dnnl_memory_create);
  COLOSSAL_DNNL_FN(dnnl_memory_set_data_handle);
  COLOSSAL_DNNL_FN(dnnl_memory_destroy);
#undef COLOSSAL_DNNL_FN

  explicit DnnlApi(const SharedLibrary& lib) {
#define COLOSSAL_DNNL_GET(name) name = lib.symbol<decltype(name)>(#name)
    COLOSSAL_DNNL_GET(dnnl_engine_create);
    COLOSSAL_DNNL_GET(dnnl_engine_destroy);
    COLOSSAL_DNNL_GET(dnnl_stream_create);
    COLOSSAL_DNNL_GET(dnnl_stream_wait);
    COLOSSAL_DNNL_GET(dnnl_stream_destroy);
    COLOSSAL_DNNL_GET(dnnl_memory_desc_init_by_strides);
    COLOSSAL_DNNL_GET(dnnl_matmul_desc_init);
    COLOSSAL_DNNL_GET(dnnl_primitive_attr_create);
    COLOSSAL_DNNL_GET(dnnl_primitive_attr_destroy);
    COLOSSAL_DNNL_GET(dnnl_primitive_attr_set_output_scales);
    COLOSSAL_DNNL_GET(dnnl_primitive_attr_set_post_ops);
    COLOSSAL_DNNL_GET(dnnl_post_ops_create);
    COLOSSAL_DNNL_GET(dnnl_post_ops_destroy);
    COLOSSAL_DNNL_GET(dnnl_post_ops_append_sum);
    COLOSSAL_DNNL_GET(dnnl_primitive_desc_create);
    COLOSSAL_DNNL_GET(dnnl_primitive_desc_destroy);
    COLOSSAL_DNNL_GET(dnnl_primitive_create);
    COLOSSAL_DNNL_GET(dnnl_primitive_destroy);
    COLOSSAL_DNNL_GET(dnnl_primitive_execute);
    COLOSSAL_DNNL_GET(dnnl_memory_create);
    COLOSSAL_DNNL_GET(dnnl_memory_set_data_handle);
    COLOSSAL_DNNL_GET(dnnl_memory_destroy);
#undef COLOSSAL_DNNL_GET
  }
};

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success) {
    throw std::runtime_error(std::string("oneDNN matmul: ") + what + " failed with status " +
                             std::to_string(int(status)));
  }
}

// The descriptor of a row-major operand op(X) (rows x cols; stored transposed when t is T),
// rows ld apart, `batch` matrices `stride` apart (a stride of 0 broadcasts one matrix).
dnnl_memory_desc_t operand_desc(const DnnlApi& api, dnnl_data_type_t type, Trans t, int rows,
                                int cols, int ld, int64_t stride, int batch) {
  dnnl_memory_desc_t md;
  const dnnl_dim_t row_stride = t == Trans::N ? ld : 1, col_stride = t == Trans::N ? 1 : ld;
  if (batch == 1) {
    const dnnl_dims_t dims{rows, cols}, strides{row_stride, col_stride};
    check(api.dnnl_memory_desc_init_by_strides(&md, 2, dims, type, strides), "memory desc");
  } else {
    const bool broadcast = stride == 0;
    const dnnl_dim_t one = dnnl_dim_t(t == Trans::N ? rows : cols) * ld;  // a matrix's extent
    const dnnl_dims_t dims{broadcast ? 1 : batch, rows, cols},
        strides{broadcast ? one : stride, row_stride, col_stride};
    check(api.dnnl_memory_desc_init_by_strides(&md, 3, dims, type, strides), "memory desc");
  }
  return md;
}

// C_i *= alpha over the host threads, one matrix row per item.
void scale(float* C, int M, int N, int ldc, int64_t stride_c, int batch, float alpha) {
  HostThreads::shared().run(
      std::size_t(batch) * std::size_t(M),
      [&](std::size_t, std::size_t begin, std::size_t end) {
        for (std::size_t r = begin; r < end; ++r) {
          float* row = C + int64_t(r / M) * stride_c + int64_t(r % M) * ldc;
          for (int j = 0; j < N; ++j) row[j] *= alpha;
        }
      },
      /*grain=*/64, /*align=*/1);
}

class DnnlMatmulImpl final : public DnnlMatmul {
 public:
  DnnlMatmulImpl(const SharedLibrary& lib, Operands operands)
      : api_(lib), type_(operands == Operands::bf16 ? dnnl_bf16 : dnnl_f32) {
    check(api_.dnnl_engine_create(&engine_, dnnl_cpu, 0), "engine");
    check(api_.dnnl_stream_create(&stream_, engine_, dnnl_stream_default_flags), "stream");
  }
  ~DnnlMatmulImpl() override {
    for (auto& [key, entry] : cache_) {
      if (entry.primitive == nullptr) continue;
      api_.dnnl_primitive_destroy(entry.primitive);
      for (dnnl_memory_t m : entry.memory) api_.dnnl_memory_destroy(m);
    }
    api_.dnnl_stream_destroy(stream_);
    api_.dnnl_engine_destroy(engine_);
  }

  bool run(Trans ta, Trans tb, int M, int N, int K, float alpha, const void* A, int lda,
           int64_t stride_a, const void* B, int ldb, int64_t stride_b, float beta, float* C,
           int ldc, int64_t stride_c, int batch) override {
    // oneDNN's output scales slowed its batched jit GEMM sevenfold (attention's scores, 8 x
    // 128x128x32: 0.21 against 0.03 ms), so with beta 0 alpha scales C afterwards instead.
    const bool scale_after = alpha != 1.0f && beta == 0.0f;
    const float primitive_alpha = scale_after ? 1.0f : alpha;
    const bool single = batch == 1;  // batch strides do not matter then: one primitive
    const Key key{int(ta), int(tb), M, N, K, lda, ldb, ldc, single ? 0 : stride_a,
                  single ? 0 : stride_b, single ? 0 : stride_c, batch,
                  std::bit_cast<std::uint32_t>(primitive_alpha), std::bit_cast<std::uint32_t>(beta)};
    auto it = cache_.find(key);
    if (it == cache_.end()) it = cache_.emplace(key, make_entry(key)).first;
    const Entry& entry = it->second;
    if (entry.primitive == nullptr) return false;
    // The entry's memory objects point at this call's arrays (no allocation per product).
    const void* data[3] = {A, B, C};
    for (int m = 0; m < 3; ++m) {
      check(api_.dnnl_memory_set_data_handle(entry.memory[m], const_cast<void*>(data[m])),
            "data handle");
    }
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, entry.memory[0]},
                                    {DNNL_ARG_WEIGHTS, entry.memory[1]},
                                    {DNNL_ARG_DST, entry.memory[2]}};
    check(api_.dnnl_primitive_execute(entry.primitive, stream_, 3, args), "execute");
    check(api_.dnnl_stream_wait(stream_), "stream wait");
    if (scale_after) scale(C, M, N, ldc, stride_c, batch, alpha);
    return true;
  }

  std::size_t primitives() const override {
    std::size_t n = 0;
    for (const auto& [key, entry] : cache_) n += entry.primitive != nullptr;
    return n;
  }

 private:
  using Key = std::tuple<int, int, int, int, int, int, int, int, int64_t, int64_t, int64_t, int,
                         std::uint32_t, std::uint32_t>;
  struct Entry {
    dnnl_primitive_t primitive = nullptr;  // null: no implementation for this layout
    dnnl_memory_t memory[3] = {};          // A, B, C of the layout, data set per call
  };

  Entry make_entry(const Key& key) const {
    const auto [ta, tb, M, N, K, lda, ldb, ldc, sa, sb, sc, batch, alpha_bits, beta_bits] = key;
    const float alpha = std::bit_cast<float>(alpha_bits), beta = std::bit_cast<float>(beta_bits);
    Entry e;
    const dnnl_memory_desc_t md[3] = {operand_desc(api_, type_, Trans(ta), M, K, lda, sa, batch),
                                      operand_desc(api_, type_, Trans(tb), K, N, ldb, sb, batch),
                                      operand_desc(api_, dnnl_f32, Trans::N, M, N, ldc, sc,
                                                   batch)};
    dnnl_matmul_desc_t desc;
    check(api_.dnnl_matmul_desc_init(&desc, &md[0], &md[1], nullptr, &md[2]), "matmul desc");
    dnnl_primitive_attr_t attr = nullptr;
    dnnl_post_ops_t post_ops = nullptr;
    check(api_.dnnl_primitive_attr_create(&attr), "attributes");
    if (alpha != 1.0f) {
      check(api_.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scale");
    }
    if (beta != 0.0f) {  // C = alpha A B + beta C: the sum post-op
      check(api_.dnnl_post_ops_create(&post_ops), "post-ops");
      check(api_.dnnl_post_ops_append_sum(post_ops, beta), "sum post-op");
      check(api_.dnnl_primitive_attr_set_post_ops(attr, post_ops), "post-ops");
    }
    dnnl_primitive_desc_t pd = nullptr;
    const dnnl_status_t status =
        api_.dnnl_primitive_desc_create(&pd, &desc, attr, engine_, nullptr);
    if (post_ops != nullptr) api_.dnnl_post_ops_destroy(post_ops);
    api_.dnnl_primitive_attr_destroy(attr);
    if (status == dnnl_unimplemented) return e;
    check(status, "primitive desc");
    const dnnl_status_t created = api_.dnnl_primitive_create(&e.primitive, pd);
    api_.dnnl_primitive_desc_destroy(pd);
    check(created, "primitive");
    for (int m = 0; m < 3; ++m) {
      check(api_.dnnl_memory_create(&e.memory[m], &md[m], engine_, DNNL_MEMORY_NONE), "memory");
    }
    return e;
  }

  DnnlApi api_;
  dnnl_data_type_t type_;
  dnnl_engine_t engine_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  std::map<Key, Entry> cache_;
};

}  // namespace

std::unique_ptr<DnnlMatmul> DnnlMatmul::create(const SharedLibrary& lib, Operands operands) {
  const char* off = std::getenv("COLOSSAL_DNNL_MATMUL");
  if (!lib.loaded() || (off != nullptr && std::string(off) == "0")) return nullptr;
  try {
    return std::make_unique<DnnlMatmulImpl>(lib, operands);
  } catch (const std::exception&) {  // an older or trimmed libdnnl: the caller's gemm calls
    return nullptr;
  }
}

#else

std::unique_ptr<DnnlMatmul> DnnlMatmul::create(const SharedLibrary&, Operands) { return nullptr; }

#endif

}  // namespace colossal::core
