// The DeepSeek-V4 prompt encoder: OpenAI-style messages and tools to the exact prompt text
// DeepSeek's reference encoder (encoding_dsv4.py) produces. Spec:
// shared/design/dsv4-chat-and-tools.md §2 (V4 only).
//
//   BOS {system}[\n\n TOOLS_BLOCK] <｜User｜>{user} <｜Assistant｜><think>   (thinking, generation)
//   ... <｜Assistant｜>{reasoning}</think>{content}[\n\n<｜DSML｜tool_calls>…]<｜end▁of▁sentence｜>
//   <｜User｜><tool_result>{result}</tool_result>\n\n{user text} <｜Assistant｜></think>   (chat)
//
// V4 has no tool role: tool results become <tool_result> blocks of a user turn, in the order of
// the calls they answer. Content is inserted raw: markup inside a message (special-token
// spellings) is not rejected or escaped, as with the reference.
//
// Errors are InvalidArgument whose message starts with the offending field's path in the
// caller's message list, e.g. `messages[3].role: "robot" is not system, developer, user,
// assistant or tool` or `messages[2].tool_calls[0].function.arguments: not valid JSON`.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace dsv4::chat {

struct ToolCall {
  std::string id;    // only orders the tool results that answer it; never in the prompt
  std::string name;
  // A JSON string holding an object's JSON text (the OpenAI wire form), or the object itself.
  // Each top-level key becomes one DSML parameter, in order.
  nlohmann::ordered_json arguments;
};

struct Message {
  std::string role;                  // "system" | "developer" | "user" | "assistant" | "tool"
  std::string content;               // text (list-valued content is flattened by the caller)
  std::string reasoning_content;     // assistant only
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only; unknown or empty ids sort first
};

struct EncodeOptions {
  bool thinking = true;       // thinking mode: generation opens with <think>
  bool drop_thinking = true;  // drop earlier turns' reasoning (never when tools are present)
};

// The prompt for generating the next assistant turn, BOS included (tokenize it without adding
// special tokens). `tools`: each element is the OpenAI `tools[k].function` object as the client
// sent it, key order kept (parse with ordered_json: nlohmann::json sorts keys). An empty list
// means no tools. The conversation must end with a user, developer or tool message.
absl::StatusOr<std::string> EncodeChat(const std::vector<Message>& messages,
                                       const std::vector<nlohmann::ordered_json>& tools,
                                       const EncodeOptions& options);

// The "## Tools" section put after the system (or developer) text, from its heading to its
// trailing newline; one json.dumps line per tool. Exposed for tests.
std::string RenderToolsBlock(const std::vector<nlohmann::ordered_json>& tools);

}  // namespace dsv4::chat
