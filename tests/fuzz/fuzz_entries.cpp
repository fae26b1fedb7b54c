#include "tests/fuzz/fuzz_entries.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/model_spec.hpp"
#include "io/checkpoint.hpp"
#include "io/config.hpp"
#include "io/hdf5_file.hpp"

namespace colossal::fuzz {

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

std::string config_input(const uint8_t* data, std::size_t size) {
  // YAML text up to the first NUL; each later NUL-separated part is one --set override.
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const std::size_t nul = input.find('\0', start);
    parts.push_back(input.substr(start, nul == std::string::npos ? nul : nul - start));
    if (nul == std::string::npos || parts.size() > 8) break;
    start = nul + 1;
  }
  const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
  io::Config config;
  try {
    config = io::parse_config(parts.front(), "fuzz.yaml", overrides);
  } catch (const io::ConfigError& e) {
    // "<file>:<line>:<column>: <key>: <what>" or "--set '<override>': <key>: <what>".
    const std::string message = e.what();
    if (!starts_with(message, "fuzz.yaml") && !starts_with(message, "--set '")) {
      fail("config error does not say where: " + message);
    }
    return message;
  }
  // What was accepted is written back as YAML (config.yaml beside the metrics, the checkpoint's
  // config attribute) and must read back as the same config.
  io::Config again;
  try {
    again = io::parse_config(config.text, "resolved.yaml");
  } catch (const io::ConfigError& e) {
    fail(std::string("the resolved config does not parse again: ") + e.what() + "\n" + config.text);
  }
  if (again.text != config.text) {
    fail("to_yaml round trip changed the config:\n" + config.text + "---\n" + again.text);
  }
  if (!io::changed_keys(config.text, again.text).empty()) {
    fail("changed_keys reports differences between identical configs");
  }
  return "accepted";
}

namespace {

// The model every checkpoint seed was written for (tests/fuzz/make_checkpoint_seeds.sh).
const io::Config& reference_config() {
  static const io::Config config = io::parse_config(
      "model: {arch: gpt2, layers: 1, hidden: 8, heads: 2, ffn_hidden: 16, vocab: 16, max_seq: 8,"
      " vocab_multiple: 1}\n"
      "data: {path: tokens.bin}\n"
      "train: {steps: 2, seq_len: 8, global_batch: 2, micro_batch: 1}\n",
      "fuzz-reference.yaml");
  return config;
}

// One file per process, removed at exit.
struct ScratchFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("colossal-fuzz-" + std::to_string(::getpid()) + ".h5"))
                         .string();
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

}  // namespace

std::string checkpoint_input(const uint8_t* data, std::size_t size) {
  static ScratchFile scratch;
  const std::string& path = scratch.path;
  std::vector<uint8_t> bytes(data, data + size);
  // COLOSSAL_FUZZ_CHECKPOINT_REHEADER=1: give every input a valid integrity header, so that what
  // follows it reaches HDF5 and our reading code (see README.md: crashes inside libhdf5 are
  // expected there, and are what the header keeps out of resume).
  static const bool reheader = std::getenv("COLOSSAL_FUZZ_CHECKPOINT_REHEADER") != nullptr;
  if (reheader && bytes.size() >= io::kCheckpointUserBlock) {
    const std::size_t rest = bytes.size() - io::kCheckpointUserBlock;
    char header[io::kCheckpointUserBlock] = {};
    std::snprintf(header, sizeof(header), "colossal-checkpoint-integrity 1\nhdf5-bytes %zu\ncrc32 %08x\n",
                  rest, unsigned(io::crc32(bytes.data() + io::kCheckpointUserBlock, rest)));
    std::copy(header, header + sizeof(header), bytes.begin());
  }
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) fail("cannot write the scratch file " + path);
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      fail("short write to " + path);
    }
    std::fclose(f);
  }
  const io::Config& reference = reference_config();
  const auto table = core::parameter_table(reference.model);
  const std::size_t floats = core::parameter_units(table, 16).back().end;
  std::vector<float> params(floats), m(floats), v(floats);
  try {
    // As apps::Trainer::resume on rank 0: the whole-file checksum and the config first (a
    // checkpoint of another model is refused before its tensors are read), then every tensor with
    // its shape and checksum.
    const std::string written = io::read_checkpoint_config(path);
    for (const std::string& key : io::changed_keys(written, reference.text)) {
      if (starts_with(key, "model.")) return "another model (" + key + " differs)";
    }
    io::read_checkpoint(path, table, params, m, v, /*verify=*/false);  // checked just above
    return "accepted";
  } catch (const io::H5Error& e) {
    const std::string message = e.what();
    if (message.find(path) == std::string::npos) {
      fail("checkpoint error does not name the file: " + message);
    }
    return message;
  }
}

}  // namespace colossal::fuzz
