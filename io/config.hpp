// The experiment configuration: a YAML file checked against a schema, plus `--set key=value`
// overrides. Every key is documented in configs/README.md.
//
// Errors are thrown as ConfigError whose message reads
//   <file>:<line>:<column>: <key>: <what is wrong> (<what is allowed>); <what to do>
// so rank 0 can print it and every rank can exit non-zero the same way.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/checkpoint_policy.hpp"
#include "core/gemm.hpp"
#include "core/model_spec.hpp"
#include "core/tensor_mode.hpp"
#include "parallel/pipeline_schedule.hpp"

namespace colossal::io {

// The config's closed sets of words that only the config and the programs use, as values. Each
// has its word (what to_yaml writes and the error texts name) and a parse (nullopt for any other
// text). The modes of lower folders live there: core::TensorMode, core::CheckpointPolicy,
// core::GemmPrecision (train.precision), parallel::PipelineSchedule.

// train.on_nonfinite: stop the run, or skip the step.
enum class OnNonfinite : uint8_t { stop, skip };
// parallel.mode: manual (the sizes given), or automatic (the word "auto": the planner's layout).
enum class ParallelMode : uint8_t { manual, automatic };
// checkpoint.resume: never (start afresh), automatic (the word "auto": continue from the
// newest intact checkpoint), or file (any other text: that checkpoint file,
// CheckpointConfig::resume_path).
enum class ResumeMode : uint8_t { never, automatic, file };

const char* on_nonfinite_name(OnNonfinite mode);    // "stop", "skip"
const char* parallel_mode_name(ParallelMode mode);  // "manual", "auto"
const char* resume_mode_name(ResumeMode mode);      // "never", "auto", "file"
std::optional<OnNonfinite> parse_on_nonfinite(std::string_view name);
std::optional<ParallelMode> parse_parallel_mode(std::string_view name);
std::optional<ResumeMode> parse_resume_mode(std::string_view name);  // never | auto only

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DataConfig {
  std::string path;              // training data: raw text (bytes as tokens) or llm.c uint16 tokens
  std::string val_path;          // validation data; empty = no validation
  int64_t val_windows = 0;       // cap on validation windows; 0 = all
};

struct OptimizerConfig {
  double lr = 3.0e-4;
  double min_lr = 3.0e-5;
  int64_t warmup = 100;          // steps of linear warm-up
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;        // global-norm clip; 0 = off
};

// Fine-tuning from a checkpoint file (checkpoint.resume: PATH): each reset makes the run a new
// one counted from step 0 whose train.steps are the steps after the checkpoint.
struct FineTuneConfig {
  bool reset_optimizer = false;  // fresh AdamW moments and step count; weights restored
  bool reset_schedule = false;   // the learning-rate schedule starts again at step 0
  bool any() const { return reset_optimizer || reset_schedule; }
};

struct TrainConfig {
  int64_t steps = 1000;
  int seq_len = 256;
  int global_batch = 32;         // sequences per optimizer step
  int micro_batch = 4;           // sequences per forward/backward
  uint64_t seed = 1234;
  core::GemmPrecision precision = core::GemmPrecision::fp32;  // fp32 | bf16
  bool tf32 = false;             // fp32 products on a GPU's TF32 tensor cores
  OptimizerConfig optimizer;
  OnNonfinite on_nonfinite = OnNonfinite::stop;  // stop | skip
  double watchdog_seconds = 1800.0;   // end a rank that makes no progress this long; 0 = off
  FineTuneConfig fine_tune;      // train.reset_optimizer, train.reset_schedule
};

// Activation checkpointing (checkpoint_sched/): which activations the first forward keeps.
struct CheckpointingConfig {
  core::CheckpointPolicy policy = core::CheckpointPolicy::none;  // none | full | every_k | sqrt |
                                                                 // rotor | selective | manual
  int every = 0;                 // every_k: blocks per recomputed segment
  std::vector<int> blocks;       // manual: blocks recomputed whole
  double memory_budget = 0.0;    // rotor: GiB per rank for everything the tracker counts
};

struct ParallelConfig {
  ParallelMode mode = ParallelMode::manual;  // manual: the sizes below; auto: the planner's
  int data = 1;                  // data-parallel ranks (the world size is world_size(), below)
  int zero_stage = 0;            // 0: replicated; 1: optimizer states; 2: + gradients; 3: + params
  double bucket_mb = 25.0;       // gradient all-reduce bucket size, MiB
  bool offload_optimizer = false;  // AdamW moments in host memory, update on the host
  bool offload_params = false;     // stage-3 parameter shards in host memory (needs stage 3, offload_optimizer)
  double offload_fraction = 1.0;   // with offload_optimizer: the share of each rank's optimizer
                                   // state (its last chunks) on the host; the rest stays on the
                                   // device (core::offloaded_states)
  double offload_params_fraction = 1.0;  // with offload_params: the share of each rank's
                                         // parameter shard (its last chunks) in host memory
  int tensor = 1;                  // tensor-parallel ranks (1D, Megatron)
  core::TensorMode tensor_mode = core::TensorMode::d1;  // 1d | 2d | 2.5d | 3d
  int tensor_depth = 1;            // 2.5d: depth layers d (tensor = q * q * d)
  bool sequence_split = false;     // Megatron sequence parallelism inside the tensor group
  int sequence = 1;                // ring self-attention ranks
  int pipeline = 1;                // pipeline stages
  std::vector<int> pipeline_layers;  // blocks per stage; empty: balanced
  parallel::PipelineSchedule pipeline_schedule =
      parallel::PipelineSchedule::one_f_one_b;  // gpipe | 1f1b | interleaved
  int pipeline_chunks = 1;         // virtual stages per rank (> 1 needs schedule interleaved)
  std::string comm = "auto";       // transport: auto | nccl | mpi (parallel/comm_choice.hpp)
  std::string grad_reduce = "fp32";  // data-parallel gradient sums on the wire: fp32 | bf16
  bool bf16_grad_reduce() const { return grad_reduce == "bf16"; }
  std::string offload_policy = "static";  // static: the two flags above; auto: apps/offload_policy
  int world_size() const { return data * tensor * sequence * pipeline; }
};

struct CheckpointConfig {
  std::string dir;               // "" = log.dir/checkpoints
  int64_t every = 0;             // steps between checkpoints; 0 = none while training
  int keep = 2;                  // newest checkpoints kept
  ResumeMode resume = ResumeMode::never;  // never | auto | file
  bool verify = true;            // whole-file checksum before HDF5 reads a checkpoint

