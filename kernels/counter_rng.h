// Counter-based random numbers shared by the CPU reference and the CUDA kernels: a value depends
// only on (seed, counter), never on thread layout or batch composition, so the GPU reproduces
// the CPU's draws and synthetic weights bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/ragged_batch.h"  // DSV4_HD

namespace dsv4 {

// SplitMix64 finaliser of seed + golden-ratio * (counter + 1).
DSV4_HD inline uint64_t CounterHash(uint64_t seed, uint64_t counter) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (counter + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform double in the open interval (0, 1): 53 random bits, centred in their cell.
DSV4_HD inline double CounterUniform(uint64_t seed, uint64_t counter) {
  return (static_cast<double>(CounterHash(seed, counter) >> 11) + 0.5) * 0x1.0p-53;
}

// Counter of token `i`'s draw at decode step `step` (vocabularies are < 2^32).
DSV4_HD inline uint64_t SamplingCounter(uint64_t step, int64_t i) {
  return (step << 32) + static_cast<uint64_t>(i);
}

// Element `i` of a synthetic tensor: uniform in [lo, hi), with an explicit fused multiply-add so
// that host and device round identically.
DSV4_HD inline float SyntheticUniform(uint64_t seed, uint64_t i, float lo, float hi) {
  return fmaf(hi - lo, static_cast<float>(CounterUniform(seed, i)), lo);
}

// Element `i` of a synthetic index table: uniform in [0, modulus).
DSV4_HD inline int32_t SyntheticIndex(uint64_t seed, uint64_t i, int32_t modulus) {
  return static_cast<int32_t>(CounterHash(seed, i) % static_cast<uint64_t>(modulus));
}

}  // namespace dsv4
