// The problem descriptor of the KV / indexer-key compressors (dsv4-model.md §7): one definition for the CPU reference
// (kernels/compressor_ref.h) and the CUDA launcher (kernels/cuda/compressor.h).
#pragma once

#include <cstdint>

namespace dsv4 {

struct CompressorShape {
  int64_t ratio = 0;     // m
  int64_t overlap = 1;   // c: 2 = CSA (entry w pools window w-1's first halves and window w's
                         // second halves), 1 = HCA
  int64_t dim = 0;       // d
  int64_t rope_dims = 0;
  float norm_eps = 1e-6f;
};

}  // namespace dsv4
