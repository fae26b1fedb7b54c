#include "io/init_from.hpp"

#include <hdf5.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <iomanip>
#include <sstream>
#include <tuple>

#include "io/hdf5_detail.hpp"
#include "io/hdf5_file.hpp"
#include "io/safetensors.hpp"

namespace colossal::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::atomic<uint64_t> g_elements_read{0};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The config key (and the value it would need) that decides dimension `dim` of `p`.
std::string key_for(const core::ParamSpec& p, const core::ModelSpec& s, std::size_t dim,
                    int64_t found) {
  const int64_t want = p.shape[dim];
  auto set = [](const std::string& key, int64_t v) {
    return "set " + key + ": " + std::to_string(v) + " to match the file";
  };
  if ((p.role == core::ParamRole::token_embedding || p.role == core::ParamRole::lm_head) &&
      dim == 0)
    return set("model.vocab", found);
  if (s.llama()) {
    const auto ends = [&](const char* tail) {
      const std::string t(tail);
      return p.name.size() >= t.size() &&
             p.name.compare(p.name.size() - t.size(), t.size(), t) == 0;
    };
    if ((ends("k_proj.weight") || ends("v_proj.weight")) && dim == 0 &&
        found % s.head_dim() == 0)
      return set("model.kv_heads", found / s.head_dim());
    if (((ends("gate_proj.weight") || ends("up_proj.weight")) && dim == 0) ||
        (ends("down_proj.weight") && dim == 1))
      return set("model.ffn_hidden", found);
    return set("model.hidden", found);
  }
  if (p.role == core::ParamRole::position_embedding && dim == 0)
    return set("model.max_seq", found - s.position_offset());
  if (want == s.ffn_hidden && s.ffn_hidden != s.hidden) return set("model.ffn_hidden", found);
  if (want == 3 * int64_t(s.hidden) && found % 3 == 0) return set("model.hidden", found / 3);
  return set("model.hidden", found);
}

enum class Kind { safetensors, model_file, checkpoint };

Kind kind_of(const std::string& path) {
  if (is_safetensors_path(path)) return Kind::safetensors;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw WeightsError("'" + path +
                       "' is a directory without model.safetensors or "
                       "model.safetensors.index.json; give a Hugging Face directory, a "
                       ".safetensors file, a model.h5 or a training checkpoint");
  if (!fs::exists(path, ec))
    throw WeightsError("'" + path + "' does not exist");
  std::ifstream in(path, std::ios::binary);
  char head[29] = {};
  in.read(head, sizeof head);
  if (in.gcount() == 29 && std::memcmp(head, "colossal-checkpoint-integrity", 29) == 0)
    return Kind::checkpoint;
  return Kind::model_file;
}

// Names in a Hugging Face file: ours, or without the "transformer." / "model." prefix of the
// causal-LM wrapper (files saved from GPT2Model / OPTModel, like the published gpt2 weights).
struct NameMap {
  std::string strip;  // the prefix our names carry that the file's do not ("" when alike)
  std::string to_file(const std::string& ours) const {
    return strip.empty() || ours.rfind(strip, 0) != 0 ? ours : ours.substr(strip.size());
  }
};

NameMap name_map(const SafetensorsSet& set, const std::vector<core::ParamSpec>& logical,
                 const core::ModelSpec& spec) {
  const std::string& embed = logical.front().name;
  const std::string prefix = spec.arch == core::Arch::gpt2 ? "transformer." : "model.";
  if (set.has(embed) || !set.has(embed.substr(prefix.size()))) return {};
  return {prefix};
}

}  // namespace

