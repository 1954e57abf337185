#include "control/plan_codec.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

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
  out->set_num_state_snapshots(c.num_state_snapshots);
}

CacheConfig FromProto(const pb::CacheLayout& c) {
  CacheConfig out;
  out.block_size = c.block_size();
  out.num_blocks = c.num_blocks();
  out.num_slots = c.num_slots();
  out.max_model_len = c.max_model_len();
  out.max_step_tokens = c.max_step_tokens();
  out.max_graph_tokens = c.max_graph_tokens();
  out.num_state_snapshots = c.num_state_snapshots();
  return out;
}

void ToProto(const WorkerConfig& wc, const std::string& config_json, pb::Configure* out) {
  out->set_config_json(config_json);
  out->set_model_dir(wc.model_dir);
  out->set_synthetic(wc.synthetic);
  out->set_synthetic_seed(wc.synthetic_seed);
  out->set_source(wc.source);
  out->set_precision(wc.precision);
  out->set_weight_format(wc.weight_format);
  out->set_batch_invariant(wc.batch_invariant);
  out->set_threads(wc.threads);
  ToProto(wc.cache, out->mutable_cache());
  out->set_enforce_eager(wc.graphs.enforce_eager);
  out->set_wide_eager_region(wc.graphs.wide_eager_region);
}

absl::StatusOr<WorkerConfig> FromProto(const pb::Configure& c) {
  WorkerConfig wc;
  ASSIGN_OR_RETURN(wc.model, ParseModelConfig(c.config_json()));
  wc.precision = c.precision();
  wc.weight_format = c.weight_format();
  wc.batch_invariant = c.batch_invariant();
  wc.threads = c.threads();
  wc.model_dir = c.model_dir();
  wc.synthetic = c.synthetic();
  wc.synthetic_seed = c.synthetic_seed();
  wc.source = c.source();
  wc.cache = FromProto(c.cache());
  wc.graphs.enforce_eager = c.enforce_eager();
  wc.graphs.wide_eager_region = c.wide_eager_region();
  wc.parallel = {c.rank(), c.world_size()};
  return wc;
}

void ToProto(const StepPlan& plan, pb::Step* out) {
  out->set_step_id(plan.step_id);
  const int n = static_cast<int>(plan.seqs.size());
  out->mutable_request_ids()->Reserve(n);
  out->mutable_token_offsets()->Reserve(n + 1);
  out->mutable_block_offsets()->Reserve(n + 1);
  out->add_token_offsets(0);
  out->add_block_offsets(0);
  int32_t tokens = 0, blocks = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    out->add_request_ids(s.request_id);
    out->mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    tokens += static_cast<int32_t>(s.tokens.size());
    out->add_token_offsets(tokens);
    out->add_start_pos(s.start_pos);
    out->add_state_slots(s.state_slot);
    out->mutable_block_table()->Add(s.block_table.begin(), s.block_table.end());
    blocks += static_cast<int32_t>(s.block_table.size());
    out->add_block_offsets(blocks);
    out->add_prompt_len(s.prompt_len);
    out->add_output_index(s.output_index);
    out->add_flags((s.sample ? 1u : 0u) | (s.deferred_token ? 2u : 0u));
  }
  bool restores = false, snapshots = false;
  for (const ScheduledSeq& s : plan.seqs) {
    restores |= s.restore_from >= 0;
    snapshots |= !s.snapshots.empty();
  }
  if (restores) {
    for (const ScheduledSeq& s : plan.seqs) out->add_restore_rows(s.restore_from);
  }
  if (snapshots) {
    int32_t at = 0;
    out->add_snapshot_offsets(0);
    for (const ScheduledSeq& s : plan.seqs) {
      for (const StateSnapshotAt& snap : s.snapshots) {
        out->add_snapshot_positions(snap.position);
        out->add_snapshot_rows(snap.row);
      }
      at += static_cast<int32_t>(s.snapshots.size());
      out->add_snapshot_offsets(at);
    }
  }
  out->mutable_released()->Add(plan.released.begin(), plan.released.end());
  out->set_graph_mode(static_cast<int32_t>(plan.graph_mode));
  out->set_padded_tokens(plan.padded_tokens);
  out->set_force_indexer_scoring(plan.force_indexer_scoring);
}

