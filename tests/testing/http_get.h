// Minimal HTTP/1.0 GET over loopback for tests (the /metrics endpoint).
#pragma once

#include <string>

namespace dsv4::testing {

// Returns the response body, or "" on any failure. `status` receives the HTTP status code.
std::string HttpGet(int port, const std::string& path, int* status = nullptr);

// Runs a shell command, returning its exit code and combined output.
int RunCommand(const std::string& cmd, std::string* output);

}  // namespace dsv4::testing
