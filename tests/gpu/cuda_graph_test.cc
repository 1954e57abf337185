// CUDA graphs on the GPU worker (label `gpu`, docs/cuda-graphs.md): a graph captured at short
// context replayed on long cached prefixes (the vLLM #52448 failure) against eager, with a debug
// switch that re-enables the bug to show the check catches it; graph == eager under concurrent
// long-context load with FULL and PIECEWISE steps; padding rows write no state; the kill switch.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <random>

#include "common/status.h"
#include "tests/gpu/backend_pair.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {
namespace {

// The real DSV4-Flash attention and indexer shapes (top-512, ratio 4) in 3 layers; fewer experts
// and a small vocabulary keep it quick.
Json FlashIndexerConfig() { return testing::FlashWidthsConfigJson(512, 1024, 4096); }

constexpr int32_t kMaxLen = 4096;
const std::vector<int32_t> kCaptureSizes = {1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024};

struct Pair {
  ModelConfig config;
  CacheConfig cache;
  std::unique_ptr<Worker> graph, eager;
};

Pair MakeWorkers(int slots, const CudaGraphOptions& graph_options, Precision precision) {
  Pair p;
  auto config = ParseModelConfig(FlashIndexerConfig().dump());
  EXPECT_TRUE(config.ok()) << config.status();
  p.config = *config;
  p.cache.num_slots = slots;
  p.cache.max_model_len = kMaxLen;
  p.cache.block_size = DefaultBlockSize(p.config);
  p.cache.num_blocks = slots * (kMaxLen / DefaultBlockSize(p.config));
  WeightsSpec weights;
  weights.keep_formats = testing::TestKeepsFormats();
  weights.synthetic = true;
  weights.seed = 21;
  auto g =
      CreateWorker(DeviceChoice{true, 0}, precision, p.config, weights, p.cache, graph_options);
  auto e = CreateWorker(DeviceChoice{true, 0}, precision, p.config, weights, p.cache);
  EXPECT_TRUE(g.ok() && e.ok()) << g.status() << e.status();
  if (g.ok()) p.graph = *std::move(g);
  if (e.ok()) p.eager = *std::move(e);
  return p;
}

// One request of a fixed schedule. The plan shapes depend only on how far each request got, so
// the graph and eager runs see identical schedules.
struct Req {
  std::vector<int32_t> prompt;
  int arrival = 0;
  int32_t slot = 0;
  std::vector<int32_t> blocks;
  int32_t fed = 0;
  std::vector<int32_t> out;
  std::vector<float> margin;  // top-1 minus top-2 log-probability of each sampled token
};

std::shared_ptr<SamplingSpec> Greedy() {
  auto s = std::make_shared<SamplingSpec>();
  s->logprobs = 2;
  return s;
}

// FULL for uniform decode, PIECEWISE otherwise, padded to the next capture size.
void ChooseGraph(StepPlan* plan) {
  const int64_t T = plan->num_tokens();
  bool decode = true;
  for (const ScheduledSeq& s : plan->seqs) decode &= s.tokens.size() == 1;
  for (int32_t size : kCaptureSizes) {
    if (size >= T) {
      plan->graph_mode = decode ? GraphMode::kFull : GraphMode::kPiecewise;
      plan->padded_tokens = size;
      return;
    }
  }
}

// Request `i`'s entry in a plan, where it stands now (the caller sets the tokens).
ScheduledSeq SeqOf(const Req& r, size_t i, const std::shared_ptr<SamplingSpec>& spec) {
  ScheduledSeq s;
  s.request_id = i + 1;
  s.state_slot = r.slot;
  s.block_table = r.blocks;
  s.start_pos = r.fed;
  s.prompt_len = static_cast<int32_t>(r.prompt.size());
  s.output_index = static_cast<int32_t>(r.out.size());
  s.sampling = spec;
  return s;
}

// Running requests decode; requests with prompt left get chunks within the step's prefill budget.
StepPlan NextPlan(std::vector<Req>& reqs, int step, int prefill_budget, int max_new,
                  const std::shared_ptr<SamplingSpec>& spec) {
  StepPlan plan;
  plan.step_id = static_cast<uint64_t>(step + 1);
  int budget = prefill_budget;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Req& r = reqs[i];
    if (r.arrival > step || static_cast<int>(r.out.size()) >= max_new) continue;
    ScheduledSeq s = SeqOf(r, i, spec);
    if (r.fed < static_cast<int32_t>(r.prompt.size())) {
      const int n = std::min<int>(budget, static_cast<int>(r.prompt.size()) - r.fed);
      if (n == 0) continue;
      budget -= n;
      s.tokens.assign(r.prompt.begin() + r.fed, r.prompt.begin() + r.fed + n);
      s.sample = r.fed + n == static_cast<int32_t>(r.prompt.size());
    } else {
      s.tokens = {r.out.back()};
      s.sample = true;
    }
    plan.seqs.push_back(std::move(s));
  }
  return plan;
}

