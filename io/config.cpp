// Config loading: YAML text -> tree (+ --set overrides) -> structure check -> typed values ->
// presets and defaults -> cross-key checks.
//
// One table, schema(), drives everything: which keys exist (so typos are caught with a
// suggestion), their type and range, where each lands in Config, the order to_yaml writes them,
// and the documentation returned by config_schema(). Adding a key means adding one row.
#include "io/config.hpp"

#include <yaml-cpp/yaml.h>
#if __has_include(<yaml-cpp/depthguard.h>)
#include <yaml-cpp/depthguard.h>
#define COLOSSAL_YAML_DEPTH_GUARD 1
#endif

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>

#include "core/tensor_mode.hpp"
#include "io/init_from.hpp"

namespace colossal::io {
namespace {

constexpr const char* kFromWeights = "from_weights";  // model.preset taken from config.json

// ------------------------------------------------------------------------------------------------
// The schema

enum class Kind { integer, number, text, choice, preset, number_pair, integer_list };
enum class Required { no, always, without_preset };

constexpr double kInf = std::numeric_limits<double>::infinity();

// Bounds on a value. Integer keys use the same struct; their bounds are whole numbers.
struct Range {
  double lo = -kInf;
  bool lo_open = false;
  double hi = kInf;
  bool hi_open = false;

