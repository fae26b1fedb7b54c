#include "apps/trainer_md.hpp"
#include "apps/init_weights.hpp"

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <filesystem>
#include <stdexcept>
#include <tuple>

#include "core/model2d.hpp"
#include "io/hdf5_file.hpp"

namespace colossal::apps {

TrainerMD::TrainerMD(const io::Config& config, std::FILE* log, parallel::Communicator* world)
    : config_(config), log_(log), gemm_(core::make_default_gemm(config.hardware.gemm,
                                        config.train.precision)) {
  world_ = run_world(config_, world, own_world_);
  const auto& par = config_.parallel;
  groups_ = parallel::make_groups(
      *world_, parallel::DeviceMesh(parallel::MeshShape{
                   .data = par.data, .pipeline = 1, .tensor = par.tensor, .sequence = 1}));
  dp_ = groups_.dp.get();
  tp_ = groups_.tp.get();
  const core::TensorMode mode = par.tensor_mode;
  // The tensor group's sub-grid and the sub-groups its model needs, from the mesh.
  const parallel::TensorSubGrid sub_grid(mode, par.tensor, par.tensor_depth);
  tensor_groups_ = parallel::make_tensor_grid_groups(*tp_, sub_grid);
  const auto& t = config_.train;
  depth_ = sub_grid.depth();
  depth_rank_ = sub_grid.coord_of(tp_->rank()).depth;
  // ZeRO 1 splits the flat buffer into equal data-rank shards of 16-float multiples.
  const std::size_t unit_multiple = par.zero_stage == 1 ? std::size_t(dp_->size()) * 16 : 16;
  built_ = make_stage_model(config_, t.seq_len, tracker_, *gemm_,
                            core::ModelOptions{.unit_multiple = unit_multiple}, &tensor_groups_);
  model_ = built_.sharded();
  plan_ = "tensor: {size: " + std::to_string(par.tensor) + ", mode: " +
          core::tensor_mode_name(mode) + "}  # " + built_.grid_text +
          "\ndata: " + std::to_string(par.data) + "\nzero: " + std::to_string(par.zero_stage) +
          "\nmicro_batch: " + std::to_string(t.micro_batch) + "\naccumulation: " +
          std::to_string(config_.accumulation_steps()) + "\n";
  open_run_data(config_, train_data_, sampler_, val_data_);
  model_->init_parameters(t.seed);
  core::FullParameterStore& store = model_->full_store();
  optimizer_ = std::make_unique<zero::ShardedAdamW>(
      model_->parameters(), store, *dp_, tracker_,
      zero::OptimizerOptions{.stage = par.zero_stage});
  print("%s", init_from_weights(config_, *world_, {{optimizer_.get(), model_}}).c_str());
  gradients_ = std::make_unique<zero::GradientSync>(
      model_->parameters(), store, *dp_, tracker_,
      zero::GradientSyncOptions{.bucket_mb = par.bucket_mb,
                                .tensor = tp_,
                                .counted_ranges = model_->norm_ranges()});
  const std::size_t tokens = std::size_t(t.micro_batch) * t.seq_len;
  host_inputs_.resize(tokens);
  host_targets_.resize(tokens);
  inputs_ = core::DeviceArray<int32_t>(tracker_, core::MemCategory::data, tokens);
  targets_ = core::DeviceArray<int32_t>(tracker_, core::MemCategory::data, tokens);
  print("plan:\n%s", plan_.c_str());
  print("memory (per rank): %s\n", tracker_.summary().c_str());
}

TrainerMD::~TrainerMD() = default;

void TrainerMD::print(const char* fmt, ...) const {
  if (log_ == nullptr) return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(log_, fmt, args);
  va_end(args);
  std::fflush(log_);
}

std::vector<core::ParamSpec> TrainerMD::logical_table() const {
  return core::parameter_table(config_.model);
}

std::vector<float> TrainerMD::logical_parameters() {
  const auto table = logical_table();
  std::vector<float> out(core::parameter_units(table, 16).back().end, 0.0f);
  std::vector<float> local(model_->flat_size());
  core::copy_to_host(local.data(), model_->params(), local.size() * sizeof(float));
  // Every element from its one owner (2.5D: in depth layer 0); the sum over the tensor group
  // assembles the whole.
  core::export_owned_runs(model_->logical_runs(), table, local.data(), out.data());
  tp_->all_reduce_sum(out);
  return out;
}

void TrainerMD::save_checkpoint(int64_t step, int64_t optimizer_step) {
  ChunkState held;
  io::CheckpointShard mine;
  add_chunk_checkpoint(*optimizer_, *model_, dp_->rank() > 0, held, mine);
  const auto& t = config_.train;
  const io::CheckpointState state{step, optimizer_step,
                                  step * int64_t(t.global_batch) * t.seq_len, int64_t(t.seed),
                                  config_.text, plan_};
  write_checkpoint_over(*world_, config_, logical_table(), mine, state);
}

io::CheckpointState TrainerMD::resume() {
  ChunkState state;
  io::CheckpointShard wanted, owned;
  add_chunk_resume(*optimizer_, *model_, dp_->rank() > 0, state, wanted, owned);
  std::string log;
  const io::CheckpointState resumed =
      read_newest_checkpoint(config_, *world_, logical_table(), wanted, owned, log);
  print("%s", log.c_str());
  if (resumed.step > 0) restore_chunk(*optimizer_, *model_, state);
  return resumed;
}

double TrainerMD::evaluate() {
  if (!val_data_) throw std::runtime_error("no validation data: set data.val_path");
  const int T = config_.train.seq_len, B = config_.train.micro_batch;
  const int64_t windows = io::validation_windows(*val_data_, T, config_.data.val_windows);
  const int64_t replicas = int64_t(dp_->size()) * depth_;
  const int64_t replica = int64_t(dp_->rank()) * depth_ + depth_rank_;
  const int64_t rounds = windows / (B * replicas);
  if (rounds == 0) {
    throw CollectiveError("data.val_path has " + std::to_string(windows) + " windows, fewer " +
                          "than one round of train.micro_batch x data x depth = " +
                          std::to_string(B * replicas));
  }
  double total = 0.0;
  for (int64_t k = 0; k < rounds; ++k) {
    io::validation_batch(*val_data_, T, (k * replicas + replica) * B, B, host_inputs_.data(),
                         host_targets_.data());
    core::copy_to_device(inputs_.data(), host_inputs_.data(), host_inputs_.size() * 4);
    core::copy_to_device(targets_.data(), host_targets_.data(), host_targets_.size() * 4);
    // The mean over the tensor group's windows (B, or B x depth in 2.5D).
    total += model_->forward(inputs_.data(), targets_.data(), B, 0.0f) * double(B * depth_);
  }
  return dp_->all_reduce_sum_value(total) / double(rounds * B * replicas);
}

TrainSummary TrainerMD::train() {
  const auto& t = config_.train;
  const auto& spec = config_.model;
  TrainSummary summary;
  const double tokens_per_step = double(t.global_batch) * t.seq_len;
  core::LrSchedule schedule{t.optimizer.lr, t.optimizer.min_lr, t.optimizer.warmup, t.steps};
  core::AdamWParams hp{t.optimizer.lr, t.optimizer.beta1, t.optimizer.beta2, t.optimizer.eps,
                       t.optimizer.weight_decay};
  const bool writer = world_->rank() == 0;
  int64_t first_step = 0;
  if (config_.checkpoint.resume == io::ResumeMode::automatic) {
    const auto resuming = Clock::now();
    const io::CheckpointState state = resume();
    first_step = state.step;
    if (first_step > 0) print("resume took %.2f s\n", seconds_since(resuming));
    summary.first_step = first_step;
    // Steps a 1d run skipped (train.on_nonfinite: skip) applied no AdamW update.
    summary.skipped_steps = state.step - state.optimizer_step;
  }
  const int64_t skipped = summary.skipped_steps;
  // Rank 0 writes metrics.csv (not yet metrics.h5 or config.yaml; the line has no ETA).
  RunLog run_log(config_, RunLogOptions{.writer = writer,
                                        .first_step = first_step,
                                        .log = log_,
                                        .tokens_per_step = tokens_per_step,
                                        .flops_per_token = core::flops_per_token(spec, t.seq_len),
                                        .peak_flops = peak_flops(config_.hardware),
                                        .memory = &tracker_,
                                        .write_h5 = false,
                                        .write_config = false,
                                        .eta = false});
  const int accumulation = config_.accumulation_steps();
  const int64_t replicas = int64_t(dp_->size()) * depth_;
  const int64_t replica = int64_t(dp_->rank()) * depth_ + depth_rank_;
  const int64_t per_replica = t.global_batch / replicas;
  const float grad_scale = 1.0f / float(tokens_per_step);
  // Payload bytes this rank moves in the tensor group and its sub-groups (validation apart).
  auto traffic = [this] {
    double bytes = double(tp_->stats().total_payload_bytes());
    for (const auto& c : tensor_groups_.comms) {
      if (c) bytes += double(c->stats().total_payload_bytes());
    }
    return bytes;
  };
  double validation_traffic = 0.0;
  const double traffic_before = traffic();
  const auto save = [&](int64_t done) { save_checkpoint(done, done - skipped); };
  run_log.start();
  for (int64_t step = first_step; step < t.steps; ++step) {
    const auto step_start = Clock::now();
    model_->zero_grad();
    double loss = 0.0;
    for (int a = 0; a < accumulation; ++a) {
      sampler_->batch(step, replica * per_replica + int64_t(a) * t.micro_batch, t.micro_batch,
                      t.global_batch, host_inputs_.data(), host_targets_.data());
      core::copy_to_device(inputs_.data(), host_inputs_.data(), host_inputs_.size() * 4);
      core::copy_to_device(targets_.data(), host_targets_.data(), host_targets_.size() * 4);
      // The mean over the tensor group's tokens (one depth layer's or all of them in 2.5D).
      loss += model_->forward(inputs_.data(), targets_.data(), t.micro_batch, grad_scale) *
              double(t.micro_batch) * depth_;
      model_->backward(inputs_.data(), t.micro_batch);
    }
    // Sums over the replicas inside the tensor group, then over the data ranks, and the norm
    // (every element once: the 2.5D depth layers hold equal copies, layer 0 counts).
    model_->reduce_gradients();
    const double norm = gradients_->reduce();
    loss = dp_->all_reduce_sum_value(loss) / double(t.global_batch);
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      // The update was not applied: checkpoint the last good state so the run can resume.
      const std::string saved = checkpoint_before_failure(config_, step, save);
      throw NonFiniteError("step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                           ", gradient norm " + std::to_string(norm) + " is not finite" + saved +
                           "; lower train.optimizer.lr or check the data");
    }
    hp.lr = schedule.at(step);
    optimizer_->step(hp, step + 1 - skipped,
                     float(core::clip_coefficient(norm, t.optimizer.grad_clip)));
    StepRecord record{.loss = loss, .lr = hp.lr, .grad_norm = norm,
                      .seconds = seconds_since(step_start)};
    if (val_data_ && ((config_.eval.every > 0 && (step + 1) % config_.eval.every == 0) ||
                      step + 1 == t.steps)) {
      const double before = traffic();
      record.val_loss = evaluate();
      validation_traffic += traffic() - before;
      print("step %lld: val loss %.6g\n", (long long)step + 1, record.val_loss);
    }
    run_log.record(step, record);
    if (end_step(*world_, config_, step + 1, save, summary, run_log.start_time(), log_)) {
      run_log.finish(summary);
      return summary;
    }
  }
  run_log.finish(summary);
  const double trained = double(std::max<int64_t>(t.steps - first_step, 1));
  print("tensor-parallel traffic (rank 0): %s per step\n",
        core::format_bytes((traffic() - traffic_before - validation_traffic) / trained).c_str());
  summary.model_path = config_.log.dir + "/model.h5";
  const std::vector<float> values = logical_parameters();
  if (writer) io::write_model_file(summary.model_path, logical_table(), values.data(), config_.text,
                                   plan_);
  summary.peak_rss_bytes = core::peak_rss_bytes();
  if (writer && config_.sample.tokens > 0) summary.sample = sample(summary.model_path);
  return summary;
}

// The end-of-run sample, as colossal_generate makes it: on rank 0, the whole model in a one-rank
// 1d trainer holding the written weights (the same text a 1d run of these weights would print).
std::string TrainerMD::sample(const std::string& model_path) const {
  io::Config one = config_;
  one.parallel = io::ParallelConfig{};
  one.train.micro_batch = 1;
  one.train.global_batch = 1;
  one.checkpoint.every = 0;
  one.checkpoint.resume = io::ResumeMode::never;
  Trainer trainer(one, nullptr);
  trainer.load_weights(model_path);
  return trainer.generate(config_.sample.prompt, config_.sample.tokens,
                          config_.sample.temperature, config_.train.seed);
}

}  // namespace colossal::apps
