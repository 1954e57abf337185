// Scheduler: continuous batching over a per-step token budget. Deterministic, CPU-only, no
// clock, no threads: the engine loop (and the tests' simulated step loop) drive it.
//
// Each step, in this order:
//   1. decode priority: every running request with one token to feed gets it, in arrival order;
//      when its KV cannot grow, the latest-arriving running requests are preempted (recompute:
//      their KV is dropped and they re-prefill prompt + generated tokens later);
//   2. running requests in the middle of a chunked prefill continue, up to the budget;
//   3. waiting requests are admitted first come, first served while a state slot, KV blocks and
//      budget are available; admission stops at the first that does not fit (no overtaking).
//      With the prefix cache on (KvBlockManager::caching), an admitted request starts after the
//      cached blocks its tokens begin with: it shares them, its first chunk restores the state
//      snapshot of the last one, and every block boundary its chunks reach gets a snapshot.
//      Requests with repetition/presence/frequency penalties are not served from the cache (their
//      counts need every token); they still fill it.
// Prefill chunks are capped by the budget and by max_prefill_chunk.
//
// Overlapped decode (the engine's step N+1 planned while step N runs): AppendPending records that a
// launched step samples a request's next token; ScheduleAhead plans the next decode step with that
// token deferred (ScheduledSeq::deferred_token); AppendToken later fills the oldest pending token
// in. Schedule itself is only called with no token pending.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "common/step_plan.h"
#include "node/scheduler/kv_block_manager.h"

namespace dsv4 {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;          // running requests (<= the workers' state slots)
  int32_t max_batched_tokens = 2048;  // tokens per step
  int32_t max_prefill_chunk = 0;      // 0 = only the budget limits a chunk
};

struct SchedRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  std::shared_ptr<const SamplingSpec> sampling;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvBlockManager* kv);

  // Queues a new request (waiting).
  void Add(SchedRequest request);
  // Builds the next step. Requests preempted while building it are appended to `preempted`.
  StepPlan Schedule(std::vector<uint64_t>* preempted);
  // Records that the worker ran `plan`: the scheduled tokens are now cached.
  void Commit(const StepPlan& plan);
  // A sampled token the request keeps: it is fed in a later step. With tokens pending, it is the
  // oldest pending one.
  void AppendToken(uint64_t id, int32_t token);
  // A launched step samples the request's next token; its value comes later (AppendToken).
  void AppendPending(uint64_t id);
  // The next decode step, planned while the step sampling the running requests' pending tokens is
  // still in flight: one deferred token for each running request with a pending token for which
  // `include` is true (false: that token is known to be its last, e.g. at max_tokens). nullopt
  // when the step must wait for the results: a request is waiting for admission, a running
  // request has no token pending (a prefill in progress), or the KV blocks the step needs are
  // not free (planning it would preempt). A waiting request holds the step back only while it
  // could be admitted (a running slot and a state slot free): a saturated node keeps overlapping.
  std::optional<StepPlan> ScheduleAhead(const std::function<bool(uint64_t)>& include);
  // Gives back the releases of a plan the workers did not take (a failed launch).
  void RestoreReleases(std::vector<uint64_t> ids);
  // Drops a request (finished, aborted or failed) and frees its KV; its worker state is released
  // with the next plan. False if unknown.
  bool Remove(uint64_t id);

  bool Has(uint64_t id) const { return reqs_.count(id) > 0; }
  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  bool idle() const { return reqs_.empty() && releases_.empty(); }
  const KvBlockManager& kv() const { return *kv_; }
  // Generated tokens so far (for tests and recompute).
  const std::vector<int32_t>* Output(uint64_t id) const;
  int32_t Preemptions(uint64_t id) const;
  // Prompt tokens served from the prefix cache at the request's first admission.
  int32_t CachedTokens(uint64_t id) const;
  // Prefix-cache lookups so far, in tokens: looked up (every admission's known tokens) and hit.
  uint64_t prefix_query_tokens() const { return prefix_query_tokens_; }
  uint64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }

 private:
  struct Req {
    SchedRequest r;
    uint64_t arrival = 0;
    std::vector<int32_t> output;
    int32_t computed = 0;  // tokens with KV in the cache
    KvAllocation kv;
    bool running = false;
    int32_t preemptions = 0;
    int32_t pending = 0;  // trailing outputs whose value an in-flight step has not returned yet
    uint64_t scheduled_step = ~uint64_t{0};  // the step that last scheduled it
    int32_t restore_row = -1;   // the next chunk starts from this prefix-cache snapshot
    int32_t cached_tokens = -1;  // served from the cache at the first admission (-1: not yet)
    int64_t known() const { return static_cast<int64_t>(r.prompt.size() + output.size()); }
    int32_t Token(int64_t i) const {
      return i < static_cast<int64_t>(r.prompt.size()) ? r.prompt[i] : output[i - r.prompt.size()];
    }
  };
  void Preempt(Req* r);
  void InsertWaiting(Req* r);
  ScheduledSeq Emit(Req* r, int32_t n);
  // The cached prefix `r` can start from (nothing when caching is off or `r` has computed
  // tokens or uses penalties).
  PrefixHit LookupPrefix(const Req& r) const;
  void Admit(Req* r, const PrefixHit& hit, int64_t tokens);

  SchedulerConfig config_;
  KvBlockManager* kv_;
  std::map<uint64_t, Req> reqs_;
  std::vector<uint64_t> running_;   // arrival order
  std::deque<uint64_t> waiting_;    // arrival order
  std::vector<uint64_t> releases_;
  uint64_t next_arrival_ = 0;
  uint64_t next_step_ = 0;
  uint64_t prefix_query_tokens_ = 0, prefix_hit_tokens_ = 0;
};

}  // namespace dsv4