  bool contains(double v) const {
    const bool above_lo = lo_open ? v > lo : v >= lo;
    const bool below_hi = hi_open ? v < hi : v <= hi;
    return above_lo && below_hi;
  }
};
Range at_least(double lo) { return Range{lo, false, kInf, false}; }
Range between(double lo, double hi) { return Range{lo, false, hi, false}; }
Range above(double lo) { return Range{lo, true, kInf, false}; }
Range half_open_unit() { return Range{0.0, false, 1.0, true}; }  // [0, 1): Adam betas

// Where a key's value lives inside Config. The reader writes through it and to_yaml reads
// through it, so the two cannot drift apart.
struct Betas {
  double* beta1;
  double* beta2;
};
// A closed set of words held as an enum (core::Arch, core::TensorMode, ...): its current word,
// and setting it from a word (false when the enum has no such word: the schema's choices and the
// enum's names disagree, a bug).
struct Choice {
  std::function<std::string()> word;
  std::function<bool(std::string_view)> set;
};
template <class E, class Parse>
Choice enum_choice(E* p, const char* (*name)(E), Parse parse) {
  return {[p, name] { return std::string(name(*p)); },
          [p, parse](std::string_view w) {
            const std::optional<E> e = parse(w);
            if (e) *p = *e;
            return e.has_value();
          }};
}
// The value among `values` whose `name` is `w`.
template <class E>
std::optional<E> parse_among(std::string_view w, std::initializer_list<E> values,
                             const char* (*name)(E)) {
  for (E v : values) {
    if (w == name(v)) return v;
  }
  return std::nullopt;
}
Choice choice(core::Arch* p) {
  return enum_choice(p, core::arch_name, [](std::string_view w) {
    return parse_among(w, {core::Arch::gpt2, core::Arch::opt, core::Arch::llama},
                      core::arch_name);
  });
}
Choice choice(core::TensorMode* p) {
  return enum_choice(p, core::tensor_mode_name, core::parse_tensor_mode);
}
Choice choice(core::GemmPrecision* p) {
  constexpr auto name = +[](core::GemmPrecision v) { return core::to_string(v); };
  return enum_choice(p, name, [name](std::string_view w) {
    return parse_among(w, {core::GemmPrecision::fp32, core::GemmPrecision::bf16}, name);
  });
}
Choice choice(core::CheckpointPolicy* p) {
  return enum_choice(p, core::checkpoint_policy_name, core::parse_checkpoint_policy);
}
Choice choice(parallel::PipelineSchedule* p) {
  return enum_choice(p, parallel::pipeline_schedule_name, parallel::parse_pipeline_schedule);
}
Choice choice(OnNonfinite* p) { return enum_choice(p, on_nonfinite_name, parse_on_nonfinite); }
Choice choice(ParallelMode* p) { return enum_choice(p, parallel_mode_name, parse_parallel_mode); }
// checkpoint.resume: the words never and auto, or any other text as a checkpoint file's path.
Choice resume_choice(CheckpointConfig* p) {
  return {[p] {
            return p->resume == ResumeMode::file ? p->resume_path
                                                 : std::string(resume_mode_name(p->resume));
          },
          [p](std::string_view w) {
            const std::optional<ResumeMode> mode = parse_resume_mode(w);
            p->resume = mode.value_or(ResumeMode::file);
            p->resume_path = mode ? "" : std::string(w);
            return !w.empty();
          }};
}

// model.fused_attention: false, true, or auto (Config::fused_attention_auto; the model's flag
// stays false until colossal_train's start-up decides).
Choice fused_attention_choice(Config* c) {
  return {[c] {
            return std::string(c->fused_attention_auto ? "auto"
                               : c->model.fused_attention ? "true"
                                                          : "false");
          },
          [c](std::string_view w) {
            c->fused_attention_auto = w == "auto";
            c->model.fused_attention = w == "true";
            return w == "auto" || w == "true" || w == "false";
          }};
}

using Field = std::variant<int*, int64_t*, uint64_t*, double*, std::string*, Choice, bool*,
                           Betas, std::vector<int>*>;

struct KeySpec {
  std::string key;  // dotted
  Kind kind;
  std::function<Field(Config&)> field;
  std::string doc;                     // one line, for configs/README.md and --help
  Range range{};                       // integer, number, number_pair
  std::vector<std::string> choices{};  // choice: accepted values
  Required required = Required::no;
  std::string default_note{};  // documented default when not Config{}'s value
  std::string example{};       // value used in hints when the default is not one
  std::string cross_check{};   // constraint involving other keys, for the docs
  bool non_empty = false;      // text: the empty string is not allowed
};

// The order here is the order of to_yaml's output and of the documentation. The table is kept
// out of clang-format: one key per block reads better than one field per line.
// clang-format off
const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> table = {
      // model: preset first, because it fills the sizes that the keys after it override.
      {.key = "model.preset", .kind = Kind::preset,
       .field = [](Config& c) -> Field { return &c.model_preset; },
       .doc = "named model whose arch and sizes are the defaults for the keys below",
       .default_note = "none", .example = "gpt2-124m"},
      {.key = "model.arch", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.model.arch); },
       .doc = "architecture: GPT-2 (GELU, pre-LN), OPT (ReLU, position offset 2) or LLaMA "
              "(RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases)",
       .choices = {"gpt2", "opt", "llama"}, .default_note = "gpt2, or the preset's"},
      {.key = "model.layers", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.layers; },
       // Bounded far above any model (GPT-3 has 96 blocks): 10^8 took minutes of the start-up's
       // memory check before any error.
       .doc = "transformer blocks", .range = between(1, 1000),
       .required = Required::without_preset,
       .default_note = "the preset's; required without one", .example = "12"},
      {.key = "model.hidden", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.hidden; },
       .doc = "model width (channels of the residual stream)", .range = at_least(1),
       .required = Required::without_preset,
       .default_note = "the preset's; required without one", .example = "768",
       .cross_check = "divisible by model.heads"},
      {.key = "model.heads", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.heads; },
       .doc = "attention heads; each head has hidden / heads channels", .range = at_least(1),
       .required = Required::without_preset,
       .default_note = "the preset's; required without one", .example = "12",
       .cross_check = "divides model.hidden"},
      {.key = "model.ffn_hidden", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.ffn_hidden; },
       .doc = "width of the MLP's inner layer (llama: of the SwiGLU gate and up projections)",
       .range = at_least(1),
       .default_note = "4 * model.hidden; llama: 8/3 * hidden rounded up to a multiple of 256",
       .example = "3072"},
      {.key = "model.vocab", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.vocab; },
       .doc = "vocabulary size (256 for raw-byte text data)", .range = at_least(1),
       .required = Required::without_preset,
       .default_note = "the preset's; required without one", .example = "50257"},
      {.key = "model.max_seq", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.max_seq; },
       .doc = "longest sequence the position table holds", .range = at_least(1),
       .required = Required::without_preset,
       .default_note = "the preset's; required without one", .example = "1024"},

      {.key = "model.vocab_multiple", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.vocab_multiple; },
       .doc = "under tensor parallelism the vocabulary is padded to a multiple of "
              "parallel.tensor.size * this; padded rows are masked and never saved",
       .range = at_least(1)},
      {.key = "model.fused_attention", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return fused_attention_choice(&c); },
       .doc = "fused causal attention: no (B,H,T,T) matrix saved, memory linear in seq_len; "
              "slower than the default at short sequences; auto: the planner chooses at "
              "start-up (the faster attention that fits)",
       .choices = {"false", "true", "auto"}},

      // Starting weights (io/init_from.hpp, docs/init-from.md).
      {.key = "model.init_from", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.model_init_from; },
       .doc = "start from these weights instead of the seeded initialisation: a Hugging Face "
              "model.safetensors, model.safetensors.index.json or a directory holding one (with "
              "config.json for model.preset: from_weights), a model.h5, or a training "
              "checkpoint (its model part)",
       .default_note = "none", .example = "hf/gpt2"},
      // model.arch: llama only (issue 25); gpt2 and opt ignore these keys.
      {.key = "model.kv_heads", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.kv_heads; },
       .doc = "llama: key/value heads of grouped-query attention, each shared by heads / kv_heads "
              "query heads; 0 = model.heads (multi-head attention)",
       .range = at_least(0), .default_note = "0, or the preset's",
       .cross_check = "divides model.heads; a multiple of parallel.tensor.size"},
      {.key = "model.rope_theta", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.model.rope_theta; },
       .doc = "llama: base of the rotary position embedding's frequencies", .range = above(0)},
      {.key = "model.rope_factor", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.model.rope_scaling.factor; },
       .doc = "llama: Llama 3's rotary scaling (Hugging Face rope_scaling rope_type llama3): "
              "frequencies of wavelengths above rope_original_max_seq / rope_low_freq_factor "
              "are divided by this, those below rope_original_max_seq / rope_high_freq_factor "
              "kept, the band between interpolated; 1 = unscaled",
       .range = at_least(1), .example = "8"},
      {.key = "model.rope_low_freq_factor", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.model.rope_scaling.low_freq_factor; },
       .doc = "llama, with rope_factor > 1: rope_scaling's low_freq_factor", .range = above(0),
       .cross_check = "< model.rope_high_freq_factor when model.rope_factor > 1"},
      {.key = "model.rope_high_freq_factor", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.model.rope_scaling.high_freq_factor; },
       .doc = "llama, with rope_factor > 1: rope_scaling's high_freq_factor", .range = above(0)},
      {.key = "model.rope_original_max_seq", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.model.rope_scaling.original_max_seq; },
       .doc = "llama, with rope_factor > 1: rope_scaling's original_max_position_embeddings, "
              "the context the unscaled model was trained for",
       .range = at_least(1)},
      {.key = "model.rms_eps", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.model.rms_eps; },
       .doc = "llama: epsilon of RMSNorm", .range = above(0)},
      {.key = "model.tie_embeddings", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.model.tie_embeddings; },
       .doc = "llama: the LM head reads the token embedding (Hugging Face tie_word_embeddings) "
              "instead of its own lm_head.weight; gpt2 and opt always tie",
       .choices = {"false", "true"}},

      {.key = "data.path", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.data.path; },
       .doc = "training data: raw text (bytes as tokens) or an llm.c token file: uint16 tokens "
              "(magic 20240520) or, for vocabularies above 65536 such as Llama 3's, uint32 "
              "(magic 20240801)",
       .required = Required::always, .default_note = "required",
       .example = "data/train.bin", .non_empty = true},
      {.key = "data.val_path", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.data.val_path; },
       .doc = "validation data in the same format; empty = no validation"},
      {.key = "data.val_windows", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.data.val_windows; },
       .doc = "cap on validation windows per pass; 0 = all", .range = at_least(0)},

      {.key = "train.steps", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.steps; },
       .doc = "optimizer steps to run", .range = at_least(1)},
      {.key = "train.seq_len", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.seq_len; },
       .doc = "tokens per training sequence", .range = at_least(1),
       .cross_check = "<= model.max_seq"},
      {.key = "train.global_batch", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.global_batch; },
       // Bounded far above any run (GPT-3's was 1536 sequences): 2 x 10^9 took 12 GB and half
       // a minute before its memory error.
       .doc = "sequences per optimizer step, over all data-parallel ranks",
       .range = between(1, 1 << 20), .cross_check = "a multiple of train.micro_batch"},
      {.key = "train.micro_batch", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.micro_batch; },
       .doc = "sequences per forward/backward pass; gradients accumulate over them",
       .range = at_least(1), .cross_check = "divides train.global_batch"},
      {.key = "train.seed", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.seed; },
       .doc = "seed of initialisation and data order", .range = at_least(0)},
      {.key = "train.precision", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.train.precision); },
       .doc = "precision of the matrix products: fp32, or bf16 (operands rounded to bfloat16, "
              "products summed in fp32, as bf16 tensor cores do; weights, activations, "
              "gradients and optimizer states stay fp32). On GPUs (hardware.gemm: cublas) bf16 "
              "runs on the tensor cores; on CPUs with AVX512-BF16 or AMX-BF16 and "
              "hardware.gemm auto or onednn, on oneDNN's bf16 GEMM; otherwise it is emulated "
              "(bf16 numerics, fp32 speed or less), as the start-up gemm line says",
       .choices = {"fp32", "bf16"}},
      {.key = "train.tf32", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.train.tf32; },
       .doc = "fp32 runs on a GPU: let the matrix products use the TF32 tensor cores (operands "
              "rounded to 10-bit significands, fp32 sums; several times the fp32 rate, losses "
              "no longer match a CPU run to 1e-4). Host products have no TF32 and ignore it; "
              "bf16 runs are unaffected",
       .choices = {"false", "true"}},
      {.key = "train.optimizer.lr", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.optimizer.lr; },
       .doc = "peak learning rate, reached after warm-up", .range = above(0)},
      {.key = "train.optimizer.min_lr", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.optimizer.min_lr; },
       .doc = "learning rate at the end of the cosine decay", .range = at_least(0),
       .cross_check = "<= train.optimizer.lr"},
      {.key = "train.optimizer.warmup", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.train.optimizer.warmup; },
       .doc = "steps of linear warm-up from 0 to lr", .range = at_least(0)},
      {.key = "train.optimizer.betas", .kind = Kind::number_pair,
       .field = [](Config& c) -> Field {
         return Betas{&c.train.optimizer.beta1, &c.train.optimizer.beta2};
       },
       .doc = "AdamW moment decay rates [beta1, beta2]", .range = half_open_unit()},
      {.key = "train.optimizer.eps", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.optimizer.eps; },
       .doc = "AdamW denominator epsilon", .range = above(0)},
      {.key = "train.optimizer.weight_decay", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.optimizer.weight_decay; },
       .doc = "decoupled weight decay on matrices and embeddings", .range = at_least(0)},
      {.key = "train.optimizer.grad_clip", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.optimizer.grad_clip; },
       .doc = "clip the global gradient norm to this; 0 = off", .range = at_least(0)},
      {.key = "train.watchdog_seconds", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.train.watchdog_seconds; },
       .doc = "end a rank (with an error) when no step, validation batch or checkpoint finishes for "
              "this long, so a job whose peer died or hung in a collective ends; 0 = off",
       .range = at_least(0)},
      {.key = "train.on_nonfinite", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.train.on_nonfinite); },
       .doc = "on a NaN/Inf loss or gradient: stop the run, or skip the step",
       .choices = {"stop", "skip"}},
      // Fine-tune controls: with checkpoint.resume: PATH (configs/README.md, "Resuming and
      // fine-tuning").
      {.key = "train.reset_optimizer", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.train.fine_tune.reset_optimizer; },
       .doc = "fine-tune from checkpoint.resume: PATH: restore its weights only; fresh AdamW "
              "moments and step count, the run counted from step 0 and train.steps the steps "
              "after the checkpoint",
       .choices = {"false", "true"}, .cross_check = "needs checkpoint.resume: a file"},
      {.key = "train.reset_schedule", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.train.fine_tune.reset_schedule; },
       .doc = "fine-tune from checkpoint.resume: PATH: the learning-rate schedule (warm-up, "
              "decay over train.steps) starts again at 0; the run counted from step 0",
       .choices = {"false", "true"}, .cross_check = "needs checkpoint.resume: a file"},

      {.key = "parallel.mode", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.parallel.mode); },
       .doc = "manual: the sizes below; auto: colossal_train plans the layout and checkpointing "
              "for the ranks started on rank 0 (planner/README.md) and every rank runs it",
       .choices = {"manual", "auto"}},
      {.key = "parallel.data", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.data; },
       .doc = "data-parallel ranks; the number of ranks started must equal it",
       .range = at_least(1),
       .cross_check = "parallel.data * train.micro_batch divides train.global_batch"},
      {.key = "parallel.zero.stage", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.zero_stage; },
       .doc = "ZeRO: 0 replicated, 1 optimizer states sharded over parallel.data, "
              "2 also gradients reduce-scattered, 3 also parameters sharded and gathered per layer",
       .range = Range{0, false, 3, false}},
      {.key = "parallel.zero.offload.optimizer", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.offload_optimizer; },
       .doc = "keep the AdamW moments in host memory and run the update on the host "
              "(needs parallel.zero.stage >= 1)",
       .choices = {"false", "true"}, .cross_check = "needs parallel.zero.stage >= 1"},
      {.key = "parallel.zero.offload.optimizer_fraction", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.parallel.offload_fraction; },
       .doc = "with offload.optimizer: true, the share of each rank's optimizer state kept in "
              "host memory (its last chunks in state order, in 16-float steps); the rest stays "
              "on the device and its update runs there, beside the host's (Colossal-AI's "
              "offload_optim_frac); offload.policy: auto sets it",
       .range = Range{0.0, true, 1.0, false},
       .cross_check = "< 1 needs offload.optimizer: true and offload.params: false"},
      {.key = "parallel.zero.offload.params", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.offload_params; },
       .doc = "keep the stage-3 parameter shards in host memory; each gather uploads the "
              "rank's slice (needs parallel.zero.stage: 3 and offload.optimizer: true)",
       .choices = {"false", "true"},
       .cross_check = "needs parallel.zero.stage: 3 and parallel.zero.offload.optimizer: true"},
      {.key = "parallel.zero.offload.params_fraction", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.parallel.offload_params_fraction; },
       .doc = "with offload.params: true, the share of each rank's parameter shard kept in host "
              "memory (its last chunks, in 16-float steps); the rest stays on the device, so only "
              "those slices are uploaded by each gather (Gemini's chunks); offload.policy: auto "
              "sets it",
       .range = Range{0.0, true, 1.0, false},
       .cross_check = "< 1 needs offload.params: true"},
      // ZeRO offload decided from the memory plan (apps/offload_policy.hpp).
      {.key = "parallel.zero.offload.policy", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.offload_policy; },
       .doc = "static: offload.optimizer and offload.params as written; auto: at start-up, from "
              "the memory plan and the device's capacity, the optimizer states and then the "
              "parameters move to the host only as far as needed to fit (printed)",
       .choices = {"static", "auto"}},
      {.key = "parallel.tensor.size", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.tensor; },
       .doc = "tensor-parallel ranks: attention heads, MLP width and vocabulary split over them",
       .range = at_least(1),
       .cross_check = "divides model.heads and model.ffn_hidden"},
      {.key = "parallel.tensor.mode", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.parallel.tensor_mode); },
       .doc = "tensor parallelism: 1d (Megatron column/row-parallel linears), 2d (SUMMA on a "
              "q x q grid: size = q^2), 2.5d (Tesseract: size = q^2 x depth), 3d (q^3 cube)",
       .choices = {"1d", "2d", "2.5d", "3d"},
       .cross_check = "2d/2.5d/3d: size a square / square x depth / cube; no sequence, "
                      "ZeRO 3 or parameter offload"},
      {.key = "parallel.tensor.depth", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.tensor_depth; },
       .doc = "2.5d: depth layers d of q x q grids (the batch is split across them)",
       .range = at_least(1), .cross_check = "> 1 only with mode 2.5d; divides tensor.size"},
      {.key = "parallel.tensor.sequence_split", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.sequence_split; },
       .doc = "Megatron sequence parallelism inside the tensor group: layernorms and residual "
              "adds on 1/size of the token rows (needs tensor.size > 1 dividing train.seq_len)",
       .choices = {"false", "true"},
       .cross_check = "needs parallel.tensor.size > 1 dividing train.seq_len"},
      {.key = "parallel.sequence", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.sequence; },
       .doc = "sequence-parallel ranks: ring self-attention over contiguous chunks of every "
              "sequence",
       .range = at_least(1),
       .cross_check = "divides train.seq_len; not with model.fused_attention"},
      {.key = "parallel.pipeline.size", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.pipeline; },
       .doc = "pipeline stages: contiguous ranges of blocks, the first with the embeddings, the "
              "last with the final layernorm, LM head and loss",
       .range = at_least(1), .cross_check = "<= model.layers"},
      {.key = "parallel.pipeline.layers", .kind = Kind::integer_list,
       .field = [](Config& c) -> Field { return &c.parallel.pipeline_layers; },
       .doc = "blocks per stage, first to last; [] balances them (equal counts, the remainder "
              "to the middle stages)",
       .range = at_least(1), .cross_check = "one entry per stage, summing to model.layers"},
      {.key = "parallel.pipeline.schedule", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.parallel.pipeline_schedule); },
       .doc = "gpipe: all forwards, then all backwards; 1f1b: warm-up forwards, then one "
              "forward one backward, then cool-down; interleaved: 1F1B over pipeline.chunks "
              "model chunks per rank",
       .choices = {"gpipe", "1f1b", "interleaved"}},
      {.key = "parallel.pipeline.chunks", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.parallel.pipeline_chunks; },
       .doc = "model chunks (virtual stages) per rank; more than 1 needs schedule: interleaved",
       .range = at_least(1),
       .cross_check = "> 1 only with schedule: interleaved"},
      // The communicators' transport (parallel/comm_choice.hpp decides and checks it at start-up).
      {.key = "parallel.comm", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.comm; },
       .doc = "transport of the collectives: auto (host MPI on a CPU build; on a CUDA build NCCL "
              "with one GPU per rank, else CUDA-aware MPI, else MPI through pinned host staging), "
              "nccl, or mpi (CUDA-aware, else staged); printed at start-up",
       .choices = {"auto", "nccl", "mpi"},
       .cross_check = "nccl needs a CUDA build and one GPU per rank"},
      {.key = "parallel.grad_reduce", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.parallel.grad_reduce; },
       .doc = "precision of the data-parallel gradient sums on the wire: fp32, or bf16 (half "
              "the bytes; each partial sum rounded to bf16, as NCCL's bf16 sum)",
       .choices = {"fp32", "bf16"}},
      {.key = "parallel.bucket_mb", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.parallel.bucket_mb; },
       .doc = "size of the gradient all-reduce buckets, MiB", .range = above(0)},

      {.key = "checkpointing.policy", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return choice(&c.checkpointing.policy); },
       .doc = "activation checkpointing: none keeps every activation; full keeps only block "
              "inputs; every_k keeps the input of every k-th block; sqrt is every_k with "
              "k = ceil(sqrt(layers)) (Chen et al. 2016); rotor is the fastest schedule at "
              "attention/MLP granularity under memory_budget (dynamic program; whole blocks "
              "under tensor modes 2d/2.5d/3d); selective "
              "recomputes only the attention probabilities (Korthikanti et al. 2022); manual "
              "recomputes the listed blocks",
       .choices = {"none", "full", "every_k", "sqrt", "rotor", "selective", "manual"}},
      {.key = "checkpointing.every", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.checkpointing.every; },
       .doc = "every_k: blocks per recomputed segment (the input of blocks 0, k, 2k, ... kept)",
       .range = at_least(0), .default_note = "0 (unset)", .cross_check = ">= 1 with every_k"},
      {.key = "checkpointing.blocks", .kind = Kind::integer_list,
       .field = [](Config& c) -> Field { return &c.checkpointing.blocks; },
       .doc = "manual: blocks that keep only their input and run their forward again in backward",
       .range = at_least(0), .cross_check = "each < model.layers; only with manual"},
      {.key = "checkpointing.memory_budget", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.checkpointing.memory_budget; },
       .doc = "rotor: GiB per rank for everything the tracker counts (parameters, gradients, "
              "optimizer, activations, temporaries, data); the schedule gets what the rest leaves",
       .range = at_least(0), .cross_check = "> 0 with rotor"},

      {.key = "hardware.preset", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.hardware.preset; },
       .doc = "hardware spec for the cost model and MFU (planner/hardware.cpp)",
       .choices = {"host", "a100-40g", "a100-80g", "h100", "h200", "v100"}},
      {.key = "hardware.gpus", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.hardware.gpus; },
       .doc = "devices colossal_plan plans for (--gpus overrides); 0 = the ranks the config's "
              "parallel sizes need",
       .range = at_least(0)},
      // The device size parallel.zero.offload.policy: auto plans for (apps/offload_policy.hpp).
      {.key = "hardware.device_memory_gib", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.hardware.device_memory_gib; },
       .doc = "GiB of device memory per GPU that offload.policy: auto and "
              "model.fused_attention: auto plan for; 0 = the GPU's "
              "free memory (CUDA builds) or no device limit (CPU builds: the device is the "
              "host); CUDA builds keep 512 MiB a rank sharing the GPU free of it (cuBLAS, "
              "NCCL) and divide the rest among those ranks",
       .range = at_least(0)},
      // The host memory the planner lets a GPU node's offloaded bytes use (planner/hardware.hpp).
      {.key = "hardware.host_memory_gib", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.hardware.host_memory_gib; },
       .doc = "GiB of host memory per node that the planner lets the ranks' offloaded bytes use "
              "(ZeRO offload on GPUs); 0 = the hardware spec's (preset or file), and under "
              "parallel.mode: auto on a GPU build the node's available memory",
       .range = at_least(0)},
      {.key = "hardware.file", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.hardware.file; },
       .doc = "a hardware YAML written by colossal_plan --calibrate; overrides hardware.preset "
              "for the cost model"},
      {.key = "hardware.gemm", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.hardware.gemm; },
       .doc = "host GEMM backend: openblas (linked), blis or onednn (loaded at run time when "
              "Debian's libblis4-openmp / libdnnl2 are installed), or auto (per shape the fastest "
              "of those, measured on its first product; not bitwise reproducible across runs), "
              "or cublas (CUDA builds: every product runs on the rank's GPU, its operands copied "
              "there and back; the other kernels stay on the host). A Kokkos CUDA build always "
              "uses cuBLAS",
       .choices = {"openblas", "blis", "onednn", "auto", "cublas"}},
      {.key = "hardware.peak_tflops", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.hardware.peak_tflops; },
       .doc = "peak TFLOP/s per device (rank) for MFU, which is over the job's sum; 0 = a GPU's "
               "preset or file value, a CPU's peak measured at start-up", .range = at_least(0)},

      {.key = "eval.every", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.eval.every; },
       .doc = "steps between validation passes; 0 = only at the end", .range = at_least(0)},
      {.key = "eval.choices", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.eval.choices; },
       .doc = "a multiple-choice file in llm.c's format (HellaSwag: scripts/make_choices.py) "
              "scored with each validation pass and at the end: its accuracy in the log, the "
              "summary and log.dir/choices.csv; colossal_eval scores it when --choices is not "
              "given; empty = none"},
      {.key = "eval.choices_examples", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.eval.choices_examples; },
       .doc = "score only the first N examples of eval.choices (a cheaper signal during "
              "training); 0 = all", .range = at_least(0)},

      {.key = "log.every", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.log.every; },
       .doc = "steps between progress lines", .range = at_least(1)},
      {.key = "log.dir", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.log.dir; },
       .doc = "directory for metrics and the resolved config", .non_empty = true},
      {.key = "log.save_model", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.log.save_model; },
       .doc = "at the end of the run, write the final weights to log.dir/model.h5 (false: "
              "only the metrics, e.g. a benchmark of a large model; checkpoints are unaffected)",
       .choices = {"false", "true"}},
      // Hugging Face export (colossal_export's output, written by the run itself).
      {.key = "log.export_hf", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.log.export_hf; },
       .doc = "at the end of the run, after log.dir/model.h5, rank 0 writes log.dir/hf/ "
              "(config.json + model.safetensors) for transformers' from_pretrained",
       .choices = {"false", "true"}},

      {.key = "checkpoint.dir", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.checkpoint.dir; },
       .doc = "directory of the training checkpoints; empty = log.dir/checkpoints"},
      {.key = "checkpoint.every", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.checkpoint.every; },
       .doc = "steps between checkpoints (and one at the end); 0 = none, except on SIGTERM/SIGUSR1",
       .range = at_least(0)},
      {.key = "checkpoint.keep", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.checkpoint.keep; },
       .doc = "newest checkpoints kept in checkpoint.dir", .range = at_least(1)},
      {.key = "checkpoint.resume", .kind = Kind::text,
       .field = [](Config& c) -> Field { return resume_choice(&c.checkpoint); },
       .doc = "auto: continue from the newest intact checkpoint in checkpoint.dir (a corrupted "
              "one is skipped with a warning); never: start afresh; any other text: the path of "
              "a checkpoint file to continue from (a missing or damaged one is an error)",
       .choices = {"never", "auto"}, .non_empty = true},
      {.key = "checkpoint.verify", .kind = Kind::choice,
       .field = [](Config& c) -> Field { return &c.checkpoint.verify; },
       .doc = "check a checkpoint's whole-file checksum before HDF5 parses it (HDF5 can crash on "
              "damaged files); false also reads format-1 checkpoints, which have none",
       .choices = {"false", "true"}},

      {.key = "sample.prompt", .kind = Kind::text,
       .field = [](Config& c) -> Field { return &c.sample.prompt; },
       .doc = "what the end-of-run sample starts from: text over byte data (empty = a newline); "
              "over a token file (llm.c .bin) token ids separated by spaces, e.g. '50256 464' "
              "(scripts/tokenize.py --encode TEXT)"},
      {.key = "sample.tokens", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.sample.tokens; },
       .doc = "tokens to generate at the end of training; 0 = no sample", .range = at_least(0)},
      {.key = "sample.temperature", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.sample.temperature; },
       .doc = "softmax temperature of the sample", .range = above(0), .example = "0.8"},
      {.key = "sample.top_k", .kind = Kind::integer,
       .field = [](Config& c) -> Field { return &c.sample.top_k; },
       .doc = "draw each token among the top_k likeliest only (after the temperature); 0 = all",
       .range = at_least(0)},
      {.key = "sample.top_p", .kind = Kind::number,
       .field = [](Config& c) -> Field { return &c.sample.top_p; },
       .doc = "nucleus sampling: draw among the fewest likeliest tokens whose probabilities sum "
              "to at least top_p (after top_k); 1 = all",
       .range = Range{0.0, true, 1.0, false}, .example = "0.9"},
      {.key = "sample.stop_tokens", .kind = Kind::integer_list,
       .field = [](Config& c) -> Field { return &c.sample.stop_tokens; },
       .doc = "token ids that end the sample when drawn (included in it): over a token file e.g. "
              "[50256], GPT-2's <|endoftext|>; over byte data byte values, e.g. [10] for a "
              "newline",
       .range = at_least(0), .cross_check = "each < model.vocab (< 256 over byte data)"},
  };
  return table;
}
// clang-format on

