#pragma once

#include <cstdint>

namespace lamp {
namespace data {
namespace detail {

// SplitMix64's increment (the golden ratio's 64-bit fraction).
constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;

// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014; Java's SplittableRandom): the output of a
// generator whose state is `state`, which advances it by kSplitMixGamma
// and mixes it. Output number k (from 1) of the generator seeded with s is
// split_mix64(s + (k - 1) * kSplitMixGamma), all modulo 2^64; for seed 0
// the first is 0xe220a8397b1dcdaf.
inline uint64_t split_mix64(uint64_t state) {
  uint64_t z = state + kSplitMixGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

} // namespace detail
} // namespace data
} // namespace lamp
