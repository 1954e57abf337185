// The tiled grouped expert GEMMs on FP8 tensor cores (moe_tile_parts.cuh: RunTiledFp8Gemm), the
// precision fp8 path for MXFP4 experts: activations in e4m3 with a power-of-two scale per row and
// 128 columns (QuantizeFp8Groups, DeepSeek's inference recipe), and the experts' e2m1 codes
// expanded to e4m3 in shared memory.
//
// MXFP4 to e4m3: a row's 128 columns of a stage hold four 32-column groups with UE8M0 scales
// s_0..s_3. With E = max s_g, group g's codes become e2m1 x 2^(s_g - E + 6) in e4m3 (at most
// 6 x 64 = 384 < 448; exact while s_g - E >= -14, the smallest group then 2^-14 of the largest),
// and the row's factor 2^(E - 133) is applied with the activation scale when the stage's
// products are added to the accumulators. A group's eight e4m3 magnitudes are a byte table, so a
// code becomes its byte with one byte permute per four codes (and one for the signs).
//
// Same tiles, numbering and pipeline as the bf16 wgmma kernels (moe_tiled_wgmma.cu), with BM 64
// and K slices of 128: two warpgroups, each m64n64k32 against its 64 weight rows; a stage's four
// products go to a second set of accumulators, which the warpgroup then scales and adds.
#include <cuda_fp8.h>

#include <limits>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/moe_tile_parts.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kF8Threads = 256;  // two warpgroups
constexpr int kF8Rows = 64;      // assignments a tile
constexpr int kF8N = 64;         // weight rows a warpgroup
constexpr int kF8K = 128;        // k a stage (bytes of a row)
constexpr int kF8Stages = 4;
constexpr int kF8AStage = kF8Rows * kF8K;  // bytes
constexpr int kF8BStage = kTileN * kF8K;
constexpr int kF8Align = 1024;
constexpr size_t kF8Smem =
    size_t{kF8Stages} * (kF8AStage + kF8BStage) + sizeof(float) * kF8Stages * kTileN + kF8Align;

// Byte offset of 16-byte chunk `c` (0..7) of row r in a 128-byte-row swizzled stage.
__device__ __forceinline__ int SwizzledChunk(int r, int c) { return r * kF8K + (((c ^ r) & 7) << 4); }

// The e4m3 bytes of the e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} x 2^p (p <= 6; below the
// e4m3 range they round, to zero at the end), as a byte-permute table (bytes 0..3 in lo).
__device__ __forceinline__ void E4m3Table(int p, uint32_t* lo, uint32_t* hi) {
  const float f = exp2f(static_cast<float>(p));
  const uint32_t b01 = __nv_cvt_float2_to_fp8x2(make_float2(0.0f, 0.5f * f), __NV_SATFINITE, __NV_E4M3);
  const uint32_t b23 = __nv_cvt_float2_to_fp8x2(make_float2(f, 1.5f * f), __NV_SATFINITE, __NV_E4M3);
  const uint32_t b45 = __nv_cvt_float2_to_fp8x2(make_float2(2.0f * f, 3.0f * f), __NV_SATFINITE, __NV_E4M3);
  const uint32_t b67 = __nv_cvt_float2_to_fp8x2(make_float2(4.0f * f, 6.0f * f), __NV_SATFINITE, __NV_E4M3);
  *lo = b01 | (b23 << 16);
  *hi = b45 | (b67 << 16);
}

// Codes of columns 4 i .. 4 i + 3 (nibbles of the low 16 bits of `w`) to 4 e4m3 bytes.
__device__ __forceinline__ uint32_t E2m1ToE4m3x4(uint32_t w, uint32_t lo, uint32_t hi) {
  const uint32_t mag = __byte_perm(lo, hi, w & 0x7777u);
  const uint32_t sel = ((w >> 3) & 0x1111u) * 7u;  // byte 7 (0x80) where the sign is set
  return mag | __byte_perm(0u, 0x80000000u, sel);
}

