// The converted copy of a range of operands that does not change while it is held (the model's
// parameters from a forward to the next), for a backend that converts its operands before
// multiplying (oneDNN's and cuBLAS's bf16 ones: bf16 bits). See Gemm::hold_stable. Buffer holds
// the copies: std::vector on the host, a device array for cuBLAS (size(), resize(n), data()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace colossal::core {

template <class T, class Buffer = std::vector<T>>
class StableOperands {
 public:
  // Holds [begin, begin + n) (nothing when n = 0). `unchanged`: the same range as held now, and
  // its values too, so a copy already made is kept (Gemm::hold_stable).
  void hold(const float* begin, std::size_t n, bool unchanged) {
    const bool any = begin != nullptr && n > 0;
    const float* const b = any ? begin : nullptr;
    const std::size_t count = any ? n : 0;
    if (!unchanged || b != begin_ || count != n_) converted_ = false;
    begin_ = b;
    n_ = count;
  }
  // The converted `span` floats from `from`: out of the held copy when they lie inside the held
  // range (the whole range converted once, on its first use), else converted into `scratch`
  // (grown once to the largest operand). convert(in, out, n) writes n converted values.
  template <class Convert>
  const T* get(Buffer& scratch, const float* from, std::size_t span, Convert&& convert) {
    const auto at = reinterpret_cast<std::uintptr_t>(from);
    const auto lo = reinterpret_cast<std::uintptr_t>(begin_);
    if (begin_ != nullptr && at >= lo && at + span * sizeof(float) <= lo + n_ * sizeof(float)) {
      T* copy = storage_;
      if (copy == nullptr) {
        if (copy_.size() < n_) copy_.resize(n_);
        copy = copy_.data();
      } else if (n_ > capacity_) {
        throw std::logic_error("core::StableOperands: a held range of " + std::to_string(n_) +
                               " floats exceeds the copy's storage of " +
                               std::to_string(capacity_));
      }
      if (!converted_) {
        convert(begin_, copy, n_);
        converted_ = true;
        ++conversions_;
      }
      return copy + (from - begin_);
    }
    if (scratch.size() < span) scratch.resize(span);
    convert(from, scratch.data(), span);
    return scratch.data();
  }
  std::size_t conversions() const { return conversions_; }
  // The copy in `capacity` values at `storage` (memory someone else tracks) from now on, instead
  // of a buffer of its own; nullptr: its own again. Converted anew on first use.
  void use_storage(T* storage, std::size_t capacity) {
    storage_ = storage;
    capacity_ = storage != nullptr ? capacity : 0;
    converted_ = false;
  }

 private:
  const float* begin_ = nullptr;
  std::size_t n_ = 0;
  bool converted_ = false;
  std::size_t conversions_ = 0;
  Buffer copy_;             // the copy, unless in storage_
  T* storage_ = nullptr;    // use_storage's
  std::size_t capacity_ = 0;
};

}  // namespace colossal::core
