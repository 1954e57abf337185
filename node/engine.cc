#include "node/engine.h"

#include <sys/random.h>

#include <cerrno>

#include <algorithm>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"

namespace dsv4 {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// The key of a request id in its owner's namespace.
std::string NameKey(const std::string& owner, const std::string& name) {
  return absl::StrCat(owner, "\x1f", name);
}

// "req-" and 128 random bits from the kernel's CSPRNG, so that nobody can guess another
// client's id.
std::string NewRequestId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      // No getrandom (pre-3.17 kernel): random_device reads /dev/urandom.
      std::random_device rd;
      for (size_t i = got; i < sizeof(bytes); ++i) bytes[i] = static_cast<unsigned char>(rd());
      got = sizeof(bytes);
    }
  }
  return absl::StrCat("req-", absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return v1::STOP;
    case FinishReason::kLength: return v1::LENGTH;
    case FinishReason::kCancelled: return v1::CANCELLED;
    case FinishReason::kError: return v1::ERROR;
    case FinishReason::kRepetition: return v1::REPETITION;
  }
  return v1::ERROR;
}

v1::Phase ToProto(Phase p) { return p == Phase::kReasoning ? v1::PHASE_REASONING : v1::PHASE_CONTENT; }
v1::Channel ToChannel(Phase p) {
  return p == Phase::kReasoning ? v1::CHANNEL_REASONING : v1::CHANNEL_CONTENT;
}

// The requests of a plan's entries (the ones a failed step fails).
std::vector<uint64_t> RequestIds(const StepPlan& plan) {
  std::vector<uint64_t> ids;
  for (const ScheduledSeq& s : plan.seqs) ids.push_back(s.request_id);
  return ids;
}

}  // namespace

absl::StatusOr<OverlapMode> ParseOverlapMode(std::string_view s) {
  if (s == "auto") return OverlapMode::kAuto;
  if (s == "on") return OverlapMode::kOn;
  if (s == "off") return OverlapMode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("overlap mode must be auto, on or off, got '", AV(s), "'"));
}

bool OverlapActive(OverlapMode mode, const WorkerInfo& info) {
  return info.max_in_flight >= 2 &&
         (mode == OverlapMode::kOn || (mode == OverlapMode::kAuto && info.overlap));
}

Engine::Engine(EngineConfig config, std::unique_ptr<Worker> worker, const Tokenizer* tokenizer,
               NodeMetrics* metrics)
    : config_(config),
      worker_(std::move(worker)),
      worker_info_(worker_->info()),
      tokenizer_(tokenizer),
      metrics_(metrics),
      kv_(worker_info_.num_blocks, worker_info_.num_slots, worker_info_.block_size,
          config.enable_prefix_caching ? worker_info_.num_state_snapshots : 0,
          config.prefix_cache_salt),
      scheduler_(config.scheduler, &kv_) {
  // (`on` with a worker that takes one step at a time, e.g. while it profiles ops: off, logged.)
  overlap_ = OverlapActive(config.overlap, worker_info_);
  if (config.overlap == OverlapMode::kOn && !overlap_) {
    LogWarning("overlap_steps_unavailable",
               {{"reason", "the worker runs one step at a time"},
                {"max_in_flight", static_cast<int64_t>(worker_info_.max_in_flight)}});
  }
  stats_.total_blocks = worker_info_.num_blocks;
  stats_.free_blocks = worker_info_.num_blocks;
  stats_.free_slots = worker_info_.num_slots;
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable() || stop_) return;
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<std::string> Engine::Submit(ValidatedRequest request,
                                           std::shared_ptr<RequestSink> sink) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || draining_) {
    if (metrics_) metrics_->Rejected("draining").Increment();
    return absl::UnavailableError("the node is draining and accepts no new requests");
  }
  // Waiting = in flight but not running (running is refreshed every step, so this errs towards
  // refusing slightly early, never late).
  if (stats_.in_flight - stats_.running >= config_.max_waiting) {
    if (metrics_) metrics_->Rejected("queue_full").Increment();
    return absl::ResourceExhaustedError(absl::StrCat("the request queue is full (",
                                                     config_.max_waiting, " waiting)"));
  }
  const uint64_t id = next_id_++;
  std::string name = request.request_id.empty() ? NewRequestId() : request.request_id;
  std::string key = NameKey(request.owner, name);
  if (names_.count(key) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("request_id: \"", name, "\" is already in flight"));
  }
  names_[key] = id;
  ++stats_.in_flight;
  inbox_.push_back(Pending{std::move(request), std::move(sink), name, std::move(key), Clock::now()});
  cv_.notify_one();
  return name;
}

