#include "kernels/quant_ref.h"

namespace dsv4 {

void DequantizeFp8Ref(const Fp8Matrix& m, float* out) {
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) out[r * m.cols + c] = Fp8At(m, r, c);
  }
}

void DequantizeMxfp4Ref(const Mxfp4Matrix& m, float* out) {
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) out[r * m.cols + c] = Mxfp4At(m, r, c);
  }
}

}  // namespace dsv4
