// CPU reference: RMSNorm (dsv4-model.md §2.1–2.2).
#pragma once

#include <cstdint>

namespace dsv4 {

// y[r] = w ⊙ (x[r] · rsqrt(mean(x[r]²) + eps)) for each of `rows` rows of `dim`; `w` may be null
// (unweighted). In place (y == x) allowed.
void RmsNormRef(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y);

}  // namespace dsv4
