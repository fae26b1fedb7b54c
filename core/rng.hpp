// Counter-based random numbers (Philox-4x32-10, Salmon et al. SC'11): a value is a pure function of
// (key, counter), never of a generator's history. Parameters are initialised from
// (seed, logical tensor name, element index), so any sharding of a tensor across ranks draws exactly
// the values one rank would draw; the data sampler keys on (seed, step, sample index).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/kokkos_compat.hpp"

namespace colossal::core {

struct Philox4x32 {
  uint32_t v[4];
};

// Ten Philox rounds over a 128-bit counter (c0..c3) with a 64-bit key (k0, k1).
KOKKOS_INLINE_FUNCTION Philox4x32 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                             uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c0 = n0;
    c1 = static_cast<uint32_t>(p1);
    c2 = n2;
    c3 = static_cast<uint32_t>(p0);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// 64-bit FNV-1a of a name: the stream id of a logical tensor.
constexpr uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Four 32-bit words for (seed, stream, index): the key is the seed, the counter (stream, index).
KOKKOS_INLINE_FUNCTION Philox4x32 random_words(uint64_t seed, uint64_t stream, uint64_t index) {
  return philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                    static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32),
                    static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Uniform in (0, 1], from 24 random bits.
KOKKOS_INLINE_FUNCTION float word_to_unit(uint32_t w) {
  return (static_cast<float>(w >> 8) + 1.0f) * (1.0f / 16777216.0f);
}

// A standard normal for (seed, stream, index), by Box-Muller on two words.
KOKKOS_INLINE_FUNCTION float random_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const Philox4x32 r = random_words(seed, stream, index);
  const float u1 = word_to_unit(r.v[0]);
  const float u2 = word_to_unit(r.v[1]);
  return kmath::sqrt(-2.0f * kmath::log(u1)) * kmath::cos(6.28318530717958647692f * u2);
}

// A uniform integer in [0, n) for (seed, stream, index); bias below 2^-32 for n < 2^32.
KOKKOS_INLINE_FUNCTION uint64_t random_below(uint64_t seed, uint64_t stream, uint64_t index,
                                             uint64_t n) {
  const Philox4x32 r = random_words(seed, stream, index);
  const uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  return x % n;
}

// dst[i] = std * normal(seed, stream, first_index + i) for i < count, on the default device.
void fill_normal(float* dst, std::size_t count, float std, uint64_t seed, uint64_t stream,
                 uint64_t first_index = 0);

}  // namespace colossal::core
