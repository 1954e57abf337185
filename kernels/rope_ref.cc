#include "kernels/rope_ref.h"

#include <cmath>

namespace dsv4 {

void RopeRowRef(float* x, int64_t dim, int64_t rope_dims, const float* inv_freq, int64_t pos,
                bool inverse) {
  float* r = x + (dim - rope_dims);
  for (int64_t p = 0; p < rope_dims / 2; ++p) {
    // HF forms the angle in fp32 (position × inv_freq), then takes cos/sin.
    const float angle = static_cast<float>(pos) * inv_freq[p];
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    if (inverse) s = -s;
    const float x0 = r[2 * p];
    const float x1 = r[2 * p + 1];
    r[2 * p] = x0 * c - x1 * s;
    r[2 * p + 1] = x1 * c + x0 * s;
  }
}

void RopeRef(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dims,
             const float* inv_freq, const int32_t* positions, bool inverse) {
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      RopeRowRef(x + (t * heads + h) * dim, dim, rope_dims, inv_freq, positions[t], inverse);
    }
  }
}

}  // namespace dsv4
