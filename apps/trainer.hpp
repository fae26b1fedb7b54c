// The training loop shared by colossal_train, colossal_eval and colossal_generate, for every
// layout (1d, 2d, 2.5d and 3d tensor modes; data, sequence and pipeline parallelism; ZeRO): the
// sampler -> the pipeline executor over the chunks' core::StageModels -> the model's own reduce
// over its replicas -> zero::GradientSync -> clip -> zero::ShardedAdamW -> validation -> the run log (apps/run_log.hpp: metrics files, progress
// line, summary) -> checkpoints, model file. docs/training-step.md walks through it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/errors.hpp"
#include "apps/layout.hpp"
#include "apps/memory_fit.hpp"
#include "apps/model_factory.hpp"
#include "apps/run_log.hpp"
#include "apps/watchdog.hpp"
#include "core/gemm.hpp"
#include "core/host_threads.hpp"
#include "core/memory.hpp"
#include "core/model.hpp"
#include "core/optimizer.hpp"
#include "core/profiler.hpp"
#include "core/trace.hpp"
#include "io/checkpoint.hpp"
#include "io/choice_file.hpp"
#include "io/config.hpp"
#include "io/dataset.hpp"
#include "parallel/communicator.hpp"
#include "parallel/mesh.hpp"
#include "parallel/pipeline_executor.hpp"
#include "parallel/pipeline_schedule.hpp"
#include "parallel/stage_link.hpp"
#include "parallel/tensor_group.hpp"
#include "zero/gradient_sync.hpp"
#include "zero/sharded_optimizer.hpp"

namespace colossal::apps {

// Asks every trainer of this process to stop after its current step with a checkpoint
// (async-signal-safe: SIGTERM / SIGUSR1 handlers call it). 0 clears the request.
void request_stop(int signal);
int stop_requested();

// Where checkpoints go: checkpoint.dir, else log.dir/checkpoints.
std::string checkpoint_dir(const io::Config& config);
// The file of the checkpoint after `step` steps.
std::string checkpoint_path(const io::Config& config, int64_t step);

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start);

// What checkpoint.resume: auto reads, for any trainer: rank 0 checks each checkpoint of
// checkpoint_dir(config), newest first (integrity header, and the model config it was written
// with: another model is an error, not damage to skip); then every rank reads `wanted`
// collectively, verified through `owned` (io::read_checkpoint). Returns the state, step 0 when
// no checkpoint is intact; `log` gets the lines to print (skipped files, what was resumed).
// Collective over `world`; errors are thrown on every rank alike.
io::CheckpointState read_newest_checkpoint(const io::Config& config, parallel::Communicator& world,
                                           const std::vector<core::ParamSpec>& logical,
                                           const io::CheckpointShard& wanted,
                                           const io::CheckpointShard& owned, std::string& log);

// log.export_hf: rank 0 exports the model file `model_path` to log.dir/hf/ (io/hf_export.hpp);
// a failure is a CollectiveError on every rank. Collective; nothing when the key is false.
// Returns the line to print ("" when nothing was exported).
std::string export_hf_over(parallel::Communicator& world, const io::Config& config,
                           const std::string& model_path);

// Creates log.dir on rank 0 before anything is written there; one that cannot be created (or
// written) is a CollectiveError naming log.dir and the path on every rank. Collective.
void make_log_dir(parallel::Communicator& world, const io::Config& config);

// Where a run stands after checkpoint.resume restored `state` (step 0: nothing restored), for any
// trainer. Continuing (auto, or a file without train.reset_*): the run's own step counter, LR
// schedule and AdamW count go on, train.steps is its total. Fine-tuning (a file with a reset): a
// new run counted from step 0, train.steps more steps; what is not reset goes on from the
// checkpoint. At this run's step s (0-based) AdamW takes its update number
// s + 1 - skipped_steps + optimizer_base and the LR is the schedule over
// train.steps + schedule_base steps at s + schedule_base.
struct RunStart {
  int64_t first_step = 0;      // the first step this run trains
  int64_t skipped_steps = 0;   // steps before first_step that applied no update
  int64_t optimizer_base = 0;  // AdamW updates taken before this run's step 0
  int64_t schedule_base = 0;   // LR schedule steps before this run's step 0
  bool restore_moments = true; // the AdamW moments come from the checkpoint
};
RunStart run_start(const io::Config& config, const io::CheckpointState& state);

