#include "kernels/cuda/moe.h"

#include <cub/device/device_radix_sort.cuh>

#include "kernels/common/cuda_check.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kMaxExpertsPerLane = 32;  // E <= 1024
constexpr int kMaxTopK = 16;

__device__ __forceinline__ float Softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// One warp per token.
__global__ void RouteKernel(RouterDims d, const float* logits, const float* bias,
                            const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx,
                            float* weights) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= d.tokens) return;
  const float* l = logits + t * d.experts;
  float score[kMaxExpertsPerLane];
  float key[kMaxExpertsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxExpertsPerLane; ++i) {
    const int64_t e = lane + 32 * i;
    if (e < d.experts) {
      score[i] = sqrtf(Softplus(l[e]));
      key[i] = score[i] + (bias != nullptr ? bias[e] : 0.0f);
    } else {
      score[i] = 0.0f;
      key[i] = -INFINITY;
    }
  }
  int32_t chosen[kMaxTopK];
  float chosen_score[kMaxTopK];
  if (tid2eid != nullptr) {
    const int64_t tok = token_ids[t];
    for (int k = 0; k < d.top_k; ++k) {
      chosen[k] = tid2eid[tok * d.top_k + k];
      // Score of that expert, from the lane that holds it.
      const int owner = chosen[k] % 32, slot = chosen[k] / 32;
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxExpertsPerLane; ++i) {
        if (i == slot) v = score[i];
      }
      chosen_score[k] = __shfl_sync(0xffffffffu, v, owner);
    }
  } else {
    for (int k = 0; k < d.top_k; ++k) {
      // Warp argmax of key (ties to the lower expert index), then remove the winner.
      float best = -INFINITY;
      int32_t best_e = INT32_MAX;
#pragma unroll
      for (int i = 0; i < kMaxExpertsPerLane; ++i) {
        const int32_t e = lane + 32 * i;
        if (key[i] > best || (key[i] == best && e < best_e)) {
          best = key[i];
          best_e = e;
        }
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oe = __shfl_xor_sync(0xffffffffu, best_e, o);
        if (ob > best || (ob == best && oe < best_e)) {
          best = ob;
          best_e = oe;
        }
      }
      chosen[k] = best_e;
      float v = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxExpertsPerLane; ++i) {
        if (lane + 32 * i == best_e) {
          v = score[i];
          key[i] = -INFINITY;
        }
      }
      chosen_score[k] = __shfl_sync(0xffffffffu, v, best_e % 32);
    }
  }
  if (lane == 0) {
    float sum = 0;
    for (int k = 0; k < d.top_k; ++k) sum += chosen_score[k];
    for (int k = 0; k < d.top_k; ++k) {
      idx[t * d.top_k + k] = chosen[k];
      weights[t * d.top_k + k] = chosen_score[k] / (sum + 1e-20f) * d.routed_scale;
    }
  }
}

__global__ void SwiGluKernel(const float* gu, int64_t rows, int64_t inter, float limit, float* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * inter;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / inter, c = i % inter;
    const float g = fminf(gu[r * 2 * inter + c], limit);
    const float u = fminf(fmaxf(gu[r * 2 * inter + inter + c], -limit), limit);
    h[i] = g / (1.0f + expf(-g)) * u;
  }
}

// Expert boundaries from the sorted expert ids: offsets[e] = first sorted assignment of expert e,
// active[i] = the i-th expert that has assignments, *num_active.
__global__ void OffsetsKernel(const int32_t* sorted_experts, int64_t assignments, int64_t experts,
                              int32_t* offsets, int32_t* active, int32_t* num_active) {
  // Single block.
  for (int64_t e = threadIdx.x; e <= experts; e += blockDim.x) offsets[e] = static_cast<int32_t>(assignments);
  __syncthreads();
  for (int64_t a = threadIdx.x; a < assignments; a += blockDim.x) {
    const int32_t e = sorted_experts[a];
    if (a == 0 || sorted_experts[a - 1] != e) offsets[e] = static_cast<int32_t>(a);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Experts without assignments start where the next one does.
    for (int64_t e = experts - 1; e >= 0; --e) {
      if (offsets[e] > offsets[e + 1]) offsets[e] = offsets[e + 1];
    }
    int32_t n = 0;
    for (int64_t e = 0; e < experts; ++e) {
      if (offsets[e + 1] > offsets[e]) active[n++] = static_cast<int32_t>(e);
    }
    *num_active = n;
  }
}

