// The control plane's codec (control/plan_codec.h): plans and results survive the wire exactly,
// sampling parameters travel once, and garbage is refused by name, never a crash.
#include "control/plan_codec.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4::control {
namespace {

StepPlan Plan(std::shared_ptr<const SamplingSpec> spec) {
  StepPlan p;
  p.step_id = 42;
  p.graph_mode = GraphMode::kPiecewise;
  p.padded_tokens = 16;
  p.force_indexer_scoring = true;
  p.released = {7, 9};
  for (int i = 0; i < 3; ++i) {
    ScheduledSeq s;
    s.request_id = 100 + i;
    s.tokens = i == 1 ? std::vector<int32_t>{5, 6, 7, 8} : std::vector<int32_t>{11 + i};
    s.start_pos = 30 * i;
    s.state_slot = 3 - i;
    s.block_table = {i, i + 10, i + 20};
    s.sample = i != 1;
    s.deferred_token = i == 2;
    s.prompt_len = 12;
    s.output_index = i;
    if (s.sample) s.sampling = spec;
    p.seqs.push_back(s);
  }
  return p;
}

TEST(PlanCodec, PlansAndResultsRoundTripAndSamplingTravelsOnce) {
  auto spec = std::make_shared<SamplingSpec>();
  spec->temperature = 0.7f;
  spec->top_k = 5;
  spec->seed = 99;
  spec->min_tokens_mask = {1, 2};
  spec->logprobs = 3;
  const StepPlan plan = Plan(spec);
  pb::Step wire;
  ToProto(plan, &wire);
  for (uint64_t id : {100, 102}) {
    pb::RequestSpec* r = wire.add_requests();
    r->set_request_id(id);
    ToProto(*spec, r->mutable_sampling());
  }
  std::string bytes;
  ASSERT_TRUE(wire.SerializeToString(&bytes));
  pb::Step back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  std::map<uint64_t, std::shared_ptr<const SamplingSpec>> known;
  auto got = FromProto(back, &known);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->seqs.size(), plan.seqs.size());
  EXPECT_EQ(got->step_id, 42u);
  EXPECT_EQ(got->graph_mode, GraphMode::kPiecewise);
  EXPECT_EQ(got->padded_tokens, 16);
  EXPECT_TRUE(got->force_indexer_scoring);
  EXPECT_EQ(got->released, plan.released);
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const ScheduledSeq &a = plan.seqs[i], &b = got->seqs[i];
    EXPECT_EQ(b.request_id, a.request_id);
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.start_pos, a.start_pos);
    EXPECT_EQ(b.state_slot, a.state_slot);
    EXPECT_EQ(b.block_table, a.block_table);
    EXPECT_EQ(b.sample, a.sample);
    EXPECT_EQ(b.deferred_token, a.deferred_token);
    EXPECT_EQ(b.prompt_len, a.prompt_len);
    EXPECT_EQ(b.output_index, a.output_index);
    if (a.sample) {
      ASSERT_NE(b.sampling, nullptr);
      EXPECT_EQ(b.sampling->temperature, 0.7f);
      EXPECT_EQ(b.sampling->top_k, 5);
      EXPECT_EQ(b.sampling->seed, 99u);
      EXPECT_EQ(b.sampling->min_tokens_mask, spec->min_tokens_mask);
      EXPECT_EQ(b.sampling->logprobs, 3);
    }
  }
  // The next step carries no specs: the rank remembers them.
  pb::Step next;
  ToProto(plan, &next);
  next.clear_released();
  EXPECT_TRUE(FromProto(next, &known).ok());
  // Released requests are forgotten: sampling one again without its spec is refused by name.
  pb::Step release;
  StepPlan r;
  r.released = {100, 102};
  ToProto(r, &release);
  ASSERT_TRUE(FromProto(release, &known).ok());
  auto again = FromProto(next, &known);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().message().find("request 100 samples"), std::string::npos);

  StepResult res;
  res.step_id = 42;
  res.execute_seconds = 0.25;
  res.collective_seconds = 0.125;
  res.sampled = {SampledToken{100, 7, -0.5f, {{7, -0.5f}, {3, -1.25f}}, false},
                 SampledToken{102, 9, -2.0f, {}, true}};
  pb::StepDone done;
  ToProto(res, true, &done);
  auto r2 = FromProto(done);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_EQ(r2->sampled.size(), 2u);
  EXPECT_EQ(r2->sampled[0].top, res.sampled[0].top);
  EXPECT_TRUE(r2->sampled[1].nonfinite);
  EXPECT_EQ(r2->collective_seconds, 0.125);
  pb::StepDone ack;
  ToProto(res, false, &ack);  // ranks other than 0: timings only
  EXPECT_EQ(ack.request_ids_size(), 0);
}