// Writes one checkpoint collectively over `world` (see io::write_checkpoint); a failure is
// reported on every rank as a CollectiveError that keeps the previous checkpoint.
void write_checkpoint_over(parallel::Communicator& world, const io::Config& config,
                           const std::vector<core::ParamSpec>& logical,
                           const io::CheckpointShard& mine, const io::CheckpointState& state);

// TrainSummary: apps/run_log.hpp, which fills most of it.

// Both trainers' end of step `done` (counted from 1), decided alike on every rank (collective
// over `world`): a stop request (SIGTERM, SIGUSR1) on any rank stops every rank after it; a
// checkpoint is written with `save(done)` on a stop, every checkpoint.every steps and after the
// last step when checkpoint.every is set, and reported on `log`. On a stop before the last step
// `summary` is filled as stopped (run started at `start`) and true returned: return it.
bool end_step(parallel::Communicator& world, const io::Config& config, int64_t done,
              const std::function<void(int64_t)>& save, TrainSummary& summary,
              Clock::time_point start, std::FILE* log);
// Step `failed` (counted from 0) was not finite: saves the state before it with `save(failed)`
// (none before the first step) and returns what the error adds ("; checkpoint ... holds ...").
std::string checkpoint_before_failure(const io::Config& config, int64_t failed,
                                      const std::function<void(int64_t)>& save);

using PipelineStats = parallel::PipelineStats;

// Peak FLOP/s of one device for MFU: hardware.peak_tflops if set, else the preset's (or the
// hardware file's) figure in the run's precision.
double peak_flops(const io::Config& config);

// MFU's peak for the whole job (collective over `world`): the sum over the ranks of each one's
// peak, and what it is. Where the products run on a GPU (a device build, or hardware.gemm:
// cublas) a rank's peak is hardware.peak_tflops or the spec's (peak_flops), divided among the
// ranks sharing that GPU. On a CPU it is hardware.peak_tflops, else the cores its threads run
// on at once at the rate per core that rank 0 measured (core::measure_cpu_peak, once per
// process; cpu_rank_peak), else the spec's where nothing was measured.
struct JobPeak {
  double flops = 0.0;
  std::string source;     // for rank 0's start-up line
  double per_core = 0.0;  // the CPU's measured fp32 rate per core (0: not measured)
};
JobPeak job_peak_flops(const io::Config& config, parallel::Communicator& world);
// A CPU rank's peak: `per_core` fp32 FLOP/s times the cores its threads run on at once (its
// threads, or its share of the node's cores where the node's threads outnumber them), times
// `bf16_multiple` (core::bf16_peak_multiple) when its products run on the bf16 units.
double cpu_rank_peak(double per_core, const core::ThreadPlan& plan, bool bf16_units,
                     double bf16_multiple);

// A trainer's world: `world`, or a one-process communicator kept alive in `own` when it is null.
// Throws CollectiveError naming the parallel sizes when its size is not the config's.
parallel::Communicator* run_world(const io::Config& config, parallel::Communicator* world,
                                  std::unique_ptr<parallel::Communicator>& own);

// The tokens a prompt stands for, given the training data: a text file's tokens are its bytes,
// so the prompt is text (empty: a newline); a token file's (llm.c .bin) are a tokenizer's ids,
// which colossal cannot make from text, so the prompt is those ids as numbers ("15496 995").
// Throws io::ConfigError naming `key` (sample.prompt, --prompt) for a prompt that is neither, or
// a token outside model.vocab.
std::vector<int32_t> prompt_tokens(const std::string& prompt, const io::TokenFile& data,
                                   int vocab, const std::string& key);

// How generate() draws each token: sample.* (colossal_train's end-of-run sample) or
// colossal_generate's flags. Softmax(logits / temperature), cut to the top_k likeliest, then to
// the fewest likeliest whose probabilities reach top_p, renormalised (Hugging Face's order).
struct Sampling {
  double temperature = 0.8;      // 0 = greedy (top_k and top_p then change nothing)
  int top_k = 0;                 // 0 = every token
  double top_p = 1.0;            // 1 = every token
  std::vector<int> stop_tokens;  // drawing one ends the text (which includes it)
  std::string stop_key = "sample.stop_tokens";  // where stop_tokens came from, for errors
  uint64_t seed = 1;
  int stream = 0;                // independent draws from one seed (colossal_generate --samples)
};
Sampling sampling_of(const io::SampleConfig& sample, uint64_t seed);

