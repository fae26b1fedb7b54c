#include "apps/trainer.hpp"
#include "apps/init_weights.hpp"
#include "io/init_from.hpp"

#include "core/host_threads.hpp"

#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <array>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <iomanip>
#include <sstream>
#include <tuple>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_map>
#include <span>
#include <utility>
#include <type_traits>

#include "apps/memory_fit.hpp"
#include "apps/on_root.hpp"
#include "core/cpu_peak.hpp"
#include "core/kernels.hpp"
#include "core/layers.hpp"
#include "core/rng.hpp"
#include "io/hdf5_file.hpp"
#include "io/hf_export.hpp"
#include "parallel/local_communicator.hpp"
#include "parallel/local_device.hpp"
#include "parallel/mpi_communicator.hpp"
#include "parallel/staged_communicator.hpp"

namespace colossal::apps {

namespace {
// The cost model's seconds per step by profiler kind, then the untimed rest (negative: not
// predicted), for the --profile-steps table: the step graph's op kinds, the optimizer, and as
// communication the collectives inside the layers, the stage-boundary sends, the pipeline bubble
// (spent waiting in them), the exposed gradient reduction and the gradient norm after it; the
// rest is what the step has beyond those but for waiting for shared cores, which slows every
// kind. The grid forms price their compute in closed form, not by kind: their compute and the
// rest are "-".
std::vector<double> predicted_by_kind(const planner::TimePrediction& t) {
  std::vector<double> out(core::Profiler::kKinds + 1, -1.0);
  double listed = 0.0;
  for (int k = 0; k < core::Profiler::kKinds; ++k) {
    const auto kind = core::WorkKind(k);
    if (const auto it = t.kind_compute.find(core::work_kind_key(kind));
        it != t.kind_compute.end()) {
      out[k] = it->second;
      listed += it->second;
    }
  }
  // The gradient norm is timed with the reduction it follows.
  out[int(core::WorkKind::optimizer)] = t.optimizer - t.gradient_norm;
  out[int(core::WorkKind::communication)] =
      t.tensor_comm + t.pipeline_comm + t.bubble + t.data_comm - t.hidden_comm + t.gradient_norm;
  if (!t.kind_compute.empty()) {
    listed += out[int(core::WorkKind::optimizer)] + out[int(core::WorkKind::communication)];
    out[core::Profiler::kKinds] = std::max(0.0, t.step - t.shared_cores - listed);
  }
  return out;
}

}  // namespace

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One model chunk as the pipeline executor sees it: its tokens sampled and uploaded before a
// forward (only where they are read), the model's forward and backward of a slot, and gradient
// buckets that start reducing during the last micro-batch's backward.
class Trainer::ChunkStage final : public parallel::PipelineStage {
 public:
  ChunkStage(Trainer& trainer, int index) : t_(trainer), index_(index) {}

  void load(int micro, int slot) override {
    // Only the chunk that embeds needs the tokens, and the one with the head the targets.
    if (!chunk().range.embeds && !chunk().range.head) return;
    const auto& train = t_.config_.train;
    core::Profiler::Scope scope(&t_.profiler_, core::WorkKind::data);
    // Data rank r (x the model's batch replicas, 2.5D depth layers) takes its share of the batch.
    const core::StageModel& m = *chunk().model;
    const int64_t replicas = int64_t(t_.dp_->size()) * m.batch_replicas();
    const int64_t replica = int64_t(t_.dp_->rank()) * m.batch_replicas() + m.batch_replica();
    const int64_t first = replica * (train.global_batch / replicas);
    t_.sampler_->batch(t_.step_, first + int64_t(micro) * train.micro_batch, train.micro_batch,
                       train.global_batch, t_.host_inputs_.data(), t_.host_targets_.data());
    t_.upload(slot, index_);
  }
  double forward(int micro, int slot) override {
    const auto& train = t_.config_.train;
    // Gradients summed over ranks are the gradient of the mean loss over the global batch.
    const float grad_scale = 1.0f / (float(train.global_batch) * float(train.seq_len));
    // A step's later micro-batches see the weights its first one saw (a chunk's forwards run in
    // micro-batch order; the optimizer steps after the last): bf16's copy of them is kept.
    if (micro > 0) model().parameters_unchanged();
    return model().forward(t_.slot_inputs(slot, index_), t_.slot_targets(slot, index_),
                           train.micro_batch, grad_scale, slot);
  }
  void before_backward(int micro) override {
    // On the last micro-batch, gradient buckets start reducing as soon as they are final.
    // Not for 2d / 2.5d / 3d: their reduce_gradients sums the replicated vectors inside the
    // tensor group after backward, which an all-reduce in flight over the same floats forbids.
    chunk().gradients->set_overlap(micro + 1 == t_.config_.accumulation_steps() &&
                                   t_.config_.parallel.tensor_mode == core::TensorMode::d1);
  }
  void backward(int /*micro*/, int slot) override {
    model().backward(t_.slot_inputs(slot, index_), t_.config_.train.micro_batch, slot);
  }
  void after_backward(int /*micro*/) override { chunk().gradients->set_overlap(false); }
  double forward_only(int batch) override {
    if (index_ > 0) t_.upload(0, index_);  // the tokens are in the host buffers already
    return model().forward(t_.slot_inputs(0, index_), t_.slot_targets(0, index_), batch, 0.0f, 0);
  }
  void decode(int rows, int position) override {
    core::Model& m = *chunk().dense;
    if (t_.decode_unchanged_) m.parameters_unchanged();
    m.decode(chunk().inputs.data(), rows, position,
             t_.decode_want_logits_ ? t_.decode_logits_.data() : nullptr);
  }
  std::size_t decode_floats(int rows) const override {
    if (t_.virtual_stages_ == 1) return 0;
    return std::size_t(rows) * std::size_t(t_.config_.model.hidden);
  }
  float* decode_input() override { return chunk().dense->decode_input(); }
  const float* decode_output() override { return chunk().dense->decode_output(); }
  std::size_t boundary_floats(int batch) const override {
    // A single stage has no boundary (nor do the 2D / 3D models buffers for one).
    if (t_.virtual_stages_ == 1) return 0;
    return std::size_t(t_.chunks_[std::size_t(index_)].model->stage_floats(batch));
  }
  float* stage_input(int slot) override { return model().stage_input(slot); }
  const float* stage_output(int slot) override { return model().stage_output(slot); }
  float* output_gradient() override { return model().output_gradient(); }
  const float* input_gradient() override { return model().input_gradient(); }

 private:
  Chunk& chunk() { return t_.chunks_[std::size_t(index_)]; }
  core::StageModel& model() { return *chunk().model; }
  Trainer& t_;
  int index_;
};

double peak_flops(const io::Config& config) {
  const io::HardwareConfig& hardware = config.hardware;
  if (hardware.peak_tflops > 0) return hardware.peak_tflops * 1e12;
  // The spec's peak in the run's precision (a GPU preset's bf16 tensor-core peak for bf16 runs,
  // its fp32/TF32 one otherwise; "host": the sgemm ceiling of the 2-core AVX-512 development
  // machine, 2 x 177 GFLOP/s, shared/BUILD-NOTES.md, for both). Set hardware.peak_tflops for
  // other machines.
  const bool bf16 = config.train.precision == core::GemmPrecision::bf16;
  return hardware.file.empty() ? planner::hardware_preset(hardware.preset).peak_flops(bf16)
                               : planner::read_hardware(hardware.file).peak_flops(bf16);
}

double cpu_rank_peak(double per_core, const core::ThreadPlan& plan, bool bf16_units,
                     double bf16_multiple) {
  // The cores this rank's threads run on at once: all of them, or its share of the node's
  // cores where the node's threads outnumber them (plan.oversubscribed()).
  const double cores = std::min(double(plan.threads),
                                double(plan.node_cores) / std::max(1, plan.local_ranks));
  return per_core * cores * (bf16_units ? bf16_multiple : 1.0);
}

JobPeak job_peak_flops(const io::Config& config, parallel::Communicator& world) {
  const bool bf16 = config.train.precision == core::GemmPrecision::bf16;
  const bool on_gpu = device_resident_build() || config.hardware.gemm == "cublas";
  const std::string spec =
      config.hardware.file.empty() ? "preset " + config.hardware.preset : config.hardware.file;
  double mine = peak_flops(config);
  std::string how;
  double measured_per_core = 0.0;
  if (on_gpu) {
    // Ranks sharing one GPU (the staged MPI path) count it once between them. Asked over
    // MPI_COMM_WORLD, so only when this world is all of it (a test's one-rank reference
    // trainer beside the others must not wait for them).
    int sharing = 1;
    int initialized = 0, world_size = 1;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world.size() > 1 && world.size() == world_size) {
      sharing = parallel::ranks_sharing_this_gpu();
    }
    mine /= sharing;
    how = (config.hardware.peak_tflops > 0
               ? std::string("hardware.peak_tflops")
               : "the " + std::string(bf16 ? "bf16" : "fp32") + " peak of hardware " + spec) +
          (sharing > 1 ? " per GPU, " + std::to_string(sharing) + " ranks sharing each"
                       : " per rank");
  } else if (config.hardware.peak_tflops > 0) {
    how = "hardware.peak_tflops per rank";
  } else {
    // Rank 0 measures its threads once per process; the other ranks sleep meanwhile (blocking
    // MPI busy-polls, and a spinning rank on a sibling hyperthread or a shared core would take
    // half of what is measured). Every rank then counts the cores its threads run on at once
    // at that rate per core. Nodes are taken to be alike, as a job's nodes are.
    static bool first = true;
    static core::CpuPeak cpu;
    static double cpu_per_core = 0.0;
    const core::ThreadPlan plan = core::current_thread_plan();
    // Together first, so the others' sleep covers rank 0's measurement. Every rank, every call:
    // `first` can differ between ranks (a test's one-rank trainer on some of them), and the
    // collectives here must not.
    if (world.size() > 1) world.barrier();
    if (first && world.rank() == 0) {
      cpu = core::measure_cpu_peak(core::HostThreads::shared());
      // A core each: the fastest thread's rate (a core another process took part of does not
      // lower it; all ran for the same time side by side, so at the clock all cores keep
      // together). More threads than cores shared them: their total over the cores.
      cpu_per_core = cpu.threads <= plan.cores
                         ? cpu.best_thread
                         : cpu.fp32_flops / std::max(1, std::min(cpu.threads, plan.cores));
    }
    if (first && world.rank() != 0) {  // past the longest measurement, not polling in MPI
      std::this_thread::sleep_for(
          std::chrono::duration<double>(core::kMeasureSeconds + 0.04));
    }
    first = false;
    const double per_core = world.all_reduce_sum_value(world.rank() == 0 ? cpu_per_core : 0.0);
    measured_per_core = per_core;
    if (per_core > 0) {
      // The bf16 units' multiple where the products run on them (oneDNN), not where bf16 is
      // emulated on the fp32 units.
      const bool bf16_units = core::default_gemm_keeps_copy(config.hardware.gemm,
                                                            config.train.precision);
      const double multiple = core::bf16_peak_multiple(core::host_bf16_hardware());
      mine = cpu_rank_peak(per_core, plan, bf16_units, multiple);
      if (world.rank() == 0) {  // the text is rank 0's start-up line
        char rate[32];
        std::snprintf(rate, sizeof rate, "%.3g", per_core / 1e9);
        how = "measured: " + std::string(rate) + " GFLOP/s per core (" + cpu.vectors +
              " multiply-adds) x " + std::to_string(plan.threads) + " thread" +
              (plan.threads == 1 ? "" : "s") + " per rank";
        if (plan.oversubscribed()) how += ", the node's cores shared by its ranks";
        if (bf16_units && multiple >= 16) how += ", x 16 for AMX-BF16";
        else if (bf16_units && multiple > 1) how += ", x 2 for AVX512-BF16";
        else if (bf16) how += " (bf16 emulated on the fp32 units)";
      }
    } else {
      how = "the peak of hardware " + spec + " per rank";
    }
  }
  return {world.all_reduce_sum_value(mine), how, measured_per_core};
}

parallel::Communicator* run_world(const io::Config& config, parallel::Communicator* world,
                                  std::unique_ptr<parallel::Communicator>& own) {
  if (world == nullptr) {
    own = std::make_unique<parallel::LocalCommunicator>();
    world = own.get();
  }
  const auto& par = config.parallel;
  if (world->size() != par.world_size()) {
    throw CollectiveError("parallel.data = " + std::to_string(par.data) +
                          " x parallel.tensor.size = " + std::to_string(par.tensor) +
                          " x parallel.sequence = " + std::to_string(par.sequence) +
                          " x parallel.pipeline.size = " + std::to_string(par.pipeline) + " needs " +
                          std::to_string(par.world_size()) + " ranks but " +
                          std::to_string(world->size()) +
                          " ranks were started; change parallel.data or start " +
                          std::to_string(par.world_size()) + " ranks");
  }
  return world;
}

std::vector<int32_t> prompt_tokens(const std::string& prompt, const io::TokenFile& data,
                                   int vocab, const std::string& key) {
  std::vector<int32_t> tokens;
  auto outside = [&](long long token, const std::string& what) {
    return io::ConfigError(key + ": " + what + " " + std::to_string(token) +
                           " is outside the model's vocabulary (model.vocab: " +
                           std::to_string(vocab) + ")");
  };
  if (data.format() == io::TokenFile::Format::raw_bytes) {
    for (unsigned char c : prompt.empty() ? std::string("\n") : prompt) {
      if (c >= vocab) throw outside(c, "byte");
      tokens.push_back(c);
    }
    return tokens;
  }
  const std::string why =
      key + ": '" + prompt + "' is not token ids; " + data.path() +
      " holds a tokenizer's ids (llm.c format), which colossal cannot make from text: give the "
      "prompt as ids separated by spaces, e.g. '50256 464' for GPT-2's <|endoftext|>The "
      "(scripts/tokenize.py --encode TEXT --tokenizer tokenizer.json prints them)";
  std::size_t at = 0;
  while (true) {
    while (at < prompt.size() && (std::isspace(static_cast<unsigned char>(prompt[at])) ||
                                  prompt[at] == ',')) {
      ++at;
    }
    if (at == prompt.size()) break;
    std::size_t end = at;
    while (end < prompt.size() && std::isdigit(static_cast<unsigned char>(prompt[end]))) ++end;
    if (end == at || end - at > 9 ||
        (end < prompt.size() && !std::isspace(static_cast<unsigned char>(prompt[end])) &&
         prompt[end] != ',')) {
      throw io::ConfigError(why);
    }
    const long long token = std::stoll(prompt.substr(at, end - at));
    if (token >= vocab) throw outside(token, "token");
    tokens.push_back(int32_t(token));
    at = end;
  }
  if (tokens.empty()) throw io::ConfigError(why);
  return tokens;
}

