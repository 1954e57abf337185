#include "node/chat/dsv4_encoding.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/json_util.h"
#include "common/status.h"
#include "node/chat/python_json.h"

namespace dsv4::chat {
namespace {

using OJson = nlohmann::ordered_json;

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kEos[] = "<｜end▁of▁sentence｜>";
constexpr char kUser[] = "<｜User｜>";
constexpr char kAssistant[] = "<｜Assistant｜>";
constexpr char kThinkStart[] = "<think>";
constexpr char kThinkEnd[] = "</think>";

// Deeper arguments are refused before parsing: PythonJsonDumps recurses once per level, and a
// call's arguments never need more.
constexpr int kMaxArgumentsDepth = 64;

// One piece of a merged user turn: a user text, or a tool result and the call it answers.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_call_id;
};

struct Call {
  std::string id;
  std::string name;
  OJson arguments;  // always an object
};

// A message after preprocessing (§2.1): no tool role, user turns made of blocks, calls parsed.
struct Turn {
  std::string role;  // system | developer | user | assistant
  std::string content;
  std::string reasoning;
  std::vector<Block> blocks;  // user
  std::vector<Call> calls;    // assistant
  bool tools = false;         // the request's tools are rendered after this turn's text
};

Turn MakeTurn(std::string role, std::string content = "") {
  Turn t;
  t.role = std::move(role);
  t.content = std::move(content);
  return t;
}

absl::Status Invalid(std::string_view field, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(AV(field), ": ", AV(problem)));
}

std::string Field(size_t i, std::string_view name) {
  return absl::StrCat("messages[", i, "].", AV(name));
}



// §2.6: the arguments as an object. The reference json.loads a string and on failure renders
// the raw text as one `arguments` parameter, which teaches the model to nest its next calls
// (spec §2.6 pitfall); anything that is not an object is refused instead, as vLLM does.
absl::StatusOr<OJson> ArgumentsObject(const OJson& arguments, const std::string& where) {
  if (arguments.is_object()) return arguments;
  if (!arguments.is_string()) {
    return Invalid(where, absl::StrCat("must be a JSON object or a string holding one; got ",
                                       AV(JsonTypeName(arguments))));
  }
  const std::string& text = arguments.get_ref<const std::string&>();
  if (!JsonNestingWithin(text, kMaxArgumentsDepth)) {
    return Invalid(where, absl::StrCat("JSON nested deeper than ", kMaxArgumentsDepth, " levels"));
  }
  // ordered_json keeps the keys in the client's order; a repeated key keeps its first position
  // and its last value, as Python's json.loads does.
  OJson parsed = OJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Invalid(where, "not valid JSON");
  if (!parsed.is_object()) {
    return Invalid(where, absl::StrCat("must hold a JSON object; got ", AV(JsonTypeName(parsed))));
  }
  return parsed;
}

absl::StatusOr<std::vector<Call>> ParseCalls(const Message& m, size_t i) {
  std::vector<Call> calls;
  for (size_t j = 0; j < m.tool_calls.size(); ++j) {
    const ToolCall& tc = m.tool_calls[j];
    const std::string where = absl::StrCat(Field(i, "tool_calls"), "[", j, "].function");
    if (tc.name.empty()) return Invalid(absl::StrCat(where, ".name"), "must not be empty");
    ASSIGN_OR_RETURN(OJson args, ArgumentsObject(tc.arguments, absl::StrCat(where, ".arguments")));
    calls.push_back({tc.id, tc.name, std::move(args)});
  }
  return calls;
}

absl::Status CheckMessage(const Message& m, size_t i) {
  const std::string& r = m.role;
  if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool") {
    return Invalid(Field(i, "role"), absl::StrCat(EchoValue(r),
                                                  " is not system, developer, user, assistant "
                                                  "or tool"));
  }
  // The reference asserts on an empty developer message; its turn would be a bare <｜User｜>.
  if (r == "developer" && m.content.empty()) {
    return Invalid(Field(i, "content"), "a developer message must not be empty");
  }
  // Calls on another role would vanish from the prompt without a word.
  if (r != "assistant" && !m.tool_calls.empty()) {
    return Invalid(Field(i, "tool_calls"), "only an assistant message has tool calls");
  }
  return absl::OkStatus();
}

