// Running the built programs from a test: a shell command's exit code and its stdout and stderr
// together, and the path of a program in the build's bin/ (COLOSSAL_BIN_DIR, set by ctest).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace colossal::test {

struct Result {
  int code;
  std::string output;
};

inline Result run(const std::string& command) {
  Result r{-1, ""};
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) r.output += buf.data();
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string bin(const std::string& program) {
  const char* dir = std::getenv("COLOSSAL_BIN_DIR");
  return std::string(dir ? dir : "build/bin") + "/" + program;
}

}  // namespace colossal::test
