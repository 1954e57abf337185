#include "kernels/rms_norm_ref.h"

#include <cmath>

namespace dsv4 {

void RmsNormRef(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float mean = static_cast<float>(sum / static_cast<double>(dim));
    const float inv = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < dim; ++i) {
      const float v = xr[i] * inv;
      yr[i] = w != nullptr ? w[i] * v : v;
    }
  }
}

}  // namespace dsv4
