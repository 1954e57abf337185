#include "node/chat/dsml_parser.h"

#include <algorithm>
#include <cstdint>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4::chat {
namespace {

constexpr std::string_view kSentinel = "｜DSML｜";
constexpr std::string_view kOpenTag = "<｜DSML｜";
constexpr std::string_view kCloseTag = "</｜DSML｜";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kWhitespace = " \t\n\r";
// Bounds that keep a malformed tag from holding input forever: the word after the sentinel
// (`invoke`, `tool_calls`, ...) and a quoted NAME/KEY.
constexpr size_t kMaxTagWord = 16;
constexpr size_t kMaxName = 1024;

enum class Match { kOk, kNeedMore, kMismatch };

// Matches `lit` at in[*at], advancing *at over the matching part.
Match Expect(std::string_view in, size_t* at, std::string_view lit) {
  for (char c : lit) {
    if (*at == in.size()) return Match::kNeedMore;
    if (in[*at] != c) return Match::kMismatch;
    ++*at;
  }
  return Match::kOk;
}

// Reads a NAME up to (not including) the next '"'; *at is left on the quote.
Match Quoted(std::string_view in, size_t* at, std::string* name) {
  const size_t start = *at;
  const size_t end = in.find('"', start);
  if (end == std::string_view::npos || end - start > kMaxName) {
    if (in.size() - start <= kMaxName) return Match::kNeedMore;
    *at = start + kMaxName;
    return Match::kMismatch;
  }
  name->assign(in.substr(start, end - start));
  *at = end;
  return Match::kOk;
}

// The length of the longest suffix of `in` that is a proper prefix of `pattern`.
size_t PartialSuffix(std::string_view in, std::string_view pattern) {
  for (size_t len = std::min(pattern.size() - 1, in.size()); len > 0; --len) {
    if (in.substr(in.size() - len) == pattern.substr(0, len)) return len;
  }
  return 0;
}

// JSON string escaping as Python's json.dumps(ensure_ascii=False): `"`, `\` and control
// characters; everything else (non-ASCII included) is kept.
std::string JsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out;
}

// A short quoted excerpt of model text for error messages (cut on a UTF-8 character boundary).
std::string Excerpt(std::string_view s) {
  constexpr size_t kMax = 48;
  if (s.size() <= kMax) return absl::StrCat("\"", AV(JsonEscape(s)), "\"");
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat("\"", AV(JsonEscape(s.substr(0, cut))), "\"...");
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

struct DsmlParser::Tag {
  enum class Lex { kNeedMore, kNotTag, kMalformed, kTag } lex = Lex::kNeedMore;
  enum class Type { kOpenBlock, kCloseBlock, kInvoke, kCloseInvoke, kParam, kCloseParam };
  Type type = Type::kOpenBlock;
  size_t len = 0;      // kTag: its length; kMalformed: the bytes known to belong to it
  bool ended = false;  // kMalformed: `len` includes the tag's closing '>'
  std::string name;    // kInvoke: NAME; kParam: KEY
  bool is_string = false;
};

bool ParsedDelta::empty() const {
  return reasoning.empty() && content.empty() && tool_calls.empty();
}

std::string NewCallId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "call_";
  const uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) id += kHex[(a >> (4 * i)) & 0xf];
  for (int i = 0; i < 8; ++i) id += kHex[(b >> (4 * i)) & 0xf];
  return id;
}

DsmlParser::DsmlParser(ParserOptions options) : opt_(std::move(options)) {
  if (!opt_.new_call_id) opt_.new_call_id = NewCallId;
  if (!opt_.tools) opt_.start = ParserOptions::Start::kContent;
  if (opt_.start != ParserOptions::Start::kContent) {
    reasoning_open_ = false;
    state_ = State::kBlock;
  }
}

