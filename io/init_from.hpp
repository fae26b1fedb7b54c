// model.init_from: starting weights from a file (docs/init-from.md).
//
// The source is a Hugging Face checkpoint (model.safetensors, a sharded
// model.safetensors.index.json, or a directory holding either beside its config.json), our
// model.h5, or a training checkpoint (its /model part). Our logical tensors carry Hugging Face
// names and layouts (GPT-2's Conv1D [in, out], OPT's Linear [out, in] and its position table of
// max_seq + 2 rows), so a tensor maps to the file's tensor of the same name; a file saved from
// the bare GPT2Model / OPTModel (no "transformer." / "model." prefix) maps too.
//
// check_weights (rank 0) validates the whole file against the model before anything is read:
// every tensor present with the expected shape (an error names the tensor, both shapes and the
// config key to change), extras handled as transformers does (the causal-mask buffers
// attn.bias / attn.masked_bias ignored; an lm_head.weight equal to the token embedding accepted,
// since our head is tied; a different one refused), F16/BF16 widened and said so.
// read_weights (every rank) then reads exactly the element runs its layout holds, with pread
// (safetensors) or HDF5 hyperslabs, never the whole file.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/model_spec.hpp"
#include "io/checkpoint.hpp"

namespace colossal::io {

class WeightsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Validates `path` as the starting weights of the model `spec` (whose whole logical table is
// `logical`). Returns the lines to print (what was read, conversions, what was ignored); throws
// WeightsError naming the file, the tensor and the key to change.
std::string check_weights(const std::string& path, const core::ModelSpec& spec,
                          const std::vector<core::ParamSpec>& logical);

// What to change when a file's tensor has shape `found` where the model expects p.shape: the
// config key and value that match the file (set model.vocab: 50257 to match the file), or the
// arch when the rank or the orientation differs.
std::string shape_mismatch_hint(const core::ParamSpec& p, const core::ModelSpec& spec,
                                const std::vector<int64_t>& found);

// Fills every run (a tensor index into `logical`, a row-major element range and its target) from
// `path`. Assumes check_weights passed; throws WeightsError or SafetensorsError / H5Error on a
// read failure.
void read_weights(const std::string& path, const core::ModelSpec& spec,
                  const std::vector<core::ParamSpec>& logical, const std::vector<TensorRun>& runs);

// Float elements this process has read through read_weights (tests check shard-only reads).
uint64_t weights_elements_read();

// model.preset: from_weights: the sizes from a Hugging Face config.json (GPT2Config or
// OPTConfig), beside `path` (a directory, or a file inside one). Throws WeightsError naming the
// config.json key whose value our model does not support.
core::ModelSpec spec_from_hf_config(const std::string& path);

// The config.json that spec_from_hf_config reads for `path` ("" when there is none).
std::string hf_config_path(const std::string& path);

// A LLaMA config.json's settings that no tensor's shape shows (unset: absent there).
struct HfNumerics {
  std::optional<double> rope_theta;  // rope_theta, or transformers 5's rope_parameters.rope_theta
  std::optional<double> rms_eps;     // rms_norm_eps
  // rope_scaling (or rope_parameters) of rope_type llama3: factor, low_freq_factor,
  // high_freq_factor, original_max_position_embeddings; factor 1 when the config.json has none.
  std::optional<double> rope_factor, rope_low_freq_factor, rope_high_freq_factor,
      rope_original_max_seq;
};
// Every one of them, as `spec` has them (a model file's config, to compare with).
HfNumerics numerics_of(const core::ModelSpec& spec);
// Those of the config.json beside `path`; none when there is no config.json or its model_type
// is not llama. Throws WeightsError for a rotary form our model cannot run (a rope_type other
// than default and llama3) or two rope_theta (or rope scaling) values that differ.
HfNumerics hf_llama_numerics(const std::string& path);

// Those of `theirs` that differ from `spec`'s beyond float32 rounding (a float32 1e-5 written out
// is 1e-5): each with our key, config.json's key, and both values.
struct NumericsDifference {
  const char* key;     // model.rope_theta, model.rms_eps, model.rope_factor, ...
  const char* hf_key;  // rope_theta, rms_norm_eps, rope_scaling.factor, ...
  double ours, theirs;
};
std::vector<NumericsDifference> numerics_differences(const core::ModelSpec& spec,
                                                     const HfNumerics& theirs);

}  // namespace colossal::io
