// Tensor + expert parallelism (architecture.md §2): which part of every layer rank r of n owns.
// Model-free arithmetic over the config, shared by the coordinator (which refuses a size at start)
// and the workers (which load their slices from it).
//
//   attention heads    rank r: heads [r·H/n, (r+1)·H/n) with their q_b_proj rows and sinks
//   output groups      n <= G: the G/n whole groups holding those heads (o_a_proj rows, o_b_proj
//                      columns); n > G: a part of one group (o_a_proj rows of that group, the
//                      columns of the rank's heads; o_b_proj columns of the group). Partial
//                      outputs are all-reduced.
//   routed experts     EP: experts [r·E/n, (r+1)·E/n); the router is replicated
//   shared expert      intermediate columns [r·I/n, (r+1)·I/n); partial outputs all-reduced
//   everything else    replicated (KV latent, compressors, indexer, mHC, norms, embedding, head)
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace dsv4 {

// Where a worker sits in its tensor-parallel group. Decided by the coordinator, sent to each rank.
struct ParallelLayout {
  int32_t rank = 0;
  int32_t world_size = 1;
  // Tests: run the collectives even at size 1 (a one-rank NCCL group inside the graphs).
  bool always_reduce = false;
  bool distributed() const { return world_size > 1; }
  bool reduces() const { return distributed() || always_reduce; }
};

struct TensorShard {
  int64_t head_begin = 0, heads = 0;          // attention heads of this rank
  int64_t group_begin = 0, groups = 0;        // output groups it touches (whole or a part)
  int64_t group_col_begin = 0, group_cols = 0;  // o_a_proj input columns of each of its groups
  int64_t expert_begin = 0, experts = 0;      // routed experts (EP)
  int64_t shared_begin = 0, shared_inter = 0; // shared expert's intermediate columns
};

// OK when `world_size` ranks can split `config`; otherwise InvalidArgument naming the field and
// the sizes that work (divisors of heads, output groups, experts and the expert width).
absl::Status CheckTensorParallel(const ModelConfig& config, int32_t world_size);

// The shard of `layout.rank` (CheckTensorParallel must pass).
absl::StatusOr<TensorShard> ShardOf(const ModelConfig& config, const ParallelLayout& layout);

}  // namespace dsv4
