#include "node/openai/response.h"

#include "absl/strings/str_cat.h"
#include "node/openai/api_error.h"

namespace dsv4::openai {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Json ByteArray(const std::string& bytes) {
  Json a = Json::array();
  for (unsigned char c : bytes) a.push_back(static_cast<int>(c));
  return a;
}

const char* FinishName(v1::FinishReason r, bool calls) {
  if (r == v1::LENGTH) return "length";
  return calls ? "tool_calls" : "stop";
}

Json ToolCallJson(const chat::ToolCallDelta& d, bool first) {
  Json c;
  c["index"] = d.index;
  if (first) {
    c["id"] = d.id;
    c["type"] = "function";
    c["function"] = {{"name", d.name}, {"arguments", d.arguments}};
  } else {
    c["function"] = {{"arguments", d.arguments}};
  }
  return c;
}

}  // namespace

ResponseSink::ResponseSink(const ApiRequest& request, ResponseMeta meta,
                           std::shared_ptr<http::Responder> responder, const Tokenizer* tokenizer,
                           std::function<void(int)> on_done)
    : endpoint_(request.endpoint),
      stream_(request.stream),
      include_usage_(request.include_usage),
      thinking_(request.thinking),
      logprobs_(request.logprobs),
      top_logprobs_(request.top_logprobs),
      return_token_ids_(request.return_token_ids),
      meta_(std::move(meta)),
      responder_(std::move(responder)),
      tokenizer_(tokenizer),
      on_done_(std::move(on_done)),
      parser_(request.parser) {
  if (endpoint_ == Endpoint::kCompletion) {
    logprob_items_ = {{"tokens", Json::array()}, {"token_logprobs", Json::array()},
                      {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  }
}

void ResponseSink::Done() {
  std::function<void(int)> f;
  f.swap(on_done_);
  if (f) f(status_);
}

void ResponseSink::Begin() {
  std::lock_guard<std::mutex> lock(mu_);
  StartStream();
}

void ResponseSink::StartStream() {
  if (!stream_ || begun_ || ended_) return;
  begun_ = true;
  http::Response head;
  head.content_type = "text/event-stream";
  head.headers.emplace_back("Cache-Control", "no-cache");
  head.headers.emplace_back("X-Accel-Buffering", "no");  // proxies: do not buffer the stream
  responder_->StartStream(std::move(head));
  if (endpoint_ == Endpoint::kChat) {
    Json e = ChunkEnvelope();
    e["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
    SendEvent(e);
  }
}

ResponseSink::Json ResponseSink::ChunkEnvelope() const {
  Json e = Head(endpoint_ == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  Json choice;
  choice["index"] = 0;
  if (endpoint_ == Endpoint::kChat) choice["delta"] = Json::object();
  else choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  e["choices"] = Json::array({choice});
  return e;
}

void ResponseSink::SendEvent(const Json& event) {
  responder_->Send(absl::StrCat("data: ", Dump(event), "\n\n"));
}

void ResponseSink::EndStream() {
  responder_->Send("data: [DONE]\n\n");
  responder_->End();
  ended_ = true;
}

void ResponseSink::Emit(v1::GenerateResponse response, bool last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ended_) {
      // The engine may answer before Submit returned and Begin() ran: the stream starts here then.
      StartStream();
      if (response.has_chunk()) OnChunk(response.chunk());
      if (response.has_finished()) OnFinished(response.finished());
      if (response.has_error()) {
        // A failure while running is the node's, never the client's (whatever its status code):
        // 503 when the node is unavailable, else 500.
        const bool unavailable =
            response.error().code() == static_cast<int>(absl::StatusCode::kUnavailable);
        OnError(unavailable ? 503 : 500, unavailable ? "service_unavailable" : "server_error", "",
                response.error().message());
      }
    }
  }
  if (last) Done();
}

ResponseSink::Json ResponseSink::LogprobsJson(const v1::Chunk& chunk) {
  if (!logprobs_ || chunk.logprobs().empty()) return nullptr;
  if (endpoint_ == Endpoint::kChat) {
    Json content = Json::array();
    for (const v1::TokenLogprob& t : chunk.logprobs()) {
      const std::string bytes = tokenizer_->TokenBytes(t.token_id());
      Json item = {{"token", Utf8Lossy(bytes)}, {"logprob", t.logprob()}, {"bytes", ByteArray(bytes)}};
      Json top = Json::array();
      for (int k = 0; k < t.top_size() && k < top_logprobs_; ++k) {
        const std::string b = tokenizer_->TokenBytes(t.top(k).token_id());
        top.push_back({{"token", Utf8Lossy(b)}, {"logprob", t.top(k).logprob()}, {"bytes", ByteArray(b)}});
      }
      item["top_logprobs"] = std::move(top);
      content.push_back(std::move(item));
    }
    return Json{{"content", std::move(content)}};
  }
  Json lp = {{"tokens", Json::array()}, {"token_logprobs", Json::array()},
             {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  for (const v1::TokenLogprob& t : chunk.logprobs()) {
    const std::string bytes = tokenizer_->TokenBytes(t.token_id());
    lp["tokens"].push_back(Utf8Lossy(bytes));
    lp["token_logprobs"].push_back(t.logprob());
    Json top = Json::object();
    for (int k = 0; k < t.top_size() && k < top_logprobs_; ++k) {
      top[Utf8Lossy(tokenizer_->TokenBytes(t.top(k).token_id()))] = t.top(k).logprob();
    }
    lp["top_logprobs"].push_back(std::move(top));
    lp["text_offset"].push_back(text_offset_);
    text_offset_ += static_cast<int64_t>(bytes.size());
  }
  return lp;
}

void ResponseSink::OnChunk(const v1::Chunk& chunk) {
  Json lp = LogprobsJson(chunk);
  chat::ParsedDelta d;
  if (endpoint_ == Endpoint::kChat) {
    d = parser_.Feed(chunk.channel() == v1::CHANNEL_REASONING ? chat::Channel::kReasoning
                                                               : chat::Channel::kContent,
                     chunk.text());
  } else {
    d.content = chunk.text();  // completions: the text as generated, whatever its channel
  }
  Deliver(d, std::move(lp), &chunk);
}

void ResponseSink::Deliver(const chat::ParsedDelta& d, Json lp, const v1::Chunk* chunk) {
  const bool ids = return_token_ids_ && chunk != nullptr && chunk->token_ids_size() > 0;
  if (d.empty() && lp.is_null() && !ids) return;
  if (!stream_) {
    if (ids) {
      for (int32_t t : chunk->token_ids()) token_ids_.push_back(t);
    }
    reasoning_ += d.reasoning;
    content_ += d.content;
    for (const chat::ToolCallDelta& c : d.tool_calls) {
      if (c.index >= static_cast<int>(calls_.size())) calls_.resize(c.index + 1);
      chat::ToolCallDelta& acc = calls_[c.index];
      acc.index = c.index;
      if (!c.id.empty()) acc.id = c.id;
      if (!c.name.empty()) acc.name = c.name;
      acc.arguments += c.arguments;
    }
    if (lp.is_null()) return;
    if (endpoint_ == Endpoint::kChat) {
      for (auto& item : lp["content"]) logprob_items_.push_back(std::move(item));
    } else {
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        for (auto& v : lp[k]) logprob_items_[k].push_back(std::move(v));
      }
    }
    return;
  }
  Json e = ChunkEnvelope();
  Json& choice = e["choices"][0];
  if (endpoint_ == Endpoint::kChat) {
    Json& delta = choice["delta"];
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      // One entry per call index in a chunk, as OpenAI sends them: a call's start and its first
      // argument fragments can come from one engine chunk.
      std::vector<chat::ToolCallDelta> merged;
      for (const chat::ToolCallDelta& c : d.tool_calls) {
        if (!merged.empty() && merged.back().index == c.index) {
          merged.back().arguments += c.arguments;
        } else {
          merged.push_back(c);
        }
      }
      Json calls = Json::array();
      for (const chat::ToolCallDelta& c : merged) calls.push_back(ToolCallJson(c, !c.id.empty()));
      delta["tool_calls"] = std::move(calls);
    }
  } else {
    choice["text"] = d.content;
  }
  choice["logprobs"] = std::move(lp);
  if (ids) choice["token_ids"] = Json(std::vector<int32_t>(chunk->token_ids().begin(), chunk->token_ids().end()));
  SendEvent(e);
}

ResponseSink::Json ResponseSink::Usage(const v1::Usage& u) const {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens()}}}};
}

