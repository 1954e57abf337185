// Products with FP8 block-scaled weights (kernels/cuda/fp8_linear.h) through the Backend seam
// (label `gpu`): the CUDA backend keeps the e4m3 bytes and scales (CudaBackend::CreateStoredWeight)
// and runs decode rows (m <= 8) through Fp8Gemv where it fits, larger m (or shapes it refuses)
// through Fp8Dequantize + the GEMM; the CPU reference dequantises exactly and multiplies in fp32.
// Weights: random e4m3 codes (every code but the NaNs 0x7f / 0xff), fp32 block scales.
//   fp32 precision: arbitrary positive scales; both paths are exact up to the accumulation order.
//   bf16 precision: x is rounded to bf16 (the reference gets the rounded x). Fp8Gemv takes the
//     weights exactly; the fallback rounds W to bf16, which is exact for power-of-two scales (the
//     release's UE8M0 scales), so the tight comparisons use those; arbitrary scales are compared
//     with the bf16 tolerance of the other suites.
// Shapes: the DSV4-Flash dense projections at m = 1, 2, 8 (Fp8Gemv) and 9, 64 (fallback), the
// grouped output projection, small and odd shapes, partial and non-square blocks, stacked parts.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_ref.h"
#include "tests/gpu/backend_pair.h"
#include "worker/checkpoint/stored_weight.h"