std::string shape_mismatch_hint(const core::ParamSpec& p, const core::ModelSpec& spec,
                                 const std::vector<int64_t>& found) {
  std::string todo;
  if (found.size() != p.shape.size()) {
    todo = "is this a " + std::string(core::arch_name(spec.arch)) + " checkpoint? (model.arch)";
  } else if (found.size() == 2 && found[0] == p.shape[1] && found[1] == p.shape[0]) {
    // No size key makes a matrix its own transpose: the file's layout is another (GPT-2's
    // Conv1D keeps [in, out], OPT's and LLaMA's Linear [out, in]).
    todo = "the file holds it transposed: it was written with another layout (GPT-2's Conv1D "
           "is [in, out], Linear [out, in]); is this a " +
           std::string(core::arch_name(spec.arch)) + " checkpoint? (model.arch)";
  } else {
    for (std::size_t d = 0; d < found.size(); ++d)
      if (found[d] != p.shape[d]) {
        todo = key_for(p, spec, d, found[d]);
        break;
      }
  }
  return todo;
}

namespace {
void check_shape(const std::string& file, const core::ParamSpec& p, const core::ModelSpec& spec,
                 const std::vector<int64_t>& found) {
  if (found == p.shape) return;
  throw WeightsError(file + ": tensor '" + p.name + "' has shape " + shape_text(found) +
                     " but the model expects " + shape_text(p.shape) + "; " +
                     shape_mismatch_hint(p, spec, found));
}

std::string check_safetensors(const std::string& path, const core::ModelSpec& spec,
                              const std::vector<core::ParamSpec>& logical) {
  const SafetensorsSet set(path);
  const NameMap names = name_map(set, logical, spec);
  const std::vector<std::string> all = set.names();
  const bool gpt2 = spec.arch == core::Arch::gpt2;
  const std::string stem = gpt2 ? "h." : "layers.";
  const int file_layers = layers_in(all, stem);
  std::map<std::string, int> converted;  // dtype -> tensors
  std::set<std::string> ours;
  for (const core::ParamSpec& p : logical) {
    const std::string name = names.to_file(p.name);
    ours.insert(name);
    if (!set.has(name)) {
      std::string todo;
      if (file_layers > 0 && file_layers < spec.layers)
        todo = "the file holds " + std::to_string(file_layers) +
               " layers; set model.layers: " + std::to_string(file_layers);
      else if (gpt2 && (set.has("model.decoder.embed_tokens.weight") ||
                        set.has("decoder.embed_tokens.weight")))
        todo = "the file is an OPT checkpoint; set model.arch: opt";
      else if (p.role == core::ParamRole::lm_head)
        todo = "the file has no untied LM head (Hugging Face tie_word_embeddings: true); set "
               "model.tie_embeddings: true";
      else if (!gpt2 && (set.has("transformer.wte.weight") || set.has("wte.weight")))
        todo = "the file is a GPT-2 checkpoint; set model.arch: gpt2";
      else
        todo = "is this a " + std::string(core::arch_name(spec.arch)) +
               " checkpoint of this model? (model.arch, model.layers)";
      throw WeightsError(set.path() + ": tensor '" + name + "' is missing; " + todo);
    }
    const StTensorInfo& info = set.info(name);
    check_shape(set.file_of(name).path(), p, spec, info.shape);
    if (info.dtype != StDtype::F32) ++converted[st_dtype_name(info.dtype)];
  }
  if (file_layers > spec.layers)
    throw WeightsError(set.path() + ": the file holds " + std::to_string(file_layers) +
                       " layers but model.layers is " + std::to_string(spec.layers) +
                       "; set model.layers: " + std::to_string(file_layers));
  int buffers = 0;
  std::string notes;
  for (const std::string& n : all) {
    if (ours.count(n)) continue;
    const auto ends = [&](const std::string& s) {
      return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
    };
    if (gpt2 && (ends(".attn.bias") || ends(".attn.masked_bias"))) {
      ++buffers;  // causal-mask buffers: transformers recomputes them and so do we
      continue;
    }
    if (spec.llama() && ends(".rotary_emb.inv_freq")) {
      ++buffers;  // rotary frequencies: recomputed from rope_theta
      continue;
    }
    if (!gpt2 && (ends("project_in.weight") || ends("project_out.weight")))
      throw WeightsError(set.path() + ": tensor '" + n +
                         "' projects the embedding to another width (OPTConfig "
                         "word_embed_proj_dim != hidden_size, as in opt-350m), which our model "
                         "does not support");
    if (n == "lm_head.weight") {
      const std::string embed = names.to_file(logical.front().name);
      const StTensorInfo& head = set.info(n);
      if (head.shape != logical.front().shape)
        throw WeightsError(set.path() + ": tensor 'lm_head.weight' has shape " +
                           shape_text(head.shape) + " but the tied head is the token embedding " +
                           shape_text(logical.front().shape) +
                           "; our model ties the LM head to the embedding" +
                           (spec.llama() ? std::string(" (model.tie_embeddings)")
                                         : std::string()));
      constexpr uint64_t kChunk = 1 << 16;
      const uint64_t total = head.elements();
      std::vector<float> a(std::min(total, kChunk)), b(a.size());
      for (uint64_t at = 0; at < total; at += kChunk) {
        const uint64_t k = std::min(kChunk, total - at);
        set.read(n, at, k, a.data());
        set.read(embed, at, k, b.data());
        for (uint64_t i = 0; i < k; ++i)
          if (a[i] != b[i])
            throw WeightsError(
                set.path() + ": tensor 'lm_head.weight' differs from '" + embed +
                "' (element " + std::to_string(at + i) + ": " + std::to_string(a[i]) + " vs " +
                std::to_string(b[i]) +
                "); our model ties the LM head to the token embedding, so an untied head "
                "cannot be loaded" +
                (spec.llama() ? std::string(" (set model.tie_embeddings: false to load it)")
                              : std::string()));
      }
      notes += "model.init_from: lm_head.weight equals " + embed +
               ": accepted as the tied head\n";
      continue;
    }
    throw WeightsError(set.path() + ": tensor '" + n + "' has no place in the " +
                       core::arch_name(spec.arch) +
                       " model (model.arch, model.layers); a different architecture?");
  }
  std::string out = "model.init_from: " + std::to_string(logical.size()) + " tensors from " +
                    set.path() + (names.strip.empty() ? "" : " (names without '" + names.strip +
                                                                 "')") + "\n";
  for (const auto& [dtype, count] : converted)
    out += "model.init_from: converted " + std::to_string(count) + " " + dtype +
           " tensors to fp32\n";
  if (buffers > 0)
    out += "model.init_from: ignored " + std::to_string(buffers) +
           (spec.llama() ? " rotary buffers (rotary_emb.inv_freq), recomputed from rope_theta\n"
                         : " causal-mask buffers (attn.bias, attn.masked_bias), as transformers "
                           "does\n");
  return out + notes;
}

struct H5Source {
  H5Handle file;
  std::string prefix;  // "/model/" in a training checkpoint, "" in model.h5
};

H5Source open_h5(const std::string& path, Kind kind) {
  detail::silence_hdf5_errors();
  H5Source s{H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                      "opening '" + path + "' (not a safetensors, model.h5 or checkpoint file?)"),
             kind == Kind::checkpoint ? "/model/" : ""};
  if (kind == Kind::model_file &&
      detail::read_string_attribute(s.file.get(), "format") == "colossal-checkpoint")
    s.prefix = "/model/";  // a format-1 checkpoint (no integrity header)
  return s;
}

