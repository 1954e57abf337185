// A small HTTP/1.1 server for the node's own endpoints (/metrics today; the OpenAI-compatible API
// builds on it), on Boost.Beast over Boost.Asio: asynchronous, so an idle or slow connection costs
// memory, not a thread; its threads are created here with default stacks (the prometheus-cpp
// exposer's civetweb workers had ~104 KiB stacks, which OpenBLAS's static TLS overflowed; see
// docs/serving.md "HTTP listeners"). Optional TLS (the node's --tls-* files, mutual TLS included).
//
// Limits: at most `max_connections` open connections and `max_connections_per_client` from one
// IP address; at a cap the oldest connection that waits for a request (idle keep-alive, a slow
// sender; the same client's at its own cap) is closed to make room, and when there is none the
// new connection is closed at once; a
// request's head and body must arrive within `request_timeout` (slow senders are cut off); a
// keep-alive connection waits `idle_timeout` for its next request; a head over `max_header_bytes`
// gets 431, a body over `max_body_bytes` 413, a malformed request 400, an unknown path 404 and a
// known path with another method 405 (with Allow). GET routes answer HEAD too.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "node/server/tls.h"

namespace dsv4::http {

struct Request {
  std::string method;  // "GET", "HEAD", "POST", ...
  std::string path;    // the target up to '?'
  std::string query;   // after '?', undecoded
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case
  std::string body;
  std::string peer;  // "127.0.0.1:40404"
  // The first header of that (lower-case) name, or null.
  const std::string* Header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Given to a handler with its request: answer exactly once, from any thread, either whole
// (Respond) or streamed (StartStream, Send..., End). A responder dropped without an answer answers
// 500; one dropped mid-stream ends the stream.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Respond(Response response) = 0;
  // A streamed answer (server-sent events): the head goes out with chunked transfer encoding (its
  // body, when not empty, is the first chunk), then every Send() is one chunk, in order, and End()
  // closes the body; the connection then serves its next request. Send() returns false once the
  // client is gone (what it was given is dropped). A client that does not read is cut off when
  // `max_stream_buffer_bytes` wait for it or a write makes no progress for `request_timeout`.
  virtual void StartStream(Response head) = 0;
  virtual bool Send(std::string chunk) = 0;
  virtual void End() = 0;
  // `on_gone` runs once, on an I/O thread, when the client closes its connection (or is cut off)
  // before the answer is complete; at once when it already did. Plain TCP notices a close while
  // the answer is pending; TLS (where the close cannot be told from more data without reading it)
  // notices it at the next write that fails.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
  virtual bool client_gone() const = 0;
};

using Handler = std::function<void(const Request& request, std::shared_ptr<Responder> responder)>;

class Router {
 public:
  void Add(std::string method, std::string path, Handler handler);
  // The handler for (method, path), HEAD falling back to GET; null when none. `allow` receives
  // the methods the path has ("" when the path is unknown).
  const Handler* Find(std::string_view method, std::string_view path, std::string* allow) const;

 private:
  struct Route {
    std::string method;
    std::string path;
    Handler handler;
  };
  std::vector<Route> routes_;
};

struct ServerOptions {
  std::string name = "http";  // in logs and errors ("metrics")
  std::string host = "127.0.0.1";  // a literal address (node/server/listen_address.h)
  int port = 0;                    // 0 = any free port
  int threads = 2;
  int max_connections = 1024;
  int max_connections_per_client = 64;  // per client IP address: one client cannot take them all
  std::chrono::milliseconds request_timeout{10000};
  std::chrono::milliseconds idle_timeout{30000};
  uint32_t max_header_bytes = 16 << 10;
  uint64_t max_body_bytes = 1 << 20;
  uint64_t max_stream_buffer_bytes = 8 << 20;  // a streamed answer's bytes waiting for the client
  // Stop() lets answers already handed to connections finish writing for this long.
  std::chrono::milliseconds stop_grace{2000};
  const TlsCredentials* tls = nullptr;  // null: plain HTTP
  // The body of the server's own errors (400 malformed, 404, 405, 413, 431, 500 no answer): plain
  // text unless given (the OpenAI API answers with its error objects).
  std::function<Response(int status, std::string_view message)> error_response;
};

struct ServerStats {
  int64_t open_connections = 0;
  uint64_t accepted = 0;
  uint64_t refused = 0;   // closed at accept: at a cap with no connection to evict
  uint64_t evicted = 0;   // idle connections closed to make room for new ones
  uint64_t requests = 0;  // answered requests (any status)
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options, Router router);
  ~Server();
  int port() const { return port_; }
  ServerStats stats() const;
  // Closes the listener and the idle connections, gives answers in progress up to `stop_grace` to
  // be written (nothing new is queued once stopping), then closes every connection; idempotent.
  void Stop();

  struct Core;

 private:
  Server() = default;
  std::shared_ptr<Core> core_;
  int port_ = 0;
};

}  // namespace dsv4::http
