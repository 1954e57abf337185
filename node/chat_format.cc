#include "node/chat_format.h"

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "node/chat/dsv4_encoding.h"

namespace dsv4 {
namespace {

// The gRPC chat shape: an optional leading system message, then user and assistant turns
// alternating from a user turn and ending with one. Stricter than EncodeChat, and its error
// messages are part of the public gRPC behaviour (tests pin them).
absl::Status CheckTurns(const std::vector<ChatTurn>& messages) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: at least one message is needed");
  bool expect_user = true;
  for (size_t i = messages[0].role == "system" ? 1 : 0; i < messages.size(); ++i) {
    const ChatTurn& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "].role");
    if (m.role != "user" && m.role != "assistant" && m.role != "system") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", EchoValue(m.role), " is not system, user or assistant"));
    }
    if (m.role == "system") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": system is only allowed first"));
    }
    if ((m.role == "user") != expect_user) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected a ",
                                                     expect_user ? "user" : "assistant",
                                                     " turn (turns alternate, starting with user)"));
    }
    expect_user = !expect_user;
  }
  if (expect_user) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", messages.size() - 1, "].role: the last message must be a user turn"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const std::vector<ChatTurn>& messages, bool thinking) {
  if (absl::Status s = CheckTurns(messages); !s.ok()) return s;
  std::vector<chat::Message> converted;
  converted.reserve(messages.size());
  for (const ChatTurn& m : messages) {
    chat::Message msg;
    msg.role = m.role;
    msg.content = m.content;
    // A past assistant turn arrives as generated: "reasoning</think>answer". Everything up to
    // its last </think> is reasoning, which EncodeChat drops from turns before the last user
    // turn (all of them here: the conversation ends with a user turn).
    const size_t end = m.role == "assistant" ? m.content.rfind(kThinkEndText) : std::string::npos;
    if (end != std::string::npos) {
      msg.reasoning_content = m.content.substr(0, end);
      msg.content = m.content.substr(end + sizeof(kThinkEndText) - 1);
    }
    converted.push_back(std::move(msg));
  }
  chat::EncodeOptions options;
  options.thinking = thinking;
  options.drop_thinking = true;
  return chat::EncodeChat(converted, /*tools=*/{}, options);
}

}  // namespace dsv4
