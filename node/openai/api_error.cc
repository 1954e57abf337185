#include "node/openai/api_error.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace dsv4::openai {

std::string ApiError::Json() const {
  nlohmann::ordered_json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  e["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  nlohmann::ordered_json body;
  body["error"] = std::move(e);
  // Replace, not throw, on bytes that are not UTF-8 (an echoed value can carry them).
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

http::Response ApiError::ToResponse() const {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = Json();
  r.body += "\n";
  return r;
}

ApiError MakeError(int status, std::string type, std::string code, std::string message) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

ApiError InvalidField(const std::string& param, const std::string& problem) {
  ApiError e;
  e.param = param;
  e.message = absl::StrCat(param, ": ", problem);
  return e;
}

namespace {

// "field: problem" -> "field"; "" when the message has no such prefix.
std::string FieldOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "";
  for (size_t i = 0; i < colon; ++i) {
    const char c = message[i];
    if (c == ' ' || c == '"' || c == '\'') return "";
  }
  return message.substr(0, colon);
}

}  // namespace

ApiError FromStatus(const absl::Status& status, std::string (*rename)(const std::string&)) {
  ApiError e;
  std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: {
      e.status = 400;
      const std::string field = FieldOf(message);
      if (!field.empty()) {
        e.param = rename ? rename(field) : field;
        if (e.param != field) message = absl::StrCat(e.param, message.substr(field.size()));
      }
      break;
    }
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      e.code = "unavailable";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      e.code = "not_found";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "authentication_error";
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kAlreadyExists:
      e.status = 409;
      e.code = "conflict";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      e.type = "timeout";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
      break;
  }
  e.message = std::move(message);
  return e;
}

}  // namespace dsv4::openai
