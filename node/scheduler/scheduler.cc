#include "node/scheduler/scheduler.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace dsv4 {

Scheduler::Scheduler(SchedulerConfig config, KvBlockManager* kv) : config_(config), kv_(kv) {
  config_.max_num_seqs = std::min(config_.max_num_seqs, kv_->num_slots());
}

void Scheduler::Add(SchedRequest request) {
  const uint64_t id = request.id;
  Req& r = reqs_[id];
  r.r = std::move(request);
  r.arrival = next_arrival_++;
  waiting_.push_back(id);
}

void Scheduler::InsertWaiting(Req* r) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](uint64_t id) { return reqs_.at(id).arrival > r->arrival; });
  waiting_.insert(it, r->r.id);
}

void Scheduler::Preempt(Req* r) {
  kv_->Release(&r->kv);
  r->computed = 0;
  r->restore_row = -1;
  r->running = false;
  ++r->preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), r->r.id));
  InsertWaiting(r);
  releases_.push_back(r->r.id);
}

ScheduledSeq Scheduler::Emit(Req* r, int32_t n) {
  ScheduledSeq s;
  s.restore_from = std::exchange(r->restore_row, -1);
  // A snapshot at every block boundary the chunk reaches (the state there, for later hits).
  const int32_t bs = kv_->block_size();
  for (int64_t b = (r->computed / bs + 1) * bs; kv_->caching() && b <= r->computed + n; b += bs) {
    const int32_t row = kv_->SnapshotRow(&r->kv, static_cast<int32_t>(b / bs - 1));
    if (row < 0) break;
    s.snapshots.push_back({static_cast<int32_t>(b), row});
  }
  s.request_id = r->r.id;
  s.tokens.reserve(n);
  for (int32_t i = 0; i < n; ++i) s.tokens.push_back(r->Token(r->computed + i));
  s.start_pos = r->computed;
  s.state_slot = r->kv.slot;
  s.block_table = r->kv.blocks;
  s.sample = r->computed + n == r->known();
  s.prompt_len = static_cast<int32_t>(r->r.prompt.size());
  s.output_index = static_cast<int32_t>(r->output.size());
  s.sampling = r->r.sampling;
  // Only a decode token can be pending (prefill chunks never reach an unknown output).
  s.deferred_token = r->pending > 0 && n == 1 && r->computed == r->known() - r->pending;
  return s;
}

StepPlan Scheduler::Schedule(std::vector<uint64_t>* preempted) {
  StepPlan plan;
  plan.step_id = next_step_++;
  int64_t budget = config_.max_batched_tokens;
  auto is_scheduled = [&](uint64_t id) { return reqs_.at(id).scheduled_step == plan.step_id; };
  auto add = [&](Req& r, int32_t n) {
    plan.seqs.push_back(Emit(&r, n));
    r.scheduled_step = plan.step_id;
    budget -= n;
  };
  const int64_t chunk_cap =
      config_.max_prefill_chunk > 0 ? config_.max_prefill_chunk : config_.max_batched_tokens;

  // Grows r's KV to `tokens`, preempting the newest running requests not yet in this step when
  // blocks run out; the oldest request always wins, so the system makes progress. False when r
  // itself had to be preempted.
  auto reserve = [&](Req& r, int64_t tokens) {
    while (!kv_->Reserve(&r.kv, tokens)) {
      uint64_t victim = r.r.id;
      for (auto v = running_.rbegin(); v != running_.rend(); ++v) {
        if (*v != r.r.id && !is_scheduled(*v) && reqs_.at(*v).arrival > r.arrival) {
          victim = *v;
          break;
        }
      }
      Preempt(&reqs_.at(victim));
      if (preempted != nullptr) preempted->push_back(victim);
      if (victim == r.r.id) return false;
    }
    return true;
  };

  // 1. Decodes, oldest first.
  plan.seqs.reserve(running_.size() + waiting_.size());
  const std::vector<uint64_t> order = running_;
  for (uint64_t id : order) {
    if (budget < 1) break;
    auto it = reqs_.find(id);
    if (it == reqs_.end() || !it->second.running) continue;  // preempted above
    Req& r = it->second;
    if (r.known() - r.computed != 1) continue;
    if (!reserve(r, r.computed + 1)) continue;
    add(r, 1);
  }

  // 2. Chunked prefills already running.
  for (uint64_t id : std::vector<uint64_t>(running_)) {
    if (budget < 1) break;
    auto it = reqs_.find(id);
    if (it == reqs_.end() || !it->second.running || is_scheduled(id)) continue;
    Req& r = it->second;
    const int64_t remaining = r.known() - r.computed;
    if (remaining <= 1) continue;
    const int32_t n = static_cast<int32_t>(std::min({remaining, budget, chunk_cap}));
    if (!reserve(r, r.computed + n)) continue;
    add(r, n);
  }

  // 3. Admit waiting requests in arrival order.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Req& r = reqs_.at(waiting_.front());
    const PrefixHit hit = LookupPrefix(r);
    const int64_t start = hit.tokens(kv_->block_size());
    const int64_t remaining = r.known() - start;
    const int32_t n = static_cast<int32_t>(std::min({remaining, budget, chunk_cap}));
    if (!kv_->CanAdmit(start + n, hit)) break;
    Admit(&r, hit, start + n);
    waiting_.pop_front();
    r.running = true;
    auto pos = std::find_if(running_.begin(), running_.end(),
                            [&](uint64_t id) { return reqs_.at(id).arrival > r.arrival; });
    running_.insert(pos, r.r.id);
    add(r, n);
  }
  plan.released = std::move(releases_);
  releases_.clear();
  return plan;
}