__global__ void IotaKernel(int32_t* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = static_cast<int32_t>(i);
  }
}

// y[a, :N] = W[e] · x[src(a)] for the sorted assignments a of expert e = active[blockIdx.y];
// rows [blockIdx.x * kRows, ...). Inputs staged in shared memory 8 assignments at a time, K in
// chunks; each warp owns kRows / warps rows. src(a) = order[a] / top_k (token) when
// `by_token`, else order position a itself (rows of `x` already in sorted order).
constexpr int kGroup = 8;
constexpr int kKChunk = 1024;
constexpr int kGemmThreads = 256;
constexpr int kWarps = kGemmThreads / 32;
constexpr int kMoeRowsPerWarp = 4;
constexpr int kGemvRowsPerWarp = 1;  // plain GEMV: more blocks for narrow outputs

// With `active` null this is a plain small-M GEMV: one "expert" (weight itself) and rows
// [0, dense_rows) of x in order. bf16 weights see x rounded to bf16 (the GEMM convention).
template <typename W, int kRowsPerWarp>
__global__ void __launch_bounds__(kGemmThreads) GroupedGemvKernel(
    const float* x, int64_t ldx, bool by_token, int64_t top_k, const W* weight, int64_t n_out,
    int64_t k_in, const int32_t* order, const int32_t* offsets, const int32_t* active,
    const int32_t* num_active, int32_t dense_rows, float* y) {
  constexpr int kRows = kRowsPerWarp * kWarps;
  __shared__ __align__(16) float sx[kGroup][kKChunk];
  int32_t e = 0, a0 = 0, a1 = dense_rows;
  if (active != nullptr) {
    if (static_cast<int32_t>(blockIdx.y) >= *num_active) return;
    e = active[blockIdx.y];
    a0 = offsets[e];
    a1 = offsets[e + 1];
  }
  const W* we = weight + static_cast<int64_t>(e) * n_out * k_in;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row_base = static_cast<int64_t>(blockIdx.x) * kRows + warp * kRowsPerWarp;
  for (int32_t g = a0; g < a1; g += kGroup) {
    const int ng = a1 - g < kGroup ? a1 - g : kGroup;
    float acc[kRowsPerWarp][kGroup];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) acc[r][j] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < k_in; k0 += kKChunk) {
      const int kc = k_in - k0 < kKChunk ? static_cast<int>(k_in - k0) : kKChunk;
      __syncthreads();
      for (int i = threadIdx.x; i < ng * kc; i += kGemmThreads) {
        const int j = i / kc, c = i % kc;
        const int64_t src = by_token ? order[g + j] / top_k : g + j;
        const float v = x[src * ldx + k0 + c];
        sx[j][c] = sizeof(W) == 2 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
      }
      __syncthreads();
      // 16-byte weight loads: 8 bf16 or 4 fp32 consecutive elements per lane, the warp's rows
      // loaded together so that several loads are in flight per lane.
      constexpr int kVec = 16 / sizeof(W);
      // One row per warp (plain GEMV): unroll along K for loads in flight; the expert path already
      // has kRowsPerWarp of them and more would cost registers.
      constexpr int kUnroll = kRowsPerWarp >= 4 ? 1 : 4;
#pragma unroll kUnroll
      for (int c = lane * kVec; c < kc; c += 32 * kVec) {
        uint4 raw[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int64_t row = row_base + r;
          raw[r] = row < n_out ? *reinterpret_cast<const uint4*>(we + row * k_in + k0 + c)
                               : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float wv[kVec];
          if constexpr (sizeof(W) == 2) {
            const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw[r]);
#pragma unroll
            for (int v = 0; v < kVec / 2; ++v) {
              const float2 f = __bfloat1622float2(p2[v]);
              wv[2 * v] = f.x;
              wv[2 * v + 1] = f.y;
            }
          } else {
            const float* pf = reinterpret_cast<const float*>(&raw[r]);
#pragma unroll
            for (int v = 0; v < kVec; ++v) wv[v] = pf[v];
          }
          // Only the group's real assignments (decode groups are mostly one or two), with
          // 16-byte shared-memory reads.
#pragma unroll
          for (int j = 0; j < kGroup; ++j) {
            if (j < ng) {
              const float4* xs = reinterpret_cast<const float4*>(&sx[j][c]);
              float sum = 0.0f;
#pragma unroll
              for (int v4 = 0; v4 < kVec / 4; ++v4) {
                const float4 xv = xs[v4];
                sum += wv[4 * v4] * xv.x + wv[4 * v4 + 1] * xv.y + wv[4 * v4 + 2] * xv.z +
                       wv[4 * v4 + 3] * xv.w;
              }
              acc[r][j] += sum;
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row_base + r;
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (j < ng) {  // uniform across the warp
          const float v = WarpSum(acc[r][j]);
          if (lane == 0 && row < n_out) y[static_cast<int64_t>(g + j) * n_out + row] = v;
        }
      }
    }
  }
}