  // Resume and fine-tune controls (docs: configs/README.md, "Resuming and fine-tuning").
  std::string resume_path;       // checkpoint.resume: a file (resume == file)
};

struct HardwareConfig {
  std::string preset = "host";
  double peak_tflops = 0.0;      // per device, for MFU; 0 = a GPU's spec, a CPU's measured peak
  std::string file;              // a hardware YAML (colossal_plan --calibrate); overrides preset
  int gpus = 0;                  // devices to plan for (colossal_plan); 0 = the config's ranks
  double device_memory_gib = 0.0;  // device capacity offload.policy: auto plans for; 0 = measured
  double host_memory_gib = 0.0;  // a node's host memory the planner lets offload use; 0 = spec's
  std::string gemm = "openblas"; // host GEMM backend: openblas | blis | onednn | auto
};

struct EvalConfig {
  int64_t every = 100;           // steps between validation passes; 0 = only at the end
  std::string choices;           // a multiple-choice file scored with each validation; "" = none
  int64_t choices_examples = 0;  // its first N examples only; 0 = all
};

struct LogConfig {
  int64_t every = 10;            // steps between progress lines
  std::string dir = "runs/default";

  // Whether the run ends by writing log.dir/model.h5 (false: runs that want only the metrics,
  // such as benchmarks and sweeps of a large model).
  bool save_model = true;
  // Hugging Face export (io/hf_export.hpp): log.dir/hf/ after the final model.h5.
  bool export_hf = false;
};

struct SampleConfig {
  std::string prompt = "";       // end-of-run text sample; empty prompt = start from a newline
  int tokens = 0;                // tokens to generate at the end of training; 0 = no sample
  double temperature = 0.8;
  int top_k = 0;                 // draw among the top_k likeliest tokens only; 0 = all
  double top_p = 1.0;            // among the fewest likeliest whose probability reaches top_p
  std::vector<int> stop_tokens;  // stop after drawing one of these (it ends the text)
};

struct Config {
  std::string model_preset;      // empty when no preset was named ("from_weights": config.json)
  core::ModelSpec model;
  // model.init_from (io/init_from.hpp): starting weights from a Hugging Face safetensors
  // checkpoint, a model.h5 or a training checkpoint; empty = the seeded initialisation.
  std::string model_init_from;
  // model.fused_attention: auto. model.fused_attention (the spec's flag) stays false until
  // colossal_train's start-up decides (apps/layout.hpp: plan_automatically with parallel.mode:
  // auto, else plan_attention), which sets the flag and clears this.
  bool fused_attention_auto = false;
  DataConfig data;
  TrainConfig train;
  ParallelConfig parallel;
  HardwareConfig hardware;
  EvalConfig eval;
  LogConfig log;
  SampleConfig sample;
  CheckpointConfig checkpoint;
  CheckpointingConfig checkpointing;

