// Listen addresses of the node's servers (--listen, --metrics-listen, --http-listen), parsed once
// so that a typo fails at start with the flag named, instead of binding something else:
// "HOST:PORT" with HOST an IPv4 address (four decimal octets), a bracketed IPv6 address
// ("[::]", "[::1]") or "localhost", and PORT a decimal number in [0, 65535] (0 = any free port).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dsv4 {

struct ListenAddress {
  std::string host;  // "127.0.0.1", "::1" (no brackets), "localhost"
  int port = 0;
  bool ipv6 = false;
  // "127.0.0.1:50051", "[::1]:50051": what gRPC's AddListeningPort takes.
  std::string ToString() const;
};

// `flag` names the option in errors: "--listen: port 99999 is outside [0, 65535]".
absl::StatusOr<ListenAddress> ParseListenAddress(std::string_view flag, std::string_view value);

}  // namespace dsv4
