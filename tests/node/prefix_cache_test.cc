// The prefix cache in the coordinator (node/scheduler/kv_block_manager.h) and the scheduler's use
// of it: what is hit, what is shared, what is evicted, and a property test over random
// interleavings of admissions, finishes, aborts, preemptions and evictions.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "node/scheduler/kv_block_manager.h"
#include "node/scheduler/scheduler.h"

namespace dsv4 {
namespace {

constexpr int32_t kBs = 8;

std::vector<int32_t> Tokens(int n, int32_t base) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

// Fills `a` as a request that computed `tokens` with a snapshot at every block boundary.
void Compute(KvBlockManager& kv, KvAllocation* a, const std::vector<int32_t>& tokens) {
  ASSERT_TRUE(kv.AcquireSlot(a));
  ASSERT_TRUE(kv.Reserve(a, static_cast<int64_t>(tokens.size())));
  for (int32_t b = 0; (b + 1) * kBs <= static_cast<int32_t>(tokens.size()); ++b) {
    EXPECT_GE(kv.SnapshotRow(a, b), 0);
  }
  kv.Commit(a, static_cast<int64_t>(tokens.size()), [&](int64_t i) { return tokens[i]; });
}

TEST(PrefixCache, IdenticalTokensHitEveryFullBlockButTheLastToken) {
  KvBlockManager kv(32, 2, kBs, /*snapshot_rows=*/16, /*salt=*/7);
  KvAllocation a;
  const std::vector<int32_t> t = Tokens(3 * kBs, 100);
  Compute(kv, &a, t);
  EXPECT_EQ(kv.cached_blocks(), 3);
  // The last token must be computed: 3 full blocks of 24 tokens hit 2.
  PrefixHit hit = kv.Lookup(t);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.blocks[0], a.blocks[0]);
  EXPECT_EQ(hit.blocks[1], a.blocks[1]);
  EXPECT_EQ(hit.restore_row, kv.row(a.blocks[1]));
  std::vector<int32_t> longer = t;
  longer.push_back(5);
  EXPECT_EQ(kv.Lookup(longer).blocks.size(), 3u);
  // A prefix that diverges inside block 1 hits block 0 only; one that differs in block 0 nothing.
  std::vector<int32_t> other = longer;
  other[kBs + 3] = 9999;
  EXPECT_EQ(kv.Lookup(other).blocks.size(), 1u);
  other[0] = 9999;
  EXPECT_EQ(kv.Lookup(other).blocks.size(), 0u);
  // Another salt (another model) shares nothing.
  KvBlockManager kv2(32, 2, kBs, 16, /*salt=*/8);
  KvAllocation b;
  Compute(kv2, &b, Tokens(3 * kBs, 100));
  EXPECT_EQ(kv2.Lookup(longer).blocks.size(), 3u);
  EXPECT_EQ(kv.Lookup(std::vector<int32_t>(kBs * 2, 1)).blocks.size(), 0u);
}

TEST(PrefixCache, SharedBlocksAreRefCountedAndIdleOnesEvictedTailFirst) {
  KvBlockManager kv(6, 3, kBs, 6, 1);
  KvAllocation a, b;
  const std::vector<int32_t> t = Tokens(2 * kBs + 1, 100);
  Compute(kv, &a, t);
  const PrefixHit hit = kv.Lookup(t);
  ASSERT_EQ(hit.blocks.size(), 2u);
  ASSERT_TRUE(kv.CanAdmit(2 * kBs + 1, hit));
  ASSERT_TRUE(kv.AcquireSlot(&b));
  kv.Share(&b, hit);
  EXPECT_EQ(kv.refs(a.blocks[0]), 2);
  kv.Release(&a);
  EXPECT_EQ(kv.refs(hit.blocks[0]), 1);
  EXPECT_TRUE(kv.cached(hit.blocks[0]));
  kv.Release(&b);
  // Everything is idle now: all six blocks count as free, two of them cached.
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.cached_blocks(), 2);
  // Taking five blocks evicts one cached block: the tail (block 1) before the head.
  KvAllocation c;
  ASSERT_TRUE(kv.AcquireSlot(&c));
  ASSERT_TRUE(kv.Reserve(&c, 5 * kBs));
  EXPECT_EQ(kv.evictions(), 1u);
  EXPECT_EQ(kv.Lookup(t).blocks.size(), 1u);
  // No block is held twice and a held one is never evicted.
  ASSERT_FALSE(kv.Reserve(&c, 7 * kBs));
  kv.Release(&c);
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.free_rows() + kv.cached_blocks(), 6);
}