// ------------------------------------------------------------------------------------------------
// Small string helpers

std::string join(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string parent_of(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

std::string join_key(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// Shortest text that reads back to the same double, so to_yaml round-trips exactly and stays
// readable (0.0003, not 0.00029999999999999997). Scientific notation always carries a '.' and a
// signed exponent (1.0e-08), which YAML 1.1 readers such as PyYAML need to see a float.
std::string format_number(double v) {
  char buf[64];
  const double magnitude = std::fabs(v);
  const bool fixed = magnitude == 0.0 || (magnitude >= 1e-4 && magnitude < 1e15);
  const auto format = fixed ? std::chars_format::fixed : std::chars_format::scientific;
  const auto end = std::to_chars(buf, buf + sizeof buf, v, format).ptr;
  std::string s(buf, end);
  const auto e = s.find('e');
  const std::string mantissa = s.substr(0, e);
  if (mantissa.find('.') == std::string::npos)
    s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

// Bounds read best without a fraction when they have none ("a number > 0").
std::string format_bound(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return format_number(v);
}

// Strict number parsing: the whole text must be a finite number (an optional '+' allowed).
enum class Parse { ok, malformed, too_large };
template <typename T>
Parse parse_whole(const std::string& text, T& value) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  if (digits.empty()) return Parse::malformed;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range) return Parse::too_large;
  if (ec != std::errc() || end != digits.data() + digits.size()) return Parse::malformed;
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) return Parse::malformed;  // from_chars accepts "inf" and "nan"
  }
  return Parse::ok;
}

// ------------------------------------------------------------------------------------------------
// Derived views of the schema

struct SchemaIndex {
  std::map<std::string, const KeySpec*> leaves;
  std::set<std::string> sections;                            // "model", "train.optimizer", ...
  std::map<std::string, std::vector<std::string>> children;  // section ("" = top) -> names
  std::vector<std::string> all_keys;                         // sections and leaves, dotted

  bool known(const std::string& key) const { return leaves.count(key) || sections.count(key); }
};

const SchemaIndex& index() {
  static const SchemaIndex built = [] {
    SchemaIndex idx;
    auto add_child = [&](const std::string& section, const std::string& name) {
      auto& names = idx.children[section];
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    };
    for (const KeySpec& spec : schema()) {
      idx.leaves[spec.key] = &spec;
      add_child(parent_of(spec.key), last_part(spec.key));
      for (std::string s = parent_of(spec.key); !s.empty(); s = parent_of(s)) {
        if (idx.sections.insert(s).second) idx.all_keys.push_back(s);
        add_child(parent_of(s), last_part(s));
      }
      idx.all_keys.push_back(spec.key);
    }
    return idx;
  }();
  return built;
}

