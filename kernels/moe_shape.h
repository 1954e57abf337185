// The problem descriptors of the MoE block (dsv4-model.md §10): one definition for the CPU
// reference (kernels/moe_ref.h) and the CUDA launchers (kernels/cuda/moe.h, moe_quant.h).
#pragma once

#include <cstdint>

namespace dsv4 {

struct RouterShape {
  int64_t tokens = 0;
  int64_t experts = 0;   // E
  int64_t top_k = 0;     // K
  float routed_scale = 1;
};

struct ExpertsShape {
  int64_t tokens = 0;
  int64_t dim = 0;       // D
  int64_t inter = 0;     // I
  int64_t experts = 0;   // E
  int64_t top_k = 0;     // K
  float swiglu_limit = 10;
};

}  // namespace dsv4
