// CUDA launcher: CSA/HCA compressor step (dsv4-model.md §7, §11), parallel over the windows that
// close in this step, then the state update. Same state layout as kernels/compressor_ref.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/compressor_shape.h"
#include "kernels/ragged_batch.h"

namespace dsv4::cuda {

// The problem descriptor shared with the CPU reference (kernels/compressor_shape.h).
using CompressorDims = ::dsv4::CompressorShape;

// a, z [T, c*d]; bias [m, c*d]; norm_w [d]; inv_freq [rd/2]; state [slots, state floats];
// entries [blocks, block_size/m, d]. `b` holds device pointers.
absl::Status Compress(const CompressorDims& s, const RaggedBatchView& b, const float* a,
                      const float* z, const float* bias, const float* norm_w, const float* inv_freq,
                      float* state, float* entries, cudaStream_t stream);

}  // namespace dsv4::cuda
