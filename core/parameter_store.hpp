// Where a model's parameters and gradients live, unit by unit (ParamUnit: the embeddings, each
// transformer block, the final layernorm).
//
// The model never addresses a flat parameter buffer directly: before it runs a unit it asks the
// store for the unit's full parameters (gather), gives them back when done (release), accumulates
// the unit's gradients into the buffer the store hands out (gradients) and says when backward has
// finished them for this micro-batch (gradients_done). A replicated store (FullParameterStore, the
// default) keeps both flat buffers whole and makes these calls free; ZeRO's sharded stores
// (zero/sharded_store.hpp) all-gather parameters and reduce-scatter gradients in them.
//
// Under sharding gather() and gradients_done() are collective over the data-parallel group: every
// rank must make the same calls in the same order (the model's forward and backward do).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/memory.hpp"
#include "core/model_spec.hpp"

namespace colossal::core {

class ParameterStore {
 public:
  ParameterStore(std::vector<ParamUnit> units, std::size_t flat_size)
      : units_(std::move(units)), flat_size_(flat_size) {}
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  virtual ~ParameterStore() = default;

  const std::vector<ParamUnit>& units() const { return units_; }
  std::size_t flat_size() const { return flat_size_; }

  // The full parameters of `unit` (its first element, flat offset units()[unit].begin), valid
  // until release(unit). Unit 0 and one other unit may be held at once.
  virtual const float* gather(int unit) = 0;
  virtual void release(int unit) { (void)unit; }
  // A buffer of the unit's size to write its full values into (initialisation, loading);
  // commit(unit) makes them the unit's parameters. Same pairing rule as gather().
  virtual float* begin_write(int unit) = 0;
  virtual void commit(int unit) { (void)unit; }

  // Where backward accumulates (+=) the unit's gradients for the current micro-batch; then
  // gradients_done(unit) once backward has finished them. Unit 0 and one other unit may be open at
  // once. Whether the buffer starts at zero or holds earlier micro-batches is the store's affair:
  // the accumulated gradient of the step is the same either way. Asking again for a unit that is
  // open returns the same buffer as it is (core::Model's training forward opens the LM head's
  // weight unit, and the slot's backward continues into it).
  virtual float* gradients(int unit) = 0;
  virtual void gradients_done(int unit) { (void)unit; }
  // Zeroes the step's accumulated gradients.
  virtual void zero_gradients() = 0;

  // The whole flat buffers when this store keeps them; nullptr when they are sharded.
  virtual float* full_params() { return nullptr; }
  // Whether full_params() is the whole buffer (in a memory plan, where nothing is allocated,
  // whether it would be).
  virtual bool keeps_whole() const { return false; }
  virtual float* full_grads() { return nullptr; }
  // After the step's backward, where this rank holds the (data-reduced, when sharded) gradients
  // of the flat range [begin, end): (pointer, count) pieces in flat order. A whole buffer gives
  // the range itself; a sharded store its intersections with this rank's slices, in its shard,
  // the same pieces on every rank of one data index.
  virtual std::vector<std::pair<float*, std::size_t>> gradient_pieces(std::size_t begin,
                                                                      std::size_t end) = 0;
  // True when gather()/gradients_done() communicate (every rank must run the same forwards).
  virtual bool collective() const { return false; }
  // The units other than 0 that the caller will gather next, in order (units[0] first; n of
  // them, read before this returns): core::Model's backward, whose recomputed segments go up
  // before their backward comes down. A store that gathers ahead uses it instead of guessing
  // from the direction of travel, and after the last of them starts nothing ahead.
  virtual void plan_gathers(const int* units, std::size_t n) {
    (void)units;
    (void)n;
  }

 private:
  std::vector<ParamUnit> units_;
  std::size_t flat_size_;
};

// The whole flat parameter buffer where the host may write it in place: a FullParameterStore's
// in a host build; nullptr otherwise (device memory, a sharded store, a memory plan's store).
// Loading weights writes there directly instead of through a host copy.
float* host_writable_params(ParameterStore& store);

// Makes a store over a model's parameter units (their flat end `flat`): how a model that lays
// out its own units (core::GridModel) is given a sharded one (zero::ShardedParameterStore).
using StoreFactory = std::function<std::unique_ptr<ParameterStore>(std::vector<ParamUnit> units,
                                                                   std::size_t flat)>;

// Both flat buffers whole on this rank (one rank, data parallelism, ZeRO 1).
class FullParameterStore : public ParameterStore {
 public:
  // Without `gradients` (inference: colossal_eval, colossal_generate) only the parameters are
  // allocated; gradients() then throws std::logic_error and the pieces are empty.
  FullParameterStore(std::vector<ParamUnit> units, std::size_t flat_size, MemoryTracker& tracker,
                     bool gradients = true);

  const float* gather(int unit) override { return params_.data() + units()[unit].begin; }
  float* begin_write(int unit) override { return params_.data() + units()[unit].begin; }
  float* gradients(int unit) override;
  // Calls the hook with the unit's first offset: backward finishes units from the last to the
  // first, so [offset, flat_size()) is final then.
  void gradients_done(int unit) override;
  void zero_gradients() override;
  float* full_params() override { return params_.data(); }
  float* full_grads() override { return grads_.data(); }
  bool keeps_whole() const override { return true; }
  std::vector<std::pair<float*, std::size_t>> gradient_pieces(std::size_t begin,
                                                              std::size_t end) override {
    if (begin >= end || !has_gradients_) return {};
    return {{grads_.data() + begin, end - begin}};
  }

  // Called from gradients_done() (empty: not called): lets data-parallel all-reduces of finished
  // buckets start while backward continues. The kernels that wrote the unit's gradients may still
  // be running: the hook orders its reads after them (a fence, or NCCL's event).
  void set_gradients_ready_hook(std::function<void(std::size_t offset)> hook) {
    gradients_ready_ = std::move(hook);
  }

 private:
  DeviceArray<float> params_, grads_;
  bool has_gradients_ = true;
  std::function<void(std::size_t)> gradients_ready_;
};

}  // namespace colossal::core
