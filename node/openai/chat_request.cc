// The chat-specific half of request.h: messages, tools, tool_choice and the thinking switch,
// rendered into the DeepSeek-V4 prompt.
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/status.h"
#include "node/chat/dsv4_encoding.h"
#include "node/openai/json_fields.h"
#include "node/openai/request.h"

namespace dsv4::openai {
namespace {

// Message content: a string, or a list of {"type": "text", "text": ...} parts joined.
absl::StatusOr<std::string> ContentText(const Json* content, const std::string& path,
                                        const char* separator) {
  if (content == nullptr) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) return Invalid(path, "must be a string or an array of content parts");
  std::string text;
  for (size_t k = 0; k < content->size(); ++k) {
    const Json& part = (*content)[k];
    const std::string at = absl::StrCat(path, "[", k, "]");
    if (!part.is_object()) return Invalid(at, "must be a content part object");
    const Json* type = Member(part, "type");
    if (type == nullptr || !type->is_string()) return Invalid(at + ".type", "required (\"text\")");
    if (*type != "text") {
      return Invalid(at + ".type", absl::StrCat(EchoValue(type->get<std::string>()),
                                                " is not supported (text parts only)"));
    }
    const Json* t = Member(part, "text");
    if (t == nullptr || !t->is_string()) return Invalid(at + ".text", "must be a string");
    if (k > 0) text += separator;
    text += t->get<std::string>();
  }
  return text;
}

// Spellings of the chat format's own tokens and markup (DeepSeek's reference parser refuses
// them in messages too): in a message they would be tokenized as those tokens and could forge a
// turn, a reasoning block or a tool call (a tool result is often untrusted web text).
absl::Status CheckNoMarkup(const std::string& text, const std::string& path) {
  static const char* kMarkup[] = {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                                  "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"};
  for (const char* m : kMarkup) {
    if (text.find(m) != std::string::npos) {
      return Invalid(path, absl::StrCat("contains \"", m, "\", markup of the chat format that a message may not carry"));
    }
  }
  return absl::OkStatus();
}

// OpenAI's rule for function names; also keeps them safe inside the DSML name="..." attribute.
bool ValidToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<chat::ToolCall> ParseToolCall(const Json& call, const std::string& path) {
  if (!call.is_object()) return Invalid(path, "must be an object");
  chat::ToolCall tc;
  if (const Json* id = Member(call, "id")) {
    if (!id->is_string()) return Invalid(path + ".id", "must be a string");
    tc.id = id->get<std::string>();
  }
  if (const Json* type = Member(call, "type"); type != nullptr && *type != "function") {
    return Invalid(path + ".type", "must be \"function\"");
  }
  const Json* fn = Member(call, "function");
  if (fn == nullptr || !fn->is_object()) return Invalid(path + ".function", "required (an object)");
  const Json* name = Member(*fn, "name");
  if (name == nullptr || !name->is_string()) return Invalid(path + ".function.name", "must be a string");
  tc.name = name->get<std::string>();
  if (!ValidToolName(tc.name)) {
    return Invalid(path + ".function.name", "1-64 characters of a-z, A-Z, 0-9, _ and -");
  }
  if (const Json* args = Member(*fn, "arguments")) {
    // The history's arguments are rendered raw into the prompt (keys and string values).
    RETURN_IF_ERROR(CheckNoMarkup(args->is_string() ? args->get<std::string>() : args->dump(),
                                  path + ".function.arguments"));
    if (!args->is_string() && !args->is_object()) {
      return Invalid(path + ".function.arguments", "must be a JSON string or an object");
    }
    tc.arguments = *args;
  } else {
    tc.arguments = Json::object();
  }
  return tc;
}

absl::StatusOr<chat::Message> ParseMessage(const Json& m, size_t i) {
  const std::string path = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return Invalid(path, "must be an object");
  const Json* role = Member(m, "role");
  if (role == nullptr || !role->is_string()) return Invalid(path + ".role", "required (a string)");
  chat::Message msg;
  msg.role = role->get<std::string>();
  if (msg.role != "system" && msg.role != "developer" && msg.role != "user" &&
      msg.role != "assistant" && msg.role != "tool") {
    return Invalid(path + ".role", absl::StrCat(EchoValue(msg.role),
                                                " is not system, developer, user, assistant or tool"));
  }
  const Json* content = Member(m, "content");
  if (content == nullptr && msg.role != "assistant") return Invalid(path + ".content", "required");
  // A tool result's text parts are joined by blank lines (the reference encoder's rule), others'
  // concatenated.
  ASSIGN_OR_RETURN(msg.content,
                   ContentText(content, path + ".content", msg.role == "tool" ? "\n\n" : ""));
  RETURN_IF_ERROR(CheckNoMarkup(msg.content, path + ".content"));
  if (msg.role == "assistant") {
    // DeepSeek's field, and vLLM's newer name for it.
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (const Json* r = Member(m, key)) {
        if (!r->is_string()) return Invalid(absl::StrCat(path, ".", key), "must be a string");
        msg.reasoning_content = r->get<std::string>();
        RETURN_IF_ERROR(CheckNoMarkup(msg.reasoning_content, absl::StrCat(path, ".", key)));
        break;
      }
    }
    if (const Json* calls = Member(m, "tool_calls")) {
      if (!calls->is_array()) return Invalid(path + ".tool_calls", "must be an array");
      for (size_t k = 0; k < calls->size(); ++k) {
        ASSIGN_OR_RETURN(chat::ToolCall tc,
                         ParseToolCall((*calls)[k], absl::StrCat(path, ".tool_calls[", k, "]")));
        msg.tool_calls.push_back(std::move(tc));
      }
    }
  }
  if (msg.role == "tool") {
    // Required as in OpenAI's API: it orders the results after the calls (dsv4_encoding.h).
    const Json* id = Member(m, "tool_call_id");
    if (id == nullptr || !id->is_string()) return Invalid(path + ".tool_call_id", "required (a string)");
    msg.tool_call_id = id->get<std::string>();
  }
  return msg;
}

