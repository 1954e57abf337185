// The scheduler driven by a simulated step loop: a fake model whose next token is a pure function
// of (request, output index), so every iteration's expectations are exact.
#include "node/scheduler/scheduler.h"

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

int32_t FakeToken(uint64_t id, int32_t index) { return static_cast<int32_t>(10 + (id * 31 + index * 7) % 90); }

class SimLoop {
 public:
  SimLoop(int32_t blocks, int32_t slots, int32_t block_size, SchedulerConfig cfg)
      : kv_(blocks, slots, block_size), sched_(cfg, &kv_) {}

  void Add(uint64_t id, int prompt_len, int max_tokens) {
    SchedRequest r;
    r.id = id;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<int32_t>(100 + i));
    r.sampling = std::make_shared<SamplingSpec>();
    max_tokens_[id] = max_tokens;
    sched_.Add(std::move(r));
  }

  // One iteration; returns "id:n" per scheduled sequence ("+" when it sampled).
  std::vector<std::string> Step() {
    std::vector<uint64_t> preempted;
    last_ = sched_.Schedule(&preempted);
    for (uint64_t p : preempted) preempted_.push_back(p);
    sched_.Commit(last_);
    std::vector<std::string> out;
    for (const ScheduledSeq& s : last_.seqs) {
      out.push_back(std::to_string(s.request_id) + ":" + std::to_string(s.tokens.size()) +
                    (s.sample ? "+" : ""));
      EXPECT_LE(static_cast<int64_t>(s.block_table.size()) * kv_.block_size(),
                static_cast<int64_t>(s.start_pos + s.tokens.size()) + kv_.block_size() - 1);
      EXPECT_GE(static_cast<int64_t>(s.block_table.size()) * kv_.block_size(),
                static_cast<int64_t>(s.start_pos + s.tokens.size()));
      if (s.sample) Sampled(s);
    }
    return out;
  }

  // The fake model's token for a sampled entry: kept, or the request's last (then removed).
  void Sampled(const ScheduledSeq& s) {
    const int32_t t = FakeToken(s.request_id, s.output_index);
    auto& got = outputs_[s.request_id];
    got.push_back(t);
    if (static_cast<int>(got.size()) == max_tokens_[s.request_id]) {
      sched_.Remove(s.request_id);
    } else {
      sched_.AppendToken(s.request_id, t);
    }
  }

  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && !sched_.idle(); ++i) Step();
    EXPECT_TRUE(sched_.idle());
  }

  KvBlockManager kv_;
  Scheduler sched_;
  StepPlan last_;
  std::map<uint64_t, int> max_tokens_;
  std::map<uint64_t, std::vector<int32_t>> outputs_;
  std::vector<uint64_t> preempted_;
};

using V = std::vector<std::string>;

TEST(Scheduler, ChunkedPrefillThenDecode) {
  SimLoop sim(64, 4, 16, SchedulerConfig{4, 8, 0});
  sim.Add(1, 20, 3);
  EXPECT_EQ(sim.Step(), V({"1:8"}));
  EXPECT_EQ(sim.Step(), V({"1:8"}));
  EXPECT_EQ(sim.Step(), V({"1:4+"}));
  EXPECT_EQ(sim.Step(), V({"1:1+"}));
  EXPECT_EQ(sim.Step(), V({"1:1+"}));
  EXPECT_TRUE(sim.sched_.idle() || sim.Step().empty());
  EXPECT_EQ(sim.outputs_[1], (std::vector<int32_t>{FakeToken(1, 0), FakeToken(1, 1), FakeToken(1, 2)}));
}

TEST(Scheduler, DecodesGoFirstAndPrefillTakesTheRest) {
  SimLoop sim(64, 4, 16, SchedulerConfig{4, 8, 0});
  sim.Add(1, 4, 10);
  EXPECT_EQ(sim.Step(), V({"1:4+"}));
  sim.Add(2, 30, 2);
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:7"}));
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:7"}));
  sim.Add(3, 2, 1);
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:7"}));
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:7"}));
  // 2 needs 2 more; the leftover budget admits 3.
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:2+", "3:2+"}));
  EXPECT_EQ(sim.Step(), V({"1:1+", "2:1+"}));
}