// Lexes the DSML tag that starts `in` (in[0] == '<'). Until the sentinel is complete a mismatch
// means "not a tag" (plain '<'); after it, a mismatch is a malformed tag.
DsmlParser::Tag DsmlParser::Lex(std::string_view in) {
  using L = Tag::Lex;
  using T = Tag::Type;
  Tag t;
  const bool close = in.size() >= 2 && in[1] == '/';
  size_t at = 0;
  const Match sentinel = Expect(in, &at, close ? kCloseTag : kOpenTag);
  if (sentinel != Match::kOk) {
    t.lex = sentinel == Match::kNeedMore ? L::kNeedMore : L::kNotTag;
    return t;
  }
  auto malformed = [&]() {
    t.lex = L::kMalformed;
    t.ended = at < in.size() && in[at] == '>';
    t.len = at + (t.ended ? 1 : 0);
    return t;
  };
  auto expect = [&](std::string_view lit) { return Expect(in, &at, lit); };
  const size_t word_at = at;
  while (at < in.size() && at - word_at < kMaxTagWord &&
         ((in[at] >= 'a' && in[at] <= 'z') || in[at] == '_')) {
    ++at;
  }
  if (at == in.size()) return t;  // kNeedMore
  const std::string_view word = in.substr(word_at, at - word_at);
  Match m = Match::kMismatch;
  if (close) {
    if (in[at] != '>') return malformed();
    if (word == "parameter")
      t.type = T::kCloseParam;
    else if (word == "invoke")
      t.type = T::kCloseInvoke;
    else if (word == "tool_calls")
      t.type = T::kCloseBlock;
    else
      return malformed();
    m = expect(">");
  } else if (word == "tool_calls") {
    t.type = T::kOpenBlock;
    m = expect(">");
  } else if (word == "invoke") {
    t.type = T::kInvoke;
    m = expect(" name=\"");
    if (m == Match::kOk) m = Quoted(in, &at, &t.name);
    if (m == Match::kOk) m = expect("\">");
  } else if (word == "parameter") {
    t.type = T::kParam;
    m = expect(" name=\"");
    if (m == Match::kOk) m = Quoted(in, &at, &t.name);
    if (m == Match::kOk) m = expect("\" string=\"");
    if (m == Match::kOk) {
      if (at == in.size()) return t;  // kNeedMore
      t.is_string = in[at] == 't';
      m = expect(t.is_string ? "true\">" : "false\">");
    }
  }
  if (m == Match::kNeedMore) return t;
  if (m == Match::kMismatch) return malformed();
  t.lex = L::kTag;
  t.len = at;
  return t;
}

void DsmlParser::Begin(ParsedDelta* out) {
  if (begun_) return;
  begun_ = true;
  // The prompt already holds the invoke tag of the named tool.
  if (opt_.start == ParserOptions::Start::kInvoke) StartCall(opt_.forced_name, out);
}

ParsedDelta DsmlParser::Feed(Channel channel, std::string_view text) {
  ParsedDelta out;
  if (finished_) return out;
  Begin(&out);
  if (state_ == State::kText && reasoning_open_ && channel == Channel::kContent) {
    // The </think> token came between the deltas: what reasoning held back is decided now.
    FlushText(&out);
    EndReasoning();
  }
  buf_.append(text);
  Run(&out);
  return out;
}

ParsedDelta DsmlParser::Finish(bool truncated) {
  ParsedDelta out;
  if (finished_) return out;
  Begin(&out);
  finished_ = true;
  if (state_ == State::kText) {
    FlushText(&out);
  } else if (in_call_ && call_valid_) {
    Invalidate(truncated ? "truncated by the length limit" : "generation ended inside the call");
  }
  buf_.clear();
  return out;
}

// Steps the machine over buf_ until it needs more input; keeps only the undecided rest.
void DsmlParser::Run(ParsedDelta* out) {
  size_t pos = 0;
  while (pos < buf_.size()) {
    const size_t before = pos;
    const State was = state_;
    switch (state_) {
      case State::kText:
        pos = StepText(pos, out);
        break;
      case State::kBlock:
      case State::kInvoke:
        pos = StepMarkup(pos, out);
        break;
      case State::kValue:
        pos = StepValue(pos, out);
        break;
      case State::kSkipTag:
        pos = StepSkip(pos);
        break;
    }
    if (pos == before && state_ == was) break;
  }
  buf_.erase(0, pos);
}

