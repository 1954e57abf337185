#include "common/dtype.h"

#include <cmath>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kI32, DType::kU8,
                  DType::kI8, DType::kF8E4M3, DType::kF8E8M0}) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.has_value()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_FALSE(ParseDType("F64").has_value());
  EXPECT_FALSE(ParseDType("").has_value());
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI64), 8);
}

TEST(DType, Bf16) {
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between two bf16 values; ties round to even (down to 1.0).
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(DType, F16) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);                // largest normal
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
}

TEST(DType, Fp8AndScales) {
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);       // exp 7, mant 0
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);     // largest finite
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_EQ(E8M0ToF32(127), 1.0f);
  EXPECT_EQ(E8M0ToF32(130), 8.0f);
  EXPECT_TRUE(std::isnan(E8M0ToF32(255)));
  EXPECT_EQ(E2M1ToF32(0x7), 6.0f);
  EXPECT_EQ(E2M1ToF32(0x9), -0.5f);
}

}  // namespace
}  // namespace dsv4