  std::string source;            // file name the config came from ("<string>" for text)
  std::string text;              // the resolved config as YAML (after presets and overrides)

  // Micro-batches each data-parallel rank (each 2.5D depth layer) runs per optimizer step.
  int accumulation_steps() const {
    const int depth = core::tensor_depth(parallel.tensor_mode, parallel.tensor_depth);
    return train.global_batch / (train.micro_batch * parallel.data * depth);
  }
};

// What a program needs of a config beyond the schema.
struct ParseOptions {
  // false: data.path may be absent or empty (colossal_plan plans without data; "" when absent).
  bool require_data = true;
  // The resolved config a model file or checkpoint carries: it is read as written, never
  // completed from the config.json beside its model.init_from (which may have changed since).
  bool stored = false;
};

// Reads `path`, applies `overrides` ("a.b=value", as given to --set), validates and resolves
// presets and defaults. Throws ConfigError naming file, line, key and what is allowed.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   ParseOptions options = {});
// Same, from YAML text; `source` names it in messages.
Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides = {}, ParseOptions options = {});
// The resolved configuration as YAML; parse_config(to_yaml(c)) gives back c.
std::string to_yaml(const Config& config);

// The dotted keys ("parallel.zero.stage") whose values differ between two YAML config texts,
// keys present in only one of them included, sorted. Throws ConfigError when either is not YAML.
// `values`, when given, receives each such key's value before and after as flow YAML ("" where
// the key is absent).
// A key only one text holds, at its default there (a key added since the other was written),
// is no change.
std::vector<std::string> changed_keys(
    const std::string& before, const std::string& after,
    std::map<std::string, std::pair<std::string, std::string>>* values = nullptr);

// One key of the schema, as documented in configs/README.md (and printable by --help).
struct ConfigKeyInfo {
  std::string key;            // dotted, e.g. "train.optimizer.lr"
  std::string type;           // integer | number | string | enum | preset | list of 2 numbers
  std::string default_value;  // as YAML, or a note such as "required" or "4 * model.hidden"
  std::string allowed;        // e.g. "a number > 0", "one of: stop, skip"
  std::string doc;            // one line
};
// Every key Config reads, in the order to_yaml writes them.
const std::vector<ConfigKeyInfo>& config_schema();

// The closest key among `candidates` to `key` by edit distance, or "" when none is close.
std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace colossal::io