// A multiple-choice evaluation (colossal_eval --choices, eval.choices; io/choice_file.hpp):
// the summed cross-entropy of each completion's tokens after its context, in the file's order.
// An example is answered right when its label's completion has the least loss per token (as
// llm.c scores HellaSwag; lm-evaluation-harness's acc_norm divides by bytes instead) or, the
// second measure, the least total loss (lm-evaluation-harness's acc). Ties go to the first.
enum class ChoiceMeasure { per_token, total };
struct ChoiceScores {
  std::vector<std::size_t> first;  // example e's completions: [first[e], first[e + 1])
  std::vector<int> labels;         // per example
  std::vector<double> loss;        // per completion: summed over its tokens
  std::vector<int> tokens;         // per completion
  int64_t cut = 0;                 // contexts cut on the left to fit train.seq_len
  int64_t examples() const { return int64_t(labels.size()); }
  int best(int64_t e, ChoiceMeasure m) const;  // the completion of example e the measure picks
  int64_t right(ChoiceMeasure m) const;        // examples whose label it picks
  double accuracy(ChoiceMeasure m) const { return double(right(m)) / double(examples()); }
};

// The tokens of `context` a row keeps before a completion of `completion` tokens in a window
// of `seq_len` positions (its last ones; all when they fit).
inline std::size_t kept_context(std::size_t context, std::size_t completion, int seq_len) {
  return std::min(context, std::size_t(seq_len) + 1 - completion);
}

// --choices or eval.choices (`key`) read on rank 0 and parsed on every rank alike (a bad file
// is a DataFileError on every rank, before anything is allocated), cut to its first `first_n`
// examples (0: all) and checked against the config's window (check_choice_lengths).
std::vector<io::ChoiceExample> load_choices(parallel::Communicator& world,
                                            const std::string& path, const std::string& key,
                                            const io::Config& config, int64_t first_n);

// `config` with train.seq_len the shortest window that holds every row of `examples` (each
// context cut as train.seq_len cuts it), rounded up to a multiple of 16 x the ring's ranks (x
// the tensor ranks under sequence_split); `config` itself when that is no shorter or a rule of
// the layout refuses it.
io::Config choice_window_config(const io::Config& config,
                                const std::vector<io::ChoiceExample>& examples);

// "choices accuracy A (R/N) per token, B (R/N) total" (colossal_eval, colossal_train
// --eval-only), without a newline.
std::string choice_accuracy_line(const ChoiceScores& scores);

// Throws DataFileError (naming `key`) when a completion of `examples` is longer than
// seq_len - 1 tokens, which no window can score after a context.
void check_choice_lengths(const std::vector<io::ChoiceExample>& examples, int seq_len,
                          const std::string& key);

// The `i`-th token of a text drawn by `how` from `logits` (the last position's; overwritten),
// among the first `candidates` ids (256 over byte data: only the bytes can be printed). A tie at
// the top_k-th place keeps the smaller ids (exactly top_k tokens; Hugging Face keeps every tied
// one).
int sample_token(std::span<float> logits, int candidates, const Sampling& how, int i);

// Stop tokens the data can produce: io::ConfigError naming `key` for one at or past model.vocab
// or, over byte data, past 255 (never drawn there).
void check_stop_tokens(const std::vector<int>& stop, const io::TokenFile& data, int vocab,
                       const std::string& key);

// data.path (with its sampler) and, when set, data.val_path, each checked to hold the model's
// token ids and enough tokens for train.seq_len.
void open_run_data(const io::Config& config, std::unique_ptr<io::TokenFile>& train,
                   std::unique_ptr<io::TrainSampler>& sampler, std::unique_ptr<io::TokenFile>& val);

// One model chunk's part of a training checkpoint (docs/checkpoint-format.md), for any model
// class: its optimizer's state ranges mapped through the model's logical runs. Host buffers
// (the parameters, the moments) that the shard's runs point into.
struct ChunkState {
  std::vector<float> params, m, v;
};
// What the chunk writes: the parameters and moments its optimizer owns, each element from its
// owner, appended to `mine` (nothing on a `replica`: a gradient-group rank > 0 under stage 0).
void add_chunk_checkpoint(zero::ShardedAdamW& optimizer, const core::StageModel& model,
                          bool replica, ChunkState& held, io::CheckpointShard& mine);
