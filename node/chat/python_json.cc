#include "node/chat/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace dsv4::chat {
namespace {

// Python's json encoder (py_encode_basestring / c_encode_basestring with ensure_ascii=False)
// escapes exactly `"`, `\` and U+0000..U+001F; everything else, DEL and non-ASCII included,
// passes through as the bytes it is.
void AppendString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

void Append(const nlohmann::ordered_json& v, std::string* out) {
  using Type = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case Type::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        AppendString(it.key(), out);
        *out += ": ";
        Append(it.value(), out);
      }
      out->push_back('}');
      return;
    }
    case Type::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& element : v) {
        if (!first) *out += ", ";
        first = false;
        Append(element, out);
      }
      out->push_back(']');
      return;
    }
    case Type::string: AppendString(v.get_ref<const std::string&>(), out); return;
    case Type::boolean: *out += v.get<bool>() ? "true" : "false"; return;
    case Type::number_integer: *out += std::to_string(v.get<int64_t>()); return;
    case Type::number_unsigned: *out += std::to_string(v.get<uint64_t>()); return;
    case Type::number_float: *out += PythonFloatRepr(v.get<double>()); return;
    case Type::null:
    case Type::discarded:
    case Type::binary:  // no JSON spelling; never produced by parsing JSON text
      *out += "null";
      return;
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  Append(value, &out);
  return out;
}

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, as Python's repr picks them; only the layout differs.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));  // [-]d[.ddd]e±xx
  const size_t e = sci.find('e');
  std::string digits;
  bool negative = false;
  for (const char c : sci.substr(0, e)) {
    if (c == '-') negative = true;
    if (c >= '0' && c <= '9') digits.push_back(c);
  }
  const int exp = std::atoi(std::string(sci.substr(e + 1)).c_str());
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + tail;
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  }
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

}  // namespace dsv4::chat
