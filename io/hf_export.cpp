#include "io/hf_export.hpp"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/config.hpp"
#include "io/hdf5_detail.hpp"
#include "io/hdf5_file.hpp"
#include "io/safetensors.hpp"

namespace colossal::io {

std::string hf_config_json(const core::ModelSpec& s) {
  using nlohmann::ordered_json;
  ordered_json j;
  if (s.arch == core::Arch::gpt2) {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = s.vocab;
    j["n_positions"] = s.max_seq;
    j["n_ctx"] = s.max_seq;
    j["n_embd"] = s.hidden;
    j["n_layer"] = s.layers;
    j["n_head"] = s.heads;
    j["n_inner"] = s.ffn_hidden;
    j["activation_function"] = "gelu_new";  // GELU, tanh approximation
    j["layer_norm_epsilon"] = 1e-5;  // layernorm_eps()'s, written as 1e-5, not its float's double
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = true;
    // GPT-2's <|endoftext|>, where the vocabulary has it.
    if (s.vocab > 50256) {
      j["bos_token_id"] = 50256;
      j["eos_token_id"] = 50256;
    } else {
      j["bos_token_id"] = nullptr;
      j["eos_token_id"] = nullptr;
    }
  } else if (s.llama()) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = s.vocab;
    j["max_position_embeddings"] = s.max_seq;
    j["hidden_size"] = s.hidden;
    j["intermediate_size"] = s.ffn_hidden;
    j["num_hidden_layers"] = s.layers;
    j["num_attention_heads"] = s.heads;
    j["num_key_value_heads"] = s.key_value_heads();
    j["head_dim"] = s.head_dim();
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = s.rms_eps;
    j["rope_theta"] = s.rope_theta;
    // Llama 3's scaling as transformers 4 writes it (transformers 5 reads it too).
    const core::RopeScaling& r = s.rope_scaling;
    if (r.scaled()) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_max_seq}};
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["pretraining_tp"] = 1;
    // Our byte and llama-2 vocabularies carry no special-token ids of their own.
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
  } else {
    j["architectures"] = {"OPTForCausalLM"};
    j["model_type"] = "opt";
    j["vocab_size"] = s.vocab;
    j["max_position_embeddings"] = s.max_seq;  // the table holds max_seq + 2 rows (offset 2)
    j["hidden_size"] = s.hidden;
    j["word_embed_proj_dim"] = s.hidden;
    j["num_hidden_layers"] = s.layers;
    j["num_attention_heads"] = s.heads;
    j["ffn_dim"] = s.ffn_hidden;
    j["activation_function"] = "relu";
    j["do_layer_norm_before"] = true;  // pre-LN, as every OPT but opt-350m
    j["_remove_final_layer_norm"] = false;
    j["enable_bias"] = true;
    j["layer_norm_elementwise_affine"] = true;
    j["dropout"] = 0.0;
    j["attention_dropout"] = 0.0;
    j["activation_dropout"] = 0.0;
    j["layerdrop"] = 0.0;
    j["init_std"] = 0.02;
    if (s.vocab > 2) {  // OPT's special tokens: <pad> 1, </s> 2
      j["pad_token_id"] = 1;
      j["bos_token_id"] = 2;
      j["eos_token_id"] = 2;
    }
  }
  j["tie_word_embeddings"] = s.tied();
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

std::vector<std::string> write_hf_dir(const std::string& dir, const core::ModelSpec& spec,
                                      const std::vector<core::ParamSpec>& table,
                                      const std::vector<float>& values, uint64_t shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw SafetensorsError("cannot create '" + dir + "': " + ec.message());
  std::vector<StTensorOut> tensors;
  for (const core::ParamSpec& p : table) {
    if (p.offset + p.count > values.size()) {
      throw std::invalid_argument("write_hf_dir: " + p.name + " lies outside the values");
    }
    tensors.push_back({p.name, p.shape, values.data() + p.offset});
  }
  // transformers refuses safetensors whose metadata does not name the framework.
  std::vector<std::string> files =
      write_safetensors_dir(dir, tensors, shard_bytes, {{"format", "pt"}});
  const std::string config_path = dir + "/config.json";
  const std::string tmp = config_path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!(out << hf_config_json(spec))) {
      throw SafetensorsError("cannot write '" + tmp + "': " + std::strerror(errno));
    }
  }
  std::filesystem::rename(tmp, config_path, ec);
  if (ec) throw SafetensorsError("cannot rename '" + tmp + "': " + ec.message());
  files.push_back(config_path);
  return files;
}

std::vector<std::string> export_model_file(const std::string& model_path, const std::string& dir,
                                           uint64_t shard_bytes) {
  // The model is the one the file says it holds: its config text, read before the tensors.
  std::string config_text;
  {
    detail::silence_hdf5_errors();
    if (!std::filesystem::is_regular_file(model_path)) {
      throw H5Error("model file '" + model_path + "' does not exist");
    }
    H5Handle file(H5Fopen(model_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                  "opening '" + model_path + "' (not an HDF5 file?)");
    if (H5Aexists(file.get(), "config") <= 0) {
      throw H5Error("'" + model_path + "' has no config attribute: not a colossal model file "
                    "(model.h5 written by colossal_train)");
    }
    config_text = detail::read_string_attribute(file.get(), "config");
  }
  const Config config =
      parse_config(config_text, model_path + " (config)", {},
                   ParseOptions{.require_data = false, .stored = true});
  const std::vector<core::ParamSpec> table = core::parameter_table(config.model);
  std::vector<float> values(core::parameter_units(table, 16).back().end, 0.0f);
  read_model_file(model_path, table, values);
  return write_hf_dir(dir, config.model, table, values, shard_bytes);
}

uint64_t parse_byte_size(const std::string& text) {
  std::size_t used = 0;
  double number = 0.0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, double> units[] = {
      {"", 1.0},      {"B", 1.0},           {"KB", 1e3},          {"MB", 1e6},
      {"GB", 1e9},    {"TB", 1e12},         {"KIB", 1024.0},      {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  if (used > 0 && number > 0.0) {
    for (const auto& [name, scale] : units) {
      if (unit == name) return uint64_t(number * scale);
    }
  }
  throw std::invalid_argument("'" + text + "' is not a size (a positive number with an optional "
                              "unit: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; e.g. 5GB)");
}

}  // namespace colossal::io