void ResponseSink::OnError(int status, const std::string& type, const std::string& code,
                           const std::string& message) {
  status_ = status;
  const ApiError e = MakeError(status, type, code, message);
  if (stream_) {
    // An error event: the SDKs raise it as an APIError.
    responder_->Send(absl::StrCat("data: ", e.Json(), "\n\n"));
    EndStream();
    return;
  }
  http::Response r = e.ToResponse();
  // The model's output is not a transient failure: a retry would only spend the same tokens.
  if (code == "invalid_tool_call") r.headers.emplace_back("x-should-retry", "false");
  responder_->Respond(std::move(r));
  ended_ = true;
}

void ResponseSink::OnFinished(const v1::Finished& f) {
  const v1::FinishReason reason = f.finish_reason();
  const bool valid_before = parser_.error().ok();
  if (endpoint_ == Endpoint::kChat) Deliver(parser_.Finish(reason == v1::LENGTH), nullptr);
  // A call cut off by the request's own length limit is dropped and the answer ends with
  // "length", as OpenAI does; only a call the model got wrong is an error.
  const bool invalid_call = !parser_.error().ok() && !(reason == v1::LENGTH && valid_before);
  if (reason == v1::CANCELLED) {
    if (responder_->client_gone()) {
      status_ = 499;  // nginx's "client closed request": counted, never sent
      ended_ = true;
      if (stream_) responder_->End();
      return;
    }
    return OnError(503, "service_unavailable", "cancelled", absl::StrCat("the request was cancelled: ", f.message()));
  }
  if (reason == v1::ERROR) return OnError(500, "server_error", "", f.message());
  if (invalid_call) {
    return OnError(500, "server_error", "invalid_tool_call",
                   absl::StrCat("the model produced an invalid tool call: ", parser_.error().message()));
  }
  const bool calls = endpoint_ == Endpoint::kChat && parser_.calls() > 0 && reason != v1::LENGTH;
  const char* finish = FinishName(reason, calls);
  if (stream_) {
    Json e = ChunkEnvelope();
    e["choices"][0]["finish_reason"] = finish;
    SendEvent(e);
    if (include_usage_) {
      Json u = ChunkEnvelope();
      u["choices"] = Json::array();
      u["usage"] = Usage(f.usage());
      SendEvent(u);
    }
    EndStream();
    return;
  }
  http::Response r;
  r.content_type = "application/json";
  r.body = Dump(WholeBody(finish, f.usage()));
  responder_->Respond(std::move(r));
  ended_ = true;
}

