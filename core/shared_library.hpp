// A shared library opened at run time (dlopen, RTLD_LOCAL), and symbols looked up in it: how the
// optional host GEMM libraries (BLIS, oneDNN) are used without being linked.
#pragma once

#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::core {

class SharedLibrary {
 public:
  // The first of `names` that opens; loaded() says whether one did.
  explicit SharedLibrary(const std::vector<const char*>& names) {
    for (const char* n : names) {
      handle_ = dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) {
        path_ = n;
        return;
      }
    }
  }
  ~SharedLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  bool loaded() const { return handle_ != nullptr; }
  const std::string& path() const { return path_; }
  // The symbol as a function pointer of type F; throws naming the library and the symbol.
  template <typename F>
  F symbol(const char* name) const {
    void* s = handle_ != nullptr ? dlsym(handle_, name) : nullptr;
    if (s == nullptr) {
      throw std::runtime_error(std::string("GEMM backend library ") + path_ + " lacks " + name);
    }
    return reinterpret_cast<F>(s);
  }

 private:
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace colossal::core
