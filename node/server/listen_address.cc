#include "node/server/listen_address.h"

#include <arpa/inet.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/echo.h"
#include "common/status.h"

namespace dsv4 {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool IsIpv4(std::string_view s) {
  int parts = 0;
  size_t at = 0;
  while (true) {
    const size_t dot = s.find('.', at);
    const std::string_view part = s.substr(at, dot == std::string_view::npos ? s.npos : dot - at);
    if (!AllDigits(part) || part.size() > 3) return false;
    if (part.size() > 1 && part[0] == '0') return false;  // "010" is octal to some parsers
    int v = 0;
    for (char c : part) v = v * 10 + (c - '0');
    if (v > 255) return false;
    ++parts;
    if (dot == std::string_view::npos) break;
    at = dot + 1;
  }
  return parts == 4;
}

}  // namespace

std::string ListenAddress::ToString() const {
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view flag, std::string_view value) {
  auto bad = [&](std::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(AV(flag), ": ", EchoValue(value), " ", AV(problem)));
  };
  const size_t colon = value.rfind(':');
  if (colon == std::string_view::npos) return bad("is not HOST:PORT");
  std::string_view host = value.substr(0, colon);
  const std::string_view port = value.substr(colon + 1);
  if (!AllDigits(port) || port.size() > 5) return bad("has no decimal port after the last ':'");
  ListenAddress out;
  out.port = 0;
  for (char c : port) out.port = out.port * 10 + (c - '0');
  if (out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(flag), ": port ", out.port, " is outside [0, 65535]"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    in6_addr addr;
    if (host.size() > 64 || inet_pton(AF_INET6, std::string(host).c_str(), &addr) != 1) {
      return bad("has an invalid IPv6 address in brackets");
    }
    out.ipv6 = true;
  } else if (host != "localhost" && !IsIpv4(host)) {
    return bad("needs an IPv4 address (four octets 0-255), [IPv6] or localhost before the port");
  }
  out.host = std::string(host);
  return out;
}

}  // namespace dsv4
