// Prints what io::TokenFile reads from a token file: the count, then one token per line; or,
// with --choices, what io::read_choice_file reads from a multiple-choice file: one line per
// example, "index label | context ids | completion ids | ...". The Python tests
// (tests/python/) compare it with what they wrote.
#include <cstdio>
#include <exception>
#include <string>

#include "io/choice_file.hpp"
#include "io/dataset.hpp"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--choices") {
    try {
      for (const auto& ex : colossal::io::read_choice_file(argv[2], 1 << 30, "token_dump")) {
        std::printf("%d %d", ex.index, ex.label);
        const auto ids = [](const std::vector<int32_t>& run) {
          std::printf(" |");
          for (const int32_t t : run) std::printf(" %d", t);
        };
        ids(ex.context);
        for (const auto& c : ex.completions) ids(c);
        std::printf("\n");
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "token_dump: %s\n", e.what());
      return 3;
    }
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: token_dump FILE (prints the token count, then the tokens)\n"
                         "       token_dump --choices FILE (a multiple-choice file's examples)\n");
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
