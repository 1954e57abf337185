// The DeepSeek-V4 prompt encoder against the spec's literal examples
// (shared/design/dsv4-chat-and-tools.md §2.5, §10.1, §10.3), and RenderChat's gRPC format.
#include "node/chat/dsv4_encoding.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "node/chat/python_json.h"
#include "node/chat_format.h"

namespace dsv4::chat {
namespace {

using OJson = nlohmann::ordered_json;

const char kBos[] = "<｜begin▁of▁sentence｜>";

// §2.5 verbatim, split around {TOOL_SCHEMAS}.
const char kToolsBlockHead[] = R"SPEC(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)SPEC";
const char kToolsBlockTail[] = R"SPEC(

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)SPEC";

// §10.1: the prompt after two turns, then the generation the spec expects for it.
const char kExample101[] = R"SPEC(<｜begin▁of▁sentence｜>You are a helpful assistant.

## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{"name": "get_weather", "description": "Get current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
<｜User｜>What's the weather in Paris?<｜Assistant｜><think>The user wants Paris weather. Call get_weather.</think>

<｜DSML｜tool_calls>
<｜DSML｜invoke name="get_weather">
<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
</｜DSML｜invoke>
</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>{"temp_c": 18, "sky": "cloudy"}</tool_result><｜Assistant｜><think>Got the data.</think>It is 18°C and cloudy in Paris.<｜end▁of▁sentence｜><｜User｜>And in Rome, in fahrenheit?<｜Assistant｜><think>)SPEC";
const char kExample101Generation[] = R"SPEC(The user wants Rome in fahrenheit. Call get_weather again.</think>

<｜DSML｜tool_calls>
<｜DSML｜invoke name="get_weather">
<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>
<｜DSML｜parameter name="unit" string="true">fahrenheit</｜DSML｜parameter>
</｜DSML｜invoke>
</｜DSML｜tool_calls><｜end▁of▁sentence｜>)SPEC";

OJson GetWeather() {
  return OJson::parse(
      R"({"name":"get_weather","description":"Get current weather","parameters":{"type":"object",)"
      R"("properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius",)"
      R"("fahrenheit"]}},"required":["city"]}})");
}

std::string Encode(const std::vector<Message>& messages, const std::vector<OJson>& tools,
                   bool thinking = true, bool drop_thinking = true) {
  EncodeOptions options;
  options.thinking = thinking;
  options.drop_thinking = drop_thinking;
  auto out = EncodeChat(messages, tools, options);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::string();
}