// out[t] = Σ_k weights[t, k] · y[pos(t, k)], k in order.
__global__ void CombineKernel(const float* y, const int32_t* position, const float* weights,
                              int64_t top_k, int64_t dim, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float acc = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      acc += weights[t * top_k + k] * y[static_cast<int64_t>(position[t * top_k + k]) * dim + i];
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

struct Workspace {
  int32_t* keys_out;
  int32_t* order_in;
  int32_t* order;
  int32_t* position;
  int32_t* offsets;
  int32_t* active;
  int32_t* num_active;
  float* gu;
  float* h;
  float* y;
  void* sort_temp;
  size_t sort_bytes;
};

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
size_t Layout(const ExpertsDims& d, void* base, Workspace* w) {
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
  w->gu = static_cast<float*>(take(sizeof(float) * a * 2 * d.inter));
  w->h = static_cast<float*>(take(sizeof(float) * a * d.inter));
  w->y = static_cast<float*>(take(sizeof(float) * a * d.dim));
  w->sort_bytes = SortTempBytes(a);
  w->sort_temp = take(w->sort_bytes);
  return off;
}

}  // namespace

absl::Status Route(const RouterDims& d, const float* logits, const float* bias,
                   const int32_t* tid2eid, const int32_t* token_ids, int32_t* idx, float* weights,
                   cudaStream_t stream) {
  if (d.experts > 32 * kMaxExpertsPerLane || d.top_k > kMaxTopK) {
    return absl::UnimplementedError("router: at most 1024 experts and top-16 are compiled");
  }
  if (d.tokens == 0) return absl::OkStatus();
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((d.tokens * 32 + threads - 1) / threads);
  RouteKernel<<<blocks, threads, 0, stream>>>(d, logits, bias, tid2eid, token_ids, idx, weights);
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
  Workspace w;
  return Layout(d, nullptr, &w);
}

