// Errors of the OpenAI-compatible API, as OpenAI sends them:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "messages[0].role", "code": null}}
// with the HTTP status that goes with them. The node's own errors (absl::Status, whose messages
// start with the offending field's path) map here in one place (FromStatus).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "node/http/http_server.h"

namespace dsv4::openai {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;   // "" = null
  std::string param;  // "" = null
  std::string message;

  // The error object's JSON text (without a trailing newline).
  std::string Json() const;
  http::Response ToResponse() const;
};

ApiError MakeError(int status, std::string type, std::string code, std::string message);

// 400 naming `param`: "param: problem".
ApiError InvalidField(const std::string& param, const std::string& problem);

// A Status of the node mapped to its HTTP form: INVALID_ARGUMENT and OUT_OF_RANGE 400 (the field
// taken from the message's "field: ..." prefix, renamed by `rename` from the node's field paths to
// the API's), RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, NOT_FOUND 404, UNAUTHENTICATED 401,
// ALREADY_EXISTS 409, DEADLINE_EXCEEDED 504, anything else 500.
ApiError FromStatus(const absl::Status& status,
                    std::string (*rename)(const std::string& node_field) = nullptr);

}  // namespace dsv4::openai
