// Entry points shared by the libFuzzer targets (tests/fuzz/fuzz_main.cpp, built with
// COLOSSAL_FUZZ=ON and clang) and the corpus replay test (tests/fuzz/replay_main.cpp, built and run
// by ctest everywhere). Each takes one input and returns "accepted" or the error a user would see
// when the loader rejected it as it should; anything else (a crash, another exception type, an error that
// does not say where, a broken invariant) aborts with a message, which libFuzzer and ctest report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace colossal::fuzz {

// The config loader: the input is YAML text, then optionally NUL-separated `--set` overrides
// (at most 8). Accepted configs must round-trip through to_yaml.
std::string config_input(const uint8_t* data, std::size_t size);

// The checkpoint reader, as `checkpoint.resume: auto` uses it on rank 0: the input is the bytes of
// a ckpt-<step>.h5 file, read back for the model of tests/fuzz/corpus/checkpoint/README.md.
std::string checkpoint_input(const uint8_t* data, std::size_t size);

}  // namespace colossal::fuzz
