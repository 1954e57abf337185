#include "worker/model/local_sequences.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dsv4 {

LocalSequences::LocalSequences(const Dsv4Model& model, bool reverse_blocks) : model_(model) {
  for (int32_t s = model.cache().num_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  for (int32_t b = 0; b < model.cache().num_blocks; ++b) free_blocks_.push_back(b);
  // free lists pop from the back
  if (!reverse_blocks) std::reverse(free_blocks_.begin(), free_blocks_.end());
}

absl::StatusOr<int> LocalSequences::Create() {
  if (free_slots_.empty()) return absl::ResourceExhaustedError("no free state slot");
  Seq seq;
  seq.slot = free_slots_.back();
  free_slots_.pop_back();
  const int id = next_id_++;
  seqs_[id] = std::move(seq);
  return id;
}

absl::StatusOr<SequenceStep> LocalSequences::Next(int id, std::span<const int32_t> tokens,
                                                  SequenceStep::Logits logits) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", id));
  Seq& seq = it->second;
  const int64_t bs = model_.cache().block_size;
  const int64_t need = (seq.length + static_cast<int64_t>(tokens.size()) + bs - 1) / bs;
  if (need > model_.max_blocks_per_seq()) {
    return absl::OutOfRangeError(absl::StrCat("sequence would exceed the model length ",
                                              model_.cache().max_model_len));
  }
  while (static_cast<int64_t>(seq.blocks.size()) < need) {
    if (free_blocks_.empty()) return absl::ResourceExhaustedError("no free context block");
    seq.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  SequenceStep step;
  step.tokens = tokens;
  step.start_pos = static_cast<int32_t>(seq.length);
  step.state_slot = seq.slot;
  step.block_table = seq.blocks;
  step.logits = logits;
  return step;
}

void LocalSequences::Advance(int id, int64_t n) { seqs_.at(id).length += n; }

void LocalSequences::Release(int id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  free_slots_.push_back(it->second.slot);
  for (int32_t b : it->second.blocks) free_blocks_.push_back(b);
  seqs_.erase(it);
}

}  // namespace dsv4