void open_run_data(const io::Config& config, std::unique_ptr<io::TokenFile>& train,
                   std::unique_ptr<io::TrainSampler>& sampler, std::unique_ptr<io::TokenFile>& val) {
  const int T = config.train.seq_len, V = config.model.vocab;
  train = std::make_unique<io::TokenFile>(config.data.path, "data.path");
  train->check(V, static_cast<std::size_t>(T) + 2,
               "train.seq_len + 1 tokens for one window, and more than one window");
  sampler = std::make_unique<io::TrainSampler>(*train, T, config.train.seed);
  if (!config.data.val_path.empty()) {
    val = std::make_unique<io::TokenFile>(config.data.val_path, "data.val_path");
    val->check(V, static_cast<std::size_t>(T) + 1,
               "train.seq_len + 1 tokens for one validation window");
  }
}

Trainer::Trainer(const io::Config& config, std::FILE* log, parallel::Communicator* world,
                 TrainerOptions options)
    : config_(options.inference ? inference_config(config) : config),
      inference_(options.inference),
      log_(log),
      gemm_(core::make_default_gemm(config.hardware.gemm, config.train.precision,
                                    config.train.tf32)) {
  const bool memory_plan = options.memory_plan;
  tracker_.set_dry_run(memory_plan);
  world_ = run_world(config_, world, own_world_);
  const auto& par = config_.parallel;
  // The mesh (tensor innermost, then sequence, data, pipeline): this rank's groups along each axis.
  const parallel::DeviceMesh mesh(parallel::MeshShape{
      .data = par.data, .pipeline = par.pipeline, .tensor = par.tensor, .sequence = par.sequence});
  groups_ = parallel::make_groups(*world_, mesh);
  dp_ = groups_.dp.get();
  tp_ = groups_.tp.get();
  sp_ = groups_.sp.get();
  pp_ = groups_.pp.get();
  if (tp_->size() > 1) tensor_group_ = std::make_unique<parallel::CommunicatorGroup>(*tp_);
  // Ring attention splits sequences, so the sequence ranks of a replica hold the same parameters
  // and see different tokens: their gradients are summed (and ZeRO shards over) the data and
  // sequence axes together, the ranks with this rank's tensor and pipeline coordinates.
  grad_ = dp_;
  if (sp_->size() > 1) {
    sequence_group_ = std::make_unique<parallel::CommunicatorGroup>(*sp_);
    grad_owner_ = parallel::make_group(*world_, mesh, {parallel::Axis::sequence,
                                                       parallel::Axis::data});
    grad_ = grad_owner_.get();
  }
  chunk_ = config_.train.seq_len / sp_->size();
  const auto& train = config_.train;
  const auto& spec = config_.model;
  // Pipeline: this rank's stage, its blocks, its schedule, and the ranks it talks to.
  // Virtual stages: one per rank, or `chunks` per rank under the interleaved schedule (virtual
  // stage c * stages + rank); the partition is over the virtual stages.
  const int stages = pp_->size(), stage = pp_->rank();
  const int chunks = par.pipeline_chunks;
  virtual_stages_ = stages * chunks;
  stage_layers_ = pipeline_layers(config_);
  schedule_ = parallel::pipeline_schedule(par.pipeline_schedule, stages, stage,
                                          config_.accumulation_steps(), chunks);
  chunks_.resize(chunks);
  for (int c = 0; c < chunks; ++c) {
    Chunk& chunk = chunks_[c];
    chunk.virtual_stage = c * stages + stage;
    const int v = chunk.virtual_stage;
    chunk.range = core::StageRange{0, 0, v == 0, v == virtual_stages_ - 1};
    for (int s = 0; s < v; ++s) chunk.range.layer_begin += stage_layers_[s];
    chunk.range.layer_end = chunk.range.layer_begin + stage_layers_[v];
    std::vector<parallel::PipelineAction> mine;
    for (const auto& a : schedule_) {
      if (a.chunk == c) mine.push_back(a);
    }
    // Inference: one forward at a time through the stages (pipeline_forward), in slot 0.
    chunk.slots = inference_ ? 1 : parallel::peak_in_flight(mine);
  }
  zero::PipelineLinks links;
  if (stages > 1) {
    // The first and last stage of each (tensor, sequence, data) position share the tied
    // embedding; ranks of other stages get none (null).
    tied_owner_ = parallel::make_embedding_group(*world_, mesh);
    links = zero::PipelineLinks{pp_, tied_owner_.get(), true};
  }
  open_run_data(config_, train_data_, sampler_, val_data_);
  if (!inference_ && !config_.eval.choices.empty()) {
    choice_examples_ = load_choices(*world_, config_.eval.choices, "eval.choices", config_,
                                    config_.eval.choices_examples);
  }
  // Parameter units padded to dp*16 floats, so ZeRO splits every unit into equal slices. Each
  // chunk's optimizer owns the store its parameters live in (whole, or sharded by stage).
  const std::size_t unit_multiple = std::size_t(grad_->size()) * 16;
  // Activation checkpointing as checkpointing.policy decides for this pipeline rank: from the
  // hardware spec as written (not scaled to this rank's threads), so that every rank of a stage
  // derives the same schedule from the same config.
  // 2d / 2.5d / 3d take whole-block schedules, costed with the grid's own block sizes.
  activation_plan_ = inference_ ? inference_activation_plan(config_)
                                : activation_plan(config_, stage, hardware_spec(config_, 0));
  planner::HardwareSpec hw = hardware_spec(config_, core::HostThreads::shared().size());
  // The staged transport (ranks sharing a GPU) copies each pipeline message through the host.
  hw.pipeline_staged = pp_->backend() == "staged-mpi";
  // The plan first: an allocation that fails, in the build below or mid-run, is told about it.
  // Incremental decoding where the chunks are the 1d model (the grid forms sample through a
  // one-rank trainer, generate()).
  decode_requested_ = options.decode;
  decoding_ = options.decode && par.tensor_mode == core::TensorMode::d1;
  predict_rank(config_, stage, activation_plan_, hw, predicted_memory_, predicted_time_,
               inference_, decoding_);
  tracker_.set_plan(predicted_memory_.bytes);
  if (par.tensor_mode != core::TensorMode::d1) {
    // 2d / 2.5d / 3d: the tensor group's sub-grid and the sub-groups its model needs.
    tensor_grid_groups_ = parallel::make_tensor_grid_groups(
        *tp_, parallel::TensorSubGrid(par.tensor_mode, par.tensor, par.tensor_depth));
  }
  for (Chunk& chunk : chunks_) {
    if (par.tensor_mode != core::TensorMode::d1) {
      build_grid_chunk(chunk, memory_plan);
      continue;
    }
    const auto table = core::parameter_table(
        spec, unit_multiple, core::TensorSplit{tp_->size(), tp_->rank()}, chunk.range);
    auto units = core::parameter_units(table, unit_multiple);
    const std::size_t flat = units.back().end;
    zero::PipelineLinks chunk_links = links;
    if (stages > 1) {
      // Only the chunks holding the tied embedding sum it; the norm is summed over stages (and
      // over the chunks, by the trainer, when there are several); the head counts no embedding.
      // An untied LM head (llama's lm_head.weight) shares nothing with the embedding.
      const bool holds = (chunk.range.embeds || chunk.range.head) && spec.tied();
      if (!holds) chunk_links.tied = nullptr;
      chunk_links.count_embedding = !chunk.range.head || chunk.range.embeds;
      chunk_links.sum_over_stages = chunks_.size() == 1;
    }
    chunk.optimizer = std::make_unique<zero::ShardedAdamW>(
        table, std::move(units), flat, *grad_, tracker_,
        zero::OptimizerOptions{.stage = par.zero_stage,
                               .offload_optimizer = par.offload_optimizer,
                               .offload_params = par.offload_params,
                               .offload_fraction = par.offload_fraction,
                               .offload_params_fraction = par.offload_params_fraction,
                               .bf16_reduce = par.bf16_grad_reduce(),
                               .inference = inference_});
    if (!inference_) {
      chunk.gradients = std::make_unique<zero::GradientSync>(
          table, chunk.optimizer->store(), *grad_, tracker_,
          zero::GradientSyncOptions{.bucket_mb = par.bucket_mb,
                                    .bf16_reduce = par.bf16_grad_reduce(),
                                    .tensor = tp_->size() > 1 ? tp_ : nullptr,
                                    .sequence_split = par.sequence_split,
                                    .pipeline = chunk_links});
    }
    chunk.built = make_stage_model(
        config_, chunk_, tracker_, *gemm_,
        core::ModelOptions{.unit_multiple = unit_multiple,
                           .store = &chunk.optimizer->store(),
                           .tensor = tensor_group_.get(),
                           .sequence_split = par.sequence_split,
                           .sequence = sequence_group_.get(),
                           .stage = chunk.range,
                           .slots = chunk.slots,
                           .keep = activation_plan_.keep,
                           .selective = activation_plan_.selective,
                           .bf16_operands = bf16_operands(config_),
                           .bf16_probabilities = bf16_operands(config_)});
    chunk.model = chunk.built.model.get();
    chunk.dense = chunk.built.dense();
    // Inference: the store starts at zero, and the weights are read into it.
    if (!memory_plan && !inference_) chunk.model->init_parameters(train.seed);
    chunk.model->set_profiler(&profiler_);
  }
  // A GEMM that keeps a bf16 copy of the weights it holds gets tracked memory for it, as much as
  // the chunk that holds the most (the chunks take turns in it), as the memory plan predicts.
  if (gemm_->keeps_stable_copy() != run_layout(config_).bf16_weight_copy) {
    throw std::logic_error("colossal_train: the GEMM " + gemm_->name() +
                           (gemm_->keeps_stable_copy() ? " keeps" : " does not keep") +
                           " a bf16 copy of the weights, which the memory plan does not predict "
                           "(core::default_gemm_keeps_copy)");
  }
  if (gemm_->keeps_stable_copy()) {
    std::size_t held = 0;
    for (Chunk& chunk : chunks_) held = std::max(held, chunk.model->held_floats());
    weight_copy_ =
        core::DeviceArray<std::uint16_t>(tracker_, core::MemCategory::temporaries, held);
    if (!memory_plan) gemm_->set_stable_storage(weight_copy_.data(), held);
  }
  if (!memory_plan && !config_.model_init_from.empty()) {
    std::vector<WeightsChunk> held;
    for (Chunk& chunk : chunks_) held.push_back({chunk.optimizer.get(), chunk.model});
    print("%s", init_from_weights(config_, *world_, held).c_str());
  }
  model_ = chunks_.front().dense;
  optimizer_ = chunks_.front().optimizer.get();
  gradient_sync_ = chunks_.front().gradients.get();  // null under inference
  hardware_name_ = hw.name;
  agree_on_plan();
  // A host spec (the same on every rank: the gather is collective). The 2d / 3d closed forms
  // predict no per-micro-batch times to simulate: every rank of a stage's grid does the same
  // work, so the step lasts the node's thread-seconds (each stage's busy time, averaged over
  // the stages, which have equal ranks) over its cores, as the planner's search takes it.
  const core::ThreadPlan threads = core::current_thread_plan();
  if (hw.threads > 0 && predicted_time_.micro_forward.empty() && threads.oversubscribed()) {
    const double busy =
        pp_->all_reduce_sum_value(planner::busy_seconds(predicted_time_)) / pp_->size();
    planner::share_cores(predicted_time_, busy * threads.local_ranks * threads.threads,
                         threads.node_cores);
  } else if (hw.threads > 0 && !predicted_time_.micro_forward.empty()) {
    // Ranks taking turns on a node's cores (mpirun --oversubscribe) stretch the step as the
    // planner predicts it (planner::share_node_cores), from every pipeline stage's prediction.
    const std::size_t chunks = predicted_time_.micro_forward.size();
    std::vector<float> mine(predicted_time_.micro_forward.begin(),
                            predicted_time_.micro_forward.end());
    mine.insert(mine.end(), predicted_time_.micro_backward.begin(),
                predicted_time_.micro_backward.end());
    // The reduction's exposed part (what runs beside compute is not the rank's to wait for).
    mine.insert(mine.end(), {float(predicted_time_.data_comm - predicted_time_.hidden_comm),
                             float(predicted_time_.optimizer),
                             float(predicted_time_.step)});
    std::vector<float> all(std::size_t(pp_->size()) * mine.size());
    pp_->all_gather(mine, all);
    if (threads.oversubscribed()) {
      std::vector<planner::TimePrediction> stages(std::size_t(pp_->size()));
      for (std::size_t p = 0; p < stages.size(); ++p) {
        const float* v = all.data() + p * mine.size();
        stages[p].micro_forward.assign(v, v + chunks);
        stages[p].micro_backward.assign(v + chunks, v + 2 * chunks);
        stages[p].data_comm = v[2 * chunks];
        stages[p].optimizer = v[2 * chunks + 1];
        stages[p].step = v[2 * chunks + 2];
      }
      const auto& par = config_.parallel;
      const planner::SharedCoresLayout shared{
          par.data,           par.tensor,         par.sequence, par.pipeline,
          par.pipeline_chunks, config_.accumulation_steps(), par.pipeline_schedule,
          threads.node_cores, threads.local_ranks, threads.threads, threads.pinned};
      planner::share_node_cores(predicted_time_, shared, stages);
    }
  }
  // Host buffers hold whole windows (micro_batch x seq_len); the device gets this rank's part,
  // one per activation slot (a pipeline stage needs a micro-batch's tokens again in backward).
  const std::size_t tokens = std::size_t(train.micro_batch) * train.seq_len;
  const std::size_t chunk_tokens = std::size_t(train.micro_batch) * chunk_;
  token_staging_ = core::DeviceArray<int32_t>(staging_tracker_, core::MemCategory::offloaded,
                                              2 * chunk_tokens);
  host_inputs_.resize(tokens);
  host_targets_.resize(tokens);
  for (Chunk& chunk : chunks_) {
    using core::MemCategory;
    chunk.inputs = core::DeviceArray<int32_t>(tracker_, MemCategory::data, chunk_tokens * chunk.slots);
    chunk.targets = core::DeviceArray<int32_t>(tracker_, MemCategory::data, chunk_tokens * chunk.slots);
    // Its neighbours, tags and send buffers, planned once (scatter-gather over the tensor group
    // when every tensor rank holds the whole boundary).
    chunk.link = std::make_unique<parallel::StageLink>(
        parallel::StageLinkOptions{
            .pipeline = pp_,
            .tensor = par.sequence_split || par.tensor_mode != core::TensorMode::d1 ? nullptr : tp_,
            .virtual_stage = chunk.virtual_stage,
            .virtual_stages = virtual_stages_,
            .floats = virtual_stages_ == 1
                          ? 0  // no boundary to send
                          : std::size_t(chunk.model->stage_floats(train.micro_batch)),
            .slots = chunk.slots},
        tracker_);
    chunk.stage = std::make_unique<ChunkStage>(*this, int(&chunk - chunks_.data()));
    if (decoding_) chunk.dense->enable_decode(tracker_);
  }
  if (decoding_) decode_logits_.resize(std::size_t(config_.model.vocab));
  std::vector<parallel::PipelineExecutor::Chunk> executed;
  for (Chunk& chunk : chunks_) executed.push_back({chunk.stage.get(), chunk.link.get()});
  // Under NCCL each schedule step's messages go as one group (parallel/pipeline_schedule.hpp).
  std::vector<std::vector<parallel::PipelineMessage>> exchanges;
  if (pp_->matches_in_issue_order()) {
    const int micro = config_.accumulation_steps();
    if (!parallel::exchanges_complete(par.pipeline_schedule, stages, micro, chunks)) {
      throw std::logic_error(
          std::string("the ") + parallel::pipeline_schedule_name(par.pipeline_schedule) +
          " schedule's point-to-point groups deadlock or mismatch under " +
          std::string(pp_->backend()) + " for " + std::to_string(stages) + " stages, " +
          std::to_string(micro) + " micro-batches and " + std::to_string(chunks) +
          " chunk(s); run with parallel.comm: mpi or another schedule");
    }
    exchanges = parallel::pipeline_exchanges(par.pipeline_schedule, stages, stage, micro, chunks);
  }
  executor_ = std::make_unique<parallel::PipelineExecutor>(
      std::move(executed), schedule_, &profiler_, &trace_, std::move(exchanges));
}

