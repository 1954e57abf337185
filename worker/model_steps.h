// The model's view of a plan, shared by the in-process workers (CPU and CUDA).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {

// The model steps of a plan (views into it): a sampled sequence returns its last logits. A
// sampled entry without a sampling spec is InvalidArgument.
absl::StatusOr<std::vector<SequenceStep>> ModelSteps(const StepPlan& plan);

}  // namespace dsv4