// Every decision the coordinator makes for all ranks arrives as it was made.
TEST(PlanCodec, ConfigureRoundTripsTheRankDecisions) {
  for (bool flag : {false, true}) {
    WorkerConfig wc;
    wc.precision = flag ? "fp32" : "bf16";
    wc.weight_format = flag ? "bf16" : "auto";
    wc.batch_invariant = flag;
    wc.graphs.enforce_eager = flag;
    wc.graphs.wide_eager_region = !flag;
    wc.synthetic = true;
    wc.synthetic_seed = 77;
    wc.cache.block_size = 64;
    wc.cache.num_state_snapshots = flag ? 9 : 0;
    wc.parallel = {1, 2};
    pb::Configure msg;
    ToProto(wc, testing::TinyConfigJson().dump(), &msg);
    msg.set_rank(1);
    msg.set_world_size(2);
    auto back = FromProto(msg);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->precision, wc.precision);
    EXPECT_EQ(back->weight_format, wc.weight_format);
    EXPECT_EQ(back->batch_invariant, flag);
    EXPECT_EQ(back->graphs.enforce_eager, flag);
    EXPECT_EQ(back->graphs.wide_eager_region, !flag);
    EXPECT_EQ(back->synthetic_seed, 77u);
    EXPECT_EQ(back->cache.num_state_snapshots, wc.cache.num_state_snapshots);
    EXPECT_EQ(back->parallel.rank, 1);
  }
}

TEST(PlanCodec, InconsistentStepsAreRefusedByField) {
  auto spec = std::make_shared<SamplingSpec>();
  pb::Step good;
  ToProto(Plan(spec), &good);
  struct Case {
    std::function<void(pb::Step*)> bend;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](pb::Step* s) { s->mutable_token_offsets()->RemoveLast(); }, "token_offsets"},
      {[](pb::Step* s) { s->set_block_offsets(1, 7); }, "block_offsets"},
      {[](pb::Step* s) { s->mutable_start_pos()->RemoveLast(); }, "start_pos"},
      {[](pb::Step* s) { s->set_flags(0, 8); }, "flags"},
      {[](pb::Step* s) { s->set_graph_mode(5); }, "graph_mode"},
      {[](pb::Step* s) { s->set_padded_tokens(-1); }, "padded_tokens"},
      {[](pb::Step* s) { s->set_start_pos(0, -3); }, "negative"},
      {[](pb::Step* s) {}, "never arrived"},  // sampling without a spec
  };
  for (const Case& c : cases) {
    pb::Step bad = good;
    c.bend(&bad);
    std::map<uint64_t, std::shared_ptr<const SamplingSpec>> known;
    auto got = FromProto(bad, &known);
    ASSERT_FALSE(got.ok()) << c.field;
    EXPECT_NE(got.status().message().find(c.field), std::string::npos) << got.status();
  }
}

// Random corruption of real messages: every parse either fails or decodes to a plan or an error.
TEST(PlanCodec, CorruptedBytesNeverCrash) {
  auto spec = std::make_shared<SamplingSpec>();
  pb::Step wire;
  ToProto(Plan(spec), &wire);
  pb::RequestSpec* r = wire.add_requests();
  r->set_request_id(100);
  std::string bytes;
  wire.SerializeToString(&bytes);
  StepResult res;
  res.sampled = {SampledToken{100, 7, -0.5f, {{7, -0.5f}}, false}};
  pb::StepDone done;
  ToProto(res, true, &done);
  std::string done_bytes;
  done.SerializeToString(&done_bytes);
  std::mt19937 rng(7);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string b = (i % 2 == 0) ? bytes : done_bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    if (rng() % 8 == 0) b.resize(rng() % b.size());
    if (i % 2 == 0) {
      pb::Step s;
      if (!s.ParseFromString(b)) continue;
      std::map<uint64_t, std::shared_ptr<const SamplingSpec>> known;
      decoded += FromProto(s, &known).ok();
    } else {
      pb::StepDone d;
      if (!d.ParseFromString(b)) continue;
      decoded += FromProto(d).ok();
    }
  }
  EXPECT_GT(decoded, 0);  // some corruptions stay valid (a changed token id)
}

}  // namespace
}  // namespace dsv4::control