std::vector<int64_t> dataset_shape(hid_t dset) {
  H5Handle space(H5Dget_space(dset), H5Sclose, "H5Dget_space");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

std::string check_h5(const std::string& path, Kind kind, const core::ModelSpec& spec,
                     const std::vector<core::ParamSpec>& logical) {
  if (kind == Kind::checkpoint) verify_checkpoint_integrity(path);
  H5Source s = open_h5(path, kind);
  for (const core::ParamSpec& p : logical) {
    const std::string name = s.prefix + p.name;
    if (H5Lexists(s.file.get(), s.prefix.empty() ? p.name.c_str() : "/model", H5P_DEFAULT) <= 0 ||
        H5Lexists(s.file.get(), name.c_str(), H5P_DEFAULT) <= 0)
      throw WeightsError(path + ": tensor '" + p.name +
                         "' is missing; was it saved from another model? (model.arch, "
                         "model.layers)");
    H5Handle dset(H5Dopen2(s.file.get(), name.c_str(), H5P_DEFAULT), H5Dclose,
                  "opening dataset " + name);
    check_shape(path, p, spec, dataset_shape(dset.get()));
  }
  // No tensor beyond the model's (a file of more layers would otherwise load its first ones).
  std::vector<std::string> in_file;
  if (s.prefix.empty()) {
    in_file = detail::datasets_in(s.file.get());
  } else {
    const H5Handle group(H5Gopen2(s.file.get(), "/model", H5P_DEFAULT), H5Gclose,
                         "opening /model in '" + path + "'");
    in_file = detail::datasets_in(group.get());
  }
  const std::string extra = unexpected_tensors(in_file, logical);
  if (!extra.empty()) throw WeightsError(path + ": " + extra);
  return "model.init_from: " + std::to_string(logical.size()) + " tensors from " + path +
         (s.prefix.empty() ? "" : " (the checkpoint's model part)") + "\n";
}

}  // namespace

