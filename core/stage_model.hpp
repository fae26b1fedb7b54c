// The one interface a trainer drives a model through, whatever the tensor-parallel layout:
// core::Model (one rank, 1D tensor, sequence and pipeline parallelism), core::Model2D (2D and
// 2.5D) and core::Model3D (3D) implement it. A StageModel is this rank's part of one pipeline
// stage (the whole model when there is no pipeline): the forward and backward of a micro-batch
// into an activation slot, the stage's boundary buffers, where its parameters and gradients live
// (a ParameterStore) and how its local flat layout maps into the logical (Hugging Face) tensors.
//
// What a model cannot do (a 2D/3D model built as the whole model has no stage boundary) it
// refuses with std::logic_error; the factory (apps/model_factory.hpp) never builds such a
// combination.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/model_spec.hpp"
#include "core/parameter_store.hpp"
#include "core/profiler.hpp"

namespace colossal::core {

class StageModel {
 public:
  virtual ~StageModel() = default;

  virtual const ModelSpec& spec() const = 0;
  // The single-rank model's values for the same seed, keyed by logical element.
  virtual void init_parameters(uint64_t seed) = 0;
  virtual void zero_grad() = 0;

  // Runs a micro-batch of `batch` sequences (tokens and targets in device memory, this rank's
  // part of them) into activation set `slot`; returns its mean loss on the stage with the head
  // (0 elsewhere). With grad_scale != 0 it starts the backward of grad_scale * (sum of token
  // losses) (the logits become their gradient, or core::Model runs the LM head's backward
  // here), which backward() of the same slot must then finish before the slot's next such
  // forward.
  virtual double forward(const int32_t* tokens, const int32_t* targets, int batch,
                         float grad_scale, int slot = 0) = 0;
  // Accumulates (+=) the parameter gradients of the forward() of `slot`.
  virtual void backward(const int32_t* tokens, int batch, int slot = 0) = 0;
  // The caller's promise that the parameters have not changed since this model's previous
  // forward() (a later micro-batch of the same optimizer step): the next forward() may keep what
  // a converting GEMM made of them then (bf16's copy of the weights, Gemm::hold_stable) instead
  // of converting them again. It applies to that one forward().
  void parameters_unchanged() { parameters_unchanged_ = true; }
  // Once per optimizer step, before the data-parallel sum and the norm: sums the gradients of the
  // parameters replicated inside the tensor group (2D grid columns, 2.5D depth layers, 3D
  // planes). Nothing to do in 1D, where zero::GradientSync sums the sequence-split partials.
  virtual void reduce_gradients() {}

  // Whether forward() takes only the micro-batch its buffers were built for (the 2D / 3D models)
  // rather than any batch up to it (validation's last, smaller batch).
  virtual bool fixed_batch() const { return false; }
  // The ranks of the tensor group that each take sequences of their own (2.5D: the depth layers,
  // one micro-batch each; forward() returns the mean over all of them), and this rank's index
  // among them. The trainer's sampler splits the batch over data ranks x these.
  virtual int batch_replicas() const { return 1; }
  virtual int batch_replica() const { return 0; }

  // Pipeline stage boundaries: (local token rows of batch, hidden) floats each.
  virtual const StageRange& stage() const = 0;
  virtual int slots() const = 0;
  virtual int64_t stage_floats(int batch) const = 0;
  virtual float* stage_input(int slot) = 0;
  virtual const float* stage_output(int slot) = 0;
  virtual float* output_gradient() = 0;
  virtual const float* input_gradient() const = 0;

  // Where the parameters and gradients live; the local table (names are the logical tensors',
  // roles give weight decay) and the padded length of the flat buffers.
  virtual ParameterStore& store() = 0;
  virtual const std::vector<ParamSpec>& parameters() const = 0;
  virtual std::size_t flat_size() const = 0;
  // The most floats this model holds in the GEMM at once (Gemm::hold_stable): the whole flat
  // buffer where the store keeps it; core::Model under ZeRO-3 holds its gathered LM head alone.
  virtual std::size_t held_floats() { return store().keeps_whole() ? flat_size() : 0; }
  // How the local flat buffer maps into the logical tensors (LogicalRun::owned: whether this
  // rank is the one copy that writes the run; replicated parameters have one owner).
  virtual const std::vector<LogicalRun>& logical_runs() const = 0;

  // Times forward and backward by kind of work while `profiler` is enabled (nullptr: never).
  virtual void set_profiler(Profiler* profiler) { (void)profiler; }

 protected:
  // For forward(): whether parameters_unchanged() was promised since the last call (then
  // forgotten).
  bool take_parameters_unchanged() { return std::exchange(parameters_unchanged_, false); }

 private:
  bool parameters_unchanged_ = false;
};

}  // namespace colossal::core
