// The one place that picks the model class from the config (issue 21's factory): core::Model for
// parallel.tensor.mode 1d (tensor, sequence, pipeline stage and store from ModelOptions),
// core::Model2D for 2d and 2.5d, core::Model3D for 3d over the tensor group's sub-grid
// (parallel::make_tensor_grid_groups). Whatever the class, the trainer drives it as a
// core::StageModel. The config (io/config.cpp) has already refused what a class cannot run.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/gemm.hpp"
#include "core/memory.hpp"
#include "core/model.hpp"
#include "core/model3d.hpp"
#include "core/stage_model.hpp"
#include "core/tensor2d.hpp"
#include "io/config.hpp"
#include "parallel/mesh.hpp"

namespace colossal::apps {

// A model and the group bundles a 2D / 3D model refers to (kept alive beside it).
struct BuiltModel {
  std::unique_ptr<core::Grid2D> grid;         // Model2D's row and column groups
  std::unique_ptr<core::Cube3DGroups> cube;   // Model3D's axes and planes
  std::unique_ptr<core::StageModel> model;    // declared last: destroyed first
  // The tensor layout in words ("2 x 2 grid x 2 depth layers", "2 x 2 x 2 cube"); empty in 1d.
  std::string grid_text;
  core::Model* dense() const { return dynamic_cast<core::Model*>(model.get()); }
  core::GridModel* sharded() const { return dynamic_cast<core::GridModel*>(model.get()); }
};

// Buffers for micro-batches of train.micro_batch sequences of `seq_len` tokens (this rank's
// chunk of them under ring attention). 1d: `options` places the model; 2d / 2.5d / 3d:
// `grid_groups` are the tensor group's sub-groups and the parameters are padded to
// `options.unit_multiple` floats (data x 16 for ZeRO 1).
BuiltModel make_stage_model(const io::Config& config, int seq_len, core::MemoryTracker& tracker,
                            core::Gemm& gemm, const core::ModelOptions& options,
                            const parallel::TensorGridGroups* grid_groups = nullptr);

}  // namespace colossal::apps
