// Token files for tests: llm.c's format (a 256-int32 header: magic, version, token count; then
// uint16 tokens, or uint32 after the llama-3 magic), as io::TokenFile reads it.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "io/dataset.hpp"

namespace colossal::test {

// The header (magic, version, token count; `count` < 0: tokens.size(), another value makes a
// damaged file), then the tokens as they are in memory (little-endian here).
template <class Token>
void write_llmc_file(const std::string& path, const std::vector<Token>& tokens, int32_t magic,
                     int32_t version, int32_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count < 0 ? static_cast<int32_t>(tokens.size()) : count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            std::streamsize(tokens.size() * sizeof(Token)));
}

// llm.c's GPT-2 token file: uint16 tokens after magic 20240520.
inline void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens,
                       int32_t version = 1, int32_t count = -1) {
  write_llmc_file(path, tokens, io::TokenFile::kLlmcMagic, version, count);
}

// llm.c's "llama-3" token file: uint32 tokens after magic 20240801 (version 7).
inline void write_llmc32(const std::string& path, const std::vector<uint32_t>& tokens,
                         int32_t version = io::TokenFile::kLlmcVersion32, int32_t count = -1) {
  write_llmc_file(path, tokens, io::TokenFile::kLlmcMagic32, version, count);
}

}  // namespace colossal::test