Trainer::~Trainer() = default;

// 2d / 2.5d / 3d: the model lays out and owns its store (its units padded for ZeRO 1-2's equal
// data-rank shards); the optimizer and the gradient sync run on that store, the norm over the
// ranges the model counts once over the tensor group (and the pipeline stages).
void Trainer::build_grid_chunk(Chunk& chunk, bool memory_plan) {
  const auto& par = config_.parallel;
  const std::size_t unit_multiple = par.zero_stage >= 1 ? std::size_t(grad_->size()) * 16 : 16;
  core::StoreFactory store;
  if (inference_) {
    // The parameters whole, without gradients (inference_config leaves stage 0 here).
    store = [this](std::vector<core::ParamUnit> units, std::size_t flat) {
      return std::make_unique<core::FullParameterStore>(std::move(units), flat, tracker_,
                                                        /*gradients=*/false);
    };
  } else if (par.zero_stage == 2) {
    // ZeRO 2: each unit's gradients reduce-scattered over the data ranks as backward finishes it.
    store = [this](std::vector<core::ParamUnit> units, std::size_t flat) {
      return std::make_unique<zero::ShardedParameterStore>(
          std::move(units), flat, 2, *grad_, tracker_, /*offload_params=*/0.0,
          config_.parallel.bf16_grad_reduce());
    };
  }
  const int grid_side = planner::grid_side(par.tensor_mode, par.tensor, par.tensor_depth);
  chunk.built = make_stage_model(config_, chunk_, tracker_, *gemm_,
                                 core::ModelOptions{.unit_multiple = unit_multiple,
                                                    .stage = chunk.range,
                                                    .slots = chunk.slots,
                                                    .keep = activation_plan_.keep,
                                                    .selective = activation_plan_.selective,
                                                    .grid_store = store,
                                                    .grid_first_unit_floats =
                                                        core::grid_first_unit_floats(
                                                            config_.model, par.tensor_mode,
                                                            grid_side, unit_multiple,
                                                            chunk.range, par.zero_stage)},
                                 &tensor_grid_groups_);
  chunk.model = chunk.built.model.get();
  chunk.dense = nullptr;
  core::GridModel& model = *chunk.built.sharded();
  if (!memory_plan && !inference_) model.init_parameters(config_.train.seed);
  chunk.model->set_profiler(&profiler_);
  chunk.optimizer = std::make_unique<zero::ShardedAdamW>(
      model.parameters(), model.store(), *grad_, tracker_,
      zero::OptimizerOptions{.stage = par.zero_stage,
                             .offload_optimizer = par.offload_optimizer,
                             .offload_fraction = par.offload_fraction,
                             .inference = inference_});
  if (inference_) return;  // no gradients to sum
  // Pipeline stages: the first and the last sum the tied token embedding (the first floats of
  // unit 0 on both); the norm, over the ranges each stage counts, is summed over the stages.
  zero::PipelineLinks links;
  if (pp_->size() > 1) {
    // Several chunks (interleaved): the trainer sums their norms over the stages.
    links = zero::PipelineLinks{.stages = pp_,
                                .tied = model.tied_floats() > 0 ? tied_owner_.get() : nullptr,
                                .sum_over_stages = chunks_.size() == 1,
                                .tied_floats = model.tied_floats()};
  }
  chunk.gradients = std::make_unique<zero::GradientSync>(
      model.parameters(), model.store(), *grad_, tracker_,
      zero::GradientSyncOptions{.bucket_mb = par.bucket_mb,
                                .bf16_reduce = par.bf16_grad_reduce(),
                                .tensor = tp_,
                                .pipeline = links,
                                .counted_ranges = model.norm_ranges()});
}

// The layout as YAML. Derived on every rank from the same config; rank 0's copy is broadcast and
// compared, so ranks that disagree (a different binary or config file on one node) stop together
// before the first collective of training instead of deadlocking in it.
void Trainer::agree_on_plan() {
  const auto& p = config_.parallel;
  // Sizes that differ between pipeline stages, listed stage by stage (the same text everywhere).
  auto per_stage = [&](double value) {
    if (pp_->size() == 1) return std::to_string(int64_t(value));
    std::string list = "[";
    for (int s = 0; s < pp_->size(); ++s) {
      const double v = pp_->all_reduce_sum_value(pp_->rank() == s ? value : 0.0);
      list += (s ? ", " : "") + std::to_string(int64_t(v));
    }
    return list + "]";
  };
  std::string plan = "mesh: {data: " + std::to_string(dp_->size()) + ", tensor: " +
                     std::to_string(tp_->size()) + ", sequence: " +
                     std::to_string(groups_.sp->size()) +
                     ", pipeline: " + std::to_string(pp_->size()) + ", order: tp-sp-dp-pp}\n" +
                     "pipeline: {schedule: " +
                     parallel::pipeline_schedule_name(p.pipeline_schedule) + ", layers: [" +
                     [&] {
                       std::string list;
                       for (int n : stage_layers_) list += (list.empty() ? "" : ", ") + std::to_string(n);
                       return list;
                     }() + "]}\n" +
                     "tensor: {mode: " + core::tensor_mode_name(p.tensor_mode) +
                     (chunks_.front().built.grid_text.empty()
                          ? std::string()
                          : ", grid: " + chunks_.front().built.grid_text) +
                     ", sequence_split: " +
                     (p.sequence_split ? "true" : "false") + ", padded_vocab: " +
                     std::to_string(core::padded_vocab(config_.model, tp_->size())) + "}\n" +
                     "zero: {stage: " + std::to_string(p.zero_stage) +
                     ", offload_optimizer: " + (p.offload_optimizer ? "true" : "false") +
                     ", offload_params: " + (p.offload_params ? "true" : "false") +
                     (p.offload_optimizer && p.offload_fraction < 1.0
                          ? ", optimizer_fraction: " + core::format_number(p.offload_fraction)
                          : std::string()) +
                     (p.offload_params && p.offload_params_fraction < 1.0
                          ? ", params_fraction: " + core::format_number(p.offload_params_fraction)
                          : std::string()) +
                     "}\n" +
                     "flat_parameters: " + per_stage(double(chunks_.front().model->flat_size())) +
                     "\n" + "parameter_units: " +
                     per_stage(double(chunks_.front().model->store().units().size())) + "\n" +
                     "shard: {size: " + per_stage(double(optimizer_->shard_size())) + "}\n" +
                     "gradient_reduction: " +
                     (inference_           ? std::string("none (inference)")
                      : p.zero_stage < 2 ? per_stage(double(gradient_sync_->buckets().size())) +
                                             " all-reduce buckets"
                                         : std::string("reduce-scatter per unit")) +
                     (p.bf16_grad_reduce() && grad_->size() > 1 ? ", in bf16" : "") + "\n" +
                     "activation_slots: " + per_stage(double(chunks_.front().slots)) + "\n" +
                     "model_chunks: " + std::to_string(chunks_.size()) + "\n" +
                     "micro_batches_per_rank: " + std::to_string(config_.accumulation_steps()) + "\n";
  std::string root = plan;
  world_->broadcast_string(root, 0);
  const double differs = world_->all_reduce_sum_value(root == plan ? 0.0 : 1.0);
  if (differs > 0) {
    throw CollectiveError(std::to_string(int(differs)) +
                          " rank(s) derived a different parallel plan from rank 0's; check that "
                          "every rank runs the same colossal build on the same config");
  }
  plan_ = plan;
}

void Trainer::print(const char* fmt, ...) const {
  if (log_ == nullptr) return;
  va_list args;
  va_start(args, fmt);
  std::vfprintf(log_, fmt, args);
  va_end(args);
  std::fflush(log_);
}

void Trainer::upload(int slot, int chunk) {
  const int T = config_.train.seq_len;
  const std::size_t rows = host_inputs_.size() / T, begin = std::size_t(sp_->rank()) * chunk_;
  const std::size_t part_tokens = slot_tokens();
  Chunk& part = chunks_[chunk];
  // On a GPU the host waits for no kernel here: wait() returns once the previous upload's copies
  // have read the staging (they followed only the kernels queued before that upload, long done
  // by now as a rule); the copies follow the kernels queued so far (a backward still to run may
  // read this slot's tokens), and the kernels queued next follow the copies.
  tokens_queue_.wait();
  int32_t* staging = token_staging_.data();
  for (const std::vector<int32_t>* host : {&host_inputs_, &host_targets_}) {
    for (std::size_t r = 0; r < rows; ++r) {
      std::copy_n(host->begin() + r * T + begin, chunk_, staging + r * chunk_);
    }
    staging += part_tokens;
  }
  tokens_queue_.follow_kernels();
  tokens_queue_.to_device(part.inputs.data() + slot * part_tokens, token_staging_.data(),
                          part_tokens * sizeof(int32_t));
  tokens_queue_.to_device(part.targets.data() + slot * part_tokens,
                          token_staging_.data() + part_tokens, part_tokens * sizeof(int32_t));
  tokens_queue_.precede();
}

const int32_t* Trainer::slot_inputs(int slot, int chunk) const {
  return chunks_[chunk].inputs.data() + slot * slot_tokens();
}
const int32_t* Trainer::slot_targets(int slot, int chunk) const {
  return chunks_[chunk].targets.data() + slot * slot_tokens();
}

double Trainer::pipeline_forward(int batch) { return executor_->forward_only(batch); }

void Trainer::set_trace(const std::string& path) {
  const std::string file = world_->size() == 1 || path.empty()
                               ? path
                               : path + ".rank" + std::to_string(world_->rank()) + ".json";
  if (!trace_.open(file)) {
    throw std::runtime_error("--trace: cannot write '" + file +
                             "'; give a path in a writable directory");
  }
}

void Trainer::write_trace() const {
  // One process per rank; the stage and coordinates in its name.
  trace_.write(world_->rank(), "rank " + std::to_string(world_->rank()) + " (stage " +
                                   std::to_string(pp_->rank()) + ", data " +
                                   std::to_string(dp_->rank()) + ", tensor " +
                                   std::to_string(tp_->rank()) + ", sequence " +
                                   std::to_string(sp_->rank()) + ")");
}