// Reasoning or content text up to the next thing that is not plain text.
size_t DsmlParser::StepText(size_t pos, ParsedDelta* out) {
  const std::string_view in = std::string_view(buf_).substr(pos);
  if (!tail_.empty() && newlines_ == 0) {
    // Text that was joined to the output across a dropped token (`｜DSM` + `</think>` + `L｜`)
    // must not complete a sentinel there: that completion is dropped too.
    const std::string_view rest = kSentinel.substr(tail_.size());
    if (StartsWith(in, rest)) return pos + rest.size();
    if (StartsWith(rest, in)) return pos;  // undecided
  }
  if (opt_.tools && in.find_first_not_of('\n') == std::string_view::npos) {
    // Newlines may precede a tool opener: counted, not rescanned (a run of them stays linear).
    newlines_ += in.size();
    return pos + in.size();
  }
  enum class What { kNone, kThinkEnd, kEos, kDsml } what = What::kNone;
  size_t at = in.size();
  auto consider = [&](size_t p, What w) {
    if (p != std::string_view::npos && p < at) {
      at = p;
      what = w;
    }
  };
  consider(in.find(kThinkEnd), What::kThinkEnd);
  consider(in.find(kEos), What::kEos);
  if (opt_.tools) {
    size_t s = in.find(kSentinel);
    if (s != std::string_view::npos) {
      if (s >= 1 && in[s - 1] == '<')
        s -= 1;
      else if (s >= 2 && in.substr(s - 2, 2) == "</")
        s -= 2;
      consider(s, What::kDsml);
    }
  }
  if (what == What::kNone) {
    // Hold back what may still become a tag; with tools on, also the newlines before it, which
    // would belong to a tool opener.
    size_t keep = std::max(PartialSuffix(in, kThinkEnd), PartialSuffix(in, kEos));
    if (opt_.tools) {
      keep = std::max({keep, PartialSuffix(in, kOpenTag), PartialSuffix(in, kCloseTag),
                       PartialSuffix(in, kSentinel)});
      while (keep < in.size() && in[in.size() - keep - 1] == '\n') ++keep;
    }
    if (keep == in.size()) return pos;
    EmitAfterNewlines(in.substr(0, in.size() - keep), out);
    return pos + in.size() - keep;
  }
  if (what != What::kDsml) {
    EmitAfterNewlines(in.substr(0, at), out);
    // </think> ends the reasoning; a stray one in content is swallowed. EOS text is stripped.
    if (what == What::kThinkEnd && reasoning_open_) EndReasoning();
    return pos + at + (what == What::kThinkEnd ? kThinkEnd.size() : kEos.size());
  }
  return pos + StartMarkup(in, at, out);
}

// DSML markup at in[at] in the text state; returns the bytes consumed. The newlines right
// before it belong to it.
size_t DsmlParser::StartMarkup(std::string_view in, size_t at, ParsedDelta* out) {
  size_t text_end = at;
  while (text_end > 0 && in[text_end - 1] == '\n') --text_end;
  size_t len = kSentinel.size();  // a bare sentinel
  if (in[at] == '<' && in[at + 1] == '/') {
    // A stray closer: dropped (malformed ones as far as they are known), text continues.
    const Tag t = Lex(in.substr(at));
    if (t.lex == Tag::Lex::kNeedMore) {
      if (text_end > 0) EmitAfterNewlines(in.substr(0, text_end), out);
      return text_end;
    }
    len = t.len;
  }
  if (text_end > 0) {
    EmitAfterNewlines(in.substr(0, text_end), out);
  } else {
    newlines_ = 0;
  }
  if (in[at] == '<' && in[at + 1] != '/') {
    // Tool markup: the rest of the turn. It ends the reasoning, if still open (§9).
    reasoning_open_ = false;
    state_ = State::kBlock;
    return at;
  }
  return at + len;
}

void DsmlParser::EmitAfterNewlines(std::string_view text, ParsedDelta* out) {
  if (newlines_ > 0) {
    EmitText(std::string(newlines_, '\n'), out);
    newlines_ = 0;
  }
  EmitText(text, out);
}

void DsmlParser::EndReasoning() {
  reasoning_open_ = false;
  tail_.clear();
}

void DsmlParser::EmitText(std::string_view text, ParsedDelta* out) {
  if (!reasoning_open_ && !content_started_) {
    const size_t first = text.find_first_not_of('\n');
    if (first == std::string_view::npos) return;
    text.remove_prefix(first);
    content_started_ = true;
  }
  if (text.empty()) return;
  (reasoning_open_ ? out->reasoning : out->content).append(text);
  if (opt_.tools) {
    std::string joined = tail_;
    joined.append(text.substr(text.size() - std::min(text.size(), kSentinel.size() - 1)));
    tail_ = joined.substr(joined.size() - PartialSuffix(joined, kSentinel));
  }
}

// Releases what the text state held back; a partial DSML tag (with its newlines) never
// reaches the output.
void DsmlParser::FlushText(ParsedDelta* out) {
  const std::string_view rest = buf_;
  const size_t first = rest.find_first_not_of('\n');
  if (opt_.tools && first != std::string_view::npos &&
      (StartsWith(rest.substr(first), "<｜") || StartsWith(rest.substr(first), "</｜"))) {
    newlines_ = 0;
  } else {
    EmitAfterNewlines(rest, out);
  }
  buf_.clear();
}

