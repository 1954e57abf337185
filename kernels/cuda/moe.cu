#include "kernels/cuda/moe.h"

#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "common/status.h"
#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_mma.cuh"
#include "kernels/cuda/moe_tiled.h"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExpertsPerLane = 32;  // E <= 1024
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float Softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp per token. Expert e lives in slot e % kSlots of lane e / kSlots (kSlots = the
// smallest power of two >= E / 32, so E = 256 needs 8 registers per lane, not 32). The selection
// key of a slot is packed into one 64-bit word, (order-preserving bits of score + bias) << 32 |
// ~e, so that one integer max is "largest key, ties to the lower expert index" (-0 counts as +0,
// NaN below everything, as a float compare never picks it); top-k is top_k passes of a
// lane-local max over the slots and a 5-step warp max, with the winner's key set to -inf after
// it is taken (as before). Lane k keeps pick k; the weight sum is added in k order.
__device__ __forceinline__ uint64_t RouteKey(float key, int32_t e) {
  if (key == 0.0f) key = 0.0f;  // -0 == +0 in the float compare
  const uint32_t b = __float_as_uint(key);
  uint32_t o = (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
  if (key != key) o = 0;
  return (static_cast<uint64_t>(o) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(e));
}

template <int kSlots>
__global__ void RouteKernel(RouterDims d, const float* logits, const float* bias,
                            const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx,
                            float* weights) {
  PdlTrigger();  // the single-token expert kernels launch early (they wait before reading idx)
  PdlWait();
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= d.tokens) return;  // uniform across the warp
  const float* l = logits + t * d.experts;
  const int top_k = static_cast<int>(d.top_k);
  int32_t my_e = 0;
  float my_s = 0.0f;
  if (tid2eid != nullptr) {
    if (lane < top_k) {
      const int64_t tok = token_ids[t];
      my_e = tid2eid[tok * d.top_k + lane];
      my_s = my_e >= 0 && my_e < d.experts ? sqrtf(Softplus(l[my_e])) : 0.0f;
    }
  } else {
    float score[kSlots];
    uint64_t key[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int32_t e = lane * kSlots + i;
      if (e < d.experts) {
        score[i] = sqrtf(Softplus(l[e]));
        key[i] = RouteKey(score[i] + (bias != nullptr ? bias[e] : 0.0f), e);
      } else {
        score[i] = 0.0f;
        key[i] = 0;  // below every real expert
      }
    }
    for (int k = 0; k < top_k; ++k) {
      uint64_t best = key[0];
#pragma unroll
      for (int i = 1; i < kSlots; ++i) best = key[i] > best ? key[i] : best;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const uint64_t ob = __shfl_xor_sync(0xffffffffu, best, o);
        best = ob > best ? ob : best;
      }
      const int32_t be = static_cast<int32_t>(~static_cast<uint32_t>(best & 0xffffffffu));
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        if (lane * kSlots + i == be) {
          v = score[i];
          key[i] = RouteKey(-INFINITY, be);
        }
      }
      v = __shfl_sync(0xffffffffu, v, (be / kSlots) & 31);
      if (lane == k) {
        my_e = be;
        my_s = v;
      }
    }
  }
  float sum = 0;
  for (int k = 0; k < top_k; ++k) sum += __shfl_sync(0xffffffffu, my_s, k);
  if (lane < top_k) {
    idx[t * d.top_k + lane] = my_e;
    weights[t * d.top_k + lane] = my_s / (sum + 1e-20f) * d.routed_scale;
  }
}

__global__ void SwiGluKernel(const float* gu, int64_t rows, int64_t inter, float limit, float* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    h[i] = ClampedSwiGlu(gu[r * 2 * inter + c], gu[r * 2 * inter + inter + c], limit);
  }
}

