// The control plane's messages (proto/dsv4/internal/v1/worker.proto) to and from the plain structs
// both sides use: StepPlan / StepResult (common/step_plan.h), the sampling parameters, the cache
// layout. Model-free: the coordinator and the workers link it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/statusor.h"
#include "common/cache_config.h"
#include "common/step_plan.h"
#include "dsv4/internal/v1/worker.pb.h"
#include "worker/worker.h"

namespace dsv4::control {

namespace pb = ::dsv4::internal::v1;

void ToProto(const SamplingSpec& s, pb::Sampling* out);
SamplingSpec FromProto(const pb::Sampling& s);

void ToProto(const CacheConfig& c, pb::CacheLayout* out);
CacheConfig FromProto(const pb::CacheLayout& c);

// The worker configuration every rank shares (Configure without the rank's own fields: rank,
// world size, rendezvous, data plane). `config_json` is the model's config.json text.
void ToProto(const WorkerConfig& wc, const std::string& config_json, pb::Configure* out);
// The configuration a Configure message describes: the config text parsed (errors name its
// field), the layout from its rank and world size; no communicator yet.
absl::StatusOr<WorkerConfig> FromProto(const pb::Configure& c);

// The plan without per-request data: the caller adds Step.requests for requests the ranks have
// not seen (SamplingSpecs travel once).
void ToProto(const StepPlan& plan, pb::Step* out);
// The plan with each sequence's sampling spec from `known` (request id -> spec, which this call
// extends with `step.requests` and trims by `step.released` after decoding). A sampling sequence
// of an unknown request, a bad graph mode or a negative field is InvalidArgument naming it.
absl::StatusOr<StepPlan> FromProto(const pb::Step& step,
                                   std::map<uint64_t, std::shared_ptr<const SamplingSpec>>* known);

void ToProto(const StepResult& r, bool with_tokens, pb::StepDone* out);
// InvalidArgument when its arrays disagree (a rank's bug or garbage on the stream).
absl::StatusOr<StepResult> FromProto(const pb::StepDone& d);

}  // namespace dsv4::control