// A close key for a misspelt or misplaced one: first by spelling among the names the section
// allows, then any key anywhere with the same last name (train.lr -> train.optimizer.lr).
std::string suggest_key(const std::string& section, const std::string& name) {
  const auto& names = index().children.at(section);
  if (auto close = did_you_mean(name, names); !close.empty()) return join_key(section, close);
  for (const std::string& key : index().all_keys)
    if (last_part(key) == name) return key;
  return "";
}

std::string kind_name(const KeySpec& spec) {
  switch (spec.kind) {
    case Kind::integer:
      return "integer";
    case Kind::number:
      return "number";
    case Kind::text:
      return "string";
    case Kind::choice:
      return "enum";
    case Kind::preset:
      return "preset";
    case Kind::number_pair:
      return "list of 2 numbers";
    case Kind::integer_list:
      return "list of integers";
  }
  return "";
}

std::string range_text(const Range& r) {
  const bool has_lo = std::isfinite(r.lo), has_hi = std::isfinite(r.hi);
  if (has_lo && has_hi)
    return std::string(" in ") + (r.lo_open ? "(" : "[") + format_bound(r.lo) + ", " +
           format_bound(r.hi) + (r.hi_open ? ")" : "]");
  if (has_lo) return std::string(r.lo_open ? " > " : " >= ") + format_bound(r.lo);
  if (has_hi) return std::string(r.hi_open ? " < " : " <= ") + format_bound(r.hi);
  return "";
}

// What a key accepts, in words: the "(what is allowed)" part of messages and the docs.
std::string allowed_text(const KeySpec& spec) {
  switch (spec.kind) {
    case Kind::integer:
      return "an integer" + range_text(spec.range);
    case Kind::number:
      return "a number" + range_text(spec.range);
    case Kind::text:
      if (!spec.choices.empty()) return "one of: " + join(spec.choices) + ", or a file path";
      return spec.non_empty ? "a non-empty string" : "a string";
    case Kind::choice:
      return "one of: " + join(spec.choices);
    case Kind::preset:
      return "one of the presets: " + join(core::preset_names()) + ", or " + kFromWeights;
    case Kind::number_pair:
      return "a list of two numbers, each" + range_text(spec.range);
    case Kind::integer_list:
      return "a list of integers, each" + range_text(spec.range) + " ([] for none)";
  }
  return "";
}

// ------------------------------------------------------------------------------------------------
// Reading and writing one Field