// Forward and backward over this rank's micro-batches of the step: rank r of dp takes samples
// [r*G/dp, (r+1)*G/dp) of the global batch G. Gradients are summed into the model's buffer, scaled
// so that their sum over ranks is the gradient of the mean loss over the global batch. Returns the
// global mean loss on every rank. The micro-batches run in the order of this stage's pipeline
// schedule, through the executor (parallel/pipeline_executor.hpp).
double Trainer::run_step(int64_t step) {
  const int accumulation = config_.accumulation_steps();
  const int stage = pp_->rank(), stages = pp_->size();
  {
    core::Profiler::Scope scope(&profiler_, core::WorkKind::optimizer);
    for (Chunk& chunk : chunks_) chunk.model->zero_grad();
  }
  if (const char* hang = std::getenv("COLOSSAL_INJECT_HANG")) {
    // Testing hook: "STAGE:STEP" makes that pipeline stage stop responding at that step (as a
    // wedged node would); the watchdog must end the job.
    int hang_stage = -1, hang_step = -1;
    if (std::sscanf(hang, "%d:%d", &hang_stage, &hang_step) == 2 && hang_stage == stage &&
        hang_step == step + 1) {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  if (const char* fail = std::getenv("COLOSSAL_INJECT_FAILURE")) {
    // Testing hook: "STAGE:STEP" makes that pipeline stage fail at that step (1-based), alone.
    int fail_stage = -1, fail_step = -1;
    if (std::sscanf(fail, "%d:%d", &fail_stage, &fail_step) == 2 && fail_stage == stage &&
        fail_step == step + 1) {
      throw std::runtime_error("injected failure on pipeline stage " + std::to_string(stage) +
                               " at step " + std::to_string(step + 1) +
                               " (COLOSSAL_INJECT_FAILURE)");
    }
  }
  step_ = step;
  const double loss = executor_->run_step();
  {
    // The model's own sums over replicas inside the tensor group (2D grid columns, 2.5D depth
    // layers, 3D planes) before the data-parallel sync; nothing in 1d.
    core::Profiler::Scope scope(&profiler_, core::WorkKind::communication);
    for (Chunk& chunk : chunks_) chunk.model->reduce_gradients();
  }
  // The loss lives on the last stage; every rank of the data x sequence group averaged the same
  // number of tokens.
  const double stage_loss = stages > 1 ? pp_->all_reduce_sum_value(loss) : loss;
  return grad_->all_reduce_sum_value(stage_loss / accumulation) / grad_->size();
}

void Trainer::require_training(const char* what) const {
  if (inference_) {
    throw std::logic_error(std::string("Trainer::") + what +
                           " needs a training trainer; this one was built for inference "
                           "(TrainerOptions::inference: no gradients or optimizer state)");
  }
}

// The validation windows evaluate() reads: data.val_path's (capped by data.val_windows), and
// under 2d / 2.5d / 3d, whose models take whole micro-batches only, rounded down to whole
// micro-batches of every replica (the data ranks x the model's batch replicas, 2.5D's depth).
// Too few for one each is an error, every rank alike; train() asks at its start, so a run is not
// refused at its closing validation pass after its last step.
Trainer::ValidationWindows Trainer::validation_windows() const {
  const int64_t all =
      io::validation_windows(*val_data_, config_.train.seq_len, config_.data.val_windows);
  const core::StageModel& model = *chunks_.front().model;
  if (!model.fixed_batch()) return {all, all};
  const int64_t need =
      int64_t(config_.train.micro_batch) * dp_->size() * model.batch_replicas();
  if (all < need) {
    throw DataFileError(
        "data.val_path gives " + std::to_string(all) + " validation window(s) of " +
        "train.seq_len " + std::to_string(config_.train.seq_len) +
        (config_.data.val_windows > 0
             ? " (data.val_windows: " + std::to_string(config_.data.val_windows) + ")"
             : std::string()) +
        ", but " + core::tensor_mode_name(config_.parallel.tensor_mode) +
        " evaluates whole micro-batches of every replica: at least train.micro_batch x data x "
        "depth = " + std::to_string(need) + "; raise data.val_windows (0: every window) or "
        "give data.val_path more text");
  }
  return {all, all - all % need};
}

TrainSummary Trainer::train() {
  require_training("train");
  const auto& t = config_.train;
  const auto& spec = config_.model;
  TrainSummary summary;
  core::AdamWParams hp{t.optimizer.lr, t.optimizer.beta1, t.optimizer.beta2, t.optimizer.eps,
                       t.optimizer.weight_decay};
  make_log_dir(*world_, config_);
  // The end-of-run sample's prompt, checked now rather than after the training it follows.
  if (config_.sample.tokens > 0 && profile_steps_ == 0) {
    prompt_tokens(config_.sample.prompt, *train_data_, spec.vocab, "sample.prompt");
    check_stop_tokens(config_.sample.stop_tokens, *train_data_, spec.vocab,
                      "sample.stop_tokens");
  }
  if (profile_steps_ == 0 && val_data_) validation_windows();  // refused now, not at the end

  // A rank that makes no progress for train.watchdog_seconds ends itself (and so the job).
  Watchdog watchdog(t.watchdog_seconds, world_->rank());
  struct Unset {
    Watchdog*& slot;
    ~Unset() { slot = nullptr; }
  } unset{watchdog_};
  watchdog_ = &watchdog;
  RunStart start;  // checkpoint.resume: where the run continues, or what a fine-tune resets
  if (config_.checkpoint.resume != io::ResumeMode::never && profile_steps_ == 0) {
    const auto resuming = Clock::now();
    start = run_start(config_, resume());
    if (start.first_step > 0 || t.fine_tune.any())
      print("resume took %.2f s\n", seconds_since(resuming));
    summary.first_step = start.first_step;
    summary.skipped_steps = start.skipped_steps;
  }
  const int64_t first_step = start.first_step;
  if (first_step > t.steps) {  // the same checkpoint, so the same error, on every rank
    throw CollectiveError("checkpoint.resume: the checkpoint is at step " +
                          std::to_string(first_step) + ", past train.steps: " +
                          std::to_string(t.steps) + "; set train.steps >= " +
                          std::to_string(first_step) + " to go on from it, or " +
                          "checkpoint.resume: never (or another log.dir) to start over");
  }
  if (first_step == t.steps && first_step > 0) {
    print("checkpoint at step %lld = train.steps: nothing left to train (raise train.steps to "
          "go on); the end-of-run files are written again\n",
          (long long)first_step);
  }
  if (world_->rank() == 0 && profile_steps_ == 0) {
    // A run continuing in this directory has not finished (yet): log.dir/finished is written
    // again when it reaches train.steps. (After the checks above: a refused resume leaves a
    // finished run finished.)
    std::error_code ignored;
    std::filesystem::remove(config_.log.dir + "/finished", ignored);
  }
  if (profile_steps_ == 0) {
    // Checkpoints numbered after this run's first step are another run's (a fresh start in a
    // used log.dir), or this run's from before a resume from an earlier one: the retention keeps
    // the newest by step and would delete the ones this run writes (with checkpoint.every: 0
    // too, which checkpoints on a stop signal), and resume: auto would continue the other.
    const std::string moved = on_root<CollectiveError>(*world_, "checkpoint.dir: ", [&](auto&) {
      return io::set_aside_later_checkpoints(apps::checkpoint_dir(config_), first_step);
    });
    if (!moved.empty()) print("checkpoint.dir: %s\n", moved.c_str());
  }
  core::LrSchedule schedule{t.optimizer.lr, t.optimizer.min_lr, t.optimizer.warmup,
                            t.steps + start.schedule_base};
  const JobPeak peak = job_peak_flops(config_, *world_);
  // Rank 0 writes the run's files; every rank trains and tallies. A file rank 0 cannot create
  // (a full disk) stops every rank: the others would wait for it in the first step.
  std::optional<RunLog> run_log_held;
  std::string run_log_error;
  try {
    run_log_held.emplace(config_,
                         RunLogOptions{.writer = world_->rank() == 0,
                                       .first_step = first_step,
                                       .log = log_,
                                       .tokens_per_step = double(t.global_batch) * t.seq_len,
                                       .flops_per_token = core::flops_per_token(spec, t.seq_len),
                                       .peak_flops = peak.flops,
                                       .memory = &tracker_});
    // What this run is and what the cost model predicts for it, beside the measurements
    // (written by rank 0 now: inside the agreement below).
    RunLog& log = *run_log_held;
    log.set_attribute("hardware", hardware_name_);
    log.set_attribute("parameters", double(core::parameter_count(spec)));  // logical elements
    log.set_attribute("predicted_step_seconds", predicted_time_.step);
    log.set_attribute("predicted_memory_total_bytes", predicted_memory_.total());
    for (int c = 0; c < int(core::MemCategory::count); ++c) {
      const auto category = core::MemCategory(c);
      log.set_attribute("predicted_memory_" + memory_key(category) + "_bytes",
                        predicted_memory_[category]);
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    run_log_error = "log.dir: " + what +
                    (what.find("flushing") != std::string::npos ? " (is its disk full?)" : "");
  }
  world_->broadcast_string(run_log_error, 0);
  if (!run_log_error.empty()) throw CollectiveError(run_log_error);
  RunLog& run_log = *run_log_held;
  const double parameters = double(core::parameter_count(spec));  // logical elements
  print("model: %s, %d layers, hidden %d, %d heads, ffn %d, vocab %d: %.2fM parameters\n",
        core::arch_name(spec.arch), spec.layers, spec.hidden, spec.heads, spec.ffn_hidden,
        spec.vocab, parameters / 1e6);
  print("train: %lld steps x %d sequences x %d tokens (micro-batch %d, %d accumulation steps); "
        "data %s (%zu tokens)\n",
        (long long)t.steps, t.global_batch, t.seq_len, t.micro_batch, config_.accumulation_steps(),
        train_data_->path().c_str(), train_data_->size());
  if (pp_->size() > 1) {
    std::string layers;
    for (int n : stage_layers_) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
    print("parallel: %d pipeline stages (%s schedule; blocks per stage [%s]%s)\n", pp_->size(),
          parallel::pipeline_schedule_name(config_.parallel.pipeline_schedule), layers.c_str(),
          config_.parallel.pipeline_layers.empty() ? ", balanced by predicted time" : "");
  }
  if (tp_->size() > 1 && config_.parallel.tensor_mode == core::TensorMode::d1) {
    print("parallel: %d tensor-parallel ranks (1d: heads, MLP width and vocabulary split; "
          "vocabulary padded to %lld)\n",
          tp_->size(), (long long)core::padded_vocab(spec, tp_->size()));
  } else if (tp_->size() > 1) {
    print("parallel: tensor: {size: %d, mode: %s}  # %s\n", tp_->size(),
          core::tensor_mode_name(config_.parallel.tensor_mode),
          chunks_.front().built.grid_text.c_str());
  }
  if (sp_->size() > 1) {
    print("parallel: %d sequence-parallel ranks (ring self-attention; %d positions each)\n",
          sp_->size(), chunk_);
  }
  if (dp_->size() > 1) {
    const std::string share =
        config_.parallel.offload_fraction < 1.0
            ? " (the last " + core::format_number(config_.parallel.offload_fraction) +
                  " of each shard's states; the rest updated on the device beside it)"
            : std::string();
    const std::string params =
        !config_.parallel.offload_params ? std::string()
        : config_.parallel.offload_params_fraction < 1.0
            ? ", parameters offloaded (the last " +
                  core::format_number(config_.parallel.offload_params_fraction) +
                  " of each shard)"
            : ", parameters offloaded";
    print("parallel: %d data-parallel ranks, ZeRO stage %d%s%s\n", dp_->size(),
          config_.parallel.zero_stage,
          config_.parallel.offload_optimizer ? (", optimizer offloaded" + share).c_str() : "",
          params.c_str());
  }
  print("plan (identical on every rank):\n%s", plan_.c_str());
  if (config_.checkpointing.policy != core::CheckpointPolicy::none) {
    print("activation checkpointing: %s\n", activation_plan_.description.c_str());
  }
  print("memory (per rank): %s\n", tracker_.summary().c_str());
  const bool tf32_ignored = config_.train.tf32 &&
                           config_.train.precision == core::GemmPrecision::fp32 &&
                           !gemm_->uses_tf32();
  print("gemm: %s (hardware.gemm)%s%s\n", gemm_->name().c_str(),
        core::HostThreads::team() == core::HostTeam::openmp
            ? "; the host kernels share its OpenMP threads"
            : "",
        tf32_ignored ? "; train.tf32 ignored: these products have no TF32" : "");
  {
    const core::ModelSpec& spec = config_.model;
    const int ring = config_.parallel.sequence;
    const std::string attention =
        ring > 1 ? "ring self-attention over " + std::to_string(ring) +
                       " ranks (parallel.sequence), probabilities kept"
        : spec.fused_attention
            ? core::fused_attention_description(spec.hidden / spec.heads, bf16_operands(config_))
            : "dense, (B,H,T,T) probabilities kept (model.fused_attention: true keeps one value "
              "per row)";
    print("attention: %s\n", attention.c_str());
  }
  print("MFU: against %.3g TFLOP/s, %s\n", peak.flops / 1e12, peak.source.c_str());
  if (executor_->grouped() && virtual_stages_ > 1) {
    print("pipeline: each schedule step's sends and receives as one group on %s (a send there "
          "completes only while its receive runs)\n",
          std::string(pp_->backend()).c_str());
  }
  print("cost model (hardware %s, rank 0): memory %s; step %.3g s (compute %.3g, recompute %.3g, "
        "communication %.3g exposed, bubble %.3g, optimizer %.3g, waiting for shared cores %.3g)\n",
        hardware_name_.c_str(), core::format_bytes(predicted_memory_.total()).c_str(),
        predicted_time_.step, predicted_time_.compute - predicted_time_.recompute,
        predicted_time_.recompute,
        predicted_time_.tensor_comm + predicted_time_.pipeline_comm + predicted_time_.data_comm -
            predicted_time_.hidden_comm,
        predicted_time_.bubble, predicted_time_.optimizer, predicted_time_.shared_cores);

  // The tensor group's payload bytes on this rank (with its 2d / 3d sub-groups'), validation
  // apart (printed per step at the end).
  const auto tensor_traffic = [this] {
    double bytes = double(tp_->stats().total_payload_bytes());
    for (const auto& c : tensor_grid_groups_.comms) {
      if (c) bytes += double(c->stats().total_payload_bytes());
    }
    return bytes;
  };
  const double tensor_bytes_before = tensor_traffic();
  double validation_tensor_bytes = 0.0;
  // A checkpoint after `done` steps; skipped steps applied no AdamW update.
  const auto save = [&](int64_t done) {
    save_checkpoint(done, done - summary.skipped_steps + start.optimizer_base,
                    done + start.schedule_base);
  };
  run_log.start();
  for (int64_t step = first_step; step < t.steps; ++step) {
    const auto step_start = Clock::now();
    // Time per kind of work is recorded for the steps the profiler watches (--profile-steps).
    const bool profiled = profiler_.enabled();
    std::array<double, core::Profiler::kKinds> profiled_before{};
    for (int k = 0; k < core::Profiler::kKinds; ++k) {
      profiled_before[k] = profiler_.seconds(core::WorkKind(k));
    }
    hp.lr = schedule.at(step + start.schedule_base);
    const double loss = run_step(step);
    double norm = 0.0;
    {
      core::Profiler::Scope scope(&profiler_, core::WorkKind::communication);
      core::TraceRecorder::Span span(&trace_, "reduce gradients", "communication");
      if (chunks_.size() == 1) {
        norm = gradient_sync_->reduce();
      } else {
        // Each chunk's norm over its data and tensor groups; the squares summed over the chunks
        // and then over the stages.
        double squares = 0.0;
        for (Chunk& chunk : chunks_) {
          const double n = chunk.gradients->reduce();
          squares += n * n;
        }
        norm = std::sqrt(pp_->all_reduce_sum_value(squares));
      }
    }
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      if (t.on_nonfinite == io::OnNonfinite::stop) {
        // The update was not applied: checkpoint the last good state (the steps before this one)
        // so the run can resume, e.g. with a lower learning rate.
        const std::string saved = checkpoint_before_failure(config_, step, save);
        throw NonFiniteError("step " + std::to_string(step + 1) + ": loss " + std::to_string(loss) +
                             ", gradient norm " + std::to_string(norm) +
                             " is not finite" + saved +
                             "; lower train.optimizer.lr or set train.on_nonfinite: skip to skip "
                             "such steps");
      }
      ++summary.skipped_steps;
      for (Chunk& chunk : chunks_) chunk.optimizer->skip_step();
      print("step %lld: non-finite loss or gradient, update skipped\n", (long long)step + 1);
    } else {
      const double clip = core::clip_coefficient(norm, t.optimizer.grad_clip);
      core::Profiler::Scope scope(&profiler_, core::WorkKind::optimizer);
      core::TraceRecorder::Span span(&trace_, "optimizer", "optimizer");
      for (Chunk& chunk : chunks_) {
        chunk.optimizer->step(hp, step + 1 - summary.skipped_steps + start.optimizer_base,
                              static_cast<float>(clip));
      }
    }
    StepRecord record{.loss = loss, .lr = hp.lr, .grad_norm = norm,
                      .seconds = seconds_since(step_start)};
    if (profiled) {
      record.work_seconds.emplace();
      for (int k = 0; k < core::Profiler::kKinds; ++k) {
        (*record.work_seconds)[k] = profiler_.seconds(core::WorkKind(k)) - profiled_before[k];
      }
    }
    watchdog.progress(step + 1, "after a step");
    device_used_peak_ = std::max(device_used_peak_, core::device_used_bytes());
    if (profile_steps_ > 0) {
      // The first step pays for first-touch page faults: profile the ones after it.
      if (step == 0) {
        profiler_.reset();
        profiler_.enable(true);
      } else {
        profiled_seconds_ += record.seconds;
        if (step == profile_steps_) {
          summary.profile = profiler_.table(profile_steps_, profiled_seconds_ / profile_steps_,
                                            predicted_by_kind(predicted_time_),
                                            predicted_time_.step);
          print("\nprofile of %d steps (rank 0; gemm %s):\n%s", profile_steps_,
                gemm_->name().c_str(), summary.profile.c_str());
          const double measured = profiled_seconds_ / profile_steps_;
          print("cost model (rank 0, hardware %s): step %.4f s predicted, %.4f s measured "
                "(%+.1f%%); memory %s predicted, %s tracked\n",
                hardware_name_.c_str(), predicted_time_.step, measured,
                100.0 * (predicted_time_.step / measured - 1.0),
                core::format_bytes(predicted_memory_.total()).c_str(),
                core::format_bytes(double(tracker_.peak_total())).c_str());
          run_log.record(step, record, RunLog::Progress::never);
          run_log.finish(summary);
          fill_memory_summary(summary);
          return summary;
        }
      }
    }
    const bool evaluate_now =
        (config_.eval.every > 0 && (step + 1) % config_.eval.every == 0) || step + 1 == t.steps;
    if (val_data_ && evaluate_now) {
      const double tensor_bytes = tensor_traffic();
      record.val_loss = evaluate();
      validation_tensor_bytes += tensor_traffic() - tensor_bytes;
      print("step %lld: val loss %.6g\n", (long long)step + 1, record.val_loss);
    }
    if (!choice_examples_.empty() && evaluate_now) {
      const double tensor_bytes = tensor_traffic();
      const auto scoring = Clock::now();
      const ChoiceScores scores = score_choices(choice_examples_);
      validation_tensor_bytes += tensor_traffic() - tensor_bytes;
      record.choice_accuracy = scores.accuracy(ChoiceMeasure::per_token);
      record.choice_accuracy_total = scores.accuracy(ChoiceMeasure::total);
      record.choice_examples = double(scores.examples());
      record.choice_seconds = seconds_since(scoring);
      print("step %lld: choices accuracy %.4f per token, %.4f total (%lld examples, %.1f s)\n",
            (long long)step + 1, record.choice_accuracy, record.choice_accuracy_total,
            (long long)scores.examples(), record.choice_seconds);
    }
    run_log.record(step, record);
    if (step_callback_) step_callback_(step + 1);
    if (end_step(*world_, config_, step + 1, save, summary, run_log.start_time(), log_)) {
      run_log.finish(summary);
      fill_memory_summary(summary);
      return summary;
    }
  }
  run_log.finish(summary);
  if (tp_->size() > 1 && t.steps > first_step) {
    print("tensor-parallel traffic (rank 0): %s per step\n",
          core::format_bytes((tensor_traffic() - tensor_bytes_before -
                              validation_tensor_bytes) /
                             double(t.steps - first_step))
              .c_str());
  }
  summary.predicted_step_seconds = predicted_time_.step;
  summary.predicted_peak_bytes = predicted_memory_.total();

  write_trace();
  if (config_.log.save_model) {
    summary.model_path = config_.log.dir + "/model.h5";
    save_weights(summary.model_path);
    print("%s", export_hf_over(*world_, config_, summary.model_path).c_str());
  }
  // The run reached train.steps: log.dir/finished says so (the sbatch scripts' and
  // colossal_sweep's test of a finished run; model.h5 may be switched off).
  if (world_->rank() == 0) {
    std::ofstream(config_.log.dir + "/finished") << "step " << t.steps << "\n";
  }
  // Forwards may be collective (ZeRO-3 gathers, tensor parallelism): every rank samples alike.
  if (config_.sample.tokens > 0) {
    summary.sample = generate(config_.sample.prompt, config_.sample.tokens,
                              sampling_of(config_.sample, t.seed));
    summary.sample_tokens = generated_;
  }
  fill_memory_summary(summary);
  return summary;
}

void Trainer::fill_memory_summary(TrainSummary& summary) const {
  summary.peak_rss_bytes = core::peak_rss_bytes();
  summary.device_added_bytes =
      device_used_peak_ > device_used_at_start_ ? device_used_peak_ - device_used_at_start_ : 0;
}

namespace {
// Items [0, total) shared by `replicas` replicas, replica r taking [total*r/R, total*(r+1)/R) in
// batches of up to `B`. With `padded_share` > 0 (ZeRO-3: every rank runs as many forwards, each
// gathering parameters collectively) each replica runs ceil(padded_share / B) batches, the extra
// ones again on one item, to be discarded.
struct ReplicaBatches {
  struct Batch {
    int64_t first;
    int size;
    bool real;  // false: a padding forward
  };
  ReplicaBatches(int64_t items, int64_t replicas, int64_t replica, int batch, int64_t padded_share)
      : total(items), B(batch), begin(items * replica / replicas),
        end(items * (replica + 1) / replicas),
        count(((padded_share > 0 ? padded_share : end - begin) + batch - 1) / batch) {}
  Batch operator[](int64_t i) const {
    const int64_t wanted = begin + i * B;
    if (wanted < end) return {wanted, int(std::min<int64_t>(B, end - wanted)), true};
    return {std::min(begin, total - 1), 1, false};
  }
  const int64_t total;
  const int B;
  const int64_t begin, end, count;  // this replica's items; its batches
};
}  // namespace

double Trainer::evaluate() {
  if (!val_data_) throw std::runtime_error("no validation data: set data.val_path");
  const int T = config_.train.seq_len, B = config_.train.micro_batch;
  const auto [all, windows] = validation_windows();
  // The replicas that take windows of their own: the data ranks x the model's batch replicas
  // (2.5D depth layers, whose forward returns the mean over all of them).
  core::StageModel& model = *chunks_.front().model;
  const int shares = model.batch_replicas();
  const int64_t replicas = int64_t(dp_->size()) * shares;
  const int64_t replica = int64_t(dp_->rank()) * shares + model.batch_replica();
  if (windows < all && !said_val_windows_) {
    print("validation: %lld of %lld windows (%s evaluates whole micro-batches of %d per "
          "replica), so its val loss is not a 1d run's or colossal_eval's\n",
          (long long)windows, (long long)all,
          core::tensor_mode_name(config_.parallel.tensor_mode), B);
    said_val_windows_ = true;
  }
  // Replica r evaluates windows [W*r/R, W*(r+1)/R); the sum of window losses is all-reduced.
  // Under ZeRO-3 every rank runs as many forwards as the largest data-parallel part.
  const ReplicaBatches part(windows, replicas, replica, B,
                            model.store().collective() ? (windows + dp_->size() - 1) / dp_->size()
                                                       : 0);
  double total = 0.0;
  for (int64_t i = 0; i < part.count; ++i) {
    const auto [first, count, real] = part[i];
    io::validation_batch(*val_data_, T, first, count, host_inputs_.data(), host_targets_.data());
    upload();
    if (i > 0) {  // the weights of the batch before: bf16's copy of them is kept
      for (Chunk& chunk : chunks_) chunk.model->parameters_unchanged();
    }
    // (the mean over the batch replicas' windows: `count` each)
    const double loss = pipeline_forward(count) * count * shares;
    if (watchdog_ != nullptr) watchdog_->progress(-1, "validating");
    if (real) total += loss;
  }
  // The losses live on the last stage; each sequence rank averaged its chunk of the same windows.
  if (pp_->size() > 1) total = pp_->all_reduce_sum_value(total);
  return grad_->all_reduce_sum_value(total) / double(windows) / double(sp_->size());
}

std::vector<float> Trainer::local_parameters() { return chunk_parameters(chunks_.front()); }

std::vector<float> Trainer::chunk_parameters(Chunk& chunk) {
  core::StageModel& model = *chunk.model;
  std::vector<float> host(model.flat_size());
  core::ParameterStore& store = model.store();
  for (std::size_t u = 0; u < store.units().size(); ++u) {
    const core::ParamUnit& unit = store.units()[u];
    const float* values = store.gather(int(u));
    core::copy_to_host(host.data() + unit.begin, values, unit.size() * sizeof(float));
    store.release(int(u));
  }
  return host;
}

namespace {
std::atomic<int> g_stop_signal{0};

}  // namespace

void request_stop(int signal) { g_stop_signal.store(signal); }
int stop_requested() { return g_stop_signal.load(); }

std::string checkpoint_dir(const io::Config& config) {
  return config.checkpoint.dir.empty() ? config.log.dir + "/checkpoints" : config.checkpoint.dir;
}

std::string Trainer::checkpoint_dir() const { return apps::checkpoint_dir(config_); }

std::string checkpoint_path(const io::Config& config, int64_t step) {
  return checkpoint_dir(config) + "/ckpt-" + std::to_string(step) + ".h5";
}

bool end_step(parallel::Communicator& world, const io::Config& config, int64_t done,
              const std::function<void(int64_t)>& save, TrainSummary& summary,
              Clock::time_point start, std::FILE* log) {
  // The signal any rank received (SIGTERM may reach one rank only): every rank stops, and names it.
  float received[1] = {float(stop_requested())};
  world.all_reduce_max(received);
  const int signal = int(received[0]);
  const bool stop = signal != 0;
  const int64_t every = config.checkpoint.every;
  const bool last = done == config.train.steps;
  if (stop || (every > 0 && (done % every == 0 || last))) {
    const auto saving = Clock::now();
    save(done);
    summary.checkpoint = checkpoint_path(config, done);
    if (log != nullptr) {
      std::fprintf(log, "step %lld: checkpoint %s (%.2f s)\n", (long long)done,
                   summary.checkpoint.c_str(), seconds_since(saving));
      std::fflush(log);
    }
  }
  if (!stop || last) return false;
  summary.stopped = true;
  summary.stop_signal = signal;
  summary.steps = done;
  summary.seconds = seconds_since(start);
  if (log != nullptr) {
    std::fprintf(log, "stopped at step %lld on request (signal %d); continue with --set "
                 "checkpoint.resume=auto\n", (long long)done, signal);
    std::fflush(log);
  }
  return true;
}

std::string checkpoint_before_failure(const io::Config& config, int64_t failed,
                                      const std::function<void(int64_t)>& save) {
  if (failed == 0) return "";
  save(failed);
  return "; checkpoint " + checkpoint_path(config, failed) + " holds the state before it";
}

namespace {
// A chunk's flat ranges held in `buffer`: at their flat offsets (`flat_addressed`, a buffer of the
// chunk's whole flat size) or packed in the optimizer's state order.
std::vector<io::FlatRange> held_ranges(const std::vector<zero::ShardedAdamW::StateRange>& ranges,
                                       std::vector<float>& buffer, bool flat_addressed) {
  std::vector<io::FlatRange> out;
  for (const auto& r : ranges) {
    out.push_back({r.begin, r.length, buffer.data() + (flat_addressed ? r.begin : r.at)});
  }
  return out;
}

void append(std::vector<io::TensorRun>& to, const std::vector<io::TensorRun>& runs) {
  to.insert(to.end(), runs.begin(), runs.end());
}

// The communicator parallel HDF5 opens files over (null: a serial file).
MPI_Comm file_communicator(parallel::Communicator* world) {
  const parallel::MpiCommunicator* mpi = parallel::mpi_of(world);  // also under staging / NCCL
  return mpi != nullptr && mpi->size() > 1 ? mpi->native() : MPI_COMM_NULL;
}
}  // namespace

// Who writes what (docs/checkpoint-format.md): every rank the elements its optimizer owns, from
// its own layout, as hyperslabs of the logical datasets: under ZeRO 1-3 each data(-and-sequence)
// rank its shard of parameters and moments; without ZeRO the first of them everything it holds.
// Tensor ranks > 0 leave out replicated tensors, and a chunk that only runs the tied LM head
// leaves out the embedding unit. Nothing is gathered.
void add_chunk_checkpoint(zero::ShardedAdamW& optimizer, const core::StageModel& model,
                          bool replica, ChunkState& held, io::CheckpointShard& mine) {
  if (optimizer.stage() == 0 && replica) return;  // a replica of rank 0's state
  held.params = optimizer.owned_parameters();
  held.m = optimizer.state(0);
  held.v = optimizer.state(1);
  const auto ranges = optimizer.state_ranges();
  for (auto [buffer, runs] : {std::pair{&held.params, &mine.params}, std::pair{&held.m, &mine.m},
                              std::pair{&held.v, &mine.v}}) {
    append(*runs, io::tensor_runs(model.logical_runs(), held_ranges(ranges, *buffer, false), true));
  }
}

void add_chunk_resume(const zero::ShardedAdamW& optimizer, const core::StageModel& model,
                      bool replica, ChunkState& state, io::CheckpointShard& wanted,
                      io::CheckpointShard& owned) {
  const auto ranges = optimizer.state_ranges();
  const std::size_t held = ranges.back().at + ranges.back().length;
  state.params.assign(model.flat_size(), 0.0f);
  state.m.assign(held, 0.0f);
  state.v.assign(held, 0.0f);
  const std::vector<zero::ShardedAdamW::StateRange> whole{{0, model.flat_size(), 0}};
  const auto read = [&](const std::vector<io::FlatRange>& at, bool writing) {
    return io::tensor_runs(model.logical_runs(), at, writing);
  };
  append(wanted.params, read(held_ranges(optimizer.stage() == 3 ? ranges : whole, state.params,
                                         true), false));
  append(wanted.m, read(held_ranges(ranges, state.m, false), false));
  append(wanted.v, read(held_ranges(ranges, state.v, false), false));
  if (optimizer.stage() == 0 && replica) return;
  append(owned.params, read(held_ranges(ranges, state.params, true), true));
  append(owned.m, read(held_ranges(ranges, state.m, false), true));
  append(owned.v, read(held_ranges(ranges, state.v, false), true));
}

void restore_chunk(zero::ShardedAdamW& optimizer, core::StageModel& model,
                   const ChunkState& state) {
  set_store_parameters(model.store(), state.params);
  optimizer.set_state(0, state.m);
  optimizer.set_state(1, state.v);
}

void set_store_parameters(core::ParameterStore& store, const std::vector<float>& host) {
  for (std::size_t u = 0; u < store.units().size(); ++u) {
    const core::ParamUnit& unit = store.units()[u];
    core::copy_to_device(store.begin_write(int(u)), host.data() + unit.begin,
                         unit.size() * sizeof(float));
    store.commit(int(u));
  }
}

void Trainer::save_checkpoint(int64_t step, int64_t optimizer_step, int64_t schedule_step) {
  require_training("save_checkpoint");
  std::vector<ChunkState> held(chunks_.size());
  io::CheckpointShard mine;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    add_chunk_checkpoint(*chunks_[c].optimizer, *chunks_[c].model, grad_->rank() > 0, held[c],
                         mine);
  }
  io::CheckpointState state{step, optimizer_step,
                            step * int64_t(config_.train.global_batch) * config_.train.seq_len,
                            int64_t(config_.train.seed), config_.text, plan_, schedule_step};
  write_checkpoint_over(*world_, config_, logical_table(), mine, state);
  if (watchdog_ != nullptr) watchdog_->progress(step, "after a checkpoint");
}

// Keys whose values differ between two config texts, model keys and the others apart.
namespace {
std::pair<std::string, std::string> config_changes(const std::string& before_text,
                                                   const std::string& now_text) {
  std::string model_changes, other_changes;
  std::map<std::string, std::pair<std::string, std::string>> values;
  for (const std::string& key : io::changed_keys(before_text, now_text, &values)) {
    // model.init_from names where the weights came from, model.fused_attention how the
    // attention is computed (model.fused_attention: auto may decide it otherwise on another
    // node) and model.preset how the sizes were given (the sizes themselves are compared), not
    // another model.
    const bool model = key.rfind("model.", 0) == 0 && key != "model.init_from" &&
                       key != "model.fused_attention" && key != "model.preset";
    std::string& list = model ? model_changes : other_changes;
    const auto& [was, now] = values.at(key);
    // A model key with its two values (the checkpoint's, then this config's).
    const std::string item = model ? key + " " + (was.empty() ? "unset" : was) + " there, " +
                                         (now.empty() ? "unset" : now) + " here"
                                   : key;
    list += (list.empty() ? "" : ", ") + item;
  }
  return {model_changes, other_changes};
}
}  // namespace

io::CheckpointState Trainer::resume() {
  require_training("resume");
  // What this rank reads: its whole layout of the parameters (ZeRO-3: only its slices) and its
  // moments; and what it would write, whose CRCs verify every dataset once over all ranks.
  std::vector<ChunkState> states(chunks_.size());
  io::CheckpointShard wanted, owned;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    add_chunk_resume(*chunks_[c].optimizer, *chunks_[c].model, grad_->rank() > 0, states[c],
                     wanted, owned);
  }
  std::string log;
  const io::CheckpointState state =
      read_newest_checkpoint(config_, *world_, logical_table(), wanted, owned, log);
  print("%s", log.c_str());
  if (state.step == 0 && config_.checkpoint.resume != io::ResumeMode::file) return state;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    if (config_.train.fine_tune.reset_optimizer) {  // weights only: the moments stay fresh
      set_store_parameters(chunks_[c].model->store(), states[c].params);
    } else {
      restore_chunk(*chunks_[c].optimizer, *chunks_[c].model, states[c]);
    }
  }
  return state;
}