TEST(Scheduler, MaxPrefillChunk) {
  SimLoop sim(64, 4, 16, SchedulerConfig{4, 100, 5});
  sim.Add(1, 12, 1);
  sim.Add(2, 3, 1);
  EXPECT_EQ(sim.Step(), V({"1:5", "2:3+"}));
  EXPECT_EQ(sim.Step(), V({"1:5"}));
  EXPECT_EQ(sim.Step(), V({"1:2+"}));
}

TEST(Scheduler, FirstComeFirstServedWithoutOvertaking) {
  // 4 blocks of 4 tokens. A holds 3 blocks; B needs 2 and must wait although C (1 block) fits.
  SimLoop sim(4, 4, 4, SchedulerConfig{4, 64, 0});
  sim.Add(1, 12, 2);
  EXPECT_EQ(sim.Step(), V({"1:12+"}));
  sim.Add(2, 8, 1);
  sim.Add(3, 2, 1);
  EXPECT_EQ(sim.Step(), V({"1:1+"}));  // 1 takes its 4th block for token 13
  EXPECT_EQ(sim.sched_.num_waiting(), 2u);
  sim.RunToCompletion();
  EXPECT_EQ(sim.outputs_[2].size(), 1u);
  EXPECT_EQ(sim.outputs_[3].size(), 1u);
}

TEST(Scheduler, MaxNumSeqs) {
  SimLoop sim(64, 8, 16, SchedulerConfig{2, 64, 0});
  sim.Add(1, 2, 3);
  sim.Add(2, 2, 3);
  sim.Add(3, 2, 3);
  EXPECT_EQ(sim.Step(), V({"1:2+", "2:2+"}));
  EXPECT_EQ(sim.sched_.num_running(), 2u);
  EXPECT_EQ(sim.sched_.num_waiting(), 1u);
  sim.RunToCompletion();
  EXPECT_EQ(sim.outputs_[3].size(), 3u);
}

TEST(Scheduler, PreemptionByRecomputeGivesTheSameTokens) {
  // Room for 5 blocks of 4 tokens: three requests growing to 10 tokens each cannot all stay.
  SimLoop tight(5, 3, 4, SchedulerConfig{3, 64, 0});
  SimLoop roomy(64, 3, 4, SchedulerConfig{3, 64, 0});
  for (SimLoop* sim : {&tight, &roomy}) {
    sim->Add(1, 4, 6);
    sim->Add(2, 4, 6);
    sim->Add(3, 4, 6);
    sim->RunToCompletion();
  }
  EXPECT_FALSE(tight.preempted_.empty());
  EXPECT_TRUE(roomy.preempted_.empty());
  // The newest request is the victim.
  EXPECT_EQ(tight.preempted_.front(), 3u);
  for (uint64_t id : {1, 2, 3}) EXPECT_EQ(tight.outputs_[id], roomy.outputs_[id]) << id;
  EXPECT_EQ(tight.kv_.free_blocks(), 5);
  EXPECT_EQ(tight.kv_.free_slots(), 3);
}

TEST(Scheduler, RecomputeReplaysPromptAndOutputs) {
  SimLoop sim(3, 2, 4, SchedulerConfig{2, 64, 0});
  sim.Add(1, 4, 5);
  sim.Add(2, 4, 5);
  V log;
  for (int i = 0; i < 40 && !sim.sched_.idle(); ++i) {
    for (const auto& s : sim.Step()) log.push_back(s);
    for (const ScheduledSeq& s : sim.last_.seqs) {
      if (s.start_pos == 0 && s.request_id == 2 && sim.preempted_.size() > 0) {
        // Re-prefill after preemption: prompt + every generated token so far, in order.
        const auto& out = sim.outputs_[2];
        ASSERT_GE(s.tokens.size(), 4u);
        for (size_t k = 4; k < s.tokens.size(); ++k) EXPECT_EQ(s.tokens[k], out[k - 4]);
        // Step() already appended the token this chunk sampled.
        EXPECT_EQ(s.output_index, static_cast<int32_t>(out.size()) - (s.sample ? 1 : 0));
      }
    }
  }
  EXPECT_TRUE(sim.sched_.idle());
  EXPECT_FALSE(sim.preempted_.empty());
  EXPECT_EQ(sim.outputs_[2].size(), 5u);
}

