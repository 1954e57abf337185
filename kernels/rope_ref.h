// CPU reference: interleaved partial RoPE on the trailing channels (dsv4-model.md §2.3).
#pragma once

#include <cstdint>

namespace dsv4 {

// Rotates the last `rope_dims` channels of one vector `x[dim]` in adjacent pairs
// (dim-rd+2p, dim-rd+2p+1) by angle pos·inv_freq[p] (or its negative when `inverse`).
void RopeRowRef(float* x, int64_t dim, int64_t rope_dims, const float* inv_freq, int64_t pos,
                bool inverse);

// x [tokens, heads, dim]: token t rotated at positions[t].
void RopeRef(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dims,
             const float* inv_freq, const int32_t* positions, bool inverse);

}  // namespace dsv4
