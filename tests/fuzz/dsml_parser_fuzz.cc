// libFuzzer target for the DeepSeek-V4 turn parser (node/chat/dsml_parser.h).
// Input: one flags byte, then the generated text with fuzzer-chosen structure:
//   flags: bit0 tools on, bits1-2 start (1 kBlock, 2 kInvoke, else kContent), bit3 truncated,
//          bit4 the first delta is reasoning, bit5 an empty tool_names list (any name);
//   text:  0xFF = a split point between deltas, 0xFE = switch the channel, and bytes that never
//          occur in UTF-8 stand for markup pieces (0xF5-0xFD, 0xC0, 0xC1; see kMacros) so that
//          mutations reach deep states; every other invalid UTF-8 becomes U+FFFD (deltas are
//          whole characters).
// Invariants: the deltas split at the chosen points, the whole channel runs and one code point
// per delta all assemble to the same result, which ParseTurn agrees with; the delta conventions
// (first delta of call k: index k, an id, the name, no arguments); with tools on no `｜DSML｜`
// in reasoning or content; visible text is valid UTF-8; every complete call's arguments are a
// JSON object, and without an error every emitted call is complete.
//   clang++ -fsanitize=fuzzer ... && dsml_parser_fuzzer tests/fuzz/corpus/dsml_parser
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/chat/dsml_parser.h"

namespace dsv4::fuzz {
namespace {

using chat::Channel;
using Deltas = std::vector<std::pair<Channel, std::string>>;

struct Macro {
  unsigned char byte;
  const char* text;
};
constexpr Macro kMacros[] = {
    {0xF5, "tool_calls>"},
    {0xF6, "\" string=\"false\">"},
    {0xF7, "\n\n"},
    {0xF8, "<｜DSML｜"},
    {0xF9, "</｜DSML｜"},
    {0xFA, "invoke name=\""},
    {0xFB, "parameter name=\""},
    {0xFC, "\" string=\"true\">"},
    {0xFD, "</think>"},
    {0xC0, "<｜end▁of▁sentence｜>"},
    {0xC1, "get_weather\">"},
};

// The length of the valid UTF-8 character at s[i], or 0.
size_t Utf8Len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = c < 0x80                 ? 1
             : c >= 0xC2 && c <= 0xDF ? 2
             : c >= 0xE0 && c <= 0xEF ? 3
             : c >= 0xF0 && c <= 0xF4 ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  const unsigned char c1 = b(i + 1 < s.size() ? i + 1 : i);
  if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F) || (c == 0xF0 && c1 < 0x90) ||
      (c == 0xF4 && c1 > 0x8F)) {
    return 0;  // overlong, surrogate or beyond U+10FFFF
  }
  return n;
}

bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// Decodes the fuzzer's text into deltas (see the file comment).
Deltas Decode(std::string_view in, Channel first) {
  Deltas out;
  Channel ch = first;
  out.emplace_back(ch, "");
  for (size_t i = 0; i < in.size();) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    if (c == 0xFF || c == 0xFE) {
      if (c == 0xFE) ch = ch == Channel::kContent ? Channel::kReasoning : Channel::kContent;
      out.emplace_back(ch, "");
      ++i;
      continue;
    }
    const char* macro = nullptr;
    for (const Macro& m : kMacros) {
      if (m.byte == c) macro = m.text;
    }
    const size_t n = macro ? 0 : Utf8Len(in, i);
    if (macro) {
      out.back().second += macro;
      ++i;
    } else if (n == 0) {
      out.back().second += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
    } else {
      out.back().second.append(in.substr(i, n));
      i += n;
    }
  }
  return out;
}

struct Assembled {
  std::string reasoning, content;
  std::vector<chat::ParsedTurn::Call> calls;
  int complete = 0;
  std::string error;
  bool operator==(const Assembled& o) const {
    if (reasoning != o.reasoning || content != o.content || complete != o.complete ||
        error != o.error || calls.size() != o.calls.size()) {
      return false;
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments) {
        return false;
      }
    }
    return true;
  }
};