void Commit(std::vector<Req>& reqs, const StepPlan& plan, const StepResult& result) {
  size_t k = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    Req& r = reqs[s.request_id - 1];
    r.fed += static_cast<int32_t>(s.tokens.size());
    if (!s.sample) continue;
    const SampledToken& t = result.sampled[k++];
    r.out.push_back(t.token);
    r.margin.push_back(t.top.size() >= 2 ? t.top[0].second - t.top[1].second : 1e9f);
  }
}

std::vector<Req> MakeRequests(int n, int min_len, int max_len, int vocab, int32_t per_seq,
                              int stagger, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Req> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Req& r = reqs[static_cast<size_t>(i)];
    r.prompt.resize(
        static_cast<size_t>(min_len + static_cast<int>(rng() % (max_len - min_len + 1))));
    for (auto& t : r.prompt) t = static_cast<int32_t>(2 + rng() % (vocab - 2));
    r.arrival = i * stagger;
    r.slot = i;
    for (int32_t b = 0; b < per_seq; ++b) r.blocks.push_back(i * per_seq + b);
  }
  return reqs;
}

// ---- capture short, replay long --------------------------------------------------------------

struct ShortLongResult {
  double max_logprob_diff = 0;  // top-2 log-probabilities, graph vs eager, on the long replays
  int token_mismatches = 0;     // greedy ids that differ where eager's margin exceeds 1e-3
  int long_replays = 0;         // FULL steps replayed (not captured) on the long sequence
};

// Prefills a short and a long sequence eagerly, then decodes the short one first under FULL
// graphs (the batch-1 graph is captured there, at ~32 positions), then the long one (the same
// graph replayed at ~3000 positions: 750 > 512 visible CSA entries, so the indexer must score).
// Both workers are fed the eager worker's tokens (teacher forcing), so one near-tie cannot make
// the runs drift apart.
ShortLongResult CaptureShortReplayLong(const CudaGraphOptions& options,
                                       Precision precision = Precision::kFP32) {
  ShortLongResult res;
  Pair p = MakeWorkers(2, options, precision);
  if (!p.graph || !p.eager) return res;
  const int32_t per_seq = kMaxLen / p.cache.block_size;
  std::vector<Req> reqs =
      MakeRequests(2, 32, 32, static_cast<int>(p.config.vocab_size), per_seq, 0, 5);
  reqs[1].prompt.resize(3000);
  std::mt19937 rng(6);
  for (auto& t : reqs[1].prompt) t = static_cast<int32_t>(2 + rng() % (p.config.vocab_size - 2));
  auto spec = Greedy();
  auto run = [&](const StepPlan& plan, bool check) {
    StepPlan eager_plan = plan;
    eager_plan.graph_mode = GraphMode::kEager;
    eager_plan.padded_tokens = 0;
    auto g = p.graph->Execute(plan);
    auto e = p.eager->Execute(eager_plan);
    EXPECT_TRUE(g.ok() && e.ok()) << g.status() << e.status();
    if (!g.ok() || !e.ok()) return;
    EXPECT_EQ(g->graph.mode, plan.graph_mode);
    EXPECT_EQ(e->graph.mode, GraphMode::kEager);
    if (check) {
      for (size_t i = 0; i < e->sampled.size(); ++i) {
        const SampledToken& a = g->sampled[i];
        const SampledToken& b = e->sampled[i];
        for (size_t k = 0; k < 2; ++k) {
          res.max_logprob_diff =
              std::max<double>(res.max_logprob_diff, std::fabs(a.top[k].second - b.top[k].second));
        }
        if (a.token != b.token && b.top[0].second - b.top[1].second > 1e-3f) ++res.token_mismatches;
      }
      if (g->graph.captures == 0) res.long_replays += g->graph.replays;
    }
    Commit(reqs, plan, *e);
  };
  // Prefill both, eagerly.
  for (int step = 0; reqs[0].fed < 32 || reqs[1].fed < 3000; ++step) {
    run(NextPlan(reqs, step, 1024, 64, spec), false);
  }
  for (int step = 0; step < 6; ++step) {
    for (size_t which : {size_t{0}, size_t{1}}) {
      StepPlan plan;
      plan.step_id = 1000 + static_cast<uint64_t>(step * 2 + which);
      const Req& r = reqs[which];
      ScheduledSeq s = SeqOf(r, which, spec);
      s.tokens = {r.out.back()};
      s.sample = true;
      plan.seqs.push_back(std::move(s));
      plan.graph_mode = GraphMode::kFull;
      plan.padded_tokens = 1;
      run(plan, which == 1);
    }
  }
  return res;
}

