// The quantised-weight accessors (kernels/quant_weights.h, also compiled into the CUDA kernels)
// against the checkpoint converters of common/dtype.h, code by code, and the scale grids of
// stacked FP8 parts.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/quant_ref.h"
#include "kernels/quant_synthetic.h"

namespace dsv4 {
namespace {

bool SameFloat(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(QuantRef, CodesMatchTheCheckpointConverters) {
  for (int b = 0; b < 256; ++b) {
    EXPECT_TRUE(SameFloat(E4M3Value(static_cast<uint8_t>(b)), F8E4M3ToF32(static_cast<uint8_t>(b))))
        << b;
    EXPECT_TRUE(SameFloat(E8M0Value(static_cast<uint8_t>(b)), E8M0ToF32(static_cast<uint8_t>(b))))
        << b;
  }
  for (uint32_t n = 0; n < 16; ++n) {
    EXPECT_TRUE(SameFloat(E2M1Value(n), E2M1ToF32(static_cast<uint8_t>(n)))) << n;
    EXPECT_EQ(std::signbit(E2M1Value(n)), std::signbit(E2M1ToF32(static_cast<uint8_t>(n)))) << n;
  }
}

TEST(QuantRef, StackedFp8PartsRestartTheirScaleGrid) {
  // Two parts of 3 rows, 2x2 blocks, 5 columns: each part has ceil(3/2) = 2 block rows and
  // ceil(5/2) = 3 block columns; part 1's first row uses the grid's row 2, not row 1.
  std::vector<uint8_t> w(6 * 5, 0x38);  // e4m3 1.0
  std::vector<float> scale(2 * 2 * 3);
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = static_cast<float>(i + 1);
  Fp8Matrix m{w.data(), scale.data(), 6, 5, 2, 2, 3};
  EXPECT_EQ(m.ScaleCount(), 12);
  std::vector<float> out(30);
  DequantizeFp8Ref(m, out.data());
  EXPECT_EQ(out[0 * 5 + 0], 1.0f);   // part 0, block (0, 0)
  EXPECT_EQ(out[2 * 5 + 4], 6.0f);   // part 0, row 2: block row 1, block col 2 -> index 5
  EXPECT_EQ(out[3 * 5 + 0], 7.0f);   // part 1, row 0: grid row 2 -> index 6
  EXPECT_EQ(out[5 * 5 + 3], 11.0f);  // part 1, row 2: grid row 3, block col 1 -> index 10
}

TEST(QuantRef, Mxfp4NibbleOrderAndScales) {
  // Row 0: byte 0x21 -> column 0 = code 1 (0.5), column 1 = code 2 (1.0); scale 2^1.
  std::vector<uint8_t> w(16, 0);
  w[0] = 0x21;
  w[15] = 0xf9;  // columns 30 (code 9 = -0.5) and 31 (code 15 = -6)
  std::vector<uint8_t> s = {128};
  Mxfp4Matrix m{w.data(), s.data(), 1, 32};
  std::vector<float> out(32);
  DequantizeMxfp4Ref(m, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[30], -1.0f);
  EXPECT_EQ(out[31], -12.0f);
  EXPECT_EQ(out[5], 0.0f);
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// Every e4m3 value converts back to its own code; halfway points round to even; beyond 448
// saturates. The same for e2m1.
TEST(QuantSynthetic, FloatToCodeRoundTripsAndRoundsToEven) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float v = E4M3Value(static_cast<uint8_t>(b));
    const uint8_t back = E4M3FromFloat(v);
    if (v == 0.0f) {
      EXPECT_EQ(back & 0x7f, 0) << b;
    } else {
      EXPECT_EQ(back, b) << b << " " << v;
    }
  }
  EXPECT_EQ(E4M3FromFloat(1000.0f), 0x7e);
  EXPECT_EQ(E4M3FromFloat(-1000.0f), 0xfe);
  // 1 + 1/16 lies halfway between 1.0 (0x38) and 1.125 (0x39): even mantissa, 1.0.
  EXPECT_EQ(E4M3FromFloat(1.0625f), 0x38);
  EXPECT_EQ(E4M3FromFloat(1.1875f), 0x3a);  // between 1.125 and 1.25: to 1.25 (even)
  for (uint32_t n = 0; n < 16; ++n) {
    const float v = E2M1Value(n);
    EXPECT_EQ(E2M1Value(E2M1FromFloat(v)), v) << n;
  }
  EXPECT_EQ(E2M1FromFloat(2.5f), 4);   // tie 2 | 3 -> 2
  EXPECT_EQ(E2M1FromFloat(5.0f), 6);   // tie 4 | 6 -> 4
  EXPECT_EQ(E2M1FromFloat(-7.0f), 15); // saturates to -6
}

// A synthetic MXFP4 group's scale maps its largest magnitude to at most 6, and dequantising
// stays within half a step of the dense synthetic values.
TEST(QuantSynthetic, Mxfp4GroupFollowsTheDenseValues) {
  uint8_t bytes[16];
  const uint8_t s = SyntheticMxfp4Group(7, 64, -0.02f, 0.02f, bytes);
  const float scale = E8M0Value(s);
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(SyntheticUniform(7, 64 + j, -0.02f, 0.02f)));
  EXPECT_LE(amax / scale, 6.0f);
  EXPECT_GT(amax / scale, 3.0f);
  for (int j = 0; j < 32; ++j) {
    const uint32_t nib = (j % 2 == 0) ? (bytes[j / 2] & 15) : (bytes[j / 2] >> 4);
    const float got = E2M1Value(nib) * scale;
    EXPECT_LE(std::fabs(got - SyntheticUniform(7, 64 + j, -0.02f, 0.02f)), scale * 1.0f) << j;
  }
}

}  // namespace
}  // namespace dsv4