// Between calls (kBlock) or between the parameters of a call (kInvoke).
size_t DsmlParser::StepMarkup(size_t pos, ParsedDelta* out) {
  const std::string_view in = std::string_view(buf_).substr(pos);
  if (kWhitespace.find(in[0]) != std::string_view::npos) {
    const size_t n = in.find_first_not_of(kWhitespace);
    return pos + (n == std::string_view::npos ? in.size() : n);
  }
  Tag t;
  if (in[0] == '<') {
    t = Lex(in);
    if (t.lex == Tag::Lex::kNeedMore) return pos;
  } else {
    t.lex = Tag::Lex::kNotTag;
  }
  switch (t.lex) {
    case Tag::Lex::kTag:
      OnTag(t, out);
      return pos + t.len;
    case Tag::Lex::kMalformed: {
      const std::string why = absl::StrCat("malformed tag ", Excerpt(in.substr(0, t.len)));
      if (in_call_) {
        Invalidate(why);
      } else {
        SetError(absl::StrCat("tool call ", emitted_, ": ", why));
      }
      if (!t.ended) {
        skip_return_ = state_;
        state_ = State::kSkipTag;
      }
      return pos + t.len;
    }
    default: {
      // Text that is no tag: dropped; inside a call it makes the call invalid (e.g. a JSON body
      // instead of parameter tags, which would otherwise become `{}`).
      if (state_ == State::kInvoke) Invalidate("unexpected text between parameters");
      const size_t n = in.find('<', 1);
      return pos + (n == std::string_view::npos ? in.size() : n);
    }
  }
}

void DsmlParser::OnTag(const Tag& tag, ParsedDelta* out) {
  using T = Tag::Type;
  if (state_ == State::kBlock) {
    if (tag.type == T::kInvoke) {
      StartCall(tag.name, out);
    } else if (tag.type == T::kParam) {
      // Its value then is text between calls: dropped.
      SetError(absl::StrCat("tool call ", emitted_, ": parameter ", Excerpt(tag.name),
                            " outside an invoke"));
    }
    return;  // openers and closers between calls are absorbed
  }
  switch (tag.type) {
    case T::kParam:
      StartParam(tag.name, tag.is_string, out);
      break;
    case T::kCloseInvoke:
    case T::kCloseBlock:
      EndCall(out);
      break;
    case T::kInvoke:  // the previous call's closer is missing: it ends here
      EndCall(out);
      StartCall(tag.name, out);
      break;
    case T::kOpenBlock:
    case T::kCloseParam:
      break;  // doubled or stray: absorbed
  }
}

// Inside a parameter value: everything up to the next `</｜DSML｜`.
size_t DsmlParser::StepValue(size_t pos, ParsedDelta* out) {
  const std::string_view in = std::string_view(buf_).substr(pos);
  const size_t closer = in.find(kCloseTag);
  const size_t text =
      closer == std::string_view::npos ? in.size() - PartialSuffix(in, kCloseTag) : closer;
  ValueText(in.substr(0, text), out);
  if (closer == std::string_view::npos) return pos + text;
  const Tag t = Lex(in.substr(closer));
  if (t.lex == Tag::Lex::kNeedMore) return pos + text;
  if (t.lex != Tag::Lex::kTag) {
    Invalidate(absl::StrCat("parameter ", Excerpt(key_), ": malformed tag ",
                            Excerpt(in.substr(closer, t.len))));
    state_ = State::kInvoke;
    if (!t.ended) {
      skip_return_ = State::kInvoke;
      state_ = State::kSkipTag;
    }
    return pos + closer + t.len;
  }
  EndParam(out);
  if (t.type != Tag::Type::kCloseParam) EndCall(out);  // the invoke or block closer ends the call
  return pos + closer + t.len;
}

// The rest of a malformed tag: up to its '>' or the next '<'.
size_t DsmlParser::StepSkip(size_t pos) {
  const std::string_view in = std::string_view(buf_).substr(pos);
  const size_t n = in.find_first_of("<>");
  if (n == std::string_view::npos) return pos + in.size();
  state_ = skip_return_;
  return pos + n + (in[n] == '>' ? 1 : 0);
}

