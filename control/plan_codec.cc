#include "control/plan_codec.h"

#include "absl/strings/str_cat.h"

namespace dsv4::control {

void ToProto(const SamplingSpec& s, pb::Sampling* out) {
  out->set_temperature(s.temperature);
  out->set_top_k(s.top_k);
  out->set_top_p(s.top_p);
  out->set_min_p(s.min_p);
  out->set_seed(s.seed);
  out->set_repetition_penalty(s.repetition_penalty);
  out->set_presence_penalty(s.presence_penalty);
  out->set_frequency_penalty(s.frequency_penalty);
  out->set_min_tokens(s.min_tokens);
  for (int32_t id : s.min_tokens_mask) out->add_min_tokens_mask(id);
  out->set_logprobs(s.logprobs);
}

SamplingSpec FromProto(const pb::Sampling& s) {
  SamplingSpec out;
  out.temperature = s.temperature();
  out.top_k = s.top_k();
  out.top_p = s.top_p();
  out.min_p = s.min_p();
  out.seed = s.seed();
  out.repetition_penalty = s.repetition_penalty();
  out.presence_penalty = s.presence_penalty();
  out.frequency_penalty = s.frequency_penalty();
  out.min_tokens = s.min_tokens();
  out.min_tokens_mask.assign(s.min_tokens_mask().begin(), s.min_tokens_mask().end());
  out.logprobs = s.logprobs();
  return out;
}

void ToProto(const CacheConfig& c, pb::CacheLayout* out) {
  out->set_block_size(c.block_size);
  out->set_num_blocks(c.num_blocks);
  out->set_num_slots(c.num_slots);
  out->set_max_model_len(c.max_model_len);
  out->set_max_step_tokens(c.max_step_tokens);
  out->set_max_graph_tokens(c.max_graph_tokens);
}

CacheConfig FromProto(const pb::CacheLayout& c) {
  CacheConfig out;
  out.block_size = c.block_size();
  out.num_blocks = c.num_blocks();
  out.num_slots = c.num_slots();
  out.max_model_len = c.max_model_len();
  out.max_step_tokens = c.max_step_tokens();
  out.max_graph_tokens = c.max_graph_tokens();
  return out;
}

void ToProto(const StepPlan& plan, pb::Step* out) {
  out->set_step_id(plan.step_id);
  for (const ScheduledSeq& s : plan.seqs) {
    pb::ScheduledSeq* q = out->add_seqs();
    q->set_request_id(s.request_id);
    q->mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    q->set_start_pos(s.start_pos);
    q->set_state_slot(s.state_slot);
    q->mutable_block_table()->Add(s.block_table.begin(), s.block_table.end());
    q->set_sample(s.sample);
    q->set_prompt_len(s.prompt_len);
    q->set_output_index(s.output_index);
    q->set_deferred_token(s.deferred_token);
  }
  out->mutable_released()->Add(plan.released.begin(), plan.released.end());
  out->set_graph_mode(static_cast<int32_t>(plan.graph_mode));
  out->set_padded_tokens(plan.padded_tokens);
  out->set_force_indexer_scoring(plan.force_indexer_scoring);
}

absl::StatusOr<StepPlan> FromProto(const pb::Step& step,
                                   std::map<uint64_t, std::shared_ptr<const SamplingSpec>>* known) {
  for (const pb::RequestSpec& r : step.requests()) {
    (*known)[r.request_id()] = std::make_shared<const SamplingSpec>(FromProto(r.sampling()));
  }
  StepPlan plan;
  plan.step_id = step.step_id();
  if (step.graph_mode() < 0 || step.graph_mode() > static_cast<int32_t>(GraphMode::kFull)) {
    return absl::InvalidArgumentError(absl::StrCat("Step.graph_mode ", step.graph_mode(),
                                                   " is not 0 (eager), 1 (piecewise) or 2 (full)"));
  }
  if (step.padded_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Step.padded_tokens ", step.padded_tokens(), " < 0"));
  }
  plan.graph_mode = static_cast<GraphMode>(step.graph_mode());
  plan.padded_tokens = step.padded_tokens();
  plan.force_indexer_scoring = step.force_indexer_scoring();
  plan.seqs.reserve(step.seqs_size());
  for (int i = 0; i < step.seqs_size(); ++i) {
    const pb::ScheduledSeq& q = step.seqs(i);
    ScheduledSeq s;
    s.request_id = q.request_id();
    s.tokens.assign(q.tokens().begin(), q.tokens().end());
    s.start_pos = q.start_pos();
    s.state_slot = q.state_slot();
    s.block_table.assign(q.block_table().begin(), q.block_table().end());
    s.sample = q.sample();
    s.prompt_len = q.prompt_len();
    s.output_index = q.output_index();
    s.deferred_token = q.deferred_token();
    if (s.start_pos < 0 || s.prompt_len < 0 || s.output_index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Step.seqs[", i, "]: a negative position"));
    }
    if (s.sample) {
      auto it = known->find(s.request_id);
      if (it == known->end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Step.seqs[", i, "]: request ", s.request_id, " samples but its sampling parameters "
            "never arrived (Step.requests)"));
      }
      s.sampling = it->second;
    }
    plan.seqs.push_back(std::move(s));
  }
  plan.released.assign(step.released().begin(), step.released().end());
  for (uint64_t id : plan.released) known->erase(id);
  return plan;
}

void ToProto(const StepResult& r, bool with_tokens, pb::StepDone* out) {
  out->set_step_id(r.step_id);
  out->set_execute_seconds(r.execute_seconds);
  out->set_device_seconds(r.device_seconds);
  out->set_graph_mode(static_cast<int32_t>(r.graph.mode));
  out->set_graph_fallback(r.graph.fallback);
  out->set_collective_seconds(r.collective_seconds);
  if (!with_tokens) return;
  for (const SampledToken& t : r.sampled) {
    pb::SampledToken* p = out->add_sampled();
    p->set_request_id(t.request_id);
    p->set_token(t.token);
    p->set_logprob(t.logprob);
    p->set_nonfinite(t.nonfinite);
    for (const auto& [id, lp] : t.top) {
      pb::TopLogprob* top = p->add_top();
      top->set_token(id);
      top->set_logprob(lp);
    }
  }
}

StepResult FromProto(const pb::StepDone& d) {
  StepResult r;
  r.step_id = d.step_id();
  r.execute_seconds = d.execute_seconds();
  r.device_seconds = d.device_seconds();
  const int32_t mode = d.graph_mode();
  r.graph.mode = mode >= 0 && mode <= 2 ? static_cast<GraphMode>(mode) : GraphMode::kEager;
  r.graph.fallback = d.graph_fallback();
  r.collective_seconds = d.collective_seconds();
  for (const pb::SampledToken& p : d.sampled()) {
    SampledToken t;
    t.request_id = p.request_id();
    t.token = p.token();
    t.logprob = p.logprob();
    t.nonfinite = p.nonfinite();
    for (const pb::TopLogprob& top : p.top()) t.top.emplace_back(top.token(), top.logprob());
    r.sampled.push_back(std::move(t));
  }
  return r;
}

}  // namespace dsv4::control
