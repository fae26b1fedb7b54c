// bfloat16 as 16-bit patterns (the upper half of a float): the rounding every bf16 path of the
// project shares (GEMM operands, activations stored in bf16), so they all agree bit for bit.
// Device-legal.
#pragma once

#include <cstdint>
#include <cstring>

#include <Kokkos_Core.hpp>

namespace colossal::core {

// The float bits of x's nearest bfloat16, round to nearest, ties to even (lower half zero). A
// NaN stays a NaN (its quiet bit set: rounding could carry a payload in the low half into
// infinity); overflow goes to infinity.
KOKKOS_INLINE_FUNCTION std::uint32_t bf16_rounded_bits(std::uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (bits | 0x00400000u) & 0xFFFF0000u;
  // Add half an ulp of bf16, less one when the kept part is even.
  return (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
}

// x rounded to bfloat16, as its 16-bit pattern.
KOKKOS_INLINE_FUNCTION std::uint16_t bf16_bits(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return std::uint16_t(bf16_rounded_bits(bits) >> 16);
}

// The float a bfloat16 pattern represents (exact).
KOKKOS_INLINE_FUNCTION float bf16_value(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// A stored element (a norm's output, a saved activation): the float itself, or its bfloat16
// pattern when the tensor is stored in bf16.
KOKKOS_INLINE_FUNCTION void store_output(float& out, float value) { out = value; }
KOKKOS_INLINE_FUNCTION void store_output(std::uint16_t& out, float value) {
  out = bf16_bits(value);
}

// A saved element as the float it holds: itself, or the value of its bf16 pattern.
KOKKOS_INLINE_FUNCTION float load_value(float x) { return x; }
KOKKOS_INLINE_FUNCTION float load_value(std::uint16_t bits) { return bf16_value(bits); }

}  // namespace colossal::core