TEST(Scheduler, ChunkedPrefillsThatDoNotFitTogetherStillFinish) {
  // 6 blocks of 4 tokens; two 14-token prompts prefilled 4 tokens a step cannot both hold their
  // KV: the newer one is preempted instead of both waiting forever.
  SimLoop sim(6, 2, 4, SchedulerConfig{2, 8, 4});
  sim.Add(1, 14, 2);
  sim.Add(2, 14, 2);
  sim.RunToCompletion(200);
  EXPECT_EQ(sim.outputs_[1].size(), 2u);
  EXPECT_EQ(sim.outputs_[2].size(), 2u);
  EXPECT_FALSE(sim.preempted_.empty());
  EXPECT_EQ(sim.preempted_.front(), 2u);
}

TEST(Scheduler, RemoveFreesKvAndReleasesWorkerState) {
  SimLoop sim(16, 4, 4, SchedulerConfig{4, 64, 0});
  sim.Add(1, 10, 100);
  sim.Add(2, 3, 100);
  sim.Step();
  EXPECT_EQ(sim.kv_.free_blocks(), 16 - 3 - 1);
  EXPECT_TRUE(sim.sched_.Remove(1));
  EXPECT_FALSE(sim.sched_.Remove(1));
  EXPECT_EQ(sim.kv_.free_blocks(), 16 - 1);
  sim.Step();
  EXPECT_EQ(sim.last_.released, std::vector<uint64_t>({1}));
  // A waiting request can be removed too.
  sim.Add(3, 100, 1);
  EXPECT_TRUE(sim.sched_.Remove(3));
  EXPECT_EQ(sim.sched_.num_waiting(), 0u);
}

TEST(Scheduler, Deterministic) {
  auto run = [] {
    SimLoop sim(12, 4, 4, SchedulerConfig{4, 9, 4});
    std::vector<std::string> log;
    for (uint64_t id = 1; id <= 6; ++id) sim.Add(id, static_cast<int>(3 + id * 2), static_cast<int>(2 + id % 3));
    for (int i = 0; i < 500 && !sim.sched_.idle(); ++i) {
      for (auto& s : sim.Step()) log.push_back(s);
      log.push_back("|");
    }
    return log;
  };
  EXPECT_EQ(run(), run());
}

// The engine's overlapped loop: a step is launched (committed, its samples pending), the next
// decode step is planned ahead while it is "in flight", then the oldest step is collected.
// (SimLoop's requests and pools; its own step.)
class OverlapLoop : public SimLoop {
 public:
  using SimLoop::SimLoop;

  void Launch(const StepPlan& plan, bool ahead = false) {
    for (const ScheduledSeq& s : plan.seqs) {
      // Planned ahead: every entry feeds a pending token; planned synchronously: none does.
      EXPECT_EQ(s.deferred_token, ahead) << s.request_id;
      EXPECT_GE(static_cast<int64_t>(s.block_table.size()) * kv_.block_size(),
                static_cast<int64_t>(s.start_pos + s.tokens.size()));
      if (s.deferred_token) {
        // The token the previous launched step samples for it.
        EXPECT_EQ(s.tokens, std::vector<int32_t>{kDeferredToken});
        ASSERT_FALSE(in_flight_.empty());
        bool sampled = false;
        for (const ScheduledSeq& p : in_flight_.back().seqs) {
          sampled |= p.request_id == s.request_id && p.sample;
        }
        EXPECT_TRUE(sampled) << s.request_id;
      } else {
        for (int32_t t : s.tokens) EXPECT_GE(t, 0);
      }
    }
    sched_.Commit(plan);
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.sample) sched_.AppendPending(s.request_id);
    }
    in_flight_.push_back(plan);
  }

  void Collect() {
    const StepPlan plan = in_flight_.front();
    in_flight_.pop_front();
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.sample && sched_.Has(s.request_id)) Sampled(s);  // else finished since: dropped
    }
  }

  void Step() {
    if (in_flight_.empty()) {
      std::vector<uint64_t> preempted;
      StepPlan plan = sched_.Schedule(&preempted);
      if (plan.seqs.empty()) return;
      Launch(plan);
    }
    std::optional<StepPlan> ahead = sched_.ScheduleAhead(
        [&](uint64_t id) { return static_cast<int>(outputs_[id].size()) + 1 < max_tokens_[id]; });
    if (ahead.has_value()) {
      ++ahead_;
      Launch(*ahead, /*ahead=*/true);
    }
    Collect();
  }

  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && !(sched_.idle() && in_flight_.empty()); ++i) Step();
    EXPECT_TRUE(sched_.idle());
  }

  std::deque<StepPlan> in_flight_;
  int ahead_ = 0;
};