std::string check_weights(const std::string& path, const core::ModelSpec& spec,
                          const std::vector<core::ParamSpec>& logical) {
  const Kind kind = kind_of(path);
  if (kind != Kind::safetensors) return check_h5(path, kind, spec, logical);
  std::string notes = check_safetensors(path, spec, logical);
  // The config takes these from config.json unless it sets them (io::parse_config): say where
  // they differ, so a deliberate change (a longer context's rotary base) is seen as one.
  if (!spec.llama()) return notes;
  for (const NumericsDifference& d : numerics_differences(spec, hf_llama_numerics(path))) {
    std::ostringstream line;
    line << std::setprecision(9) << "note: " << d.key << " " << d.ours
         << " (set in the config) differs from config.json's " << d.hf_key << " " << d.theirs
         << "\n";
    notes += line.str();
  }
  return notes;
}

void read_weights(const std::string& path, const core::ModelSpec& spec,
                  const std::vector<core::ParamSpec>& logical, const std::vector<TensorRun>& runs) {
  const Kind kind = kind_of(path);
  if (kind == Kind::safetensors) {
    const SafetensorsSet set(path);
    const NameMap names = name_map(set, logical, spec);
    for (const TensorRun& r : runs) {
      set.read(names.to_file(logical.at(r.tensor).name), r.logical, r.length, r.data);
      g_elements_read += r.length;
    }
    return;
  }
  H5Source s = open_h5(path, kind);
  for (const TensorRun& r : runs) {
    const core::ParamSpec& p = logical.at(r.tensor);
    const std::string name = s.prefix + p.name;
    H5Handle dset(H5Dopen2(s.file.get(), name.c_str(), H5P_DEFAULT), H5Dclose,
                  "opening dataset " + name + " in '" + path + "'");
    std::vector<hsize_t> dims(p.shape.begin(), p.shape.end());
    H5Handle space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose,
                   "H5Screate_simple");
    bool first = true;
    for (const SelectionBlock& b : selection_blocks(p.shape, {r})) {
      std::vector<hsize_t> start{b.row, b.col}, count{b.rows, b.cols};
      if (dims.size() == 1) {
        start = {b.col};
        count = {b.cols};
      }
      detail::check(H5Sselect_hyperslab(space.get(), first ? H5S_SELECT_SET : H5S_SELECT_OR,
                                        start.data(), nullptr, count.data(), nullptr),
                    "selecting elements of " + name);
      first = false;
    }
    const hsize_t n = r.length;
    H5Handle mem(H5Screate_simple(1, &n, nullptr), H5Sclose, "H5Screate_simple");
    detail::check(H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT,
                          r.data),
                  "reading " + name + " from '" + path + "'");
    g_elements_read += r.length;
  }
}

