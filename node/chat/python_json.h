// JSON text exactly as Python's `json.dumps(obj, ensure_ascii=False)` writes it.
//
// DeepSeek's prompt encoder is Python: tool schemas and non-string tool-call arguments reach the
// prompt through json.dumps, and the model was trained on that spelling. A prompt that differs
// by a single space (nlohmann's dump() writes `{"a":1}`, Python `{"a": 1}`) is a different
// prompt: other tokens, no prefix-cache hits, and a model that imitates the drift. So this
// reproduces Python byte for byte rather than approximately.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dsv4::chat {

// Keys in the order the object holds them (ordered_json keeps the client's order), separators
// ", " and ": ", non-ASCII bytes unescaped, `"` `\` and control characters escaped as Python
// does (\n \r \t \b \f, other controls \u00xx in lower-case hex), `/` unescaped, integers as
// integers, floats as Python's repr (PythonFloatRepr), true/false/null.
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

// Python's repr() of a float: the shortest digits that round-trip, positional for decimal
// exponents -4..15 ("0.0001", "1.0", "1e+16" is the first exponent form), otherwise
// d[.ddd]e±XX with at least two exponent digits ("1e-05"). NaN/Infinity/-Infinity as json.dumps
// writes them (not valid JSON, but that is what Python emits).
std::string PythonFloatRepr(double value);

}  // namespace dsv4::chat
