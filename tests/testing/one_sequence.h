// Test helper: the ragged metadata of one sequence (slot 0, block b -> b) with tokens at positions
// [start, start + n), as the host view the CPU reference kernels read.
#pragma once

#include <cstdint>

#include "worker/model/backend.h"

namespace dsv4::testing {

struct OneSequence {
  StepMeta meta;
  RaggedBatchView view;
  OneSequence(int32_t start_pos, int32_t n, int32_t block_size = 8, int32_t blocks = 1) {
    meta.num_tokens = n;
    meta.num_seqs = 1;
    for (int32_t i = 0; i < n; ++i) {
      meta.positions.push_back(start_pos + i);
      meta.token_seq.push_back(0);
    }
    meta.seq_begin = {0, n};
    meta.seq_start_pos = {start_pos};
    meta.state_slot = {0};
    for (int32_t b = 0; b < blocks; ++b) meta.block_table.push_back(b);
    meta.block_stride = blocks;
    meta.block_size = block_size;
    view = HostView(meta);
  }
  OneSequence(const OneSequence&) = delete;  // `view` points into `meta`
  OneSequence& operator=(const OneSequence&) = delete;
};

}  // namespace dsv4::testing