// What it reads on resume (`wanted`: its whole layout of the parameters, ZeRO-3 its slices, and
// its moments) and what its owners verify (`owned`), into `state`; restore_chunk applies it.
void add_chunk_resume(const zero::ShardedAdamW& optimizer, const core::StageModel& model,
                      bool replica, ChunkState& state, io::CheckpointShard& wanted,
                      io::CheckpointShard& owned);
void restore_chunk(zero::ShardedAdamW& optimizer, core::StageModel& model,
                   const ChunkState& state);
// A flat host buffer's values into a store, unit by unit.
void set_store_parameters(core::ParameterStore& store, const std::vector<float>& host);

struct TrainerOptions {
  // Every buffer is counted by the tracker but none is allocated or initialised: memory() then
  // says what this layout needs per rank; nothing else may be called.
  bool memory_plan = false;
  // colossal_eval, colossal_generate: the model's parameters and what a forward needs, nothing of
  // training (no gradients, AdamW moments or gradient reduction; one activation slot; every block
  // recomputed from its input: inference_config, inference_activation_plan, apps/layout.hpp).
  // The parameters start at zero (not drawn): load_weights or model.init_from sets them.
  // evaluate(), generate(), load_weights(), save_weights() and the parameter views run;
  // train(), resume() and save_checkpoint() throw std::logic_error.
  bool inference = false;
  // colossal_generate: each 1d model chunk also keeps an incremental-decoding state
  // (core::Model::enable_decode: every block's keys and values of the window, priced in the
  // memory plan), and generate() samples each token from the new position alone instead of a
  // forward over the whole window. 2d / 2.5d / 3d sample in a one-rank trainer that has it.
  bool decode = false;
};

class Trainer {
 public:
  // `log` receives progress lines (nullptr: silent, as on ranks other than 0). `world` holds every
  // rank of the run (its size must be parallel.data * parallel.tensor.size * parallel.sequence),
  // split into the mesh's groups; nullptr runs on this process alone.
  Trainer(const io::Config& config, std::FILE* log, parallel::Communicator* world = nullptr,
          TrainerOptions options = {});
  ~Trainer();

  TrainSummary train();
  // With steps > 0, train() runs 1 + steps steps, prints the time per kind of work of the last
  // `steps` and returns without validation, model file or sample.
  void set_profile_steps(int steps) { profile_steps_ = steps; }
  // Records forward, backward, send, receive, gradient-reduction and optimizer spans of every
  // step and writes them at the end of train() as Chrome trace-event JSON (chrome://tracing,
  // Perfetto): to `path` on one rank, to path.rankN.json on each rank N of several.
  // The file is created here, so an unwritable path fails before any training.
  void set_trace(const std::string& path);
  // Mean validation loss over data.val_path windows (capped by data.val_windows).
  double evaluate();
  // Collective under ZeRO-3 (call on every rank); rank 0 writes the file.
  void save_weights(const std::string& path);
  // This rank's flat parameter buffer in host memory (collective under ZeRO-3).
  std::vector<float> local_parameters();
  // Every logical (Hugging Face) tensor, laid out as logical_table() says: one rank's layout
  // whatever this run's (collective over the tensor group, and the data group under ZeRO-3).
  std::vector<float> logical_parameters();
  std::vector<core::ParamSpec> logical_table() const;
  // This rank's flat layout <-> the logical tensors (collective over tensor and pipeline ranks).
  // (one buffer per model chunk; one chunk but under the interleaved schedule)
  std::vector<float> to_logical(const std::vector<std::vector<float>>& local);
  std::vector<std::vector<float>> from_logical(const std::vector<float>& logical) const;
  void set_local_parameters(const std::vector<std::vector<float>>& host);
  // from_logical and set_local_parameters in one, without the whole local copy where a chunk's
  // store is one host buffer (written in place); the store's padding is left as it is.
  void set_logical_parameters(const std::vector<float>& logical);

