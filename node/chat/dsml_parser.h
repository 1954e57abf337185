// DsmlParser: splits one DeepSeek-V4 generated turn into reasoning, content and tool calls as
// the text streams in (spec: design/dsv4-chat-and-tools.md §4-§7, §9, §10). Pure logic (no
// clock, no I/O), one instance per request. Only the V4 dialect: outer tag `tool_calls` (V3.2's
// `function_calls` is a malformed tag here; V4.1's spaced tags and ASCII `|DSML|` are text).
//
// Input: text deltas of whole UTF-8 characters, tagged with the channel the engine generated
// them in (reasoning: before the </think> token; content: after it); a tag may be split at any
// character. Output: append-only deltas whose concatenation is the same for every split of the
// same text (ParseTurn is the same machine over whole deltas).
//
// States: TEXT (reasoning or content) -> BLOCK (between calls) <-> INVOKE (between parameters)
// <-> VALUE (a parameter's value). Once in BLOCK, the rest of the turn is tool markup.
//
// TEXT, always:
//  * Reasoning ends at the first content-channel delta, at a literal `</think>` in the text, or
//    when tool markup starts (an implicit </think>, §9). It never reopens: reasoning-channel
//    text after that is content (or markup). Without any of these, reasoning stays reasoning,
//    also at Finish (truncated or not): the HTTP layer decides the §9 fallback.
//  * Leading newlines of content are dropped (deepseek-recipe); reasoning is kept verbatim.
//    A literal EOS `<｜end▁of▁sentence｜>` is stripped; a stray `</think>` in content is
//    swallowed.
// TEXT with tools on:
//  * `\n*<｜DSML｜` (any opening DSML tag) starts tool markup; the newlines before it belong to
//    it and are dropped. `<｜DSML｜tool_calls>` is the normal opener; an orphan
//    `<｜DSML｜invoke …>` opens an implicit block (recovered, like deepseek-recipe); any other
//    opening DSML tag is an error in the block (see below).
//  * A closing `</｜DSML｜NAME>` and a bare `｜DSML｜` are dropped with the newlines before them;
//    text continues. If a dropped token leaves output ending in a sentinel prefix (`｜DSM` +
//    `</think>` + `L｜`), the completion is dropped too: `｜DSML｜` never reaches reasoning or
//    content.
//  * What may still become one of these (`\n*` + a prefix of `<｜DSML｜`, `</｜DSML｜`,
//    `｜DSML｜`, `</think>`, EOS) is held back until decided. At Finish, or when the reasoning
//    channel closes, held text that began a tag (`<｜…`, `</｜…`, with its newlines) is dropped;
//    anything else held (`<`, `</thi`, `｜DS`, newlines) is released as text.
// TEXT with tools off: DSML is plain content (start is ignored); only EOS, `</think>` and the
//    leading newlines are handled, and held prefixes of EOS/`</think>` are released at Finish.
//
// Tool markup, tolerant of the drift reported in §7:
//  * Whitespace between tags is skipped. Tags are exact: `<｜DSML｜tool_calls>`,
//    `<｜DSML｜invoke name="NAME">`, `<｜DSML｜parameter name="KEY" string="true|false">`
//    (NAME, KEY: up to 1024 bytes of anything but `"`), `</｜DSML｜parameter|invoke|tool_calls>`.
//  * Stray or doubled closers, a doubled opener and empty blocks are absorbed. After
//    `</｜DSML｜tool_calls>` the parser stays between calls: a second block (or orphan invoke)
//    is parsed too and its calls continue the indices; any other text there is dropped, as is
//    text between calls inside a block (neither is an error).
//  * An outer or sibling tag closes what is open: `</｜DSML｜invoke>` or `</｜DSML｜tool_calls>`
//    inside a value ends the parameter too; `<｜DSML｜invoke …>` or `</｜DSML｜tool_calls>`
//    between parameters ends the current call (which stays valid).
//  * Inside a value only `</｜DSML｜` ends it (the reference terminator): `<`, `</x` or even
//    `<｜DSML｜…` is value text. string="true" values are streamed JSON-escaped (`"`, `\`,
//    control characters; non-ASCII kept) as they arrive, holding back only a possible closer
//    prefix; string="false" values are buffered to the closer, checked with
//    nlohmann::json::accept (a NUL byte is refused) and spliced verbatim.
//  * Arguments use the reference spacing: `{"K": V`, `, "K": V`, `}`; `{}` without parameters.
//    A call's first delta (index, id, name, arguments "") is emitted when its invoke tag is
//    complete, in a ToolCallDelta of its own; index counts emitted calls from 0.
//  * Invalid (error() keeps the first; later calls are still parsed): a name not in tool_names
//    (or empty; an empty tool_names list accepts any non-empty name), a duplicate parameter, a
//    string="false" value that is not JSON, a malformed DSML tag (`<｜DSML｜` or `</｜DSML｜`
//    followed by anything but the tags above), a parameter tag outside an invoke, text other
//    than whitespace between parameters (e.g. a JSON body). Nothing more of that call is
//    emitted (of an invalid name, nothing at all), so its arguments stay an unterminated but
//    uncorrupted prefix, and it does not count in calls(). A malformed tag is skipped up to its
//    `>` (or the next `<`).
//  * Finish inside a call (truncated or not): the incomplete call is dropped; if its start was
//    emitted and it was valid so far, error() says "tool call N (NAME): truncated by the length
//    limit" (truncated) or "…: generation ended inside the call". Finish between calls or
//    inside a tag that never completed sets nothing. Held markup never becomes text.
// Forced starts (tools on): kBlock = the prompt ended with `<｜DSML｜tool_calls>\n` (tool_choice
// required); kInvoke = it ended with `<｜DSML｜invoke name="forced_name">\n` (named): that call's
// first delta comes with the first Feed or Finish. Both parse all text as markup, whatever the
// channel (no reasoning).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace dsv4::chat {

