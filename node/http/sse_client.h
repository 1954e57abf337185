// A blocking HTTP/1.1 client for server-sent events, for `dsv4-node loadgen --http` (one per
// client thread, its connection kept alive across requests): POSTs a JSON body and hands each
// `data:` payload to a callback as it arrives. Boost.Beast, like the server (http_server.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4::http {

class SseClient {
 public:
  SseClient(std::string host, int port, std::string api_key = "");
  ~SseClient();
  // POSTs `body` to `path`; `on_event` gets every event's data ("[DONE]" included). A status
  // other than 200 is an error carrying the response body. Reconnects when the connection was
  // closed.
  absl::Status Post(const std::string& path, const std::string& body,
                    const std::function<void(std::string_view data)>& on_event);
  // GET `path`: the body of a 200 answer, else an error.
  absl::StatusOr<std::string> Get(const std::string& path);

 private:
  struct Conn;
  absl::Status PostOnce(const std::string& path, const std::string& body,
                        const std::function<void(std::string_view data)>& on_event, bool* answered);
  std::string host_;
  int port_;
  std::string api_key_;
  std::unique_ptr<Conn> conn_;
};

}  // namespace dsv4::http
