#include "node/scheduler/kv_block_manager.h"

#include <algorithm>

namespace dsv4 {
namespace {

uint64_t Mix(uint64_t x) {  // the splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

KvBlockManager::KvBlockManager(int32_t num_blocks, int32_t num_slots, int32_t block_size,
                               int32_t snapshot_rows, uint64_t salt)
    : num_blocks_(num_blocks),
      num_slots_(num_slots),
      block_size_(block_size),
      num_rows_(std::max(snapshot_rows, 0)),
      root_{Mix(salt), Mix(salt ^ 0x5DEECE66Dull)},
      blocks_(static_cast<size_t>(std::max(num_blocks, 0))) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  for (int32_t s = num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int32_t r = num_rows_ - 1; r >= 0; --r) free_rows_.push_back(num_slots + r);
}

PrefixKey KvBlockManager::Chain(const PrefixKey& parent, std::span<const int32_t> tokens) const {
  PrefixKey k{parent.a, parent.b ^ 0xA0761D6478BD642Full};
  for (int32_t t : tokens) {
    const uint64_t v = static_cast<uint32_t>(t);
    k.a = Mix(k.a ^ v);
    k.b = Mix(k.b + v * 0xE7037ED1A0B428DBull);
  }
  return k;
}

bool KvBlockManager::AcquireSlot(KvAllocation* a) {
  if (a->slot >= 0) return true;
  if (free_slots_.empty()) return false;
  a->slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

void KvBlockManager::Evict(int32_t block) {
  Block& b = blocks_[block];
  idle_.erase({b.tick, block});
  cache_.erase(b.key);
  free_rows_.push_back(b.row);
  b.row = -1;
  b.tokens.clear();
  ++evictions_;
}

int32_t KvBlockManager::TakeBlock() {
  if (free_blocks_.empty()) {
    if (idle_.empty()) return -1;
    const int32_t victim = idle_.begin()->second;
    Evict(victim);
    free_blocks_.push_back(victim);
  }
  const int32_t b = free_blocks_.back();
  free_blocks_.pop_back();
  blocks_[b].refs = 1;
  return b;
}

bool KvBlockManager::Reserve(KvAllocation* a, int64_t tokens) {
  const int32_t need = BlocksFor(tokens) - static_cast<int32_t>(a->blocks.size());
  if (need <= 0) return true;
  if (need > free_blocks()) return false;
  for (int32_t i = 0; i < need; ++i) a->blocks.push_back(TakeBlock());
  return true;
}

bool KvBlockManager::CanAdmit(int64_t tokens, const PrefixHit& hit) const {
  if (free_slots_.empty()) return false;
  // The hit's idle blocks stop being available once shared.
  int32_t idle_in_hit = 0;
  for (int32_t b : hit.blocks) idle_in_hit += blocks_[b].refs == 0 ? 1 : 0;
  const int32_t need = BlocksFor(tokens) - static_cast<int32_t>(hit.blocks.size());
  return need <= free_blocks() - idle_in_hit;
}

void KvBlockManager::Release(KvAllocation* a) {
  // Last block first: a request's tail is evicted before its head (which more prompts share).
  for (auto it = a->blocks.rbegin(); it != a->blocks.rend(); ++it) {
    Block& b = blocks_[*it];
    if (--b.refs > 0) continue;
    if (b.row >= 0) {
      b.tick = ++clock_;
      idle_.insert({b.tick, *it});
    } else {
      free_blocks_.push_back(*it);
    }
  }
  for (const auto& [index, row] : a->pending) free_rows_.push_back(row);
  a->blocks.clear();
  a->keys.clear();
  a->pending.clear();
  a->snapshots_off = false;
  if (a->slot >= 0) free_slots_.push_back(a->slot);
  a->slot = -1;
}

PrefixHit KvBlockManager::Lookup(std::span<const int32_t> tokens) const {
  PrefixHit hit;
  if (!caching() || tokens.empty()) return hit;
  PrefixKey key = root_;
  for (size_t begin = 0; begin + block_size_ <= tokens.size() - 1; begin += block_size_) {
    const std::span<const int32_t> block = tokens.subspan(begin, block_size_);
    key = Chain(key, block);
    auto it = cache_.find(key);
    if (it == cache_.end()) break;
    const Block& b = blocks_[it->second];
    if (!std::equal(block.begin(), block.end(), b.tokens.begin(), b.tokens.end())) break;
    hit.blocks.push_back(it->second);
    hit.keys.push_back(key);
    hit.restore_row = b.row;
  }
  return hit;
}

void KvBlockManager::Share(KvAllocation* a, const PrefixHit& hit) {
  for (int32_t block : hit.blocks) {
    Block& b = blocks_[block];
    if (b.refs++ == 0) idle_.erase({b.tick, block});
    a->blocks.push_back(block);
  }
  a->keys = hit.keys;
}

int32_t KvBlockManager::SnapshotRow(KvAllocation* a, int32_t index) {
  if (!caching() || a->snapshots_off) return -1;
  if (free_rows_.empty() && !idle_.empty()) {
    const int32_t victim = idle_.begin()->second;
    Evict(victim);
    free_blocks_.push_back(victim);
  }
  if (free_rows_.empty()) {
    a->snapshots_off = true;
    return -1;
  }
  const int32_t row = free_rows_.back();
  free_rows_.pop_back();
  a->pending.emplace_back(index, row);
  return row;
}

void KvBlockManager::Commit(KvAllocation* a, int64_t computed,
                            absl::FunctionRef<int32_t(int64_t)> token) {
  if (!caching()) return;
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  while (static_cast<int64_t>(a->keys.size() + 1) * block_size_ <= computed &&
         a->keys.size() < a->blocks.size()) {
    const int32_t index = static_cast<int32_t>(a->keys.size());
    for (int32_t i = 0; i < block_size_; ++i) {
      tokens[i] = token(int64_t{index} * block_size_ + i);
      // A token an overlapped step feeds before the coordinator has seen it: a later commit
      // (once it is known) takes the block.
      if (tokens[i] < 0) return;
    }
    a->keys.push_back(Chain(index == 0 ? root_ : a->keys.back(), tokens));
    auto p = std::find_if(a->pending.begin(), a->pending.end(),
                          [&](const auto& e) { return e.first == index; });
    if (p == a->pending.end()) continue;
    const int32_t row = p->second;
    a->pending.erase(p);
    const int32_t physical = a->blocks[index];
    if (cache_.count(a->keys.back()) > 0 || blocks_[physical].row >= 0) {
      free_rows_.push_back(row);  // another request cached the same prefix first
      continue;
    }
    Block& b = blocks_[physical];
    b.row = row;
    b.key = a->keys.back();
    b.tokens = tokens;
    cache_[b.key] = physical;
  }
}

}  // namespace dsv4