// Requests 1..n (prompt 2 + id tokens, base + step * id outputs) through the synchronous and the
// overlapped loop, 64 blocks of 4 tokens and 4 slots: the same outputs, every block and slot free
// after. Returns the steps the overlapped loop planned ahead.
int AheadStepsWithTheSameOutputs(SchedulerConfig cfg, int n, int base, int step) {
  SimLoop sync(64, 4, 4, cfg);
  OverlapLoop overlap(64, 4, 4, cfg);
  for (uint64_t id = 1; id <= static_cast<uint64_t>(n); ++id) {
    const int prompt = static_cast<int>(2 + id), outputs = base + step * static_cast<int>(id);
    sync.Add(id, prompt, outputs);
    overlap.Add(id, prompt, outputs);
  }
  sync.RunToCompletion();
  overlap.RunToCompletion();
  EXPECT_EQ(overlap.outputs_, sync.outputs_);
  EXPECT_EQ(overlap.kv_.free_blocks(), 64);
  EXPECT_EQ(overlap.kv_.free_slots(), 4);
  return overlap.ahead_;
}

TEST(SchedulerOverlap, AheadStepsDeferTokensAndGiveTheSameOutputs) {
  // Staggered lengths: requests finish (by length) while others decode, and late arrivals wait
  // for a synchronous step to be admitted.
  EXPECT_GT(AheadStepsWithTheSameOutputs(SchedulerConfig{4, 16, 0}, 6, 3, 2), 10);
}

TEST(SchedulerOverlap, AheadWaitsWhenTheStepNeedsResults) {
  OverlapLoop loop(64, 4, 4, SchedulerConfig{4, 16, 0});
  auto all = [](uint64_t) { return true; };
  loop.Add(1, 3, 100);
  std::vector<uint64_t> preempted;
  StepPlan first = loop.sched_.Schedule(&preempted);
  // Nothing launched: no token is pending.
  EXPECT_FALSE(loop.sched_.ScheduleAhead(all).has_value());
  loop.Launch(first);
  std::optional<StepPlan> ahead = loop.sched_.ScheduleAhead(all);
  ASSERT_TRUE(ahead.has_value());
  ASSERT_EQ(ahead->seqs.size(), 1u);
  EXPECT_TRUE(ahead->seqs[0].deferred_token);
  EXPECT_EQ(ahead->seqs[0].start_pos, 3);
  EXPECT_EQ(ahead->seqs[0].output_index, 1);
  loop.Launch(*ahead, /*ahead=*/true);
  // Two tokens pending: the first result fills the older one.
  loop.Collect();
  EXPECT_EQ(*loop.sched_.Output(1), (std::vector<int32_t>{FakeToken(1, 0), kDeferredToken}));
  loop.Collect();
  EXPECT_EQ(*loop.sched_.Output(1), (std::vector<int32_t>{FakeToken(1, 0), FakeToken(1, 1)}));

  // A waiting request: the next step admits it, so it waits for the results.
  loop.Launch(loop.sched_.Schedule(&preempted));
  loop.Add(2, 3, 100);
  EXPECT_FALSE(loop.sched_.ScheduleAhead(all).has_value());
  loop.Collect();
  // Admitted with a chunked prefill in progress (budget 2): no pending token for request 2.
  OverlapLoop chunked(64, 4, 4, SchedulerConfig{4, 2, 0});
  chunked.Add(1, 5, 100);
  chunked.Launch(chunked.sched_.Schedule(&preempted));
  EXPECT_FALSE(chunked.sched_.ScheduleAhead(all).has_value());

  // A request left out (its pending token is its last), the others planned.
  OverlapLoop two(64, 4, 4, SchedulerConfig{4, 16, 0});
  two.Add(1, 3, 100);
  two.Add(2, 3, 100);
  two.Launch(two.sched_.Schedule(&preempted));
  ahead = two.sched_.ScheduleAhead([](uint64_t id) { return id != 1; });
  ASSERT_TRUE(ahead.has_value());
  ASSERT_EQ(ahead->seqs.size(), 1u);
  EXPECT_EQ(ahead->seqs[0].request_id, 2u);
}

