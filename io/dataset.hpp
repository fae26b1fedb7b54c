// Token data: a raw text file (each byte is a token, vocabulary 256) or a token file in the llm.c
// layout: a header of 256 int32 (magic, version, token count), then the tokens: uint16 for
// GPT-2-sized vocabularies (magic 20240520, version 1), uint32 for larger ones such as Llama 3's
// 128256 (llm.c's "llama-3" files: magic 20240801, version 7).
// Files are memory-mapped, so a multi-gigabyte corpus costs only the pages a run touches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::io {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TokenFile {
 public:
  enum class Format { raw_bytes, llmc_uint16, llmc_uint32 };
  static constexpr int32_t kLlmcMagic = 20240520;
  static constexpr int32_t kLlmcVersion = 1;
  static constexpr int32_t kLlmcMagic32 = 20240801;
  static constexpr int32_t kLlmcVersion32 = 7;

  // `key` names the config key the path came from (for messages, e.g. "data.path").
  TokenFile(const std::string& path, const std::string& key);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  std::size_t size() const { return count_; }
  Format format() const { return format_; }
  const std::string& path() const { return path_; }
  uint32_t operator[](std::size_t i) const {
    return format_ == Format::raw_bytes     ? tokens8_[i]
           : format_ == Format::llmc_uint16 ? tokens16_[i]
                                            : tokens32_[i];
  }
  uint32_t max_token() const;
  // Throws DataError unless every token is below `vocab` and the file holds at least `min_tokens`.
  void check(int vocab, std::size_t min_tokens, const std::string& why) const;

 private:
  std::string path_, key_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  Format format_ = Format::raw_bytes;
  const uint8_t* tokens8_ = nullptr;
  const uint16_t* tokens16_ = nullptr;
  const uint32_t* tokens32_ = nullptr;
  std::size_t count_ = 0;
};

// The training sampler: window starts are a pure function of (seed, step, global sample index), so
// the global batch is the same whatever the process count or layout.
class TrainSampler {
 public:
  TrainSampler(const TokenFile& data, int seq_len, uint64_t seed);
  // Fills inputs/targets (count sequences of seq_len, row-major) for samples
  // [first_sample, first_sample + count) of optimizer step `step`.
  void batch(int64_t step, int64_t first_sample, int count, int global_batch, int32_t* inputs,
             int32_t* targets) const;
  std::size_t window_start(int64_t step, int64_t global_index, int global_batch) const;

 private:
  const TokenFile& data_;
  int seq_len_;
  uint64_t seed_;
};

// Validation windows: x = tokens[i*T : i*T+T], y = tokens[i*T+1 : i*T+T+1], i = 0 .. (N-1)/T - 1,
// optionally capped.
int64_t validation_windows(const TokenFile& data, int seq_len, int64_t cap);
void validation_batch(const TokenFile& data, int seq_len, int64_t first_window, int count,
                      int32_t* inputs, int32_t* targets);

}  // namespace colossal::io