io::CheckpointState read_newest_checkpoint(const io::Config& config, parallel::Communicator& world,
                                           const std::vector<core::ParamSpec>& logical,
                                           const io::CheckpointShard& wanted,
                                           const io::CheckpointShard& owned, std::string& log) {
  const std::string dir = checkpoint_dir(config);
  // checkpoint.resume: PATH reads that file alone, and any damage is an error, not a skip.
  const bool one_file = config.checkpoint.resume == io::ResumeMode::file;
  const std::string& file = config.checkpoint.resume_path;
  std::string listing, missing;
  if (world.rank() == 0) {
    if (!one_file) {
      for (const std::string& path : io::list_checkpoints(dir)) listing += path + "\n";
    } else if (std::error_code ec; !std::filesystem::is_regular_file(file, ec)) {
      const std::string close = io::did_you_mean(file, {"auto", "never"});
      missing = "checkpoint.resume: '" + file + "' is not a checkpoint file (" +
                (std::filesystem::exists(file, ec) ? "not a regular file" : "no such file") +
                "; allowed: auto, never, or the path of a checkpoint file); " +
                (close.empty() ? "check the path" : "did you mean '" + close + "'?");
    } else {
      listing = file + "\n";
    }
  }
  world.broadcast_string(missing, 0);
  if (!missing.empty()) throw io::ConfigError(missing);  // the key names no file: exit 2
  world.broadcast_string(listing, 0);
  std::string chosen;
  io::CheckpointState state;
  for (std::size_t at = 0, end; (end = listing.find('\n', at)) != std::string::npos;
       at = end + 1) {
    const std::string path = listing.substr(at, end - at);
    std::string fatal, damage;
    if (world.rank() == 0) {
      try {
        const std::string written = io::read_checkpoint_config(path, config.checkpoint.verify);
        const std::string model_changes = config_changes(written, config.text).first;
        if (!model_changes.empty()) {
          fatal = "checkpoint " + path + " was written for another model (" + model_changes +
                  "); resume with the model config it was written with (set each key to its "
                  "value there), or point checkpoint.dir elsewhere";
        }
      } catch (const std::exception& e) {
        damage = e.what();
      }
    }
    world.broadcast_string(fatal, 0);
    if (!fatal.empty()) throw DataFileError(fatal);
    world.broadcast_string(damage, 0);
    if (damage.empty()) {
      try {
        // The whole-file checksum was checked just above, before HDF5 parsed anything.
        state = io::read_checkpoint(path, logical, wanted, owned, file_communicator(&world),
                                    /*verify=*/false);
        chosen = path;
        break;
      } catch (const io::H5Error& e) {  // thrown on every rank alike
        damage = e.what();
      }
    }
    if (one_file) {
      throw DataFileError("checkpoint.resume: cannot read checkpoint file '" + path + "': " +
                          damage + "; point checkpoint.resume at an intact checkpoint");
    }
    log += "warning: skipping checkpoint " + path + ": " + damage + "\n";
  }
  if (chosen.empty()) {
    log += "checkpoint.resume: auto: no intact checkpoint in " + dir + "; starting from step 0\n";
    return {};
  }
  const std::string other_changes = config_changes(state.config, config.text).second;
  log += "resumed from " + chosen + " at step " + std::to_string(state.step) +
         (other_changes.empty() ? "" : "; changed since: " + other_changes) + "\n";
  return state;
}

