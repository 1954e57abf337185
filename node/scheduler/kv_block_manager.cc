#include "node/scheduler/kv_block_manager.h"

namespace dsv4 {

KvBlockManager::KvBlockManager(int32_t num_blocks, int32_t num_slots, int32_t block_size)
    : num_blocks_(num_blocks), num_slots_(num_slots), block_size_(block_size) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  for (int32_t s = num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

bool KvBlockManager::AcquireSlot(KvAllocation* a) {
  if (a->slot >= 0) return true;
  if (free_slots_.empty()) return false;
  a->slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

bool KvBlockManager::Reserve(KvAllocation* a, int64_t tokens) {
  const int32_t need = BlocksFor(tokens) - static_cast<int32_t>(a->blocks.size());
  if (need <= 0) return true;
  if (need > static_cast<int32_t>(free_blocks_.size())) return false;
  for (int32_t i = 0; i < need; ++i) {
    a->blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return true;
}

bool KvBlockManager::CanAdmit(int64_t tokens) const {
  return !free_slots_.empty() && BlocksFor(tokens) <= static_cast<int32_t>(free_blocks_.size());
}

void KvBlockManager::Release(KvAllocation* a) {
  for (auto it = a->blocks.rbegin(); it != a->blocks.rend(); ++it) free_blocks_.push_back(*it);
  a->blocks.clear();
  if (a->slot >= 0) free_slots_.push_back(a->slot);
  a->slot = -1;
}

}  // namespace dsv4
