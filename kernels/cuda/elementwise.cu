#include "kernels/cuda/elementwise.h"

#include "kernels/quant_synthetic.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "absl/status/statusor.h"
#include "kernels/common/cuda_check.h"
#include "kernels/counter_rng.h"
#include "kernels/cuda/common.cuh"

namespace dsv4::cuda {
namespace {

constexpr int kThreads = 256;

inline int Blocks(int64_t n, int per_block = kThreads) {
  const int64_t b = (n + per_block - 1) / per_block;
  return static_cast<int>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

__device__ __forceinline__ float Bf16(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

__device__ __forceinline__ uint16_t ToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}


// out[t, j] = table[ids[t]] for j < copies (out [tokens, copies, dim]).
template <typename T>
__global__ void EmbedKernel(const T* table, int64_t vocab, int64_t dim, RaggedBatchView b,
                            DeferredTokens deferred, int64_t copies, float* out) {
  PdlTrigger();
  PdlWait();
  const int32_t t = blockIdx.x;
  const int64_t i = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (t >= b.num_tokens || i >= dim) return;
  int32_t id = b.token_ids[t];
  if (id < 0) {
    // A deferred token: the one last sampled into the sequence's slot, written back for the
    // step's later readers (hash routing). Every block of the row resolves the same id.
    const int32_t slot = b.state_slot[b.token_seq[t]];
    id = deferred.slot_tokens != nullptr && slot >= 0 ? deferred.slot_tokens[slot] : 0;
    if (blockIdx.y == 0 && threadIdx.x == 0) deferred.token_ids[t] = id;
  }
  const T* row = table + int64_t{id} * dim;
  float v;
  if constexpr (sizeof(T) == 2) {
    v = Bf16(row[i]);
  } else {
    v = row[i];
  }
  for (int64_t j = 0; j < copies; ++j) out[(t * copies + j) * dim + i] = v;
}

// 16-byte words when both ends allow it, else 4-byte words (callers pass int32-aligned sizes).
__global__ void CopyWordsKernel(const uint4* src, uint4* dst, int64_t n16, const uint32_t* src4,
                                uint32_t* dst4, int64_t n4) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n16; i += stride) {
    dst[i] = src[i];
  }
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4; i += stride) {
    dst4[i] = src4[i];
  }
}

__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = a[i] + b[i];
  }
}

__global__ void CastToBf16Kernel(const float* x, uint16_t* y, int64_t n) {
  PdlTrigger();
  PdlWait();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = ToBf16(x[i]);
  }
}

// 8 elements a thread: stored pairs (0, 4), (1, 5), (2, 6), (3, 7).
__global__ void CastToBf16Pair4Kernel(const float* x, uint4* y, int64_t words) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= words) return;
  const float4 a = reinterpret_cast<const float4*>(x)[2 * i];
  const float4 b = reinterpret_cast<const float4*>(x)[2 * i + 1];
  y[i] = make_uint4(PackBf16x2(a.x, b.x), PackBf16x2(a.y, b.y), PackBf16x2(a.z, b.z),
                    PackBf16x2(a.w, b.w));
}

__global__ void CastToF32Kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = Bf16(x[i]);
  }
}

// Row copies: block (row, column block), one element per thread. (One block per row looping over
// the columns was a chain of dependent round trips: ~10-15 us for a 4-16k row at decode.)
__global__ void GatherRowsKernel(const float* x, int64_t width, const int32_t* rows, float* out) {
  PdlTrigger();
  PdlWait();
  const int64_t r = blockIdx.x;
  const int64_t i = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (i < width) out[r * width + i] = x[static_cast<int64_t>(rows[r]) * width + i];
}

__global__ void HcExpandKernel(const float* x, int64_t n, int64_t dim, float* hs) {
  PdlTrigger();
  PdlWait();
  const int64_t t = blockIdx.x;
  const int64_t i = int64_t{blockIdx.y} * blockDim.x + threadIdx.x;
  if (i >= dim) return;
  const float v = x[t * dim + i];
  for (int64_t j = 0; j < n; ++j) hs[(t * n + j) * dim + i] = v;
}

dim3 RowGrid(int64_t rows, int64_t width) {
  const int64_t cols = std::max<int64_t>((width + kThreads - 1) / kThreads, 1);
  return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(cols));
}

