#include "node/http/sse_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"

namespace dsv4::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

struct SseClient::Conn {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  bool open = false;
};

SseClient::SseClient(std::string host, int port, std::string api_key)
    : host_(std::move(host)), port_(port), api_key_(std::move(api_key)), conn_(new Conn) {}

SseClient::~SseClient() = default;

absl::StatusOr<std::string> SseClient::Get(const std::string& path) {
  beast::error_code ec;
  Conn c;
  tcp::resolver resolver(c.ioc);
  auto results = resolver.resolve(host_, std::to_string(port_), ec);
  if (!ec) c.stream.connect(results, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("connect ", host_, ":", port_, ": ", ec.message()));
  bhttp::request<bhttp::empty_body> req{bhttp::verb::get, path, 11};
  req.set(bhttp::field::host, host_);
  if (!api_key_.empty()) req.set(bhttp::field::authorization, absl::StrCat("Bearer ", api_key_));
  bhttp::write(c.stream, req, ec);
  bhttp::response<bhttp::string_body> res;
  if (!ec) bhttp::read(c.stream, c.buffer, res, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("GET ", path, ": ", ec.message()));
  if (res.result_int() != 200) {
    return absl::UnknownError(absl::StrCat("GET ", path, ": HTTP ", res.result_int(), ": ", res.body()));
  }
  return res.body();
}

absl::Status SseClient::Post(const std::string& path, const std::string& body,
                             const std::function<void(std::string_view)>& on_event) {
  // A kept-alive connection the server has since closed fails before any answer: once more on a
  // fresh one.
  const bool reused = conn_->open;
  bool answered = false;
  absl::Status s = PostOnce(path, body, on_event, &answered);
  if (!s.ok() && reused && !answered) s = PostOnce(path, body, on_event, &answered);
  return s;
}

absl::Status SseClient::PostOnce(const std::string& path, const std::string& body,
                                 const std::function<void(std::string_view)>& on_event,
                                 bool* answered) {
  beast::error_code ec;
  if (!conn_->open) {
    conn_ = std::make_unique<Conn>();
    tcp::resolver resolver(conn_->ioc);
    auto results = resolver.resolve(host_, std::to_string(port_), ec);
    if (!ec) conn_->stream.connect(results, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("connect ", host_, ":", port_, ": ", ec.message()));
    conn_->stream.socket().set_option(tcp::no_delay(true), ec);
    conn_->open = true;
  }
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, path, 11};
  req.set(bhttp::field::host, host_);
  req.set(bhttp::field::content_type, "application/json");
  req.set(bhttp::field::accept, "text/event-stream");
  if (!api_key_.empty()) req.set(bhttp::field::authorization, absl::StrCat("Bearer ", api_key_));
  req.keep_alive(true);
  req.body() = body;
  req.prepare_payload();
  bhttp::write(conn_->stream, req, ec);
  if (ec) {
    conn_->open = false;
    return absl::UnavailableError(absl::StrCat("write: ", ec.message()));
  }
  bhttp::response_parser<bhttp::buffer_body> parser;
  parser.body_limit(boost::none);
  bhttp::read_header(conn_->stream, conn_->buffer, parser, ec);
  if (ec) {
    conn_->open = false;
    return absl::UnavailableError(absl::StrCat("read: ", ec.message()));
  }
  *answered = true;
  const int status = static_cast<int>(parser.get().result_int());
  std::string pending, error_body;
  char buf[16384];
  while (!parser.is_done()) {
    parser.get().body().data = buf;
    parser.get().body().size = sizeof(buf);
    // read_some: hand over each event as it arrives (read() would wait for a full buffer).
    bhttp::read_some(conn_->stream, conn_->buffer, parser, ec);
    if (ec == bhttp::error::need_buffer) ec = {};
    if (ec) {
      conn_->open = false;
      return absl::UnavailableError(absl::StrCat("read: ", ec.message()));
    }
    const size_t n = sizeof(buf) - parser.get().body().size;
    if (status != 200) {
      error_body.append(buf, n);
      continue;
    }
    pending.append(buf, n);
    // Events end at a blank line; each line "data: X" carries X.
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string_view event(pending.data(), end);
      size_t at = 0;
      while (at < event.size()) {
        size_t eol = event.find('\n', at);
        if (eol == std::string_view::npos) eol = event.size();
        std::string_view line = event.substr(at, eol - at);
        if (line.substr(0, 6) == "data: ") on_event(line.substr(6));
        at = eol + 1;
      }
      pending.erase(0, end + 2);
    }
  }
  if (!parser.keep_alive()) conn_->open = false;
  if (status != 200) {
    return absl::UnknownError(absl::StrCat("HTTP ", status, ": ", error_body.substr(0, 512)));
  }
  return absl::OkStatus();
}

}  // namespace dsv4::http
