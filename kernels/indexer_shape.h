// The problem descriptor of the lightning indexer (dsv4-model.md §8): one definition for the CPU reference
// (kernels/indexer_ref.h) and the CUDA launcher (kernels/cuda/indexer.h).
#pragma once

#include <cstdint>

namespace dsv4 {

struct IndexerShape {
  int64_t heads = 0;      // nI
  int64_t dim = 0;        // dI
  int64_t ratio = 4;      // m
  int64_t topk = 0;
  float weight_scale = 1; // nI^-0.5
  float score_scale = 1;  // dI^-0.5
};

}  // namespace dsv4
