// LocalSequences: a minimal owner of state slots and context blocks for driving a Dsv4Model
// directly (the CLI's generate / check-golden / bench and the tests). Each sequence gets a slot
// and grows its block table on demand; blocks come from a shuffled-or-ordered free list so that
// tests can exercise non-contiguous paging. The serving coordinator has its own block manager.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {

class LocalSequences {
 public:
  // `reverse_blocks`: hand out blocks from the top of the pool down, so that logically adjacent
  // blocks are physically far apart.
  LocalSequences(const Dsv4Model& model, bool reverse_blocks = false);

  // A new empty sequence; ResourceExhausted when no slot is free.
  absl::StatusOr<int> Create();
  // Describes `tokens` as the next chunk of `seq` (allocating blocks as needed). The step must
  // then run; call Advance() after it succeeded.
  absl::StatusOr<SequenceStep> Next(int seq, std::span<const int32_t> tokens,
                                    SequenceStep::Logits logits);
  void Advance(int seq, int64_t n);
  void Release(int seq);
  int64_t length(int seq) const { return seqs_.at(seq).length; }
  int free_blocks() const { return static_cast<int>(free_blocks_.size()); }

 private:
  struct Seq {
    int32_t slot = 0;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  const Dsv4Model& model_;
  std::vector<int32_t> free_slots_;
  std::vector<int32_t> free_blocks_;
  std::map<int, Seq> seqs_;
  int next_id_ = 0;
};

}  // namespace dsv4