uint64_t weights_elements_read() { return g_elements_read.load(); }

// --- config.json ---------------------------------------------------------------------------------

std::string hf_config_path(const std::string& path) {
  std::error_code ec;
  fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const fs::path p = dir / "config.json";
  return fs::exists(p, ec) ? p.string() : "";
}

namespace {

json read_config_json(const std::string& file) {
  std::ifstream in(file);
  json c;
  try {
    c = json::parse(in);
  } catch (const json::parse_error& e) {
    throw WeightsError(file + ": not well-formed JSON: " + e.what());
  }
  if (!c.is_object()) throw WeightsError(file + ": not a JSON object");
  return c;
}

// LlamaConfig's rotary and RMSNorm settings, which no tensor's shape shows, and the rotary forms
// our model cannot run (refused).
HfNumerics llama_numerics(const json& c, const std::string& file) {
  const auto fail = [&](const std::string& key, const std::string& why) -> WeightsError {
    return WeightsError(file + ": " + key + ": " + why);
  };
  const auto number = [&](const json& in, const std::string& key,
                          const std::string& name) -> std::optional<double> {
    if (!in.contains(key) || in[key].is_null()) return std::nullopt;
    if (!in[key].is_number() || !(in[key].get<double>() > 0.0))
      throw fail(name, "is " + in[key].dump() + ", not a positive number");
    return in[key].get<double>();
  };
  HfNumerics n;
  n.rms_eps = number(c, "rms_norm_eps", "rms_norm_eps");
  n.rope_theta = number(c, "rope_theta", "rope_theta");
  // The rotary form: rope_scaling (transformers 4) or rope_parameters (transformers 5, which
  // also holds rope_theta there), of rope_type default (none) or llama3 (Llama 3.1 and later):
  // its four numbers, factor 1 for none. save_pretrained writes one of the two; with both,
  // transformers 5 reads rope_scaling in place of rope_parameters and 4 ignores rope_parameters,
  // so a config.json holding both is refused.
  using Scaling = std::array<std::optional<double>, 4>;
  const Scaling none = {1.0, std::nullopt, std::nullopt, std::nullopt};
  const auto scaling_of = [&](const json& in, const std::string& name) -> Scaling {
    if (!in.is_object()) throw fail(name, "is " + in.dump() + ", not an object");
    const std::string type = in.contains("rope_type") ? in["rope_type"].dump()
                             : in.contains("type")    ? in["type"].dump()
                                                      : "\"default\"";
    if (type == "\"default\"") return none;
    if (type != "\"llama3\"")
      throw fail(name, "is " + in.dump() + "; our rotary embedding supports rope_type default "
                                           "and llama3");
    Scaling s = {number(in, "factor", name + ".factor"),
                 number(in, "low_freq_factor", name + ".low_freq_factor"),
                 number(in, "high_freq_factor", name + ".high_freq_factor"),
                 number(in, "original_max_position_embeddings",
                        name + ".original_max_position_embeddings")};
    for (const auto& v : s) {
      if (!v) throw fail(name, "is " + in.dump() + "; rope_type llama3 needs factor, "
                                                   "low_freq_factor, high_freq_factor and "
                                                   "original_max_position_embeddings");
    }
    if (*s[0] < 1.0)
      throw fail(name + ".factor", "is " + in["factor"].dump() +
                                       "; llama3 scaling stretches the context (factor >= 1)");
    if (*s[0] != 1.0 && !(*s[1] < *s[2]))
      throw fail(name + ".low_freq_factor",
                 "is " + in["low_freq_factor"].dump() + ", not below high_freq_factor " +
                     in["high_freq_factor"].dump());
    const json& original = in["original_max_position_embeddings"];
    if (!original.is_number_integer() || *s[3] > double(1 << 30))
      throw fail(name + ".original_max_position_embeddings",
                 "is " + original.dump() + ", not a whole number of positions (1 to 2^30)");
    return s;
  };
  const auto present = [&](const char* key) {
    return c.contains(key) && !c[key].is_null() && !(c[key].is_object() && c[key].empty());
  };
  Scaling scaling = none;
  if (present("rope_scaling") && present("rope_parameters"))
    throw fail("rope_scaling", "and rope_parameters are both set (" + c["rope_scaling"].dump() +
                                   ", " + c["rope_parameters"].dump() +
                                   "); transformers 5 reads rope_scaling in place of "
                                   "rope_parameters, older versions only rope_scaling: keep one");
  if (present("rope_scaling")) {
    const json& rs = c["rope_scaling"];
    scaling = scaling_of(rs, "rope_scaling");
    // transformers 5 takes a rope_theta there over the top-level one; older versions ignore it.
    const std::optional<double> inner = number(rs, "rope_theta", "rope_scaling.rope_theta");
    if (inner && (!n.rope_theta || *inner != *n.rope_theta))
      throw fail("rope_scaling.rope_theta",
                 "is " + rs["rope_theta"].dump() + " but rope_theta is " +
                     (n.rope_theta ? c["rope_theta"].dump() : std::string("unset")) +
                     "; transformers 5 reads the first, older versions the second: keep one");
  }
  // transformers 5 folds rope_theta into rope_parameters (and reads it from there).
  if (present("rope_parameters")) {
    const json& rp = c["rope_parameters"];
    scaling = scaling_of(rp, "rope_parameters");
    const std::optional<double> inner = number(rp, "rope_theta", "rope_parameters.rope_theta");
    if (inner && n.rope_theta && *inner != *n.rope_theta)
      throw fail("rope_parameters.rope_theta",
                 "is " + rp["rope_theta"].dump() + " but rope_theta is " + c["rope_theta"].dump() +
                     "; transformers 5 reads rope_parameters, older versions rope_theta: keep one");
    if (inner) n.rope_theta = inner;
  }
  n.rope_factor = scaling[0];
  n.rope_low_freq_factor = scaling[1];
  n.rope_high_freq_factor = scaling[2];
  n.rope_original_max_seq = scaling[3];
  return n;
}

}  // namespace

