// CUDA launchers: gathers, casts, adds, the window ring, synthetic fills. Activations are fp32;
// big weight matrices are bf16 or fp32 (WDType). Every launcher enqueues on `stream` and returns
// the launch status; none synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// Deferred input tokens (overlapped decode): a token id < 0 in the batch stands for
// slot_tokens[state slot of its sequence], the token the previous step sampled there; the kernel
// writes the resolved id back into token_ids (the same buffer as the view's ids).
struct DeferredTokens {
  const int32_t* slot_tokens = nullptr;  // [slots]; null: no step has deferred tokens
  int32_t* token_ids = nullptr;          // [T]
};

// out[T, copies, D] = table[token_ids[t]] in each of the copies (table fp32 or bf16; copies = 1:
// the embedding, copies = n: the embedding expanded into the n mHC streams).
absl::Status Embed(const void* table, DType table_dtype, int64_t vocab, int64_t dim,
                   const RaggedBatchView& b, DeferredTokens deferred, int64_t copies, float* out,
                   cudaStream_t stream);
// Copies `bytes` (a multiple of 4, both ends 4-byte aligned) with a kernel instead of a copy-engine
// transfer; either end may be mapped pinned host memory (zero-copy), which saves the DMA's
// turnaround between the compute work around it.
absl::Status CopyWords(const void* src, void* dst, size_t bytes, cudaStream_t stream);
// A CopyWords captured into a graph: whether `node` is one, and its new ends for the graph's next
// launches (the same launch shape CopyWords picks; launches already queued keep theirs).
bool IsCopyWordsNode(cudaGraphNode_t node);
absl::Status SetCopyWordsNode(cudaGraphExec_t exec, cudaGraphNode_t node, const void* src,
                              void* dst, size_t bytes);
// y = a + b (n floats).
absl::Status Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
// bf16 <-> fp32 conversions (n elements).
absl::Status CastToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
// The same with each 8 consecutive elements stored in the pairing of the MXFP4 expansion
// (Mxfp4Bf16x8: columns 0, 4, 1, 5, 2, 6, 3, 7; n % 8 == 0, x and y 16-byte aligned), so that
// 16 stored bytes line up with the expanded weights' (the MXFP4 expert kernels' activations).
absl::Status CastToBf16Pair4(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
absl::Status CastToF32(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);
// out[r, :] = x[rows[r], :] for r < num_rows; rows on the device.
absl::Status GatherRows(const float* x, int64_t width, const int32_t* rows, int64_t num_rows,
                        float* out, cudaStream_t stream);
// hs[t, j, :] = x[t, :] for j < n.
absl::Status HcExpand(const float* x, int64_t tokens, int64_t n, int64_t dim, float* hs,
                      cudaStream_t stream);
// ring[slot][pos % W] = kv[t] for every token.
absl::Status RingWrite(const float* kv, int64_t dim, int64_t window, const RaggedBatchView& b,
                       float* ring, cudaStream_t stream);
// Deterministic pseudo-random fill: x[i] = lo + (hi - lo) * U(seed, i), as fp32 or bf16.
absl::Status FillUniform(void* x, DType dtype, int64_t n, uint64_t seed, float lo, float hi,
                         cudaStream_t stream);
// Synthetic weights in the released formats (kernels/quant_synthetic.h), the same bytes as the
// host's: w[i] = SyntheticFp8Code(seed, i, lo, hi, scale) for n e4m3 values; n MXFP4 values in
// groups of 32 (w: n / 2 bytes, 16-byte aligned; scale: n / 32 UE8M0 bytes).
absl::Status FillFp8Synthetic(uint8_t* w, int64_t n, uint64_t seed, float lo, float hi,
                              float scale, cudaStream_t stream);
absl::Status FillMxfp4Synthetic(uint8_t* w, uint8_t* scale, int64_t n, uint64_t seed, float lo,
                                float hi, cudaStream_t stream);
// Holds `stream` until *flag != 0 (host-mapped memory) or ~2 s pass (op profiling).
absl::Status Gate(const int* flag, cudaStream_t stream);
// Integer fill for hash tables: x[i] = U(seed, i) * modulus.
absl::Status FillIndices(int32_t* x, int64_t n, uint64_t seed, int32_t modulus, cudaStream_t stream);

}  // namespace dsv4::cuda