TEST(SchedulerOverlap, ASaturatedNodeKeepsOverlapping) {
  // max_num_seqs 2: with both running, a third request waits without holding the step back; once
  // one finishes it is admitted by a synchronous step. The outputs equal the synchronous loop's.
  auto all = [](uint64_t) { return true; };
  OverlapLoop loop(64, 4, 4, SchedulerConfig{2, 16, 0});
  loop.Add(1, 3, 100);
  loop.Add(2, 3, 100);
  loop.Add(3, 3, 100);
  std::vector<uint64_t> preempted;
  loop.Launch(loop.sched_.Schedule(&preempted));
  EXPECT_EQ(loop.sched_.num_waiting(), 1u);
  std::optional<StepPlan> ahead = loop.sched_.ScheduleAhead(all);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(ahead->seqs.size(), 2u);
  // A free running slot with a waiting request: the next step admits, so it is synchronous.
  OverlapLoop roomy(64, 4, 4, SchedulerConfig{4, 16, 0});
  roomy.Add(1, 3, 100);
  roomy.Launch(roomy.sched_.Schedule(&preempted));
  roomy.Add(2, 3, 100);
  EXPECT_FALSE(roomy.sched_.ScheduleAhead(all).has_value());

  EXPECT_GT(AheadStepsWithTheSameOutputs(SchedulerConfig{2, 16, 0}, 5, 6, 3), 20);
}

TEST(SchedulerOverlap, PenaltiesAndReleases) {
  auto all = [](uint64_t) { return true; };
  OverlapLoop loop(64, 4, 4, SchedulerConfig{4, 16, 0});
  loop.Add(1, 3, 100);
  SchedRequest r;
  r.id = 2;
  r.prompt = {100, 101, 102};
  auto spec = std::make_shared<SamplingSpec>();
  spec->presence_penalty = 0.5f;
  r.sampling = spec;
  loop.sched_.Add(std::move(r));
  std::vector<uint64_t> preempted;
  loop.Launch(loop.sched_.Schedule(&preempted));
  // Request 2's penalties do not hold the step back (the worker counts the deferred token).
  std::optional<StepPlan> ahead = loop.sched_.ScheduleAhead(all);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(ahead->seqs.size(), 2u);
  loop.Launch(*ahead, /*ahead=*/true);
  loop.Collect();
  // Releases given back after a failed launch go out with the next plan.
  loop.Collect();
  loop.sched_.Remove(2);
  StepPlan next = loop.sched_.Schedule(&preempted);
  EXPECT_EQ(next.released, std::vector<uint64_t>{2});
  loop.sched_.RestoreReleases(std::move(next.released));
  EXPECT_EQ(loop.sched_.Schedule(&preempted).released, std::vector<uint64_t>{2});
}

TEST(SchedulerOverlap, AheadNeverPreempts) {
  // 2 blocks of 4 tokens: request 1 (prompt 4) fills one, request 2 (prompt 4) the other; their
  // next tokens each need a new block, which only preemption could give.
  OverlapLoop loop(2, 2, 4, SchedulerConfig{2, 16, 0});
  loop.Add(1, 4, 100);
  loop.Add(2, 4, 100);
  std::vector<uint64_t> preempted;
  loop.Launch(loop.sched_.Schedule(&preempted));
  EXPECT_EQ(loop.kv_.free_blocks(), 0);
  EXPECT_FALSE(loop.sched_.ScheduleAhead([](uint64_t) { return true; }).has_value());
  EXPECT_EQ(loop.kv_.free_blocks(), 0);
  EXPECT_EQ(loop.sched_.num_running(), 2u);
}

}  // namespace
}  // namespace dsv4
