#include "kernels/cuda/small_gemv.h"

#include <cooperative_groups.h>

#include <algorithm>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_mma.cuh"

namespace dsv4::cuda {
namespace {

// ---- SmallGemv: split-K over a thread-block cluster ----
//
// y[m, n] = x[m, k] · W[n, k]ᵀ for m <= 8, W fp32 or bf16 (x rounded to bf16 for bf16 W, as in
// the GEMM convention), fp32 accumulation. A 2-8 MB weight streamed by a few dozen blocks is
// latency-bound (each block waits on its own long chain of loads), so the grid is (16-row
// tile) x (K slice): the C blocks of a thread-block cluster (C <= 8, portable) share one tile and
// each reads one contiguous K slice, every lane issuing all of its 16-byte weight loads (up to
// kSgUnroll x 2 rows) before using any. Within a block warp w owns rows 2w, 2w+1 of the tile;
// warp sums (fixed butterfly) go to shared memory, and after a cluster barrier block rank 0 adds
// the C partials of each output through distributed shared memory in rank order: deterministic,
// no atomics, no workspace (so the declaration of SmallGemv stays as it is).
constexpr int kSgThreads = 256;
constexpr int kSgWarps = kSgThreads / 32;
constexpr int kSgRowsPerWarp = 2;
constexpr int kSgRows = kSgWarps * kSgRowsPerWarp;  // rows per tile (block)
// 16-byte loads per lane per row in flight: 512 elements of K per warp pass (fp32: 4, bf16: 2),
// which is the whole slice of a 4096-wide K split 8 ways.
constexpr int kSgMaxCluster = 8;                      // portable cluster size
constexpr int64_t kSgMinSlice = 512;                  // K per block at least (elements)
constexpr int kSgMaxM = static_cast<int>(kSmallGemvMaxRows);

template <typename W>
__global__ void __launch_bounds__(kSgThreads, 3) SplitGemvKernel(const float* x, int m, int64_t k,
                                                              const W* w, int64_t n,
                                                              int64_t k_slice, float* y) {
  PdlTrigger();
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned csize = cluster.num_blocks();
  const unsigned rank = cluster.block_rank();
  __shared__ float part[kSgMaxM][kSgRows];
  constexpr int kVec = 16 / sizeof(W);
  constexpr int kSgUnroll = 512 / (32 * kVec);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t tile = blockIdx.x / csize;
  const int64_t k0 = static_cast<int64_t>(rank) * k_slice;
  const int64_t k1 = k0 + k_slice < k ? k0 + k_slice : k;
  const int64_t row0 = tile * kSgRows + warp * kSgRowsPerWarp;
  const W* wr[kSgRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kSgRowsPerWarp; ++r) {
    const int64_t row = row0 + r;
    wr[r] = w + (row < n ? row : 0) * k;  // rows past the end read row 0, never stored
  }
  float acc[kSgRowsPerWarp][kSgMaxM];
#pragma unroll
  for (int r = 0; r < kSgRowsPerWarp; ++r) {
#pragma unroll
    for (int j = 0; j < kSgMaxM; ++j) acc[r][j] = 0.0f;
  }
  constexpr int64_t kStep = 32 * kVec * kSgUnroll;
  uint4 raw[kSgUnroll][kSgRowsPerWarp];
  auto load = [&](int64_t cb) {
#pragma unroll
    for (int u = 0; u < kSgUnroll; ++u) {
      const int64_t c = cb + u * 32 * kVec;
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        raw[u][r] = c < k1 ? LoadWeights16(reinterpret_cast<const uint4*>(wr[r] + c))
                           : make_uint4(0, 0, 0, 0);
      }
    }
  };
  // w is a plain weight: the first batch is loaded before the PDL wait (overlapping the previous
  // kernel's tail), x only after it; each later batch is loaded once the previous one is used.
  const int64_t first = k0 + lane * kVec;
  if (first < k1) load(first);
  PdlWait();
  for (int64_t cb = first; cb < k1; cb += kStep) {
#pragma unroll
    for (int u = 0; u < kSgUnroll; ++u) {
      const int64_t c = cb + u * 32 * kVec;
      if (c >= k1) break;
      float wv[kSgRowsPerWarp][kVec];
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        if constexpr (sizeof(W) == 2) {
          const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[u][r]);
#pragma unroll
          for (int v = 0; v < kVec / 2; ++v) {
            const float2 f = __bfloat1622float2(p2[v]);
            wv[r][2 * v] = f.x;
            wv[r][2 * v + 1] = f.y;
          }
        } else {
          const float* pf = reinterpret_cast<const float*>(&raw[u][r]);
#pragma unroll
          for (int v = 0; v < kVec; ++v) wv[r][v] = pf[v];
        }
      }
#pragma unroll
      for (int j = 0; j < kSgMaxM; ++j) {
        if (j < m) {
          float xv[kVec];
          const float4* xp = reinterpret_cast<const float4*>(x + j * k + c);
#pragma unroll
          for (int v4 = 0; v4 < kVec / 4; ++v4) {
            const float4 f = __ldg(xp + v4);
            xv[4 * v4] = f.x;
            xv[4 * v4 + 1] = f.y;
            xv[4 * v4 + 2] = f.z;
            xv[4 * v4 + 3] = f.w;
          }
          if constexpr (sizeof(W) == 2) {
#pragma unroll
            for (int v = 0; v < kVec; ++v) xv[v] = __bfloat162float(__float2bfloat16_rn(xv[v]));
          }
#pragma unroll
          for (int r = 0; r < kSgRowsPerWarp; ++r) {
            float sum = 0.0f;
#pragma unroll
            for (int v = 0; v < kVec; ++v) sum += wv[r][v] * xv[v];
            acc[r][j] += sum;
          }
        }
      }
    }
    if (cb + kStep < k1) load(cb + kStep);
  }