// Expert boundaries from the sorted expert ids: offsets[e] = first sorted assignment of expert e
// (experts without assignments start where the next one does), active[i] = the i-th expert that
// has assignments, *num_active, and wide[i] / *num_wide the same for the experts with more than
// kMmaTokens. Single block: per-expert counts (integer shared-memory atomics, so the result does
// not depend on their order) and block scans; an earlier version walked the experts serially in
// one thread, a long dependent chain of global accesses at every step.
constexpr int kOffsetsThreads = 1024;
using OffsetsScan = cub::BlockScan<int32_t, kOffsetsThreads>;

// From per-expert counts: offsets[e] (the running sum), the active list and the wide list
// (experts with more than kMmaTokens; none when `wide` is null); chunks of kOffsetsThreads
// experts carry the totals (uniform trip count). With `rebase`, count[e] becomes offsets[e]
// (each thread touches only its own entries). Returns {assignments counted, active, wide}, the
// same in every thread.
__device__ int3 ExpertLists(int32_t* count, int64_t experts, bool rebase,
                            OffsetsScan::TempStorage& scan, int32_t* offsets, int32_t* active,
                            int32_t* wide) {
  int32_t start = 0, ranked = 0, wide_ranked = 0;
  for (int64_t base = 0; base < experts; base += kOffsetsThreads) {
    const int64_t e = base + threadIdx.x;
    const int32_t c = e < experts ? count[e] : 0;
    int32_t off, total, rank, total_active, wrank, total_wide;
    OffsetsScan(scan).ExclusiveSum(c, off, total);
    __syncthreads();  // the scan storage is reused
    OffsetsScan(scan).ExclusiveSum(c > 0 ? 1 : 0, rank, total_active);
    __syncthreads();
    wrank = total_wide = 0;
    if (wide != nullptr) {  // uniform: no wide list where no expert can have more than 8
      OffsetsScan(scan).ExclusiveSum(c > kMmaTokens ? 1 : 0, wrank, total_wide);
      __syncthreads();
    }
    if (e < experts) {
      offsets[e] = start + off;
      if (rebase) count[e] = start + off;
      if (c > 0) active[ranked + rank] = static_cast<int32_t>(e);
      if (wide != nullptr && c > kMmaTokens) wide[wide_ranked + wrank] = static_cast<int32_t>(e);
    }
    start += total;
    ranked += total_active;
    wide_ranked += total_wide;
  }
  return make_int3(start, ranked, wide_ranked);
}

__global__ void __launch_bounds__(kOffsetsThreads)
    OffsetsKernel(const int32_t* sorted_experts, int64_t assignments, int64_t experts,
                  int32_t* offsets, int32_t* active, int32_t* num_active, int32_t* wide,
                  int32_t* num_wide) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* count = reinterpret_cast<int32_t*>(smem_raw);  // [experts]
  __shared__ OffsetsScan::TempStorage scan;
  for (int64_t e = threadIdx.x; e < experts; e += kOffsetsThreads) count[e] = 0;
  __syncthreads();
  for (int64_t a = threadIdx.x; a < assignments; a += kOffsetsThreads) {
    const int32_t e = sorted_experts[a];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int3 totals = ExpertLists(count, experts, false, scan, offsets, active, wide);
  if (threadIdx.x == 0) {
    offsets[experts] = totals.x;  // the counted assignments: the last range is its count
    *num_active = totals.y;
    *num_wide = totals.z;
  }
}

