// Quantised weight matrices as DeepSeek releases them (dsv4-model.md §12), described once for the
// CPU reference and the CUDA kernels (this header has no CUDA dependency; the accessors are
// __host__ __device__ under nvcc):
//   FP8   e4m3 bytes [rows, cols] and one fp32 scale per block_rows x block_cols block
//         (the checkpoint's UE8M0 / F32 / BF16 `.scale` converted to fp32 at load);
//   MXFP4 e2m1 nibbles [rows, cols / 2] (byte b at [r, q]: column 2q in the low nibble, 2q + 1 in
//         the high one) and one UE8M0 byte per 32 columns [rows, cols / 32] (value 2^(s - 127)).
// A matrix may be a stack of parts along the rows (experts [E, 2I, D] = E x (w1 [I, D] ‖ w3
// [I, D])): FP8 scale grids restart at every part of `part_rows` rows (the blocks of one part
// never span two); MXFP4 scales are per row, so stacking needs nothing.
// W[r, c] = e4m3(w[r, c]) * scale[block(r), c / block_cols]   (FP8)
// W[r, c] = e2m1(nibble(r, c)) * 2^(s[r, c / 32] - 127)         (MXFP4)
// Both are exact in fp32, and every MXFP4 value (a power of two times e2m1) is exact in bf16 and
// in e4m3 within its 32-column group's exponent range.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_QHD __host__ __device__ __forceinline__
#else
#define DSV4_QHD inline
#endif

namespace dsv4 {

// How a weight matrix is stored when it is not plain fp32/bf16.
enum class QuantFormat : uint8_t {
  kNone,
  kFp8Block,  // e4m3 bytes, fp32 scales per block_rows x block_cols block (Fp8Matrix)
  kMxfp4,     // two e2m1 nibbles per byte (low = even column), UE8M0 per 32 columns (Mxfp4Matrix)
};

struct Fp8Matrix {
  const uint8_t* w = nullptr;    // [rows, cols] e4m3fn
  const float* scale = nullptr;  // [parts * ScaleRowsPerPart(), ScaleCols()]
  int64_t rows = 0, cols = 0;
  int32_t block_rows = 128, block_cols = 128;
  int64_t part_rows = 0;         // rows of one stacked part; 0 or rows = not stacked

  DSV4_QHD int64_t PartRows() const { return part_rows > 0 ? part_rows : rows; }
  DSV4_QHD int64_t ScaleRowsPerPart() const { return (PartRows() + block_rows - 1) / block_rows; }
  DSV4_QHD int64_t ScaleCols() const { return (cols + block_cols - 1) / block_cols; }
  DSV4_QHD int64_t ScaleCount() const { return (rows / PartRows()) * ScaleRowsPerPart() * ScaleCols(); }
  // Index into `scale` of element (r, c).
  DSV4_QHD int64_t ScaleIndex(int64_t r, int64_t c) const {
    const int64_t pr = PartRows();
    return ((r / pr) * ScaleRowsPerPart() + (r % pr) / block_rows) * ScaleCols() + c / block_cols;
  }
};

struct Mxfp4Matrix {
  const uint8_t* w = nullptr;      // [rows, cols / 2]
  const uint8_t* scale = nullptr;  // [rows, cols / 32] UE8M0
  int64_t rows = 0, cols = 0;      // cols % 32 == 0
};

// e2m1 code -> value: {0, .5, 1, 1.5, 2, 3, 4, 6} and their negatives (bit 3 = sign).
DSV4_QHD float E2M1Value(uint32_t nibble) {
  const uint32_t m = nibble & 7u;
  const float v = m < 2 ? 0.5f * static_cast<float>(m)
                        : m < 4 ? 1.0f + 0.5f * static_cast<float>(m - 2)
                                : m < 6 ? 2.0f + static_cast<float>(m - 4) : (m == 6 ? 4.0f : 6.0f);
  return (nibble & 8u) ? -v : v;
}

// UE8M0 -> 2^(s - 127) (s = 255 is NaN; s = 0 is 2^-127, a subnormal-range value kept exact).
DSV4_QHD float E8M0Value(uint8_t s) {
  if (s == 255) return __builtin_nanf("");
  if (s == 0) return 5.877471754111438e-39f;  // 2^-127
  uint32_t bits = static_cast<uint32_t>(s) << 23;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// e4m3fn (no infinities; S.1111.111 is NaN) -> value.
DSV4_QHD float E4M3Value(uint8_t b) {
  const uint32_t sign = b >> 7, exp = (b >> 3) & 15u, man = b & 7u;
  if (exp == 15u && man == 7u) return __builtin_nanf("");
  float v;
  if (exp == 0) {
    v = static_cast<float>(man) * 0.001953125f;  // man * 2^-9
  } else {
    uint32_t bits = ((exp + 120u) << 23) | (man << 20);  // 2^(exp-7) * (1 + man/8)
    __builtin_memcpy(&v, &bits, 4);
  }
  return sign ? -v : v;
}

DSV4_QHD float Fp8At(const Fp8Matrix& m, int64_t r, int64_t c) {
  return E4M3Value(m.w[r * m.cols + c]) * m.scale[m.ScaleIndex(r, c)];
}

DSV4_QHD float Mxfp4At(const Mxfp4Matrix& m, int64_t r, int64_t c) {
  const uint8_t byte = m.w[r * (m.cols / 2) + c / 2];
  const uint32_t nibble = (c & 1) ? (byte >> 4) : (byte & 15u);
  return E2M1Value(nibble) * E8M0Value(m.scale[r * (m.cols / 32) + c / 32]);
}

}  // namespace dsv4

#undef DSV4_QHD
