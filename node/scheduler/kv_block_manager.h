// KvBlockManager: accounting of the workers' paged pools, owned by the coordinator.
// Context blocks (block_size tokens each) back the compressed KV entries and indexer keys; state
// slots (one per running sequence) back the sliding-window ring and compressor state. Blocks and
// slots come from LIFO free lists, so allocation is deterministic. Not thread-safe (engine thread).
#pragma once

#include <cstdint>
#include <vector>

namespace dsv4 {

struct KvAllocation {
  int32_t slot = -1;
  std::vector<int32_t> blocks;  // block table: logical block i -> physical block
};

class KvBlockManager {
 public:
  KvBlockManager(int32_t num_blocks, int32_t num_slots, int32_t block_size);

  int32_t BlocksFor(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
  }
  // Gives `a` a state slot; false when none is free.
  bool AcquireSlot(KvAllocation* a);
  // Grows `a` to cover `tokens` tokens; false (and `a` unchanged) when blocks run out.
  bool Reserve(KvAllocation* a, int64_t tokens);
  // True when a fresh allocation for `tokens` tokens would succeed (slot and blocks).
  bool CanAdmit(int64_t tokens) const;
  // Returns every block and the slot of `a` to the free lists.
  void Release(KvAllocation* a);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_slots() const { return num_slots_; }
  int32_t block_size() const { return block_size_; }
  int32_t free_blocks() const { return static_cast<int32_t>(free_blocks_.size()); }
  int32_t free_slots() const { return static_cast<int32_t>(free_slots_.size()); }
  // Fraction of context blocks in use.
  double usage() const {
    return num_blocks_ == 0 ? 0.0 : 1.0 - static_cast<double>(free_blocks_.size()) / num_blocks_;
  }

 private:
  int32_t num_blocks_, num_slots_, block_size_;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> free_slots_;
};

}  // namespace dsv4