std::string export_hf_over(parallel::Communicator& world, const io::Config& config,
                           const std::string& model_path) {
  if (!config.log.export_hf) return "";
  const std::string written = on_root<CollectiveError>(world, "log.export_hf: ", [&](auto&) {
    const auto files =
        io::export_model_file(model_path, config.log.dir + "/hf", io::kDefaultHfShardBytes);
    return std::to_string(files.size()) + " files";
  });
  return "hugging face export: " + config.log.dir + "/hf (" + written +
         "; from_pretrained loads it)\n";
}

namespace {
// Empty when `dir` exists or can be made and a file can be written in it; else why not. With
// `leave_none`, a directory this makes is removed again (the writer makes it when first needed).
std::string cannot_write(const std::string& dir, bool leave_none) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The outermost folder of `dir` missing now: what removing what this made stops at.
  fs::path path = fs::path(dir).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  fs::path outermost;
  for (fs::path p = path; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    outermost = p;
    if (p == p.parent_path()) break;
  }
  const bool made = std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec)) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  if (!ec) {
    const std::string probe = dir + "/.colossal-write-test";
    std::FILE* f = std::fopen(probe.c_str(), "w");
    if (f == nullptr) {
      ec = std::error_code(errno, std::generic_category());
    } else {
      std::fclose(f);
      std::error_code ignored;
      std::filesystem::remove(probe, ignored);
    }
  }
  if (made && leave_none && !outermost.empty()) {
    std::error_code ignored;
    for (fs::path p = path;; p = p.parent_path()) {
      fs::remove(p, ignored);  // empty folders only: anything put there since stays
      if (p == outermost || p == p.parent_path()) break;
    }
  }
  return ec ? ec.message() : std::string();
}
}  // namespace

void make_log_dir(parallel::Communicator& world, const io::Config& config) {
  const std::string& dir = config.log.dir;
  on_root<CollectiveError>(world, "log.dir: ", [&](std::string& error) {
    const std::string ckpt = checkpoint_dir(config);
    if (const std::string why = cannot_write(dir, false); !why.empty()) {
      error = "log.dir: cannot create or write '" + dir + "' (" + why +
              "; the run's metrics, config and model go there); set log.dir to a writable "
              "directory, e.g. --set log.dir=runs/mine";
    } else if (const std::string why_ckpt = cannot_write(ckpt, true); !why_ckpt.empty()) {
      // Checked now, not at the first checkpoint (checkpoint.every steps, or a SIGTERM, later).
      error = "checkpoint.dir: cannot create or write '" + ckpt + "' (" + why_ckpt +
              "); set checkpoint.dir to a writable directory (default: log.dir/checkpoints)";
    }
    return std::string();
  });
}

RunStart run_start(const io::Config& config, const io::CheckpointState& state) {
  RunStart start;
  if (state.step == 0) return start;
  const io::FineTuneConfig& reset = config.train.fine_tune;
  if (!reset.any()) {
    start.first_step = state.step;
    // A checkpoint of a fine-tune counts AdamW updates from before its own step 0.
    start.skipped_steps = std::max<int64_t>(state.step - state.optimizer_step, 0);
    start.optimizer_base = std::max<int64_t>(state.optimizer_step - state.step, 0);
    // ... and where its LR schedule stood (a fine-tune that continued the schedule).
    start.schedule_base = std::max<int64_t>(state.schedule_step - state.step, 0);
    return start;
  }
  start.restore_moments = !reset.reset_optimizer;
  start.optimizer_base = reset.reset_optimizer ? 0 : state.optimizer_step;
  start.schedule_base = reset.reset_schedule ? 0 : state.step;
  return start;
}

