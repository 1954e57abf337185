// Element types of checkpoint tensors and device buffers, with host-side conversions.
// No CUDA headers: this file is shared by the coordinator and the workers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dsv4 {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kI64,
  kI32,
  kU8,
  kI8,       // also carries packed MXFP4 (two e2m1 nibbles per byte) in official checkpoints
  kF8E4M3,   // FP8 weights (block-scaled)
  kF8E8M0,   // UE8M0 exponent-only scales
};

// Bytes per element.
int DTypeSize(DType dtype);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype string; nullopt for dtypes this project does not read.
std::optional<DType> ParseDType(std::string_view name);

inline float Bf16ToF32(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x40);
  }
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float F16ToF32(uint16_t bits);
// FP8 e4m3fn (no infinities; 0x7f/0xff are NaN).
float F8E4M3ToF32(uint8_t bits);
// UE8M0 scale: 2^(bits - 127); 255 is NaN.
float E8M0ToF32(uint8_t bits);
// One e2m1 (MXFP4) nibble.
float E2M1ToF32(uint8_t nibble);

}  // namespace dsv4
