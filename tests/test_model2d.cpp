// The 2D tensor-parallel transformer (core/model2d.hpp) on a 2 x 2 grid trains the single-rank
// model: the same initial logical weights, the same first-step gradients, and ten AdamW steps with
// global-norm clipping giving the same losses and final weights, for GPT-2 and OPT (a vocabulary
// and an OPT position table that leave padding rows in the last block).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>

#include "core/gemm.hpp"
#include "core/model.hpp"
#include "core/model2d.hpp"
#include "core/optimizer.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/tensor_group.hpp"

using namespace colossal;

namespace {

// The local buffer as logical values, compared with the single-rank model's flat buffer.
void expect_logical_equal(const core::Model2D& m, const float* local,
                          const std::vector<core::ParamSpec>& reference_table,
                          const float* reference, double tol, const std::string& what) {
  int bad = 0;
  for (const core::Model2D::Run& run : m.logical_runs()) {
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

// After training: every product of the 2D layout sums its inner dimension in q partial sums, so
// weights differ from the single rank's by fp32 rounding, which AdamW's per-element
// normalisation turns into a visible step for elements whose gradient sits near zero (the first
// update is about lr * sign(g)), and ten steps spread it. Measured here: mean |difference| about
// 3e-7, the worst below 1e-4. A layout bug moves whole tensors by about lr (1e-3) per step, and
// the first-step gradients and per-step losses above are checked tightly.
void expect_same_trained_weights(const core::Model2D& m, const float* local,
                                 const std::vector<core::ParamSpec>& reference_table,
                                 const float* reference) {
  double worst = 0, total = 0;
  std::size_t n = 0;
  for (const core::Model2D::Run& run : m.logical_runs()) {
    const std::size_t base = reference_table[run.tensor].offset + run.logical;
    for (std::size_t e = 0; e < run.length; ++e) {
      const double d = std::abs(double(local[run.local + e]) - reference[base + e]);
      worst = std::max(worst, d);
      total += d;
      ++n;
    }
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_LT(total / double(n), 1e-6);
}

class Model2DParity : public ::testing::TestWithParam<core::Arch> {};

// 4 ranks: one 2 x 2 grid (2D). 8 ranks: 2.5D with q = 2, d = 2 (world rank = d 4 + i 2 + j),
// each depth layer running half of the global batch, gradients summed over the depth group (the
// ranks at the same grid position); the same computation as 2D x dp2.
TEST_P(Model2DParity, TrainsTheSingleRankModelForTenSteps) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 4 && world.size() != 8) GTEST_SKIP() << "needs 4 or 8 ranks";
  const int q = 2, layers = world.size() / 4, d = world.rank() / 4, i = world.rank() / q % q,
            j = world.rank() % q;
  auto row_comm = world.split(d * q + i, j), col_comm = world.split(d * q + j, i),
       depth_comm = world.split(i * q + j, d);
  parallel::CommunicatorGroup row(*row_comm), col(*col_comm), depth(*depth_comm);
  core::Grid2D grid{row, col};

  const core::ModelSpec spec = core::model_spec(GetParam(), 2, 32, 4, 64, 51, 16);
  const int B = 4, global_batch = B * layers, T = 12;
  auto gemm = core::make_host_gemm();
  core::MemoryTracker ref_tracker, tracker;
  // OPT's ReLU has a kink: a pre-activation within rounding of zero flips its derivative between
  // layouts and the runs part (seed 77 with 8 sequences hits one at step 4; 78-81 do not).
  const uint64_t seed = 78;
  core::Model reference(spec, global_batch, T, ref_tracker, *gemm);
  core::Model2D model(spec, B, T, grid, *gemm, tracker, &depth);
  reference.init_parameters(seed);
  model.init_parameters(seed);
  Kokkos::fence();
  expect_logical_equal(model, model.params(), reference.parameters(), reference.params(), 0.0,
                       "initial weights");

  core::AdamW ref_opt(reference.parameters(), reference.flat_size(), ref_tracker);
  core::AdamW opt(model.parameters(), model.flat_size(), tracker);
  // The trainer tests' schedule: 2 warm-up steps to 3e-3, cosine to 3e-4.
  const core::LrSchedule schedule{3e-3, 3e-4, 2, 10};
  core::AdamWParams hp{3e-3, 0.9, 0.95, 1e-8, 0.1};
  std::vector<int32_t> tokens(global_batch * T), targets(global_batch * T);
  const float scale = 1.0f / float(global_batch * T);
  for (int step = 1; step <= 10; ++step) {
    for (int n = 0; n < global_batch * T; ++n) {  // the same on every rank
      tokens[n] = int32_t((n * 7 + step * 13) % spec.vocab);
      targets[n] = int32_t((n * 11 + step * 5 + 3) % spec.vocab);
    }
    reference.zero_grad();
    const double want = reference.forward(tokens.data(), targets.data(), global_batch, scale);
    reference.backward(tokens.data(), global_batch);
    const double ref_norm =
        std::sqrt(core::sum_of_squares(reference.grads(), reference.flat_size()));

    // This depth layer's sequences; the loss is scaled for the global mean.
    model.zero_grad();
    const int32_t* my_tokens = tokens.data() + d * B * T;
    const double got = model.forward(my_tokens, targets.data() + d * B * T, scale);
    model.backward(my_tokens);
    model.reduce_gradients();
    double squares = model.gradient_sum_squares();
    // One grid holds every element once (the depth layers' copies are equal).
    squares = row_comm->all_reduce_sum_value(squares);
    squares = col_comm->all_reduce_sum_value(squares);
    Kokkos::fence();
    EXPECT_NEAR(got, want, 1e-5 * want) << "loss at step " << step;
    // The norm follows weights that AdamW's rounding noise (see below) has moved apart by up to
    // ~1e-5 after a few steps: 1e-4 relative.
    EXPECT_NEAR(std::sqrt(squares), ref_norm, 1e-4 * ref_norm) << "gradient norm at step " << step;
    if (step == 1) {
      expect_logical_equal(model, model.grads(), reference.parameters(), reference.grads(), 1e-4,
                           "gradients at step " + std::to_string(step));
    }
    hp.lr = schedule.at(step - 1);
    ref_opt.update(reference.params(), reference.grads(), hp, step,
                   float(core::clip_coefficient(ref_norm, 0.5)));
    opt.update(model.params(), model.grads(), hp, step,
               float(core::clip_coefficient(std::sqrt(squares), 0.5)));
  }
  Kokkos::fence();
  expect_same_trained_weights(model, model.params(), reference.parameters(), reference.params());
  // Each rank holds a quarter of every weight matrix: the parameter bytes are about a quarter of
  // the single rank's (replicated vectors and block padding are the difference).
  const double ratio = double(tracker.current(core::MemCategory::parameters)) /
                       double(ref_tracker.current(core::MemCategory::parameters));
  EXPECT_GT(ratio, 0.25);
  EXPECT_LT(ratio, 0.40);
}

// The bytes one forward + backward moves along the grid row and down the column, and the tracked
// parameter and activation bytes, against the closed forms next to the model.
TEST_P(Model2DParity, CommunicationAndMemoryEqualTheClosedForms) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int q = 2, i = world.rank() / q, j = world.rank() % q;
  auto row_comm = world.split(i, j), col_comm = world.split(j, i);
  parallel::CommunicatorGroup row(*row_comm), col(*col_comm);
  core::Grid2D grid{row, col};
  const core::ModelSpec spec = core::model_spec(GetParam(), 3, 48, 6, 96, 101, 16);
  const int B = 6, T = 10;
  auto gemm = core::make_host_gemm();
  core::MemoryTracker tracker;
  core::Model2D model(spec, B, T, grid, *gemm, tracker);
  model.init_parameters(5);
  EXPECT_EQ(tracker.current(core::MemCategory::parameters),
            core::Model2D::parameter_floats(spec, q) * sizeof(float));
  EXPECT_EQ(tracker.current(core::MemCategory::activations),
            core::Model2D::activation_floats(spec, B, T, q) * sizeof(float));
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int n = 0; n < B * T; ++n) tokens[n] = targets[(n + 1) % (B * T)] = n * 3 % spec.vocab;
  row_comm->reset_stats();
  col_comm->reset_stats();
  model.forward(tokens.data(), targets.data(), 1.0f / float(B * T));
  model.backward(tokens.data());
  const auto want = core::Model2D::step_communication(spec, B, T, q);
  const auto& r = row_comm->stats();
  const auto& c = col_comm->stats();
  EXPECT_EQ(double(r.broadcast.payload_bytes), 4 * want.row_broadcast);
  EXPECT_EQ(double(r.all_gather.payload_bytes), 4 * want.row_all_gather);
  EXPECT_EQ(double(r.reduce_scatter.payload_bytes), 4 * want.row_reduce_scatter);
  EXPECT_EQ(double(r.all_reduce.payload_bytes), 4 * want.row_all_reduce);
  EXPECT_EQ(double(c.broadcast.payload_bytes), 4 * want.col_broadcast);
  EXPECT_EQ(double(c.all_gather.payload_bytes), 4 * want.col_all_gather);
  EXPECT_EQ(double(c.reduce_scatter.payload_bytes), 4 * want.col_reduce_scatter);
  EXPECT_EQ(double(c.all_reduce.payload_bytes), 4 * want.col_all_reduce);
}

INSTANTIATE_TEST_SUITE_P(Archs, Model2DParity, ::testing::Values(core::Arch::gpt2, core::Arch::opt),
                         [](const auto& info) {
                           return info.param == core::Arch::gpt2 ? std::string("gpt2")
                                                                 : std::string("opt");
                         });

}  // namespace
