// Model dimensions, named presets and the logical parameter table of GPT-2, OPT and LLaMA.
//
// Parameter names and shapes are exactly those of the Hugging Face `transformers` state_dict
// (GPT2LMHeadModel: Conv1D weights stored [in, out]; OPTForCausalLM and LlamaForCausalLM:
// nn.Linear weights stored [out, in]), so weights convert to and from Hugging Face without
// renaming or transposing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace colossal::core {

// gpt2 and opt: pre-LN, learned positions, tied head, biases. llama: RMSNorm, rotary positions,
// SwiGLU MLP, grouped-query attention, no biases, untied head unless tie_embeddings.
enum class Arch { gpt2, opt, llama };

const char* arch_name(Arch arch);

// Llama 3's rotary scaling (Hugging Face rope_type "llama3", Llama 3.1 and later): a frequency
// whose wavelength 2 pi / f exceeds original_max_seq / low_freq_factor is divided by factor, one
// whose wavelength is below original_max_seq / high_freq_factor is kept, and the band between
// moves smoothly from one to the other. factor 1 is no scaling.
struct RopeScaling {
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_seq = 8192;

  bool scaled() const { return factor != 1.0; }
};

// The rotation frequency of pair i (of hs / 2) of a head of hs columns: theta^(-2i/hs), then
// scaled as `scaling` says. In double: every layout builds its tables from it.
double rope_frequency(int i, int hs, double theta, const RopeScaling& scaling);

struct ModelSpec {
  Arch arch = Arch::gpt2;
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int ffn_hidden = 3072;  // 4 * hidden unless set
  int vocab = 50257;
  int max_seq = 1024;     // learned position table size (OPT stores max_seq + 2 rows)
  // Fused causal attention: no (B,H,T,T) probabilities saved, memory linear in T (slower at
  // short T, where the dense GEMM path is faster). Same results within fp32 tolerance.
  bool fused_attention = false;
  // Under tensor parallelism the vocabulary is padded to a multiple of tensor size * this (as
  // Megatron does); padded rows are masked and never saved. One rank never pads.
  int vocab_multiple = 128;
  // LLaMA only (gpt2/opt ignore them): key/value heads of grouped-query attention (0: = heads;
  // must divide heads), the rotary base, RMSNorm's epsilon, and whether lm_head is the token
  // embedding (Hugging Face's tie_word_embeddings; gpt2/opt always tie).
  int kv_heads = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_eps = 1e-5;
  bool tie_embeddings = false;

  int head_dim() const { return hidden / heads; }
  int key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  bool llama() const { return arch == Arch::llama; }
  // Whether the LM head reads the token embedding (else lm_head.weight, llama untied).
  bool tied() const { return !llama() || tie_embeddings; }
  // Rows of the learned position table: OPT's table carries an offset of 2; LLaMA has none.
  int position_rows() const {
    return arch == Arch::opt ? max_seq + 2 : arch == Arch::llama ? 0 : max_seq;
  }
  int position_offset() const { return arch == Arch::opt ? 2 : 0; }
  float layernorm_eps() const { return llama() ? float(rms_eps) : 1e-5f; }
};

// A spec from its sizes, in the order a reader expects them.
ModelSpec model_spec(Arch arch, int layers, int hidden, int heads, int ffn_hidden, int vocab,
                     int max_seq);
// A LLaMA spec (untied unless `tie`).
ModelSpec llama_spec(int layers, int hidden, int heads, int kv_heads, int ffn_hidden, int vocab,
                     int max_seq, double rope_theta = 10000.0, double rms_eps = 1e-5,
                     bool tie = false);

// Named presets: gpt2-124m/355m/774m/1.5b, opt-125m/1.3b/2.7b/6.7b/13b/30b/66b/175b, and
// llama2-7b/13b/70b with llama-tiny (a byte-vocabulary model that trains on two cores).
// (opt-350m is absent on purpose: it is post-LN with a 512-wide projected embedding, a different
// model from the rest of the family.)
std::optional<ModelSpec> find_preset(const std::string& name);
std::vector<std::string> preset_names();

// What a parameter is, which decides its initialisation and weight decay by rule.
enum class ParamRole {
  token_embedding,     // tied with the LM head
  position_embedding,
  layernorm_weight,    // initialised to 1, no decay
  layernorm_bias,      // initialised to 0, no decay
  weight,              // matrix, normal(0, 0.02), decayed
  residual_out_weight, // output projection into the residual stream: std 0.02/sqrt(2*layers)
  bias,                // initialised to 0, no decay
  lm_head,             // untied LM head (llama): vocabulary-parallel like the embedding, decayed
};

// This rank's place in a 1D (Megatron) tensor-parallel group: `size` ranks split the attention
// heads, the MLP width and the (padded) vocabulary.
struct TensorSplit {
  int size = 1;
  int rank = 0;
};

// How a rank's local tensor maps into the logical (Hugging Face) one.
struct ParamShard {
  int dim = -1;         // Hugging Face dimension split over the tensor group; -1: replicated
  int parts = 1;        // the split dimension holds `parts` equal blocks, each split alike (q|k|v)
  int64_t padded = 0;   // extent of the split dimension with padding (vocabulary rows)
  bool replicated() const { return dim < 0; }
};

