#include "node/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/status.h"
#include "node/chat_format.h"

namespace dsv4 {
namespace {

absl::Status Invalid(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

bool PrintableAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// Phase of a prompt given as text or ids: content unless it ends inside an open <think>.
Phase PromptPhase(const std::vector<int32_t>& ids, int32_t think_start, int32_t think_end) {
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (*it == think_end) return Phase::kContent;
    if (*it == think_start) return Phase::kReasoning;
  }
  return Phase::kContent;
}

// Bounds an input before it is tokenized: at most max_input_bytes, and not so long that it
// cannot fit in the model length whatever its tokens (a token spells at most
// max_bytes_per_token bytes).
absl::Status CheckInputBytes(const char* field, int64_t bytes, const Tokenizer& tokenizer,
                             const NodeLimits& limits) {
  if (bytes > limits.max_input_bytes) {
    return absl::OutOfRangeError(absl::StrCat(field, ": ", bytes, " bytes exceed the limit of ",
                                              limits.max_input_bytes));
  }
  const int64_t per_token = tokenizer.max_bytes_per_token();
  if (per_token > 0 && bytes / per_token >= limits.max_model_len) {
    return absl::OutOfRangeError(absl::StrCat(
        field, ": ", bytes, " bytes need at least ", bytes / per_token,
        " tokens; the model length is ", limits.max_model_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ValidatedRequest> ValidateRequest(const v1::GenerateRequest& req,
                                                 const Tokenizer& tokenizer,
                                                 const NodeLimits& limits, uint64_t default_seed) {
  ValidatedRequest out;
  if (req.request_id().size() > 128 || (!req.request_id().empty() && !PrintableAscii(req.request_id()))) {
    return Invalid("request_id", "at most 128 printable ASCII characters");
  }
  out.request_id = req.request_id();

  // ---- input ----
  Phase phase = Phase::kContent;
  switch (req.input_case()) {
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = req.token_ids().ids();
      if (ids.empty()) return Invalid("input.token_ids.ids", "must not be empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Invalid(absl::StrCat("input.token_ids.ids[", i, "]"),
                         absl::StrCat(ids[i], " is outside the vocabulary [0, ", limits.vocab_size,
                                      ")"));
        }
      }
      out.prompt.assign(ids.begin(), ids.end());
      phase = PromptPhase(out.prompt, limits.think_start_id, limits.think_end_id);
      break;
    }
    case v1::GenerateRequest::kText: {
      if (req.text().empty()) return Invalid("input.text", "must not be empty");
      RETURN_IF_ERROR(CheckInputBytes("input.text", req.text().size(), tokenizer, limits));
      auto ids = tokenizer.Encode(req.text(), limits.max_model_len - 1);
      if (!ids.ok()) return Annotate(ids.status(), "input.text");
      out.prompt = std::move(*ids);
      phase = PromptPhase(out.prompt, limits.think_start_id, limits.think_end_id);
      break;
    }
    case v1::GenerateRequest::kChat: {
      const auto& chat = req.chat();
      if (chat.messages().empty()) return Invalid("input.chat.messages", "must not be empty");
      if (chat.messages_size() > limits.max_messages) {
        return absl::OutOfRangeError(absl::StrCat("input.chat.messages: more than ",
                                                  limits.max_messages, " messages"));
      }
      // Roles first: cheap, and a bad one is named whatever the size of the rest.
      for (int i = 0; i < chat.messages_size(); ++i) {
        const std::string& role = chat.messages(i).role();
        if (role != "system" && role != "user" && role != "assistant") {
          return Invalid(absl::StrCat("input.chat.messages[", i, "].role"),
                         absl::StrCat(EchoValue(role), " is not system, user or assistant"));
        }
      }
      std::vector<ChatTurn> turns;
      int64_t bytes = 0;
      for (const auto& m : chat.messages()) {
        bytes += static_cast<int64_t>(m.role().size() + m.content().size());
        turns.push_back({m.role(), m.content()});
      }
      // Only the byte limit here: the chat format drops past reasoning, so the bytes say little
      // about the rendered prompt's length; its tokenizing stops at the model length.
      if (bytes > limits.max_input_bytes) {
        return absl::OutOfRangeError(absl::StrCat("input.chat.messages: ", bytes,
                                                  " bytes exceed the limit of ",
                                                  limits.max_input_bytes));
      }
      auto text = RenderChat(turns, chat.thinking());
      if (!text.ok()) {
        // RenderChat names "messages[i].role"; the public path is input.chat.messages[i].role.
        return absl::InvalidArgumentError(absl::StrCat("input.chat.", text.status().message()));
      }
      auto ids = tokenizer.Encode(*text, limits.max_model_len - 1);
      if (!ids.ok()) return Annotate(ids.status(), "input.chat.messages");
      out.prompt = std::move(*ids);
      phase = chat.thinking() ? Phase::kReasoning : Phase::kContent;
      break;
    }
    default:
      return Invalid("input", "one of token_ids, text or chat is required");
  }
  const int64_t prompt_len = static_cast<int64_t>(out.prompt.size());
  if (prompt_len >= limits.max_model_len) {
    return absl::OutOfRangeError(absl::StrCat("input: the prompt has ", prompt_len,
                                              " tokens; the model length is ",
                                              limits.max_model_len,
                                              " (room for at least one generated token needed)"));
  }

  // ---- lengths ----
  int64_t max_tokens;
  if (req.has_max_tokens()) {
    if (req.max_tokens() < 1) {
      return Invalid("max_tokens", absl::StrCat("must be >= 1, got ", req.max_tokens()));
    }
    max_tokens = req.max_tokens();
    if (prompt_len + max_tokens > limits.max_model_len) {
      return absl::OutOfRangeError(absl::StrCat(
          "max_tokens: prompt (", prompt_len, ") + max_tokens (", max_tokens,
          ") exceeds the model length ", limits.max_model_len));
    }
  } else {
    // The default never asks for more than the model length or the KV pool can hold.
    max_tokens = std::min<int64_t>({limits.default_max_tokens, limits.max_model_len - prompt_len,
                                    limits.kv_capacity_tokens - prompt_len});
    if (max_tokens < 1) {
      return absl::OutOfRangeError(absl::StrCat("input: the prompt has ", prompt_len,
                                                " tokens; the node's KV capacity is ",
                                                limits.kv_capacity_tokens, " tokens"));
    }
  }
  if (prompt_len + max_tokens > limits.kv_capacity_tokens) {
    return absl::OutOfRangeError(absl::StrCat("max_tokens: prompt + max_tokens = ",
                                              prompt_len + max_tokens,
                                              " tokens exceed the node's KV capacity of ",
                                              limits.kv_capacity_tokens, " tokens"));
  }
  if (req.min_tokens() < 0 || req.min_tokens() > max_tokens) {
    return Invalid("min_tokens", absl::StrCat("must be in [0, max_tokens = ", max_tokens, "], got ",
                                              req.min_tokens()));
  }

  // ---- sampling ----
  auto spec = std::make_shared<SamplingSpec>();
  const auto& s = req.sampling();
  if (s.has_temperature()) {
    if (!std::isfinite(s.temperature()) || s.temperature() < 0 || s.temperature() > 100) {
      return Invalid("sampling.temperature", absl::StrCat("must be in [0, 100], got ", s.temperature()));
    }
    spec->temperature = s.temperature();
  }
  if (s.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat("must be >= 0, got ", s.top_k()));
  spec->top_k = s.top_k();
  if (s.has_top_p()) {
    if (!(s.top_p() > 0 && s.top_p() <= 1)) {
      return Invalid("sampling.top_p", absl::StrCat("must be in (0, 1], got ", s.top_p()));
    }
    spec->top_p = s.top_p();
  }
  if (!(s.min_p() >= 0 && s.min_p() <= 1)) {
    return Invalid("sampling.min_p", absl::StrCat("must be in [0, 1], got ", s.min_p()));
  }
  spec->min_p = s.min_p();
  spec->seed = s.has_seed() ? s.seed() : default_seed;
  if (s.has_repetition_penalty()) {
    if (!std::isfinite(s.repetition_penalty()) || s.repetition_penalty() <= 0 ||
        s.repetition_penalty() > 10) {
      return Invalid("sampling.repetition_penalty",
                     absl::StrCat("must be in (0, 10], got ", s.repetition_penalty()));
    }
    spec->repetition_penalty = s.repetition_penalty();
  }
  for (auto [name, v] : {std::pair<const char*, float>{"sampling.presence_penalty", s.presence_penalty()},
                         {"sampling.frequency_penalty", s.frequency_penalty()}}) {
    if (!(v >= -2 && v <= 2)) return Invalid(name, absl::StrCat("must be in [-2, 2], got ", v));
  }
  spec->presence_penalty = s.presence_penalty();
  spec->frequency_penalty = s.frequency_penalty();
  if (req.logprobs() < 0 || req.logprobs() > limits.max_logprobs) {
    return Invalid("logprobs", absl::StrCat("must be in [0, ", limits.max_logprobs, "], got ",
                                            req.logprobs()));
  }
  spec->logprobs = req.logprobs();
  spec->min_tokens = req.min_tokens();

  // ---- stops ----
  if (req.stop_size() > limits.max_stop_strings) {
    return Invalid("stop", absl::StrCat("at most ", limits.max_stop_strings, " stop strings, got ",
                                        req.stop_size()));
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string& st = req.stop(i);
    if (st.empty() || static_cast<int32_t>(st.size()) > limits.max_stop_string_bytes) {
      return Invalid(absl::StrCat("stop[", i, "]"),
                     absl::StrCat("must be 1..", limits.max_stop_string_bytes, " bytes"));
    }
    if (!IsValidUtf8(st)) return Invalid(absl::StrCat("stop[", i, "]"), "is not valid UTF-8");
    out.output.stop_strings.push_back(st);
  }
  if (req.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid("stop_token_ids", absl::StrCat("at most ", limits.max_stop_token_ids,
                                                  " ids, got ", req.stop_token_ids_size()));
  }
  for (int i = 0; i < req.stop_token_ids_size(); ++i) {
    const int32_t id = req.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(absl::StrCat("stop_token_ids[", i, "]"),
                     absl::StrCat(id, " is outside the vocabulary"));
    }
    out.output.stop_token_ids.push_back(id);
  }
  spec->min_tokens_mask = out.output.stop_token_ids;
  if (!req.ignore_eos()) {
    for (int32_t e : limits.eos_token_ids) spec->min_tokens_mask.push_back(e);
  }

  RepetitionMode mode = limits.repetition_mode;
  switch (req.repetition_action()) {
    case v1::REPETITION_ACTION_DEFAULT: break;
    case v1::REPETITION_ACTION_OBSERVE: mode = RepetitionMode::kObserve; break;
    case v1::REPETITION_ACTION_STOP: mode = RepetitionMode::kStop; break;
    case v1::REPETITION_ACTION_OFF: mode = RepetitionMode::kOff; break;
    default: return Invalid("repetition_action", absl::StrCat("unknown value ", req.repetition_action()));
  }

  out.sampling = std::move(spec);
  out.output.eos_token_ids = limits.eos_token_ids;
  out.output.ignore_eos = req.ignore_eos();
  out.output.include_stop_str_in_output = req.include_stop_str_in_output();
  out.output.max_tokens = static_cast<int32_t>(max_tokens);
  out.output.initial_phase = phase;
  out.output.think_start_id = limits.think_start_id;
  out.output.think_end_id = limits.think_end_id;
  out.output.repetition_mode = mode;
  out.output.repetition = limits.repetition;
  return out;
}

}  // namespace dsv4