absl::Status ParseTools(const Json& j, const ParseLimits& limits, std::vector<Json>* tools,
                        std::vector<std::string>* names) {
  const Json* t = Member(j, "tools");
  if (t == nullptr) return absl::OkStatus();
  if (!t->is_array()) return Invalid("tools", "must be an array");
  if (static_cast<int32_t>(t->size()) > limits.max_tools) {
    return Invalid("tools", absl::StrCat("at most ", limits.max_tools, " tools, got ", t->size()));
  }
  for (size_t k = 0; k < t->size(); ++k) {
    const Json& tool = (*t)[k];
    const std::string path = absl::StrCat("tools[", k, "]");
    if (!tool.is_object()) return Invalid(path, "must be an object");
    const Json* type = Member(tool, "type");
    if (type == nullptr || *type != "function") return Invalid(path + ".type", "must be \"function\"");
    const Json* fn = Member(tool, "function");
    if (fn == nullptr || !fn->is_object()) return Invalid(path + ".function", "required (an object)");
    const Json* name = Member(*fn, "name");
    if (name == nullptr || !name->is_string() || !ValidToolName(name->get<std::string>())) {
      return Invalid(path + ".function.name", "required: 1-64 characters of a-z, A-Z, 0-9, _ and -");
    }
    if (const Json* d = Member(*fn, "description"); d != nullptr && !d->is_string()) {
      return Invalid(path + ".function.description", "must be a string");
    }
    if (const Json* p = Member(*fn, "parameters"); p != nullptr && !p->is_object()) {
      return Invalid(path + ".function.parameters", "must be a JSON Schema object");
    }
    for (const std::string& seen : *names) {
      if (seen == name->get<std::string>()) {
        return Invalid(path + ".function.name", absl::StrCat("duplicate tool ", EchoValue(seen)));
      }
    }
    names->push_back(name->get<std::string>());
    tools->push_back(*fn);
  }
  return absl::OkStatus();
}

enum class Choice { kAuto, kNone, kRequired, kNamed };

absl::StatusOr<Choice> ParseToolChoice(const Json& j, const std::vector<std::string>& names,
                                       std::string* forced) {
  const Json* c = Member(j, "tool_choice");
  if (c == nullptr) return Choice::kAuto;
  Choice choice;
  if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "auto") choice = Choice::kAuto;
    else if (s == "none") choice = Choice::kNone;
    else if (s == "required") choice = Choice::kRequired;
    else return Invalid("tool_choice", absl::StrCat(EchoValue(s), " is not none, auto, required or a function"));
  } else if (c->is_object()) {
    const Json* fn = Member(*c, "function");
    const Json* name = fn != nullptr && fn->is_object() ? Member(*fn, "name") : nullptr;
    if (name == nullptr || !name->is_string()) {
      return Invalid("tool_choice.function.name", "required (a string)");
    }
    *forced = name->get<std::string>();
    if (std::find(names.begin(), names.end(), *forced) == names.end()) {
      return Invalid("tool_choice.function.name",
                     absl::StrCat(EchoValue(*forced), " is not one of the request's tools"));
    }
    choice = Choice::kNamed;
  } else {
    return Invalid("tool_choice", "must be a string or an object");
  }
  if ((choice == Choice::kRequired || choice == Choice::kNamed) && names.empty()) {
    return Invalid("tool_choice", "needs tools");
  }
  return choice;
}

