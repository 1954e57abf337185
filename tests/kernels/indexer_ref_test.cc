#include "kernels/indexer_ref.h"

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

struct Batch {
  std::vector<int32_t> positions, token_seq, seq_begin, start, slot, table;
  RaggedBatchView view;
  // One sequence whose tokens sit at `pos`, entries paged with block_size 8 (2 entries a block
  // at ratio 4), blocks mapped in reverse to exercise the block table.
  Batch(std::vector<int32_t> pos, int32_t blocks) : positions(std::move(pos)) {
    token_seq.assign(positions.size(), 0);
    seq_begin = {0, static_cast<int32_t>(positions.size())};
    start = {positions.front()};
    slot = {0};
    for (int32_t b = 0; b < blocks; ++b) table.push_back(blocks - 1 - b);
    view.num_tokens = static_cast<int32_t>(positions.size());
    view.num_seqs = 1;
    view.positions = positions.data();
    view.token_seq = token_seq.data();
    view.seq_begin = seq_begin.data();
    view.seq_start_pos = start.data();
    view.state_slot = slot.data();
    view.block_table = table.data();
    view.block_stride = blocks;
    view.block_size = 8;
  }
};

TEST(IndexerRef, ScoreFormula) {
  IndexerShape s{/*heads=*/2, /*dim=*/2, /*ratio=*/4, /*topk=*/4, /*weight_scale=*/0.5f,
                 /*score_scale=*/0.25f};
  Batch b({7}, 1);  // position 7: entries 0 and 1 visible
  const std::vector<float> q = {1, 0, 0, 1};       // head 0 = e0, head 1 = e1
  const std::vector<float> w = {2, -4};
  // block table maps logical block 0 -> physical 0 here (1 block): rows 0, 1.
  const std::vector<float> keys = {3, -1, -2, 5};  // entry 0 = (3,-1), entry 1 = (-2,5)
  std::vector<float> scores(2);
  IndexerScoresRef(s, b.view, 0, q.data(), w.data(), keys.data(), scores.data());
  // entry 0: 2*.5*relu(3)*.25 + -4*.5*relu(-1)*.25 = 0.75; entry 1: 0 + -2*5*.25 = -2.5
  EXPECT_FLOAT_EQ(scores[0], 0.75f);
  EXPECT_FLOAT_EQ(scores[1], -2.5f);
}

class IndexerTopK : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1, 1);
    q.resize(positions.size() * heads * dim);
    w.resize(positions.size() * heads);
    keys.resize(blocks * 2 * dim);
    for (auto* v : {&q, &w, &keys}) {
      for (auto& x : *v) x = u(rng);
    }
  }
  const int64_t heads = 3, dim = 4, blocks = 6;
  const std::vector<int32_t> positions = {2, 3, 10, 15, 22, 23, 47};
  std::vector<float> q, w, keys;
};

TEST_F(IndexerTopK, ShortcutEqualsScoringWhenEverythingFits) {
  // topk 12 >= every token's visible count (<= 12): both paths select all visible entries.
  IndexerShape s{heads, dim, 4, 12, 0.5f, 0.5f};
  Batch b(positions, blocks);
  std::vector<int32_t> shortcut(positions.size() * 12), scored(positions.size() * 12);
  IndexerTopKRef(s, b.view, q.data(), w.data(), keys.data(), shortcut.data());
  b.view.force_indexer_scoring = true;
  IndexerTopKRef(s, b.view, q.data(), w.data(), keys.data(), scored.data());
  EXPECT_EQ(shortcut, scored);
  for (size_t t = 0; t < positions.size(); ++t) {
    const int visible = (positions[t] + 1) / 4;
    for (int k = 0; k < 12; ++k) EXPECT_EQ(shortcut[t * 12 + k], k < visible ? k : -1);
  }
}

TEST_F(IndexerTopK, KeepsTheHighestScoresAndNeverTheFuture) {
  IndexerShape s{heads, dim, 4, 3, 0.5f, 0.5f};
  Batch b(positions, blocks);
  std::vector<int32_t> sel(positions.size() * 3);
  IndexerTopKRef(s, b.view, q.data(), w.data(), keys.data(), sel.data());
  for (size_t t = 0; t < positions.size(); ++t) {
    const int visible = (positions[t] + 1) / 4;
    std::vector<float> scores(std::max(visible, 1));
    IndexerScoresRef(s, b.view, static_cast<int32_t>(t), q.data(), w.data(), keys.data(),
                     scores.data());
    std::vector<int> order(visible);
    for (int i = 0; i < visible; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int x, int y) { return scores[x] > scores[y]; });
    std::set<int> expect(order.begin(), order.begin() + std::min(visible, 3));
    std::set<int> got;
    for (int k = 0; k < 3; ++k) {
      const int e = sel[t * 3 + k];
      if (e >= 0) {
        EXPECT_LT(e, visible) << "selected a future entry";
        got.insert(e);
      }
    }
    EXPECT_EQ(got, expect) << "token at position " << positions[t];
  }
}

}  // namespace
}  // namespace dsv4
