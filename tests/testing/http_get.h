// Minimal HTTP/1.0 GET over loopback for tests (the /metrics endpoint).
#pragma once

#include <string>

namespace dsv4::testing {

// Returns the response body, or "" on any failure. `status` receives the HTTP status code.
std::string HttpGet(int port, const std::string& path, int* status = nullptr);

// Runs a shell command, returning its exit code and combined output.
int RunCommand(const std::string& cmd, std::string* output);

}  // namespace dsv4::testing

namespace dsv4::testing {

// A raw exchange with an HTTP server on loopback: `request` is sent as is on a fresh connection
// (then the sending side is shut when `half_close`) and the reply read until it is complete, the
// server closes the connection or `timeout_ms` passes.
struct RawReply {
  bool connected = false;
  int status = 0;        // 0 when no status line came back
  std::string head;      // status line and headers
  std::string body;
  bool timed_out = false;
};
RawReply HttpRaw(int port, const std::string& request, int timeout_ms = 5000,
                 bool half_close = false);

// A connected TCP socket to 127.0.0.1:port (the caller closes it), or -1.
int ConnectLoopback(int port);

}  // namespace dsv4::testing
