// The OpenAI request bodies (POST /v1/chat/completions, POST /v1/completions) turned into what
// the engine runs: a dsv4.v1.GenerateRequest (the rendered prompt, sampling, lengths, stops) that
// then goes through the same ValidateRequest as a gRPC request, plus what the response needs
// (streaming, logprobs, the DSML parser's options). Every field a client can get wrong is checked
// here with an InvalidArgument whose message starts with the field's path in the body
// ("messages[2].tool_calls[0].function.name: ..."); unknown fields are ignored, as vLLM does.
//
// DeepSeek-V4 semantics (docs/openai-api.md): thinking is on unless the request turns it off
// (`thinking: {"type": "disabled"}` or false, `chat_template_kwargs.thinking` /
// `.enable_thinking` false, `reasoning_effort: "none"`); tools go into the prompt in the DSML
// format (node/chat/dsv4_encoding.h) unless tool_choice is "none"; tool_choice "required" and a
// named function end the prompt inside the tool-call block (the model's turn starts at an empty
// reasoning and the block opener, or at the named invoke), which is how the choice is enforced
// without a grammar.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "dsv4/v1/dsv4.pb.h"
#include "node/chat/dsml_parser.h"

namespace dsv4::openai {

enum class Endpoint { kChat, kCompletion };

struct ApiRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool thinking = false;       // chat: the prompt opens a reasoning block
  // Logprobs asked for: chat `logprobs: true` (+ top_logprobs), completions `logprobs: N`.
  bool logprobs = false;
  int32_t top_logprobs = 0;
  // vLLM's extension: each choice (and stream chunk) carries the generated token ids, and a
  // stream sends a chunk for every engine step's tokens even when their text is held back.
  bool return_token_ids = false;
  v1::GenerateRequest generate;
  chat::ParserOptions parser;  // chat only
};

struct ParseLimits {
  int32_t max_messages = 1024;
  int32_t max_tools = 128;
  int32_t max_nesting = 64;      // of the JSON body
  int32_t max_logprobs = 20;
};

absl::StatusOr<ApiRequest> ParseChatRequest(std::string_view body, const ParseLimits& limits);
absl::StatusOr<ApiRequest> ParseCompletionRequest(std::string_view body, const ParseLimits& limits);

// The node's field paths (request_validation.h) in the API's words: "sampling.top_p" -> "top_p",
// "input.text" -> "messages" or "prompt", "input.token_ids.ids[3]" -> "prompt[3]".
std::string ChatFieldName(const std::string& node_field);
std::string CompletionFieldName(const std::string& node_field);

}  // namespace dsv4::openai