// A thread's share of a stage's 128 x 128 weight slice: two (row, 32-column group) items; Load
// into registers one stage ahead, Store expanded (and the row's factor for the first group).
struct F8Mxfp4 {
  const uint8_t* codes[2];
  const uint8_t* scales[2];  // the row's four UE8M0 bytes of the stage at k0 / 32
  int row[2], grp[2];
  uint4 raw[2];
  uint32_t s4[2];
  template <class RowOf>
  __device__ __forceinline__ void Init(const TiledExpertWeights& w, int64_t row0, RowOf row_of,
                                       int64_t k_in) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int item = threadIdx.x + i * kF8Threads;  // 512 items: 128 rows x 4 groups
      row[i] = item >> 2;
      grp[i] = item & 3;
      const int64_t g = row0 + row_of(row[i]);
      codes[i] = w.fp4.w + g * (k_in / 2) + grp[i] * 16;
      scales[i] = w.fp4.scale + g * (k_in / 32);
    }
  }
  __device__ __forceinline__ void Load(int64_t k0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      raw[i] = LoadWeights16(reinterpret_cast<const uint4*>(codes[i] + k0 / 2));
      s4[i] = __ldg(reinterpret_cast<const uint32_t*>(scales[i] + k0 / 32));
    }
  }
  __device__ __forceinline__ void Store(uint8_t* stage, float* factors) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t s = s4[i];
      const int e = max(max(s & 0xFF, (s >> 8) & 0xFF), max((s >> 16) & 0xFF, s >> 24));
      const int sg = (s >> (8 * grp[i])) & 0xFF;
      uint32_t lo, hi;
      E4m3Table(sg - e + 6, &lo, &hi);
      const uint32_t words[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
      uint32_t out[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[2 * j] = E2m1ToE4m3x4(words[j], lo, hi);
        out[2 * j + 1] = E2m1ToE4m3x4(words[j] >> 16, lo, hi);
      }
      // The group's 32 bytes are chunks 2 grp, 2 grp + 1 of the row.
      *reinterpret_cast<uint4*>(stage + SwizzledChunk(row[i], 2 * grp[i])) =
          make_uint4(out[0], out[1], out[2], out[3]);
      *reinterpret_cast<uint4*>(stage + SwizzledChunk(row[i], 2 * grp[i] + 1)) =
          make_uint4(out[4], out[5], out[6], out[7]);
      if (grp[i] == 0) factors[row[i]] = exp2f(static_cast<float>(e - 133));
    }
  }
};

// Tile row r in the expert's weight: as WgWeightRow with N = 64 (gate_up: warpgroup r / 64 holds
// 32 gate rows then the 32 up rows of the same columns).
template <bool kSwiGlu>
__device__ __forceinline__ int64_t F8WeightRow(int r, int32_t n_tile, int64_t n_out) {
  if constexpr (kSwiGlu) {
    const int64_t j = int64_t{n_tile} * (kTileN / 2) + (r / kF8N) * (kF8N / 2);
    const int rr = r % kF8N;
    return rr < kF8N / 2 ? j + rr : n_out + j + rr - kF8N / 2;
  } else {
    return int64_t{n_tile} * kTileN + r;
  }
}

template <bool kSwiGlu>
__global__ void __launch_bounds__(kF8Threads, 2) ExpertFp8Kernel(const TileGemmArgs g) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* const base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kF8Align - 1) & ~uintptr_t{kF8Align - 1});
  uint8_t* const sa = base;                              // [stages][64][128]
  uint8_t* const sb = sa + kF8Stages * kF8AStage;        // [stages][128][128]
  float* const sf = reinterpret_cast<float*>(sb + kF8Stages * kF8BStage);  // [stages][128]

  TileCoord tc;
  if (!FindTile(g, kF8Rows, reinterpret_cast<int32_t*>(base), &tc)) return;
  const int32_t a0 = tc.a0, count = tc.count, n_tile = tc.n_tile, m0 = tc.m0;

  // Activation chunks: 64 rows x 8 chunks = 2 a thread.
  const uint8_t* ap[2];
  int adst[2];
  bool aok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = threadIdx.x + i * kF8Threads, r = c >> 3;
    aok[i] = m0 + r < count;
    int64_t src = 0;
    if (aok[i]) {
      const int32_t a = a0 + m0 + r;
      src = g.by_token ? g.order[a] / g.top_k : a;
    }
    ap[i] = g.x8 + src * g.k_in + (c & 7) * 16;
    adst[i] = SwizzledChunk(r, c & 7);
  }
  const int64_t w_rows = kSwiGlu ? 2 * g.n_out : g.n_out;
  F8Mxfp4 wt;
  wt.Init(g.w, int64_t{tc.e} * w_rows, [&](int r) { return F8WeightRow<kSwiGlu>(r, n_tile, g.n_out); },
          g.k_in);
  auto load_a = [&](int64_t k0, uint8_t* stage) {
#pragma unroll
    for (int i = 0; i < 2; ++i) CpAsync16(stage + adst[i], ap[i] + k0, aok[i]);
  };

  const int wg = threadIdx.x >> 7;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  // The thread's two accumulator rows (assignments) and their activation-scale rows.
  const int m_lo = m0 + 16 * warp + (lane >> 2);
  int64_t srow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m_lo + 8 * h;
    srow[h] = 0;
    if (m < count) {
      const int32_t a = a0 + m;
      srow[h] = g.by_token ? g.order[a] / g.top_k : a;
    }
  }
  float acc[kF8N / 2], part[kF8N / 2];