void write_checkpoint_over(parallel::Communicator& world, const io::Config& config,
                           const std::vector<core::ParamSpec>& logical,
                           const io::CheckpointShard& mine, const io::CheckpointState& state) {
  try {
    io::write_checkpoint(checkpoint_dir(config), logical, mine, state, config.checkpoint.keep,
                         file_communicator(&world));  // errors alike on every rank
  } catch (const std::exception& e) {
    throw CollectiveError("checkpoint at step " + std::to_string(state.step) + " failed: " +
                          e.what() + "; the previous checkpoint is untouched");
  }
}

std::vector<core::ParamSpec> Trainer::logical_table() const {
  return core::parameter_table(config_.model);
}

std::vector<float> Trainer::logical_parameters() {
  std::vector<std::vector<float>> local;
  for (Chunk& chunk : chunks_) local.push_back(chunk_parameters(chunk));  // collective (ZeRO-3)
  return to_logical(local);
}

std::vector<float> Trainer::to_logical(const std::vector<std::vector<float>>& local) {
  const int t = tp_->size();
  const auto logical = logical_table();
  std::vector<float> out(core::parameter_units(logical, 16).back().end, 0.0f);
  // 2d / 2.5d / 3d: every rank writes the elements it owns; the sum over the tensor group below
  // assembles them.
  const bool owned_sum = t > 1 && chunks_.front().dense == nullptr;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const core::StageModel& model = *chunks_[c].model;
    if (t == 1 || owned_sum) {
      core::export_owned_runs(model.logical_runs(), logical, local[c].data(), out.data());
      continue;
    }
    // Every tensor rank's part (the ranks' tables are alike; their runs differ by rank).
    std::vector<float> all(local[c].size() * t);
    tp_->all_gather(local[c], all);
    for (int r = 0; r < t; ++r) {
      core::export_owned_runs(
          core::logical_runs(model.parameters(), logical, r, model.stage().embeds), logical,
          all.data() + std::size_t(r) * model.flat_size(), out.data());
    }
  }
  if (owned_sum) tp_->all_reduce_sum(out);
  // Every stage wrote its own tensors and zeros elsewhere: the sum is the whole model.
  if (pp_->size() > 1) pp_->all_reduce_sum(out);
  return out;
}

void Trainer::save_weights(const std::string& path) {
  const bool writer = world_->rank() == 0;
  // Without tensor parallelism every tensor is whole in this rank's layout: write it from there
  // (the model's table names the same tensors, at its own offsets), without copies when the
  // parameters are already whole in host memory.
  if (tp_->size() == 1 && pp_->size() == 1) {
    const float* whole = model_->store().full_params();
    if (whole != nullptr &&
        std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace>) {
      if (writer) io::write_model_file(path, model_->parameters(), whole, config_.text, plan_);
      return;
    }
    const std::vector<float> local = local_parameters();  // collective under ZeRO-3
    if (writer) io::write_model_file(path, model_->parameters(), local.data(), config_.text, plan_);
    return;
  }
  const std::vector<float> values = logical_parameters();  // collective
  if (writer) io::write_model_file(path, logical_table(), values.data(), config_.text, plan_);
}

std::vector<std::vector<float>> Trainer::from_logical(const std::vector<float>& values) const {
  const auto logical = logical_table();
  // This rank's part of every tensor, in each chunk's layout.
  std::vector<std::vector<float>> out;
  for (const Chunk& chunk : chunks_) {
    std::vector<float> host(chunk.model->flat_size(), 0.0f);
    core::import_runs(chunk.model->logical_runs(), logical, values.data(), host.data());
    out.push_back(std::move(host));
  }
  return out;
}

void Trainer::set_logical_parameters(const std::vector<float>& values) {
  const auto logical = logical_table();
  for (Chunk& chunk : chunks_) {
    core::ParameterStore& store = chunk.model->store();
    if (float* flat = core::host_writable_params(store)) {
      core::import_runs(chunk.model->logical_runs(), logical, values.data(), flat);
      continue;
    }
    std::vector<float> host(chunk.model->flat_size(), 0.0f);
    core::import_runs(chunk.model->logical_runs(), logical, values.data(), host.data());
    set_store_parameters(store, host);
  }
}

void Trainer::load_weights(const std::string& path) {
  const auto logical = logical_table();
  // Rank 0 checks the file (every tensor's shape, nothing extra) and reads its config; then each
  // rank reads only the elements its layout holds (read_chunk_weights), so no rank holds the
  // whole model twice.
  const std::string saved = on_root<io::H5Error>(
      *world_, "", [&](auto&) { return io::check_model_file(path, logical, &config_.model); });
  // What no tensor's shape shows: a LLaMA's rotary base and RMSNorm epsilon, from the config the
  // file carries. Evaluated with other values the model computes other numbers, silently.
  io::Config trained;
  try {
    trained = io::parse_config(saved, path + " (config)", {},
                               io::ParseOptions{.require_data = false, .stored = true});
  } catch (const std::exception&) {
    trained.model = config_.model;  // an older or hand-made file: nothing to compare
  }
  if (config_.model.llama() && trained.model.llama()) {
    const auto differences =
        io::numerics_differences(config_.model, io::numerics_of(trained.model));
    if (!differences.empty()) {  // every one, so that one edit of the config fixes them all
      std::ostringstream text, set;
      text << std::setprecision(9) << "model file '" << path << "' was trained with ";
      set << std::setprecision(9);
      for (std::size_t i = 0; i < differences.size(); ++i) {
        const io::NumericsDifference& d = differences[i];
        text << (i ? ", " : "") << d.key << " " << d.theirs << " but the config has " << d.ours;
        set << (i ? ", " : "") << d.key << ": " << d.theirs;
      }
      text << "; set " << set.str()
           << " (or start from the file with model.init_from, which keeps the config's)";
      throw io::H5Error(text.str());
    }
  }
  std::vector<WeightsChunk> held;
  for (Chunk& chunk : chunks_) held.push_back({chunk.optimizer.get(), chunk.model});
  read_chunk_weights(path, config_.model, *world_, held, "model file: ");
}

void Trainer::set_local_parameters(const std::vector<std::vector<float>>& per_chunk) {
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    set_store_parameters(chunks_[c].model->store(), per_chunk[c]);
  }
}

Sampling sampling_of(const io::SampleConfig& sample, uint64_t seed) {
  Sampling how;
  how.temperature = sample.temperature;
  how.top_k = sample.top_k;
  how.top_p = sample.top_p;
  how.stop_tokens = sample.stop_tokens;
  how.seed = seed;
  return how;
}

// The largest logit (temperature 0), or a draw with the i-th number of the seed's sampling
// stream from the weights exp((l - max) / temperature), those outside the top_k / top_p cut set
// to 0. The draw walks the ids in order, so without a cut it is the plain softmax draw.
int sample_token(std::span<float> logits, int candidates, const Sampling& how, int i) {
  constexpr uint64_t kStream = core::hash_name("colossal.sample");
  const int n = std::min<int>(candidates, int(logits.size()));
  float* l = logits.data();
  if (how.temperature <= 0.0) return int(std::max_element(l, l + n) - l);
  const float mx = *std::max_element(l, l + n);
  for (int j = 0; j < n; ++j) l[j] = std::exp(float((l[j] - mx) / how.temperature));
  const int k = how.top_k > 0 ? std::min(how.top_k, n) : n;
  if (k < n || how.top_p < 1.0) {
    // The likeliest first (ties: the smaller id), cut to k, then to the nucleus of top_p.
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    int keep = k;
    if (how.top_p < 1.0) {
      double mass = 0.0;
      for (int j = 0; j < k; ++j) mass += l[order[j]];
      double acc = 0.0;
      keep = 0;
      while (keep < k && acc < how.top_p * mass) acc += l[order[keep++]];
      keep = std::max(keep, 1);
    }
    for (int j = keep; j < n; ++j) l[order[j]] = 0.0f;
  }
  double total = 0.0;
  for (int j = 0; j < n; ++j) total += l[j];
  const double u = core::word_to_unit(
                       core::random_words(how.seed, kStream + uint64_t(how.stream), i).v[0]) *
                   total;
  // The first id whose running sum reaches u; an id of weight 0 is never drawn.
  double acc = 0.0;
  int last = 0;
  for (int j = 0; j < n; ++j) {
    if (l[j] <= 0.0f) continue;
    acc += l[j];
    last = j;
    if (acc >= u) break;
  }
  return last;
}

void check_stop_tokens(const std::vector<int>& stop, const io::TokenFile& data, int vocab,
                       const std::string& key) {
  const bool bytes = data.format() == io::TokenFile::Format::raw_bytes;
  for (int id : stop) {
    if (id < 0 || id >= vocab) {
      throw io::ConfigError(key + ": token " + std::to_string(id) +
                            " is outside the model's vocabulary (model.vocab: " +
                            std::to_string(vocab) + ")");
    }
    if (bytes && id > 255) {
      throw io::ConfigError(key + ": token " + std::to_string(id) + " is never drawn: " +
                            data.path() +
                            " is text, whose tokens are bytes (0 to 255), e.g. 10 for a newline");
    }
  }
}

void Trainer::upload_decode(const int32_t* tokens, int n) {
  for (Chunk& chunk : chunks_) {
    if (!chunk.range.embeds) continue;
    tokens_queue_.wait();  // the staging is free (as upload())
    std::copy_n(tokens, n, token_staging_.data());
    tokens_queue_.follow_kernels();
    tokens_queue_.to_device(chunk.inputs.data(), token_staging_.data(), std::size_t(n) * 4);
    tokens_queue_.precede();
  }
}

void Trainer::decode_tokens(const int32_t* tokens, int n, int position) {
  const int rows = chunks_.front().dense->decode_shape().rows;
  for (int done = 0; done < n; done += rows) {
    const int r = std::min(rows, n - done);
    upload_decode(tokens + done, r);
    decode_want_logits_ = done + r == n;  // the last row's alone
    executor_->decode(r, position + done);
    decode_unchanged_ = true;  // the weights do not change while sampling
  }
  // The logits of the last token: on the last pipeline stage (every tensor and sequence rank of
  // it computed them), then sent to the other stages.
  if (pp_->size() > 1) {
    pp_->broadcast_bytes(std::as_writable_bytes(std::span<float>(decode_logits_)),
                         pp_->size() - 1);
  }
}

std::string Trainer::generate(const std::string& prompt, int tokens, const Sampling& how,
                              const std::string& key,
                              const std::function<void(int done)>& progress) {
  const int T = config_.train.seq_len, V = config_.model.vocab;
  // Checked on every rank (the same data, the same verdict), before any collective.
  std::vector<int32_t> context = prompt_tokens(prompt, *train_data_, V, key);
  check_stop_tokens(how.stop_tokens, *train_data_, V, how.stop_key);
  if (chunks_.back().dense == nullptr) {
    // 2d / 2.5d / 3d: the whole model (collective over the tensor group) in a one-rank 1d
    // trainer on world rank 0, which samples: the text a 1d run of these weights prints.
    const std::vector<float> values = logical_parameters();
    if (world_->rank() != 0) return "";
    if (sampler_trainer_ == nullptr) sampler_trainer_ = one_rank_trainer(1, decode_requested_);
    Trainer& whole = *sampler_trainer_;
    whole.set_logical_parameters(values);
    std::string text = whole.generate(prompt, tokens, how, key, progress);
    last_logits_ = whole.last_logits();
    generated_ = whole.generated();
    return text;
  }
  const bool bytes = train_data_->format() == io::TokenFile::Format::raw_bytes;
  // The model's window is train.seq_len: a longer context keeps only its last T tokens (and
  // positions restart), which differs from a model reading all of it. Said, not done silently.
  // (colossal_generate's --prompt; the end-of-run sample of a training run stays quiet.)
  if (world_->rank() == 0 && key == "--prompt" &&
      context.size() + std::size_t(std::max(tokens, 0)) > std::size_t(T)) {
    std::fprintf(stderr,
                 "note: the prompt's %zu tokens and %d new ones exceed train.seq_len = %d: each "
                 "token is sampled from the last %d of the context only; raise train.seq_len "
                 "(up to model.max_seq = %d) for more\n",
                 context.size(), tokens, T, T, config_.model.max_seq);
  }
  std::vector<float> logits(V);
  std::string out;
  // Incremental decoding: the cache holds the window's first `cached` positions. Until the
  // window is full each token is one new position; once it is, the window moves by one token
  // and its positions restart, so it is decoded again whole (what the forward below does).
  int cached = 0;
  decode_unchanged_ = false;
  generated_ = 0;
  for (int i = 0; i < tokens; ++i) {
    const std::size_t len = std::min<std::size_t>(context.size(), T);
    if (decoding_) {
      if (i > 0 && cached < T && std::size_t(cached) + 1 == len) {
        decode_tokens(&context.back(), 1, cached);
        ++cached;
      } else {
        decode_tokens(context.data() + (context.size() - len), int(len), 0);
        cached = int(len);
      }
      logits = decode_logits_;
    } else {
      // Causal attention: positions after the context do not affect the last context position.
      std::fill(host_inputs_.begin(), host_inputs_.begin() + T, 0);
      std::copy(context.end() - len, context.end(), host_inputs_.begin());
      std::fill(host_targets_.begin(), host_targets_.begin() + T, 0);  // unused: no gradient
      upload();
      pipeline_forward(1);
      // The last context position's logits: on the last pipeline stage, gathered over the
      // tensor group on the sequence rank holding that position and sent to the other sequence
      // ranks; then sent to the other stages.
      const int last = pp_->size() - 1;
      if (pp_->rank() == last) {
        const int owner = int(len - 1) / chunk_;
        head_model().gather_logits(sp_->rank() == owner ? int64_t(len - 1) % chunk_ : 0,
                                   logits.data());
        if (sp_->size() > 1) {
          sp_->broadcast_bytes(std::as_writable_bytes(std::span<float>(logits)), owner);
        }
      }
      if (pp_->size() > 1) {
        pp_->broadcast_bytes(std::as_writable_bytes(std::span<float>(logits)), last);
      }
    }
    last_logits_ = logits;
    // World rank 0's draw for every rank: ranks that sample alike (data-parallel replicas run
    // the same forward) stay in step, also where a stop token ends the text.
    int next = sample_token(logits, bytes ? 256 : V, how, i);
    if (world_->size() > 1) world_->broadcast_value(next, 0);
    context.push_back(next);
    if (bytes) {
      out.push_back(static_cast<char>(next));
    } else {
      out += ' ' + std::to_string(next);
    }
    generated_ = i + 1;
    if (progress) progress(i + 1);
    if (std::find(how.stop_tokens.begin(), how.stop_tokens.end(), next) !=
        how.stop_tokens.end()) {
      break;
    }
  }
  return out;
}