void write_field(YAML::Emitter& out, const KeySpec& spec, const Field& field) {
  std::visit(
      [&](auto p) {
        using T = decltype(p);
        if constexpr (std::is_same_v<T, Betas>) {
          out << YAML::Flow << YAML::BeginSeq << format_number(*p.beta1) << format_number(*p.beta2)
              << YAML::EndSeq;
        } else if constexpr (std::is_same_v<T, double*>) {
          out << format_number(*p);
        } else if constexpr (std::is_same_v<T, std::string*>) {
          // Free text is always quoted so that values such as "null", "123" or "a: b" come
          // back as the same string; enum values and preset names read better plain.
          if (spec.kind == Kind::text)
            out << YAML::DoubleQuoted << *p;
          else
            out << *p;
        } else if constexpr (std::is_same_v<T, Choice>) {
          // Free text besides the words (checkpoint.resume's path) is quoted, as above.
          const std::string word = p.word();
          const bool listed =
              std::find(spec.choices.begin(), spec.choices.end(), word) != spec.choices.end();
          if (spec.kind == Kind::text && !listed)
            out << YAML::DoubleQuoted << word;
          else
            out << word;
        } else if constexpr (std::is_same_v<T, bool*>) {
          out << (*p ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::vector<int>*>) {
          out << YAML::Flow << YAML::BeginSeq;
          for (int v : *p) out << v;
          out << YAML::EndSeq;
        } else {
          out << *p;  // integers
        }
      },
      field);
}

// The value of a key in a default Config, as YAML text (for docs and hints).
std::string default_text(const KeySpec& spec) {
  Config defaults;
  YAML::Emitter out;
  write_field(out, spec, spec.field(defaults));
  return out.c_str();
}

// ------------------------------------------------------------------------------------------------
// The resolver: one config source, from tree to Config

[[noreturn]] void raise(const std::string& where, const std::string& key, const std::string& what,
                        const std::string& allowed, const std::string& todo) {
  std::string message = where + ": " + key + ": " + what;
  if (!allowed.empty()) message += " (" + allowed + ")";
  if (!todo.empty()) message += "; " + todo;
  throw ConfigError(message);
}

// yaml-cpp's message, except for its nesting limit, which it reports as "bad file".
std::string yaml_error_text(const YAML::Exception& e) {
#ifdef COLOSSAL_YAML_DEPTH_GUARD
  if (dynamic_cast<const YAML::DeepRecursion*>(&e) != nullptr) {
    return "nested too deeply (more levels of [ ] or { } than the YAML parser allows)";
  }
#endif
  return e.msg;
}

std::string describe_node(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (an empty value)";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "'" + node.Scalar() + "'";
}

class Resolver {
 public:
  Resolver(std::string source, YAML::Node root, ParseOptions options)
      : source_(std::move(source)), root_(root), options_(options) {}

  // The order decides which error a user sees first: overrides are merged before anything is
  // checked (they are validated like the file); unknown keys come before values, so a typo is
  // reported as a typo rather than as a missing key; cross-key checks come last, when every
  // value is known to be well-formed.
  Config run(const std::vector<std::string>& overrides) {
    check_top_level();
    for (const std::string& text : overrides) apply_override(text);
    check_section("", root_);
    Config config;
    read_preset(config);
    for (const KeySpec& spec : schema())
      if (spec.kind != Kind::preset && entries_.count(spec.key))
        read_value(spec, entries_.at(spec.key).value, config);
    check_required(config);
    fill_model_defaults(config);
    fill_numerics_from_weights(config);
    check_consistency(config);
    config.source = source_;
    config.text = to_yaml(config);
    return config;
  }

 private:
  struct Entry {
    YAML::Node value;
    YAML::Mark key_mark;
  };

  // --- locations -------------------------------------------------------------------------------

  std::string position(const YAML::Mark& mark) const {
    if (mark.is_null()) return source_;
    return source_ + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
  }

  // A key set (or replaced, with its section) by --set is reported as that override: the
  // positions inside its value text would mean nothing to the user.
  std::string where(const std::string& key, const YAML::Mark& mark) const {
    for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
      const std::string& set = it->first;
      if (key == set || key.rfind(set + ".", 0) == 0) return "--set '" + it->second + "'";
    }
    return position(mark);
  }

  std::string where_value(const std::string& key) const {
    const Entry& e = entries_.at(key);
    // An empty value has no position of its own (yaml-cpp marks the next line); use the key's.
    return where(key, e.value.IsNull() ? e.key_mark : e.value.Mark());
  }

  // For a key that is absent: the nearest enclosing section that is present, else the file.
  std::string where_missing(const std::string& key) const {
    for (std::string s = parent_of(key); !s.empty(); s = parent_of(s))
      if (entries_.count(s)) return where(s, entries_.at(s).key_mark);
    return where(key, YAML::Mark::null_mark());
  }

  // For a message about several keys: the first of them that the user wrote.
  std::string where_first(const std::vector<std::string>& keys) const {
    for (const std::string& key : keys)
      if (entries_.count(key)) return where_value(key);
    return where_missing(keys.front());
  }

  // --- structure -------------------------------------------------------------------------------

  void check_top_level() {
    if (!root_.IsDefined() || root_.IsNull()) {
      root_ = YAML::Node(YAML::NodeType::Map);  // an empty file is an empty mapping
      return;
    }
    if (!root_.IsMap())
      raise(position(root_.Mark()), "config",
            "expected a mapping of sections, got " + describe_node(root_),
            "sections: " + join(index().children.at("")),
            "start the file with a section such as 'model:'");
  }

  // Every key present must be in the schema, once; sections must be mappings. Records where
  // each key is so that later messages can point at it.
  void check_section(const std::string& prefix, const YAML::Node& map) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& item : map) {
      const YAML::Node& name_node = item.first;
      const std::string label = prefix.empty() ? "config" : prefix;
      if (!name_node.IsScalar())
        raise(where(prefix, name_node.Mark()), label,
              "a key must be a plain name, got " + describe_node(name_node), "",
              "write keys as 'name: value'");
      const std::string name = name_node.Scalar();
      const std::string key = join_key(prefix, name);
      if (auto first = seen.find(name); first != seen.end())
        raise(where(key, name_node.Mark()), key, "duplicate key",
              "each key may appear once; first at line " + std::to_string(first->second.line + 1),
              "remove one of them");
      seen.emplace(name, name_node.Mark());
      if (!index().known(key)) raise_unknown(prefix, name, name_node.Mark());
      entries_[key] = Entry{item.second, name_node.Mark()};
      if (!index().sections.count(key)) continue;
      if (item.second.IsMap())
        check_section(key, item.second);
      else if (!item.second.IsNull())
        raise(where_value(key), key,
              "expected a mapping of keys, got " + describe_node(item.second),
              "keys of " + key + ": " + join(index().children.at(key)),
              "write it as '" + name + ":' followed by indented keys");
    }
  }

  [[noreturn]] void raise_unknown(const std::string& prefix, const std::string& name,
                                  const YAML::Mark& mark) const {
    const std::string key = join_key(prefix, name);
    const std::string allowed =
        prefix.empty() ? "sections: " + join(index().children.at(""))
                       : "keys of " + prefix + ": " + join(index().children.at(prefix));
    const std::string close = suggest_key(prefix, name);
    raise(where(key, mark), key, prefix.empty() ? "unknown section" : "unknown key", allowed,
          close.empty() ? "remove it (every key is documented in configs/README.md)"
                        : "did you mean '" + close + "'?");
  }

  // --- --set overrides -------------------------------------------------------------------------

  void apply_override(const std::string& text) {
    const std::string here = "--set '" + text + "'";
    const auto eq = text.find('=');
    if (eq == std::string::npos)
      raise(here, trim(text), "missing '='", "an override is key=value, e.g. train.steps=2000",
            "write --set <dotted.key>=<value>");
    const std::string key = trim(text.substr(0, eq));
    if (!index().known(key)) {
      const std::string section = index().sections.count(parent_of(key)) ? parent_of(key) : "";
      const std::string close = suggest_key(section, last_part(key));
      raise(here, key, "unknown key",
            section.empty() ? "sections: " + join(index().children.at(""))
                            : "keys of " + section + ": " + join(index().children.at(section)),
            close.empty() ? "see configs/README.md for the keys" : "did you mean '" + close + "'?");
    }
    YAML::Node value;
    try {
      value = YAML::Load(text.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      raise(here, key, "the value is not valid YAML: " + yaml_error_text(e),
            "a scalar, a [flow, list] or a {flow: mapping}",
            "quote the value if it holds YAML punctuation");
    }
    set_path(key, value);
    overrides_.emplace_back(key, text);
  }

  // Sets root_[a][b][c] = value, creating (or replacing non-mapping) sections on the way.
  void set_path(const std::string& key, const YAML::Node& value) {
    YAML::Node node;
    node.reset(root_);  // reset rebinds; operator= would overwrite the root's contents
    std::string rest = key;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const std::string part = rest.substr(0, dot);
      rest = rest.substr(dot + 1);
      if (!node[part].IsMap()) node[part] = YAML::Node(YAML::NodeType::Map);
      YAML::Node child = node[part];
      node.reset(child);
    }
    node[rest] = value;
  }

  // --- values ----------------------------------------------------------------------------------

  std::string example_of(const KeySpec& spec) const {
    return spec.key + ": " + (spec.example.empty() ? default_text(spec) : spec.example);
  }

  [[noreturn]] void raise_type(const KeySpec& spec, const std::string& expected,
                               const YAML::Node& node, const std::string& where_text) const {
    raise(where_text, spec.key, "expected " + expected + ", got " + describe_node(node),
          allowed_text(spec), "for example " + example_of(spec));
  }

  [[noreturn]] void raise_range(const KeySpec& spec, const std::string& value,
                                const std::string& allowed, const std::string& where_text) const {
    raise(where_text, spec.key, value + " is out of range", allowed,
          "for example " + example_of(spec));
  }

  // The text of a scalar; an empty value reads as "" for strings and is a type error otherwise.
  std::string scalar_of(const KeySpec& spec, const YAML::Node& node, const std::string& expected,
                        const std::string& where_text) const {
    if (node.IsNull() && spec.kind == Kind::text) return "";
    if (!node.IsScalar()) raise_type(spec, expected, node, where_text);
    return node.Scalar();
  }

  int64_t read_integer(const KeySpec& spec, const YAML::Node& node,
                       const std::string& where_text) const {
    const std::string text = scalar_of(spec, node, "an integer", where_text);
    int64_t v = 0;
    const Parse result = parse_whole(text, v);
    if (result == Parse::too_large)
      raise_range(spec, text, allowed_text(spec) + ", within 64 bits", where_text);
    if (result != Parse::ok) raise_type(spec, "an integer", node, where_text);
    if (!spec.range.contains(static_cast<double>(v)))
      raise_range(spec, text, allowed_text(spec), where_text);
    return v;
  }

  double read_number(const KeySpec& spec, const YAML::Node& node,
                     const std::string& where_text) const {
    const std::string text = scalar_of(spec, node, "a number", where_text);
    double v = 0.0;
    const Parse result = parse_whole(text, v);
    if (result == Parse::too_large)
      raise_range(spec, text, allowed_text(spec) + ", as a finite double", where_text);
    if (result != Parse::ok) raise_type(spec, "a finite number", node, where_text);
    if (!spec.range.contains(v)) raise_range(spec, text, allowed_text(spec), where_text);
    return v;
  }

  std::string read_choice(const KeySpec& spec, const YAML::Node& node,
                          const std::string& where_text) const {
    const std::string value = scalar_of(spec, node, allowed_text(spec), where_text);
    if (std::find(spec.choices.begin(), spec.choices.end(), value) != spec.choices.end())
      return value;
    const std::string close = did_you_mean(value, spec.choices);
    raise(where_text, spec.key, "invalid value '" + value + "'", allowed_text(spec),
          close.empty() ? "use one of the values listed" : "did you mean '" + close + "'?");
  }

  void read_value(const KeySpec& spec, const YAML::Node& node, Config& config) const {
    const std::string where_text = where_value(spec.key);
    const Field field = spec.field(config);
    switch (spec.kind) {
      case Kind::integer:
        return store_integer(spec, read_integer(spec, node, where_text), field, node, where_text);
      case Kind::number:
        *std::get<double*>(field) = read_number(spec, node, where_text);
        return;
      case Kind::text: {
        const std::string text = scalar_of(spec, node, "a string", where_text);
        if (spec.non_empty && text.empty() && !optional_data(spec))
          raise_type(spec, "a non-empty string", node, where_text);
        if (auto* words = std::get_if<Choice>(&field)) {  // words or free text (a path)
          words->set(text);
          return;
        }
        *std::get<std::string*>(field) = text;
        return;
      }
      case Kind::choice: {
        const std::string value = read_choice(spec, node, where_text);
        if (auto* named = std::get_if<Choice>(&field)) {
          if (!named->set(value)) {  // read_choice accepted it: the enum must know the word
            throw std::logic_error(spec.key + ": the schema allows '" + value +
                                   "' but its enum has no such name");
          }
        } else if (auto* flag = std::get_if<bool*>(&field)) {
          **flag = value == "true";
        } else {
          *std::get<std::string*>(field) = value;
        }
        return;
      }
      case Kind::number_pair:
        return read_pair(spec, node, std::get<Betas>(field), where_text);
      case Kind::integer_list:
        return read_integer_list(spec, node, *std::get<std::vector<int>*>(field), where_text);
      case Kind::preset:
        return;  // read first, by read_preset
    }
  }

  void store_integer(const KeySpec& spec, int64_t v, const Field& field, const YAML::Node& node,
                     const std::string& where_text) const {
    if (auto* p = std::get_if<int*>(&field)) {
      if (v > INT_MAX || v < INT_MIN)
        raise_range(spec, node.Scalar(), allowed_text(spec) + ", within 32 bits", where_text);
      **p = static_cast<int>(v);
    } else if (auto* p64 = std::get_if<int64_t*>(&field)) {
      **p64 = v;
    } else {
      **std::get_if<uint64_t*>(&field) = static_cast<uint64_t>(v);  // the range keeps v >= 0
    }
  }

  void read_integer_list(const KeySpec& spec, const YAML::Node& node, std::vector<int>& out,
                         const std::string& where_text) const {
    if (node.IsNull()) {
      out.clear();
      return;
    }
    if (!node.IsSequence()) raise_type(spec, "a list of integers", node, where_text);
    out.clear();
    for (std::size_t i = 0; i < node.size(); ++i) {
      const std::string at = where(spec.key, node[i].Mark());
      if (!node[i].IsScalar()) raise_type(spec, "an integer", node[i], at);
      const std::string text = node[i].Scalar();
      int64_t v = 0;
      if (parse_whole(text, v) != Parse::ok || v > INT_MAX) {
        raise_type(spec, "an integer", node[i], at);
      }
      if (!spec.range.contains(double(v))) raise_range(spec, text, allowed_text(spec), at);
      out.push_back(int(v));
    }
  }

  void read_pair(const KeySpec& spec, const YAML::Node& node, const Betas& out,
                 const std::string& where_text) const {
    if (!node.IsSequence() || node.size() != 2)
      raise_type(spec, "a list of two numbers", node, where_text);
    for (std::size_t i = 0; i < 2; ++i) {
      const std::string at = where(spec.key, node[i].Mark());
      if (!node[i].IsScalar()) raise_type(spec, "a number", node[i], at);
      const std::string text = node[i].Scalar();
      double v = 0.0;
      if (parse_whole(text, v) != Parse::ok) raise_type(spec, "a finite number", node[i], at);
      if (!spec.range.contains(v)) raise_range(spec, text, allowed_text(spec), at);
      *(i == 0 ? out.beta1 : out.beta2) = v;
    }
  }

  // The preset is read before any other model key, so that explicit keys override it.
  void read_preset(Config& config) const {
    if (!entries_.count("model.preset")) return;
    const KeySpec& spec = *index().leaves.at("model.preset");
    const YAML::Node& node = entries_.at("model.preset").value;
    const std::string where_text = where_value(spec.key);
    const std::string name = scalar_of(spec, node, "a preset name", where_text);
    if (name == kFromWeights) {
      read_sizes_from_weights(config, where_text);
      return;
    }
    const auto preset = core::find_preset(name);
    if (!preset) {
      const std::string close = did_you_mean(name, core::preset_names());
      raise(where_text, spec.key, "unknown preset '" + name + "'",
            "presets: " + join(core::preset_names()) + ", " + kFromWeights +
                " (the sizes in model.init_from's config.json)",
            close.empty() ? "pick one of these, or drop model.preset and set the sizes"
                          : "did you mean '" + close + "'?");
    }
    config.model_preset = name;
    config.model = *preset;
  }

  // model.preset: from_weights: the arch and sizes of the Hugging Face config.json beside
  // model.init_from (explicit model keys still override them).
  void read_sizes_from_weights(Config& config, const std::string& where_text) const {
    if (!entries_.count("model.init_from"))
      raise(where_text, "model.preset", "from_weights needs model.init_from",
            "the sizes come from the config.json of the weights' directory",
            "add model: {init_from: DIR}, with DIR a Hugging Face directory");
    const KeySpec& from = *index().leaves.at("model.init_from");
    const std::string path = scalar_of(from, entries_.at("model.init_from").value, "a path",
                                       where_value("model.init_from"));
    // A resolved config (the one model.h5, checkpoints and log.dir/config.yaml carry) sets every
    // size itself: it reads without the weights' directory, which may be gone or on another
    // cluster by the time the model is exported or evaluated.
    // A stored one written before the LLaMA keys existed lacks them (a GPT-2 or OPT ignores
    // them): its sizes alone make it resolved.
    bool resolved = true;
    for (const char* key : {"model.arch", "model.layers", "model.hidden", "model.heads",
                            "model.ffn_hidden", "model.vocab", "model.max_seq"}) {
      resolved = resolved && entries_.count(key) > 0;
    }
    for (const char* key :
         {"model.kv_heads", "model.rope_theta", "model.rms_eps", "model.tie_embeddings"}) {
      resolved = resolved && (options_.stored || entries_.count(key) > 0);
    }
    if (resolved && (options_.stored || hf_config_path(path).empty())) {
      config.model_preset = kFromWeights;
      return;
    }
    try {
      config.model = spec_from_hf_config(path);
    } catch (const WeightsError& e) {
      raise(where_value("model.init_from"), "model.preset", std::string("from_weights: ") + e.what(),
            "Hugging Face GPT2Config, OPTConfig or LlamaConfig of a model ours can run",
            "fix the weights' config.json, or drop model.preset: from_weights and set the sizes");
    }
    config.model_preset = kFromWeights;
  }

  // --- defaults and cross-key checks -----------------------------------------------------------

  // data.path, for a program that reads no data (ParseOptions::require_data).
  bool optional_data(const KeySpec& spec) const {
    return !options_.require_data && spec.key == "data.path";
  }

  void check_required(const Config& config) const {
    for (const KeySpec& spec : schema()) {
      const bool needed =
          spec.required == Required::always ||
          (spec.required == Required::without_preset && config.model_preset.empty());
      if (!needed || entries_.count(spec.key) || optional_data(spec)) continue;
      const std::string why = spec.required == Required::always
                                  ? allowed_text(spec)
                                  : allowed_text(spec) + "; required when model.preset is not set";
      // Written as the YAML to add, e.g. "add data: {path: data/train.bin}".
      const std::string value = spec.example.empty() ? default_text(spec) : spec.example;
      const std::string snippet =
          parent_of(spec.key) + ": {" + last_part(spec.key) + ": " + value + "}";
      const std::string todo =
          spec.required == Required::always
              ? "add " + snippet + ", or pass --set " + spec.key + "=" + value
              : "add " + snippet + ", or set model.preset to one of " + join(core::preset_names());
      raise(where_missing(spec.key), spec.key, "missing required key", why, todo);
    }
  }

  void fill_model_defaults(Config& config) const {
    if (entries_.count("model.ffn_hidden")) return;
    // from_weights: the width config.json gives, unless model.hidden is set here.
    if (config.model_preset == kFromWeights && !entries_.count("model.hidden")) return;
    if (config.model.arch == core::Arch::llama && !entries_.count("model.hidden") &&
        !config.model_preset.empty()) {
      return;  // the preset's SwiGLU width
    }
    // LLaMA's SwiGLU width keeps the MLP's parameters near 8 d^2: 2/3 of 4 d, rounded up to 256.
    const int64_t d = config.model.hidden;
    const int64_t ffn = config.model.arch == core::Arch::llama ? ((8 * d + 2) / 3 + 255) / 256 * 256
                                                               : 4 * d;
    if (ffn > INT_MAX)
      raise(where_first({"model.hidden"}), "model.hidden",
            std::to_string(config.model.hidden) + " is too large",
            "4 * hidden, the default model.ffn_hidden, must fit in 32 bits",
            "lower model.hidden or set model.ffn_hidden");
    config.model.ffn_hidden = static_cast<int>(ffn);
  }

  // A LLaMA's model.init_from with a config.json beside it (its sizes set here, not
  // from_weights): the rotary base, Llama 3's rotary scaling and RMSNorm epsilon that no tensor's
  // shape shows come from config.json unless model.rope_theta / model.rope_* / model.rms_eps are
  // set (then those win, and the start-up says they differ). Without this a model trained with
  // rope_theta 500000 was evaluated with 10000, silently 0.4% off. A stored config (a model
  // file's, a checkpoint's) is read as written.
  void fill_numerics_from_weights(Config& config) const {
    bool all_set = true;  // (a resolved config sets them all: it reads without config.json)
    for (const char* key : {"model.rope_theta", "model.rms_eps", "model.rope_factor",
                            "model.rope_low_freq_factor", "model.rope_high_freq_factor",
                            "model.rope_original_max_seq"}) {
      all_set = all_set && entries_.count(key) > 0;
    }
    if (config.model_init_from.empty() || config.model.arch != core::Arch::llama ||
        config.model_preset == kFromWeights || all_set || options_.stored) {
      return;
    }
    HfNumerics numerics;
    try {
      numerics = hf_llama_numerics(config.model_init_from);
    } catch (const WeightsError& e) {
      raise(where_value("model.init_from"), "model.init_from", e.what(),
            "the config.json of a LLaMA our model runs (rotary embedding of rope_type default or "
            "llama3)",
            "fix the weights' config.json, or point model.init_from at other weights");
    }
    if (numerics.rope_theta && !entries_.count("model.rope_theta"))
      config.model.rope_theta = *numerics.rope_theta;
    if (numerics.rms_eps && !entries_.count("model.rms_eps"))
      config.model.rms_eps = *numerics.rms_eps;
    core::RopeScaling& rope = config.model.rope_scaling;
    for (const auto& [key, value, field] :
         {std::tuple{"model.rope_factor", numerics.rope_factor, &rope.factor},
          std::tuple{"model.rope_low_freq_factor", numerics.rope_low_freq_factor,
                     &rope.low_freq_factor},
          std::tuple{"model.rope_high_freq_factor", numerics.rope_high_freq_factor,
                     &rope.high_freq_factor}}) {
      if (value && !entries_.count(key)) *field = *value;
    }
    if (numerics.rope_original_max_seq && !entries_.count("model.rope_original_max_seq"))
      rope.original_max_seq = int(*numerics.rope_original_max_seq);
  }

  void check_consistency(const Config& config) const {
    check_heads(config.model);
    check_llama(config);
    check_tensor_mode(config);
    if (config.parallel.tensor_mode == core::TensorMode::d1) check_tensor_split(config);
    check_pipeline(config);
    check_recompute(config);
    check_fine_tune(config);
    const core::RopeScaling& rope = config.model.rope_scaling;
    if (rope.scaled() && !(rope.low_freq_factor < rope.high_freq_factor)) {
      raise(where_first({"model.rope_low_freq_factor", "model.rope_high_freq_factor",
                         "model.rope_factor"}),
            "model.rope_low_freq_factor",
            format_number(rope.low_freq_factor) + " with model.rope_high_freq_factor " +
                format_number(rope.high_freq_factor),
            "the band between the two wavelengths is interpolated, so low < high",
            "use Llama 3's 1 and 4, or the values of the model's config.json");
    }
    for (int id : config.sample.stop_tokens) {
      if (id >= config.model.vocab) {
        raise(where_first({"sample.stop_tokens"}), "sample.stop_tokens",
              "token " + std::to_string(id) + " with model.vocab " +
                  std::to_string(config.model.vocab),
              "a stop token is one of the model's token ids", "list ids below " +
                  std::to_string(config.model.vocab));
      }
    }
    if (config.log.export_hf && !config.log.save_model) {
      raise(where_first({"log.export_hf", "log.save_model"}), "log.export_hf",
            "true needs the model file, but log.save_model is false",
            "the export converts log.dir/model.h5 at the end of the run",
            "set log.save_model: true, or log.export_hf: false");
    }
    const TrainConfig& t = config.train;
    if (t.seq_len > config.model.max_seq)
      raise(where_first({"train.seq_len", "model.max_seq", "model.preset"}), "train.seq_len",
            std::to_string(t.seq_len) +
                " is longer than model.max_seq = " + std::to_string(config.model.max_seq),
            "the position table has max_seq rows",
            "set train.seq_len <= " + std::to_string(config.model.max_seq) +
                " or raise model.max_seq");
    if (t.global_batch % t.micro_batch != 0) {
      const int below = t.global_batch / t.micro_batch * t.micro_batch;
      const std::string options =
          (below > 0 ? std::to_string(below) + " or " : "") + std::to_string(below + t.micro_batch);
      raise(where_first({"train.global_batch", "train.micro_batch"}), "train.global_batch",
            std::to_string(t.global_batch) +
                " is not a multiple of train.micro_batch = " + std::to_string(t.micro_batch),
            "a step accumulates whole micro-batches",
            "set train.global_batch to " + options + ", or change train.micro_batch");
    }
    const int per_step = t.micro_batch * config.parallel.data;
    if (t.global_batch % per_step != 0) {
      raise(where_first({"train.global_batch", "parallel.data", "train.micro_batch"}),
            "train.global_batch",
            std::to_string(t.global_batch) + " is not a multiple of parallel.data * " +
                "train.micro_batch = " + std::to_string(per_step),
            "every data-parallel rank runs the same number of whole micro-batches",
            "set train.global_batch to a multiple of " + std::to_string(per_step) +
                ", or change parallel.data or train.micro_batch");
    }
    if (config.parallel.offload_optimizer && config.parallel.zero_stage < 1) {
      raise(where_first({"parallel.zero.offload.optimizer", "parallel.zero.stage"}),
            "parallel.zero.offload.optimizer",
            "true with parallel.zero.stage = " + std::to_string(config.parallel.zero_stage),
            "offload moves the sharded optimizer states, so it needs stage 1, 2 or 3",
            "set parallel.zero.stage: 1 (or 2, 3), or parallel.zero.offload.optimizer: false");
    }
    if (config.parallel.offload_params && config.parallel.zero_stage != 3) {
      raise(where_first({"parallel.zero.offload.params", "parallel.zero.stage"}),
            "parallel.zero.offload.params",
            "true with parallel.zero.stage = " + std::to_string(config.parallel.zero_stage),
            "only stage 3 shards the parameters, so only stage 3 can keep them in host memory",
            "set parallel.zero.stage: 3, or parallel.zero.offload.params: false");
    }
    if (config.parallel.offload_fraction < 1.0 && !config.parallel.offload_optimizer) {
      raise(where_first({"parallel.zero.offload.optimizer_fraction",
                         "parallel.zero.offload.optimizer"}),
            "parallel.zero.offload.optimizer_fraction",
            format_number(config.parallel.offload_fraction) +
                " with parallel.zero.offload.optimizer = false",
            "the fraction says how much of the offloaded optimizer state goes to the host",
            "set parallel.zero.offload.optimizer: true, or remove optimizer_fraction");
    }
    if (config.parallel.offload_fraction < 1.0 && config.parallel.offload_params) {
      raise(where_first({"parallel.zero.offload.optimizer_fraction",
                         "parallel.zero.offload.params"}),
            "parallel.zero.offload.optimizer_fraction",
            format_number(config.parallel.offload_fraction) +
                " with parallel.zero.offload.params = true",
            "host-resident parameter shards are updated by the host optimizer, so all of the "
            "optimizer state must be on the host",
            "set parallel.zero.offload.optimizer_fraction: 1, or offload.params: false");
    }
    if (config.parallel.offload_params && !config.parallel.offload_optimizer) {
      raise(where_first({"parallel.zero.offload.params", "parallel.zero.offload.optimizer"}),
            "parallel.zero.offload.params",
            "true with parallel.zero.offload.optimizer = false",
            "host-resident parameter shards are updated by the host optimizer",
            "set parallel.zero.offload.optimizer: true as well");
    }
    if (config.parallel.offload_params_fraction < 1.0 && !config.parallel.offload_params) {
      raise(where_first({"parallel.zero.offload.params_fraction",
                         "parallel.zero.offload.params"}),
            "parallel.zero.offload.params_fraction",
            format_number(config.parallel.offload_params_fraction) +
                " with parallel.zero.offload.params = false",
            "the fraction says how much of the offloaded parameter shard goes to the host",
            "set parallel.zero.offload.params: true, or remove params_fraction");
    }
    const OptimizerConfig& o = t.optimizer;
    if (o.min_lr > o.lr)
      raise(where_first({"train.optimizer.min_lr", "train.optimizer.lr"}), "train.optimizer.min_lr",
            format_number(o.min_lr) + " is above train.optimizer.lr = " + format_number(o.lr),
            "the schedule decays from lr down to min_lr",
            "set train.optimizer.min_lr <= " + format_number(o.lr));
  }

  // A reset needs a checkpoint file: with auto, a restarted fine-tune would reset again.
  void check_fine_tune(const Config& config) const {
    const FineTuneConfig& f = config.train.fine_tune;
    if (f.any() && config.checkpoint.resume == ResumeMode::file) {
      // A fine-tune is a new run from step 0: the checkpoints of the run it starts from, in its
      // own checkpoint.dir, would be moved aside (numbered after its first step), its source
      // with them, and a rerun of the same command would no longer find the file.
      namespace fs = std::filesystem;
      const std::string dir =
          config.checkpoint.dir.empty() ? config.log.dir + "/checkpoints" : config.checkpoint.dir;
      std::error_code ec;
      const fs::path source = fs::weakly_canonical(
          fs::path(config.checkpoint.resume_path).parent_path().empty()
              ? fs::path(".")
              : fs::path(config.checkpoint.resume_path).parent_path(),
          ec);
      std::error_code ec2;
      const fs::path own = fs::weakly_canonical(fs::path(dir), ec2);
      if (!ec && !ec2 && source == own) {
        raise(where_first({"checkpoint.resume", "log.dir", "checkpoint.dir"}), "checkpoint.resume",
              "'" + config.checkpoint.resume_path + "' is in this fine-tune's own checkpoint.dir",
              "a fine-tune starts a new run at step 0, whose checkpoints must not mix with those "
              "of the run it starts from",
              "give the fine-tune its own log.dir (or checkpoint.dir)");
      }
    }
    if (!f.any() || config.checkpoint.resume == ResumeMode::file) return;
    const std::string key = f.reset_optimizer ? "train.reset_optimizer" : "train.reset_schedule";
    raise(where_first({key}), key,
          "true needs a checkpoint to start from, but checkpoint.resume is " +
              std::string(resume_mode_name(config.checkpoint.resume)),
          "a reset applies to checkpoint.resume: a checkpoint file (with auto, a restarted "
          "fine-tune would reset again)",
          "set checkpoint.resume to the checkpoint file to fine-tune from, or " + key + ": false");
  }

  // The tensor size must divide the heads and the MLP width; offer the nearest sizes that do.
  void check_recompute(const Config& config) const {
    const auto& c = config.checkpointing;
    for (int block : c.blocks) {
      if (block >= config.model.layers) {
        raise(where_first({"checkpointing.blocks"}), "checkpointing.blocks",
              "block " + std::to_string(block) + " of a model with " +
                  std::to_string(config.model.layers) + " layers",
              "blocks are numbered from 0", "list blocks below " +
                  std::to_string(config.model.layers));
      }
    }
    // A key that the chosen policy ignores is a mistake worth stopping for.
    using core::CheckpointPolicy;
    auto only_with = [&](const char* key, bool given, CheckpointPolicy wanted) {
      const std::string policy = core::checkpoint_policy_name(wanted);
      if (given && c.policy != wanted) {
        raise(where_first({key}), key,
              std::string("is set but checkpointing.policy is ") +
                  core::checkpoint_policy_name(c.policy),
              "it is used only by policy " + policy,
              "set checkpointing.policy: " + policy + " or remove " + key);
      }
    };
    only_with("checkpointing.blocks", !c.blocks.empty(), CheckpointPolicy::manual);
    only_with("checkpointing.every", c.every != 0, CheckpointPolicy::every_k);
    only_with("checkpointing.memory_budget", c.memory_budget != 0, CheckpointPolicy::rotor);
    auto needs = [&](const char* key, bool missing, CheckpointPolicy wanted,
                     const std::string& what, const std::string& example) {
      if (c.policy == wanted && missing) {
        raise(where_first({"checkpointing.policy", key}), key,
              std::string("is needed by checkpointing.policy: ") +
                  core::checkpoint_policy_name(wanted),
              what, example);
      }
    };
    needs("checkpointing.every", c.every < 1, CheckpointPolicy::every_k,
          "an integer >= 1 (blocks per segment)",
          "e.g. checkpointing: {policy: every_k, every: 2}");
    needs("checkpointing.blocks", c.blocks.empty(), CheckpointPolicy::manual,
          "a non-empty list of blocks", "e.g. checkpointing: {policy: manual, blocks: [0, 1]}");
    needs("checkpointing.memory_budget", c.memory_budget <= 0, CheckpointPolicy::rotor,
          "GiB per rank, > 0 (colossal_train --memory-plan shows what a run needs)",
          "e.g. checkpointing: {policy: rotor, memory_budget: 6}");
  }

  void check_pipeline(const Config& config) const {
    const auto& p = config.parallel;
    const int layers = config.model.layers;
    using parallel::PipelineSchedule;
    const bool interleaved = p.pipeline_schedule == PipelineSchedule::interleaved;
    if (p.pipeline_chunks > 1 && !interleaved) {
      raise(where_first({"parallel.pipeline.chunks", "parallel.pipeline.schedule"}),
            "parallel.pipeline.chunks",
            std::to_string(p.pipeline_chunks) + " with schedule " +
                parallel::pipeline_schedule_name(p.pipeline_schedule),
            "model chunks per rank need the interleaved schedule",
            "set parallel.pipeline.schedule: interleaved, or chunks: 1");
    }
    if (interleaved && (p.pipeline < 2 || p.pipeline_chunks < 2)) {
      raise(where_first({"parallel.pipeline.schedule", "parallel.pipeline.size",
                         "parallel.pipeline.chunks"}),
            "parallel.pipeline.schedule",
            "interleaved with " + std::to_string(p.pipeline) + " stages and " +
                std::to_string(p.pipeline_chunks) + " chunks",
            "it interleaves at least 2 chunks per rank over at least 2 stages",
            "set parallel.pipeline.size and parallel.pipeline.chunks to 2 or more, or use 1f1b");
    }
    const int virtual_stages = p.pipeline * p.pipeline_chunks;
    if (virtual_stages > layers) {
      raise(where_first({"parallel.pipeline.size", "parallel.pipeline.chunks", "model.layers",
                         "model.preset"}),
            "parallel.pipeline.size",
            std::to_string(virtual_stages) + " stages (size x chunks) for " +
                std::to_string(layers) + " layers",
            "every stage runs at least one transformer block",
            "set parallel.pipeline.size x chunks to at most " + std::to_string(layers));
    }
    const int micro = config.train.global_batch / std::max(1, p.data * config.train.micro_batch);
    if (interleaved && micro % p.pipeline != 0) {
      raise(where_first({"parallel.pipeline.schedule", "train.global_batch"}),
            "parallel.pipeline.schedule",
            "interleaved with " + std::to_string(micro) + " micro-batches per step for " +
                std::to_string(p.pipeline) + " stages",
            "the interleaved schedule runs micro-batches in groups of one per stage",
            "make train.global_batch / (parallel.data * train.micro_batch) a multiple of " +
                std::to_string(p.pipeline));
    }
    if (p.pipeline > 1 && p.pipeline_schedule == PipelineSchedule::one_f_one_b &&
        micro < p.pipeline) {
      raise(where_first({"parallel.pipeline.schedule", "parallel.pipeline.size",
                         "train.global_batch"}),
            "parallel.pipeline.schedule",
            "1f1b with " + std::to_string(micro) + " micro-batches per step (train.global_batch / " +
                "(parallel.data * train.micro_batch)) for " + std::to_string(p.pipeline) +
                " stages",
            "1F1B fills the pipeline with at least one micro-batch per stage",
            "raise train.global_batch to " +
                std::to_string(p.pipeline * p.data * config.train.micro_batch) +
                " or more, lower train.micro_batch, or use schedule: gpipe");
    }
    if (p.pipeline_layers.empty()) return;
    int total = 0;
    for (int n : p.pipeline_layers) total += n;
    if (int(p.pipeline_layers.size()) != virtual_stages || total != layers) {
      raise(where_first({"parallel.pipeline.layers", "parallel.pipeline.size"}),
            "parallel.pipeline.layers",
            std::to_string(p.pipeline_layers.size()) + " entries summing to " +
                std::to_string(total) + " for " + std::to_string(virtual_stages) +
                " stages of " + std::to_string(layers) + " layers",
            "one block count per (virtual) stage, every count >= 1, summing to model.layers",
            "give " + std::to_string(virtual_stages) + " counts summing to " +
                std::to_string(layers) + ", or [] to balance");
    }
  }

  // 2d / 2.5d / 3d (core::Model2D, core::Model3D): the grid's shape and what those models run.
  void check_tensor_mode(const Config& config) const {
    const ParallelConfig& p = config.parallel;
    using core::TensorMode;
    const TensorMode mode_value = p.tensor_mode;
    const std::string mode = core::tensor_mode_name(mode_value);
    if (mode_value != TensorMode::d2_5 && p.tensor_depth != 1) {
      raise(where_first({"parallel.tensor.depth", "parallel.tensor.mode"}),
            "parallel.tensor.depth", std::to_string(p.tensor_depth) + " with mode " + mode,
            "depth layers belong to 2.5d", "set parallel.tensor.mode: 2.5d or depth: 1");
    }
    if (mode_value == TensorMode::d1) return;
    const int t = p.tensor, d = core::tensor_depth(mode_value, p.tensor_depth);
    const std::string shape = mode_value == TensorMode::d3   ? "a cube q^3"
                              : mode_value == TensorMode::d2 ? "a square q^2"
                                                             : "q^2 x depth";
    const core::TensorGrid grid = core::tensor_grid(mode_value, t, d);
    const int q = grid.q;
    if (!grid.exact) {
      const int lower = std::max(2, q), upper = lower + 1;
      raise(where_first({"parallel.tensor.size", "parallel.tensor.mode"}), "parallel.tensor.size",
            std::to_string(t) + " is not " + shape + " with q >= 2 (mode " + mode +
                (mode_value == TensorMode::d2_5 ? ", depth " + std::to_string(d) : "") + ")",
            "the ranks form a grid of that shape",
            "set parallel.tensor.size to " + std::to_string(grid.ranks(lower)) + " or " +
                std::to_string(grid.ranks(upper)));
    }
    const core::ModelSpec& m = config.model;
    const int width = core::tensor_grid_multiple(mode_value, q);
    for (auto [key, value, by] : {std::tuple<const char*, int, int>{"model.heads", m.heads, q},
                                  {"model.hidden", m.hidden, width},
                                  {"model.ffn_hidden", m.ffn_hidden, width},
                                  {"train.micro_batch", config.train.micro_batch, width}}) {
      if (value % by == 0) continue;
      raise(where_first({key, "parallel.tensor.size", "model.preset"}), key,
            std::to_string(value) + " is not a multiple of " + std::to_string(by) + " (mode " +
                mode + ", q = " + std::to_string(q) + ")",
            "every rank of the grid takes an equal block",
            "set " + std::string(key) + " to " +
                (value / by > 0 ? std::to_string(value / by * by) + " or " : std::string()) +
                std::to_string((value / by + 1) * by));
    }
    const std::string why = "the " + mode + " model (core/model" +
                            (mode_value == TensorMode::d3 ? "3d" : "2d") +
                            ".hpp) does not run it yet";
    auto refuse = [&](bool bad, const char* key, const std::string& value, const char* todo) {
      if (bad) {
        raise(where_first({key, "parallel.tensor.mode"}), key,
              value + " with tensor mode " + mode, why, todo);
      }
    };
    refuse(p.sequence > 1, "parallel.sequence", std::to_string(p.sequence),
           "set it to 1, or parallel.tensor.mode: 1d");
    refuse(p.sequence_split, "parallel.tensor.sequence_split", "true", "set it to false");
    refuse(p.zero_stage > 2, "parallel.zero.stage", std::to_string(p.zero_stage),
           "set it to 0, 1 or 2 (ZeRO 2 shards the gradients and AdamW's moments over the data "
           "ranks; these models never gather parameters)");
    refuse(p.mode == ParallelMode::automatic, "parallel.mode", "auto",
           "set it to manual, or leave parallel.tensor.mode out (auto chooses the mode)");
    const int per_step = config.train.micro_batch * p.data * d;
    if (config.train.global_batch % per_step != 0) {
      raise(where_first({"train.global_batch", "train.micro_batch", "parallel.tensor.depth"}),
            "train.global_batch",
            std::to_string(config.train.global_batch) + " is not a multiple of train.micro_batch "
                "x parallel.data x depth = " + std::to_string(per_step),
            "every data rank and depth layer runs the same whole micro-batches",
            "set train.global_batch to a multiple of " + std::to_string(per_step));
    }
  }

  void check_tensor_split(const Config& config) const {
    const int t = config.parallel.tensor;
    const core::ModelSpec& m = config.model;
    if (config.parallel.sequence_split && t <= 1) {
      raise(where_first({"parallel.tensor.sequence_split", "parallel.tensor.size"}),
            "parallel.tensor.sequence_split", "true with parallel.tensor.size = 1",
            "it splits the token rows over the tensor group",
            "set parallel.tensor.size to 2 or more, or sequence_split: false");
    }
    const int ring = config.parallel.sequence;
    if (config.train.seq_len % ring != 0) {
      int lower = config.train.seq_len / ring * ring;
      raise(where_first({"parallel.sequence", "train.seq_len"}), "parallel.sequence",
            std::to_string(ring) + " does not divide train.seq_len = " +
                std::to_string(config.train.seq_len),
            "each sequence rank holds an equal chunk of every sequence",
            "set train.seq_len to " + (lower > 0 ? std::to_string(lower) + " or " : "") +
                std::to_string(lower + ring) + ", or parallel.sequence to a divisor of " +
                std::to_string(config.train.seq_len));
    }
    if (ring > 1 && m.fused_attention) {
      raise(where_first({"model.fused_attention", "parallel.sequence"}), "model.fused_attention",
            "true with parallel.sequence = " + std::to_string(ring),
            "ring self-attention keeps its rows of the attention probabilities",
            "set model.fused_attention: false (ring attention already divides that memory by "
            "parallel.sequence)");
    }
    const int chunk = config.train.seq_len / ring;
    if (config.parallel.sequence_split && chunk % t != 0) {
      raise(where_first({"parallel.tensor.sequence_split", "train.seq_len"}),
            "parallel.tensor.sequence_split",
            "true with " + std::to_string(chunk) + " positions per sequence rank (train.seq_len " +
                std::to_string(config.train.seq_len) + " / parallel.sequence " +
                std::to_string(ring) + ") not divisible by parallel.tensor.size = " +
                std::to_string(t),
            "every tensor rank takes an equal share of each sequence's rows",
            "set train.seq_len to a multiple of " + std::to_string(t * ring));
    }
    if (t <= 1) return;
    for (const auto& [what, value] : {std::pair<const char*, int>{"model.heads", m.heads},
                                      std::pair<const char*, int>{"model.ffn_hidden",
                                                                  m.ffn_hidden}}) {
      if (value % t == 0) continue;
      int lower = t, upper = t;
      while (lower > 1 && (m.heads % lower != 0 || m.ffn_hidden % lower != 0)) --lower;
      while (upper < m.heads && (m.heads % upper != 0 || m.ffn_hidden % upper != 0)) ++upper;
      std::string options = std::to_string(lower);
      if (upper != lower && m.heads % upper == 0 && m.ffn_hidden % upper == 0) {
        options += " or " + std::to_string(upper);
      }
      raise(where_first({"parallel.tensor.size", what, "model.preset"}), "parallel.tensor.size",
            std::to_string(t) + " does not divide " + what + " = " + std::to_string(value),
            "each tensor rank takes an equal share of the attention heads and MLP width",
            "set parallel.tensor.size to " + options);
    }
  }

  // model.arch: llama (issue 25): grouped-query heads and the layouts that run it.
  void check_llama(const Config& config) const {
    const core::ModelSpec& m = config.model;
    if (m.arch != core::Arch::llama) return;
    const int kv = m.key_value_heads();
    if (m.heads % kv != 0) {
      raise(where_first({"model.kv_heads", "model.heads", "model.preset"}), "model.kv_heads",
            std::to_string(kv) + " does not divide model.heads = " + std::to_string(m.heads),
            "each key/value head serves an equal group of query heads",
            "set model.kv_heads to a divisor of " + std::to_string(m.heads));
    }
    if (m.head_dim() % 2 != 0) {
      raise(where_first({"model.heads", "model.hidden", "model.preset"}), "model.heads",
            std::to_string(m.heads) + " gives an odd head size " + std::to_string(m.head_dim()),
            "rotary positions turn pairs of a head's channels",
            "choose model.heads so that model.hidden / model.heads is even");
    }
    const core::TensorMode mode = config.parallel.tensor_mode;
    if (mode != core::TensorMode::d1) {
      raise(where_first({"model.arch", "parallel.tensor.mode"}), "model.arch",
            std::string("llama with parallel.tensor.mode ") + core::tensor_mode_name(mode),
            "the 2d/2.5d/3d models (core/model2d, core/model3d) run gpt2 and opt only",
            "set parallel.tensor.mode: 1d, or model.arch: gpt2 or opt");
    }
    const int t = config.parallel.tensor;
    if (t > 1 && kv % t != 0) {
      raise(where_first({"parallel.tensor.size", "model.kv_heads", "model.preset"}),
            "parallel.tensor.size",
            std::to_string(t) + " does not divide model.kv_heads = " + std::to_string(kv),
            "each tensor rank keeps whole groups of query heads with their key/value head",
            "set parallel.tensor.size to a divisor of " + std::to_string(kv));
    }
  }

  void check_heads(const core::ModelSpec& m) const {
    if (m.hidden % m.heads == 0) return;
    // Offer the divisors of hidden nearest to the requested head count.
    int lower = m.heads, upper = m.heads;
    while (lower > 1 && m.hidden % lower != 0) --lower;
    while (upper < m.hidden && m.hidden % upper != 0) ++upper;
    const std::string options = lower == upper
                                    ? std::to_string(lower)
                                    : std::to_string(lower) + " or " + std::to_string(upper);
    raise(where_first({"model.heads", "model.hidden", "model.preset"}), "model.heads",
          "model.hidden = " + std::to_string(m.hidden) +
              " is not divisible by model.heads = " + std::to_string(m.heads),
          "each head takes hidden / heads channels",
          "set model.heads to a divisor of " + std::to_string(m.hidden) + " such as " + options);
  }

  std::string source_;
  YAML::Node root_;
  ParseOptions options_;
  std::vector<std::pair<std::string, std::string>> overrides_;  // (dotted key, "key=value")
  std::map<std::string, Entry> entries_;                        // every key present in the tree
};