// Thinking is on unless the request turns it off, as DeepSeek's API and vLLM do for V4.
absl::StatusOr<bool> ParseThinking(const Json& j) {
  if (const Json* t = Member(j, "thinking")) {
    if (t->is_boolean()) return t->get<bool>();
    const Json* type = t->is_object() ? Member(*t, "type") : nullptr;
    if (type == nullptr || !type->is_string() || (*type != "enabled" && *type != "disabled")) {
      return Invalid("thinking", "must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}");
    }
    return *type == "enabled";
  }
  if (const Json* k = Member(j, "chat_template_kwargs")) {
    if (!k->is_object()) return Invalid("chat_template_kwargs", "must be an object");
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (const Json* v = Member(*k, key)) {
        if (!v->is_boolean()) return Invalid(absl::StrCat("chat_template_kwargs.", key), "must be a boolean");
        return v->get<bool>();
      }
    }
  }
  if (const Json* e = Member(j, "reasoning_effort")) {
    static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "max", "xhigh"};
    if (!e->is_string() ||
        std::none_of(std::begin(kEfforts), std::end(kEfforts), [&](const char* s) { return *e == s; })) {
      return Invalid("reasoning_effort", "must be one of none, minimal, low, medium, high, max, xhigh");
    }
    return *e != "none";
  }
  return true;
}

}  // namespace

namespace internal {

absl::Status ParseChatBody(const Json& j, const ParseLimits& limits, ApiRequest* out) {
  const Json* messages = Member(j, "messages");
  if (messages == nullptr) return Invalid("messages", "required");
  if (!messages->is_array()) return Invalid("messages", "must be an array");
  if (messages->empty()) return Invalid("messages", "must not be empty");
  if (static_cast<int32_t>(messages->size()) > limits.max_messages) {
    return Invalid("messages", absl::StrCat("at most ", limits.max_messages, " messages, got ", messages->size()));
  }
  std::vector<chat::Message> msgs;
  for (size_t i = 0; i < messages->size(); ++i) {
    ASSIGN_OR_RETURN(chat::Message m, ParseMessage((*messages)[i], i));
    msgs.push_back(std::move(m));
  }
  std::vector<Json> tools;
  std::vector<std::string> names;
  RETURN_IF_ERROR(ParseTools(j, limits, &tools, &names));
  std::string forced;
  ASSIGN_OR_RETURN(const Choice choice, ParseToolChoice(j, names, &forced));
  ASSIGN_OR_RETURN(out->thinking, ParseThinking(j));
  if (const Json* rf = Member(j, "response_format")) {
    const Json* type = rf->is_object() ? Member(*rf, "type") : nullptr;
    if (type == nullptr || *type != "text") {
      return Invalid("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  // tool_choice none: the tools stay out of the prompt and the parser is off, as in DeepSeek's API.
  if (choice == Choice::kNone) tools.clear();
  chat::EncodeOptions eo;
  eo.thinking = out->thinking;
  ASSIGN_OR_RETURN(std::string prompt, chat::EncodeChat(msgs, tools, eo));
  chat::ParserOptions& p = out->parser;
  p.tools = !tools.empty();
  p.tool_names = names;
  if (choice == Choice::kRequired || choice == Choice::kNamed) {
    // The turn starts at the block: an empty reasoning (thinking) and the opener; for a named
    // choice also that function's invoke tag.
    if (out->thinking) prompt += "</think>";
    prompt += "\n\n<｜DSML｜tool_calls>\n";
    p.start = chat::ParserOptions::Start::kBlock;
    if (choice == Choice::kNamed) {
      absl::StrAppend(&prompt, "<｜DSML｜invoke name=\"", forced, "\">\n");
      p.start = chat::ParserOptions::Start::kInvoke;
      p.forced_name = forced;
    }
    out->thinking = false;
  }
  out->generate.set_text(std::move(prompt));
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace dsv4::openai
