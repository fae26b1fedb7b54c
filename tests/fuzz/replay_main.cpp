// Replays every file of a fuzz corpus through its entry point, so that the seeds and every input
// that once crashed are checked on every build (gcc included), without libFuzzer:
//   fuzz_replay config|checkpoint PATH...   (files, or folders searched recursively)
// README files are skipped. Exits non-zero when no input was found; a failing input aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_entries.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay config|checkpoint PATH...\n");
    return 2;
  }
  const std::string target = argv[1];
  std::string (*entry)(const uint8_t*, std::size_t) = nullptr;
  if (target == "config") entry = colossal::fuzz::config_input;
  if (target == "checkpoint") entry = colossal::fuzz::checkpoint_input;
  if (entry == nullptr) {
    std::fprintf(stderr, "fuzz_replay: unknown target '%s' (config or checkpoint)\n", argv[1]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 2; i < argc; ++i) {
    const fs::path path = argv[i];
    if (fs::is_directory(path)) {
      for (const auto& entry_path : fs::recursive_directory_iterator(path)) {
        if (entry_path.is_regular_file()) inputs.push_back(entry_path.path());
      }
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else {
      std::fprintf(stderr, "fuzz_replay: '%s' is neither a file nor a folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  int replayed = 0;
  for (const fs::path& path : inputs) {
    if (path.filename().string().rfind("README", 0) == 0) continue;
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
    std::printf("%s (%zu bytes): ", path.string().c_str(), bytes.size());
    std::fflush(stdout);  // a failing input is the last name printed
    const std::string outcome = entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    std::printf("%s\n", outcome.substr(0, 300).c_str());
    ++replayed;
  }
  std::printf("replayed %d %s inputs\n", replayed, target.c_str());
  return replayed > 0 ? 0 : 1;
}