absl::Status SmallGemv(const float* x, int64_t m, int64_t k, const void* w, DType wdtype, int64_t n,
                       float* y, cudaStream_t stream) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (m > kSmallGemvMaxRows || k % 8 != 0) {
    return absl::InvalidArgumentError("SmallGemv: needs m <= 8 and k a multiple of 8");
  }
  constexpr int kRows = kGemvRowsPerWarp * kWarps;
  const dim3 grid(static_cast<unsigned>((n + kRows - 1) / kRows), 1);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const __nv_bfloat16*>(w), n, k, nullptr, nullptr, nullptr,
        nullptr, static_cast<int32_t>(m), y);
  } else {
    GroupedGemvKernel<float, kGemvRowsPerWarp><<<grid, kGemmThreads, 0, stream>>>(
        x, k, false, 1, static_cast<const float*>(w), n, k, nullptr, nullptr, nullptr, nullptr,
        static_cast<int32_t>(m), y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status MoeExperts(const ExpertsDims& d, const float* u, const int32_t* idx,
                        const float* weights, const void* gate_up, const void* down, DType wdtype,
                        void* workspace, float* out, cudaStream_t stream) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.dim % 8 != 0 || d.inter % 8 != 0) {
    return absl::UnimplementedError("MoE: hidden and intermediate sizes must be multiples of 8");
  }
  Workspace w;
  Layout(d, workspace, &w);
  const int64_t a = d.tokens * d.top_k;
  // Sort the assignments (t, k) by expert; radix sort is stable, so each expert's assignments
  // stay in (t, k) order.
  IotaKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order_in, a);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  size_t sort_bytes = w.sort_bytes;
  int end_bit = 1;
  while ((int64_t{1} << end_bit) < d.experts) ++end_bit;
  CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(w.sort_temp, sort_bytes, idx, w.keys_out,
                                                       w.order_in, w.order, static_cast<int>(a), 0,
                                                       end_bit, stream));
  OffsetsKernel<<<1, 256, 0, stream>>>(w.keys_out, a, d.experts, w.offsets, w.active, w.num_active);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  InvertKernel<<<static_cast<unsigned>((a + 255) / 256), 256, 0, stream>>>(w.order, a, w.position);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(d.experts, a));
  const int64_t n_gu = 2 * d.inter;
  constexpr int kRows = kMoeRowsPerWarp * kWarps;
  const dim3 grid_gu(static_cast<unsigned>((n_gu + kRows - 1) / kRows), max_active);
  const dim3 grid_down(static_cast<unsigned>((d.dim + kRows - 1) / kRows), max_active);
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kMoeRowsPerWarp><<<grid_gu, kGemmThreads, 0, stream>>>(
        u, d.dim, true, d.top_k, static_cast<const __nv_bfloat16*>(gate_up), n_gu, d.dim, w.order,
        w.offsets, w.active, w.num_active, 0, w.gu);
  } else {
    GroupedGemvKernel<float, kMoeRowsPerWarp><<<grid_gu, kGemmThreads, 0, stream>>>(
        u, d.dim, true, d.top_k, static_cast<const float*>(gate_up), n_gu, d.dim, w.order,
        w.offsets, w.active, w.num_active, 0, w.gu);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  absl::Status st = SwiGlu(w.gu, a, d.inter, d.swiglu_limit, w.h, stream);
  if (!st.ok()) return st;
  if (wdtype == DType::kBF16) {
    GroupedGemvKernel<__nv_bfloat16, kMoeRowsPerWarp><<<grid_down, kGemmThreads, 0, stream>>>(
        w.h, d.inter, false, d.top_k, static_cast<const __nv_bfloat16*>(down), d.dim, d.inter,
        w.order, w.offsets, w.active, w.num_active, 0, w.y);
  } else {
    GroupedGemvKernel<float, kMoeRowsPerWarp><<<grid_down, kGemmThreads, 0, stream>>>(
        w.h, d.inter, false, d.top_k, static_cast<const float*>(down), d.dim, d.inter, w.order,
        w.offsets, w.active, w.num_active, 0, w.y);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  CombineKernel<<<static_cast<unsigned>(d.tokens), 256, 0, stream>>>(w.y, w.position, weights,
                                                                     d.top_k, d.dim, out);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