std::vector<NumericsDifference> numerics_differences(const core::ModelSpec& spec,
                                                     const HfNumerics& theirs) {
  std::vector<NumericsDifference> out;
  const core::RopeScaling& r = spec.rope_scaling;
  const bool scaled = r.scaled() || (theirs.rope_factor && *theirs.rope_factor != 1.0);
  for (const auto& [key, hf_key, ours, value, applies] :
       {std::tuple{"model.rope_theta", "rope_theta", spec.rope_theta, theirs.rope_theta, true},
        std::tuple{"model.rms_eps", "rms_norm_eps", spec.rms_eps, theirs.rms_eps, true},
        std::tuple{"model.rope_factor", "rope_scaling.factor", r.factor, theirs.rope_factor,
                   true},
        // The other three mean nothing unscaled.
        std::tuple{"model.rope_low_freq_factor", "rope_scaling.low_freq_factor",
                   r.low_freq_factor, theirs.rope_low_freq_factor, scaled},
        std::tuple{"model.rope_high_freq_factor", "rope_scaling.high_freq_factor",
                   r.high_freq_factor, theirs.rope_high_freq_factor, scaled},
        std::tuple{"model.rope_original_max_seq", "rope_scaling.original_max_position_embeddings",
                   double(r.original_max_seq), theirs.rope_original_max_seq, scaled}}) {
    if (applies && value && std::abs(*value - ours) > 1e-6 * std::abs(ours))
      out.push_back({key, hf_key, ours, *value});
  }
  return out;
}

