#include "node/openai/request.h"

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"
#include "node/chat/dsv4_encoding.h"
#include "node/openai/json_fields.h"

namespace dsv4::openai {
namespace {

absl::Status GetBool(const Json& obj, const char* name, std::optional<bool>* out) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return WrongType(name, "a boolean", *v);
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status GetNumber(const Json& obj, const char* name, std::optional<double>* out) {
  const Json* v = Member(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return WrongType(name, "a number", *v);
  const double d = v->get<double>();
  if (!std::isfinite(d)) return Invalid(name, "must be finite");
  *out = d;
  return absl::OkStatus();
}

absl::Status GetInt(const std::string& field, const Json* v, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out) {
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d) || !std::isfinite(d)) return WrongType(field, "an integer", *v);
    // (double)INT64_MAX rounds up to 2^63: compare against the exclusive bound so that the cast
    // below stays defined.
    if (d < static_cast<double>(lo) || d >= 0x1p63 || d > static_cast<double>(hi)) {
      return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", d));
    }
    *out = static_cast<int64_t>(d);
    return absl::OkStatus();
  }
  if (!v->is_number_integer()) return WrongType(field, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v->dump()));
  }
  const int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", i));
  *out = i;
  return absl::OkStatus();
}

absl::Status GetInt(const Json& obj, const char* name, int64_t lo, int64_t hi,
                    std::optional<int64_t>* out) {
  return GetInt(name, Member(obj, name), lo, hi, out);
}


absl::StatusOr<Json> ParseBody(std::string_view body, const ParseLimits& limits) {
  if (body.empty()) return Invalid("body", "empty; a JSON object is required");
  // Refused before parsing: every later walk over the value would recurse that deep.
  if (!JsonNestingWithin(body, limits.max_nesting)) {
    return Invalid("body", absl::StrCat("JSON nested deeper than ", limits.max_nesting, " levels"));
  }
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parse again for the parser's own words (where and why); only for bad bodies.
    try {
      const Json again = Json::parse(body.begin(), body.end());
      (void)again;
    } catch (const std::exception& e) {
      return Invalid("body", absl::StrCat("not valid JSON: ", e.what()));
    }
    return Invalid("body", "not valid JSON");
  }
  if (!j.is_object()) return Invalid("body", absl::StrCat("must be a JSON object, got ", JsonTypeName(j)));
  return j;
}

// stream and stream_options.
absl::Status ParseStreaming(const Json& j, ApiRequest* out) {
  std::optional<bool> stream;
  RETURN_IF_ERROR(GetBool(j, "stream", &stream));
  out->stream = stream.value_or(false);
  if (const Json* so = Member(j, "stream_options")) {
    if (!so->is_object()) return WrongType("stream_options", "an object", *so);
    if (!out->stream) return Invalid("stream_options", "only allowed with stream: true");
    if (const Json* u = Member(*so, "include_usage")) {
      if (!u->is_boolean()) return WrongType("stream_options.include_usage", "a boolean", *u);
      out->include_usage = u->get<bool>();
    }
  }
  return absl::OkStatus();
}

// Lengths and the sampling parameters.
absl::Status ParseSampling(const Json& j, v1::GenerateRequest* g) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  std::optional<int64_t> max_tokens, max_completion, min_tokens, top_k, seed;
  RETURN_IF_ERROR(GetInt(j, "max_tokens", 1, kMaxInt32, &max_tokens));
  RETURN_IF_ERROR(GetInt(j, "max_completion_tokens", 1, kMaxInt32, &max_completion));
  if (max_completion) g->set_max_tokens(static_cast<int32_t>(*max_completion));
  else if (max_tokens) g->set_max_tokens(static_cast<int32_t>(*max_tokens));
  RETURN_IF_ERROR(GetInt(j, "min_tokens", 0, kMaxInt32, &min_tokens));
  if (min_tokens) g->set_min_tokens(static_cast<int32_t>(*min_tokens));

  v1::SamplingParams& s = *g->mutable_sampling();
  std::optional<double> temperature, top_p, min_p, rep, presence, frequency;
  RETURN_IF_ERROR(GetNumber(j, "temperature", &temperature));
  RETURN_IF_ERROR(GetNumber(j, "top_p", &top_p));
  RETURN_IF_ERROR(GetNumber(j, "min_p", &min_p));
  RETURN_IF_ERROR(GetNumber(j, "repetition_penalty", &rep));
  RETURN_IF_ERROR(GetNumber(j, "presence_penalty", &presence));
  RETURN_IF_ERROR(GetNumber(j, "frequency_penalty", &frequency));
  if (temperature) {
    if (*temperature < 0 || *temperature > 2) return Invalid("temperature", absl::StrCat("must be in [0, 2], got ", *temperature));
    s.set_temperature(static_cast<float>(*temperature));
  }
  if (top_p) s.set_top_p(static_cast<float>(*top_p));
  if (min_p) s.set_min_p(static_cast<float>(*min_p));
  if (rep) s.set_repetition_penalty(static_cast<float>(*rep));
  if (presence) s.set_presence_penalty(static_cast<float>(*presence));
  if (frequency) s.set_frequency_penalty(static_cast<float>(*frequency));
  RETURN_IF_ERROR(GetInt(j, "top_k", -1, kMaxInt32, &top_k));
  if (top_k && *top_k > 0) s.set_top_k(static_cast<int32_t>(*top_k));  // -1 and 0: off
  RETURN_IF_ERROR(GetInt(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed));
  if (seed) s.set_seed(static_cast<uint64_t>(*seed));
  return absl::OkStatus();
}