#pragma unroll
  for (int i = 0; i < kF8N / 2; ++i) acc[i] = 0.0f;

  const int kt_count = static_cast<int>(g.k_in / kF8K);
#pragma unroll
  for (int s = 0; s < kF8Stages - 1; ++s) {
    if (s < kt_count) {
      load_a(int64_t{s} * kF8K, sa + s * kF8AStage);
      wt.Load(int64_t{s} * kF8K);
      wt.Store(sb + s * kF8BStage, sf + s * kTileN);
    }
    CpAsyncCommit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    // This stage's activation scales, loaded before the barrier (they are plain global data).
    const float as0 = __ldg(g.x8_scales + int64_t{kt} * g.x8_rows + srow[0]);
    const float as1 = __ldg(g.x8_scales + int64_t{kt} * g.x8_rows + srow[1]);
    CpAsyncWait<kF8Stages - 2>();
    FenceProxyAsyncShared();
    __syncthreads();
    const int pf = kt + kF8Stages - 1;
    if (pf < kt_count) {
      load_a(int64_t{pf} * kF8K, sa + (pf % kF8Stages) * kF8AStage);
      wt.Load(int64_t{pf} * kF8K);
    }
    CpAsyncCommit();
    const uint8_t* ca = sa + (kt % kF8Stages) * kF8AStage;
    const uint8_t* cb = sb + (kt % kF8Stages) * kF8BStage + wg * kF8N * kF8K;
    WgmmaFenceOperands(part);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kF8K / 32; ++ks) {
      WgmmaE4m3N64(part, WgmmaDescSw128(ca + ks * 32), WgmmaDescSw128(cb + ks * 32), ks > 0);
    }
    WgmmaCommit();
    if (pf < kt_count) wt.Store(sb + (pf % kF8Stages) * kF8BStage, sf + (pf % kF8Stages) * kTileN);
    WgmmaWait<0>();
    WgmmaFenceOperands(part);
    // acc += part x (activation scale of the row) x (weight factor of the column).
    const float* f = sf + (kt % kF8Stages) * kTileN + wg * kF8N;
#pragma unroll
    for (int j = 0; j < kF8N / 8; ++j) {
      const float2 wf = *reinterpret_cast<const float2*>(f + 8 * j + 2 * (lane & 3));
      acc[4 * j + 0] = fmaf(part[4 * j + 0], as0 * wf.x, acc[4 * j + 0]);
      acc[4 * j + 1] = fmaf(part[4 * j + 1], as0 * wf.y, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(part[4 * j + 2], as1 * wf.x, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(part[4 * j + 3], as1 * wf.y, acc[4 * j + 3]);
    }
  }
  CpAsyncWait<0>();

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int32_t m = m_lo + 8 * half;
    if (m >= count) continue;
    const int64_t a = a0 + m;
    if constexpr (kSwiGlu) {
      float* h = static_cast<float*>(g.y) + a * g.n_out;
#pragma unroll
      for (int j = 0; j < kF8N / 16; ++j) {
        const int64_t col = int64_t{n_tile} * (kTileN / 2) + wg * (kF8N / 2) + 8 * j + 2 * (lane & 3);
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          v[q] = ClampedSwiGlu(acc[4 * j + 2 * half + q],
                               acc[4 * (j + kF8N / 16) + 2 * half + q], g.limit);
        }
        *reinterpret_cast<float2*>(h + col) = make_float2(v[0], v[1]);
      }
    } else {
      float* yr = static_cast<float*>(g.y) + int64_t{g.order[a]} * g.n_out +
                  int64_t{n_tile} * kTileN + wg * kF8N;
#pragma unroll
      for (int j = 0; j < kF8N / 8; ++j) {
        *reinterpret_cast<float2*>(yr + 8 * j + 2 * (lane & 3)) =
            make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

}  // namespace

absl::Status RunTiledFp8Gemm(bool swiglu, const TileGemmArgs& g, int64_t assignments,
                             cudaStream_t stream) {
  if (g.w.format != QuantFormat::kMxfp4 || g.x8 == nullptr || g.x8_scales == nullptr ||
      g.k_in % kF8K != 0 || reinterpret_cast<uintptr_t>(g.w.fp4.scale) % 4 != 0) {
    return absl::InvalidArgumentError(
        "MoeExpertsTiled: the FP8 kernels take MXFP4 experts, e4m3 activations and K % 128 == 0");
  }
  auto kernel = swiglu ? ExpertFp8Kernel<true> : ExpertFp8Kernel<false>;
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(kF8Smem)));
  CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(kernel,
                                            cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
  const int64_t bound = TileGridBound(assignments, g.experts, kF8Rows, g.n_tiles);
  if (bound > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("MoeExpertsTiled: more tiles than a grid holds");
  }
  kernel<<<static_cast<unsigned>(bound), kF8Threads, kF8Smem, stream>>>(g);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
