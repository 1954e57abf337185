// CUDA launcher: DSV4 attention for decode and prefill: per query token, one softmax (with the
// per-head sink) over the raw sliding window and the compressed entries (all visible ones for HCA,
// the indexer's selection for CSA). MQA: the single K=V latent is shared by every head, so a block
// stages each chunk of keys once for a group of heads. Semantics of kernels/attention_ref.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// The problem descriptor shared with the CPU reference (kernels/attention_shape.h) plus the
// split-KV bound.
struct AttentionDims : ::dsv4::AttentionShape {
  int64_t max_keys = 0;  // bound on any token's keys (window + compressed): sizes the split-KV
  // bf16 precision: q and the keys are rounded to bf16 and both products (S = Q K^T, O = P V) run
  // on tensor cores with fp32 accumulation and an fp32 softmax (P rounded to bf16). Taken when
  // heads % 16 == 0 and dim is 128, 256 or 512; other shapes (and fp32 precision) use the exact
  // fp32 kernel. See AttentionUsesTensorCores.
  bool bf16_tensor_cores = false;
  // Batch-invariant mode: one key split and one block shape whatever the step's token count, so
  // a token's output does not depend on the other tokens of its step.
  bool batch_invariant = false;
  // RoPE of the output's trailing out_rope_dims channels at each token's position (the model's
  // inverse RoPE; 0: none): applied by the split-KV combine as it writes, or by the RoPE kernel
  // after a single-split launch. Bit-identical to cuda::Rope on the output.
  int64_t out_rope_dims = 0;
  const float* out_rope_freq = nullptr;
  bool out_rope_inverse = false;
};

// Whether Attention() runs the bf16 tensor-core kernel for these dims.
bool AttentionUsesTensorCores(const AttentionDims& s);

// Key splits per (token, head group): 1 when the batch already fills the GPU; more at small
// batches over long contexts (flash decoding), merged by a combine pass. A function of max_keys,
// heads, the kernel choice and `tokens` only (graph capture bakes it in); 1 in batch-invariant
// mode.
int AttentionSplits(const AttentionDims& s, int64_t tokens);
// Floats of workspace Attention() needs for `tokens` tokens (0 without splits).
int64_t AttentionWorkspaceFloats(const AttentionDims& s, int64_t tokens);

absl::Status Attention(const AttentionDims& s, const RaggedBatchView& b, const float* q,
                       const float* kv, const float* ring, const float* entries,
                       const int32_t* selected, const float* sinks, float* out, float* workspace,
                       cudaStream_t stream);

}  // namespace dsv4::cuda