// stop and stop_token_ids, counted before they are copied: an 8 MiB body must not become
// millions of strings.
absl::Status ParseStops(const Json& j, v1::GenerateRequest* g) {
  constexpr size_t kMaxStops = 16, kMaxStopIds = 64;
  if (const Json* stop = Member(j, "stop")) {
    if (stop->is_array() && stop->size() > kMaxStops) {
      return Invalid("stop", absl::StrCat("at most ", kMaxStops, " stop strings, got ", stop->size()));
    }
    if (stop->is_string()) {
      g->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) return WrongType(absl::StrCat("stop[", i, "]"), "a string", (*stop)[i]);
        g->add_stop((*stop)[i].get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (const Json* ids = Member(j, "stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of integers", *ids);
    if (ids->size() > kMaxStopIds) {
      return Invalid("stop_token_ids", absl::StrCat("at most ", kMaxStopIds, " ids, got ", ids->size()));
    }
    for (size_t i = 0; i < ids->size(); ++i) {
      std::optional<int64_t> id;
      RETURN_IF_ERROR(GetInt(absl::StrCat("stop_token_ids[", i, "]"), &(*ids)[i], 0,
                             std::numeric_limits<int32_t>::max(), &id));
      g->add_stop_token_ids(static_cast<int32_t>(*id));
    }
  }
  return absl::OkStatus();
}

// Fields whose meaning would be lost silently: refused, not ignored.
absl::Status RefuseUnsupported(const Json& j) {
  for (const char* name : {"logit_bias", "functions", "function_call", "prompt_logprobs"}) {
    if (const Json* v = Member(j, name); v != nullptr && !(v->is_object() && v->empty())) {
      return Invalid(name, "is not supported");
    }
  }
  if (Member(j, "suffix") != nullptr) return Invalid("suffix", "is not supported");
  if (const Json* v = Member(j, "best_of"); v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 1)) {
    return Invalid("best_of", "is not supported");
  }
  return absl::OkStatus();
}

// The fields the two endpoints share: model, stream, n, lengths, sampling, stops, extras.
absl::Status ParseCommon(const Json& j, ApiRequest* out) {
  const Json* model = Member(j, "model");
  if (model == nullptr) return Invalid("model", "required");
  if (!model->is_string()) return WrongType("model", "a string", *model);
  out->model = model->get<std::string>();
  RETURN_IF_ERROR(ParseStreaming(j, out));
  std::optional<int64_t> n;
  RETURN_IF_ERROR(GetInt(j, "n", 1, std::numeric_limits<int32_t>::max(), &n));
  if (n.has_value() && *n != 1) return Invalid("n", absl::StrCat("only 1 choice per request is supported, got ", *n));
  v1::GenerateRequest& g = out->generate;
  RETURN_IF_ERROR(ParseSampling(j, &g));
  RETURN_IF_ERROR(ParseStops(j, &g));
  std::optional<bool> ignore_eos, token_ids, echo_stop;
  RETURN_IF_ERROR(GetBool(j, "ignore_eos", &ignore_eos));
  g.set_ignore_eos(ignore_eos.value_or(false));
  RETURN_IF_ERROR(GetBool(j, "return_token_ids", &token_ids));
  out->return_token_ids = token_ids.value_or(false);
  RETURN_IF_ERROR(GetBool(j, "include_stop_str_in_output", &echo_stop));
  g.set_include_stop_str_in_output(echo_stop.value_or(false));
  return RefuseUnsupported(j);
}

}  // namespace