bool Engine::Abort(const std::string& request_id, const std::string& reason,
                   const std::string& owner) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key = NameKey(owner, request_id);
  if (names_.count(key) == 0) return false;
  aborts_.emplace_back(std::move(key), reason);
  cv_.notify_one();
  return true;
}

void Engine::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Engine::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool Engine::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return stats_.in_flight == 0; });
}

void Engine::CancelAll(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, id] : names_) aborts_.emplace_back(key, reason);
  cv_.notify_one();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  // The loop drained the worker before it ended; its model and memory go now, once.
  std::call_once(worker_shutdown_, [this] { worker_->Shutdown(); });
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::Loop() {
  while (true) {
    std::deque<Pending> inbox;
    std::vector<std::pair<std::string, std::string>> aborts;
    bool stop;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool busy = !scheduler_.idle() || !in_flight_.empty();
      auto ready = [&] { return stop_ || busy || !inbox_.empty() || !aborts_.empty(); };
      if (reported_broken_) {
        cv_.wait_for(lock, config_.recover_interval, ready);  // and try to recover meanwhile
      } else {
        cv_.wait(lock, ready);
      }
      inbox.swap(inbox_);
      aborts.swap(aborts_);
      stop = stop_;
    }
    for (Pending& p : inbox) Admit(std::move(p));
    for (const auto& [name, reason] : aborts) {
      uint64_t id = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = names_.find(name);
        if (it == names_.end()) continue;
        id = it->second;
      }
      auto it = live_.find(id);
      if (it == live_.end()) continue;
      Live& r = it->second;
      const Phase phase = r.processor->phase();
      std::string tail = r.processor->Flush();
      Finish(&r, FinishReason::kCancelled, StopInfo{}, reason, std::move(tail), "", phase);
    }
    if (stop) {
      std::vector<uint64_t> ids;
      for (const auto& [id, r] : live_) ids.push_back(id);
      for (uint64_t id : ids) {
        Live& r = live_.at(id);
        const Phase phase = r.processor->phase();
        Finish(&r, FinishReason::kCancelled, StopInfo{}, "the node stopped", r.processor->Flush(),
               "", phase);
      }
      DrainInFlight();
      PublishStats();
      return;
    }
    if (reported_broken_) TendBrokenWorker();
    const bool progressed = (!scheduler_.idle() || !in_flight_.empty()) && RunStep();
    PublishStats();
    if (!progressed && !scheduler_.idle()) {
      // Nothing fits right now (should not persist: admission checks the KV capacity); wait
      // for new work instead of spinning.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(1),
                   [&] { return stop_ || !inbox_.empty() || !aborts_.empty(); });
    }
  }
}

void Engine::Admit(Pending p) {
  Live r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.id = names_.at(p.key);
  }
  r.name = p.name;
  r.key = p.key;
  r.sink = std::move(p.sink);
  r.prompt_tokens = static_cast<int32_t>(p.request.prompt.size());
  r.logprobs = p.request.sampling->logprobs;
  r.arrival = p.arrival;
  r.processor = std::make_unique<OutputProcessor>(tokenizer_, p.request.output);
  r.metrics = p.request.internal ? nullptr : metrics_;
  if (r.metrics) {
    metrics_->prompt_tokens->Increment(r.prompt_tokens);
    metrics_->request_prompt_tokens->Observe(r.prompt_tokens);
  }
  SchedRequest s;
  s.id = r.id;
  s.prompt = std::move(p.request.prompt);
  s.sampling = std::move(p.request.sampling);
  scheduler_.Add(std::move(s));
  live_.emplace(r.id, std::move(r));
}

