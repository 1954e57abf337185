#include "node/chat_format.h"

#include "absl/strings/str_cat.h"
#include "common/echo.h"

namespace dsv4 {

absl::StatusOr<std::string> RenderChat(const std::vector<ChatTurn>& messages, bool thinking) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: at least one message is needed");
  std::string out = kBosText;
  size_t i = 0;
  if (messages[0].role == "system") {
    out += messages[0].content;
    i = 1;
  }
  bool expect_user = true;
  for (; i < messages.size(); ++i) {
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
    if (m.role == "user") {
      absl::StrAppend(&out, kUserText, m.content, kAssistantText);
    } else {
      // Earlier reasoning is dropped: keep what follows the last </think>.
      std::string answer = m.content;
      const size_t end = answer.rfind(kThinkEndText);
      if (end != std::string::npos) answer = answer.substr(end + sizeof(kThinkEndText) - 1);
      absl::StrAppend(&out, kThinkEndText, answer, kEosText);
    }
    expect_user = !expect_user;
  }
  if (expect_user) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages[", messages.size() - 1, "].role: the last message must be a user turn"));
  }
  out += thinking ? kThinkStartText : kThinkEndText;
  return out;
}

}  // namespace dsv4
