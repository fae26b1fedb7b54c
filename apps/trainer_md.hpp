// colossal_train's loop for parallel.tensor.mode 2d, 2.5d and 3d: the sharded models of
// core/model2d.hpp (2D, and 2.5D with a depth group) and core/model3d.hpp (3D), with data
// parallelism on top, through zero/ as in 1d (zero::GradientSync with the model's norm ranges,
// zero::ShardedAdamW over the model's own store: ZeRO 0 or 1; the model from
// apps/model_factory). Data -> micro-batches with gradient accumulation -> clipped AdamW ->
// progress, metrics.csv, validation, training checkpoints (checkpoint.every, resume, a stop on
// SIGTERM/SIGUSR1) and model.h5, as apps::Trainer does for 1d; checkpoints hold the same logical
// tensors, so either trainer resumes the other's. What those models do not run yet (pipeline,
// sequence, ZeRO 2-3, offload, fused attention, activation checkpointing) the config refuses by
// key. docs/training-step.md says what is left before apps::Trainer runs these models too.
// The end-of-run sample runs on rank 0 with the whole model, as colossal_generate does.
//
// Ranks: the mesh of apps::Trainer with tensor innermost (rank = data index * tensor size +
// tensor rank); inside the tensor group, rank r is grid position (i, j) = (r / q, r % q) in 2D,
// (depth layer, i, j) = (r / q^2, r / q % q, r % q) in 2.5D and (i, j, l) = (r / q^2, r / q % q,
// r % q) in 3D.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/model_factory.hpp"
#include "apps/trainer.hpp"
#include "core/grid_model.hpp"
#include "core/tensor2d.hpp"
#include "core/model3d.hpp"

namespace colossal::apps {

class TrainerMD {
 public:
  TrainerMD(const io::Config& config, std::FILE* log, parallel::Communicator* world = nullptr);
  ~TrainerMD();

  TrainSummary train();
  // Mean validation loss over whole rounds of micro-batches (every data rank and depth layer
  // runs the same forwards): the windows of data.val_path rounded down to a multiple of
  // micro_batch x data x depth.
  double evaluate();
  // Every logical (Hugging Face) tensor in one rank's layout (collective over the tensor group).
  std::vector<float> logical_parameters();
  std::vector<core::ParamSpec> logical_table() const;
  const std::string& plan() const { return plan_; }
  // A checkpoint of the model and AdamW state after `step` steps (`optimizer_step` updates
  // applied); collective. Data rank 0 (2.5D: depth layer 0) writes, each element from the rank
  // that owns it.
  void save_checkpoint(int64_t step, int64_t optimizer_step);
  // checkpoint.resume: auto: restores the newest intact checkpoint (written under any layout) and
  // returns its state, step 0 when there is none; collective.
  io::CheckpointState resume();
  parallel::Communicator& tensor_parallel() { return *tp_; }
  parallel::Communicator& data_parallel() { return *dp_; }
  const core::MemoryTracker& memory() const { return tracker_; }

 private:
  void print(const char* fmt, ...) const;
  std::string sample(const std::string& model_path) const;

  io::Config config_;
  std::FILE* log_;
  std::unique_ptr<parallel::Communicator> own_world_;
  parallel::Communicator* world_;
  parallel::Groups groups_;
  parallel::Communicator* dp_;
  parallel::Communicator* tp_;
  // The tensor group's sub-groups (parallel::make_tensor_grid_groups) and their model-side views.
  parallel::TensorGridGroups tensor_groups_;
  int depth_ = 1, depth_rank_ = 0;  // 2.5D layers and this rank's
  core::MemoryTracker tracker_;
  std::unique_ptr<core::Gemm> gemm_;
  BuiltModel built_;  // apps/model_factory.hpp
  core::GridModel* model_ = nullptr;
  // zero/: AdamW (ZeRO 0-1) on the model's store, and the data-parallel sum and global norm.
  std::unique_ptr<zero::ShardedAdamW> optimizer_;
  std::unique_ptr<zero::GradientSync> gradients_;
  std::unique_ptr<io::TokenFile> train_data_, val_data_;
  std::unique_ptr<io::TrainSampler> sampler_;
  core::DeviceArray<int32_t> inputs_, targets_;
  std::vector<int32_t> host_inputs_, host_targets_;
  std::string plan_;
};

}  // namespace colossal::apps