// A user turn that can take more blocks: every merged user turn can (§2.1 step 2).
bool OpenUserTurn(const std::vector<Turn>& turns) {
  return !turns.empty() && turns.back().role == "user";
}

// §2.1 step 2, with validation: every error names the caller's index, which merging loses.
absl::StatusOr<std::vector<Turn>> MergeMessages(const std::vector<Message>& messages) {
  if (messages.empty()) return Invalid("messages", "must not be empty");
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    RETURN_IF_ERROR(CheckMessage(m, i));
    if (m.role == "tool" || m.role == "user") {
      Block block{m.role == "tool", m.content, m.tool_call_id};
      if (!OpenUserTurn(turns)) turns.push_back(MakeTurn("user"));
      turns.back().blocks.push_back(std::move(block));
      continue;
    }
    Turn t = MakeTurn(m.role, m.content);
    if (m.role == "assistant") {
      t.reasoning = m.reasoning_content;
      ASSIGN_OR_RETURN(t.calls, ParseCalls(m, i));
    }
    turns.push_back(std::move(t));
  }
  const std::string& last = messages.back().role;
  if (last != "user" && last != "developer" && last != "tool") {
    return Invalid(Field(messages.size() - 1, "role"),
                   absl::StrCat("the last message must be user, developer or tool; got ", last));
  }
  return turns;
}

// §2.1 step 3: tool results in the order of the calls of the latest assistant that made calls
// (the model saw the calls in that order). A stable sort: unknown ids rank 0, as in the
// reference, and text blocks keep their places.
void SortToolResults(std::vector<Turn>* turns) {
  std::map<std::string, size_t> rank;
  for (Turn& t : *turns) {
    if (t.role == "assistant" && !t.calls.empty()) {
      rank.clear();
      for (size_t k = 0; k < t.calls.size(); ++k) {
        if (!t.calls[k].id.empty()) rank[t.calls[k].id] = k;
      }
      continue;
    }
    if (t.role != "user" || rank.empty()) continue;
    std::vector<Block> results;
    for (const Block& b : t.blocks) {
      if (b.tool_result) results.push_back(b);
    }
    if (results.size() < 2) continue;
    auto key = [&](const Block& b) {
      auto it = rank.find(b.tool_call_id);
      return it == rank.end() ? size_t{0} : it->second;
    };
    std::stable_sort(results.begin(), results.end(),
                     [&](const Block& a, const Block& b) { return key(a) < key(b); });
    size_t next = 0;
    for (Block& b : t.blocks) {
      if (b.tool_result) b = results[next++];
    }
  }
}

// §2.1 step 1: the tools follow a leading system/developer text, else an empty system turn.
void AttachTools(std::vector<Turn>* turns) {
  if (turns->front().role == "system" || turns->front().role == "developer") {
    turns->front().tools = true;
  } else {
    Turn system = MakeTurn("system");
    system.tools = true;
    turns->insert(turns->begin(), std::move(system));
  }
}

// §2.1 step 4: the last user or developer turn (a tool-result turn is a user turn by now).
size_t LastUserIndex(const std::vector<Turn>& turns) {
  for (size_t i = turns.size(); i-- > 0;) {
    if (turns[i].role == "user" || turns[i].role == "developer") return i;
  }
  return 0;  // unreachable: MergeMessages requires the conversation to end with one
}

// §2.1 step 6: earlier reasoning goes, and so do developer turns before the last user turn.
void DropThinking(std::vector<Turn>* turns) {
  const size_t last_user = LastUserIndex(*turns);
  std::vector<Turn> kept;
  for (size_t i = 0; i < turns->size(); ++i) {
    Turn& t = (*turns)[i];
    if (i < last_user && t.role == "developer") continue;
    if (i < last_user && t.role == "assistant") t.reasoning.clear();
    kept.push_back(std::move(t));
  }
  *turns = std::move(kept);
}

std::string RenderParameter(const std::string& key, const OJson& value) {
  // The flag follows the value's JSON type, not the schema: strings go in raw, unquoted.
  const bool is_string = value.is_string();
  return absl::StrCat("<｜DSML｜parameter name=\"", key, "\" string=\"",
                      is_string ? "true" : "false", "\">",
                      is_string ? value.get_ref<const std::string&>() : PythonJsonDumps(value),
                      "</｜DSML｜parameter>");
}