bool Engine::RunStep() {
  if (in_flight_.empty()) {
    const auto t0 = Clock::now();
    std::vector<uint64_t> preempted;
    StepPlan plan = scheduler_.Schedule(&preempted);
    preemptions_ += preempted.size();
    if (metrics_ && !preempted.empty()) {
      metrics_->preemptions->Increment(static_cast<double>(preempted.size()));
    }
    if (plan.seqs.empty() && plan.released.empty()) return false;
    if (!LaunchStep(std::move(plan), t0)) return true;
  }
  // Overlap: the next decode step goes out before this one's results come back; its requests'
  // inputs are the tokens this step samples. A request whose pending token is its last by length
  // stays out of it (one that stops otherwise runs one wasted row, whose result is dropped).
  if (overlap_ && static_cast<int>(in_flight_.size()) < worker_info_.max_in_flight) {
    const auto t0 = Clock::now();
    std::optional<StepPlan> ahead = scheduler_.ScheduleAhead([&](uint64_t id) {
      const Live& r = live_.at(id);
      return r.processor->completion_tokens() + 1 < r.processor->max_tokens();
    });
    if (ahead.has_value() && LaunchStep(*std::move(ahead), t0)) {
      ++overlapped_steps_;
      if (metrics_) metrics_->overlapped_steps->Increment();
    }
  }
  CollectStep();
  return true;
}

bool Engine::LaunchStep(StepPlan plan, Clock::time_point t0) {
  plan.force_indexer_scoring = config_.force_indexer_scoring;
  const GraphChoice graph = ChooseGraph(plan, config_.graphs, worker_info_.cuda_graphs);
  plan.graph_mode = graph.mode;
  plan.padded_tokens = graph.padded_tokens;
  for (const ScheduledSeq& s : plan.seqs) {
    Live& r = live_.at(s.request_id);
    if (!r.scheduled) {
      r.scheduled = true;
      r.first_scheduled = t0;
      if (r.metrics) r.metrics->queue_time->Observe(Seconds(t0 - r.arrival));
    }
  }
  const absl::Status launched = worker_->Launch(plan);
  if (!launched.ok()) {
    WorkerFailed(plan.step_id, launched);
    // The worker did not take the plan's releases: they go with a later one.
    scheduler_.RestoreReleases(std::move(plan.released));
    FailAll(RequestIds(plan), launched);
    return false;
  }
  // The step's tokens count as cached from now on; what it samples is pending until collected.
  scheduler_.Commit(plan);
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.sample) scheduler_.AppendPending(s.request_id);
  }
  in_flight_.push_back(InFlight{std::move(plan), graph, t0});
  return true;
}