enum class Channel { kReasoning, kContent };

struct ToolCallDelta {
  int index = 0;          // counts calls in the response from 0
  std::string id;         // set on the first delta of a call only
  std::string name;       // set on the first delta of a call only
  std::string arguments;  // a fragment; the concatenation over a call's deltas is its JSON object
};

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;  // per call: the first delta, then argument fragments
  bool empty() const;
};

struct ParserOptions {
  bool tools = false;  // false: no tool parsing at all (reasoning/content split only)
  std::vector<std::string> tool_names;  // the request's tools; a call to another name is invalid
  enum class Start { kContent, kBlock, kInvoke } start = Start::kContent;
  std::string forced_name;                   // kInvoke: the name in the prompt's invoke tag
  std::function<std::string()> new_call_id;  // ids for calls ("call_" + 24 hex by default)
};

// Non-streaming: the same machine over the given deltas; complete, valid calls only.
struct ParsedTurn {
  std::string reasoning;
  std::string content;
  struct Call {
    std::string id, name, arguments;
  };
  std::vector<Call> calls;
  absl::Status error;
};
ParsedTurn ParseTurn(const ParserOptions& options,
                     const std::vector<std::pair<Channel, std::string>>& deltas, bool truncated);

class DsmlParser {
 public:
  explicit DsmlParser(ParserOptions options);

  ParsedDelta Feed(Channel channel, std::string_view text);
  // End of generation. `truncated`: stopped by a length cap (only changes the error message of an
  // incomplete call). Later Feed/Finish calls return nothing.
  ParsedDelta Finish(bool truncated);

  int calls() const { return calls_; }                  // complete, valid calls so far
  const absl::Status& error() const { return error_; }  // the first invalid call, or OK

 private:
  enum class State { kText, kBlock, kInvoke, kValue, kSkipTag };
  struct Tag;

  static Tag Lex(std::string_view in);  // the DSML tag at in[0] == '<'
  void Begin(ParsedDelta* out);
  void Run(ParsedDelta* out);
  size_t StepText(size_t pos, ParsedDelta* out);
  size_t StartMarkup(std::string_view in, size_t at, ParsedDelta* out);
  size_t StepMarkup(size_t pos, ParsedDelta* out);
  size_t StepValue(size_t pos, ParsedDelta* out);
  size_t StepSkip(size_t pos);
  void FlushText(ParsedDelta* out);
  void EndReasoning();
  void EmitText(std::string_view text, ParsedDelta* out);
  void EmitAfterNewlines(std::string_view text, ParsedDelta* out);
  void OnTag(const Tag& tag, ParsedDelta* out);
  void StartCall(const std::string& name, ParsedDelta* out);
  void StartParam(const std::string& key, bool is_string, ParsedDelta* out);
  void EndParam(ParsedDelta* out);
  void EndCall(ParsedDelta* out);
  void Args(std::string_view text, ParsedDelta* out);
  void ValueText(std::string_view text, ParsedDelta* out);
  void Invalidate(const std::string& why);
  void SetError(const std::string& message);
  std::string CallLabel() const;

  ParserOptions opt_;
  State state_ = State::kText;
  State skip_return_ = State::kBlock;  // where kSkipTag goes after the malformed tag
  std::string buf_;                    // undecided input
  size_t newlines_ = 0;                // TEXT: undecided newlines before buf_
  bool begun_ = false;
  bool finished_ = false;
  bool reasoning_open_ = true;    // TEXT is reasoning until it ends (see above)
  bool content_started_ = false;  // a non-newline content character was emitted
  // The end of the current channel's output that is a proper prefix of `｜DSML｜` (hold-back
  // keeps it from being completed, except across a dropped token such as `</think>`).
  std::string tail_;
  // The current call (between its invoke tag and its end).
  bool in_call_ = false;
  bool call_valid_ = false;  // emitted and nothing invalid seen yet
  int call_index_ = 0;       // its index (or the index it would have had)
  std::string call_name_;
  std::vector<std::string> keys_;  // its parameter names so far
  // The current parameter.
  std::string key_;
  bool string_value_ = false;
  std::string value_;  // a string="false" value up to its closer
  int emitted_ = 0;    // calls whose first delta was emitted
  int calls_ = 0;
  std::vector<int> complete_;  // indices of the complete, valid calls
  absl::Status error_;

  friend ParsedTurn ParseTurn(const ParserOptions&,
                              const std::vector<std::pair<Channel, std::string>>&, bool);
};

// "call_" + 24 random hex digits.
std::string NewCallId();

}  // namespace dsv4::chat
