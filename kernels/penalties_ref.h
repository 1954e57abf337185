// CPU reference: logit processors applied before sampling (vLLM semantics).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>

namespace dsv4 {

// Repetition penalty over tokens seen in prompt or output: positive logits are divided by
// `repetition`, negative ones multiplied. Presence/frequency over output counts:
// logit -= presence * (count > 0) + frequency * count.
void ApplyPenaltiesRef(std::span<float> logits, const std::unordered_map<int32_t, int32_t>& seen,
                       const std::unordered_map<int32_t, int32_t>& output_counts,
                       float repetition, float presence, float frequency);

}  // namespace dsv4