namespace {

// Offsets [n + 1] that start at 0, never decrease and end at `total`.
absl::Status CheckOffsets(const google::protobuf::RepeatedField<int32_t>& off, int n, int total,
                          const char* field) {
  if (off.size() != n + 1 || off[0] != 0 || off[n] != total) {
    return absl::InvalidArgumentError(absl::StrCat("Step.", field, " must hold ", n + 1,
                                                   " offsets from 0 to ", total));
  }
  for (int i = 0; i < n; ++i) {
    if (off[i + 1] < off[i]) {
      return absl::InvalidArgumentError(absl::StrCat("Step.", field, " decreases at ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StepPlan> FromProto(const pb::Step& step,
                                   std::map<uint64_t, std::shared_ptr<const SamplingSpec>>* known) {
  const int n = step.request_ids_size();
  for (auto [size, field] : {std::pair{step.start_pos_size(), "start_pos"},
                             {step.state_slots_size(), "state_slots"},
                             {step.prompt_len_size(), "prompt_len"},
                             {step.output_index_size(), "output_index"},
                             {step.flags_size(), "flags"}}) {
    if (size != n) {
      return absl::InvalidArgumentError(absl::StrCat("Step.", field, " has ", size,
                                                     " entries for ", n, " sequences"));
    }
  }
  RETURN_IF_ERROR(CheckOffsets(step.token_offsets(), n, step.tokens_size(), "token_offsets"));
  RETURN_IF_ERROR(CheckOffsets(step.block_offsets(), n, step.block_table_size(), "block_offsets"));
  if (step.restore_rows_size() != 0 && step.restore_rows_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("Step.restore_rows has ",
                                                   step.restore_rows_size(), " entries for ", n,
                                                   " sequences"));
  }
  if (step.snapshot_positions_size() != step.snapshot_rows_size()) {
    return absl::InvalidArgumentError("Step.snapshot_positions and snapshot_rows differ in size");
  }
  if (step.snapshot_offsets_size() != 0 || step.snapshot_positions_size() != 0) {
    RETURN_IF_ERROR(CheckOffsets(step.snapshot_offsets(), n, step.snapshot_positions_size(),
                                 "snapshot_offsets"));
  }
  if (step.graph_mode() < 0 || step.graph_mode() > static_cast<int32_t>(GraphMode::kFull)) {
    return absl::InvalidArgumentError(absl::StrCat("Step.graph_mode ", step.graph_mode(),
                                                   " is not 0 (eager), 1 (piecewise) or 2 (full)"));
  }
  if (step.padded_tokens() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Step.padded_tokens ", step.padded_tokens(), " < 0"));
  }
  for (const pb::RequestSpec& r : step.requests()) {
    (*known)[r.request_id()] = std::make_shared<const SamplingSpec>(FromProto(r.sampling()));
  }
  StepPlan plan;
  plan.step_id = step.step_id();
  plan.graph_mode = static_cast<GraphMode>(step.graph_mode());
  plan.padded_tokens = step.padded_tokens();
  plan.force_indexer_scoring = step.force_indexer_scoring();
  plan.seqs.resize(static_cast<size_t>(n));
  const int32_t* tokens = step.tokens().data();
  const int32_t* blocks = step.block_table().data();
  for (int i = 0; i < n; ++i) {
    ScheduledSeq& s = plan.seqs[i];
    s.request_id = step.request_ids(i);
    s.tokens.assign(tokens + step.token_offsets(i), tokens + step.token_offsets(i + 1));
    s.start_pos = step.start_pos(i);
    s.state_slot = step.state_slots(i);
    s.block_table.assign(blocks + step.block_offsets(i), blocks + step.block_offsets(i + 1));
    s.prompt_len = step.prompt_len(i);
    s.output_index = step.output_index(i);
    const uint32_t flags = step.flags(i);
    if (flags > 3) {
      return absl::InvalidArgumentError(absl::StrCat("Step.flags[", i, "] = ", flags, " has unknown bits"));
    }
    s.sample = (flags & 1u) != 0;
    s.deferred_token = (flags & 2u) != 0;
    if (step.restore_rows_size() != 0) s.restore_from = step.restore_rows(i);
    if (step.snapshot_offsets_size() != 0) {
      for (int k = step.snapshot_offsets(i); k < step.snapshot_offsets(i + 1); ++k) {
        s.snapshots.push_back({step.snapshot_positions(k), step.snapshot_rows(k)});
      }
    }
    if (s.start_pos < 0 || s.prompt_len < 0 || s.output_index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Step sequence ", i, ": a negative position"));
    }
    if (s.sample) {
      auto it = known->find(s.request_id);
      if (it == known->end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Step sequence ", i, ": request ", s.request_id, " samples but its sampling "
            "parameters never arrived (Step.requests)"));
      }
      s.sampling = it->second;
    }
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
  const int n = static_cast<int>(r.sampled.size());
  out->mutable_request_ids()->Reserve(n);
  out->mutable_tokens()->Reserve(n);
  out->mutable_logprobs()->Reserve(n);
  out->mutable_nonfinite()->Reserve(n);
  out->mutable_top_offsets()->Reserve(n + 1);
  out->add_top_offsets(0);
  int32_t tops = 0;
  for (const SampledToken& t : r.sampled) {
    out->add_request_ids(t.request_id);
    out->add_tokens(t.token);
    out->add_logprobs(t.logprob);
    out->add_nonfinite(t.nonfinite);
    for (const auto& [id, lp] : t.top) {
      out->add_top_tokens(id);
      out->add_top_logprobs(lp);
    }
    tops += static_cast<int32_t>(t.top.size());
    out->add_top_offsets(tops);
  }
}

absl::StatusOr<StepResult> FromProto(const pb::StepDone& d) {
  StepResult r;
  r.step_id = d.step_id();
  r.execute_seconds = d.execute_seconds();
  r.device_seconds = d.device_seconds();
  const int32_t mode = d.graph_mode();
  r.graph.mode = mode >= 0 && mode <= 2 ? static_cast<GraphMode>(mode) : GraphMode::kEager;
  r.graph.fallback = d.graph_fallback();
  r.collective_seconds = d.collective_seconds();
  const int n = d.request_ids_size();
  if (d.tokens_size() != n || d.logprobs_size() != n || d.nonfinite_size() != n ||
      (n > 0 && d.top_offsets_size() != n + 1) || d.top_tokens_size() != d.top_logprobs_size()) {
    return absl::InvalidArgumentError("StepDone: its sampled arrays disagree in length");
  }
  for (int i = 0; i < n; ++i) {
    SampledToken t;
    t.request_id = d.request_ids(i);
    t.token = d.tokens(i);
    t.logprob = d.logprobs(i);
    t.nonfinite = d.nonfinite(i);
    const int32_t b = d.top_offsets(i), e = d.top_offsets(i + 1);
    if (b < 0 || e < b || e > d.top_tokens_size()) {
      return absl::InvalidArgumentError("StepDone.top_offsets out of range");
    }
    for (int32_t k = b; k < e; ++k) t.top.emplace_back(d.top_tokens(k), d.top_logprobs(k));
    r.sampled.push_back(std::move(t));
  }
  return r;
}

}  // namespace dsv4::control
