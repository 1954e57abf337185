// Device helpers shared by the kernels: warp/block reductions, bf16 loads, and the counter-based
// random numbers of kernels/counter_rng.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "kernels/counter_rng.h"

namespace dsv4::cuda {

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double WarpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats of shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float r = threadIdx.x < warps ? scratch[threadIdx.x] : 0.0f;
  if (warp == 0) r = WarpSum(r);
  if (threadIdx.x == 0) scratch[0] = r;
  __syncthreads();
  r = scratch[0];
  __syncthreads();
  return r;
}

__device__ __forceinline__ double BlockSumD(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSumD(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  double r = threadIdx.x < warps ? scratch[threadIdx.x] : 0.0;
  if (warp == 0) r = WarpSumD(r);
  if (threadIdx.x == 0) scratch[0] = r;
  __syncthreads();
  r = scratch[0];
  __syncthreads();
  return r;
}

// RMSNorm of a row held one float4 per thread (a block of ceil(dim / 4) threads rounded up to a
// warp; threads past the row hold zeros and get a meaningless result): the sum of squares in
// double (as the CPU reference), one BlockSumD tree, then w · (x · inv). Every block-per-row
// normalisation uses it, so a fused kernel rounds exactly as the RMSNorm kernel. All threads of
// the block must call it.
// Its three steps are also used one by one by kernels that split the row over a thread-block
// cluster (the same tree, its warp sums exchanged through distributed shared memory).
__device__ __forceinline__ double SumSquares4D(float4 a) {
  double s = static_cast<double>(a.x) * a.x;
  s += static_cast<double>(a.y) * a.y;
  s += static_cast<double>(a.z) * a.z;
  s += static_cast<double>(a.w) * a.w;
  return s;
}
__device__ __forceinline__ float RmsInverse(double sum_squares, int dim, float eps) {
  const float mean = static_cast<float>(sum_squares / static_cast<double>(dim));
  return 1.0f / sqrtf(mean + eps);
}
__device__ __forceinline__ float4 RmsApply4(float4 a, const float4& w, bool weighted, float inv) {
  if (weighted) return make_float4(w.x * (a.x * inv), w.y * (a.y * inv), w.z * (a.z * inv),
                                   w.w * (a.w * inv));
  return make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
}
__device__ __forceinline__ float4 RmsNormalize4(float4 a, const float4& w, bool weighted, int dim,
                                                float eps, double* scratch) {
  const double s = BlockSumD(SumSquares4D(a), scratch);
  return RmsApply4(a, w, weighted, RmsInverse(s, dim, eps));
}

// One interleaved RoPE pair (x0, x1) rotated by pos · freq (by its negative when `inverse`), the
// angle's sine and cosine in double as the CPU reference: every rotation (RoPE kernels, the fused
// norm + RoPE, the attention combine's inverse RoPE) rounds the same way.
__device__ __forceinline__ float2 RopeRotate(float x0, float x1, float pos, float freq,
                                             bool inverse) {
  const float angle = pos * freq;
  double sd, cd;
  sincos(static_cast<double>(angle), &sd, &cd);
  const float c = static_cast<float>(cd);
  float s = static_cast<float>(sd);
  if (inverse) s = -s;
  return make_float2(x0 * c - x1 * s, x1 * c + x0 * s);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float r = threadIdx.x < warps ? scratch[threadIdx.x] : -INFINITY;
  if (warp == 0) r = WarpMax(r);
  if (threadIdx.x == 0) scratch[0] = r;
  __syncthreads();
  r = scratch[0];
  __syncthreads();
  return r;
}

// Weights are read once per group and never written: read-only path, no L1 allocation (nothing
// reuses them within the SM), and a 256-byte L2 prefetch since a warp reads 512 contiguous bytes
// of each of its rows per batch anyway.
__device__ __forceinline__ uint4 LoadWeights16(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// DeepSeek-V4's clamped SwiGLU of one gate / up pair (swiglu_limit): silu(min(gate, limit)) ·
// clamp(up, -limit, limit), the one expression of every expert kernel (and of SwiGluKernel), so
// that all round alike.
__device__ __forceinline__ float ClampedSwiGlu(float gate, float up, float limit) {
  gate = fminf(gate, limit);
  up = fminf(fmaxf(up, -limit), limit);
  return gate / (1.0f + expf(-gate)) * up;
}

// ---- asynchronous copies global -> shared (cp.async, sm_80+) ----
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes, L1 bypassed, to a shared-memory address (SmemAddr) or pointer.
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  CpAsync16(SmemAddr(smem), gmem);
}
// 16 bytes, L1 bypassed, zero-filled when !valid (the source is then not read).
__device__ __forceinline__ void CpAsync16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  CpAsync16(SmemAddr(smem), gmem, valid);
}
// 16 bytes of a weight stream, L1 bypassed, the rest of its 256-byte L2 line prefetched.
__device__ __forceinline__ void CpAsync16Stream(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem), "l"(gmem)
               : "memory");
}
// 4 bytes (both addresses 4-byte aligned: no alignment beyond a float's).
__device__ __forceinline__ void CpAsync4(uint32_t smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem) {
  CpAsync4(SmemAddr(smem), gmem);
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- programmatic dependent launch (PDL) ----
// A kernel launched with LaunchPdl may start while the previous kernel on its stream is still
// running; it must call PdlWait() before it reads anything an earlier kernel may still be
// writing or writes anything, and every thread must reach PdlWait() before exiting. Before the
// wait it may read only what no kernel writes during a step (weights): that relies on no
// kernel that writes weights ever triggering its dependents early. PdlTrigger() lets this
// kernel's own PDL dependents launch; it is harmless anywhere (a no-op without such dependents).
// Every kernel of the decode path is launched this way: the weight-streaming GEMVs load their
// first weights before the wait, all others start with PdlTrigger(); PdlWait(); (so their
// launch and the next kernel's overlap the previous kernel's tail). In a CUDA graph the
// same-stream edge becomes a programmatic edge. DSV4_PDL=0 launches without the attribute
// (ordinary stream order; the waits are then no-ops).
__device__ __forceinline__ void PdlTrigger() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void PdlWait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

inline bool PdlEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("DSV4_PDL");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

// The launch attribute for thread-block clusters of `x` blocks along x.
inline cudaLaunchAttribute ClusterAttribute(unsigned x) {
  cudaLaunchAttribute a;
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = 1;
  a.val.clusterDim.z = 1;
  return a;
}

// LaunchPdl with thread-block clusters of `cluster_x` blocks along x (0: no cluster attribute).
template <typename... Params, typename... Args>
cudaError_t LaunchPdlCluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 0) attr[n++] = ClusterAttribute(cluster_x);
  if (PdlEnabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  return LaunchPdlCluster(kernel, grid, block, smem, stream, 0, std::forward<Args>(args)...);
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ float LoadF(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadF(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }


}  // namespace dsv4::cuda