// Emits nested mappings from a flat list of dotted keys in section order.
class SectionWriter {
 public:
  explicit SectionWriter(YAML::Emitter& out) : out_(out) { out_ << YAML::BeginMap; }

  void enter(const std::string& section) {
    std::vector<std::string> target;
    for (std::size_t start = 0; start < section.size();) {
      const auto dot = section.find('.', start);
      const auto end = dot == std::string::npos ? section.size() : dot;
      target.push_back(section.substr(start, end - start));
      start = end + 1;
    }
    std::size_t common = 0;
    while (common < open_.size() && common < target.size() && open_[common] == target[common])
      ++common;
    while (open_.size() > common) close_one();
    for (std::size_t i = common; i < target.size(); ++i) {
      out_ << YAML::Key << target[i] << YAML::Value << YAML::BeginMap;
      open_.push_back(target[i]);
    }
  }

  void finish() {
    while (!open_.empty()) close_one();
    out_ << YAML::EndMap;
  }

 private:
  void close_one() {
    out_ << YAML::EndMap;
    open_.pop_back();
  }

  YAML::Emitter& out_;
  std::vector<std::string> open_;
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Public API

const char* on_nonfinite_name(OnNonfinite mode) {
  return mode == OnNonfinite::skip ? "skip" : "stop";
}
const char* parallel_mode_name(ParallelMode mode) {
  return mode == ParallelMode::automatic ? "auto" : "manual";
}
const char* resume_mode_name(ResumeMode mode) {
  switch (mode) {
    case ResumeMode::automatic:
      return "auto";
    case ResumeMode::file:
      return "file";
    case ResumeMode::never:
      break;
  }
  return "never";
}
std::optional<OnNonfinite> parse_on_nonfinite(std::string_view name) {
  return parse_among(name, {OnNonfinite::stop, OnNonfinite::skip}, on_nonfinite_name);
}
std::optional<ParallelMode> parse_parallel_mode(std::string_view name) {
  return parse_among(name, {ParallelMode::manual, ParallelMode::automatic}, parallel_mode_name);
}
std::optional<ResumeMode> parse_resume_mode(std::string_view name) {
  return parse_among(name, {ResumeMode::never, ResumeMode::automatic}, resume_mode_name);
}

Config parse_config(const std::string& yaml_text, const std::string& source,
                    const std::vector<std::string>& overrides, ParseOptions options) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    const std::string where = e.mark.is_null() ? source
                                               : source + ":" + std::to_string(e.mark.line + 1) +
                                                     ":" + std::to_string(e.mark.column + 1);
    raise(where, "YAML syntax error", yaml_error_text(e), "the config must be valid YAML",
          "check indentation, brackets and quotes at or just before this point");
  }
  return Resolver(source, root, options).run(overrides);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   ParseOptions options) {
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  if (std::filesystem::is_directory(path, ec))
    raise(path, "config file", "is a directory", "a YAML file is expected",
          "pass the path of a .yaml file");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    raise(path, "config file", "cannot be opened", std::strerror(errno),
          "check the path (relative paths start from " + cwd + ")");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides, options);
}