// Decode-sized batches (assignments <= kSmallSortMax): the stable sort by expert, the offsets
// and the active list in one block, replacing Iota + the radix sort (several launches) +
// OffsetsKernel. Counts as in OffsetsKernel (the count does not depend on the order), then
// count[e] becomes the first sorted position of expert e, and assignment a goes to
// count[e] + (number of earlier assignments of e): the stable order the radix sort gives.
// Assignments with an expert id outside [0, E) get no slot (OffsetsKernel skips them too).
constexpr int kSmallSortMax = kOffsetsThreads;
__global__ void __launch_bounds__(kOffsetsThreads)
    SmallSortKernel(const int32_t* idx, int64_t assignments, int64_t experts, int32_t* order,
                    int32_t* offsets, int32_t* active, int32_t* num_active, int32_t* wide,
                    int32_t* num_wide) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int32_t* count = reinterpret_cast<int32_t*>(smem_raw);  // [experts]
  __shared__ int32_t ex[kSmallSortMax];
  __shared__ OffsetsScan::TempStorage scan;
  for (int64_t e = threadIdx.x; e < experts; e += kOffsetsThreads) count[e] = 0;
  if (threadIdx.x < assignments) ex[threadIdx.x] = idx[threadIdx.x];
  __syncthreads();
  if (threadIdx.x < assignments) {
    const int32_t e = ex[threadIdx.x];
    if (e >= 0 && e < experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int3 totals = ExpertLists(count, experts, true, scan, offsets, active, wide);
  if (threadIdx.x == 0) {
    offsets[experts] = totals.x;
    *num_active = totals.y;
    *num_wide = totals.z;
  }
  __syncthreads();
  if (threadIdx.x < assignments) {
    const int a = threadIdx.x;
    const int32_t e = ex[a];
    if (e >= 0 && e < experts) {
      int32_t r = 0;
      for (int b = 0; b < a; ++b) r += ex[b] == e ? 1 : 0;
      order[count[e] + r] = a;
    }
  }
}

__global__ void IotaKernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int32_t>(i);
  }
}

// out[t] = Σ_k weights[t, k] · y[pos(t, k)], k in order; pos is the identity (y already in
// (t, k) order) when `position` is null.
__global__ void CombineKernel(const float* y, const int32_t* position, const float* weights,
                              int64_t top_k, int64_t dim, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t p = position != nullptr ? position[t * top_k + k] : t * top_k + k;
      acc += weights[t * top_k + k] * y[p * dim + i];
    }
    out[t * dim + i] = acc;
  }
}

__global__ void InvertKernel(const int32_t* order, int64_t n, int32_t* position) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    position[order[i]] = static_cast<int32_t>(i);
  }
}

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

size_t SortTempBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(n));
  return bytes;
}

// Lays out (or, with base == nullptr, sizes) the workspace.
size_t Layout(const ExpertsDims& d, void* base, MoeWorkspace* w) {
  const int64_t a = d.tokens * d.top_k;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    void* p = base == nullptr ? nullptr : static_cast<char*>(base) + off;
    off += Align(bytes);
    return p;
  };
  w->keys_out = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->order_in = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->order = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->position = static_cast<int32_t*>(take(sizeof(int32_t) * a));
  w->offsets = static_cast<int32_t*>(take(sizeof(int32_t) * (d.experts + 1)));
  w->active = static_cast<int32_t*>(take(sizeof(int32_t) * d.experts));
  w->num_active = static_cast<int32_t*>(take(sizeof(int32_t)));
  w->wide = static_cast<int32_t*>(take(sizeof(int32_t) * d.experts));
  w->num_wide = static_cast<int32_t*>(take(sizeof(int32_t)));
  w->gu = static_cast<float*>(take(sizeof(float) * a * 2 * d.inter));
  w->h = static_cast<float*>(take(sizeof(float) * a * d.inter));
  w->y = static_cast<float*>(take(sizeof(float) * a * d.dim));
  w->xb = static_cast<uint16_t*>(take(sizeof(uint16_t) * d.tokens * d.dim));
  w->tile_start = static_cast<int32_t*>(take(sizeof(int32_t) * (d.experts + 1)));
  w->sort_bytes = SortTempBytes(a);
  w->sort_temp = take(w->sort_bytes);
  return off;
}

}  // namespace

__global__ void LocalizeExpertsKernel(int32_t* idx, float* weights, int64_t n, int64_t begin,
                                      int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t local = idx[i] - begin;
  if (local >= 0 && local < count) {
    idx[i] = static_cast<int32_t>(local);
  } else {
    idx[i] = 0;
    weights[i] = 0.0f;
  }
}