  // Checkpoints (io/checkpoint.hpp) of the model and AdamW state after `step` steps, written by
  // rank 0; collective. A failure to write is reported on every rank.
  void save_checkpoint(int64_t step, int64_t optimizer_step, int64_t schedule_step);
  // checkpoint.resume: auto: restores the newest intact checkpoint of checkpoint.dir and returns
  // its state (step 0 when there is none); collective.
  io::CheckpointState resume();
  std::string checkpoint_dir() const;
  // Called after every step with the number of steps done (tests use it to stop a run).
  void set_step_callback(std::function<void(int64_t)> callback) { step_callback_ = std::move(callback); }
  void load_weights(const std::string& path);
  // Continues `prompt` (prompt_tokens: text over byte data, token ids over a token file) by
  // `tokens` sampled tokens (temperature; 0 = greedy): text over byte data, else the ids, each
  // after a space.
  // `key` names the prompt in errors. `progress`, when set, is called after each token with the
  // tokens done so far, on every rank that samples (rank 0 alone in 2d / 2.5d / 3d).
  // Drawing one of how.stop_tokens ends the text early: generated() says how many came.
  std::string generate(const std::string& prompt, int tokens, const Sampling& how,
                       const std::string& key = "sample.prompt",
                       const std::function<void(int done)>& progress = {});
  std::string generate(const std::string& prompt, int tokens, double temperature, uint64_t seed,
                       const std::string& key = "sample.prompt",
                       const std::function<void(int done)>& progress = {}) {
    Sampling how;
    how.temperature = temperature;
    how.seed = seed;
    return generate(prompt, tokens, how, key, progress);
  }
  int generated() const { return generated_; }  // the tokens the last generate() made
  // Every completion of `examples` scored (ChoiceScores), on every rank; collective. Each
  // completion is one row of train.micro_batch rows per forward, spread over the data-parallel
  // replicas; a context longer than the window keeps its last tokens (counted in `cut`), a
  // completion longer than train.seq_len - 1 is an error. 2d / 2.5d / 3d score through a
  // one-rank trainer of the gathered weights on world rank 0 (as generate() samples).
  // `progress`, when set, is called on world rank 0 with the completions its replica scored
  // and the replica's share.
  ChoiceScores score_choices(const std::vector<io::ChoiceExample>& examples,
                             const std::function<void(int64_t done, int64_t of)>& progress = {});
  // eval.choices' examples (its first eval.choices_examples), read at construction by a
  // training trainer (inference trainers score what their program loads); empty without.
  const std::vector<io::ChoiceExample>& choice_examples() const { return choice_examples_; }
  // The full-vocabulary logits the last token generate() sampled was drawn from (on the ranks
  // that sample; empty before).
  const std::vector<float>& last_logits() const { return last_logits_; }

  core::Model& model() { return *model_; }  // 1d (the dense model class) only
  const core::MemoryTracker& memory() const { return tracker_; }
  const zero::ShardedAdamW& optimizer() const { return *optimizer_; }
  const zero::GradientSync& gradient_sync() const { return *gradient_sync_; }  // not inference
  bool inference() const { return inference_; }
  // The parallel plan every rank runs (YAML): mesh, ZeRO stage, shards and buckets. Rank 0's is
  // broadcast at construction and every rank checks that it derived the same one.
  const std::string& plan() const { return plan_; }
  // The cost model's prediction of this rank's step (shared cores included), as printed.
  const planner::TimePrediction& predicted_time() const { return predicted_time_; }
  parallel::Communicator& data_parallel() { return *dp_; }
  parallel::Communicator& tensor_parallel() { return *tp_; }
  parallel::Communicator& pipeline_parallel() { return *pp_; }
  // Forwards and backwards this stage ran, and the most micro-batches it held at once.
  const PipelineStats& pipeline_stats() const { return executor_->stats(); }
  const std::vector<int>& stage_layers() const { return stage_layers_; }
  parallel::Communicator& sequence_parallel() { return *sp_; }
  // Where gradients are summed and ZeRO shards: the data x sequence ranks of this tensor rank.
  parallel::Communicator& gradient_group() { return *grad_; }

