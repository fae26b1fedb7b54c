// What core::Model2D (2D, 2.5D) and core::Model3D (3D) share as StageModels: the whole model on
// one stage with one activation slot, micro-batches of the one size the buffers were built for,
// and their parameters and gradients in a FullParameterStore of their own (one unit: the local
// flat buffer, whose tensors the constructor lays out; ZeRO's per-unit sharding does not apply).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/model_spec.hpp"
#include "core/parameter_store.hpp"
#include "core/stage_model.hpp"
#include "core/tensor_mode.hpp"

namespace colossal::core {

// One transformer block's activations on each rank of a 2d / 2.5d grid or a 3d cube, in floats
// (sharded::layer_act_floats: R token rows of c = C/q columns, R = B*T/q in 2d and 2.5d, B*T/q^2
// in 3d): `set`, what a kept block holds; `input`, its input x (R x c), all that the first block
// of a recomputed segment keeps; `att`, its attention probabilities (in the set), which selective
// checkpointing keeps for one block only. What Model2D / Model3D allocate from and the planner
// costs from.
struct GridBlockFloats {
  int64_t set = 0, input = 0, att = 0;
};
GridBlockFloats grid_block_floats(const ModelSpec& spec, TensorMode mode, int batch, int seq_len,
                                  int q);

class GridModel : public StageModel {
 public:
  const ModelSpec& spec() const override { return spec_; }
  void zero_grad() override { store_->zero_gradients(); }

  bool fixed_batch() const override { return true; }

  // One stage (the whole model), one slot: the boundary buffers do not exist (std::logic_error).
  const StageRange& stage() const override { return whole_; }
  int slots() const override { return 1; }
  int64_t stage_floats(int batch) const override;
  float* stage_input(int slot) override;
  const float* stage_output(int slot) override;
  float* output_gradient() override;
  const float* input_gradient() const override;

  ParameterStore& store() override { return *store_; }
  FullParameterStore& full_store() { return *store_; }  // the same store, whole
  const std::vector<ParamSpec>& parameters() const override { return table_; }
  std::size_t flat_size() const override { return store_->flat_size(); }
  const std::vector<LogicalRun>& logical_runs() const override { return runs_; }

  // The local flat buffers (whole: the store keeps them).
  float* params() { return store_->full_params(); }
  float* grads() { return store_->full_grads(); }
  const float* params() const { return store_->full_params(); }
  const float* grads() const { return store_->full_grads(); }
  // This rank's part of the global sum of squared gradients: every element once per copy of the
  // model (one grid in 2D and 3D, one depth layer's grid in 2.5D). Sum it over the tensor group.
  virtual double gradient_sum_squares() const = 0;
  // The [begin, end) ranges of the gradient buffer this rank counts in the global norm, so that
  // every element is counted once over the whole tensor group (2.5D: depth layer 0's grid):
  // zero::GradientSync sums their squares over the tensor group.
  virtual std::vector<std::pair<std::size_t, std::size_t>> norm_ranges() const = 0;

 protected:
  GridModel(const ModelSpec& spec, int batch) : spec_(spec), batch_(batch) {}
  // After the constructor has laid out table_: the store over [0, table end) padded to a multiple
  // of `unit_multiple` floats (data x 16 under ZeRO 1), both buffers zero.
  void make_store(MemoryTracker& tracker, std::size_t unit_multiple);
  // Where the tensors end (the store's padding follows): what the reductions cover.
  std::size_t params_end() const { return params_end_; }
  // Throws std::invalid_argument unless `batch` is the built micro-batch and `slot` is 0.
  void check_micro_batch(int batch, int slot) const;

  ModelSpec spec_;
  int batch_;
  std::vector<ParamSpec> table_;
  std::vector<LogicalRun> runs_;

 private:
  [[noreturn]] void no_stages() const;
  StageRange whole_{};
  std::size_t params_end_ = 0;
  std::unique_ptr<FullParameterStore> store_;
};

}  // namespace colossal::core
