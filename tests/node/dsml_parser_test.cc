#include "node/chat/dsml_parser.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"

namespace dsv4::chat {
namespace {

using Deltas = std::vector<std::pair<Channel, std::string>>;
using nlohmann::json;

constexpr Channel kR = Channel::kReasoning;
constexpr Channel kC = Channel::kContent;

ParserOptions Tools(std::vector<std::string> names = {"get_weather", "create_event"}) {
  ParserOptions o;
  o.tools = true;
  o.tool_names = std::move(names);
  return o;
}

// What a client would assemble from the stream, checked against the delta conventions.
struct Result {
  std::string reasoning, content;
  std::vector<ParsedTurn::Call> calls;  // every emitted call, by index (complete or not)
  int complete = 0;
  std::string error;

  std::string Dump() const {
    std::string s = "reasoning=[" + reasoning + "] content=[" + content + "]";
    for (const auto& c : calls) s += " call{" + c.id + "," + c.name + "," + c.arguments + "}";
    return s + " complete=" + std::to_string(complete) + " error=[" + error + "]";
  }
};

void Collect(const ParsedDelta& d, Result* r) {
  r->reasoning += d.reasoning;
  r->content += d.content;
  for (const ToolCallDelta& c : d.tool_calls) {
    if (!c.name.empty()) {
      // A call's first delta: the next index, with an id and empty arguments.
      ASSERT_EQ(c.index, static_cast<int>(r->calls.size()));
      ASSERT_FALSE(c.id.empty());
      ASSERT_EQ(c.arguments, "");
      r->calls.push_back({c.id, c.name, ""});
    } else {
      ASSERT_TRUE(c.id.empty());
      ASSERT_EQ(c.index, static_cast<int>(r->calls.size()) - 1);
      r->calls.back().arguments += c.arguments;
    }
  }
}

// Deterministic ids, fresh for every parser, so that runs compare equal.
ParserOptions WithIds(ParserOptions o) {
  o.new_call_id = [n = std::make_shared<int>(0)] { return "call_" + std::to_string((*n)++); };
  return o;
}

Result Stream(const ParserOptions& options, const Deltas& deltas, bool truncated = false) {
  DsmlParser p(WithIds(options));
  Result r;
  for (const auto& [channel, text] : deltas) Collect(p.Feed(channel, text), &r);
  Collect(p.Finish(truncated), &r);
  r.complete = p.calls();
  r.error = std::string(p.error().message());
  return r;
}

// Byte offsets of the code point boundaries inside `s` (excluding 0 and size).
std::vector<size_t> Boundaries(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 1; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  return out;
}

// Streams `deltas` whole, split in two at every code point of every delta, and one code point
// per delta; all must assemble to the same result, which also agrees with ParseTurn.
Result EverySplit(const ParserOptions& options, const Deltas& deltas, bool truncated = false) {
  const Result whole = Stream(options, deltas, truncated);
  for (size_t i = 0; i < deltas.size(); ++i) {
    for (size_t at : Boundaries(deltas[i].second)) {
      Deltas split(deltas.begin(), deltas.begin() + i);
      split.emplace_back(deltas[i].first, deltas[i].second.substr(0, at));
      split.emplace_back(deltas[i].first, deltas[i].second.substr(at));
      split.insert(split.end(), deltas.begin() + i + 1, deltas.end());
      const Result r = Stream(options, split, truncated);
      EXPECT_EQ(r.Dump(), whole.Dump()) << "delta " << i << " split at byte " << at;
      if (r.Dump() != whole.Dump()) return whole;
    }
  }
  Deltas chars;
  for (const auto& [channel, text] : deltas) {
    size_t from = 0;
    for (size_t at : Boundaries(text)) {
      chars.emplace_back(channel, text.substr(from, at - from));
      from = at;
    }
    chars.emplace_back(channel, text.substr(from));
  }
  EXPECT_EQ(Stream(options, chars, truncated).Dump(), whole.Dump()) << "one code point per delta";
  // The non-streaming form: same text, only the complete calls.
  const ParsedTurn turn = ParseTurn(WithIds(options), deltas, truncated);
  EXPECT_EQ(turn.reasoning, whole.reasoning);
  EXPECT_EQ(turn.content, whole.content);
  EXPECT_EQ(static_cast<int>(turn.calls.size()), whole.complete);
  EXPECT_EQ(std::string(turn.error.message()), whole.error);
  for (const auto& c : turn.calls) {
    bool found = false;
    for (const auto& w : whole.calls) found |= w.id == c.id && w.arguments == c.arguments;
    EXPECT_TRUE(found) << c.id << " " << c.arguments;
    EXPECT_TRUE(json::parse(c.arguments, nullptr, false).is_object()) << c.arguments;
  }
  // With tools on, no markup in the visible text.
  if (options.tools) {
    EXPECT_EQ(whole.content.find("｜DSML｜"), std::string::npos) << whole.content;
    EXPECT_EQ(whole.reasoning.find("｜DSML｜"), std::string::npos) << whole.reasoning;
  }
  return whole;
}

void ExpectArgs(const ParsedTurn::Call& call, const std::string& name, const char* expected) {
  EXPECT_EQ(call.name, name);
  const json got = json::parse(call.arguments, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << call.arguments;
  EXPECT_EQ(got, json::parse(expected)) << call.arguments;
}

const char kWeatherRome[] =
    "\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"unit\" string=\"true\">fahrenheit</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

const char kCreateEvent[] =
    "\n\n<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"create_event\">\n"
    "<｜DSML｜parameter name=\"title\" string=\"true\">Team sync: \"Q3\" "
    "<draft></｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"details\" string=\"false\">{\"duration_min\": 30, \"attendees\": "
    "[\"ana\", \"bo\"]}</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>";

const char kOsloCall[] =
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n";

// §10.1: thinking mode; the </think> token separates the channels.
TEST(DsmlParser, Example101ThinkingToolCall) {
  const Result r =
      EverySplit(Tools(), {{kR, "The user wants Rome in fahrenheit. Call get_weather again."},
                           {kC, std::string(kWeatherRome) + "<｜end▁of▁sentence｜>"}});
  EXPECT_EQ(r.reasoning, "The user wants Rome in fahrenheit. Call get_weather again.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Rome", "unit": "fahrenheit"})");  // reference bytes
  ExpectArgs(r.calls[0], "get_weather", R"({"city":"Rome","unit":"fahrenheit"})");
  EXPECT_EQ(r.complete, 1);
  EXPECT_EQ(r.error, "");
}

// §10.2: a raw string value with quotes and '<', and a JSON object value.
TEST(DsmlParser, Example102StringAndObjectParameters) {
  const Result r = EverySplit(
      Tools(), {{kR, "The user wants a 30-minute sync with Ana and Bo."}, {kC, kCreateEvent}});
  EXPECT_EQ(r.reasoning, "The user wants a 30-minute sync with Ana and Bo.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments,
            R"({"title": "Team sync: \"Q3\" <draft>", "details": {"duration_min": 30, )"
            R"("attendees": ["ana", "bo"]}})");
  ExpectArgs(r.calls[0], "create_event",
             R"({"title": "Team sync: \"Q3\" <draft>", "details": {"duration_min": 30,
                 "attendees": ["ana", "bo"]}})");
}

// §10.2's delta sequence: string text streams as it comes, only a possible closer is held.
TEST(DsmlParser, StringValueStreamsAndHoldsOnlyCloserPrefixes) {
  DsmlParser p(WithIds(Tools()));
  EXPECT_TRUE(p.Feed(kR, "Thinking.").reasoning == "Thinking.");
  ParsedDelta d = p.Feed(kC, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"create_event\">\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "create_event");
  EXPECT_EQ(d.tool_calls[0].id, "call_0");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  d = p.Feed(kC, "<｜DSML｜parameter name=\"title\" string=\"true\">Team sync: \"Q3\" <");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"title": "Team sync: \"Q3\" )");  // '<' held
  d = p.Feed(kC, "draft>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "<draft>");
  d = p.Feed(kC, "</｜DSML｜para");
  EXPECT_TRUE(d.empty());
  d = p.Feed(kC,
             "meter>\n<｜DSML｜parameter name=\"details\" string=\"false\">{\"duration_min\": 30");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "\", \"details\": ");  // JSON values wait for the closer
  d = p.Feed(kC, "}</｜DSML｜parameter>\n</｜DSML｜invoke>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"duration_min\": 30}}");
  EXPECT_EQ(p.calls(), 1);
  EXPECT_TRUE(p.Feed(kC, "\n</｜DSML｜tool_calls>").empty());
  EXPECT_TRUE(p.Finish(false).empty());
  EXPECT_TRUE(p.error().ok());
}

// §10.3: chat mode, content before the block; the "\n\n" belongs to the opener.
TEST(DsmlParser, Example103ChatModeContentBeforeBlock) {
  const Result r = EverySplit(Tools({"get_weather"}),
                              {{kC, std::string("Let me check.\n\n<｜DSML｜tool_calls>\n") +
                                        kOsloCall + "</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
}

TEST(DsmlParser, PlainAnswersAndContentNewlines) {
  Result r = EverySplit(Tools(), {{kR, "Easy."}, {kC, "\n\nIt is -3°C in Oslo.\n\nBye\n"}});
  EXPECT_EQ(r.reasoning, "Easy.");
  EXPECT_EQ(r.content, "It is -3°C in Oslo.\n\nBye\n");  // only leading newlines are dropped
  EXPECT_TRUE(r.calls.empty());
  r = EverySplit(Tools(), {{kC, "\n\na < b, c </ d, x｜y, </thinking>"}});
  EXPECT_EQ(r.content, "a < b, c </ d, x｜y, </thinking>");
}

// vLLM #53227: a value ending in `2>&1` with the closer arriving as `</｜DSML｜parameter` + `>`.
TEST(DsmlParser, CloserSplitAfterShellRedirect) {
  DsmlParser p(WithIds(Tools({"bash"})));
  std::string args;
  auto feed = [&](const std::string& text) {
    for (const ToolCallDelta& c : p.Feed(kC, text).tool_calls) {
      args += c.arguments;
      EXPECT_EQ(c.arguments.find("｜"), std::string::npos) << c.arguments;
    }
  };
  feed("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n");
  feed("<｜DSML｜parameter name=\"command\" string=\"true\">make test 2>&1");
  feed("</｜DSML｜parameter");
  EXPECT_EQ(args, R"({"command": "make test 2>&1)");
  feed(">");
  feed("\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
  p.Finish(false);
  EXPECT_EQ(args, R"({"command": "make test 2>&1"})");
  EXPECT_TRUE(p.error().ok());
  EverySplit(Tools({"bash"}),
             {{kC,
               "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter "
               "name=\"command\" string=\"true\">ls 2>&1 </ x</｜DSML｜parameter>\n"
               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}});
}

// SMG #1030: the opener's first chunk `\n\n<｜DSML｜` arrives alone and must not be flushed.
TEST(DsmlParser, ChunkedOpenerIsHeld) {
  DsmlParser p(WithIds(Tools({"get_weather"})));
  EXPECT_EQ(p.Feed(kC, "Let me check.").content, "Let me check.");
  EXPECT_TRUE(p.Feed(kC, "\n\n<｜DSML｜").empty());
  EXPECT_TRUE(p.Feed(kC, "tool_calls>").empty());
  const ParsedDelta d = p.Feed(kC, std::string("\n") + kOsloCall + "</｜DSML｜tool_calls>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[1].arguments, R"({"city": "Oslo"})");
  EXPECT_TRUE(p.Finish(false).empty());
  EXPECT_EQ(p.calls(), 1);
}

// Dynamo #10646 and others: the block opened in the reasoning channel (no </think>).
TEST(DsmlParser, BlockOpenedWithoutThinkEnd) {
  const Result r =
      EverySplit(Tools({"get_weather"}),
                 {{kR, std::string("I should call the tool.\n\n<｜DSML｜tool_calls>\n") +
                           kOsloCall + "</｜DSML｜tool_calls>\nMore reasoning-channel text."}});
  EXPECT_EQ(r.reasoning, "I should call the tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.error, "");
}

TEST(DsmlParser, LiteralThinkEndAndEosInText) {
  Result r =
      EverySplit(Tools(), {{kR, "plan</think>\n\nanswer</think> done<｜end▁of▁sentence｜>"}});
  EXPECT_EQ(r.reasoning, "plan");
  EXPECT_EQ(r.content, "answer done");
  // Reasoning that never ends stays reasoning (truncated or not).
  r = EverySplit(Tools(), {{kR, "still thinking\n\n"}}, /*truncated=*/true);
  EXPECT_EQ(r.reasoning, "still thinking\n\n");
  EXPECT_EQ(r.content, "");
}

// vLLM #54686: stray and doubled closers, a doubled opener, whitespace between tags.
TEST(DsmlParser, StrayAndDoubledTagsAreAbsorbed) {
  const Result r = EverySplit(
      Tools(), {{kC,
                 "Hi</｜DSML｜parameter> there\n</｜DSML｜invoke>!"
                 "\n\n<｜DSML｜tool_calls>\n<｜DSML｜tool_calls>  \n</｜DSML｜invoke>\n"
                 "<｜DSML｜invoke name=\"get_weather\">\r\n\t"
                 "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>"
                 "</｜DSML｜parameter>\n \n"
                 "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
                 "</｜DSML｜invoke>\n</｜DSML｜invoke>\n"
                 "</｜DSML｜tool_calls>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"}});
  EXPECT_EQ(r.content, "Hi there!");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Rome", "unit": "celsius"})");
  EXPECT_EQ(r.complete, 1);
  EXPECT_EQ(r.error, "");
}

TEST(DsmlParser, EmptyBlockAndBareSentinel) {
  Result r = EverySplit(
      Tools(), {{kR, "hmm"}, {kC, "ok a｜DSML｜b\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.content, "ok ab");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.error, "");
}

// Dropping a token must not join the text around it into a sentinel.
TEST(DsmlParser, NoSentinelAcrossDroppedTokens) {
  Result r = EverySplit(Tools(), {{kC, "a <｜DSM</think>L｜L｜tool_calls> b"}});
  EXPECT_EQ(r.content, "a <｜DSMtool_calls> b");
  r = EverySplit(Tools(), {{kR, "x｜DS<｜end▁of▁sentence｜>ML｜y ｜D</｜DSML｜invoke>SML"}});
  EXPECT_EQ(r.reasoning, "x｜DSy ｜DSML");
  EXPECT_TRUE(r.calls.empty());
}

TEST(DsmlParser, ParallelCallsAndASecondBlock) {
  const Result r =
      EverySplit(Tools(), {{kC, std::string("\n\n<｜DSML｜tool_calls>\n") + kOsloCall +
                                    "<｜DSML｜invoke name=\"create_event\">\n\n</｜DSML｜invoke>\n"
                                    "</｜DSML｜tool_calls>\n\nignored text after the block\n\n"
                                    "<｜DSML｜tool_calls>\n" +
                                    kOsloCall + "</｜DSML｜tool_calls>\nbye"}});
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.calls[1].arguments, "{}");  // no parameters
  EXPECT_EQ(r.calls[2].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.calls[2].id, "call_2");
  EXPECT_EQ(r.complete, 3);
}

// An orphan invoke (no outer block) is recovered; missing inner closers are implied.
TEST(DsmlParser, OrphanInvokeAndMissingClosers) {
  const Result r = EverySplit(
      Tools(),
      {{kC,
        "Sure.\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
        "<｜DSML｜invoke name=\"create_event\">\n"
        "<｜DSML｜parameter name=\"details\" string=\"false\">[1, 2]</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Rome"})");
  EXPECT_EQ(r.calls[1].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.calls[2].arguments, R"({"details": [1, 2]})");
  EXPECT_EQ(r.complete, 3);
  EXPECT_EQ(r.error, "");
}

TEST(DsmlParser, EscapingOfStringValuesAndKeys) {
  const std::string value = "a\"b\\c\nd\te\x01 é 日本 </x <｜y";
  const Result r = EverySplit(
      Tools({"f"}), {{kC,
                      "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                      "<｜DSML｜parameter name=\"k\\ey w string=x\" string=\"true\">" +
                          value +
                          "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"\" string=\"false\"> "
                          "null\n</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}});
  ASSERT_EQ(r.calls.size(), 1u);
  const json args = json::parse(r.calls[0].arguments);
  EXPECT_EQ(args.at("k\\ey w string=x").get<std::string>(), value);
  EXPECT_TRUE(args.at("").is_null());
  EXPECT_NE(r.calls[0].arguments.find("é 日本"), std::string::npos);  // non-ASCII kept
  EXPECT_NE(r.calls[0].arguments.find("\\u0001"), std::string::npos);
}

// string="false" values must be JSON: the call is reported and nothing corrupt is emitted.
TEST(DsmlParser, InvalidJsonValueIsAnError) {
  const Result r = EverySplit(
      Tools(),
      {{kC, std::string("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"create_event\">\n") +
                "<｜DSML｜parameter name=\"title\" string=\"true\">x</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"details\" string=\"false\">false,</｜DSML｜parameter>\n"
                "<｜DSML｜parameter name=\"more\" string=\"true\">y</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n" +
                kOsloCall + "</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.error,
            "tool call 0 (create_event): parameter \"details\" is string=\"false\" but not JSON: "
            "\"false,\"");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"title": "x", "details": )");  // a prefix, never closed
  EXPECT_EQ(r.calls[1].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.complete, 1);
  EXPECT_EQ(r.content, "");
}

// nlohmann's lexer ends its input at a NUL byte: "1\0x" must not pass as JSON.
TEST(DsmlParser, NulInJsonValueIsAnError) {
  const Result r = EverySplit(
      Tools({"f"}), {{kC, std::string("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
                                      "<｜DSML｜parameter name=\"n\" string=\"false\">1") +
                              std::string(1, '\0') + "x</｜DSML｜parameter>\n</｜DSML｜invoke>"}});
  EXPECT_EQ(r.error,
            "tool call 0 (f): parameter \"n\" is string=\"false\" but not JSON: \"1\\u0000x\"");
  EXPECT_EQ(r.complete, 0);
}

TEST(DsmlParser, UnknownToolIsAnErrorAndNotEmitted) {
  const Result r =
      EverySplit(Tools({"get_weather"}),
                 {{kC,
                   "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"rm_rf\">\n<｜DSML｜parameter "
                   "name=\"path\" string=\"true\">/</｜DSML｜parameter>\n</｜DSML｜invoke>\n" +
                       std::string(kOsloCall) + "</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.error, "tool call 0 (rm_rf): not a tool of this request");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.complete, 1);
}

TEST(DsmlParser, DuplicateParameterAndMalformedTags) {
  Result r = EverySplit(Tools({"get_weather"}),
                        {{kC,
                          "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                          "<｜DSML｜parameter name=\"city\" string=\"true\">A</｜DSML｜parameter>\n"
                          "<｜DSML｜parameter name=\"city\" string=\"true\">B</｜DSML｜parameter>\n"
                          "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.error, "tool call 0 (get_weather): duplicate parameter \"city\"");
  EXPECT_EQ(r.complete, 0);
  r = EverySplit(Tools({"get_weather"}),
                 {{kC,
                   "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                   "<｜DSML｜parameter name=\"city\" strin=\"true\">A</｜DSML｜parameter>\n"
                   "</｜DSML｜invoke>\n" +
                       std::string(kOsloCall) + "</｜DSML｜tool_calls>"}});
  EXPECT_EQ(
      r.error,
      "tool call 0 (get_weather): malformed tag \"<｜DSML｜parameter name=\\\"city\\\" strin\"");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.complete, 1);
  // A JSON body instead of parameter tags would silently become {}: it is an error.
  r = EverySplit(Tools({"get_weather"}),
                 {{kC,
                   "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                   "{\"city\": \"Rome\"}\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.error, "tool call 0 (get_weather): unexpected text between parameters");
  EXPECT_EQ(r.complete, 0);
  // A malformed tag between calls, and a closer that is no closer inside a value.
  r = EverySplit(
      Tools({"get_weather"}),
      {{kC, "<｜DSML｜tool_calls>\n<｜DSML｜invok name=\"x\">\n" + std::string(kOsloCall) +
                "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
                "string=\"true\">A</｜DSML｜param>B</｜DSML｜parameter>\n</｜DSML｜invoke>"}});
  EXPECT_EQ(r.error, "tool call 0: malformed tag \"<｜DSML｜invok\"");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.complete, 1);
  EXPECT_EQ(r.content, "");
}

TEST(DsmlParser, OtherOpeningTagInContentStartsMarkup) {
  const Result r = EverySplit(
      Tools(), {{kC,
                 "Answer.\n\n<｜DSML｜parameter name=\"a\" string=\"true\">v</｜DSML｜parameter>"
                 "\nand more"}});
  EXPECT_EQ(r.content, "Answer.");
  EXPECT_EQ(r.error, "tool call 0: parameter \"a\" outside an invoke");
  EXPECT_TRUE(r.calls.empty());
}

// tool_choice=required: the prompt ended after the opener.
TEST(DsmlParser, ForcedBlockStart) {
  ParserOptions o = Tools();
  o.start = ParserOptions::Start::kBlock;
  const Result r = EverySplit(o, {{kR, std::string(kOsloCall) + "</｜DSML｜tool_calls>"}});
  EXPECT_EQ(r.reasoning, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
}

// tool_choice named: the prompt ended inside the invoke; its first delta comes at once.
TEST(DsmlParser, ForcedInvokeStart) {
  ParserOptions o = Tools();
  o.start = ParserOptions::Start::kInvoke;
  o.forced_name = "get_weather";
  DsmlParser p(WithIds(o));
  const ParsedDelta first = p.Feed(kC, "");
  ASSERT_EQ(first.tool_calls.size(), 1u);
  EXPECT_EQ(first.tool_calls[0].name, "get_weather");
  EXPECT_EQ(first.tool_calls[0].id, "call_0");
  const Result r =
      EverySplit(o, {{kC,
                      "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
                      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}});
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.complete, 1);
  // Stopped at once: the started call is reported as truncated.
  DsmlParser q(WithIds(o));
  EXPECT_EQ(q.Finish(true).tool_calls.size(), 1u);
  EXPECT_EQ(q.error().message(), "tool call 0 (get_weather): truncated by the length limit");
}

TEST(DsmlParser, ToolsOffKeepsMarkupAsContent) {
  const std::string text = std::string("Let me check.") + kWeatherRome;
  ParserOptions off;
  off.start = ParserOptions::Start::kBlock;  // ignored without tools
  Result r = EverySplit(off, {{kR, "r"}, {kC, "\n\n" + text + "<｜end▁of▁sentence｜>"}});
  EXPECT_EQ(r.reasoning, "r");
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
  r = EverySplit(off, {{kC, "a</think>b <｜DS"}});
  EXPECT_EQ(r.content, "ab <｜DS");
  r = EverySplit(Tools(),
                 {{kC, "a</think>b\n\n<｜DS"}});  // with tools: a partial opener is dropped
  EXPECT_EQ(r.content, "ab");
  r = EverySplit(Tools(), {{kC, "a <"}, {kC, "/"}});
  EXPECT_EQ(r.content, "a </");
}

TEST(DsmlParser, TruncationInsideMarkup) {
  const std::string head =
      "Checking.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
      "<｜DSML｜parameter name=\"city\" string=\"true\">Ro";
  Result r = EverySplit(Tools(), {{kC, head}}, /*truncated=*/true);
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Ro)");
  EXPECT_EQ(r.complete, 0);
  EXPECT_EQ(r.error, "tool call 0 (get_weather): truncated by the length limit");
  r = EverySplit(Tools(), {{kC, head + "me</｜DSML｜parameter>\n"}}, /*truncated=*/false);
  EXPECT_EQ(r.error, "tool call 0 (get_weather): generation ended inside the call");
  // Truncated between calls or inside a tag that never completed: no call was started.
  r = EverySplit(Tools(), {{kC, "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke na"}}, true);
  EXPECT_EQ(r.content, "x");
  EXPECT_TRUE(r.calls.empty());
  EXPECT_EQ(r.error, "");
}

TEST(DsmlParser, DefaultIdsAndFinishOnce) {
  ParserOptions o = Tools({"get_weather"});
  DsmlParser p(o);
  const ParsedDelta d = p.Feed(kC, std::string("<｜DSML｜tool_calls>\n") + kOsloCall);
  ASSERT_FALSE(d.tool_calls.empty());
  const std::string& id = d.tool_calls[0].id;
  ASSERT_EQ(id.size(), 29u);
  EXPECT_EQ(id.substr(0, 5), "call_");
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  EXPECT_NE(NewCallId(), NewCallId());
  EXPECT_TRUE(p.Finish(false).empty());
  EXPECT_TRUE(p.Feed(kC, "more").empty());
  EXPECT_TRUE(p.Finish(true).empty());
  EXPECT_EQ(p.calls(), 1);
}

}  // namespace
}  // namespace dsv4::chat