std::string ErrorOf(const std::vector<Message>& messages, const std::vector<OJson>& tools = {}) {
  auto out = EncodeChat(messages, tools, EncodeOptions{});
  EXPECT_FALSE(out.ok());
  if (out.ok()) return std::string();
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

Message Msg(std::string role, std::string content) {
  Message m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

Message User(std::string text) { return Msg("user", std::move(text)); }

Message Tool(std::string id, std::string text) {
  Message m = Msg("tool", std::move(text));
  m.tool_call_id = std::move(id);
  return m;
}

Message Assistant(std::string content, std::string reasoning = "",
                  std::vector<ToolCall> calls = {}) {
  Message m = Msg("assistant", std::move(content));
  m.reasoning_content = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}

// The two-call history of §10.1 as a message list.
std::vector<Message> Example101() {
  return {Msg("system", "You are a helpful assistant."),
          User("What's the weather in Paris?"),
          Assistant("", "The user wants Paris weather. Call get_weather.",
                    {{"call_a1", "get_weather", R"({"city":"Paris"})"}}),
          Tool("call_a1", R"({"temp_c": 18, "sky": "cloudy"})"),
          Assistant("It is 18°C and cloudy in Paris.", "Got the data."),
          User("And in Rome, in fahrenheit?")};
}

std::string Header(const std::string& system = "You are a helpful assistant.") {
  return std::string(kBos) + system + "\n\n" + RenderToolsBlock({GetWeather()});
}

// ---- PythonJsonDumps ----

TEST(PythonJson, SpacingAndKeyOrder) {
  EXPECT_EQ(PythonJsonDumps(OJson::parse(R"({"b":1,"a":[1,2,{"z":null,"y":true}],"c":{}})")),
            R"({"b": 1, "a": [1, 2, {"z": null, "y": true}], "c": {}})");
  EXPECT_EQ(PythonJsonDumps(OJson::parse("[]")), "[]");
  EXPECT_EQ(PythonJsonDumps(OJson::parse("[[[]], {\"k\": [false]}]")), R"([[[]], {"k": [false]}])");
  EXPECT_EQ(PythonJsonDumps(OJson("x")), R"("x")");
  EXPECT_EQ(PythonJsonDumps(OJson(nullptr)), "null");
}

TEST(PythonJson, StringEscapes) {
  // Non-ASCII, DEL and U+2028 pass through; / is not escaped; controls in lower-case hex.
  EXPECT_EQ(PythonJsonDumps(OJson("é 中文 😀 \x7f \u2028 a/b")), "\"é 中文 😀 \x7f \u2028 a/b\"");
  EXPECT_EQ(PythonJsonDumps(OJson("q\"b\\n\nr\rt\tb\bf\f")), R"("q\"b\\n\nr\rt\tb\bf\f")");
  EXPECT_EQ(PythonJsonDumps(OJson(std::string("\x00\x01\x1b\x1f", 4))),
            R"("\u0000\u0001\u001b\u001f")");
  // Keys are escaped the same way.
  EXPECT_EQ(PythonJsonDumps(OJson::parse(R"({"a\"b\u000b":"é"})")), R"({"a\"b\u000b": "é"})");
}

TEST(PythonJson, Numbers) {
  EXPECT_EQ(PythonJsonDumps(OJson::parse("[0, -0, 7, -12, 18446744073709551615, -9223372036854775808]")),
            "[0, 0, 7, -12, 18446744073709551615, -9223372036854775808]");
  const std::vector<std::pair<double, const char*>> cases = {
      {1.0, "1.0"},          {0.5, "0.5"},           {1e-05, "1e-05"},
      {1e+20, "1e+20"},      {0.1, "0.1"},           {100.0, "100.0"},
      {-0.0, "-0.0"},        {0.0001, "0.0001"},     {0.00012345, "0.00012345"},
      {1e16, "1e+16"},       {1e15, "1000000000000000.0"},
      {1.5e16, "1.5e+16"},   {2.5e-07, "2.5e-07"},   {123456789012345678.0, "1.2345678901234568e+17"},
      {9999999999999998.0, "9999999999999998.0"},    {1234567890123456.7, "1234567890123456.8"},
      {5e-324, "5e-324"},    {1.7976931348623157e308, "1.7976931348623157e+308"},
      {-3.25, "-3.25"},      {1e100, "1e+100"},      {3.14159, "3.14159"}};
  for (const auto& [value, python] : cases) {
    EXPECT_EQ(PythonFloatRepr(value), python) << value;
    EXPECT_EQ(PythonJsonDumps(OJson(value)), python) << value;
  }
  // Parsed text keeps its kind: 1E5 and 2.0 are floats to Python as well.
  EXPECT_EQ(PythonJsonDumps(OJson::parse("[1E5, 2.0, 1e-7, -0.0]")), "[100000.0, 2.0, 1e-07, -0.0]");
  EXPECT_EQ(PythonFloatRepr(std::numeric_limits<double>::infinity()), "Infinity");
  EXPECT_EQ(PythonFloatRepr(-std::numeric_limits<double>::infinity()), "-Infinity");
  EXPECT_EQ(PythonFloatRepr(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

// ---- the tools block and the worked examples ----

TEST(Dsv4Encoding, ToolsBlockIsTheSpecText) {
  const std::string schema =
      R"({"name": "get_weather", "description": "Get current weather", "parameters": {"type": )"
      R"("object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", )"
      R"("enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}})";
  EXPECT_EQ(RenderToolsBlock({GetWeather()}),
            std::string(kToolsBlockHead) + schema + kToolsBlockTail);
  // One schema per line, in the request's order.
  const OJson f = OJson::parse(R"({"name":"f","parameters":{}})");
  EXPECT_EQ(RenderToolsBlock({f, GetWeather()}),
            std::string(kToolsBlockHead) + R"({"name": "f", "parameters": {}})" + "\n" + schema +
                kToolsBlockTail);
}

TEST(Dsv4Encoding, Example101TwoTurnsWithToolCallThinking) {
  EXPECT_EQ(Encode(Example101(), {GetWeather()}), kExample101);
}

TEST(Dsv4Encoding, Example101ContinuesWithTheGeneratedTurn) {
  // The generated turn, parsed and sent back with its result, extends the prompt exactly.
  std::vector<Message> messages = Example101();
  messages.push_back(Assistant(
      "", "The user wants Rome in fahrenheit. Call get_weather again.",
      {{"call_b2", "get_weather", R"({"city": "Rome", "unit": "fahrenheit"})"}}));
  messages.push_back(Tool("call_b2", R"({"temp_f": 75, "sky": "sunny"})"));
  EXPECT_EQ(Encode(messages, {GetWeather()}),
            std::string(kExample101) + kExample101Generation +
                R"(<｜User｜><tool_result>{"temp_f": 75, "sky": "sunny"}</tool_result><｜Assistant｜><think>)");
}

TEST(Dsv4Encoding, Example103ChatMode) {
  std::vector<Message> messages = {Msg("system", "You are a helpful assistant."),
                                   User("Weather in Oslo?")};
  const std::string prompt = Encode(messages, {GetWeather()}, /*thinking=*/false);
  const std::string tail =
      "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
      "calls.\n<｜User｜>Weather in Oslo?<｜Assistant｜></think>";
  EXPECT_EQ(prompt, Header() + "<｜User｜>Weather in Oslo?<｜Assistant｜></think>");
  ASSERT_GE(prompt.size(), tail.size());
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail);

  // The next prompt after the tool result (chat mode renders no reasoning, even if sent).
  messages.push_back(Assistant("Let me check.", "ignored in chat mode",
                               {{"call_1", "get_weather", R"({"city": "Oslo"})"}}));
  messages.push_back(Tool("call_1", R"({"temp_c": -3})"));
  EXPECT_EQ(Encode(messages, {GetWeather()}, /*thinking=*/false),
            prompt +
                "Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
                R"(<｜User｜><tool_result>{"temp_c": -3}</tool_result><｜Assistant｜></think>)");
}

// ---- preprocessing ----

TEST(Dsv4Encoding, ToolsGoAfterALeadingDeveloperOrIntoANewSystemMessage) {
  EXPECT_EQ(Encode({User("hi")}, {GetWeather()}), Header("") + "<｜User｜>hi<｜Assistant｜><think>");
  EXPECT_EQ(Encode({Msg("developer", "Be terse."), User("hi")}, {GetWeather()}),
            std::string(kBos) + "<｜User｜>Be terse.\n\n" + RenderToolsBlock({GetWeather()}) +
                "<｜User｜>hi<｜Assistant｜><think>");
  // A system message that is not first does not take the tools.
  EXPECT_EQ(Encode({User("a"), Msg("system", "S"), User("b")}, {GetWeather()}),
            Header("") + "<｜User｜>aS<｜User｜>b<｜Assistant｜><think>");
  // No tools: no empty system message, no block.
  EXPECT_EQ(Encode({User("hi")}, {}), std::string(kBos) + "<｜User｜>hi<｜Assistant｜><think>");
}

TEST(Dsv4Encoding, ToolResultsAreSortedByCallOrderAndShareTheUserTurn) {
  const std::vector<Message> messages = {
      User("q"),
      Assistant("", "r", {{"c1", "f", "{}"}, {"c2", "g", "{}"}, {"c3", "h", "{}"}}),
      Tool("c3", "R3"), Tool("c1", "R1"), Tool("c2", "R2"), User("and then?")};
  const std::string calls =
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"g\">\n\n</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"h\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  EXPECT_EQ(Encode(messages, {}, true, /*drop_thinking=*/false),
            std::string(kBos) + "<｜User｜>q<｜Assistant｜><think>r</think>" + calls +
                "<｜end▁of▁sentence｜><｜User｜><tool_result>R1</tool_result>\n\n"
                "<tool_result>R2</tool_result>\n\n<tool_result>R3</tool_result>\n\n"
                "and then?<｜Assistant｜><think>");
}

TEST(Dsv4Encoding, UnknownIdsSortFirstAndTextKeepsItsSlot) {
  // "x" and "" are not calls: rank 0 like c1, in arrival order (a stable sort); the user text
  // between results stays the second block.
  const std::vector<Message> messages = {
      User("q"), Assistant("", "", {{"c1", "f", "{}"}, {"c2", "g", "{}"}}),
      Tool("c2", "R2"), User("mid"), Tool("x", "RX"), Tool("c1", "R1"), Tool("", "RE")};
  const std::string out = Encode(messages, {}, /*thinking=*/false);
  EXPECT_NE(out.find("<｜User｜><tool_result>RX</tool_result>\n\nmid\n\n<tool_result>R1"
                     "</tool_result>\n\n<tool_result>RE</tool_result>\n\n<tool_result>R2"
                     "</tool_result><｜Assistant｜></think>"),
            std::string::npos)
      << out;
}

TEST(Dsv4Encoding, ConsecutiveUserMessagesFormOneTurn) {
  EXPECT_EQ(Encode({User("a"), User("b"), Tool("t", "R")}, {}),
            std::string(kBos) + "<｜User｜>a\n\nb\n\n<tool_result>R</tool_result><｜Assistant｜><think>");
}

TEST(Dsv4Encoding, DropThinkingWithoutTools) {
  const std::vector<Message> messages = {Msg("system", "S"),    User("u1"), Assistant("a1", "r1"),
                                         Msg("developer", "D"), User("u2"), Assistant("a2", "r2"),
                                         User("u3")};
  // Dropped: earlier reasoning and the developer turn before the last user turn.
  EXPECT_EQ(Encode(messages, {}),
            std::string(kBos) +
                "S<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"
                "<｜User｜>u2<｜Assistant｜></think>a2<｜end▁of▁sentence｜><｜User｜>u3<｜Assistant｜><think>");
  // Kept when not dropping.
  EXPECT_EQ(Encode(messages, {}, true, /*drop_thinking=*/false),
            std::string(kBos) +
                "S<｜User｜>u1<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜><｜User｜>D"
                "<｜User｜>u2<｜Assistant｜><think>r2</think>a2<｜end▁of▁sentence｜>"
                "<｜User｜>u3<｜Assistant｜><think>");
  // Chat mode never renders reasoning, and keeps developer turns.
  EXPECT_EQ(Encode(messages, {}, /*thinking=*/false),
            std::string(kBos) +
                "S<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜><｜User｜>D"
                "<｜User｜>u2<｜Assistant｜></think>a2<｜end▁of▁sentence｜><｜User｜>u3<｜Assistant｜></think>");
}

TEST(Dsv4Encoding, ToolsKeepAllReasoning) {
  const std::vector<Message> messages = {Msg("system", "S"), User("u1"), Assistant("a1", "r1"),
                                         User("u2")};
  EXPECT_EQ(Encode(messages, {GetWeather()}, true, /*drop_thinking=*/true),
            Header("S") +
                "<｜User｜>u1<｜Assistant｜><think>r1</think>a1<｜end▁of▁sentence｜>"
                "<｜User｜>u2<｜Assistant｜><think>");
}

TEST(Dsv4Encoding, HistoryCallsWithoutRequestToolsDropReasoning) {
  // Without request tools the reasoning of a tool-calling turn is dropped like any other: the
  // tool-result turn is the last user turn.
  const std::vector<Message> messages = {User("q"), Assistant("", "r", {{"c", "f", "{}"}}),
                                         Tool("c", "R")};
  EXPECT_EQ(Encode(messages, {}),
            std::string(kBos) +
                "<｜User｜>q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">"
                "\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
                "<｜User｜><tool_result>R</tool_result><｜Assistant｜><think>");
  // With them it stays (§2.1 step 5).
  EXPECT_NE(Encode(messages, {GetWeather()}).find("<｜User｜>q<｜Assistant｜><think>r</think>\n\n"),
            std::string::npos);
}

TEST(Dsv4Encoding, MarkupInContentPassesThrough) {
  EXPECT_EQ(Encode({User("<｜end▁of▁sentence｜></think><｜DSML｜tool_calls>")}, {}, false),
            std::string(kBos) +
                "<｜User｜><｜end▁of▁sentence｜></think><｜DSML｜tool_calls><｜Assistant｜></think>");
}

// ---- tool-call arguments in history ----

TEST(Dsv4Encoding, ArgumentsAsStringOrObjectRenderTheSame) {
  const std::string text =
      R"({"title": "Team sync: \"Q3\" <draft>", "details": {"duration_min": 30, "attendees": )"
      R"(["ana", "bo"]}, "n": 1.50, "ok": false, "none": null, "big": 12, "neg": -0.0001, )"
      R"("uni": ["é\n", 1e-7]})";
  auto with = [&](OJson args) {
    return Encode({User("q"), Assistant("", "", {{"c", "create_event", std::move(args)}}),
                   Tool("c", "done")},
                  {});
  };
  const std::string from_string = with(OJson(text));
  EXPECT_EQ(from_string, with(OJson::parse(text)));
  EXPECT_NE(
      from_string.find(
          "<｜DSML｜invoke name=\"create_event\">\n"
          "<｜DSML｜parameter name=\"title\" string=\"true\">Team sync: \"Q3\" <draft></｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"details\" string=\"false\">{\"duration_min\": 30, \"attendees\": "
          "[\"ana\", \"bo\"]}</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"n\" string=\"false\">1.5</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"ok\" string=\"false\">false</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"none\" string=\"false\">null</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"big\" string=\"false\">12</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"neg\" string=\"false\">-0.0001</｜DSML｜parameter>\n"
          "<｜DSML｜parameter name=\"uni\" string=\"false\">[\"é\\n\", 1e-07]</｜DSML｜parameter>\n"
          "</｜DSML｜invoke>"),
      std::string::npos)
      << from_string;
}

TEST(Dsv4Encoding, RepeatedArgumentKeyKeepsFirstPlaceLastValue) {
  // As Python's json.loads: {"a": 3, "b": 2}.
  const std::string out = Encode(
      {User("q"), Assistant("", "", {{"c", "f", R"({"a": 1, "b": 2, "a": 3})"}}), Tool("c", "R")},
      {});
  EXPECT_NE(out.find("<｜DSML｜parameter name=\"a\" string=\"false\">3</｜DSML｜parameter>\n"
                     "<｜DSML｜parameter name=\"b\" string=\"false\">2</｜DSML｜parameter>\n"),
            std::string::npos)
      << out;
}

TEST(Dsv4Encoding, ZeroParameterCall) {
  for (const OJson& args : {OJson("{}"), OJson(" { } "), OJson::object()}) {
    const std::string out =
        Encode({User("q"), Assistant("", "", {{"c", "f", args}}), Tool("c", "R")}, {}, false);
    EXPECT_EQ(out, std::string(kBos) +
                       "<｜User｜>q<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n"
                       "<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
                       "<｜end▁of▁sentence｜><｜User｜><tool_result>R</tool_result><｜Assistant｜></think>");
  }
}

TEST(Dsv4Encoding, NonObjectArgumentsAreRejectedNamingTheField) {
  // The bad call is the caller's messages[5].tool_calls[1], although merging the two tool
  // messages into one user turn moved it to position 4.
  const std::vector<std::pair<OJson, std::string>> cases = {
      {OJson("[1, 2]"), "must hold a JSON object; got an array"},
      {OJson("3"), "must hold a JSON object; got a number"},
      {OJson("\"s\""), "must hold a JSON object; got a string"},
      {OJson("{\"a\": "), "not valid JSON"},
      {OJson(""), "not valid JSON"},
      {OJson("{} x"), "not valid JSON"},
      {OJson::array({1}), "must be a JSON object or a string holding one; got an array"},
      {OJson(7), "must be a JSON object or a string holding one; got a number"},
      {OJson(nullptr), "must be a JSON object or a string holding one; got null"},
      {OJson(std::string(100, '[') + std::string(100, ']')), "JSON nested deeper than 64 levels"},
  };
  for (const auto& [args, problem] : cases) {
    const std::vector<Message> messages = {
        User("q"), Assistant("", "", {{"c1", "f", "{}"}, {"c2", "g", "{}"}}), Tool("c1", "R1"),
        Tool("c2", "R2"), User("more"),
        Assistant("", "", {{"c3", "f", "{}"}, {"c4", "g", args}}), Tool("c4", "R")};
    EXPECT_EQ(ErrorOf(messages),
              "messages[5].tool_calls[1].function.arguments: " + problem);
  }
  EXPECT_EQ(ErrorOf({User("q"), Assistant("", "", {{"c", "", "{}"}}), Tool("c", "R")}),
            "messages[1].tool_calls[0].function.name: must not be empty");
}

TEST(Dsv4Encoding, BadConversationsAreRejectedNamingTheField) {
  EXPECT_EQ(ErrorOf({}), "messages: must not be empty");
  EXPECT_EQ(ErrorOf({User("a"), Assistant("b"), User("c"), Msg("robot", "x")}),
            "messages[3].role: \"robot\" is not system, developer, user, assistant or tool");
  EXPECT_EQ(ErrorOf({Msg("User", "x")}),
            "messages[0].role: \"User\" is not system, developer, user, assistant or tool");
  EXPECT_EQ(ErrorOf({User("a"), Assistant("b")}),
            "messages[1].role: the last message must be user, developer or tool; got assistant");
  EXPECT_EQ(ErrorOf({Msg("system", "s")}),
            "messages[0].role: the last message must be user, developer or tool; got system");
  EXPECT_EQ(ErrorOf({Msg("developer", ""), User("a")}),
            "messages[0].content: a developer message must not be empty");
  Message user_with_calls = User("a");
  user_with_calls.tool_calls = {{"c", "f", "{}"}};
  EXPECT_EQ(ErrorOf({User("q"), Tool("c", "R"), user_with_calls}),
            "messages[2].tool_calls: only an assistant message has tool calls");
}

}  // namespace
}  // namespace dsv4::chat

