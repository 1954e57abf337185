// The DeepSeek-V4 chat format of the gRPC chat input (architecture.md §5), rendered by
// node/chat/dsv4_encoding.h:
//
//   <｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>
//   <｜User｜>{user}<｜Assistant｜><think>            (thinking on: generation starts reasoning)
//   <｜User｜>{user}<｜Assistant｜></think>           (thinking off: generation starts in content)
//
// Past assistant turns keep only their answer: any reasoning up to their last </think> is dropped.
// The rendered text is tokenized as a whole, so special-token spellings inside messages become
// special tokens, as with the reference encoder.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4 {

struct ChatTurn {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;
};

inline constexpr char kBosText[] = "<｜begin▁of▁sentence｜>";
inline constexpr char kEosText[] = "<｜end▁of▁sentence｜>";
inline constexpr char kUserText[] = "<｜User｜>";
inline constexpr char kAssistantText[] = "<｜Assistant｜>";
inline constexpr char kThinkStartText[] = "<think>";
inline constexpr char kThinkEndText[] = "</think>";

// Renders a conversation. Rules: an optional system message first, then user and assistant turns
// alternating from a user turn, ending with a user turn. Violations are InvalidArgument naming
// `messages[i].role`.
absl::StatusOr<std::string> RenderChat(const std::vector<ChatTurn>& messages, bool thinking);

}  // namespace dsv4