TEST(CudaGraphs, CaptureShortReplayLongMatchesEager) {
  DSV4_REQUIRE_GPU();
  const ShortLongResult r = CaptureShortReplayLong(CudaGraphOptions{});
  std::printf(
      "    capture short / replay long: max |logprob diff| %.3g, %d replays, %d mismatches\n",
      r.max_logprob_diff, r.long_replays, r.token_mismatches);
  EXPECT_EQ(r.long_replays, 6);  // captured once (short), replayed at every long step
  EXPECT_LT(r.max_logprob_diff, 1e-3);
  EXPECT_EQ(r.token_mismatches, 0);
}

// The same in bf16, where a batch-1 step runs the single-token kernels (weight-streaming GEMV,
// fused experts) with programmatic dependent launch: inside the FULL graph they must give what
// they give eagerly.
TEST(CudaGraphs, CaptureShortReplayLongMatchesEagerInBf16) {
  DSV4_REQUIRE_GPU();
  const ShortLongResult r = CaptureShortReplayLong(CudaGraphOptions{}, Precision::kBF16);
  std::printf("    bf16: max |logprob diff| %.3g, %d replays, %d mismatches\n", r.max_logprob_diff,
              r.long_replays, r.token_mismatches);
  EXPECT_EQ(r.long_replays, 6);
  EXPECT_LT(r.max_logprob_diff, 1e-3);
  EXPECT_EQ(r.token_mismatches, 0);
}

// The same check with the indexer's short-context shortcut allowed during capture (vLLM #52448):
// the graph bakes "select candidates 0..511" and the long replays must come out wrong.
TEST(CudaGraphs, ShortcutInCaptureDebugSwitchIsCaught) {
  DSV4_REQUIRE_GPU();
  CudaGraphOptions unsafe;
  unsafe.shortcut_in_capture = true;
  const ShortLongResult r = CaptureShortReplayLong(unsafe);
  std::printf("    with the shortcut baked in: max |logprob diff| %.3g, %d mismatches\n",
              r.max_logprob_diff, r.token_mismatches);
  EXPECT_EQ(r.long_replays, 6);
  EXPECT_GT(r.max_logprob_diff, 1e-3) << "the regression check did not see the baked shortcut";
}

// ---- graph == eager under concurrency --------------------------------------------------------