TEST(PrefixCache, TheFirstToCacheAPrefixKeepsItAndUnknownTokensWait) {
  KvBlockManager kv(16, 3, kBs, 8, 1);
  KvAllocation a, b;
  const std::vector<int32_t> t = Tokens(kBs, 100);
  Compute(kv, &a, t);
  Compute(kv, &b, t);  // computed side by side: b's copy is not cached, its row comes back
  EXPECT_EQ(kv.cached_blocks(), 1);
  EXPECT_EQ(kv.free_rows(), 7);
  EXPECT_TRUE(kv.cached(a.blocks[0]));
  EXPECT_FALSE(kv.cached(b.blocks[0]));
  // A block whose last token an overlapped step feeds unseen (-1) waits for a later commit.
  KvAllocation c;
  ASSERT_TRUE(kv.AcquireSlot(&c));
  ASSERT_TRUE(kv.Reserve(&c, kBs));
  ASSERT_GE(kv.SnapshotRow(&c, 0), 0);
  std::vector<int32_t> u = Tokens(kBs, 500);
  u.back() = -1;
  kv.Commit(&c, kBs, [&](int64_t i) { return u[i]; });
  EXPECT_FALSE(kv.cached(c.blocks[0]));
  u.back() = 7;
  kv.Commit(&c, kBs, [&](int64_t i) { return u[i]; });
  EXPECT_TRUE(kv.cached(c.blocks[0]));
}

TEST(PrefixCache, WithoutRowsNothingIsCachedAndAllocationIsUnchanged) {
  KvBlockManager kv(8, 2, kBs);
  KvAllocation a;
  ASSERT_TRUE(kv.AcquireSlot(&a));
  ASSERT_TRUE(kv.Reserve(&a, 2 * kBs));
  EXPECT_EQ(kv.SnapshotRow(&a, 0), -1);
  kv.Commit(&a, 2 * kBs, [](int64_t) { return 1; });
  EXPECT_EQ(kv.cached_blocks(), 0);
  EXPECT_EQ(kv.Lookup(std::vector<int32_t>(3 * kBs, 1)).blocks.size(), 0u);
  kv.Release(&a);
  EXPECT_EQ(kv.free_blocks(), 8);
}

SchedRequest Req(uint64_t id, std::vector<int32_t> prompt, bool penalties = false) {
  SchedRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  auto s = std::make_shared<SamplingSpec>();
  if (penalties) s->presence_penalty = 0.5f;
  r.sampling = s;
  return r;
}

TEST(PrefixCache, TheSchedulerStartsAHitAfterItsCachedBlocks) {
  KvBlockManager kv(64, 4, kBs, 32, 1);
  Scheduler sched(SchedulerConfig{4, 64, 0}, &kv);
  const std::vector<int32_t> p = Tokens(3 * kBs + 5, 100);
  sched.Add(Req(1, p));
  StepPlan s1 = sched.Schedule(nullptr);
  ASSERT_EQ(s1.seqs.size(), 1u);
  // One snapshot per boundary the chunk reaches.
  ASSERT_EQ(s1.seqs[0].snapshots.size(), 3u);
  EXPECT_EQ(s1.seqs[0].snapshots[0].position, kBs);
  EXPECT_EQ(s1.seqs[0].restore_from, -1);
  sched.Commit(s1);
  sched.Remove(1);
  // The same prompt: 3 blocks from the cache, a 5-token chunk restoring block 2's snapshot.
  sched.Add(Req(2, p));
  StepPlan s2 = sched.Schedule(nullptr);
  ASSERT_EQ(s2.seqs.size(), 1u);
  EXPECT_EQ(s2.seqs[0].start_pos, 3 * kBs);
  EXPECT_EQ(s2.seqs[0].tokens.size(), 5u);
  EXPECT_EQ(s2.seqs[0].restore_from, s1.seqs[0].snapshots[2].row);
  EXPECT_EQ(std::vector<int32_t>(s2.seqs[0].block_table.begin(), s2.seqs[0].block_table.begin() + 3),
            std::vector<int32_t>(s1.seqs[0].block_table.begin(), s1.seqs[0].block_table.begin() + 3));
  EXPECT_EQ(sched.CachedTokens(2), 3 * kBs);
  EXPECT_EQ(sched.prefix_hit_tokens(), 3u * kBs);
  EXPECT_EQ(sched.prefix_query_tokens(), 2u * p.size());
  // A request with penalties computes everything (its counts need every token).
  sched.Add(Req(3, p, /*penalties=*/true));
  StepPlan s3 = sched.Schedule(nullptr);
  ASSERT_EQ(s3.seqs.size(), 2u);
  EXPECT_EQ(s3.seqs[1].start_pos, 0);
  EXPECT_EQ(sched.CachedTokens(3), 0);
}

