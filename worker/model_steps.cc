#include "worker/model_steps.h"

#include "absl/strings/str_cat.h"

namespace dsv4 {

absl::StatusOr<std::vector<SequenceStep>> ModelSteps(const StepPlan& plan) {
  std::vector<SequenceStep> steps;
  steps.reserve(plan.seqs.size());
  for (const ScheduledSeq& s : plan.seqs) {
    if (s.sample && s.sampling == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("request ", s.request_id, " has no sampling spec"));
    }
    SequenceStep step;
    step.tokens = s.tokens;
    step.start_pos = s.start_pos;
    step.state_slot = s.state_slot;
    step.block_table = s.block_table;
    step.logits = s.sample ? SequenceStep::Logits::kLast : SequenceStep::Logits::kNone;
    step.deferred_token = s.deferred_token;
    step.restore_from = s.restore_from;
    step.snapshots = s.snapshots;
    steps.push_back(step);
  }
  return steps;
}

}  // namespace dsv4
