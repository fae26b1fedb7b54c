// Hugging Face export: a directory that transformers' from_pretrained loads with no code, i.e.
// config.json (a GPT2Config for GPT2LMHeadModel, or an OPTConfig for OPTForCausalLM) and
// model.safetensors (sharded above a size, with model.safetensors.index.json). Our logical
// tensors already carry the Hugging Face names and layouts (GPT-2 Conv1D [in, out], OPT Linear
// [out, in], OPT positions with offset 2): they are written as they are, F32. The LM head is tied
// to the token embedding, as config.json says (tie_word_embeddings), so no lm_head.weight is
// written, as save_pretrained does. Docs: docs/hf-export.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/model_spec.hpp"

namespace colossal::io {

// Hugging Face's default max_shard_size.
constexpr uint64_t kDefaultHfShardBytes = 5'000'000'000ull;

// config.json for `spec`: every size, the activation (gelu_new / relu), layernorm epsilon, the
// tied head, no dropout (our models train without it).
std::string hf_config_json(const core::ModelSpec& spec);

// Writes DIR/config.json and the safetensors of `values` (laid out as `table`, a one-rank
// parameter_table of `spec`); shards above `shard_bytes` (0: one file). Returns the files written.
std::vector<std::string> write_hf_dir(const std::string& dir, const core::ModelSpec& spec,
                                      const std::vector<core::ParamSpec>& table,
                                      const std::vector<float>& values, uint64_t shard_bytes);

// A model file (model.h5, apps/trainer.hpp's save_weights) exported to DIR: its model from the
// config text the file carries. Throws H5Error / SafetensorsError / ConfigError naming the file.
std::vector<std::string> export_model_file(const std::string& model_path, const std::string& dir,
                                           uint64_t shard_bytes);

// "5GB", "200MB", "64KiB", "1000": bytes (decimal KB/MB/GB as Hugging Face counts; KiB/MiB/GiB
// binary). nullopt-like: throws std::invalid_argument naming the text.
uint64_t parse_byte_size(const std::string& text);

}  // namespace colossal::io