 private:
  void print(const char* fmt, ...) const;
  void agree_on_plan();
  // One step's micro-batches through the pipeline executor; the global mean loss.
  double run_step(int64_t step);
  // host_inputs_/host_targets_ -> this rank's part of them in slot `slot` of a chunk's buffers
  void upload(int slot = 0, int chunk = 0);
  // This rank's tokens of one micro-batch (micro_batch x its sequence chunk): one slot's share
  // of a chunk's device token arrays, and half the staging (inputs, then targets).
  std::size_t slot_tokens() const { return token_staging_.size() / 2; }
  const int32_t* slot_inputs(int slot, int chunk = 0) const;
  const int32_t* slot_targets(int slot, int chunk = 0) const;
  core::Model& head_model() { return *chunks_.back().dense; }
  // generate() with TrainerOptions::decode: `n` tokens from `position` on through every stage
  // (prefilled decode_shape().rows at a time); the last one's logits in decode_logits_ on every
  // rank. And the tokens of one decode() into the embedding chunk's token array.
  void decode_tokens(const int32_t* tokens, int n, int position);
  void upload_decode(const int32_t* tokens, int n);
  bool decode_requested_ = false;  // TrainerOptions::decode
  bool decoding_ = false;          // ... and the chunks are 1d models, which decode
  bool decode_unchanged_ = false;  // the weights' bf16 copy of the last decode() still holds
  bool decode_want_logits_ = true;  // the head stage computes the logits of this decode()
  std::vector<float> last_logits_;
  int generated_ = 0;
  // 2d / 2.5d / 3d: the one-rank 1d trainer that samples on world rank 0, made by the first
  // generate() and given the current parameters by each.
  std::unique_ptr<Trainer> sampler_trainer_;
  std::vector<io::ChoiceExample> choice_examples_;
  std::unique_ptr<Trainer> scorer_trainer_;  // the same for score_choices(), micro_batch rows
  // Such a one-rank inference trainer of this config's model.
  std::unique_ptr<Trainer> one_rank_trainer(int micro_batch, bool decode) const;
  std::vector<float> decode_logits_;
  struct Chunk;
  // 2d / 2.5d / 3d: a chunk's model (which owns its store) and its zero/ pieces on that store.
  void build_grid_chunk(Chunk& chunk, bool memory_plan);
  // One forward of `batch` sequences uploaded to slot 0 through every pipeline stage (evaluation
  // and sampling): the mean loss on the last stage, 0 elsewhere.
  double pipeline_forward(int batch);

  // The GPU's used bytes before this trainer made anything (first: before the GEMM's handle),
  // and the most seen after a step (core::device_used_bytes; 0 on the host).
  std::size_t device_used_at_start_ = core::device_used_bytes();
  std::size_t device_used_peak_ = 0;
  // The summary's memory figures: peak RSS, and on a GPU what this run added there.
  void fill_memory_summary(TrainSummary& summary) const;

