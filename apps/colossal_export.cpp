// colossal_export: a model file (model.h5) as a Hugging Face directory that
// GPT2LMHeadModel / OPTForCausalLM.from_pretrained loads with no code (io/hf_export.hpp).
#include <cstdio>
#include <exception>
#include <string>

#include "io/config.hpp"
#include "io/hdf5_file.hpp"
#include "io/hf_export.hpp"
#include "io/safetensors.hpp"

using namespace colossal;

namespace {

const char* kUsage =
    "usage: colossal_export MODEL.h5 --out DIR [--max-shard-size SIZE]\n\n"
    "Writes DIR/config.json (a GPT2Config, OPTConfig or LlamaConfig for the model's arch and\n"
    "sizes, read from the config MODEL.h5 carries) and DIR/model.safetensors with the Hugging Face\n"
    "names and layouts, so that GPT2LMHeadModel / OPTForCausalLM / LlamaForCausalLM\n"
    ".from_pretrained(DIR) load it with no code. Above SIZE of tensor bytes (default 5GB, as\n"
    "Hugging Face; units B, KB, MB, GB, KiB, MiB, GiB) the weights are sharded into\n"
    "model-0000i-of-0000n.safetensors with model.safetensors.index.json. A head tied to the token\n"
    "embedding (GPT-2, OPT; LLaMA with model.tie_embeddings) is written once\n"
    "(tie_word_embeddings: true, no lm_head.weight). colossal_train writes the same into\n"
    "log.dir/hf/ at the end of a run with log.export_hf: true.\n\n"
    "Exit codes: 0 written, 2 bad command line, 3 unreadable model file or unwritable DIR.\n";

int usage_error(const std::string& what) {
  std::fprintf(stderr, "colossal_export: error: %s; see colossal_export --help\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, out, shard = "5GB";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a == "--out" || a == "--max-shard-size") {
      if (i + 1 >= argc) return usage_error(a + " needs a value");
      (a == "--out" ? out : shard) = argv[++i];
    } else if (a.rfind("--", 0) == 0) {
      return usage_error("unknown option '" + a + "' (allowed: --out, --max-shard-size, --help)");
    } else if (model.empty()) {
      model = a;
    } else {
      return usage_error("unexpected argument '" + a + "' (the model file is already '" + model +
                         "')");
    }
  }
  if (model.empty()) return usage_error("no model file given (MODEL.h5, from colossal_train)");
  if (out.empty()) return usage_error("missing --out DIR");
  uint64_t shard_bytes = 0;
  try {
    shard_bytes = io::parse_byte_size(shard);
  } catch (const std::exception& e) {
    return usage_error(std::string("--max-shard-size: ") + e.what());
  }
  try {
    const std::vector<std::string> files = io::export_model_file(model, out, shard_bytes);
    for (const std::string& f : files) std::printf("wrote %s\n", f.c_str());
    return 0;
  } catch (const io::ConfigError& e) {
    std::fprintf(stderr, "colossal_export: error: %s: its config does not read: %s\n",
                 model.c_str(), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "colossal_export: error: %s\n", e.what());
    return 3;
  }
}