void Engine::CollectStep() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const StepPlan& plan = f.plan;
  auto result = worker_->Collect();
  if (!result.ok()) {
    WorkerFailed(plan.step_id, result.status());
    // A later launched step fed on this one's tokens: it fails with it.
    std::vector<uint64_t> ids = RequestIds(plan);
    for (const InFlight& later : in_flight_) {
      const std::vector<uint64_t> more = RequestIds(later.plan);
      ids.insert(ids.end(), more.begin(), more.end());
    }
    DrainInFlight();
    FailAll(ids, result.status());
    return;
  }
  if (result->graph.capture_failures > 0) {
    LogError("graph_capture_failed", {{"step", static_cast<int64_t>(plan.step_id)},
                                      {"mode", std::string(GraphModeName(plan.graph_mode))},
                                      {"padded_tokens", static_cast<int64_t>(plan.padded_tokens)}});
  }
  if (metrics_) {
    RecordRanks(*result);
    RecordGraphRun(f.graph, result->graph);
  }
  const auto now = Clock::now();
  std::vector<uint64_t> broken;  // rows whose logits were not finite
  for (const SampledToken& t : result->sampled) {
    // Requests that finished or were aborted since the launch: their rows are dropped.
    auto it = live_.find(t.request_id);
    if (it == live_.end()) continue;
    Live& r = it->second;
    if (t.nonfinite || t.token < 0) {
      LogError("nonfinite_logits", {{"step", static_cast<int64_t>(plan.step_id)},
                                    {"request_id", r.name},
                                    {"token", static_cast<int64_t>(t.token)}});
      broken.push_back(t.request_id);
      continue;
    }
    const TokenOutcome out = r.processor->OnToken(t.token);
    if (NodeMetrics* m = r.metrics) {
      m->generation_tokens->Increment();
      if (out.channel == Phase::kReasoning) m->reasoning_tokens->Increment();
      if (out.repetition_detected_now) m->repetition_detected->Increment();
      if (r.has_token) {
        m->itl->Observe(Seconds(now - r.last_token));
      } else {
        m->ttft->Observe(Seconds(now - r.arrival));
      }
    }
    if (!r.has_token) r.first_token = now;
    r.has_token = true;
    r.last_token = now;
    r.repetition |= out.repetition_detected_now;
    v1::GenerateResponse resp;
    resp.set_request_id(r.name);
    v1::Chunk* chunk = resp.mutable_chunk();
    chunk->add_token_ids(t.token);
    chunk->set_text(out.text);
    chunk->set_channel(ToChannel(out.channel));
    if (r.logprobs > 0) {
      v1::TokenLogprob* lp = chunk->add_logprobs();
      lp->set_token_id(t.token);
      lp->set_logprob(t.logprob);
      for (const auto& [id, logprob] : t.top) {
        v1::TopLogprob* top = lp->add_top();
        top->set_token_id(id);
        top->set_logprob(logprob);
      }
    }
    r.sink->Emit(std::move(resp), /*last=*/false);
    if (out.finished) {
      Finish(&r, out.reason, out.stop, "", "", out.discarded_text, out.channel);
    } else {
      scheduler_.AppendToken(r.id, t.token);
    }
  }
  if (!broken.empty()) {
    // The model produced NaN or Inf: the token is meaningless. A worker error, not a finish.
    if (metrics_) metrics_->worker_errors->Increment(static_cast<double>(broken.size()));
    FailAll(broken, absl::InternalError(
                        "the model produced non-finite logits (NaN or Inf) for this request; the "
                        "node's weights or its worker are broken (see the node's log)"));
  }
  if (metrics_) {
    // Labelled by what ran: a planned graph the worker could not run counts as eager. An
    // overlapped step is timed from the previous step's results (it was planned during it).
    const auto from = std::max(f.t0, last_collect_);
    metrics_->StepDuration(GraphModeName(result->graph.mode)).Observe(Seconds(Clock::now() - from));
    metrics_->step_batch_tokens->Observe(static_cast<double>(plan.num_tokens()));
  }
  last_collect_ = Clock::now();
}

void Engine::WorkerFailed(uint64_t step, const absl::Status& status) {
  LogError("worker_step_failed",
           {{"step", static_cast<int64_t>(step)}, {"error", std::string(status.message())}});
  if (metrics_) {
    metrics_->worker_errors->Increment();
    PublishRanksUp(/*failed=*/true);
  }
  TendBrokenWorker();
}

void Engine::PublishRanksUp(bool failed) {
  const std::vector<bool> up = worker_->ranks_up();
  for (size_t r = 0; r < up.size(); ++r) {
    metrics_->WorkerUp(static_cast<int>(r)).Set(!failed && up[r] ? 1 : 0);
  }
}

void Engine::RecordRanks(const StepResult& result) {
  PublishRanksUp(/*failed=*/false);
  if (result.rank_seconds.empty()) {
    metrics_->WorkerStepSeconds(0).Observe(result.execute_seconds);
    metrics_->WorkerCollectiveSeconds(0).Observe(result.collective_seconds);
    return;
  }
  for (size_t r = 0; r < result.rank_seconds.size(); ++r) {
    metrics_->WorkerStepSeconds(static_cast<int>(r)).Observe(result.rank_seconds[r]);
    if (r < result.rank_collective_seconds.size()) {
      metrics_->WorkerCollectiveSeconds(static_cast<int>(r)).Observe(result.rank_collective_seconds[r]);
    }
  }
  metrics_->control_round_trip->Observe(result.control_seconds);
}

void Engine::TendBrokenWorker() {
  if (!worker_->broken()) return;
  if (!reported_broken_) {
    reported_broken_ = true;
    next_recover_ = Clock::now();
    if (config_.on_worker_health) {
      config_.on_worker_health(false, absl::UnavailableError("a worker rank was lost"));
    }
    return;
  }
  // Recovery reloads the model: only between steps, with nothing in flight.
  if (!in_flight_.empty() || Clock::now() < next_recover_) return;
  next_recover_ = Clock::now() + config_.recover_interval;
  const absl::Status s = worker_->Recover();
  if (!s.ok()) {
    LogWarning("worker_recover_failed", {{"error", std::string(s.message())}});
    return;
  }
  reported_broken_ = false;
  LogInfo("worker_recovered", {});
  if (metrics_) PublishRanksUp(/*failed=*/false);
  if (config_.on_worker_health) config_.on_worker_health(true, absl::OkStatus());
}