void DsmlParser::StartCall(const std::string& name, ParsedDelta* out) {
  state_ = State::kInvoke;
  in_call_ = true;
  call_index_ = emitted_;
  call_name_ = name;
  keys_.clear();
  const bool known = !name.empty() && (opt_.tool_names.empty() ||
                                       std::find(opt_.tool_names.begin(), opt_.tool_names.end(),
                                                 name) != opt_.tool_names.end());
  if (!known) {
    call_valid_ = false;
    SetError(absl::StrCat(CallLabel(), ": not a tool of this request"));
    return;
  }
  call_valid_ = true;
  ++emitted_;
  ToolCallDelta first;
  first.index = call_index_;
  first.id = opt_.new_call_id();
  first.name = name;
  out->tool_calls.push_back(std::move(first));
}

void DsmlParser::StartParam(const std::string& key, bool is_string, ParsedDelta* out) {
  state_ = State::kValue;
  key_ = key;
  string_value_ = is_string;
  value_.clear();
  if (!call_valid_) return;
  if (std::find(keys_.begin(), keys_.end(), key) != keys_.end()) {
    Invalidate(absl::StrCat("duplicate parameter ", Excerpt(key)));
    return;
  }
  keys_.push_back(key);
  Args(absl::StrCat(keys_.size() == 1 ? "{\"" : ", \"", AV(JsonEscape(key)),
                    "\": ", is_string ? "\"" : ""),
       out);
}

void DsmlParser::ValueText(std::string_view text, ParsedDelta* out) {
  if (!call_valid_ || text.empty()) return;
  if (string_value_) {
    Args(JsonEscape(text), out);
  } else {
    value_.append(text);
  }
}

void DsmlParser::EndParam(ParsedDelta* out) {
  state_ = State::kInvoke;
  if (!call_valid_) return;
  if (string_value_) {
    Args("\"", out);
    return;
  }
  // Spliced verbatim like the reference, but only when it is JSON: the arguments must parse.
  // nlohmann's lexer takes a NUL byte for the end of the input, so it is refused first.
  if (value_.find('\0') != std::string::npos || !nlohmann::json::accept(value_)) {
    Invalidate(absl::StrCat("parameter ", Excerpt(key_),
                            " is string=\"false\" but not JSON: ", Excerpt(value_)));
    return;
  }
  Args(value_, out);
  value_.clear();
}

void DsmlParser::EndCall(ParsedDelta* out) {
  state_ = State::kBlock;
  in_call_ = false;
  if (!call_valid_) return;
  Args(keys_.empty() ? "{}" : "}", out);
  call_valid_ = false;
  ++calls_;
  complete_.push_back(call_index_);
}

// Appends an arguments fragment of the current call; the first delta (id, name) stays alone.
void DsmlParser::Args(std::string_view text, ParsedDelta* out) {
  if (out->tool_calls.empty() || out->tool_calls.back().index != call_index_ ||
      !out->tool_calls.back().name.empty()) {
    ToolCallDelta d;
    d.index = call_index_;
    out->tool_calls.push_back(std::move(d));
  }
  out->tool_calls.back().arguments.append(text);
}

void DsmlParser::Invalidate(const std::string& why) {
  if (!in_call_ || !call_valid_) return;  // one error per call: the first
  call_valid_ = false;
  SetError(absl::StrCat(CallLabel(), ": ", why));
}

void DsmlParser::SetError(const std::string& message) {
  if (error_.ok()) error_ = absl::InvalidArgumentError(message);
}

std::string DsmlParser::CallLabel() const {
  return absl::StrCat("tool call ", call_index_, " (", call_name_, ")");
}

ParsedTurn ParseTurn(const ParserOptions& options,
                     const std::vector<std::pair<Channel, std::string>>& deltas, bool truncated) {
  DsmlParser parser(options);
  ParsedTurn turn;
  std::vector<ParsedTurn::Call> by_index;
  auto take = [&](ParsedDelta d) {
    turn.reasoning += d.reasoning;
    turn.content += d.content;
    for (ToolCallDelta& c : d.tool_calls) {
      if (c.index >= static_cast<int>(by_index.size())) by_index.resize(c.index + 1);
      ParsedTurn::Call& call = by_index[c.index];
      if (!c.name.empty()) {
        call.id = std::move(c.id);
        call.name = std::move(c.name);
      }
      call.arguments += c.arguments;
    }
  };
  for (const auto& [channel, text] : deltas) take(parser.Feed(channel, text));
  take(parser.Finish(truncated));
  for (int i : parser.complete_) turn.calls.push_back(by_index[i]);
  turn.error = parser.error();
  return turn;
}

}  // namespace dsv4::chat