  io::Config config_;  // under inference, inference_config's
  bool inference_ = false;
  // train(), resume(), save_checkpoint(): a std::logic_error naming `what` under inference.
  void require_training(const char* what) const;
  std::FILE* log_;
  std::unique_ptr<parallel::Communicator> own_world_;  // when no communicator was given
  parallel::Communicator* world_;
  parallel::Groups groups_;  // this rank's group along each mesh axis
  parallel::Communicator* dp_;
  parallel::Communicator* tp_;
  parallel::Communicator* sp_;
  std::unique_ptr<parallel::CommunicatorGroup> tensor_group_;    // the model's view of tp_
  std::unique_ptr<parallel::CommunicatorGroup> sequence_group_;  // ... and of sp_ (ring)
  parallel::TensorGridGroups tensor_grid_groups_;  // 2d / 2.5d / 3d: tp_'s sub-grid groups
  std::unique_ptr<parallel::Communicator> grad_owner_;
  parallel::Communicator* grad_;  // gradient sum and ZeRO: data x sequence ranks (dp_ without sp)
  int chunk_ = 0;                 // positions of each sequence on this rank
  parallel::Communicator* pp_;    // one rank per pipeline stage
  std::unique_ptr<parallel::Communicator> tied_owner_;  // first + last stage (tied embedding)
  std::vector<int> stage_layers_;                 // blocks per stage
  std::vector<parallel::PipelineAction> schedule_;  // this stage's forwards and backwards
  class ChunkStage;  // a Chunk as the executor's parallel::PipelineStage
  // One model chunk of this rank (several under the interleaved schedule): virtual stage
  // index * stages + pipeline rank, its optimizer and model, its micro-batches in flight and its
  // link to the neighbouring virtual stages.
  struct Chunk {
    int virtual_stage = 0;
    core::StageRange range;
    std::unique_ptr<zero::ShardedAdamW> optimizer;
    std::unique_ptr<zero::GradientSync> gradients;  // on the optimizer's store
    BuiltModel built;          // apps/model_factory.hpp
    core::StageModel* model;   // built.model: what the executor and the checkpoints drive
    core::Model* dense;        // the same, as the 1d class (logits, generation); null in 2d/3d
    int slots = 1;
    core::DeviceArray<int32_t> inputs, targets;  // this rank's chunk of the tokens, per slot
    std::unique_ptr<parallel::StageLink> link;
    std::unique_ptr<ChunkStage> stage;
  };
  // Before the chunks: their models track into tracker_ and multiply through gemm_ until they
  // are destroyed (~Model lets go of its weights held in the GEMM).
  core::MemoryTracker tracker_;
  std::unique_ptr<core::Gemm> gemm_;
  // bf16's copy of the weights gemm_ holds (Gemm::keeps_stable_copy), tracked; empty otherwise.
  core::DeviceArray<std::uint16_t> weight_copy_;
  std::vector<Chunk> chunks_;
  int virtual_stages_ = 1;
  // A chunk's flat parameters in host memory (collective under ZeRO-3).
  std::vector<float> chunk_parameters(Chunk& chunk);
  std::unique_ptr<parallel::PipelineExecutor> executor_;  // over chunks_
  int64_t step_ = 0;  // the step run_step runs (the chunks' load() samples from it)
  // The validation windows of data.val_path, and those evaluate() reads (2d / 2.5d / 3d: whole
  // micro-batches of every replica; apps::DataFileError when fewer than one each).
  struct ValidationWindows {
    int64_t all, read;
  };
  ValidationWindows validation_windows() const;
  bool said_val_windows_ = false;  // evaluate()'s note on windows left out, printed once
  core::Model* model_ = nullptr;               // chunk 0's (the only one but interleaved)
  zero::ShardedAdamW* optimizer_ = nullptr;
  zero::GradientSync* gradient_sync_ = nullptr;
  std::unique_ptr<io::TokenFile> train_data_, val_data_;
  std::unique_ptr<io::TrainSampler> sampler_;
  std::vector<int32_t> host_inputs_, host_targets_;
  // upload()'s staging: this rank's part of the inputs, then of the targets, in host memory that
  // is pinned on a GPU build (the `offloaded` kind of array), so the copies to the device run on
  // tokens_queue_ without the host waiting for the kernels. Its own tracker: two windows of int32
  // outside the memory plan's categories, as the host buffers above.
  core::MemoryTracker staging_tracker_;
  core::DeviceArray<int32_t> token_staging_;
  core::CopyQueue tokens_queue_;  // after the staging: its destructor waits for its copies
  std::string plan_;
  Watchdog* watchdog_ = nullptr;     // during train(): told of every step, batch and checkpoint
  ActivationPlan activation_plan_;   // checkpointing.policy's schedule for this rank
  planner::MemoryPrediction predicted_memory_;  // the cost model's view of this rank
  planner::TimePrediction predicted_time_;
  std::string hardware_name_;
  core::Profiler profiler_;
  int profile_steps_ = 0;
  // --trace: spans of every step, in microseconds since the trainer started.
  core::TraceRecorder trace_;
  void write_trace() const;
  std::function<void(int64_t)> step_callback_;
  double profiled_seconds_ = 0.0;
};

// colossal_eval's and colossal_generate's trainer: an inference trainer (TrainerOptions) of
// `config` holding the model file `weights` (empty: config's model.init_from, which is otherwise
// not read), made once the node's memory was checked against its plan (check_memory_fits).
// Collective over MPI_COMM_WORLD and `world`.
// `decode`: with TrainerOptions::decode (colossal_generate), priced in the check.
// colossal_generate's config: sampling runs one sequence (its rows through the decoding state's
// own buffers, or a forward of batch 1 without the cache), so a 1d layout's trainer is built for
// train.micro_batch: 1, a forward's activations of one sequence (a quarter of gpt2-124m's at
// B=4; they also bound the rows prefilled at a time, core::decode_sizes). 2d / 2.5d / 3d, whose
// micro-batch the grid splits, sample in a one-rank trainer of their own: unchanged.
// `use`: with `decode` (TrainerOptions::decode), and whether the caller samples
// (colossal_generate) or scores multiple-choice examples (colossal_eval), which under 2d / 2.5d
// / 3d builds a whole model on world rank 0, priced in the check (whole_model_bytes); its
// `inference` is set here.
io::Config sampling_config(io::Config config);
std::unique_ptr<Trainer> inference_trainer(io::Config config, parallel::Communicator* world,
                                           const std::string& weights, MemoryUse use = {});

// The config of the one-rank 1d inference trainer in which a 2d / 2.5d / 3d run samples and
// scores eval.choices on world rank 0 (micro_batch rows a forward): the whole model.
io::Config one_rank_config(const io::Config& config, int micro_batch);

}  // namespace colossal::apps