namespace internal {
absl::Status ParseChatBody(const Json& j, const ParseLimits& limits, ApiRequest* out);
}  // namespace internal

absl::StatusOr<ApiRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits) {
  ASSIGN_OR_RETURN(Json j, ParseBody(body, limits));
  ApiRequest out;
  out.endpoint = Endpoint::kChat;
  RETURN_IF_ERROR(ParseCommon(j, &out));
  std::optional<bool> logprobs;
  RETURN_IF_ERROR(GetBool(j, "logprobs", &logprobs));
  std::optional<int64_t> top;
  RETURN_IF_ERROR(GetInt(j, "top_logprobs", 0, limits.max_logprobs, &top));
  if (top && !logprobs.value_or(false)) return Invalid("top_logprobs", "needs logprobs: true");
  out.logprobs = logprobs.value_or(false);
  out.top_logprobs = static_cast<int32_t>(top.value_or(0));
  // The engine returns the chosen token's logprob when asked for at least one alternative.
  if (out.logprobs) out.generate.set_logprobs(std::max<int32_t>(1, out.top_logprobs));
  RETURN_IF_ERROR(internal::ParseChatBody(j, limits, &out));
  return out;
}

absl::StatusOr<ApiRequest> ParseCompletionRequest(std::string_view body, const ParseLimits& limits) {
  ASSIGN_OR_RETURN(Json j, ParseBody(body, limits));
  ApiRequest out;
  out.endpoint = Endpoint::kCompletion;
  RETURN_IF_ERROR(ParseCommon(j, &out));
  std::optional<bool> echo;
  RETURN_IF_ERROR(GetBool(j, "echo", &echo));
  if (echo.value_or(false)) return Invalid("echo", "is not supported");
  if (const Json* lp = Member(j, "logprobs")) {
    if (lp->is_boolean()) return WrongType("logprobs", "an integer", *lp);
    std::optional<int64_t> n;
    RETURN_IF_ERROR(GetInt("logprobs", lp, 0, limits.max_logprobs, &n));
    out.logprobs = true;
    out.top_logprobs = static_cast<int32_t>(*n);
    out.generate.set_logprobs(std::max<int32_t>(1, out.top_logprobs));
  }
  const Json* prompt = Member(j, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "required");
  // One prompt: a string, token ids, or a list holding exactly one of those.
  std::string path = "prompt";
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    prompt = &(*prompt)[0];
    path = "prompt[0]";
  } else if (prompt->is_array() && !prompt->empty() && ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    return Invalid("prompt", absl::StrCat("only one prompt per request is supported, got ", prompt->size()));
  }
  if (prompt->is_string()) {
    if (prompt->get_ref<const std::string&>().empty()) return Invalid(path, "must not be empty");
    out.generate.set_text(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) return Invalid(path, "must not be empty");
    auto* ids = out.generate.mutable_token_ids();
    for (size_t i = 0; i < prompt->size(); ++i) {
      std::optional<int64_t> id;
      RETURN_IF_ERROR(GetInt(absl::StrCat(path, "[", i, "]"), &(*prompt)[i], 0,
                             std::numeric_limits<int32_t>::max(), &id));
      if (!id) return Invalid(absl::StrCat(path, "[", i, "]"), "must be a token id, got null");
      ids->add_ids(static_cast<int32_t>(*id));
    }
  } else {
    return WrongType("prompt", "a string or an array of token ids", *prompt);
  }
  return out;
}

namespace {

std::string RenameCommon(const std::string& f) {
  static const char kSampling[] = "sampling.";
  if (f.rfind(kSampling, 0) == 0) return f.substr(sizeof(kSampling) - 1);
  return f;
}

}  // namespace

std::string ChatFieldName(const std::string& f) {
  if (f.rfind("input", 0) == 0) return "messages";
  return RenameCommon(f);
}

std::string CompletionFieldName(const std::string& f) {
  static const char kIds[] = "input.token_ids.ids";
  if (f.rfind(kIds, 0) == 0) return absl::StrCat("prompt", f.substr(sizeof(kIds) - 1));
  if (f.rfind("input", 0) == 0) return "prompt";
  return RenameCommon(f);
}

}  // namespace dsv4::openai
