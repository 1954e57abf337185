// Synthetic weights in the released formats (FP8 block-scaled, MXFP4), element by element from
// (seed, index) with the same arithmetic on the host and the device, so that the CPU reference
// and the CUDA fill hold identical bytes. The values follow the dense synthetic weights
// (SyntheticUniform(seed, i, lo, hi), kernels/counter_rng.h), quantised the way real checkpoints
// are: FP8 with a power-of-two scale that maps max(|lo|, |hi|) near the top of e4m3 (448); MXFP4
// per group of 32 columns with the power-of-two scale that maps the group's largest magnitude
// to at most 6 (OCP MX), so the scales vary from group to group as in a release.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/counter_rng.h"  // DSV4_HD, SyntheticUniform

namespace dsv4 {

DSV4_HD inline bool SignBit(float v) {
  uint32_t bits;
  __builtin_memcpy(&bits, &v, 4);
  return (bits >> 31) != 0;
}

// Round to nearest even into e4m3fn, saturating at ±448 (NaN -> 0x7f).
DSV4_HD inline uint8_t E4M3FromFloat(float v) {
  if (v != v) return 0x7f;
  const uint8_t sign = SignBit(v) ? 0x80 : 0;
  const float a = fabsf(v);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormals m * 2^-9
    const int m = static_cast<int>(rintf(a * 512.0f));
    return sign | static_cast<uint8_t>(m);  // m == 8 is 0x08, the smallest normal
  }
  int e2;
  frexpf(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
  int e = e2 - 1;   // a in [2^e, 2^(e+1))
  int m = static_cast<int>(rintf((ldexpf(a, -e) - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    ++e;
  }
  if (e > 8 || (e == 8 && m == 7)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((e + 7) << 3) | m);
}

// Round to nearest even into e2m1 {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at ±6.
DSV4_HD inline uint8_t E2M1FromFloat(float v) {
  const float a = fabsf(v);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return (SignBit(v) && c != 0) ? static_cast<uint8_t>(c | 8) : c;
}

// Smallest k with 2^k >= x (x > 0), as a UE8M0 byte k + 127 clamped to [0, 254].
DSV4_HD inline uint8_t CeilPow2Exponent(float x) {
  if (!(x > 0.0f)) return 127;
  int e;
  const float f = frexpf(x, &e);  // x = f * 2^e, f in [0.5, 1)
  const int k = f == 0.5f ? e - 1 : e;
  const int b = k + 127;
  return static_cast<uint8_t>(b < 0 ? 0 : b > 254 ? 254 : b);
}

// The FP8 scale of a synthetic tensor with values in [lo, hi): a power of two.
DSV4_HD inline float SyntheticFp8Scale(float lo, float hi) {
  const float amax = fmaxf(fabsf(lo), fabsf(hi));
  return ldexpf(1.0f, static_cast<int>(CeilPow2Exponent(amax / 448.0f)) - 127);
}

// Element i's e4m3 code.
DSV4_HD inline uint8_t SyntheticFp8Code(uint64_t seed, uint64_t i, float lo, float hi, float scale) {
  return E4M3FromFloat(SyntheticUniform(seed, i, lo, hi) / scale);
}

// One MXFP4 group: the 32 values from element `first` on; writes 16 bytes (low nibble = even
// column) and returns the UE8M0 scale byte.
DSV4_HD inline uint8_t SyntheticMxfp4Group(uint64_t seed, uint64_t first, float lo, float hi,
                                          uint8_t* bytes16) {
  float v[32];
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    v[j] = SyntheticUniform(seed, first + j, lo, hi);
    amax = fmaxf(amax, fabsf(v[j]));
  }
  const uint8_t s = CeilPow2Exponent(amax / 6.0f);
  const float inv = ldexpf(1.0f, 127 - static_cast<int>(s));  // exact: a power of two
  for (int j = 0; j < 16; ++j) {
    bytes16[j] = static_cast<uint8_t>(E2M1FromFloat(v[2 * j] * inv) |
                                      (E2M1FromFloat(v[2 * j + 1] * inv) << 4));
  }
  return s;
}

}  // namespace dsv4