// Random interleavings: requests drawn from a few shared prefixes arrive, run, finish at random
// lengths, get aborted or preempted for lack of blocks, in a pool small enough to evict. After
// every step: no block being written is shared or cached, every restore is the snapshot row of
// a cached block the request holds, the reference counts equal the holders, and at the end
// nothing has leaked.
TEST(PrefixCache, RandomInterleavingsNeverShareABlockBeingWrittenNorLeak) {
  uint64_t evictions = 0, preemptions = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const int32_t blocks = 12 + static_cast<int32_t>(rng() % 20), slots = 4, rows = 12;
    KvBlockManager kv(blocks, slots, kBs, rows, seed);
    Scheduler sched(SchedulerConfig{slots, 24, static_cast<int32_t>(rng() % 2) * 11}, &kv);
    std::vector<std::vector<int32_t>> prefixes;
    for (int i = 0; i < 3; ++i) prefixes.push_back(Tokens(5 + static_cast<int>(rng() % 30), 1000 * i));
    std::map<uint64_t, std::vector<int32_t>> tables;  // each live request's latest block table
    std::map<uint64_t, int> left;                       // outputs still to sample
    uint64_t next_id = 1;
    int hits = 0;
    for (int step = 0; step < 400; ++step) {
      if (next_id <= 60 && rng() % 3 == 0) {
        std::vector<int32_t> p = prefixes[rng() % prefixes.size()];
        const int extra = static_cast<int>(rng() % 20);
        for (int i = 0; i < extra; ++i) p.push_back(static_cast<int32_t>(rng() % 50));
        left[next_id] = 1 + static_cast<int>(rng() % 30);
        sched.Add(Req(next_id++, p));
      }
      std::vector<uint64_t> preempted;
      const StepPlan plan = sched.Schedule(&preempted);
      for (uint64_t id : preempted) tables.erase(id);
      preemptions += preempted.size();
      std::set<int32_t> pending_rows;
      for (const ScheduledSeq& s : plan.seqs) {
        tables[s.request_id] = s.block_table;
        const int32_t end = s.start_pos + static_cast<int32_t>(s.tokens.size());
        for (int32_t b = s.start_pos / kBs; b <= (end - 1) / kBs; ++b) {
          const int32_t blk = s.block_table[b];
          ASSERT_EQ(kv.refs(blk), 1) << "seed " << seed << ": block " << blk << " shared while written";
          ASSERT_FALSE(kv.cached(blk)) << "seed " << seed << ": cached block " << blk << " written";
        }
        if (s.restore_from >= 0) {
          ++hits;
          ASSERT_GT(s.start_pos, 0);
          const int32_t last = s.block_table[s.start_pos / kBs - 1];
          ASSERT_TRUE(kv.cached(last));
          ASSERT_EQ(kv.row(last), s.restore_from);
        }
        for (const StateSnapshotAt& at : s.snapshots) {
          ASSERT_TRUE(pending_rows.insert(at.row).second) << "seed " << seed;
          ASSERT_GE(at.row, slots);
          ASSERT_LT(at.row, slots + rows);
        }
      }
      for (int32_t b = 0; b < blocks; ++b) {
        if (kv.cached(b)) ASSERT_EQ(pending_rows.count(kv.row(b)), 0u) << "seed " << seed;
      }
      sched.Commit(plan);
      // Reference counts equal the holders.
      std::vector<int32_t> holders(blocks, 0);
      for (const auto& [id, t] : tables) {
        for (int32_t b : t) ++holders[b];
      }
      for (int32_t b = 0; b < blocks; ++b) ASSERT_EQ(kv.refs(b), holders[b]) << "seed " << seed;
      // Results: finish, abort now and then, or keep the token.
      for (const ScheduledSeq& s : plan.seqs) {
        if (!s.sample) continue;
        if (--left[s.request_id] == 0 || rng() % 29 == 0) {
          sched.Remove(s.request_id);
          tables.erase(s.request_id);
        } else {
          sched.AppendToken(s.request_id, static_cast<int32_t>(rng() % 50));
        }
      }
      if (sched.idle() && next_id > 60) break;
    }
    for (auto it = tables.begin(); it != tables.end();) {
      sched.Remove(it->first);
      it = tables.erase(it);
    }
    for (uint64_t id = 1; id < next_id; ++id) sched.Remove(id);
    EXPECT_EQ(kv.free_blocks(), blocks) << "seed " << seed;
    EXPECT_EQ(kv.free_slots(), slots) << "seed " << seed;
    EXPECT_EQ(kv.free_rows() + kv.cached_blocks(), rows) << "seed " << seed;
    for (int32_t b = 0; b < blocks; ++b) EXPECT_EQ(kv.refs(b), 0);
    EXPECT_GT(hits, 0) << "seed " << seed << " never hit: the test would not test";
    evictions += kv.evictions();
  }
  // The pools were small enough for both to happen.
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(preemptions, 0u);
}

}  // namespace
}  // namespace dsv4
