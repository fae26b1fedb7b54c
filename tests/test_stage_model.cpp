// core::StageModel's map into the logical tensors, for every model class: on every rank of a
// layout (1D tensor x pipeline stages, 2D grid, 2.5D depth layers, 3D cube) the runs read the
// single-rank model's initial values at their logical elements, and the runs each rank owns cover
// every logical element exactly once. The ranks are simulated one by one (the tables and the
// initialisation communicate nothing), with groups that only know their rank and size.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "core/gemm.hpp"
#include "core/model.hpp"
#include "core/model2d.hpp"
#include "core/model3d.hpp"
#include "pretend_group.hpp"

namespace colossal {
namespace {

// Counts, per logical element, the ranks owning it, and checks every run's values.
class Coverage {
 public:
  explicit Coverage(const core::ModelSpec& spec, uint64_t seed)
      : reference_(spec, 1, 4, tracker_, *gemm_) {
    reference_.init_parameters(seed);
    owners_.resize(reference_.flat_size(), 0);
  }

  void add(core::StageModel& model) {
    std::vector<float> local(model.flat_size());
    core::ParameterStore& store = model.store();
    for (std::size_t u = 0; u < store.units().size(); ++u) {
      const core::ParamUnit& unit = store.units()[u];
      core::copy_to_host(local.data() + unit.begin, store.gather(int(u)),
                         unit.size() * sizeof(float));
      store.release(int(u));
    }
    const auto& logical = reference_.parameters();
    const float* want = reference_.params();
    for (const core::LogicalRun& run : model.logical_runs()) {
      ASSERT_LT(run.tensor, int(logical.size()));
      const core::ParamSpec& p = logical[std::size_t(run.tensor)];
      ASSERT_LE(run.logical + run.length, p.count) << p.name;
      for (std::size_t e = 0; e < run.length; ++e) {
        ASSERT_EQ(local[run.local + e], want[p.offset + run.logical + e])
            << p.name << " element " << run.logical + e;
        if (run.owned) ++owners_[p.offset + run.logical + e];
      }
    }
  }

  // Every logical element owned exactly once (padding between tensors by nobody).
  void expect_exactly_once() const {
    std::size_t covered = 0;
    for (const core::ParamSpec& p : reference_.parameters()) {
      for (std::size_t e = 0; e < p.count; ++e) {
        ASSERT_EQ(owners_[p.offset + e], 1) << p.name << " element " << e;
      }
      covered += p.count;
    }
    EXPECT_EQ(covered, core::parameter_count(reference_.spec()));
  }

 private:
  std::unique_ptr<core::Gemm> gemm_ = core::make_host_gemm();
  core::MemoryTracker tracker_;
  core::Model reference_;
  std::vector<int> owners_;
};

class StageModelRuns : public ::testing::TestWithParam<core::Arch> {};

TEST_P(StageModelRuns, TensorRanksAndPipelineStagesOwnEveryElementOnce) {
  const core::ModelSpec spec = core::model_spec(GetParam(), 3, 32, 4, 64, 51, 16);
  auto gemm = core::make_host_gemm();
  for (int t : {1, 2, 4}) {
    Coverage coverage(spec, 11);
    // Three stages: blocks [0, 1), [1, 2), [2, 3); the first embeds, the last holds the head and
    // a copy of the tied embedding that it does not own.
    for (int s = 0; s < 3; ++s) {
      for (int r = 0; r < t; ++r) {
        test::PretendGroup group(t, r);
        core::MemoryTracker tracker;
        core::Model model(spec, 2, 8, tracker, *gemm,
                          core::ModelOptions{.tensor = &group,
                                             .stage = core::StageRange{s, s + 1, s == 0, s == 2}});
        model.init_parameters(11);
        coverage.add(model);
      }
    }
    coverage.expect_exactly_once();
  }
}

TEST_P(StageModelRuns, GridsAndDepthLayersOwnEveryElementOnce) {
  const core::ModelSpec spec = core::model_spec(GetParam(), 2, 32, 4, 64, 51, 16);
  auto gemm = core::make_host_gemm();
  for (int depth : {1, 2}) {
    Coverage coverage(spec, 12);
    const int q = 2;
    for (int d = 0; d < depth; ++d) {
      for (int i = 0; i < q; ++i) {
        for (int j = 0; j < q; ++j) {
          test::PretendGroup row(q, j), col(q, i), layers(depth, d);
          core::Grid2D grid{row, col};
          core::MemoryTracker tracker;
          core::Model2D model(spec, 2, 8, grid, *gemm, tracker, &layers);
          model.init_parameters(12);
          coverage.add(model);
          EXPECT_THROW(model.stage_input(0), std::logic_error);
          EXPECT_TRUE(model.stage().whole());
          EXPECT_EQ(model.slots(), 1);
        }
      }
    }
    coverage.expect_exactly_once();
  }
}

TEST_P(StageModelRuns, CubeRanksOwnEveryElementOnce) {
  const core::ModelSpec spec = core::model_spec(GetParam(), 2, 32, 4, 64, 51, 16);
  auto gemm = core::make_host_gemm();
  Coverage coverage(spec, 13);
  const int q = 2;
  for (int i = 0; i < q; ++i) {
    for (int j = 0; j < q; ++j) {
      for (int l = 0; l < q; ++l) {
        test::PretendGroup input(q, j), weight(q, i), output(q, l), plane_l(q * q, i * q + j),
            plane_j(q * q, i * q + l);
        core::Cube3DGroups groups{input, weight, output, plane_l, plane_j};
        core::MemoryTracker tracker;
        core::Model3D model(spec, 4, 8, groups, *gemm, tracker);
        model.init_parameters(13);
        coverage.add(model);
        // A micro-batch of another size than the buffers', or a second slot, is refused.
        std::vector<int32_t> tokens(8 * 8, 0);
        EXPECT_THROW(model.forward(tokens.data(), tokens.data(), 8, 1.0f), std::invalid_argument);
        EXPECT_THROW(model.forward(tokens.data(), tokens.data(), 4, 1.0f, 1),
                     std::invalid_argument);
      }
    }
  }
  coverage.expect_exactly_once();
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, StageModelRuns,
                         ::testing::Values(core::Arch::gpt2, core::Arch::opt));

}  // namespace
}  // namespace colossal
