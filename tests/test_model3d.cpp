// The 3D tensor-parallel transformer (core/model3d.hpp) on a 2 x 2 x 2 cube trains the
// single-rank model (tests/sharded_parity.hpp): the same initial logical weights, first-step
// gradients, ten AdamW steps of losses and final weights, for GPT-2 and OPT.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "core/gemm.hpp"
#include "core/model.hpp"
#include "core/model3d.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/tensor_group.hpp"
#include "sharded_parity.hpp"

using namespace colossal;

namespace {

// The world as a 2 x 2 x 2 cube, world rank = (i q + j) q + l, with the model's five groups.
struct Cube {
  static constexpr int q = 2;
  explicit Cube(parallel::Communicator& world)
      : i(world.rank() / (q * q)), j(world.rank() / q % q), l(world.rank() % q),
        input_comm(world.split(i * q + l, j)), weight_comm(world.split(j * q + l, i)),
        output_comm(world.split(i * q + j, l)), plane_l_comm(world.split(l, i * q + j)),
        plane_j_comm(world.split(j, i * q + l)), input(*input_comm), weight(*weight_comm),
        output(*output_comm), plane_l(*plane_l_comm), plane_j(*plane_j_comm),
        groups{input, weight, output, plane_l, plane_j} {}
  int i, j, l;
  std::unique_ptr<parallel::Communicator> input_comm, weight_comm, output_comm, plane_l_comm,
      plane_j_comm;
  parallel::CommunicatorGroup input, weight, output, plane_l, plane_j;
  core::Cube3DGroups groups;
};

class Model3DParity : public ::testing::TestWithParam<core::Arch> {};

// World rank = (i q + j) q + l.
TEST_P(Model3DParity, TrainsTheSingleRankModelForTenSteps) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks (a 2 x 2 x 2 cube)";
  Cube cube(world);

  const core::ModelSpec spec = core::model_spec(GetParam(), 2, 32, 4, 64, 51, 16);
  const int B = 4, T = 12;
  auto gemm = core::make_host_gemm();
  core::MemoryTracker ref_tracker, tracker;
  core::Model reference(spec, B, T, ref_tracker, *gemm);
  core::Model3D model(spec, B, T, cube.groups, *gemm, tracker);
  reference.init_parameters(78);
  model.init_parameters(78);
  test::train_against_single_rank(
      model, reference, ref_tracker, tracker, B, T,
      [&](const int32_t* tokens, const int32_t* targets, float scale) {
        const double loss = model.forward(tokens, targets, B, scale);
        model.backward(tokens, B);
        model.reduce_gradients();
        return loss;
      },
      [&](double x) { return world.all_reduce_sum_value(x); });
  // Weight matrices are cut in q^3: the parameter bytes are about an eighth of the single rank's
  // (replicated vectors and block padding are the difference).
  const double ratio = double(tracker.current(core::MemCategory::parameters)) /
                       double(ref_tracker.current(core::MemCategory::parameters));
  EXPECT_GT(ratio, 0.125);
  EXPECT_LT(ratio, 0.30);
}

// One forward + backward's bytes in each group, and the tracked parameter and activation bytes,
// against the closed forms next to the model.
TEST_P(Model3DParity, CommunicationAndMemoryEqualTheClosedForms) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks";
  Cube cube(world);
  const int q = Cube::q;
  const core::ModelSpec spec = core::model_spec(GetParam(), 3, 48, 6, 96, 101, 16);
  const int B = 8, T = 10;
  auto gemm = core::make_host_gemm();
  core::MemoryTracker tracker;
  core::Model3D model(spec, B, T, cube.groups, *gemm, tracker);
  model.init_parameters(5);
  EXPECT_EQ(tracker.current(core::MemCategory::parameters),
            core::Model3D::parameter_floats(spec, q) * sizeof(float));
  EXPECT_EQ(tracker.current(core::MemCategory::activations),
            core::Model3D::activation_floats(spec, B, T, q) * sizeof(float));
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int n = 0; n < B * T; ++n) tokens[n] = targets[(n + 1) % (B * T)] = n * 3 % spec.vocab;
  for (auto* c : {cube.input_comm.get(), cube.weight_comm.get(), cube.output_comm.get(),
                  cube.plane_l_comm.get()}) {
    c->reset_stats();
  }
  model.forward(tokens.data(), targets.data(), B, 1.0f / float(B * T));
  model.backward(tokens.data(), B);
  const auto want = core::Model3D::step_communication(spec, B, T, q);
  auto bytes = [](parallel::Communicator& c, parallel::CollectiveKind k) {
    return double(c.stats()[k].payload_bytes);
  };
  using K = parallel::CollectiveKind;
  EXPECT_EQ(bytes(*cube.input_comm, K::all_gather), 4 * want.input_all_gather);
  EXPECT_EQ(bytes(*cube.input_comm, K::reduce_scatter), 4 * want.input_reduce_scatter);
  EXPECT_EQ(bytes(*cube.input_comm, K::all_reduce), 4 * want.input_all_reduce);
  EXPECT_EQ(bytes(*cube.weight_comm, K::all_gather), 4 * want.weight_all_gather);
  EXPECT_EQ(bytes(*cube.weight_comm, K::reduce_scatter), 4 * want.weight_reduce_scatter);
  EXPECT_EQ(bytes(*cube.weight_comm, K::all_reduce), 4 * want.weight_all_reduce);
  EXPECT_EQ(bytes(*cube.output_comm, K::all_gather), 4 * want.output_all_gather);
  EXPECT_EQ(bytes(*cube.output_comm, K::reduce_scatter), 4 * want.output_reduce_scatter);
  EXPECT_EQ(bytes(*cube.output_comm, K::all_reduce), 4 * want.output_all_reduce);
  EXPECT_EQ(bytes(*cube.plane_l_comm, K::all_gather), 4 * want.plane_all_gather);
  EXPECT_EQ(bytes(*cube.plane_l_comm, K::reduce_scatter), 4 * want.plane_reduce_scatter);
}

TEST(Model3D, SizesTheCubeCannotSplitAreRefusedWithTheNearestValid) {
  parallel::MpiCommunicator world(MPI_COMM_WORLD);
  if (world.size() != 8) GTEST_SKIP() << "needs 8 ranks";
  const int q = 2, i = world.rank() / (q * q), j = world.rank() / q % q, l = world.rank() % q;
  auto input_comm = world.split(i * q + l, j), weight_comm = world.split(j * q + l, i),
       output_comm = world.split(i * q + j, l);
  parallel::CommunicatorGroup input(*input_comm), weight(*weight_comm), output(*output_comm);
  core::Cube3DGroups groups{input, weight, output, input, weight};
  auto gemm = core::make_host_gemm();
  core::MemoryTracker tracker;
  try {
    core::Model3D model(core::model_spec(core::Arch::gpt2, 1, 42, 6, 64, 51, 16), 4, 8, groups,
                        *gemm, tracker);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.hidden = 42 must be a multiple of 4 for 3D tensor "
                                         "parallelism (nearest: 40 or 44)"),
              std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, Model3DParity, ::testing::Values(core::Arch::gpt2, core::Arch::opt),
                         [](const auto& info) {
                           return info.param == core::Arch::gpt2 ? std::string("gpt2")
                                                                 : std::string("opt");
                         });

}  // namespace
