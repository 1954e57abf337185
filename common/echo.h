// A value from outside (a request field, a flag, a file) quoted for an error message or a log
// line: at most `max_bytes` of it, non-printable bytes as \xNN, and "..." with the full length
// when it was cut. Every value echoed back to a caller goes through this, so an error can never
// grow with its input (a status travels in HTTP/2 trailers, which clients cap at 8-16 KiB).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dsv4 {

std::string EchoValue(std::string_view value, size_t max_bytes = 48);

}  // namespace dsv4