// Names the broken invariant before aborting (libFuzzer then saves the input).
#define DSML_FUZZ_CHECK(cond)                                       \
  do {                                                              \
    if (!(cond)) {                                                  \
      std::fprintf(stderr, "dsml_parser_fuzz: failed %s\n", #cond); \
      std::abort();                                                 \
    }                                                               \
  } while (0)

void Take(const chat::ParsedDelta& d, Assembled* a) {
  a->reasoning += d.reasoning;
  a->content += d.content;
  for (const chat::ToolCallDelta& c : d.tool_calls) {
    if (!c.name.empty()) {
      DSML_FUZZ_CHECK(c.index == static_cast<int>(a->calls.size()) && !c.id.empty() &&
                      c.arguments.empty());
      a->calls.push_back({c.id, c.name, ""});
    } else {
      DSML_FUZZ_CHECK(c.id.empty() && !a->calls.empty() &&
                      c.index == static_cast<int>(a->calls.size()) - 1);
      a->calls.back().arguments += c.arguments;
    }
  }
}

chat::ParserOptions WithIds(chat::ParserOptions o) {
  o.new_call_id = [n = std::make_shared<int>(0)] { return "id" + std::to_string((*n)++); };
  return o;
}

Assembled Run(const chat::ParserOptions& options, const Deltas& deltas, bool truncated) {
  chat::DsmlParser parser(WithIds(options));
  Assembled a;
  for (const auto& [channel, text] : deltas) Take(parser.Feed(channel, text), &a);
  Take(parser.Finish(truncated), &a);
  a.complete = parser.calls();
  a.error = std::string(parser.error().message());
  return a;
}

// accept() without building a document (no recursion); NUL would end its input early.
bool IsJsonObject(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\n\r");
  return first != std::string::npos && s[first] == '{' && s.find('\0') == std::string::npos &&
         nlohmann::json::accept(s);
}

}  // namespace

int DsmlParserOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  chat::ParserOptions options;
  options.tools = flags & 1;
  const int start = (flags >> 1) & 3;
  options.start = start == 1   ? chat::ParserOptions::Start::kBlock
                  : start == 2 ? chat::ParserOptions::Start::kInvoke
                               : chat::ParserOptions::Start::kContent;
  options.forced_name = "get_weather";
  const bool truncated = flags & 8;
  if (!(flags & 32)) options.tool_names = {"get_weather", "create_event", "f"};
  const Deltas split = Decode(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1),
                              flags & 16 ? Channel::kReasoning : Channel::kContent);
  // The same text as one delta per channel run, and as one code point per delta.
  Deltas whole, chars;
  for (const auto& [channel, text] : split) {
    if (whole.empty() || whole.back().first != channel) whole.emplace_back(channel, "");
    whole.back().second += text;
    if (text.empty()) chars.emplace_back(channel, "");  // an empty delta still names its channel
    for (size_t i = 0; i < text.size();) {
      const size_t n = Utf8Len(text, i);
      chars.emplace_back(channel, text.substr(i, n));
      i += n;
    }
  }
  const Assembled a = Run(options, whole, truncated);
  DSML_FUZZ_CHECK(Run(options, split, truncated) == a);
  DSML_FUZZ_CHECK(Run(options, chars, truncated) == a);
  DSML_FUZZ_CHECK(ValidUtf8(a.reasoning) && ValidUtf8(a.content));
  if (options.tools) {
    DSML_FUZZ_CHECK(a.reasoning.find("｜DSML｜") == std::string::npos);
    DSML_FUZZ_CHECK(a.content.find("｜DSML｜") == std::string::npos);
  } else {
    DSML_FUZZ_CHECK(a.calls.empty() && a.error.empty());
  }
  if (a.error.empty()) {
    DSML_FUZZ_CHECK(a.complete == static_cast<int>(a.calls.size()));
    for (const auto& c : a.calls) DSML_FUZZ_CHECK(IsJsonObject(c.arguments));
  }
  const chat::ParsedTurn turn = chat::ParseTurn(WithIds(options), whole, truncated);
  DSML_FUZZ_CHECK(turn.reasoning == a.reasoning && turn.content == a.content);
  DSML_FUZZ_CHECK(std::string(turn.error.message()) == a.error);
  DSML_FUZZ_CHECK(static_cast<int>(turn.calls.size()) == a.complete);
  size_t at = 0;  // the complete calls, in order, among the emitted ones
  for (const auto& c : turn.calls) {
    DSML_FUZZ_CHECK(IsJsonObject(c.arguments));
    while (at < a.calls.size() && a.calls[at].id != c.id) ++at;
    DSML_FUZZ_CHECK(at < a.calls.size() && a.calls[at].name == c.name &&
                    a.calls[at].arguments == c.arguments);
  }
  return 0;
}

}  // namespace dsv4::fuzz

#ifndef DSV4_FUZZ_NO_MAIN
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dsv4::fuzz::DsmlParserOneInput(data, size);
}
#endif