// Staggered long-context requests (prompts 2100..2800 tokens, above index_topk x ratio = 2048)
// through a continuous-batching schedule: mixed prefill+decode steps run PIECEWISE, uniform
// decode steps FULL, at many padded sizes. Each run generates greedily on its own; the outputs
// must be identical, except after a numerical tie (eager's top-2 margin below 1e-3 where they
// part), which is reported. Length-capped requests (no end-of-sequence token within the cap) are
// counted in both modes.
TEST(CudaGraphs, GraphEqualsEagerUnderConcurrentLongContextLoad) {
  DSV4_REQUIRE_GPU();
  constexpr int kRequests = 20, kMaxNew = 24;
  Pair p = MakeWorkers(kRequests, CudaGraphOptions{}, Precision::kFP32);
  ASSERT_TRUE(p.graph && p.eager);
  const int32_t per_seq = kMaxLen / p.cache.block_size;
  const std::vector<Req> init =
      MakeRequests(kRequests, 2100, 2800, static_cast<int>(p.config.vocab_size), per_seq, 3, 8);
  auto spec = Greedy();
  struct Run {
    std::vector<Req> reqs;
    int64_t full = 0, piecewise = 0, captures = 0, eager = 0;
  };
  auto drive = [&](Worker* w, bool graphs) {
    Run run;
    run.reqs = init;
    for (int step = 0; step < 10000; ++step) {
      StepPlan plan = NextPlan(run.reqs, step, 512, kMaxNew, spec);
      if (plan.seqs.empty()) {
        bool done = true;
        for (const Req& r : run.reqs) done &= static_cast<int>(r.out.size()) >= kMaxNew;
        if (done) break;
        continue;
      }
      if (graphs) ChooseGraph(&plan);
      auto res = w->Execute(plan);
      EXPECT_TRUE(res.ok()) << res.status();
      if (!res.ok()) break;
      run.full += res->graph.mode == GraphMode::kFull;
      run.piecewise += res->graph.mode == GraphMode::kPiecewise;
      run.eager += res->graph.mode == GraphMode::kEager;
      run.captures += res->graph.captures;
      EXPECT_FALSE(res->graph.fallback);
      Commit(run.reqs, plan, *res);
    }
    return run;
  };
  const Run g = drive(p.graph.get(), true);
  const Run e = drive(p.eager.get(), false);
  int identical = 0, tie_divergences = 0, capped_g = 0, capped_e = 0;
  auto capped = [&](const Req& r) {
    for (int32_t t : r.out) {
      for (int64_t eos : p.config.eos_token_ids) {
        if (t == eos) return false;
      }
    }
    return true;
  };
  for (size_t i = 0; i < init.size(); ++i) {
    const Req& a = g.reqs[i];
    const Req& b = e.reqs[i];
    ASSERT_EQ(a.out.size(), b.out.size());
    capped_g += capped(a);
    capped_e += capped(b);
    size_t k = 0;
    while (k < a.out.size() && a.out[k] == b.out[k]) ++k;
    if (k == a.out.size()) {
      ++identical;
      continue;
    }
    ++tie_divergences;
    EXPECT_LT(b.margin[k], 1e-3f) << "request " << i << " parts from eager at output " << k
                                  << " with a clear margin " << b.margin[k];
  }
  std::printf(
      "    %d requests: %d identical, %d parted at a numerical tie; FULL steps %lld, "
      "PIECEWISE steps %lld, captures %lld; length-capped graph %d / eager %d\n",
      kRequests, identical, tie_divergences, static_cast<long long>(g.full),
      static_cast<long long>(g.piecewise), static_cast<long long>(g.captures), capped_g, capped_e);
  EXPECT_GT(g.full, 0);
  EXPECT_GT(g.piecewise, 0);
  EXPECT_EQ(g.eager, 0);
  // One capture per (mode, padded size) at most: the baked addresses held across replays.
  EXPECT_LE(g.captures, 2 * static_cast<int64_t>(kCaptureSizes.size()));
  EXPECT_EQ(capped_g, capped_e);
  EXPECT_GE(identical, kRequests - 1);
}

// ---- padding rows are inert ------------------------------------------------------------------