void Engine::DrainInFlight() {
  if (in_flight_.empty()) return;  // the worker holds no step the engine did not launch
  const uint64_t first = in_flight_.front().plan.step_id;
  const uint64_t last = in_flight_.back().plan.step_id;
  in_flight_.clear();
  if (absl::Status s = worker_->Drain(); !s.ok()) {
    // Which of the steps failed the worker does not say: the range is logged.
    LogError("worker_step_failed", {{"step", static_cast<int64_t>(first)},
                                    {"last_step", static_cast<int64_t>(last)},
                                    {"error", std::string(s.message())}});
  }
}

void Engine::RecordGraphRun(const GraphChoice& planned, const GraphRun& ran) {
  if (ran.replays > 0) {
    if (ran.mode == GraphMode::kFull) metrics_->graph_replays_full->Increment(ran.replays);
    if (ran.mode == GraphMode::kPiecewise) {
      metrics_->graph_replays_piecewise->Increment(ran.replays);
    }
  }
  // Once per step: the coordinator found no capture size for it, or the worker could not run the
  // graph it was given.
  if (planned.fallback || ran.fallback) metrics_->graph_eager_fallbacks->Increment();
  if (ran.capture_failures > 0) metrics_->graph_capture_failures->Increment(ran.capture_failures);
  // The worker reports a step's total capture time; each capture is observed at the step's mean.
  if (ran.captures > 0) {
    const double each = ran.capture_seconds / ran.captures;
    for (int32_t i = 0; i < ran.captures; ++i) metrics_->graph_capture_seconds->Observe(each);
  }
}

void Engine::Finish(Live* r, FinishReason reason, const StopInfo& stop, const std::string& message,
                    std::string tail_text, std::string discarded, Phase tail_channel) {
  const auto now = Clock::now();
  if (!tail_text.empty()) {
    v1::GenerateResponse chunk;
    chunk.set_request_id(r->name);
    chunk.mutable_chunk()->set_text(tail_text);
    chunk.mutable_chunk()->set_channel(ToChannel(tail_channel));
    r->sink->Emit(std::move(chunk), false);
  }
  const Phase phase = r->processor->phase();
  v1::GenerateResponse resp;
  resp.set_request_id(r->name);
  v1::Finished* f = resp.mutable_finished();
  f->set_finish_reason(ToProto(reason));
  f->set_phase_at_finish(ToProto(phase));
  switch (stop.kind) {
    case StopInfo::Kind::kEos: f->mutable_stop_match()->set_eos_token_id(stop.token); break;
    case StopInfo::Kind::kStopToken: f->mutable_stop_match()->set_stop_token_id(stop.token); break;
    case StopInfo::Kind::kStopString: f->mutable_stop_match()->set_stop_string(stop.text); break;
    case StopInfo::Kind::kNone: break;
  }
  v1::Usage* u = f->mutable_usage();
  u->set_prompt_tokens(r->prompt_tokens);
  u->set_completion_tokens(r->processor->completion_tokens());
  u->set_reasoning_tokens(r->processor->reasoning_tokens());
  u->set_cached_prompt_tokens(scheduler_.CachedTokens(r->id));
  v1::Timings* tm = f->mutable_timings();
  tm->set_queue_seconds(r->scheduled ? Seconds(r->first_scheduled - r->arrival) : Seconds(now - r->arrival));
  tm->set_time_to_first_token_seconds(r->has_token ? Seconds(r->first_token - r->arrival) : 0);
  tm->set_e2e_seconds(Seconds(now - r->arrival));
  tm->set_preemptions(scheduler_.Preemptions(r->id));
  f->set_message(message);
  f->set_repetition_detected(r->repetition);
  f->set_discarded_text(discarded);
  if (NodeMetrics* m = r->metrics) {
    m->Finished(reason, phase).Increment();
    const bool runaway = reason == FinishReason::kLength &&
                         (phase == Phase::kReasoning || r->processor->content_text_bytes() == 0);
    if (runaway) m->runaways->Increment();
    m->e2e->Observe(Seconds(now - r->arrival));
    m->request_reasoning_tokens->Observe(r->processor->reasoning_tokens());
    m->request_content_tokens->Observe(r->processor->content_tokens());
  }
  if (r->metrics != nullptr) {
    LogInfo("request_finished",
            {{"request_id", r->name},
             {"finish_reason", FinishReasonName(reason)},
             {"phase", PhaseName(phase)},
             {"prompt_tokens", r->prompt_tokens},
             {"completion_tokens", r->processor->completion_tokens()},
             {"reasoning_tokens", r->processor->reasoning_tokens()},
             {"ttft_s", tm->time_to_first_token_seconds()},
             {"e2e_s", tm->e2e_seconds()},
             {"preemptions", tm->preemptions()}});
  }
  r->sink->Emit(std::move(resp), /*last=*/true);
  scheduler_.Remove(r->id);
  const std::string key = r->key;
  live_.erase(r->id);
  std::lock_guard<std::mutex> lock(mu_);
  names_.erase(key);
  --stats_.in_flight;
  RefreshCounts();
  idle_cv_.notify_all();
}