namespace dsv4 {
namespace {

using testing::BackendPair;
using testing::Both;
using testing::Close;
using testing::RandomVec;

constexpr int32_t kBlock = 128;  // KV block size of the steps (unused by these ops)
// Relative tolerance (of the largest reference output) where both sides multiply exactly and
// only the fp32 accumulation order differs.
constexpr double kExactTol = 1e-5;
// The bf16 tolerance of the other suites (W rounded to bf16 on the fallback path).
constexpr double kBf16Tol = 1e-2;
// Rows Fp8Gemv takes at most (kFp8GemvMaxRows, kernels/cuda/fp8_linear.h: plugin code).
constexpr int64_t kGemvMaxRows = 8;

struct Fp8Shape {
  const char* name;
  int64_t rows, cols;
  int32_t block_rows = 128, block_cols = 128;
  int64_t part_rows = 0;
  int64_t groups = 1;  // GroupedLinear with this many groups when > 1
};

// A random FP8 block-scaled weight: codes uniform over the non-NaN codes, scales 2^-13 .. 2^-6
// (pow2) or uniform in [2^-9, 2^-7) (arbitrary).
StoredWeight RandomFp8(const Fp8Shape& s, uint32_t seed, bool pow2_scales) {
  StoredWeight w;
  w.name = s.name;
  w.format = WeightFormat::kFp8Block;
  w.shape = Shape{s.rows, s.cols};
  w.block_rows = s.block_rows;
  w.block_cols = s.block_cols;
  w.part_rows = s.part_rows;
  std::mt19937 rng(seed);
  w.data.resize(static_cast<size_t>(s.rows * s.cols));
  for (size_t i = 0; i < w.data.size(); i += 4) {
    uint32_t bits = rng();
    for (size_t b = i; b < std::min(i + 4, w.data.size()); ++b, bits >>= 8) {
      uint8_t code = static_cast<uint8_t>(bits);
      if ((code & 0x7f) == 0x7f) code ^= 1;  // NaN -> the largest finite value's neighbour
      w.data[b] = code;
    }
  }
  w.scale_f32.resize(static_cast<size_t>(w.fp8().ScaleCount()));
  std::uniform_real_distribution<float> arb(1.0f / 512, 1.0f / 128);
  for (float& v : w.scale_f32) {
    v = pow2_scales ? std::ldexp(1.0f, -6 - static_cast<int>(rng() % 8)) : arb(rng);
  }
  return w;
}

// The weight on both backends: the reference dequantised (fp32), the CUDA backend quantised.
Both Upload(BackendPair& p, const StoredWeight& sw) {
  Both t;
  auto c = p.cpu.CreateStoredWeight(sw, WeightUse::kMatrix);
  EXPECT_TRUE(c.ok()) << c.status();
  auto g = p.gpu->CreateStoredWeight(sw, WeightUse::kMatrix);
  EXPECT_TRUE(g.ok()) << g.status();
  if (c.ok()) t.c = *c;
  if (g.ok()) t.g = *g;
  EXPECT_TRUE(t.g.quantized());
  return t;
}

::testing::AssertionResult CloseRel(const std::vector<float>& got, const std::vector<float>& ref,
                                    double tol) {
  double mx = 0;
  for (float v : ref) mx = std::max(mx, std::fabs(static_cast<double>(v)));
  return Close(got, ref, tol * mx, tol);
}

// y = x · Wᵀ (or the grouped product) on both backends for each m; the reference sees x rounded
// to bf16 in bf16 precision.
// `worst` (when set): the largest max |y - ref| / max |ref| over the ms.
void CompareProducts(BackendPair& p, Precision prec, const Fp8Shape& s, const Both& w,
                     const std::vector<int64_t>& ms, double tol, uint32_t seed,
                     double* worst = nullptr) {
  for (int64_t m : ms) {
    SCOPED_TRACE(::testing::Message() << s.name << " " << s.rows << "x" << s.cols << " block "
                                      << s.block_rows << "x" << s.block_cols << " parts of "
                                      << s.part_rows << " groups " << s.groups << " m=" << m
                                      << " " << PrecisionName(prec));
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    const int64_t xw = s.groups * s.cols;
    auto xv = RandomVec(m * xw, seed + static_cast<uint32_t>(m));
    Both x = p.Input(Shape{m, xw}, xv);
    if (prec == Precision::kBF16) xv = testing::RoundBf16(xv);
    Both xr = p.Input(Shape{m, xw}, xv);
    Both y = p.Scratch(DType::kF32, Shape{m, s.rows});
    if (s.groups > 1) {
      ASSERT_TRUE(p.cpu.GroupedLinear(xr.c, w.c, s.groups, y.c).ok());
      const absl::Status st = p.gpu->GroupedLinear(x.g, w.g, s.groups, y.g);
      ASSERT_TRUE(st.ok()) << st;
    } else {
      ASSERT_TRUE(p.cpu.Linear(xr.c, w.c, y.c).ok());
      const absl::Status st = p.gpu->Linear(x.g, w.g, y.g);
      ASSERT_TRUE(st.ok()) << st;
    }
    const std::vector<float> got = p.HostG(y.g), ref = p.HostC(y.c);
    EXPECT_TRUE(CloseRel(got, ref, tol));
    if (worst != nullptr) *worst = std::max(*worst, testing::ErrorAtScale(got, ref));
  }
}

// ---- DSV4-Flash shapes ----

const std::vector<Fp8Shape>& FlashShapes() {
  static const std::vector<Fp8Shape> v = {
      {"wq_a", 1024, 4096},
      {"wq_b", 32768, 1024},
      {"wkv", 512, 4096},
      {"wo_b", 4096, 8192},
      {"indexer.wq_b", 8192, 1024},
      {"shared.gate_up", 4096, 4096, 128, 128, 2048},  // w1 ‖ w3, 2048 rows each
      {"shared.down", 4096, 2048},
  };
  return v;
}

TEST(CudaFp8Linear, FlashShapesMatchTheReference) {
  DSV4_REQUIRE_GPU();
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    uint32_t seed = 10;
    for (const Fp8Shape& s : FlashShapes()) {
      p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
      const StoredWeight sw = RandomFp8(s, ++seed, prec == Precision::kBF16);
      const Both w = Upload(p, sw);
      CompareProducts(p, prec, s, w, {1, 2, 8, 9, 64}, kExactTol, seed * 100);
    }
  }
}

TEST(CudaFp8Linear, GroupedOutputProjectionMatchesTheReference) {
  DSV4_REQUIRE_GPU();
  // wo_a: 8 groups of 1024 rows, each against its own 4096 of the x row.
  const Fp8Shape s{"wo_a", 8 * 1024, 4096, 128, 128, 0, 8};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    const StoredWeight sw = RandomFp8(s, 21, prec == Precision::kBF16);
    const Both w = Upload(p, sw);
    CompareProducts(p, prec, s, w, {1, 2, 8, 9, 64}, kExactTol, 2100);
  }
}

// Precision fp8 (products of >= 128 rows on FP8 tensor cores, x in e4m3 per 1 x 128 group
// with a power-of-two scale) against the reference on the exact x: e4m3 keeps 4 significant bits
// (a relative error up to 2^-4 per value), so the outputs stay within a few percent of their
// scale, while a wrong scale layout or group would be off by its whole size. Below 128 rows the
// bf16 path runs as before. The Flash projections and the grouped wo_a, arbitrary weight scales.
TEST(CudaFp8Linear, Fp8ActivationsStayWithinTheirError) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kFP8);
  uint32_t seed = 60;
  std::vector<Fp8Shape> shapes = FlashShapes();
  shapes.push_back({"wo_a", 8 * 1024, 4096, 128, 128, 0, 8});
  for (const Fp8Shape& s : shapes) {
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    const StoredWeight sw = RandomFp8(s, ++seed, false);
    const Both w = Upload(p, sw);
    for (int64_t m : {128, 131, 300}) {  // 131: rows padded to 144 for cuBLASLt
      double fp8_err = 0;
      CompareProducts(p, Precision::kFP32, s, w, {m}, 4e-2, seed * 100 + m, &fp8_err);
      // The e4m3 activations' error (about 2 % of the scale) is well above the bf16 path's
      // (about 0.1 %): the FP8 path ran, not the fallback.
      std::printf("    %s m=%lld: FP8-activation error %.3g of the output scale\n", s.name,
                  static_cast<long long>(m), fp8_err);
      EXPECT_GT(fp8_err, 5e-3) << s.name << " m=" << m;
    }
    CompareProducts(p, Precision::kBF16, s, w, {64}, kBf16Tol, seed * 100 + 1);
  }
}