// A padded step (the shapes a graph runs) with one real sequence in slot 1: every pool row
// outside slot 1 and its blocks keeps its contents, and the real sequence's logits equal an
// unpadded step's. Pools are filled with a pattern first, so a stray write shows.
TEST(CudaGraphs, PaddingRowsWriteNoState) {
  DSV4_REQUIRE_GPU();
  auto config = ParseModelConfig(FlashIndexerConfig().dump());
  ASSERT_TRUE(config.ok());
  CacheConfig cache;
  cache.num_slots = 3;
  cache.max_model_len = 1024;
  cache.num_blocks = 3 * (1024 / DefaultBlockSize(*config));
  auto run = [&](int32_t padded, std::vector<std::vector<float>>* pools_after) {
    auto model =
        Dsv4Model::LoadSynthetic(*config, 3, *CreateCudaBackend(0, Precision::kFP32), cache);
    EXPECT_TRUE(model.ok()) << model.status();
    Backend& be = (*model)->backend();
    for (const auto& [name, t] : (*model)->Pools()) {
      std::vector<float> fill(static_cast<size_t>(t.numel()), 7.0f);
      EXPECT_TRUE(be.CopyFromHost(fill.data(), t).ok());
    }
    const int32_t per_seq = 1024 / (*model)->cache().block_size;
    std::vector<int32_t> tokens(300), blocks;
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + i * 7 % 4000);
    for (int32_t b = 0; b < per_seq; ++b) blocks.push_back(per_seq + b);  // slot 1's blocks
    SequenceStep s;
    s.tokens = tokens;
    s.state_slot = 1;
    s.block_table = blocks;
    s.logits = SequenceStep::Logits::kLast;
    StepOptions o;
    o.padded_tokens = padded;
    o.padded_seqs = padded > 0 ? 3 : 0;
    o.logits_per_seq = padded > 0;
    std::vector<int32_t> rows;
    EXPECT_TRUE((*model)->PrepareStep({&s, 1}, o, &rows).ok());
    auto logits = (*model)->RunForward();
    EXPECT_TRUE(logits.ok()) << logits.status();
    std::vector<float> host(static_cast<size_t>(logits->numel()));
    EXPECT_TRUE(be.CopyToHost(*logits, host.data()).ok());
    for (const auto& [name, t] : (*model)->Pools()) {
      std::vector<float> h(static_cast<size_t>(t.numel()));
      EXPECT_TRUE(be.CopyToHost(t, h.data()).ok());
      pools_after->push_back(std::move(h));
    }
    host.resize(static_cast<size_t>(config->vocab_size));  // row 0: the real sequence
    return std::make_pair(host, (*model)->Pools());
  };
  std::vector<std::vector<float>> padded_pools, plain_pools;
  // 300 real tokens padded to 512: 212 padding tokens at positions 0..211 close compressor
  // windows (ratio 4 and 128) and fill a window's worth of ring rows if they were written.
  auto [padded_logits, pools] = run(512, &padded_pools);
  auto [plain_logits, unused] = run(0, &plain_pools);
  EXPECT_TRUE(testing::Close(padded_logits, plain_logits, 1e-4, 1e-4));
  const int32_t per_seq = 1024 / DefaultBlockSize(*config);
  for (size_t i = 0; i < pools.size(); ++i) {
    const Tensor& t = pools[i].second;
    const bool by_slot = t.dim(0) == cache.num_slots;
    const int64_t row = t.numel() / t.dim(0);
    int64_t changed_outside = 0;
    for (int64_t r = 0; r < t.dim(0); ++r) {
      const bool owned = by_slot ? r == 1 : (r >= per_seq && r < 2 * per_seq);
      if (owned) continue;
      for (int64_t k = 0; k < row; ++k) changed_outside += padded_pools[i][r * row + k] != 7.0f;
    }
    EXPECT_EQ(changed_outside, 0) << pools[i].first;
    // The real sequence's rows: what an unpadded step writes (the GEMMs' row count differs).
    EXPECT_TRUE(testing::Close(padded_pools[i], plain_pools[i], 1e-4, 1e-4)) << pools[i].first;
  }
}

