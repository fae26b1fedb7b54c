// Helpers shared by the parallel-training parity tests: one data file written by rank 0, and the
// comparison of two runs' logical weights.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/trainer.hpp"
#include "parallel/communicator.hpp"

namespace colossal::test {

// Text with structure but no short period, so losses keep moving for all ten steps (`word`
// every `every` characters); written once by rank 0 under `name` in the temporary directory.
inline std::string shared_training_text(parallel::Communicator& world, const std::string& name,
                                        uint32_t seed, int every = 5,
                                        const std::string& word = "and ") {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  if (world.rank() == 0) {
    std::string text;
    uint32_t s = seed;
    for (int i = 0; i < 6000; ++i) {
      s = s * 1103515245u + 12345u;
      text.push_back(static_cast<char>("abcdefgh ijklmnop\n"[(s >> 16) % 18]));
      if (i % every == 0) text += word;
    }
    std::ofstream(path) << text;
  }
  world.barrier();
  return path;
}

// The final logical weights of a parallel run against one rank's. Layouts that sum products in
// another order (row-parallel layers, tied embeddings summed over stages) differ by fp32 rounding,
// which AdamW's per-element normalisation turns into a visible step for the few elements whose
// gradient sits near zero. Measured after 10 steps at lr 3e-3: mean |difference| below 5e-8,
// fewer than 0.3% of the elements above 1e-6, the largest 2.4e-5. A layout bug moves whole
// tensors by about lr per step.
struct WeightDifference {
  double worst = 0, mean = 0;
  std::size_t worst_at = 0, above = 0;  // where the worst is; how many differ by more than 1e-6
};
inline WeightDifference weight_difference(const std::vector<float>& got,
                                          const std::vector<float>& want) {
  WeightDifference w;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    w.mean += d / double(want.size());
    if (d > 1e-6) ++w.above;
    if (d > w.worst) {
      w.worst = d;
      w.worst_at = i;
    }
  }
  return w;
}

inline void expect_same_weights(apps::Trainer& trainer, apps::Trainer& reference) {
  const std::vector<float> weights = trainer.logical_parameters();
  const std::vector<float> want = reference.logical_parameters();
  ASSERT_EQ(weights.size(), want.size());
  const auto [worst, mean, worst_at, above] = weight_difference(weights, want);
  std::string where;
  for (const auto& p : trainer.logical_table()) {
    if (worst_at >= p.offset && worst_at < p.offset + p.count) {
      where = p.name + "[" + std::to_string(worst_at - p.offset) + "]";
    }
  }
  EXPECT_LT(worst, 1e-4) << where;
  EXPECT_LT(mean, 2e-7);
  EXPECT_LT(double(above), 0.005 * double(want.size()));
}

inline void expect_same_losses(const apps::TrainSummary& got, const apps::TrainSummary& expected,
                               double relative = 1e-5) {
  ASSERT_EQ(got.losses.size(), expected.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], expected.losses[i], relative * std::abs(expected.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_LT(got.losses.back(), got.losses.front() - 0.5) << "the run must actually learn";
}

}  // namespace colossal::test
