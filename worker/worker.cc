#include "worker/worker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {

absl::Status Worker::Launch(const StepPlan& plan) {
  if (in_flight() >= kMaxInFlight) {
    return absl::FailedPreconditionError(
        absl::StrCat("Launch with ", in_flight(), " steps in flight (at most ", kMaxInFlight, ")"));
  }
  const bool deferred = std::any_of(plan.seqs.begin(), plan.seqs.end(),
                                    [](const ScheduledSeq& s) { return s.deferred_token; });
  StepPlan resolved;
  if (deferred) {
    resolved = plan;
    for (ScheduledSeq& s : resolved.seqs) {
      if (!s.deferred_token) continue;
      auto it = last_sampled_.find(s.request_id);
      if (it == last_sampled_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", s.request_id,
                         ": a deferred token, but the previous launched step did not sample it"));
      }
      if (s.tokens.size() != 1 || s.tokens[0] != kDeferredToken) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", s.request_id, ": a deferred token is one placeholder token"));
      }
      // A row that sampled nothing (non-finite logits) feeds token 0: the coordinator fails that
      // request when it collects the earlier step, and an id must stay in the vocabulary.
      s.tokens = {std::max(it->second, 0)};
      s.deferred_token = false;
    }
  }
  absl::StatusOr<StepResult> result = Execute(deferred ? resolved : plan);
  RETURN_IF_ERROR(result.status());
  last_sampled_.clear();
  for (const SampledToken& t : result->sampled) last_sampled_[t.request_id] = t.token;
  queued_.push_back(*std::move(result));
  return absl::OkStatus();
}

absl::Status Worker::Drain() {
  absl::Status first;
  // A failed Collect drops its step too, so this ends after as many calls as there are steps.
  for (int n = in_flight(); n > 0; --n) {
    absl::StatusOr<StepResult> r = Collect();
    if (!r.ok() && first.ok()) first = r.status();
  }
  return first;
}

absl::Status BringUp(Worker& worker, const WorkerConfig& config, const LoadProgressFn& progress) {
  if (absl::Status s = worker.Configure(config); !s.ok()) return Annotate(s, "configure");
  if (absl::Status s = worker.Load(progress); !s.ok()) return Annotate(s, "load");
  if (absl::Status s = worker.WarmUp(); !s.ok()) return Annotate(s, "warm-up");
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Worker::Collect() {
  if (queued_.empty()) return absl::FailedPreconditionError("Collect with no launched step");
  StepResult result = std::move(queued_.front());
  queued_.pop_front();
  return result;
}

}  // namespace dsv4