// The kill switch: every planned graph runs eagerly and is reported as a fallback.
// The tiny model (synthetic weights, fp32) on a GPU worker with a cache of `slots` x 256 tokens,
// and `requests` requests of min_len..max_len prompt tokens for it.
struct TinyRun {
  std::unique_ptr<Worker> worker;
  std::vector<Req> reqs;
};
absl::StatusOr<TinyRun> MakeTinyRun(const CudaGraphOptions& options = {}, int slots = 2,
                                    int requests = 1, int min_len = 8, int max_len = 8) {
  ASSIGN_OR_RETURN(const ModelConfig config, ParseModelConfig(testing::TinyConfigJson().dump()));
  CacheConfig cache;
  cache.num_slots = slots;
  cache.max_model_len = 256;
  cache.num_blocks = slots * (256 / DefaultBlockSize(config));
  WeightsSpec weights;
  weights.keep_formats = testing::TestKeepsFormats();
  weights.synthetic = true;
  TinyRun t;
  ASSIGN_OR_RETURN(t.worker, CreateWorker(DeviceChoice{true, 0}, Precision::kFP32, config, weights,
                                          cache, options));
  t.reqs = MakeRequests(requests, min_len, max_len, static_cast<int>(config.vocab_size),
                        256 / DefaultBlockSize(config), 0, 1);
  return t;
}

TEST(CudaGraphs, EnforceEagerKillSwitch) {
  DSV4_REQUIRE_GPU();
  CudaGraphOptions off;
  off.enforce_eager = true;
  auto run = MakeTinyRun(off);
  ASSERT_TRUE(run.ok()) << run.status();
  std::unique_ptr<Worker>& w = run->worker;
  std::vector<Req>& reqs = run->reqs;
  for (int step = 0; step < 3; ++step) {
    StepPlan plan = NextPlan(reqs, step, 64, 8, Greedy());
    ChooseGraph(&plan);
    auto r = w->Execute(plan);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->graph.mode, GraphMode::kEager);
    EXPECT_TRUE(r->graph.fallback);
    EXPECT_EQ(r->graph.captures, 0);
    Commit(reqs, plan, *r);
  }
}

// DSV4_STEP_DEVICE_TIME=1: each step reports the device's time for its forward and sampling
// (timing events), which lies inside the step's own wall time; unset, nothing is measured.
TEST(CudaGraphs, StepDeviceTimeIsMeasuredOnlyWhenAsked) {
  DSV4_REQUIRE_GPU();
  for (const bool timed : {true, false}) {
    SCOPED_TRACE(timed ? "timed" : "untimed");
    if (timed) setenv("DSV4_STEP_DEVICE_TIME", "1", 1);
    auto run = MakeTinyRun();
    unsetenv("DSV4_STEP_DEVICE_TIME");
    ASSERT_TRUE(run.ok()) << run.status();
    std::unique_ptr<Worker>& w = run->worker;
    std::vector<Req>& reqs = run->reqs;
    // A prefill (eager or piecewise), a FULL capture, then FULL replays.
    for (int step = 0; step < 4; ++step) {
      StepPlan plan = NextPlan(reqs, step, 64, 8, Greedy());
      ChooseGraph(&plan);
      auto r = w->Execute(plan);
      ASSERT_TRUE(r.ok()) << r.status();
      if (timed) {
        EXPECT_GT(r->device_seconds, 0.0) << "step " << step;
        EXPECT_LE(r->device_seconds, r->execute_seconds) << "step " << step;
      } else {
        EXPECT_EQ(r->device_seconds, 0.0) << "step " << step;
      }
      Commit(reqs, plan, *r);
    }
  }
  setenv("DSV4_STEP_DEVICE_TIME", "2", 1);
  auto bad = MakeTinyRun();
  unsetenv("DSV4_STEP_DEVICE_TIME");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("DSV4_STEP_DEVICE_TIME"), std::string::npos)
      << bad.status();
}

