// Central finite differences for gradient tests. Kernels run in float, so the probe is large
// (1e-2) and the comparison allows the float rounding that implies; a wrong term, sign or
// transpose still shows as an error of order one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "core/memory.hpp"

namespace colossal::test {

// These tests hand host pointers to kernels, so they need a host default execution space.
inline bool host_memory() {
  return std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>;
}

// C (M x N) = op(A) op(B) with op(A) M x K and op(B) K x N, row-major, summed in double: the dense
// reference of the distributed products.
inline std::vector<float> dense_product(const std::vector<float>& A, bool ta,
                                        const std::vector<float>& B, bool tb, int64_t M,
                                        int64_t N, int64_t K) {
  std::vector<float> C(M * N);
  for (int64_t a = 0; a < M; ++a) {
    for (int64_t b = 0; b < N; ++b) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += double(ta ? A[k * M + a] : A[a * K + k]) * (tb ? B[b * K + k] : B[k * N + b]);
      }
      C[a * N + b] = float(s);
    }
  }
  return C;
}

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::vector<float> v(n);
  unsigned s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f);
  }
  return v;
}

// Compares analytic[i] with (f(x_i + eps) - f(x_i - eps)) / 2 eps for every i (or every
// `stride`-th). Returns the number of mismatches (each reported). Where f is not smooth within eps
// (a ReLU input crossing zero), finite differences mean nothing: such a point shows as a disagreement
// between the probes at eps and eps/2, and is skipped (at most a tenth of the points may be).
inline int check_gradient(const std::string& what, const std::function<double()>& f,
                          std::vector<float>& x, const std::vector<float>& analytic,
                          std::size_t stride = 1, double eps = 1e-2, double atol = 2e-3,
                          double rtol = 2e-2) {
  int bad = 0, skipped = 0, probed = 0;
  auto probe = [&](std::size_t i, double h) {
    const float saved = x[i];
    x[i] = saved + static_cast<float>(h);
    const double up = f();
    x[i] = saved - static_cast<float>(h);
    const double down = f();
    x[i] = saved;
    return (up - down) / (2 * h);
  };
  for (std::size_t i = 0; i < x.size(); i += stride) {
    ++probed;
    const double numeric = probe(i, eps);
    const double finer = probe(i, eps / 2);
    if (std::abs(numeric - finer) > atol + rtol * std::abs(numeric)) {
      ++skipped;
      continue;
    }
    if (std::abs(numeric - analytic[i]) > atol + rtol * std::abs(numeric)) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " vs numeric "
                      << numeric;
      }
    }
  }
  EXPECT_LE(skipped * 10, probed) << what << ": too many non-smooth points for a gradient check";
  return bad;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// A whole model's backward against finite differences of its summed token loss, tensor by tensor
// (every `count / 20 + 1`-th element of tensors over 40 elements). `model` is a core::Model with
// its parameters set; tokens/targets hold B x T. Returns the mismatches; with `every_tensor_moves`
// each tensor must also have a non-zero gradient (a tensor the backward never reaches).
// Host copies of n values in the default execution space's memory (a model's buffers), and back.
template <class T>
std::vector<T> to_host(const T* values, std::size_t n) {
  std::vector<T> host(n);
  Kokkos::fence();
  core::copy_to_host(host.data(), values, n * sizeof(T));
  return host;
}
template <class T>
void from_host(T* values, const std::vector<T>& host) {
  core::copy_to_device(values, host.data(), host.size() * sizeof(T));
}

// A micro-batch's tokens and targets in the default execution space's memory, where a model
// reads them (on the GPU in a Kokkos CUDA build).
class DeviceTokens {
 public:
  DeviceTokens(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets)
      : tokens_(tracker_, core::MemCategory::data, tokens.size()),
        targets_(tracker_, core::MemCategory::data, targets.size()) {
    from_host(tokens_.data(), tokens);
    from_host(targets_.data(), targets);
  }
  const int32_t* tokens(std::size_t from = 0) const { return tokens_.data() + from; }
  const int32_t* targets(std::size_t from = 0) const { return targets_.data() + from; }

 private:
  core::MemoryTracker tracker_;
  core::DeviceArray<int32_t> tokens_, targets_;
};

template <class ModelT>
int check_model_gradient(ModelT& model, const std::vector<int32_t>& tokens,
                         const std::vector<int32_t>& targets, int B, int T,
                         bool every_tensor_moves = false) {
  const DeviceTokens batch(tokens, targets);
  model.zero_grad();
  const double mean = model.forward(batch.tokens(), batch.targets(), B, 1.0f);  // grad_scale 1
  model.backward(batch.tokens(), B);
  EXPECT_GT(mean, 0.5);
  std::vector<float> analytic = to_host(model.grads(), model.flat_size());
  std::vector<float> params = to_host(model.params(), model.flat_size());
  auto f = [&] {  // the sum of token losses
    from_host(model.params(), params);
    return model.forward(batch.tokens(), batch.targets(), B, 0.0f) * B * T;
  };
  int bad = 0;
  for (const auto& p : model.parameters()) {
    std::vector<float> x(params.begin() + p.offset, params.begin() + p.offset + p.count);
    std::vector<float> g(analytic.begin() + p.offset, analytic.begin() + p.offset + p.count);
    if (every_tensor_moves) {
      double norm = 0;
      for (float v : g) norm += double(v) * v;
      EXPECT_GT(norm, 0.0) << p.name << " has no gradient";
    }
    auto f_tensor = [&] {
      std::copy(x.begin(), x.end(), params.begin() + p.offset);
      return f();
    };
    const std::size_t stride = p.count > 40 ? p.count / 20 + 1 : 1;
    bad += check_gradient(p.name, f_tensor, x, g, stride, 1e-2, 3e-3, 3e-2);
    std::copy(x.begin(), x.end(), params.begin() + p.offset);
  }
  return bad;
}

}  // namespace colossal::test
