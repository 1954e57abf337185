#include "common/echo.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dsv4 {

std::string EchoValue(std::string_view value, size_t max_bytes) {
  std::string out = "\"";
  const std::string_view shown = value.substr(0, max_bytes);
  for (char c : shown) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", u));
    }
  }
  out += '"';
  if (shown.size() < value.size()) absl::StrAppend(&out, "... (", value.size(), " bytes)");
  return out;
}

}  // namespace dsv4