absl::Status LocalizeExperts(int32_t* idx, float* weights, int64_t n, int64_t begin, int64_t count,
                             cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  if (count < 1) return absl::InvalidArgumentError("LocalizeExperts: no local experts");
  const int threads = 256;
  LocalizeExpertsKernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      idx, weights, n, begin, count);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Route(const RouterDims& d, const float* logits, const float* bias,
                   const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx, float* weights,
                   cudaStream_t stream) {
  if (d.experts > 32 * kMaxExpertsPerLane || d.top_k > kMaxTopK) {
    return absl::UnimplementedError("router: at most 1024 experts and top-16 are compiled");
  }
  if (d.tokens == 0) return absl::OkStatus();
  const int threads = 128;
  const unsigned blocks = static_cast<unsigned>((d.tokens * 32 + threads - 1) / threads);
  const int64_t per_lane = (d.experts + 31) / 32;
  cudaError_t err = cudaSuccess;
  auto launch = [&](auto kernel) {
    err = LaunchPdl(kernel, dim3(blocks), dim3(threads), 0, stream, d, logits, bias, tid2eid,
                    token_ids, idx, weights);
  };
  if (per_lane <= 1) {
    launch(RouteKernel<1>);
  } else if (per_lane <= 2) {
    launch(RouteKernel<2>);
  } else if (per_lane <= 4) {
    launch(RouteKernel<4>);
  } else if (per_lane <= 8) {
    launch(RouteKernel<8>);
  } else if (per_lane <= 16) {
    launch(RouteKernel<16>);
  } else {
    launch(RouteKernel<32>);
  }
  CUDA_RETURN_IF_ERROR(err);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status SwiGlu(const float* gate_up, int64_t rows, int64_t inter, float limit, float* h,
                    cudaStream_t stream) {
  if (rows * inter == 0) return absl::OkStatus();
  const int64_t n = rows * inter;
  SwiGluKernel<<<static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535)), 256, 0, stream>>>(
      gate_up, rows, inter, limit, h);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

size_t MoeWorkspaceBytes(const ExpertsDims& d) {
  MoeWorkspace w;
  return Layout(d, nullptr, &w);
}

MoeWorkspace MoeWorkspaceLayout(const ExpertsDims& d, void* base) {
  MoeWorkspace w;
  Layout(d, base, &w);
  return w;
}

