#include "common/tensor_parallel.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dsv4 {
namespace {

// The sizes in [1, 64] that pass `ok`, for the error message.
template <typename F>
std::string Sizes(F ok) {
  std::vector<int> v;
  for (int n = 1; n <= 64; ++n) {
    if (ok(n)) v.push_back(n);
  }
  return absl::StrJoin(v, ", ");
}

bool Splits(const ModelConfig& c, int64_t n) {
  const int64_t H = c.num_heads, G = c.o_groups;
  const bool groups_ok = G > 0 && (n <= G ? G % n == 0 : n % G == 0);
  return n >= 1 && H % n == 0 && groups_ok && c.n_routed_experts % n == 0 &&
         c.moe_intermediate_size % n == 0;
}

}  // namespace

absl::Status CheckTensorParallel(const ModelConfig& c, int32_t n) {
  if (n < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel_size ", n, " must be >= 1"));
  }
  if (Splits(c, n)) return absl::OkStatus();
  auto field = [&]() -> std::string {
    if (c.num_heads % n != 0) return absl::StrCat("num_attention_heads (", c.num_heads, ")");
    const int64_t G = c.o_groups;
    if (G <= 0 || (n <= G ? G % n != 0 : n % G != 0)) {
      return absl::StrCat("o_groups (", G, "; a size must divide it or be a multiple of it)");
    }
    if (c.n_routed_experts % n != 0) return absl::StrCat("n_routed_experts (", c.n_routed_experts, ")");
    return absl::StrCat("moe_intermediate_size (", c.moe_intermediate_size, ")");
  };
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor_parallel_size ", n, " does not split ", field(), "; this model takes ",
      Sizes([&](int k) { return Splits(c, k); })));
}

absl::StatusOr<TensorShard> ShardOf(const ModelConfig& c, const ParallelLayout& layout) {
  const int64_t n = layout.world_size, r = layout.rank;
  if (auto s = CheckTensorParallel(c, static_cast<int32_t>(n)); !s.ok()) return s;
  if (r < 0 || r >= n) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r, " is outside [0, ", n, ")"));
  }
  const int64_t H = c.num_heads, G = c.o_groups, hd = c.head_dim;
  const int64_t heads_per_group = H / G;
  TensorShard s;
  s.heads = H / n;
  s.head_begin = r * s.heads;
  if (n <= G) {
    s.groups = G / n;
    s.group_begin = r * s.groups;
    s.group_col_begin = 0;
    s.group_cols = heads_per_group * hd;
  } else {
    s.groups = 1;
    s.group_begin = s.head_begin / heads_per_group;
    s.group_col_begin = (s.head_begin % heads_per_group) * hd;
    s.group_cols = s.heads * hd;
  }
  s.experts = c.n_routed_experts / n;
  s.expert_begin = r * s.experts;
  s.shared_inter = c.moe_intermediate_size / n;
  s.shared_begin = r * s.shared_inter;
  return s;
}

}  // namespace dsv4