ResponseSink::Json ResponseSink::Head(const char* object) const {
  Json e;
  e["id"] = meta_.id;
  e["object"] = object;
  e["created"] = meta_.created;
  e["model"] = meta_.model;
  return e;
}

ResponseSink::Json ResponseSink::WholeBody(const char* finish, const v1::Usage& usage) const {
  Json body = Head(endpoint_ == Endpoint::kChat ? "chat.completion" : "text_completion");
  Json choice;
  choice["index"] = 0;
  if (endpoint_ == Endpoint::kChat) {
    Json message = {{"role", "assistant"}};
    // Only complete calls: one cut off by the length limit has arguments that are not an object.
    Json tc = Json::array();
    for (const chat::ToolCallDelta& c : calls_) {
      if (c.name.empty() || !Json::parse(c.arguments, nullptr, false).is_object()) continue;
      tc.push_back({{"id", c.id}, {"type", "function"},
                    {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    message["content"] = tc.empty() || !content_.empty() ? Json(content_) : Json(nullptr);
    if (thinking_) message["reasoning_content"] = reasoning_;
    if (!tc.empty()) message["tool_calls"] = std::move(tc);
    choice["message"] = std::move(message);
    choice["logprobs"] = logprobs_ ? Json{{"content", logprob_items_}} : Json(nullptr);
  } else {
    choice["text"] = content_;
    choice["logprobs"] = logprobs_ ? logprob_items_ : Json(nullptr);
  }
  choice["finish_reason"] = finish;
  if (return_token_ids_) choice["token_ids"] = token_ids_;
  body["choices"] = Json::array({choice});
  body["usage"] = Usage(usage);
  return body;
}

}  // namespace dsv4::openai