// ---- RenderChat, the gRPC chat format, now rendered by EncodeChat ----
// Expected strings are what the previous, standalone RenderChat produced for the same input.
namespace dsv4 {
namespace {

std::string Render(const std::vector<ChatTurn>& turns, bool thinking) {
  auto out = RenderChat(turns, thinking);
  return out.ok() ? *out : "error: " + std::string(out.status().message());
}

TEST(RenderChatCompat, OutputsAreUnchanged) {
  const std::vector<ChatTurn> long_chat = {{"system", "S"},        {"user", "u1"},
                                           {"assistant", "<think>r1</think>a1"},
                                           {"user", "u2"},         {"assistant", "plain"},
                                           {"user", "u3"}};
  EXPECT_EQ(Render({{"user", "hi"}}, true),
            "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  EXPECT_EQ(Render({{"user", "hi"}}, false),
            "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
  EXPECT_EQ(Render({{"system", ""}, {"user", "hi"}}, true),
            "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>");
  EXPECT_EQ(Render(long_chat, true),
            "<｜begin▁of▁sentence｜>S<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"
            "<｜User｜>u2<｜Assistant｜></think>plain<｜end▁of▁sentence｜><｜User｜>u3<｜Assistant｜><think>");
  EXPECT_EQ(Render(long_chat, false),
            "<｜begin▁of▁sentence｜>S<｜User｜>u1<｜Assistant｜></think>a1<｜end▁of▁sentence｜>"
            "<｜User｜>u2<｜Assistant｜></think>plain<｜end▁of▁sentence｜><｜User｜>u3<｜Assistant｜></think>");
  // Everything up to the last </think> is dropped.
  EXPECT_EQ(Render({{"user", "u"}, {"assistant", "a</think>b</think>c"}, {"user", "v"}}, true),
            "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜></think>c<｜end▁of▁sentence｜>"
            "<｜User｜>v<｜Assistant｜><think>");
  EXPECT_EQ(Render({{"user", "u"}, {"assistant", "</think>"}, {"user", "<think>v"}}, false),
            "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜></think><｜end▁of▁sentence｜>"
            "<｜User｜><think>v<｜Assistant｜></think>");
  EXPECT_EQ(Render({{"user", "u"}, {"assistant", ""}, {"user", ""}}, true),
            "<｜begin▁of▁sentence｜><｜User｜>u<｜Assistant｜></think><｜end▁of▁sentence｜>"
            "<｜User｜><｜Assistant｜><think>");
}

TEST(RenderChatCompat, ErrorsAreUnchanged) {
  EXPECT_EQ(Render({}, true), "error: messages: at least one message is needed");
  EXPECT_EQ(Render({{"system", "s"}}, true),
            "error: messages[0].role: the last message must be a user turn");
  EXPECT_EQ(Render({{"user", "a"}, {"system", "b"}, {"user", "c"}}, true),
            "error: messages[1].role: system is only allowed first");
  EXPECT_EQ(Render({{"system", "a"}, {"system", "b"}, {"user", "c"}}, true),
            "error: messages[1].role: system is only allowed first");
  EXPECT_EQ(Render({{"user", "a"}, {"robot", "b"}}, true),
            "error: messages[1].role: \"robot\" is not system, user or assistant");
  EXPECT_EQ(Render({{"user", "a"}, {"tool", "b"}}, true),
            "error: messages[1].role: \"tool\" is not system, user or assistant");
  EXPECT_EQ(Render({{"user", "a"}, {"developer", "b"}}, true),
            "error: messages[1].role: \"developer\" is not system, user or assistant");
  EXPECT_EQ(Render({{"assistant", "a"}, {"user", "b"}}, true),
            "error: messages[0].role: expected a user turn (turns alternate, starting with user)");
  EXPECT_EQ(Render({{"user", "a"}, {"user", "b"}}, true),
            "error: messages[1].role: expected a assistant turn (turns alternate, starting with "
            "user)");
  EXPECT_EQ(Render({{"user", "a"}, {"assistant", "b"}}, true),
            "error: messages[1].role: the last message must be a user turn");
}

}  // namespace
}  // namespace dsv4
