// RaggedBatchView: the per-step metadata every attention-state kernel reads, as raw pointers.
// The CPU reference points it at host arrays; the CUDA backend at persistent device buffers.
// Plain struct, no CUDA types, so .cc and .cu files share it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__
#else
#define DSV4_HD
#endif

namespace dsv4 {

struct RaggedBatchView {
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  const int32_t* token_ids = nullptr;      // [T]
  const int32_t* positions = nullptr;      // [T]
  const int32_t* token_seq = nullptr;      // [T]
  const int32_t* seq_begin = nullptr;      // [S+1]
  const int32_t* seq_start_pos = nullptr;  // [S]
  const int32_t* state_slot = nullptr;     // [S]
  const int32_t* block_table = nullptr;    // [S, block_stride]
  int32_t block_stride = 0;
  int32_t block_size = 0;                  // tokens per context block
  bool force_indexer_scoring = false;
  // Prefix caching: state snapshots taken inside this step, at block boundaries before the end of
  // their sequence's chunk (StateSnapshotAt): sequence, position and state row of each.
  int32_t num_snapshots = 0;
  const int32_t* snap_seq = nullptr;       // [num_snapshots]
  const int32_t* snap_pos = nullptr;       // [num_snapshots]
  const int32_t* snap_row = nullptr;       // [num_snapshots]
};

// Row of compressed entry `w` (ratio m) of sequence `s` inside an entry pool laid out as
// [blocks, block_size/m, d]: block_table[s][w*m / block_size] * (block_size/m) + (w*m % block_size)/m.
DSV4_HD inline int64_t EntryRow(const RaggedBatchView& b, int32_t s, int64_t w, int64_t ratio) {
  const int64_t pos = w * ratio;
  const int64_t per_block = b.block_size / ratio;
  const int64_t block = b.block_table[static_cast<int64_t>(s) * b.block_stride + pos / b.block_size];
  return block * per_block + (pos % b.block_size) / ratio;
}

}  // namespace dsv4