void Engine::FailAll(const std::vector<uint64_t>& ids, const absl::Status& status) {
  for (uint64_t id : ids) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    Live& r = it->second;
    v1::GenerateResponse resp;
    resp.set_request_id(r.name);
    resp.mutable_error()->set_code(static_cast<int>(status.code()));
    resp.mutable_error()->set_message(std::string(status.message()));
    if (r.metrics) r.metrics->Finished(FinishReason::kError, r.processor->phase()).Increment();
    r.sink->Emit(std::move(resp), /*last=*/true);
    scheduler_.Remove(id);
    const std::string key = r.key;
    live_.erase(it);
    std::lock_guard<std::mutex> lock(mu_);
    names_.erase(key);
    --stats_.in_flight;
    RefreshCounts();
    idle_cv_.notify_all();
  }
}

// The scheduler's and the KV manager's counts; called with mu_ held after every step and whenever
// a request retires, so that admission control and readers of stats() (drains, tests) see the
// state a retired request left, not the last step's.
void Engine::RefreshCounts() {
  stats_.running = static_cast<int32_t>(scheduler_.num_running());
  stats_.waiting = static_cast<int32_t>(scheduler_.num_waiting());
  stats_.free_blocks = kv_.free_blocks();
  stats_.free_slots = kv_.free_slots();
  stats_.kv_usage = kv_.usage();
  stats_.prefix_cache_blocks = kv_.cached_blocks();
}

void Engine::PublishStats() {
  std::lock_guard<std::mutex> lock(mu_);
  RefreshCounts();
  stats_.preemptions = preemptions_;
  stats_.overlapped_steps = overlapped_steps_;
  ++stats_.steps;
  if (metrics_) {
    metrics_->running->Set(stats_.running);
    metrics_->waiting->Set(stats_.waiting + static_cast<double>(inbox_.size()));
    metrics_->kv_usage->Set(stats_.kv_usage);
    metrics_->prefix_cache_blocks->Set(stats_.prefix_cache_blocks);
    // Counters follow the scheduler's and the block manager's running totals.
    auto follow = [](prometheus::Counter* c, uint64_t total, uint64_t* seen) {
      if (total > *seen) c->Increment(static_cast<double>(total - *seen));
      *seen = total;
    };
    follow(metrics_->prefix_cache_queries, scheduler_.prefix_query_tokens(),
           &stats_.prefix_cache_query_tokens);
    follow(metrics_->prefix_cache_hits, scheduler_.prefix_hit_tokens(),
           &stats_.prefix_cache_hit_tokens);
    follow(metrics_->prefix_cache_evictions, kv_.evictions(), &stats_.prefix_cache_evictions);
  } else {
    stats_.prefix_cache_query_tokens = scheduler_.prefix_query_tokens();
    stats_.prefix_cache_hit_tokens = scheduler_.prefix_hit_tokens();
    stats_.prefix_cache_evictions = kv_.evictions();
  }
}

}  // namespace dsv4