// Overlapped decode (Worker::Launch / Collect): each decode step is launched before the previous
// one's results are read, its input tokens deferred (resolved on the device from the tokens the
// previous step sampled into each slot, before the hash-routed MoE layer reads them). A
// synchronous twin worker runs the same plans with the tokens filled in on the host: the streams
// and log-probabilities are equal, FULL graphs and eager alike. 3 requests in 4 slots, so FULL
// steps sample a padding row, whose token must land in no slot; mid-way the steps reverse the
// order of their sequences, a fourth request's prefill joins a step of deferred decodes (a
// PIECEWISE step with graphs), and a request leaves, so a deferred token is found by its slot,
// not by its row. Request 3 uses penalties: the device counts its deferred tokens.
TEST(CudaGraphs, OverlappedDecodeFeedsTheSampledTokens) {
  DSV4_REQUIRE_GPU();
  constexpr int kSlots = 4, kRequests = 3, kMaxNew = 12;
  for (const bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    auto overlapped = MakeTinyRun({}, kSlots, kRequests, 6, 40);
    auto sync = MakeTinyRun({}, kSlots, kRequests, 6, 40);
    ASSERT_TRUE(sync.ok() && overlapped.ok()) << sync.status() << overlapped.status();
    Worker& w = *overlapped->worker;
    std::vector<Req>& b = overlapped->reqs;
    std::deque<StepPlan> flying;
    std::vector<StepPlan> launched;
    int64_t full = 0;
    auto launch = [&](StepPlan plan) {
      if (graphs) ChooseGraph(&plan);
      const absl::Status st = w.Launch(plan);
      EXPECT_TRUE(st.ok()) << st;
      launched.push_back(plan);
      flying.push_back(std::move(plan));
    };
    auto collect = [&] {
      auto r = w.Collect();
      ASSERT_TRUE(r.ok()) << r.status();
      full += r->graph.mode == GraphMode::kFull;
      Commit(b, flying.front(), *r);
      flying.pop_front();
    };
    // Every prompt in one step; request 3 samples with penalties, whose counts take its deferred
    // tokens on the device.
    StepPlan first = NextPlan(b, 0, 4096, kMaxNew, Greedy());
    auto penalized = std::make_shared<SamplingSpec>(*Greedy());
    penalized->repetition_penalty = 1.3f;
    penalized->presence_penalty = 0.4f;
    penalized->frequency_penalty = 0.2f;
    first.seqs[2].sampling = penalized;
    launch(std::move(first));
    for (int step = 1; step < kMaxNew; ++step) {
      // Each sequence of the step in flight decodes the token that step samples.
      StepPlan ahead;
      ahead.step_id = 100 + step;
      for (const ScheduledSeq& prev : flying.back().seqs) {
        if (step >= 8 && prev.request_id == 2) continue;  // request 2 leaves
        ScheduledSeq s = prev;
        s.start_pos = prev.start_pos + static_cast<int32_t>(prev.tokens.size());
        s.output_index = prev.output_index + 1;
        s.tokens = {kDeferredToken};
        s.deferred_token = true;
        s.sample = true;
        ahead.seqs.push_back(std::move(s));
      }
      if (step == 4) std::reverse(ahead.seqs.begin(), ahead.seqs.end());
      if (step == 6) {
        // Request 4 (slot 3) joins with its prompt.
        Req r;
        for (int t = 0; t < 10; ++t) r.prompt.push_back(5 + 7 * t);
        r.slot = 3;
        const int32_t per_seq = static_cast<int32_t>(b[0].blocks.size());
        for (int32_t k = 0; k < per_seq; ++k) r.blocks.push_back(3 * per_seq + k);
        b.push_back(r);
        ScheduledSeq s = SeqOf(b.back(), 3, Greedy());
        s.tokens = r.prompt;
        s.sample = true;
        ahead.seqs.insert(ahead.seqs.begin() + 1, std::move(s));
      }
      launch(std::move(ahead));
      EXPECT_EQ(w.in_flight(), 2);
      collect();
    }
    collect();
    EXPECT_EQ(w.in_flight(), 0);
    if (graphs) {
      EXPECT_EQ(full, kMaxNew - 2);  // all decode steps but the one request 4 joins
    }
    // The twin: the same plans, each deferred token filled in from its own previous step.
    std::map<uint64_t, int32_t> last;
    std::map<uint64_t, std::vector<int32_t>> tokens;
    std::map<uint64_t, std::vector<float>> margins;
    for (StepPlan plan : launched) {
      for (ScheduledSeq& s : plan.seqs) {
        if (!s.deferred_token) continue;
        s.tokens = {last.at(s.request_id)};
        s.deferred_token = false;
      }
      auto r = sync->worker->Execute(plan);
      ASSERT_TRUE(r.ok()) << r.status();
      for (const SampledToken& t : r->sampled) {
        last[t.request_id] = t.token;
        tokens[t.request_id].push_back(t.token);
        margins[t.request_id].push_back(t.top.size() >= 2 ? t.top[0].second - t.top[1].second
                                                          : 1e9f);
      }
    }
    ASSERT_EQ(b.size(), static_cast<size_t>(kRequests) + 1);
    for (int i = 0; i <= kRequests; ++i) {
      const uint64_t id = static_cast<uint64_t>(i) + 1;
      EXPECT_EQ(b[i].out.size(), id == 2 ? 8u : id == 4 ? 6u : static_cast<size_t>(kMaxNew));
      EXPECT_EQ(b[i].out, tokens[id]) << "request " << id;
      EXPECT_EQ(b[i].margin, margins[id]) << "request " << id;
    }
  }
}