__global__ void RingWriteKernel(const float* kv, int64_t dim, int64_t window, RaggedBatchView b,
                                float* ring) {
  PdlTrigger();
  PdlWait();
  const int32_t t = blockIdx.x;
  const int32_t seq = b.token_seq[t];
  if (b.state_slot[seq] < 0) return;  // padding of a graph step: inert
  // Only the last `window` tokens of a sequence land in the ring: earlier ones of the same step
  // would race for the same rows (the reference writes in order, so the latest wins).
  const int64_t end = int64_t{b.seq_start_pos[seq]} + (b.seq_begin[seq + 1] - b.seq_begin[seq]);
  if (b.positions[t] < end - window) return;
  float* dst = ring + (static_cast<int64_t>(b.state_slot[seq]) * window + b.positions[t] % window) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = kv[t * dim + i];
}

__global__ void FillUniformKernel(void* x, bool bf16, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = SyntheticUniform(seed, static_cast<uint64_t>(i), lo, hi);
    if (bf16) {
      static_cast<uint16_t*>(x)[i] = ToBf16(v);
    } else {
      static_cast<float*>(x)[i] = v;
    }
  }
}

__global__ void FillFp8SyntheticKernel(uint8_t* w, int64_t n, uint64_t seed, float lo, float hi,
                                       float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    w[i] = SyntheticFp8Code(seed, static_cast<uint64_t>(i), lo, hi, scale);
  }
}

// One thread per group of 32 values: 16 bytes of nibbles and its scale.
__global__ void FillMxfp4SyntheticKernel(uint8_t* w, uint8_t* scale, int64_t groups, uint64_t seed,
                                         float lo, float hi) {
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * blockDim.x) {
    uint8_t bytes[16];
    scale[g] = SyntheticMxfp4Group(seed, static_cast<uint64_t>(g) * 32, lo, hi, bytes);
    uint4 packed;
    __builtin_memcpy(&packed, bytes, 16);
    reinterpret_cast<uint4*>(w)[g] = packed;
  }
}

__global__ void GateKernel(const volatile int* flag) {
  const long long start = clock64();
  while (*flag == 0 && clock64() - start < 4'000'000'000LL) __nanosleep(1000);
}

__global__ void FillIndicesKernel(int32_t* x, int64_t n, uint64_t seed, int32_t modulus) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] = SyntheticIndex(seed, static_cast<uint64_t>(i), modulus);
  }
}

}  // namespace

absl::Status Embed(const void* table, DType table_dtype, int64_t vocab, int64_t dim,
                   const RaggedBatchView& b, DeferredTokens deferred, int64_t copies, float* out,
                   cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  if (table_dtype == DType::kBF16) {
    CUDA_RETURN_IF_ERROR(LaunchPdl(EmbedKernel<uint16_t>, RowGrid(b.num_tokens, dim),
                                   dim3(kThreads), 0, stream, static_cast<const uint16_t*>(table),
                                   vocab, dim, b, deferred, copies, out));
  } else {
    CUDA_RETURN_IF_ERROR(LaunchPdl(EmbedKernel<float>, RowGrid(b.num_tokens, dim), dim3(kThreads),
                                   0, stream, static_cast<const float*>(table), vocab, dim, b,
                                   deferred, copies, out));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

namespace {

// CopyWordsKernel's launch: its arguments (in order) and grid.
struct CopyWordsLaunch {
  const uint4* src;
  uint4* dst;
  int64_t n16;
  const uint32_t* src4;
  uint32_t* dst4;
  int64_t n4;
  unsigned blocks;
};

absl::StatusOr<CopyWordsLaunch> PlanCopyWords(const void* src, void* dst, size_t bytes) {
  if (bytes % 4 != 0 || reinterpret_cast<uintptr_t>(src) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 4 != 0) {
    return absl::InvalidArgumentError("CopyWords: 4-byte aligned ends and size");
  }
  const bool wide = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  CopyWordsLaunch l;
  l.src = static_cast<const uint4*>(src);
  l.dst = static_cast<uint4*>(dst);
  l.n16 = wide ? static_cast<int64_t>(bytes / 16) : 0;
  l.src4 = static_cast<const uint32_t*>(src);
  l.dst4 = static_cast<uint32_t*>(dst);
  l.n4 = wide ? 0 : static_cast<int64_t>(bytes / 4);
  const int64_t n = std::max(l.n16, l.n4);
  l.blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 64)));
  return l;
}

}  // namespace

