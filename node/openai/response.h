// One OpenAI request's answer, fed by the engine (a RequestSink on the engine thread): the
// generated text goes through the DSML parser (reasoning / content / tool calls) and leaves
// either as server-sent events (stream: a chunk per engine response, `data: [DONE]` last) or as
// one JSON body when the request ends. The shapes are OpenAI's (chat.completion,
// chat.completion.chunk, text_completion) with DeepSeek's `reasoning_content`.
//
// How a request ends, in the API's words: STOP (and the repetition detector's stop) is
// "tool_calls" when the turn made calls, else "stop"; LENGTH is "length"; a tool call the model
// got wrong (a parser error) is an error (500 `invalid_tool_call`, or an error event in the
// stream) and never raw markup in the content; a request cancelled by a drain is 503 (or an error
// event); ERROR is 500.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/chat/dsml_parser.h"
#include "node/engine.h"
#include "node/http/http_server.h"
#include "node/openai/request.h"
#include "node/tokenizer/tokenizer.h"

namespace dsv4::openai {

struct ResponseMeta {
  std::string id;     // "chatcmpl-..." / "cmpl-..."
  std::string model;  // the served model name
  int64_t created = 0;
};

class ResponseSink final : public RequestSink {
 public:
  // `on_done` runs once with the answer's HTTP status when the engine emitted the request's final
  // event (the client's quota slot, metrics); never when the engine did not take the request.
  ResponseSink(const ApiRequest& request, ResponseMeta meta,
               std::shared_ptr<http::Responder> responder, const Tokenizer* tokenizer,
               std::function<void(int status)> on_done);
  // Sends the stream's head and first chunk (streaming requests), once the engine took the request.
  void Begin();
  void Emit(v1::GenerateResponse response, bool last) override;

 private:
  using Json = nlohmann::ordered_json;
  void StartStream();  // mu_ held
  void OnChunk(const v1::Chunk& chunk);
  void OnFinished(const v1::Finished& finished);
  void OnError(int status, const std::string& type, const std::string& code, const std::string& message);
  // The parsed delta as a stream chunk's delta, or accumulated for the whole answer.
  void Deliver(const chat::ParsedDelta& delta, Json logprobs, const v1::Chunk* chunk = nullptr);
  Json Head(const char* object) const;  // id, object, created, model
  Json ChunkEnvelope() const;
  // The answer as one chat.completion / text_completion body.
  Json WholeBody(const char* finish, const v1::Usage& usage) const;
  void SendEvent(const Json& event);
  void EndStream();
  Json LogprobsJson(const v1::Chunk& chunk);
  Json Usage(const v1::Usage& usage) const;
  void Done();

  const Endpoint endpoint_;
  const bool stream_;
  const bool include_usage_;
  const bool thinking_;
  const bool logprobs_;
  const int32_t top_logprobs_;
  const bool return_token_ids_;
  const ResponseMeta meta_;
  std::shared_ptr<http::Responder> responder_;
  const Tokenizer* tokenizer_;
  std::function<void(int)> on_done_;
  int status_ = 200;
  chat::DsmlParser parser_;

  std::mutex mu_;
  bool begun_ = false;
  bool ended_ = false;
  // The whole answer (not streamed).
  std::string reasoning_, content_;
  std::vector<chat::ToolCallDelta> calls_;  // merged per call index
  Json logprob_items_ = Json::array();      // chat: content[]; completions: parallel arrays
  Json token_ids_ = Json::array();          // return_token_ids
  int64_t text_offset_ = 0;
};

}  // namespace dsv4::openai