// §2.6: "\n\n" + the DSML block; zero parameters leave an empty line inside the invoke.
std::string RenderCalls(const std::vector<Call>& calls) {
  std::vector<std::string> invokes;
  for (const Call& c : calls) {
    std::vector<std::string> params;
    for (auto it = c.arguments.begin(); it != c.arguments.end(); ++it) {
      params.push_back(RenderParameter(it.key(), it.value()));
    }
    invokes.push_back(absl::StrCat("<｜DSML｜invoke name=\"", c.name, "\">\n",
                                   absl::StrJoin(params, "\n"), "\n</｜DSML｜invoke>"));
  }
  return absl::StrCat("\n\n<｜DSML｜tool_calls>\n", absl::StrJoin(invokes, "\n"),
                      "\n</｜DSML｜tool_calls>");
}

std::string RenderUser(const Turn& t) {
  std::vector<std::string> parts;
  for (const Block& b : t.blocks) {
    parts.push_back(b.tool_result ? absl::StrCat("<tool_result>", b.text, "</tool_result>")
                                  : b.text);
  }
  return absl::StrCat(kUser, absl::StrJoin(parts, "\n\n"));
}

struct RenderState {
  const std::vector<nlohmann::ordered_json>& tools;
  bool thinking;
  bool drop_thinking;  // effective: requested and no tools
  size_t last_user;
};

// §2.2 for turn i, then the §2.3 transition when an assistant turn follows or generation does.
std::string RenderTurn(const std::vector<Turn>& turns, size_t i, const RenderState& s) {
  const Turn& t = turns[i];
  std::string out;
  const std::string tools =
      t.tools ? absl::StrCat("\n\n", RenderToolsBlock(s.tools)) : std::string();
  if (t.role == "system") {
    absl::StrAppend(&out, t.content, tools);
  } else if (t.role == "developer") {
    absl::StrAppend(&out, kUser, t.content, tools);
  } else if (t.role == "user") {
    out = RenderUser(t);
  } else {  // assistant; its <think> came with the previous turn's transition
    if (s.thinking && (!s.drop_thinking || i > s.last_user)) {
      absl::StrAppend(&out, t.reasoning, kThinkEnd);
    }
    absl::StrAppend(&out, t.content, t.calls.empty() ? "" : RenderCalls(t.calls), kEos);
  }
  const bool assistant_next = i + 1 == turns.size() || turns[i + 1].role == "assistant";
  if (assistant_next && (t.role == "user" || t.role == "developer")) {
    const bool open_think = s.thinking && (!s.drop_thinking || i >= s.last_user);
    absl::StrAppend(&out, kAssistant, open_think ? kThinkStart : kThinkEnd);
  }
  return out;
}

}  // namespace

std::string RenderToolsBlock(const std::vector<nlohmann::ordered_json>& tools) {
  std::vector<std::string> schemas;
  for (const auto& tool : tools) schemas.push_back(PythonJsonDumps(tool));
  return absl::StrCat(
      "## Tools\n\n"
      "You have access to a set of tools to help answer the user's question. You can invoke "
      "tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
      "<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
      "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
      "</｜DSML｜parameter>\n"
      "...\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
      "...\n"
      "</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>\n\n"
      "String parameters should be specified as is and set `string=\"true\"`. For all other "
      "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\n"
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete "
      "reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
      "Otherwise, output directly after </think> with tool calls or final response.\n\n"
      "### Available Tool Schemas\n\n",
      absl::StrJoin(schemas, "\n"),
      "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
      "tool calls.\n");
}

absl::StatusOr<std::string> EncodeChat(const std::vector<Message>& messages,
                                       const std::vector<nlohmann::ordered_json>& tools,
                                       const EncodeOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Turn> turns, MergeMessages(messages));
  SortToolResults(&turns);
  const bool has_tools = !tools.empty();
  if (has_tools) AttachTools(&turns);
  // With tools every earlier reasoning stays (interleaved thinking, §2.1 step 5).
  const bool drop = options.drop_thinking && !has_tools;
  if (options.thinking && drop) DropThinking(&turns);
  const RenderState state{tools, options.thinking, drop, LastUserIndex(turns)};
  std::string out = kBos;
  for (size_t i = 0; i < turns.size(); ++i) out += RenderTurn(turns, i, state);
  return out;
}

}  // namespace dsv4::chat