struct ParamSpec {
  std::string name;              // Hugging Face state_dict key
  std::vector<int64_t> shape;    // Hugging Face shape (the logical tensor)
  ParamRole role = ParamRole::weight;
  std::size_t offset = 0;        // element offset into the flat parameter buffer
  std::size_t count = 0;         // number of elements held on this rank
  int unit = 0;                  // parameter unit (see parameter_units)
  std::vector<int64_t> local_shape;  // this rank's part (== shape without tensor parallelism)
  ParamShard shard;              // how local_shape maps into shape
  bool decay() const {
    return role == ParamRole::token_embedding || role == ParamRole::position_embedding ||
           role == ParamRole::weight || role == ParamRole::residual_out_weight ||
           role == ParamRole::lm_head;
  }
  float init_std(int layers) const;
};

// The full logical parameter table, in a fixed order, with offsets into one flat buffer. Every
// tensor starts 16-float aligned. The tensors form `layers + 2` units, each contiguous in the flat
// buffer and padded to a multiple of `unit_multiple` floats (a multiple of 16): unit 0 holds the
// token and position embeddings, unit 1 + l transformer block l, unit layers + 1 the final
// layernorm (and, untied llama, lm_head.weight). ZeRO shards and gathers unit by unit, so units
// are padded to data-parallel size * 16.
//
// LLaMA (Hugging Face LlamaForCausalLM): model.embed_tokens.weight; per layer input_layernorm,
// self_attn.{q,k,v,o}_proj (k/v [kv_heads*hs, hidden]), post_attention_layernorm,
// mlp.{gate,up,down}_proj; model.norm.weight and lm_head.weight unless tied. Under tensor
// parallelism q/k/v, gate and up split their rows (q heads and kv heads alike, so every rank keeps
// whole groups: the tensor size must divide kv_heads), o and down their columns, lm_head its
// padded vocabulary rows.
//
// A pipeline stage holds only its part: the blocks [layer_begin, layer_end), the embedding unit
// when it embeds tokens (first stage) or runs the tied LM head (last stage), and the final
// layernorm when it runs the head. Its units are numbered from 0 in that order. An untied llama
// head stage that does not embed holds no embedding unit.
struct StageRange {
  int layer_begin = 0;
  int layer_end = -1;   // -1: through the last layer
  bool embeds = true;   // embeds tokens (the first stage)
  bool head = true;     // final layernorm, LM head and loss (the last stage)
  bool whole() const { return layer_begin == 0 && layer_end < 0 && embeds && head; }
};
std::vector<ParamSpec> parameter_table(const ModelSpec& spec, std::size_t unit_multiple = 16,
                                       TensorSplit tp = {}, StageRange stage = {});

// Vocabulary rows the model computes with: `vocab` on one rank, padded under tensor parallelism.
int64_t padded_vocab(const ModelSpec& spec, int tensor_size);

// Contiguous runs of a local tensor and where they sit in the logical tensor (element offsets
// within each tensor). Padding (vocabulary rows past the logical size) is in no run.
struct ShardRun {
  std::size_t local, logical, length;
};
std::vector<ShardRun> shard_runs(const ParamSpec& p, int tensor_rank);

// `length` elements from local flat offset `local` to element `logical` of tensor `tensor` (an
// index into the logical table, parameter_table(spec)). A parameter held on several ranks
// (replicated) has a run on each of them; `owned` on the one copy that writes it (checkpoints,
// model files).
struct LogicalRun {
  std::size_t local;
  int tensor;
  std::size_t logical, length;
  bool owned = true;
};
// The runs of a 1D layout's local `table` (a tensor rank's and pipeline stage's parameter_table)
// in `logical`, through shard_runs. Owned unless the tensor is replicated over the tensor group
// and tensor_rank > 0, or it is the tied embedding on a stage that does not embed tokens (the LM
// head's copy). Throws std::invalid_argument naming a tensor that `logical` lacks.
std::vector<LogicalRun> logical_runs(const std::vector<ParamSpec>& table,
                                     const std::vector<ParamSpec>& logical, int tensor_rank,
                                     bool embeds);
// Host copies between a local flat buffer and the logical tensors laid out as `logical` says
// (at their offsets): export copies the runs this rank owns (out elsewhere untouched; summing the
// outputs of every rank of one model copy assembles the whole), import every run.
void export_owned_runs(const std::vector<LogicalRun>& runs, const std::vector<ParamSpec>& logical,
                       const float* local, float* out);
void import_runs(const std::vector<LogicalRun>& runs, const std::vector<ParamSpec>& logical,
                 const float* values, float* local);

// A unit's range [begin, end) of the flat buffer, padding included; units tile [0, flat size).
struct ParamUnit {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
// The units of a table from parameter_table(spec, unit_multiple).
std::vector<ParamUnit> parameter_units(const std::vector<ParamSpec>& table,
                                       std::size_t unit_multiple);
std::size_t parameter_count(const ModelSpec& spec);

// N = 12*L*d^2 + 13*L*d + 2*d + V*d (the non-position parameters of GPT-2; the usual estimate),
// and training FLOPs per token = 6*N + 12*L*T*d (forward + backward, attention included).
// LLaMA: N = L*(2*d^2 + 2*d*kv*hs + 3*d*F + 2*d) + d + V*d (times 2 untied), same 12*L*T*d.
double flops_per_token(const ModelSpec& spec, int seq_len);
// Forward FLOPs per token of one block, 2 * (4*d^2 + 2*d*F) + 4*T*d (its matmuls and
// attention's two T x d products; llama 2 * (2*d^2 + 2*d*kv*hs + 3*d*F) + 4*T*d), and of the
// LM head, 2*d*V: what the pipeline partition
// balances (parallel::balanced_stage_layers, for the trainer and the planner alike).
double block_forward_flops(const ModelSpec& spec, int seq_len);
double head_forward_flops(const ModelSpec& spec);

}  // namespace colossal::core
