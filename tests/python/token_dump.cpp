// Prints what io::TokenFile reads from a token file: the count, then one token per line. The
// Python tests (tests/python/) compare it with what they wrote.
#include <cstdio>
#include <exception>

#include "io/dataset.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: token_dump FILE (prints the token count, then the tokens)\n");
    return 2;
  }
  try {
    const colossal::io::TokenFile file(argv[1], "token_dump");
    using Format = colossal::io::TokenFile::Format;
    std::printf("%zu %s\n", file.size(),
                file.format() == Format::llmc_uint16   ? "llmc_uint16"
                : file.format() == Format::llmc_uint32 ? "llmc_uint32"
                                                       : "raw_bytes");
    for (std::size_t i = 0; i < file.size(); ++i) std::printf("%u\n", file[i]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "token_dump: %s\n", e.what());
    return 3;
  }
  return 0;
}
