// What a trainer needs from a model whose every tensor is sharded over a multi-dimensional
// tensor-parallel group (core::Model2D for 2D and 2.5D, core::Model3D for 3D): the step, the
// gradient reductions, the local flat buffers and how they map into the logical tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.hpp"
#include "core/tensor_mode.hpp"

namespace colossal::core {

// The grid of a tensor group of `size` ranks in tensor mode `mode` (2d, 2.5d with `depth`
// layers, 3d): the largest side q with q^2 x depth (q^3 in 3d) <= size, and whether the
// group is exactly that grid with q >= 2. One place for the config, the planner and the trainer.
struct TensorGrid {
  int q = 1;
  bool exact = false;
  int ranks(int side) const;  // the group size of a grid of `side` (q^2 x depth or q^3)
  int depth = 1, power = 2;
};
TensorGrid tensor_grid(TensorMode mode, int size, int depth = 1);
// What model.hidden, model.ffn_hidden and train.micro_batch must be multiples of on a grid of
// side q (model.heads: of q): q in 2d and 2.5d, q^2 in 3d.
int tensor_grid_multiple(TensorMode mode, int q);

class ShardedModel {
 public:
  virtual ~ShardedModel() = default;
  virtual void init_parameters(uint64_t seed) = 0;  // the single-rank model's values
  virtual void zero_grad() = 0;
  // tokens and targets: this rank's micro-batch (the same on every rank of the tensor group, or
  // of a 2.5D depth layer); returns the mean loss over the tensor group's tokens.
  virtual double forward(const int32_t* tokens, const int32_t* targets, float grad_scale) = 0;
  virtual void backward(const int32_t* tokens) = 0;
  // Once per optimizer step: the sums over replicas inside the tensor group.
  virtual void reduce_gradients() = 0;
  // This rank's part of the global sum of squared gradients: every element once per copy of the
  // model (one grid in 2D and 3D, one depth layer's grid in 2.5D).
  virtual double gradient_sum_squares() const = 0;
  virtual float* params() = 0;
  virtual float* grads() = 0;
  virtual std::size_t flat_size() const = 0;
  virtual const std::vector<ParamSpec>& parameters() const = 0;

  // Runs of `length` elements from local offset `local` to element `logical` of tensor `tensor`
  // of parameter_table(spec). Padding has no run; replicated parameters have runs on every rank
  // holding a copy.
  struct Run {
    std::size_t local;
    int tensor;
    std::size_t logical, length;
  };
  virtual const std::vector<Run>& logical_runs() const = 0;
  // Whether this rank is the one copy of the model that writes the element at `local` (replicated
  // parameters have one owner per model copy).
  virtual bool owns(std::size_t local) const = 0;
};

}  // namespace colossal::core
