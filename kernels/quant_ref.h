// CPU reference for quantised weights (kernels/quant_weights.h): the exact fp32 values, which
// the CPU backend computes with and every quantised CUDA kernel is tested against.
#pragma once

#include <cstdint>

#include "kernels/quant_weights.h"

namespace dsv4 {

// out[rows * cols] = W (row-major fp32).
void DequantizeFp8Ref(const Fp8Matrix& m, float* out);
void DequantizeMxfp4Ref(const Mxfp4Matrix& m, float* out);

}  // namespace dsv4