HfNumerics numerics_of(const core::ModelSpec& spec) {
  const core::RopeScaling& r = spec.rope_scaling;
  return HfNumerics{spec.rope_theta,      spec.rms_eps,         r.factor,
                    r.low_freq_factor,    r.high_freq_factor,   double(r.original_max_seq)};
}

HfNumerics hf_llama_numerics(const std::string& path) {
  const std::string file = hf_config_path(path);
  if (file.empty()) return {};
  const json c = read_config_json(file);
  if (c.contains("model_type") && c["model_type"] != "llama") return {};
  return llama_numerics(c, file);
}

core::ModelSpec spec_from_hf_config(const std::string& path) {
  const std::string file = hf_config_path(path);
  if (file.empty())
    throw WeightsError("no config.json beside '" + path +
                       "' (model.preset: from_weights reads the sizes from it); give "
                       "model.init_from a Hugging Face directory, or set the sizes and drop "
                       "model.preset");
  const json c = read_config_json(file);
  const auto fail = [&](const std::string& key, const std::string& why) -> WeightsError {
    return WeightsError(file + ": " + key + ": " + why);
  };
  // An integer key, transformers' default when absent (save_pretrained may leave defaults out).
  const auto integer = [&](const std::string& key, std::optional<int64_t> fallback) -> int {
    if (!c.contains(key) || c[key].is_null()) {
      if (!fallback) throw fail(key, "missing");
      return int(*fallback);
    }
    if (!c[key].is_number_integer() || c[key].get<int64_t>() < 1 ||
        c[key].get<int64_t>() > (1 << 30))
      throw fail(key, "is " + c[key].dump() + ", not a positive integer");
    return int(c[key].get<int64_t>());
  };
  const auto text = [&](const std::string& key, const std::string& fallback) {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    if (!c[key].is_string()) throw fail(key, "is " + c[key].dump() + ", not a string");
    return c[key].get<std::string>();
  };
  const auto flag_must_be = [&](const std::string& key, bool want, const std::string& why) {
    if (!c.contains(key) || c[key].is_null()) return;
    if (!c[key].is_boolean() || c[key].get<bool>() != want)
      throw fail(key, "is " + c[key].dump() + "; our model supports only " +
                          (want ? "true" : "false") + " (" + why + ")");
  };
  const std::string type = text("model_type", "");
  core::ModelSpec s;
  if (type == "gpt2") {
    s.arch = core::Arch::gpt2;
    s.hidden = integer("n_embd", 768);
    s.layers = integer("n_layer", 12);
    s.heads = integer("n_head", 12);
    s.max_seq = integer("n_positions", 1024);
    s.vocab = integer("vocab_size", 50257);
    s.ffn_hidden = integer("n_inner", 4 * int64_t(s.hidden));
    const std::string act = text("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      throw fail("activation_function", "is '" + act +
                                            "'; our GPT-2 computes the tanh GELU (gelu_new, "
                                            "gelu_pytorch_tanh)");
    if (c.contains("layer_norm_epsilon") && c["layer_norm_epsilon"].is_number()) {
      const double eps = c["layer_norm_epsilon"].get<double>();
      if (std::abs(eps - s.layernorm_eps()) > 1e-12)
        throw fail("layer_norm_epsilon", "is " + c["layer_norm_epsilon"].dump() +
                                             "; our layernorm uses 1e-05");
    }
    flag_must_be("scale_attn_weights", true, "attention scores scaled by 1/sqrt(head_dim)");
    flag_must_be("scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
    flag_must_be("add_cross_attention", false, "a decoder-only model");
  } else if (type == "opt") {
    s.arch = core::Arch::opt;
    s.hidden = integer("hidden_size", 768);
    s.layers = integer("num_hidden_layers", 12);
    s.heads = integer("num_attention_heads", 12);
    s.ffn_hidden = integer("ffn_dim", 3072);
    s.max_seq = integer("max_position_embeddings", 2048);
    s.vocab = integer("vocab_size", 50272);
    const int proj = integer("word_embed_proj_dim", s.hidden);
    if (proj != s.hidden)
      throw fail("word_embed_proj_dim", "is " + std::to_string(proj) + " but hidden_size is " +
                                            std::to_string(s.hidden) +
                                            "; our OPT has no project_in/project_out");
    const std::string act = text("activation_function", "relu");
    if (act != "relu")
      throw fail("activation_function", "is '" + act + "'; our OPT computes relu");
    flag_must_be("do_layer_norm_before", true, "pre-LN blocks");
    flag_must_be("enable_bias", true, "linear layers with biases");
    flag_must_be("layer_norm_elementwise_affine", true, "layernorms with weight and bias");
    flag_must_be("_remove_final_layer_norm", false, "the final layernorm");
  } else if (type == "llama") {
    s.arch = core::Arch::llama;
    // The sizes have no default: LlamaConfig's are a 7B model's, which a file missing them (or a
    // GPT-2 or OPT config.json labelled llama) is not. save_pretrained always writes them.
    s.hidden = integer("hidden_size", std::nullopt);
    s.layers = integer("num_hidden_layers", std::nullopt);
    s.heads = integer("num_attention_heads", std::nullopt);
    s.kv_heads = integer("num_key_value_heads", s.heads);
    s.ffn_hidden = integer("intermediate_size", std::nullopt);
    s.max_seq = integer("max_position_embeddings", 2048);
    s.vocab = integer("vocab_size", std::nullopt);
    const HfNumerics numerics = llama_numerics(c, file);
    s.rms_eps = numerics.rms_eps.value_or(1e-6);
    s.rope_theta = numerics.rope_theta.value_or(10000.0);
    if (numerics.rope_factor && *numerics.rope_factor != 1.0) {
      s.rope_scaling = core::RopeScaling{*numerics.rope_factor, *numerics.rope_low_freq_factor,
                                         *numerics.rope_high_freq_factor,
                                         int(*numerics.rope_original_max_seq)};
    }
    if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_null()) {
      if (!c["tie_word_embeddings"].is_boolean())
        throw fail("tie_word_embeddings", "is " + c["tie_word_embeddings"].dump() +
                                              ", not true or false");
      s.tie_embeddings = c["tie_word_embeddings"].get<bool>();
    }
    const std::string act = text("hidden_act", "silu");
    if (act != "silu")
      throw fail("hidden_act", "is '" + act + "'; our LLaMA MLP computes SwiGLU (silu)");
    flag_must_be("attention_bias", false, "q/k/v/o projections without biases");
    flag_must_be("mlp_bias", false, "gate/up/down projections without biases");
    if (s.hidden % s.heads == 0) {
      const int head_dim = integer("head_dim", s.hidden / s.heads);
      if (head_dim != s.hidden / s.heads)
        throw fail("head_dim", "is " + std::to_string(head_dim) + "; our LLaMA's head size is "
                                   "hidden_size / num_attention_heads = " +
                                   std::to_string(s.hidden / s.heads));
    }
    if (s.heads % s.kv_heads != 0)
      throw fail("num_key_value_heads", "is " + std::to_string(s.kv_heads) +
                                            ", which does not divide num_attention_heads " +
                                            std::to_string(s.heads));
  } else {
    throw fail("model_type",
               "is '" + type + "'; model.preset: from_weights reads gpt2, opt and llama");
  }
  if (s.hidden % s.heads != 0)
    throw WeightsError(file + ": hidden size " + std::to_string(s.hidden) +
                       " is not divisible by the " + std::to_string(s.heads) + " heads");
  return s;
}

}  // namespace colossal::io
