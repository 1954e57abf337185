// The layout of a worker's paged state (dsv4-model.md §11): how many context blocks of how many
// tokens, how many state slots. The coordinator sizes it (its block manager hands out the block
// and slot ids) and every worker allocates its pools from it, so it is shared and model-free.
#pragma once

#include <cstdint>

#include "common/model_config.h"

namespace dsv4 {

struct CacheConfig {
  int32_t block_size = 0;          // tokens per context block; 0 = DefaultBlockSize(config)
  int32_t num_blocks = 0;          // context-pool blocks
  int32_t num_slots = 0;           // state-pool slots (max concurrent sequences)
  // Prefix caching: state-pool rows past the slots that keep a sequence's state at a block
  // boundary (rows num_slots .. num_slots + num_state_snapshots - 1). 0 = no prefix cache.
  int32_t num_state_snapshots = 0;
  int32_t max_model_len = 0;       // 0 = max_position_embeddings
  // Tokens one step may carry (the coordinator's step budget), for the memory plan's step
  // scratch; 0 = kDefaultStepTokens.
  int32_t max_step_tokens = 0;
  static constexpr int32_t kDefaultStepTokens = 2048;
  // The most tokens a step run as a CUDA graph (FULL or piecewise) may be padded to: such steps
  // keep every layer's scratch. 0: no graphs; -1: unknown (the plan assumes 512).
  int32_t max_graph_tokens = -1;
};

// Smallest multiple of every compression ratio in use that is >= 64.
int32_t DefaultBlockSize(const ModelConfig& config);

}  // namespace dsv4
