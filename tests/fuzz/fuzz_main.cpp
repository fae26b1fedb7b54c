// The libFuzzer entry of one target; COLOSSAL_FUZZ_ENTRY names the function of fuzz_entries.hpp
// (tests/fuzz/CMakeLists.txt builds one executable per entry).
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_entries.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  colossal::fuzz::COLOSSAL_FUZZ_ENTRY(data, size);
  return 0;
}