absl::Status SortAssignments(const ExpertsDims& d, const int32_t* idx, bool list_wide,
                             const MoeWorkspace& w, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  int32_t* wide_list = list_wide ? w.wide : nullptr;
  // Sort the assignments (t, k) by expert; radix sort is stable, so each expert's assignments
  // stay in (t, k) order.
  const size_t offsets_smem = sizeof(int32_t) * static_cast<size_t>(d.experts);
  if (a <= kSmallSortMax) {
    // Decode: sort, offsets and active list in one launch.
    if (offsets_smem > 32 * 1024) {  // + ~8 KiB static: under the 48 KiB default
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SmallSortKernel,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(offsets_smem)));
    }
    SmallSortKernel<<<1, kOffsetsThreads, offsets_smem, stream>>>(
        idx, a, d.experts, w.order, w.offsets, w.active, w.num_active, wide_list, w.num_wide);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  IotaKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order_in, a);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  size_t sort_bytes = w.sort_bytes;
  int end_bit = 1;
  while ((int64_t{1} << end_bit) < d.experts) ++end_bit;
  CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(w.sort_temp, sort_bytes, idx, w.keys_out,
                                                       w.order_in, w.order, static_cast<int>(a),
                                                       0, end_bit, stream));
  if (offsets_smem > 48 * 1024) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(OffsetsKernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(offsets_smem)));
  }
  OffsetsKernel<<<1, kOffsetsThreads, offsets_smem, stream>>>(
      w.keys_out, a, d.experts, w.offsets, w.active, w.num_active, wide_list, w.num_wide);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status InvertOrder(const ExpertsDims& d, const MoeWorkspace& w, cudaStream_t stream) {
  const int64_t a = d.tokens * d.top_k;
  InvertKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order, a, w.position);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CombineAssignments(const ExpertsDims& d, const float* y, const int32_t* position,
                                const float* weights, float* out, cudaStream_t stream) {
  CombineKernel<<<static_cast<unsigned>(d.tokens), 256, 0, stream>>>(y, position, weights,
                                                                     d.top_k, d.dim, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MoeExperts(const ExpertsDims& d, const float* u, const int32_t* idx,
                        const float* weights, const void* gate_up, const void* down, DType wdtype,
                        void* workspace, float* out, cudaStream_t stream,
                        const MoeKernels& kernels) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.dim % 8 != 0 || d.inter % 8 != 0) {
    return absl::UnimplementedError("MoE: hidden and intermediate sizes must be multiples of 8");
  }
  const MoeWorkspace w = MoeWorkspaceLayout(d, workspace);
  const int64_t a = d.tokens * d.top_k;
  const bool mma = kernels.tensor_cores && wdtype == DType::kBF16 && MmaFits(d.dim) &&
                   MmaFits(d.inter) && Aligned16(u) && Aligned16(gate_up) && Aligned16(down);
  TiledExpertWeights tgu, tdn;
  tgu.bf16 = gate_up;
  tdn.bf16 = down;
  const int tiled_rows = mma ? MoeTiledRows(d, tgu, tdn, kernels.tiled) : 0;
  // Experts with more than 8 assignments go to the wide kernel when one can have them; the sort
  // kernels list them.
  const bool use_wide = mma && tiled_rows == 0 && UseWide(kernels.wide, d.tokens, a, d.experts);
  RETURN_IF_ERROR(SortAssignments(d, idx, use_wide, w, stream));
  if (tiled_rows > 0) {
    return MoeExpertsTiled(d, tiled_rows, kernels.Tiled(), kernels.tile_warps,
                           /*fp8=*/false, u, weights, tgu, tdn, w, out, stream);
  }
  if (mma) {
    return RunExpertMma<Bf16Weights>(d, u, weights, static_cast<const __nv_bfloat16*>(gate_up),
                                     static_cast<const __nv_bfloat16*>(down), use_wide, w, out,
                                     stream);
  }
  RETURN_IF_ERROR(InvertOrder(d, w, stream));
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  const int64_t n_gu = 2 * d.inter;
  constexpr int kRows = kMoeRowsPerWarp * kWarps;
  const dim3 grid_gu(static_cast<unsigned>((n_gu + kRows - 1) / kRows), max_active);
  const dim3 grid_down(static_cast<unsigned>((d.dim + kRows - 1) / kRows), max_active);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<DenseRows<__nv_bfloat16>, kMoeRowsPerWarp>
        <<<grid_gu, kGemmThreads, 0, stream>>>(u, d.dim, true, d.top_k,
                                               static_cast<const __nv_bfloat16*>(gate_up), n_gu,
                                               d.dim, w.order, w.offsets, w.active, w.num_active,
                                               0, w.gu);
  } else {
    GroupedGemvKernel<DenseRows<float>, kMoeRowsPerWarp><<<grid_gu, kGemmThreads, 0, stream>>>(
        u, d.dim, true, d.top_k, static_cast<const float*>(gate_up), n_gu, d.dim, w.order,
        w.offsets, w.active, w.num_active, 0, w.gu);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  RETURN_IF_ERROR(SwiGlu(w.gu, a, d.inter, d.swiglu_limit, w.h, stream));
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<DenseRows<__nv_bfloat16>, kMoeRowsPerWarp>
        <<<grid_down, kGemmThreads, 0, stream>>>(w.h, d.inter, false, d.top_k,
                                                 static_cast<const __nv_bfloat16*>(down), d.dim,
                                                 d.inter, w.order, w.offsets, w.active,
                                                 w.num_active, 0, w.y);
  } else {
    GroupedGemvKernel<DenseRows<float>, kMoeRowsPerWarp><<<grid_down, kGemmThreads, 0, stream>>>(
        w.h, d.inter, false, d.top_k, static_cast<const float*>(down), d.dim, d.inter, w.order,
        w.offsets, w.active, w.num_active, 0, w.y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return CombineAssignments(d, w.y, w.position, weights, out, stream);
}

}  // namespace dsv4::cuda
