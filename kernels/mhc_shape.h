// The problem descriptor of the mHC boundaries (dsv4-model.md §4): one definition for the CPU reference
// (kernels/mhc_ref.h) and the CUDA launcher (kernels/cuda/mhc.h).
#pragma once

#include <cstdint>

namespace dsv4 {

struct HcShape {
  int64_t tokens = 0;
  int64_t n = 4;        // hc_mult
  int64_t dim = 0;      // D
  int64_t sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-6f;
};

}  // namespace dsv4