io::Config one_rank_config(const io::Config& config, int micro_batch) {
  io::Config one = config;
  one.parallel = io::ParallelConfig{};
  one.train.micro_batch = micro_batch;
  one.train.global_batch = micro_batch;
  one.checkpoint.every = 0;
  one.checkpoint.resume = io::ResumeMode::never;
  one.model_init_from.clear();  // its weights are the caller's: not read again
  // A grid runs the fused attention at any head size (fp32 q/k/v); as 1d in bf16 a GPU build
  // needs one the tensor cores take, else the dense attention samples (the same values).
  if (one.model.fused_attention &&
      !core::fused_attention_unsupported(one.model.hidden / one.model.heads, bf16_operands(one))
           .empty()) {
    one.model.fused_attention = false;
  }
  return one;
}

std::unique_ptr<Trainer> Trainer::one_rank_trainer(int micro_batch, bool decode) const {
  // Sampling and scoring need no training state (also at the end of a training run): the
  // parameters and one block's activations, written straight from the caller's values, and
  // (colossal_generate) the decoding state.
  return std::make_unique<Trainer>(one_rank_config(config_, micro_batch), nullptr, nullptr,
                                   TrainerOptions{.inference = true, .decode = decode});
}

int ChoiceScores::best(int64_t e, ChoiceMeasure m) const {
  const auto score = [&](std::size_t c) {
    return m == ChoiceMeasure::per_token ? loss[c] / tokens[c] : loss[c];
  };
  int best = 0;
  for (std::size_t c = first[e]; c < first[e + 1]; ++c) {
    if (score(c) < score(first[e] + std::size_t(best))) best = int(c - first[e]);
  }
  return best;
}

int64_t ChoiceScores::right(ChoiceMeasure m) const {
  int64_t right = 0;
  for (int64_t e = 0; e < examples(); ++e) right += best(e, m) == labels[e];
  return right;
}

std::vector<io::ChoiceExample> load_choices(parallel::Communicator& world,
                                            const std::string& path, const std::string& key,
                                            const io::Config& config, int64_t first_n) {
  const std::string bytes = on_root<DataFileError>(
      world, "", [&](auto&) { return io::read_choice_bytes(path, key); });
  std::vector<io::ChoiceExample> examples;
  try {
    examples = io::parse_choice_file(bytes, path, config.model.vocab, key);
  } catch (const io::ChoiceFileError& e) {
    throw DataFileError(e.what());
  }
  if (first_n > 0 && std::size_t(first_n) < examples.size()) examples.resize(first_n);
  check_choice_lengths(examples, config.train.seq_len, key);
  return examples;
}

io::Config choice_window_config(const io::Config& config,
                                const std::vector<io::ChoiceExample>& examples) {
  const std::size_t T = std::size_t(config.train.seq_len);
  std::size_t longest = 1;  // inputs: the kept context and the completion but its last token
  for (const io::ChoiceExample& ex : examples) {
    for (const auto& completion : ex.completions) {
      if (completion.size() > T) return config;  // check_choice_lengths says why
      longest = std::max(longest, kept_context(ex.context.size(), completion.size(), int(T)) +
                                      completion.size() - 1);
    }
  }
  // What divides train.seq_len: the ring's ranks, and under sequence_split the tensor ranks
  // too; 16 keeps the rows aligned. (2d / 2.5d / 3d score in a one-rank trainer.)
  const bool grid = config.parallel.tensor_mode != core::TensorMode::d1;
  const std::size_t multiple =
      16 * std::size_t(config.parallel.sequence) *
      std::size_t(!grid && config.parallel.sequence_split ? config.parallel.tensor : 1);
  const std::size_t window = (longest + multiple - 1) / multiple * multiple;
  if (window >= T) return config;
  try {
    io::ParseOptions options;
    options.stored = true;  // the resolved config, as written
    return io::parse_config(io::to_yaml(config), config.source,
                            {"train.seq_len=" + std::to_string(window)}, options);
  } catch (const io::ConfigError&) {
    return config;  // a rule of the layout this window breaks (the same on every rank)
  }
}

std::string choice_accuracy_line(const ChoiceScores& s) {
  char line[160];
  const auto n = (long long)s.examples();
  std::snprintf(line, sizeof line,
                "choices accuracy %.4f (%lld/%lld) per token, %.4f (%lld/%lld) total",
                s.accuracy(ChoiceMeasure::per_token), (long long)s.right(ChoiceMeasure::per_token),
                n, s.accuracy(ChoiceMeasure::total), (long long)s.right(ChoiceMeasure::total), n);
  return line;
}

void check_choice_lengths(const std::vector<io::ChoiceExample>& examples, int seq_len,
                          const std::string& key) {
  for (const io::ChoiceExample& ex : examples) {
    for (const auto& completion : ex.completions) {
      if (completion.size() > std::size_t(seq_len)) {
        throw DataFileError(key + ": multiple-choice example " + std::to_string(ex.index) +
                            " has a completion of " + std::to_string(completion.size()) +
                            " tokens, longer than the window (train.seq_len = " +
                            std::to_string(seq_len) + ") that scores it after at least one "
                            "context token; raise train.seq_len");
      }
    }
  }
}

namespace {
// The element-wise sum over `group` of host values, on every rank of it (each rank's values
// broadcast in turn: host memory on every backend, NCCL's included).
void sum_over(parallel::Communicator& group, std::span<double> values) {
  if (group.size() == 1) return;
  std::vector<double> sum(values.size(), 0.0), theirs(values.size());
  for (int q = 0; q < group.size(); ++q) {
    if (group.rank() == q) std::copy(values.begin(), values.end(), theirs.begin());
    group.broadcast_bytes(std::as_writable_bytes(std::span<double>(theirs)), q);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += theirs[i];
  }
  std::copy(sum.begin(), sum.end(), values.begin());
}
}  // namespace

ChoiceScores Trainer::score_choices(const std::vector<io::ChoiceExample>& examples,
                                    const std::function<void(int64_t, int64_t)>& progress) {
  const int T = config_.train.seq_len, B = config_.train.micro_batch;
  check_choice_lengths(examples, T, "multiple-choice examples");
  ChoiceScores s;
  // One row per completion: its (possibly cut) context, then its tokens; the inputs are the
  // row but its last token, the targets the row from its second.
  struct Row {
    const std::vector<int32_t>* context;
    const std::vector<int32_t>* completion;
    std::size_t keep;  // the context's last `keep` tokens
  };
  std::vector<Row> rows;
  for (const io::ChoiceExample& ex : examples) {
    s.first.push_back(rows.size());
    s.labels.push_back(ex.label);
    bool cut = false;
    for (const auto& completion : ex.completions) {
      const std::size_t keep = kept_context(ex.context.size(), completion.size(), T);
      cut = cut || keep < ex.context.size();
      rows.push_back({&ex.context, &completion, keep});
      s.tokens.push_back(int(completion.size()));
    }
    s.cut += cut;
  }
  s.first.push_back(rows.size());
  const int64_t M = int64_t(rows.size());
  s.loss.assign(std::size_t(M), 0.0);
  if (M == 0) return s;

  if (chunks_.back().dense == nullptr) {
    // 2d / 2.5d / 3d: the whole model (collective over the tensor group) in a one-rank 1d
    // trainer on world rank 0, which scores a piece of examples at a time; after each piece
    // its sums (or its error: every rank then throws it) reach every rank, which the watchdog
    // hears of. The trainer is freed at the end: one whole copy of the model at a time, beside
    // generate()'s (which a run makes after its last scoring).
    const std::vector<float> values = logical_parameters();
    const std::size_t piece_examples = 2 * std::size_t(B);  // a few forwards of rows each
    bool ready = false;
    for (std::size_t e0 = 0; e0 < examples.size(); e0 += piece_examples) {
      const std::size_t e1 = std::min(examples.size(), e0 + piece_examples);
      std::vector<double> part(s.first[e1] - s.first[e0], 0.0);
      std::string error;
      if (world_->rank() == 0) {
        try {
          if (!ready) {
            if (scorer_trainer_ == nullptr) scorer_trainer_ = one_rank_trainer(B, false);
            scorer_trainer_->set_logical_parameters(values);
            ready = true;
          }
          const std::vector<io::ChoiceExample> piece(examples.begin() + std::ptrdiff_t(e0),
                                                     examples.begin() + std::ptrdiff_t(e1));
          part = scorer_trainer_->score_choices(piece).loss;
          if (progress) progress(int64_t(s.first[e1]), M);
        } catch (const std::exception& e) {
          error = std::string("scoring the multiple-choice examples on rank 0: ") + e.what();
        }
      }
      world_->broadcast_string(error, 0);
      if (!error.empty()) {
        scorer_trainer_.reset();
        throw CollectiveError(error);
      }
      world_->broadcast_bytes(std::as_writable_bytes(std::span<double>(part)), 0);
      std::copy(part.begin(), part.end(), s.loss.begin() + std::ptrdiff_t(s.first[e0]));
      if (watchdog_ != nullptr) watchdog_->progress(-1, "scoring multiple-choice completions");
    }
    scorer_trainer_.reset();
    return s;
  }

  // Replica r of the data-parallel ones scores rows [M*r/R, M*(r+1)/R), as evaluate() shares
  // windows (under ZeRO-3 as many forwards on every rank).
  const int64_t R = dp_->size();
  const ReplicaBatches part(M, R, dp_->rank(), B,
                            chunks_.front().model->store().collective() ? (M + R - 1) / R : 0);
  const int64_t begin = part.begin, end = part.end;
  const bool head = pp_->rank() == pp_->size() - 1;
  const int64_t from = int64_t(sp_->rank()) * chunk_;  // this rank's positions [from, from+chunk_)
  std::vector<float> losses(std::size_t(B) * std::size_t(chunk_));
  for (int64_t i = 0; i < part.count; ++i) {
    const auto [first, count, real] = part[i];
    std::fill(host_inputs_.begin(), host_inputs_.end(), 0);
    std::fill(host_targets_.begin(), host_targets_.end(), 0);
    for (int b = 0; b < count; ++b) {
      const Row& row = rows[std::size_t(first + b)];
      int32_t* in = host_inputs_.data() + std::size_t(b) * T;
      int32_t* out = host_targets_.data() + std::size_t(b) * T;
      // tokens: context[size - keep:], completion; inputs [0, L-1), targets [1, L)
      std::vector<int32_t> tokens(row.context->end() - std::ptrdiff_t(row.keep),
                                  row.context->end());
      tokens.insert(tokens.end(), row.completion->begin(), row.completion->end());
      std::copy(tokens.begin(), tokens.end() - 1, in);
      std::copy(tokens.begin() + 1, tokens.end(), out);
    }
    upload();
    if (i > 0) {  // the weights of the batch before: bf16's copy of them is kept
      for (Chunk& chunk : chunks_) chunk.model->parameters_unchanged();
    }
    pipeline_forward(count);
    if (watchdog_ != nullptr) watchdog_->progress(-1, "scoring multiple-choice completions");
    if (real && progress && world_->rank() == 0) progress(first + count - begin, end - begin);
    if (!real || !head) continue;
    head_model().token_losses(int64_t(count) * chunk_, losses.data());
    for (int b = 0; b < count; ++b) {
      const Row& row = rows[std::size_t(first + b)];
      // The completion's tokens are predicted at positions [keep - 1, keep - 1 + its length).
      const int64_t lo = std::max<int64_t>(int64_t(row.keep) - 1, from);
      const int64_t hi = std::min<int64_t>(int64_t(row.keep) - 1 + int64_t(row.completion->size()),
                                           from + chunk_);
      double sum = 0.0;
      for (int64_t t = lo; t < hi; ++t) sum += losses[std::size_t(b * chunk_ + (t - from))];
      s.loss[std::size_t(first + b)] = sum;
    }
  }
  // Each sequence rank summed its positions (added up over them), the last stage alone scored
  // (sent to the others) and each replica its rows (each sends its range): every completion's
  // loss on every rank (the tensor ranks agree). Host memory, so any backend carries it.
  const std::span<double> mine(s.loss.data() + begin, std::size_t(end - begin));
  sum_over(*sp_, mine);
  if (pp_->size() > 1) pp_->broadcast_bytes(std::as_writable_bytes(mine), pp_->size() - 1);
  for (int64_t q = 0; q < R; ++q) {
    const int64_t b = M * q / R, e = M * (q + 1) / R;
    if (e > b) {
      dp_->broadcast_bytes(
          std::as_writable_bytes(std::span<double>(s.loss.data() + b, std::size_t(e - b))),
          int(q));
    }
  }
  return s;
}

io::Config sampling_config(io::Config config) {
  if (config.parallel.tensor_mode == core::TensorMode::d1 && config.train.micro_batch != 1) {
    config.train.micro_batch = 1;
    config.text = io::to_yaml(config);  // what the memory check's alternatives start from
  }
  return config;
}

std::unique_ptr<Trainer> inference_trainer(io::Config config, parallel::Communicator* world,
                                           const std::string& weights, MemoryUse use) {
  if (!weights.empty()) config.model_init_from.clear();  // not read, then overwritten
  use.inference = true;
  check_memory_fits(config, use);
  auto trainer = std::make_unique<Trainer>(
      config, nullptr, world, TrainerOptions{.inference = true, .decode = use.decode});
  if (!weights.empty()) trainer->load_weights(weights);
  return trainer;
}

}  // namespace colossal::apps