std::string to_yaml(const Config& config) {
  Config copy = config;  // fields are reached through the schema's mutable accessors
  YAML::Emitter out;
  SectionWriter sections(out);
  for (const KeySpec& spec : schema()) {
    if (spec.kind == Kind::preset && copy.model_preset.empty()) continue;
    sections.enter(parent_of(spec.key));
    out << YAML::Key << last_part(spec.key) << YAML::Value;
    write_field(out, spec, spec.field(copy));
  }
  sections.finish();
  return std::string(out.c_str()) + "\n";
}

namespace {
// Every leaf of a YAML tree as "a.b.c" -> its value as YAML.
void flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& entry : node) {
      // A key that is not a scalar (YAML allows `[a, b]: 1`) is compared by its flow text.
      std::string key;
      if (entry.first.IsScalar()) {
        key = entry.first.Scalar();
      } else {
        YAML::Emitter text;
        text << YAML::Flow << entry.first;
        key = text.c_str();
      }
      flatten(entry.second, prefix.empty() ? key : prefix + "." + key, out);
    }
    return;
  }
  YAML::Emitter text;
  text << YAML::Flow << node;
  out[prefix] = text.c_str();
}
}  // namespace

std::vector<std::string> changed_keys(
    const std::string& before, const std::string& after,
    std::map<std::string, std::pair<std::string, std::string>>* values) {
  std::map<std::string, std::string> a, b;
  for (auto [text, out, name] : {std::tuple{&before, &a, "before"}, std::tuple{&after, &b, "after"}}) {
    try {
      flatten(YAML::Load(*text), "", *out);
    } catch (const YAML::Exception& e) {
      throw ConfigError(std::string("changed_keys: the config text '") + name +
                        "' is not valid YAML: " + yaml_error_text(e));
    }
  }
  // A key one text lacks and the other holds at its default is no change: a text written before
  // the key existed (a checkpoint's, a model file's) ran with that default.
  static const std::map<std::string, std::string> defaults = [] {
    std::map<std::string, std::string> d;
    flatten(YAML::Load(to_yaml(Config{})), "", d);
    return d;
  }();
  const auto at_default = [&](const std::string& key, const std::string& value) {
    const auto it = defaults.find(key);
    return it != defaults.end() && it->second == value;
  };
  std::vector<std::string> keys;
  for (const auto& [key, value] : b) {
    const auto it = a.find(key);
    if (it == a.end() ? !at_default(key, value) : it->second != value) keys.push_back(key);
  }
  for (const auto& [key, value] : a) {
    if (!b.count(key) && !at_default(key, value)) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  if (values != nullptr) {
    for (const std::string& key : keys) {
      const auto was = a.find(key), now = b.find(key);
      (*values)[key] = {was == a.end() ? "" : was->second, now == b.end() ? "" : now->second};
    }
  }
  return keys;
}

const std::vector<ConfigKeyInfo>& config_schema() {
  static const std::vector<ConfigKeyInfo> info = [] {
    std::vector<ConfigKeyInfo> rows;
    for (const KeySpec& spec : schema()) {
      std::string allowed = allowed_text(spec);
      if (!spec.cross_check.empty()) allowed += "; " + spec.cross_check;
      rows.push_back({spec.key, kind_name(spec),
                      spec.default_note.empty() ? default_text(spec) : spec.default_note, allowed,
                      spec.doc});
    }
    return rows;
  }();
  return info;
}

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  // Levenshtein distance, one row at a time.
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
        diagonal = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
      }
    }
    return row[b.size()];
  };
  // Short keys get a floor of 2 edits (a transposition); long ones a third of their length.
  const std::size_t limit = std::max<std::size_t>(2, key.size() / 3);
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    const std::size_t d = distance(key, candidate);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace colossal::io