// What the worker refuses: a deferred token the previous launched step did not sample (or not in
// that slot), a third step in flight, Execute or Launch out of order. Each is a clear error and
// leaves the worker usable.
TEST(CudaGraphs, OverlappedDecodeMisuseIsRefused) {
  DSV4_REQUIRE_GPU();
  auto run = MakeTinyRun({}, 2, 2, 6, 6);
  ASSERT_TRUE(run.ok()) << run.status();
  Worker& w = *run->worker;
  std::vector<Req>& reqs = run->reqs;
  EXPECT_EQ(w.Collect().status().code(), absl::StatusCode::kFailedPrecondition);
  StepPlan first = NextPlan(reqs, 0, 4096, 8, Greedy());
  ASSERT_EQ(first.seqs.size(), 2u);
  auto deferred_after = [](const StepPlan& prev) {
    StepPlan next;
    for (const ScheduledSeq& p : prev.seqs) {
      ScheduledSeq s = p;
      s.start_pos = p.start_pos + static_cast<int32_t>(p.tokens.size());
      s.output_index = p.output_index + 1;
      s.tokens = {kDeferredToken};
      s.deferred_token = true;
      next.seqs.push_back(std::move(s));
    }
    return next;
  };
  // Nothing launched before: no token to defer to.
  absl::Status st = w.Launch(deferred_after(first));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  ASSERT_TRUE(w.Launch(first).ok());
  EXPECT_EQ(w.Execute(first).status().code(), absl::StatusCode::kFailedPrecondition);
  StepPlan wrong_slot = deferred_after(first);
  wrong_slot.seqs[0].state_slot = 1 - wrong_slot.seqs[0].state_slot;
  wrong_slot.seqs.resize(1);
  st = w.Launch(wrong_slot);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  StepPlan second = deferred_after(first);
  ASSERT_TRUE(w.Launch(second).ok());
  st = w.Launch(deferred_after(second));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  // The two launched steps still come back, in order, with the fed tokens.
  auto r1 = w.Collect();
  auto r2 = w.Collect();
  ASSERT_TRUE(r1.ok() && r2.ok()) << r1.status() << r2.status();
  EXPECT_EQ(r1->sampled.size(), 2u);
  EXPECT_EQ(r2->sampled.size(), 2u);
  EXPECT_EQ(w.in_flight(), 0);
}

}  // namespace
}  // namespace dsv4
