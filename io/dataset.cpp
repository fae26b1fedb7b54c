#include "io/dataset.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/rng.hpp"

namespace colossal::io {

namespace {
constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);
}

TokenFile::TokenFile(const std::string& path, const std::string& key) : path_(path), key_(key) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    throw DataError(key + ": cannot open '" + path + "': " + std::strerror(errno) +
                    "; check the path (the quickstart corpus is made by ./setup.sh or "
                    "scripts/prepare_data.sh)");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(key + ": '" + path + "' is not a regular file");
  }
  map_bytes_ = static_cast<std::size_t>(st.st_size);
  if (map_bytes_ == 0) {
    ::close(fd);
    throw DataError(key + ": '" + path + "' is empty (a data file needs tokens); point " + key +
                    " at a text or llm.c token file");
  }
  map_ = mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw DataError(key + ": cannot map '" + path + "': " + std::strerror(errno));
  }
  const auto* bytes = static_cast<const uint8_t*>(map_);
  int32_t header[3] = {0, 0, 0};
  if (map_bytes_ >= kLlmcHeaderBytes) std::memcpy(header, bytes, sizeof header);
  const bool wide = header[0] == kLlmcMagic32;
  if (map_bytes_ >= kLlmcHeaderBytes && (header[0] == kLlmcMagic || wide)) {
    format_ = wide ? Format::llmc_uint32 : Format::llmc_uint16;
    const int32_t version = wide ? kLlmcVersion32 : kLlmcVersion;
    const std::size_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
    const std::string kind = wide ? "uint32" : "uint16";
    if (header[1] != version) {
      throw DataError(key + ": '" + path + "' has the llm.c magic " + std::to_string(header[0]) +
                      " but version " + std::to_string(header[1]) + " (with that magic only " +
                      "version " + std::to_string(version) + ", " + kind +
                      " tokens, is read)");
    }
    const std::size_t body = map_bytes_ - kLlmcHeaderBytes;
    const std::size_t available = body / width;
    if (header[2] < 0 || static_cast<std::size_t>(header[2]) > available) {
      throw DataError(key + ": '" + path + "' header says " + std::to_string(header[2]) +
                      " tokens but the file holds " + std::to_string(available) +
                      " (truncated or corrupt file)");
    }
    // Exactly the header's tokens: more bytes are another token width (uint32 tokens read as
    // uint16 trained on every other id being 0, silently) or a file written wrong.
    if (body != std::size_t(header[2]) * width) {
      throw DataError(key + ": '" + path + "' header says " + std::to_string(header[2]) + " " +
                      kind + " tokens (" + std::to_string(std::size_t(header[2]) * width) +
                      " bytes) but " + std::to_string(body) + " bytes follow it (" +
                      (wide ? "a corrupt file?); write uint32 tokens after magic 20240801, "
                              "version 7"
                            : "uint32 tokens, or a corrupt file?); write the tokens as uint16, "
                              "as llm.c does, or as uint32 after llm.c's llama-3 header (magic "
                              "20240801, version 7)"));
    }
    count_ = static_cast<std::size_t>(header[2]);
    if (wide) {
      tokens32_ = reinterpret_cast<const uint32_t*>(bytes + kLlmcHeaderBytes);
    } else {
      tokens16_ = reinterpret_cast<const uint16_t*>(bytes + kLlmcHeaderBytes);
    }
  } else {
    format_ = Format::raw_bytes;
    count_ = map_bytes_;
    tokens8_ = bytes;
  }
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

uint32_t TokenFile::max_token() const {
  uint32_t mx = 0;
  for (std::size_t i = 0; i < count_; ++i) mx = std::max(mx, (*this)[i]);
  return mx;
}

void TokenFile::check(int vocab, std::size_t min_tokens, const std::string& why) const {
  if (count_ < min_tokens) {
    throw DataError(key_ + ": '" + path_ + "' holds " + std::to_string(count_) +
                    " tokens, fewer than the " + std::to_string(min_tokens) + " needed (" + why +
                    "); use a longer file or a shorter train.seq_len");
  }
  const uint32_t mx = max_token();
  if (mx >= static_cast<uint32_t>(vocab)) {
    throw DataError(key_ + ": '" + path_ + "' contains token id " + std::to_string(mx) +
                    " but model.vocab is " + std::to_string(vocab) +
                    (format_ == Format::raw_bytes ? " (a raw text file needs vocab >= 256)"
                                                  : " (token ids must be < vocab)") +
                    "; raise model.vocab or use matching data");
  }
}

TrainSampler::TrainSampler(const TokenFile& data, int seq_len, uint64_t seed)
    : data_(data), seq_len_(seq_len), seed_(seed) {}

std::size_t TrainSampler::window_start(int64_t step, int64_t global_index, int global_batch) const {
  constexpr uint64_t kStream = core::hash_name("colossal.train_sampler");
  const uint64_t starts = data_.size() - static_cast<std::size_t>(seq_len_);  // start + T < N
  const uint64_t counter = static_cast<uint64_t>(step) * static_cast<uint64_t>(global_batch) +
                           static_cast<uint64_t>(global_index);
  return static_cast<std::size_t>(core::random_below(seed_, kStream, counter, starts));
}

void TrainSampler::batch(int64_t step, int64_t first_sample, int count, int global_batch,
                         int32_t* inputs, int32_t* targets) const {
  for (int s = 0; s < count; ++s) {
    const std::size_t start = window_start(step, first_sample + s, global_batch);
    for (int t = 0; t < seq_len_; ++t) {
      inputs[int64_t(s) * seq_len_ + t] = static_cast<int32_t>(data_[start + t]);
      targets[int64_t(s) * seq_len_ + t] = static_cast<int32_t>(data_[start + t + 1]);
    }
  }
}

int64_t validation_windows(const TokenFile& data, int seq_len, int64_t cap) {
  const int64_t n = static_cast<int64_t>((data.size() - 1) / static_cast<std::size_t>(seq_len));
  return cap > 0 && cap < n ? cap : n;
}

void validation_batch(const TokenFile& data, int seq_len, int64_t first_window, int count,
                      int32_t* inputs, int32_t* targets) {
  for (int s = 0; s < count; ++s) {
    const std::size_t start = static_cast<std::size_t>(first_window + s) * seq_len;
    for (int t = 0; t < seq_len; ++t) {
      inputs[int64_t(s) * seq_len + t] = static_cast<int32_t>(data[start + t]);
      targets[int64_t(s) * seq_len + t] = static_cast<int32_t>(data[start + t + 1]);
    }
  }
}

}  // namespace colossal::io