// Precision fp8 with FP8 activations from 9 rows (DSV4_FP8_ACTIVATION_ROWS=all) at shapes with
// partial 128 x 128 weight blocks (the dsv4-tiny-fp8 fixture's: K 64, N 64) and row counts that
// need padding: the products stay on the bf16 path (within the bf16 tolerance of the bf16
// reference, where e4m3 activations would be ~20x off it). Whole-block shapes take FP8
// activations (Fp8ActivationsStayWithinTheirError).
TEST(CudaFp8Linear, PartialBlocksStayOnBf16InFp8Precision) {
  DSV4_REQUIRE_GPU();
  const testing::ScopedEnv rows("DSV4_FP8_ACTIVATION_ROWS", "all");
  BackendPair p(Precision::kFP8);
  uint32_t seed = 90;
  const std::vector<Fp8Shape> shapes = {
      {"n256_k64", 256, 64},  {"n64_k128", 64, 128},   {"n192_k128", 192, 128},
      {"n128_k64", 128, 64},  {"n384_k192", 384, 192},
  };
  for (const Fp8Shape& s : shapes) {
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    const Both w = Upload(p, RandomFp8(s, ++seed, false));
    CompareProducts(p, Precision::kBF16, s, w, {64, 58, 128, 131}, kBf16Tol, seed * 100);
  }
}

// ---- small and odd shapes, blocks, parts, groups ----

TEST(CudaFp8Linear, SmallShapesPartialBlocksPartsAndGroups) {
  DSV4_REQUIRE_GPU();
  const std::vector<Fp8Shape> shapes = {
      {"tiny", 64, 128},                  // one partial row block
      {"tiny_narrow", 32, 64},            // cols below one block
      {"rows33", 33, 48},                 // a partial 32-row tile, cols below one k step
      {"cols200", 100, 200},              // cols % 16 != 0: the fallback at every m
      {"odd", 17, 13},                    // nothing aligned
      {"cols40", 24, 40},                 // cols % 16 != 0, % 8 == 0
      {"block64x128", 256, 384, 64, 128},
      {"block128x64", 320, 256, 128, 64},
      {"block48x192", 200, 576, 48, 192},  // row blocks across mma tiles, 3-step column blocks
      {"block128x96", 256, 384, 128, 96},  // block_cols % 64 != 0: the fallback
      {"block32x32", 96, 256, 32, 32},     // the fallback
      {"partial_cols", 96, 2112},          // 16.5 column blocks, k over a cluster of 2 blocks
      {"long_k", 64, 12352},               // a cluster of 4 blocks, the last slice partial
      {"parts", 192, 256, 64, 128, 96},    // 2 parts of 96 rows: the grid restarts mid-block
      {"parts3", 3 * 80, 320, 128, 128, 80},
      {"grouped4", 128, 256, 128, 128, 0, 4},  // group_rows 32
      {"grouped2", 512, 192, 128, 64, 0, 2},
      {"grouped_narrow", 96, 128, 128, 128, 0, 6},  // group_rows 16: the fallback
  };
  const std::vector<int64_t> ms = {1, 3, 8, 9, 20};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    uint32_t seed = 30;
    for (const Fp8Shape& s : shapes) {
      p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
      // Exact weights on every path (bf16: power-of-two scales).
      const Both w = Upload(p, RandomFp8(s, ++seed, prec == Precision::kBF16));
      CompareProducts(p, prec, s, w, ms, kExactTol, seed * 100);
      if (prec == Precision::kBF16) {
        // Arbitrary scales: exact on Fp8Gemv, W rounded to bf16 on the fallback.
        const Both wa = Upload(p, RandomFp8(s, seed + 1000, false));
        CompareProducts(p, prec, s, wa, ms, kBf16Tol, seed * 100 + 50);
      }
    }
  }
}

// ---- exactness of the decode and the dequantisation ----

