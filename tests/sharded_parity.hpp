// Parity of a sharded model (core::Model2D, core::Model3D: anything with logical_runs(),
// params(), grads(), parameters(), flat_size(), zero_grad(), gradient_sum_squares()) against the
// single-rank core::Model: the same initial logical weights, first-step gradients within 1e-4,
// and ten clipped AdamW steps with the same per-step losses (1e-5 relative), gradient norms and
// final weights.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/model.hpp"
#include "core/optimizer.hpp"

namespace colossal::test {

// The local buffer as logical values, compared with the single-rank model's flat buffer.
template <class Sharded>
void expect_logical_equal(const Sharded& m, const float* local,
                          const std::vector<core::ParamSpec>& reference_table,
                          const float* reference, double tol, const std::string& what) {
  int bad = 0;
  for (const auto& run : m.logical_runs()) {
    const std::size_t base = reference_table[run.tensor].offset + run.logical;
    for (std::size_t e = 0; e < run.length; ++e) {
      const double want = reference[base + e], got = local[run.local + e];
      if (std::abs(got - want) > tol * std::max(1.0, std::abs(want)) && ++bad <= 5) {
        ADD_FAILURE() << what << ": " << reference_table[run.tensor].name << "[" << run.logical + e
                      << "] = " << got << ", single rank " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// After training: every sharded product sums its inner dimension in q partial sums, so weights
// differ from the single rank's by fp32 rounding, which AdamW's per-element normalisation turns
// into a visible step for elements whose gradient sits near zero (the first update is about
// lr * sign(g)), and ten steps spread it. Measured: mean |difference| about 3e-7, the worst below
// 1e-4 until the host row reductions summed in 16 lanes (kernels::lane_sum), then 1.1e-4 (gpt2
// on the 2 x 2 x 2 cube): hence 2e-4. A layout bug moves whole tensors by about lr (1e-3) per
// step, and the first-step gradients and per-step losses are checked tightly.
template <class Sharded>
void expect_same_trained_weights(const Sharded& m, const std::vector<core::ParamSpec>& table,
                                 const float* reference) {
  double worst = 0, total = 0;
  std::size_t n = 0;
  const float* local = m.params();
  for (const auto& run : m.logical_runs()) {
    const std::size_t base = table[run.tensor].offset + run.logical;
    for (std::size_t e = 0; e < run.length; ++e) {
      const double d = std::abs(double(local[run.local + e]) - reference[base + e]);
      worst = std::max(worst, d);
      total += d;
      ++n;
    }
  }
  EXPECT_LT(worst, 2e-4);
  EXPECT_LT(total / double(n), 1e-6);
}

// Ten steps on `global_batch` sequences of T tokens (the same on every rank). `step(tokens,
// targets, scale)` runs the sharded model's forward, backward and gradient reductions on its part
// and returns the global mean loss; `global(x)` sums a double over the ranks holding one copy of
// every element.
template <class Sharded>
void train_against_single_rank(
    Sharded& model, core::Model& reference, core::MemoryTracker& ref_tracker,
    core::MemoryTracker& tracker, int global_batch, int T,
    const std::function<double(const int32_t*, const int32_t*, float)>& step,
    const std::function<double(double)>& global) {
  Kokkos::fence();
  expect_logical_equal(model, model.params(), reference.parameters(), reference.params(), 0.0,
                       "initial weights");
  core::AdamW ref_opt(reference.parameters(), reference.flat_size(), ref_tracker);
  core::AdamW opt(model.parameters(), model.flat_size(), tracker);
  // The trainer tests' schedule: 2 warm-up steps to 3e-3, cosine to 3e-4.
  const core::LrSchedule schedule{3e-3, 3e-4, 2, 10};
  core::AdamWParams hp{3e-3, 0.9, 0.95, 1e-8, 0.1};
  const int vocab = int(reference.parameters().front().shape[0]);
  std::vector<int32_t> tokens(global_batch * T), targets(global_batch * T);
  const float scale = 1.0f / float(global_batch * T);
  for (int s = 1; s <= 10; ++s) {
    for (int n = 0; n < global_batch * T; ++n) {
      tokens[n] = int32_t((n * 7 + s * 13) % vocab);
      targets[n] = int32_t((n * 11 + s * 5 + 3) % vocab);
    }
    reference.zero_grad();
    const double want = reference.forward(tokens.data(), targets.data(), global_batch, scale);
    reference.backward(tokens.data(), global_batch);
    const double ref_norm =
        std::sqrt(core::sum_of_squares(reference.grads(), reference.flat_size()));
    model.zero_grad();
    const double got = step(tokens.data(), targets.data(), scale);
    const double norm = std::sqrt(global(model.gradient_sum_squares()));
    Kokkos::fence();
    EXPECT_NEAR(got, want, 1e-5 * want) << "loss at step " << s;
    // The norm follows weights that AdamW's rounding noise has moved apart by up to ~1e-5.
    EXPECT_NEAR(norm, ref_norm, 1e-4 * ref_norm) << "gradient norm at step " << s;
    if (s == 1) {
      expect_logical_equal(model, model.grads(), reference.parameters(), reference.grads(), 1e-4,
                           "first-step gradients");
    }
    hp.lr = schedule.at(s - 1);
    ref_opt.update(reference.params(), reference.grads(), hp, s,
                   float(core::clip_coefficient(ref_norm, 0.5)));
    opt.update(model.params(), model.grads(), hp, s, float(core::clip_coefficient(norm, 0.5)));
  }
  Kokkos::fence();
  expect_same_trained_weights(model, reference.parameters(), reference.params());
}

}  // namespace colossal::test