PrefixHit Scheduler::LookupPrefix(const Req& r) const {
  if (!kv_->caching() || r.computed != 0) return {};
  if (const SamplingSpec* p = r.r.sampling.get(); p != nullptr && UsesPenalties(*p)) return {};
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(r.known()));
  for (int64_t i = 0; i < r.known(); ++i) tokens.push_back(r.Token(i));
  return kv_->Lookup(tokens);
}

void Scheduler::Admit(Req* r, const PrefixHit& hit, int64_t tokens) {
  kv_->AcquireSlot(&r->kv);
  kv_->Share(&r->kv, hit);
  kv_->Reserve(&r->kv, tokens);
  r->computed = static_cast<int32_t>(hit.tokens(kv_->block_size()));
  r->restore_row = hit.restore_row;
  if (kv_->caching()) {
    prefix_query_tokens_ += static_cast<uint64_t>(r->known());
    prefix_hit_tokens_ += static_cast<uint64_t>(r->computed);
  }
  if (r->cached_tokens < 0) r->cached_tokens = r->computed;
}

void Scheduler::Commit(const StepPlan& plan) {
  for (const ScheduledSeq& s : plan.seqs) {
    auto it = reqs_.find(s.request_id);
    if (it == reqs_.end() || !it->second.running) continue;
    Req& r = it->second;
    r.computed = s.start_pos + static_cast<int32_t>(s.tokens.size());
    kv_->Commit(&r.kv, r.computed, [&r](int64_t i) { return r.Token(i); });
  }
}

void Scheduler::AppendToken(uint64_t id, int32_t token) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  Req& r = it->second;
  if (r.pending > 0) {
    r.output[r.output.size() - r.pending] = token;
    --r.pending;
  } else {
    r.output.push_back(token);
  }
}

void Scheduler::AppendPending(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  it->second.output.push_back(kDeferredToken);
  ++it->second.pending;
}

std::optional<StepPlan> Scheduler::ScheduleAhead(const std::function<bool(uint64_t)>& include) {
  // A waiting request the next step could admit takes precedence (it needs a synchronous step);
  // with every running slot taken, or no state slot free, none could.
  if (!waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_num_seqs &&
      kv_->free_slots() > 0) {
    return std::nullopt;
  }
  std::vector<Req*> decodes;
  int64_t new_blocks = 0;
  for (uint64_t id : running_) {
    Req& r = reqs_.at(id);
    // The pending token is the only one not yet cached: it is the next decode input.
    if (r.pending == 0 || r.known() - r.computed != 1) return std::nullopt;
    if (!include(id)) continue;
    decodes.push_back(&r);
    new_blocks += std::max<int64_t>(
        0, kv_->BlocksFor(r.computed + 1) - static_cast<int64_t>(r.kv.blocks.size()));
  }
  if (decodes.empty() || new_blocks > kv_->free_blocks() ||
      static_cast<int64_t>(decodes.size()) > config_.max_batched_tokens) {
    return std::nullopt;
  }
  StepPlan plan;
  plan.step_id = next_step_++;
  plan.seqs.reserve(decodes.size());
  for (Req* r : decodes) {
    kv_->Reserve(&r->kv, r->computed + 1);  // fits: counted above
    plan.seqs.push_back(Emit(r, 1));
    r->scheduled_step = plan.step_id;
  }
  plan.released = std::move(releases_);
  releases_.clear();
  return plan;
}

void Scheduler::RestoreReleases(std::vector<uint64_t> ids) {
  releases_.insert(releases_.end(), ids.begin(), ids.end());
}

bool Scheduler::Remove(uint64_t id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return false;
  Req& r = it->second;
  kv_->Release(&r.kv);
  if (r.running) {
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  releases_.push_back(id);
  reqs_.erase(it);
  return true;
}

const std::vector<int32_t>* Scheduler::Output(uint64_t id) const {
  auto it = reqs_.find(id);
  return it == reqs_.end() ? nullptr : &it->second.output;
}

int32_t Scheduler::CachedTokens(uint64_t id) const {
  auto it = reqs_.find(id);
  return it == reqs_.end() ? 0 : std::max(it->second.cached_tokens, 0);
}

int32_t Scheduler::Preemptions(uint64_t id) const {
  auto it = reqs_.find(id);
  return it == reqs_.end() ? 0 : it->second.preemptions;
}

}  // namespace dsv4