// Column c of W through the product: x rows are unit vectors, so y[j, n] = W[n, c_j] (one exact
// product, zeros elsewhere; the sign of a zero is not kept).
std::vector<float> UnitRows(int64_t m, int64_t cols, int64_t c0) {
  std::vector<float> x(static_cast<size_t>(m * cols), 0.0f);
  for (int64_t j = 0; j < m; ++j) x[j * cols + c0 + j] = 1.0f;
  return x;
}

// Every column of W read back through Linear with m rows of unit vectors at a time, compared
// value for value with DequantizeFp8Ref (bf16 precision + fallback: its round to nearest even).
void ExpectEveryValue(BackendPair& p, Precision prec, const StoredWeight& sw, int64_t m,
                      bool rounded_bf16) {
  const Fp8Matrix fm = sw.fp8();
  std::vector<float> ref(static_cast<size_t>(fm.rows * fm.cols));
  DequantizeFp8Ref(fm, ref.data());
  if (rounded_bf16) {
    for (float& v : ref) v = Bf16ToF32(F32ToBf16(v));
  }
  const Both w = Upload(p, sw);
  int64_t bad = 0;
  for (int64_t c0 = 0; c0 < fm.cols; c0 += m) {
    const int64_t mm = std::min(m, fm.cols - c0);
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    Both x = p.Input(Shape{mm, fm.cols}, UnitRows(mm, fm.cols, c0));
    Both y = p.Scratch(DType::kF32, Shape{mm, fm.rows});
    const absl::Status st = p.gpu->Linear(x.g, w.g, y.g);
    ASSERT_TRUE(st.ok()) << st;
    const std::vector<float> got = p.HostG(y.g);
    for (int64_t j = 0; j < mm; ++j) {
      for (int64_t n = 0; n < fm.rows; ++n) {
        const float r = ref[n * fm.cols + c0 + j], g = got[j * fm.rows + n];
        if (g != r && bad++ < 5) {
          ADD_FAILURE() << PrecisionName(prec) << " W[" << n << ", " << c0 + j << "] (code 0x"
                        << std::hex << int{sw.data[n * fm.cols + c0 + j]} << std::dec
                        << "): got " << g << ", reference " << r;
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(CudaFp8Linear, GemvDecodesEveryCodeExactly) {
  DSV4_REQUIRE_GPU();
  // 64 x 256: every non-NaN code ~64 times, at every byte position of a lane's 16; 32 x 64
  // blocks with arbitrary scales. 8 unit rows at a time: the Fp8Gemv path, whose output is
  // fmaf(scale, code, 0), i.e. exactly the reference's one rounding.
  const Fp8Shape s{"decode", 64, 256, 32, 64};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    ExpectEveryValue(p, prec, RandomFp8(s, 41, false), kGemvMaxRows, false);
  }
}

TEST(CudaFp8Linear, DequantizeMatchesTheReferenceExactly) {
  DSV4_REQUIRE_GPU();
  // All of W through Fp8Dequantize + the GEMM: unit rows 64 at a time (m > 8), fp32 GEMM with
  // products by 1 and 0 (exact). fp32: DequantizeFp8Ref's values; bf16: their rounding.
  // Vector path (cols % 16 == 0) and element path (cols % 16 != 0), parts and partial blocks.
  const std::vector<Fp8Shape> shapes = {{"dq_vec", 160, 384, 64, 128, 80},
                                        {"dq_elem", 70, 200, 32, 48},
                                        {"dq_odd", 9, 13, 4, 5}};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    uint32_t seed = 50;
    for (const Fp8Shape& s : shapes) {
      SCOPED_TRACE(s.name);
      ExpectEveryValue(p, prec, RandomFp8(s, ++seed, false), 64, prec == Precision::kBF16);
    }
  }
}

TEST(CudaFp8Linear, RepeatedProductsGiveTheSameBits) {
  DSV4_REQUIRE_GPU();
  // The summation order is fixed (no atomics): the same call twice gives the same bits.
  const Fp8Shape s{"wo_b", 4096, 8192};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
    const Both w = Upload(p, RandomFp8(s, 61, false));
    for (int64_t m : {1, 8}) {
      Both x = p.Input(Shape{m, s.cols}, RandomVec(m * s.cols, 62));
      Both y1 = p.Scratch(DType::kF32, Shape{m, s.rows});
      Both y2 = p.Scratch(DType::kF32, Shape{m, s.rows});
      ASSERT_TRUE(p.gpu->Linear(x.g, w.g, y1.g).ok());
      ASSERT_TRUE(p.gpu->Linear(x.g, w.g, y2.g).ok());
      const std::vector<float> a = p.HostG(y1.g), b = p.HostG(y2.g);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << "m=" << m << " " << PrecisionName(prec);
    }
  }
}

}  // namespace
}  // namespace dsv4
