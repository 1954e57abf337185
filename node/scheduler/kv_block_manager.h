// KvBlockManager: accounting of the workers' paged pools, owned by the coordinator, with the
// prefix cache (docs/prefix-caching.md).
//
// Context blocks (block_size tokens each) back the compressed KV entries and indexer keys; state
// slots (one per running sequence) back the sliding-window ring and compressor state. Blocks and
// slots come from LIFO free lists, so allocation is deterministic. Not thread-safe (engine thread).
//
// Prefix cache (on when the workers have snapshot rows): a full block whose state snapshot was
// taken (a state row holding the ring and the compressors' overlap state at the block's end)
// enters the cache when the step that completed it is committed. It is keyed by a 128-bit chain
// of the salt (the model and everything else that changes the state), every earlier block's
// tokens and its own, and checked against its own tokens on a hit. Cached blocks are shared by
// reference count; a block no request holds stays cached until the pool needs it back, least
// recently released first (a request's last block before its first). A running request never
// loses a block it holds, and only full, committed blocks are ever shared: nobody writes them.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"

namespace dsv4 {

struct PrefixKey {
  uint64_t a = 0, b = 0;
  bool operator==(const PrefixKey&) const = default;
};

struct KvAllocation {
  int32_t slot = -1;
  std::vector<int32_t> blocks;  // block table: logical block i -> physical block
  // Prefix caching: the chained key of each full block hashed so far (the hit's, then those this
  // request completed), and the snapshots scheduled but not committed: (block index, state row).
  std::vector<PrefixKey> keys;
  std::vector<std::pair<int32_t, int32_t>> pending;
  bool snapshots_off = false;  // a snapshot found no row: later blocks could never be hit
};

// The cached blocks that start a token sequence.
struct PrefixHit {
  std::vector<int32_t> blocks;  // physical blocks, in order
  std::vector<PrefixKey> keys;
  int32_t restore_row = -1;     // the state at the end of the last one
  int64_t tokens(int32_t block_size) const { return static_cast<int64_t>(blocks.size()) * block_size; }
};

class KvBlockManager {
 public:
  // `snapshot_rows` state rows (numbered from num_slots) back the prefix cache; 0 turns it off.
  KvBlockManager(int32_t num_blocks, int32_t num_slots, int32_t block_size,
                 int32_t snapshot_rows = 0, uint64_t salt = 0);

  int32_t BlocksFor(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
  }
  // Gives `a` a state slot; false when none is free.
  bool AcquireSlot(KvAllocation* a);
  // Grows `a` to cover `tokens` tokens, evicting idle cached blocks when the free list is empty;
  // false (and `a` unchanged) when blocks run out.
  bool Reserve(KvAllocation* a, int64_t tokens);
  // True when a fresh allocation for `tokens` tokens, starting with `hit`, would succeed.
  bool CanAdmit(int64_t tokens, const PrefixHit& hit = {}) const;
  // Returns every block and the slot of `a`: cached blocks to the cache, the rest to the free list.
  void Release(KvAllocation* a);

  // ---- prefix cache ----
  bool caching() const { return num_rows_ > 0; }
  // The longest chain of cached blocks that `tokens` starts with, leaving at least one token to
  // compute (the last one gives the logits).
  PrefixHit Lookup(std::span<const int32_t> tokens) const;
  // Puts `hit`'s blocks (shared) at the start of the empty allocation `a`.
  void Share(KvAllocation* a, const PrefixHit& hit);
  // A state row for the snapshot of block `index` of `a`, taken by the step that completes it;
  // -1 when there is none (then `a` takes no more snapshots).
  int32_t SnapshotRow(KvAllocation* a, int32_t index);
  // The step that brought `a` to `computed` tokens is launched (stream order makes its writes
  // land before any later step's reads): its full blocks get their keys and those with a
  // snapshot enter the cache (one already cached under the key keeps its place). A block with a
  // token not known yet (negative: an overlapped step's deferred token) waits for a later commit.
  void Commit(KvAllocation* a, int64_t computed, absl::FunctionRef<int32_t(int64_t)> token);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t num_slots() const { return num_slots_; }
  int32_t block_size() const { return block_size_; }
  // Blocks a request can get: free ones and idle cached ones (evicted on demand).
  int32_t free_blocks() const { return static_cast<int32_t>(free_blocks_.size() + idle_.size()); }
  int32_t free_slots() const { return static_cast<int32_t>(free_slots_.size()); }
  int32_t cached_blocks() const { return static_cast<int32_t>(cache_.size()); }
  int32_t free_rows() const { return static_cast<int32_t>(free_rows_.size()); }
  uint64_t evictions() const { return evictions_; }
  // Fraction of context blocks in use by requests (idle cached blocks count as free).
  double usage() const {
    return num_blocks_ == 0 ? 0.0 : 1.0 - static_cast<double>(free_blocks()) / num_blocks_;
  }
  // For tests: the holders of a block (requests) and whether it is cached.
  int32_t refs(int32_t block) const { return blocks_[block].refs; }
  bool cached(int32_t block) const { return blocks_[block].row >= 0; }
  int32_t row(int32_t block) const { return blocks_[block].row; }

 private:
  struct Block {
    int32_t refs = 0;
    int32_t row = -1;  // >= 0: cached, with its snapshot in this state row
    PrefixKey key;
    uint64_t tick = 0;  // when it went idle (refs 0 and cached)
    std::vector<int32_t> tokens;
  };
  struct KeyHash {
    size_t operator()(const PrefixKey& k) const { return static_cast<size_t>(k.a ^ (k.b << 1)); }
  };
  PrefixKey Chain(const PrefixKey& parent, std::span<const int32_t> tokens) const;
  // Takes a block: the free list first, else the idle cached block released longest ago. -1: none.
  int32_t TakeBlock();
  void Evict(int32_t block);

  int32_t num_blocks_, num_slots_, block_size_, num_rows_;
  PrefixKey root_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> free_slots_;
  std::vector<int32_t> free_rows_;
  std::unordered_map<PrefixKey, int32_t, KeyHash> cache_;  // key -> block
  std::set<std::pair<uint64_t, int32_t>> idle_;            // (tick, block), oldest first
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace dsv4
