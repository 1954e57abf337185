// The problem descriptor of attention (dsv4-model.md §2.4, §6, §9): one definition for the CPU reference
// (kernels/attention_ref.h) and the CUDA launcher (kernels/cuda/attention.h).
#pragma once

#include <cstdint>

namespace dsv4 {

struct AttentionShape {
  int64_t heads = 0;       // H
  int64_t dim = 0;         // hd (keys = values)
  int64_t window = 0;      // W, including the current token
  int64_t ratio = 0;       // 0: sliding layer
  int64_t topk = 0;        // CSA: width of `selected`
  bool dense_compressed = false;  // HCA: attend to every visible entry
  float scale = 1;
};

}  // namespace dsv4