absl::Status CopyWords(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  const absl::StatusOr<CopyWordsLaunch> plan = PlanCopyWords(src, dst, bytes);
  if (!plan.ok()) return plan.status();
  const CopyWordsLaunch& l = *plan;
  CopyWordsKernel<<<l.blocks, 256, 0, stream>>>(l.src, l.dst, l.n16, l.src4, l.dst4, l.n4);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool IsCopyWordsNode(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (type != cudaGraphNodeTypeKernel) return false;
  cudaKernelNodeParams p{};
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return p.func == reinterpret_cast<void*>(&CopyWordsKernel);
}

absl::Status SetCopyWordsNode(cudaGraphExec_t exec, cudaGraphNode_t node, const void* src,
                              void* dst, size_t bytes) {
  absl::StatusOr<CopyWordsLaunch> plan = PlanCopyWords(src, dst, bytes);
  if (!plan.ok()) return plan.status();
  CopyWordsLaunch& l = *plan;
  void* args[] = {&l.src, &l.dst, &l.n16, &l.src4, &l.dst4, &l.n4};
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(&CopyWordsKernel);
  p.gridDim = dim3(l.blocks);
  p.blockDim = dim3(256);
  p.sharedMemBytes = 0;
  p.kernelParams = args;
  CUDA_RETURN_IF_ERROR(cudaGraphExecKernelNodeSetParams(exec, node, &p));
  return absl::OkStatus();
}

absl::Status Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CastToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchPdl(CastToBf16Kernel, Blocks(n), dim3(kThreads), 0, stream, x, y, n));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CastToBf16Pair4(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n % 8 != 0 || !Aligned16(x) || !Aligned16(y)) {
    return absl::InvalidArgumentError(
        "CastToBf16Pair4: needs a multiple of 8 elements and 16-byte aligned ends");
  }
  if (n == 0) return absl::OkStatus();
  const int64_t words = n / 8;
  CastToBf16Pair4Kernel<<<static_cast<unsigned>((words + 255) / 256), 256, 0, stream>>>(
      x, reinterpret_cast<uint4*>(y), words);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status CastToF32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  CastToF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status GatherRows(const float* x, int64_t width, const int32_t* rows, int64_t num_rows,
                        float* out, cudaStream_t stream) {
  if (num_rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchPdl(GatherRowsKernel, RowGrid(num_rows, width), dim3(kThreads), 0,
                                 stream, x, width, rows, out));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status HcExpand(const float* x, int64_t tokens, int64_t n, int64_t dim, float* hs,
                      cudaStream_t stream) {
  if (tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(
      LaunchPdl(HcExpandKernel, RowGrid(tokens, dim), dim3(kThreads), 0, stream, x, n, dim, hs));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status RingWrite(const float* kv, int64_t dim, int64_t window, const RaggedBatchView& b,
                       float* ring, cudaStream_t stream) {
  if (b.num_tokens == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchPdl(RingWriteKernel, dim3(static_cast<unsigned>(b.num_tokens)),
                                 dim3(128), 0, stream, kv, dim, window, b, ring));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FillUniform(void* x, DType dtype, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  FillUniformKernel<<<Blocks(n, kThreads * 8), kThreads, 0, stream>>>(x, dtype == DType::kBF16, n,
                                                                      seed, lo, hi);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FillFp8Synthetic(uint8_t* w, int64_t n, uint64_t seed, float lo, float hi,
                              float scale, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  FillFp8SyntheticKernel<<<Blocks(n, kThreads * 8), kThreads, 0, stream>>>(w, n, seed, lo, hi,
                                                                           scale);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FillMxfp4Synthetic(uint8_t* w, uint8_t* scale, int64_t n, uint64_t seed, float lo,
                                float hi, cudaStream_t stream) {
  const int64_t groups = n / 32;
  if (groups == 0) return absl::OkStatus();
  FillMxfp4SyntheticKernel<<<Blocks(groups, kThreads * 4), kThreads, 0, stream>>>(
      w, scale, groups, seed, lo, hi);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Gate(const int* flag, cudaStream_t stream) {
  GateKernel<<<1, 1, 0, stream>>>(flag);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status FillIndices(int32_t* x, int64_t n, uint64_t seed, int32_t modulus, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  FillIndicesKernel<<<Blocks(n, kThreads * 8), kThreads, 0, stream>>>(x, n, seed, modulus);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace dsv4::cuda