#pragma unroll
  for (int j = 0; j < kSgMaxM; ++j) {
    if (j < m) {  // uniform
#pragma unroll
      for (int r = 0; r < kSgRowsPerWarp; ++r) {
        const float v = WarpSum(acc[r][j]);
        if (lane == 0) part[j][warp * kSgRowsPerWarp + r] = v;
      }
    }
  }
  cluster.sync();  // every block's partials are written and visible cluster-wide
  if (rank == 0 && threadIdx.x < m * kSgRows) {
    const int j = threadIdx.x / kSgRows, r = threadIdx.x % kSgRows;
    float sum = 0.0f;
    for (unsigned s = 0; s < csize; ++s) sum += *cluster.map_shared_rank(&part[j][r], s);
    const int64_t row = tile * kSgRows + r;
    if (row < n) y[static_cast<int64_t>(j) * n + row] = sum;
  }
  cluster.sync();  // no block leaves while rank 0 still reads its shared memory
}

template <typename W>
absl::Status LaunchSplitGemv(const float* x, int64_t m, int64_t k, const W* w, int64_t n,
                             float* y, cudaStream_t stream) {
  const int64_t tiles = (n + kSgRows - 1) / kSgRows;
  const int64_t c = std::min<int64_t>(kSgMaxCluster, std::max<int64_t>(1, k / kSgMinSlice));
  // Slices of whole 8-element vectors (16 bytes of bf16, two of fp32).
  const int64_t k_slice = ((k + c - 1) / c + 7) / 8 * 8;
  CUDA_RETURN_IF_ERROR(LaunchPdlCluster(SplitGemvKernel<W>, dim3(static_cast<unsigned>(tiles * c)),
                                        dim3(kSgThreads), 0, stream, static_cast<unsigned>(c), x,
                                        static_cast<int>(m), k, w, n, k_slice, y));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status SmallGemv(const float* x, int64_t m, int64_t k, const void* w, DType wdtype, int64_t n,
                       float* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (m > kSmallGemvMaxRows || k % 8 != 0) {
    return absl::InvalidArgumentError("SmallGemv: needs m <= 8 and k a multiple of 8");
  }
  if (Aligned16(x) && Aligned16(w) && (wdtype == DType::kBF16 || wdtype == DType::kF32)) {
    // Split-K over a cluster: >= 128 blocks for a 256-row, 4096-wide weight.
    if (wdtype == DType::kBF16) {
      return LaunchSplitGemv(x, m, k, static_cast<const __nv_bfloat16*>(w), n, y, stream);
    }
    return LaunchSplitGemv(x, m, k, static_cast<const float*>(w), n, y, stream);
  }
  constexpr int kRows = kGemvRowsPerWarp * kWarps;
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows), 1);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<DenseRows<__nv_bfloat16>, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const __nv_bfloat16*>(w), n, k, nullptr, nullptr, nullptr,
        nullptr, static_cast<int32_t>(m), y);
  } else {
    GroupedGemvKernel<DenseRows<float>, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const float*>(w), n, k, nullptr, nullptr, nullptr, nullptr,
        static_cast<int32_t>(m), y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
