#include "node/http/http_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsv4::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;

const std::string* Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Router::Add(std::string method, std::string path, Handler handler) {
  routes_.push_back({std::move(method), std::move(path), std::move(handler)});
}

const Handler* Router::Find(std::string_view method, std::string_view path,
                            std::string* allow) const {
  allow->clear();
  const Handler* get = nullptr;
  for (const Route& r : routes_) {
    if (r.path != path) continue;
    if (r.method == method) return &r.handler;
    if (r.method == "GET") get = &r.handler;
    absl::StrAppend(allow, allow->empty() ? "" : ", ", r.method, r.method == "GET" ? ", HEAD" : "");
  }
  return method == "HEAD" ? get : nullptr;
}

// One answer in progress: whether the client is still there, and who to tell when it is not.
// Shared by the session (its I/O) and the request's responder (the handler's thread).
struct Answer {
  std::mutex mu;
  std::function<void()> on_gone;
  std::atomic<bool> gone{false};
  std::atomic<uint64_t> waiting_bytes{0};  // streamed bytes not yet written to the socket
  bool complete = false;                    // the whole answer was written (session strand only)

  void SetOnGone(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!gone.load()) {
        on_gone = std::move(f);
        return;
      }
    }
    f();
  }
  void MarkGone() {
    std::function<void()> f;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (gone.exchange(true)) return;
      f.swap(on_gone);
    }
    if (f) f();
  }
};

class SessionBase {
 public:
  SessionBase(std::string address, net::any_io_executor strand)
      : address(std::move(address)), strand(std::move(strand)) {}
  virtual ~SessionBase() = default;
  virtual void Start() = 0;
  // These run on the session's strand; callers post them there (in order).
  virtual void Write(std::shared_ptr<Answer> answer, Response response) = 0;
  virtual void WriteHead(std::shared_ptr<Answer> answer, Response head) = 0;
  virtual void WriteChunk(std::shared_ptr<Answer> answer, std::string chunk) = 0;
  virtual void WriteEnd(std::shared_ptr<Answer> answer) = 0;
  virtual void Close() = 0;

  const std::string address;         // the client's IP address
  const net::any_io_executor strand;  // the connection's: its handlers never run concurrently
  std::atomic<bool> reading{false};  // waiting for (the rest of) a request: may be evicted
  std::atomic<bool> answering{false};  // a request was dispatched and its answer is not written
  std::atomic<bool> closing{false};  // chosen for eviction, or closed by Stop
};

struct Server::Core {
  ServerOptions options;
  Router router;
  net::io_context ioc;
  std::optional<ssl::context> tls;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> open{0};
  std::atomic<uint64_t> accepted{0}, refused{0}, evicted{0}, requests{0};
  std::mutex mu;
  std::list<std::weak_ptr<SessionBase>> sessions;  // oldest first: to evict and to close at Stop
  // Open connections per client address. Its own mutex, taken after `mu` (a session's destructor
  // takes only this one, and may run while `mu` is held).
  std::mutex peer_mu;
  std::map<std::string, int> per_peer;

  explicit Core(int threads) : ioc(threads) {}
};

namespace {

using Core = Server::Core;

Response PlainError(int status, std::string_view message) {
  Response r;
  r.status = status;
  r.body = std::string(message) + "\n";
  return r;
}

Response ErrorResponse(const Core& core, int status, std::string_view message) {
  return core.options.error_response ? core.options.error_response(status, message)
                                     : PlainError(status, message);
}

// Answers a request once, whole or streamed; holds its session (and the core under it) until
// then. Everything it sends is posted to the session's strand, so chunks keep their order.
class SessionResponder final : public Responder {
 public:
  SessionResponder(std::shared_ptr<Core> core, std::shared_ptr<SessionBase> session,
                   std::shared_ptr<Answer> answer)
      : core_(std::move(core)), session_(std::move(session)), answer_(std::move(answer)) {}
  ~SessionResponder() override {
    if (!session_) return;
    if (streaming_) {
      End();
    } else {
      Respond(ErrorResponse(*core_, 500, "internal error: the handler gave no response"));
    }
  }
  void Respond(Response response) override {
    if (streaming_) return End();  // a stream cannot become a whole answer: end it
    std::shared_ptr<SessionBase> s = std::move(session_);
    if (!s) return;
    Post(s, [s, a = answer_, r = std::move(response)]() mutable { s->Write(a, std::move(r)); });
  }
  void StartStream(Response head) override {
    if (!session_ || streaming_) return;
    streaming_ = true;
    answer_->waiting_bytes.fetch_add(head.body.size());
    Post(session_, [s = session_, a = answer_, h = std::move(head)]() mutable {
      s->WriteHead(a, std::move(h));
    });
  }
  bool Send(std::string chunk) override {
    if (!session_ || !streaming_ || answer_->gone.load() || core_->stopping.load()) return false;
    if (chunk.empty()) return true;
    const uint64_t waiting = answer_->waiting_bytes.fetch_add(chunk.size()) + chunk.size();
    if (waiting > core_->options.max_stream_buffer_bytes) {
      // The client does not read: cut it off rather than buffer without end.
      answer_->MarkGone();
      session_->Close();
      return false;
    }
    Post(session_, [s = session_, a = answer_, c = std::move(chunk)]() mutable {
      s->WriteChunk(a, std::move(c));
    });
    return true;
  }
  void End() override {
    if (!streaming_) return Respond(ErrorResponse(*core_, 500, "internal error: an empty stream"));
    std::shared_ptr<SessionBase> s = std::move(session_);
    if (!s) return;
    Post(s, [s, a = answer_]() { s->WriteEnd(a); });
  }
  void OnClientGone(std::function<void()> on_gone) override {
    answer_->SetOnGone(std::move(on_gone));
  }
  bool client_gone() const override { return answer_->gone.load(); }

 private:
  template <class F>
  void Post(const std::shared_ptr<SessionBase>& s, F&& f) {
    // Under the core's mutex: once Stop() has set `stopping`, nothing more is queued.
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->stopping.load()) return;
    net::post(s->strand, std::forward<F>(f));
  }

  std::shared_ptr<Core> core_;  // declared first: destroyed after the session it carries
  std::shared_ptr<SessionBase> session_;
  std::shared_ptr<Answer> answer_;
  bool streaming_ = false;
};

// One connection: read a request, dispatch it, write its response, repeat while keep-alive. The
// stream is `beast::tcp_stream` or `beast::ssl_stream<beast::tcp_stream>`.
template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(std::shared_ptr<Core> core, Stream stream, std::string peer, std::string address)
      : SessionBase(std::move(address), beast::get_lowest_layer(stream).get_executor()),
        core_(std::move(core)),
        stream_(std::move(stream)),
        peer_(std::move(peer)) {}
  ~Session() override {
    core_->open.fetch_sub(1);
    std::lock_guard<std::mutex> lock(core_->peer_mu);
    auto it = core_->per_peer.find(address);
    if (it != core_->per_peer.end() && --it->second <= 0) core_->per_peer.erase(it);
  }

  void Start() override {
    if constexpr (kTls) {
      Lowest().expires_after(core_->options.request_timeout);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->Read();
                              });
    } else {
      Read();
    }
  }

  void Close() override {
    closing.store(true);
    net::post(strand, [self = this->shared_from_this()] {
      beast::error_code ignored;
      self->Lowest().socket().close(ignored);
    });
  }

  void Write(std::shared_ptr<Answer> answer, Response r) override {
    if (answer != answer_) return;
    DoWrite(std::move(r));
  }

  void WriteHead(std::shared_ptr<Answer> answer, Response head) override {
    if (answer != answer_ || answer->gone.load()) return;
    auto res = std::make_shared<bhttp::response<bhttp::empty_body>>();
    res->version(11);
    res->result(static_cast<unsigned>(head.status));
    res->set(bhttp::field::server, "dsv4-node");
    res->set(bhttp::field::content_type, head.content_type);
    for (auto& [k, v] : head.headers) res->set(k, v);
    // HTTP/1.0 has no chunked encoding: its body ends when the connection closes.
    keep_alive_ = keep_alive_ && !core_->stopping.load() && !http10_;
    res->keep_alive(keep_alive_);
    res->chunked(!http10_);
    core_->requests.fetch_add(1);
    auto serializer = std::make_shared<bhttp::response_serializer<bhttp::empty_body>>(*res);
    if (!head.body.empty()) stream_queue_.push_back(std::move(head.body));
    stream_writing_ = true;
    Lowest().expires_after(core_->options.request_timeout);
    bhttp::async_write_header(
        stream_, *serializer,
        [self = this->shared_from_this(), res, serializer](beast::error_code ec, size_t) {
          self->OnStreamWritten(ec, 0);
        });
  }

  void WriteChunk(std::shared_ptr<Answer> answer, std::string chunk) override {
    if (answer != answer_) return;
    stream_queue_.push_back(std::move(chunk));
    PumpStream();
  }

  void WriteEnd(std::shared_ptr<Answer> answer) override {
    if (answer != answer_) return;
    stream_end_ = true;
    PumpStream();
  }

 private:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Read() {
    if (core_->stopping.load()) return;
    parser_.emplace();
    parser_->header_limit(core_->options.max_header_bytes);
    parser_->body_limit(core_->options.max_body_bytes);
    Lowest().expires_after(requests_ == 0 ? core_->options.request_timeout
                                          : core_->options.idle_timeout);
    reading.store(true);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        self->reading.store(false);
                        self->OnRead(ec);
                      });
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof) return Shutdown();
    if (ec == bhttp::error::body_limit) {
      return Fail(413, absl::StrCat("request body over the limit of ",
                                    core_->options.max_body_bytes, " bytes"));
    }
    if (ec == bhttp::error::header_limit) {
      return Fail(431, absl::StrCat("request head over the limit of ",
                                    core_->options.max_header_bytes, " bytes"));
    }
    if (ec && ec.category() == bhttp::make_error_code(bhttp::error::bad_target).category()) {
      return Fail(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    }
    if (ec) return;  // timeout, reset, closed: drop the connection
    Dispatch(parser_->release());
  }

  void Dispatch(bhttp::request<bhttp::string_body> req) {
    ++requests_;
    keep_alive_ = req.keep_alive();
    http10_ = req.version() < 11;
    answering.store(true);
    answer_ = std::make_shared<Answer>();
    stream_queue_.clear();
    stream_end_ = false;
    Request r;
    r.method = std::string(req.method_string());
    head_ = r.method == "HEAD";
    const std::string_view target(req.target().data(), req.target().size());
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& field : req) {
      r.headers.emplace_back(absl::AsciiStrToLower(std::string(field.name_string())),
                             std::string(field.value()));
    }
    r.body = std::move(req.body());
    r.peer = peer_;
    std::string allow;
    const Handler* handler = core_->router.Find(r.method, r.path, &allow);
    if (handler == nullptr) {
      if (allow.empty()) return DoWrite(ErrorResponse(*core_, 404, "not found"));
      Response not_allowed = ErrorResponse(*core_, 405, "method not allowed");
      not_allowed.headers.emplace_back("Allow", allow);
      return DoWrite(std::move(not_allowed));
    }
    WatchForClose(answer_);
    auto responder = std::make_shared<SessionResponder>(core_, this->shared_from_this(), answer_);
    try {
      (*handler)(r, std::move(responder));
    } catch (const std::exception& e) {
      LogError("http_handler_failed", {{"server", core_->options.name}, {"error", e.what()}});
      // The responder was moved into the handler; if it dropped it, it answered 500 already.
    }
  }

  // While an answer is pending, a plain-TCP connection whose peek sees the end of the stream was
  // closed by the client (a client that half-closes its sending side counts as gone): tell the
  // answer (its request is then aborted). Bytes to read are a pipelined request: left for Read()
  // once this answer is written. The peek runs first (a close that came with the request) and
  // after every readiness of the wait (which can be stale). The wait is cancelled when the
  // answer is complete (CancelWatch), so it never holds a finished connection open. TLS cannot
  // tell a close from more records without reading them: there a close is noticed at the next
  // write that fails.
  void WatchForClose(const std::shared_ptr<Answer>& answer) {
    if constexpr (kTls) return;
    switch (Peek()) {
      case PeekResult::kClosed: return ClientGone(answer);
      case PeekResult::kData: return;  // pipelined bytes: nothing to watch for
      case PeekResult::kNothing: break;
    }
    watching_ = true;
    Lowest().socket().async_wait(
        tcp::socket::wait_read, [self = this->shared_from_this(), answer](beast::error_code ec) {
          self->watching_ = false;
          if (answer->complete || ec == net::error::operation_aborted) return;
          if (ec) return self->ClientGone(answer);
          // Readiness can be stale (an edge of bytes the request's read already took): only an
          // orderly end counts; nothing to read is another wait.
          self->WatchForClose(answer);
        });
  }

  enum class PeekResult { kClosed, kData, kNothing };
  PeekResult Peek() {
    char probe;
    const ssize_t n = ::recv(Lowest().socket().native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return PeekResult::kClosed;
    if (n > 0) return PeekResult::kData;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? PeekResult::kNothing
                                                                     : PeekResult::kClosed;
  }

  // The answer is written: no close to watch for any more (a pending wait would keep this
  // session alive after the connection is done with).
  void Completed(const std::shared_ptr<Answer>& answer) {
    answer->complete = true;
    answering.store(false);
    if (watching_) {
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
      watching_ = false;
    }
  }

  void ClientGone(const std::shared_ptr<Answer>& answer) {
    closing.store(true);
    answer->MarkGone();
    beast::error_code ignored;
    Lowest().socket().close(ignored);
  }

  // A request that cannot be served: answer and close.
  void Fail(int status, std::string_view message) {
    keep_alive_ = false;
    head_ = false;
    DoWrite(ErrorResponse(*core_, status, message));
  }

  void DoWrite(Response r) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(11);
    res->result(static_cast<unsigned>(r.status));
    res->set(bhttp::field::server, "dsv4-node");
    res->set(bhttp::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    const bool keep = keep_alive_ && !core_->stopping.load();
    res->keep_alive(keep);
    res->content_length(r.body.size());
    if (!head_) res->body() = std::move(r.body);
    core_->requests.fetch_add(1);
    Lowest().expires_after(core_->options.request_timeout);
    bhttp::async_write(stream_, *res,
                       [self = this->shared_from_this(), res, keep,
                        answer = answer_](beast::error_code ec, size_t) {
                         if (ec) {
                           if (answer) answer->MarkGone();
                           return;
                         }
                         if (answer) self->Completed(answer);
                         if (keep) return self->Read();
                         self->Shutdown();
                       });
  }

  // Writes what the stream has queued as one chunk (at most kMaxWrite bytes, so that the write
  // timeout measures progress, not the whole backlog), or the end once End() came.
  void PumpStream() {
    static constexpr size_t kMaxWrite = 64 << 10;
    if (stream_writing_ || answer_ == nullptr || answer_->gone.load()) return;
    Lowest().expires_after(core_->options.request_timeout);
    if (!stream_queue_.empty()) {
      auto data = std::make_shared<std::string>();
      size_t taken = 0;
      while (taken < stream_queue_.size() && (data->empty() || data->size() + stream_queue_[taken].size() <= kMaxWrite)) {
        data->append(stream_queue_[taken++]);
      }
      stream_queue_.erase(stream_queue_.begin(), stream_queue_.begin() + static_cast<long>(taken));
      stream_writing_ = true;
      auto done = [self = this->shared_from_this(), data](beast::error_code ec, size_t) {
        self->OnStreamWritten(ec, data->size());
      };
      if (http10_) {
        net::async_write(stream_, net::buffer(*data), std::move(done));
      } else {
        net::async_write(stream_, bhttp::make_chunk(net::buffer(*data)), std::move(done));
      }
      return;
    }
    if (!stream_end_) return;
    stream_writing_ = true;
    auto ended = [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->stream_writing_ = false;
      if (ec) return self->answer_->MarkGone();
      self->Completed(self->answer_);
      if (self->keep_alive_ && !self->core_->stopping.load()) return self->Read();
      self->Shutdown();
    };
    if (http10_) {
      ended(beast::error_code{}, 0);
    } else {
      net::async_write(stream_, bhttp::make_chunk_last(), std::move(ended));
    }
  }

  void OnStreamWritten(beast::error_code ec, size_t bytes) {
    stream_writing_ = false;
    answer_->waiting_bytes.fetch_sub(bytes);
    if (ec) return ClientGone(answer_);
    PumpStream();
  }

  void Shutdown() {
    if constexpr (kTls) {
      Lowest().expires_after(std::chrono::seconds(2));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
        beast::error_code ignored;
        self->Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
      });
    } else {
      beast::error_code ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
  }

  std::shared_ptr<Core> core_;
  Stream stream_;
  std::string peer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  uint64_t requests_ = 0;
  bool keep_alive_ = false;
  bool head_ = false;
  // The answer in progress (null before the first request) and its streamed chunks.
  std::shared_ptr<Answer> answer_;
  std::vector<std::string> stream_queue_;
  bool stream_writing_ = false;
  bool stream_end_ = false;
  bool http10_ = false;    // the request was HTTP/1.0: no chunked encoding
  bool watching_ = false;  // WatchForClose's wait is pending
};

void Accept(const std::shared_ptr<Core>& core);

void OnAccept(const std::shared_ptr<Core>& core, beast::error_code ec, tcp::socket socket) {
  if (core->stopping.load()) return;
  if (ec) {
    // EMFILE and friends: keep accepting (the connection is lost, the listener is not).
    LogWarning("http_accept_failed", {{"server", core->options.name}, {"error", ec.message()}});
    return Accept(core);
  }
  core->accepted.fetch_add(1);
  // Streamed answers are many small writes: Nagle's algorithm would hold each behind the client's
  // delayed acknowledgement (tens of milliseconds per token).
  beast::error_code nodelay_ec;
  socket.set_option(tcp::no_delay(true), nodelay_ec);
  beast::error_code peer_ec;
  const tcp::endpoint ep = socket.remote_endpoint(peer_ec);
  const std::string address = peer_ec ? "unknown" : ep.address().to_string();
  const std::string peer = peer_ec ? "unknown" : absl::StrCat(address, ":", ep.port());
  std::shared_ptr<SessionBase> session, victim;
  {
    // Under the mutex Stop() takes: a session is either in the list it closes or never made.
    std::lock_guard<std::mutex> lock(core->mu);
    std::unique_lock<std::mutex> peers(core->peer_mu);
    const int mine = core->per_peer.count(address) > 0 ? core->per_peer[address] : 0;
    const bool full_mine = mine >= core->options.max_connections_per_client;
    const bool full = full_mine || core->open.load() >= core->options.max_connections;
    peers.unlock();
    if (full && !core->stopping.load()) {
      // Make room by closing the oldest connection that waits for a request (the same client's
      // when it is that client's cap): idle keep-alive and slow senders go before new clients.
      for (const auto& w : core->sessions) {
        auto s = w.lock();
        if (s && s->reading.load() && !s->closing.load() && (!full_mine || s->address == address)) {
          victim = std::move(s);
          victim->closing.store(true);
          break;
        }
      }
    }
    if (core->stopping.load() || (full && victim == nullptr)) {
      core->refused.fetch_add(1);
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      peers.lock();
      ++core->per_peer[address];
      peers.unlock();
      core->open.fetch_add(1);
      if (core->tls) {
        session = std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(
            core,
            beast::ssl_stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), *core->tls),
            peer, address);
      } else {
        session = std::make_shared<Session<beast::tcp_stream>>(
            core, beast::tcp_stream(std::move(socket)), peer, address);
      }
      // Forget closed sessions as new ones come, so the list stays as long as the open ones.
      core->sessions.remove_if([](const std::weak_ptr<SessionBase>& w) { return w.expired(); });
      core->sessions.push_back(session);
    }
  }
  if (victim) {
    core->evicted.fetch_add(1);
    victim->Close();
  }
  if (session == nullptr) return Accept(core);
  session->Start();
  Accept(core);
}

void Accept(const std::shared_ptr<Core>& core) {
  // Each connection gets its own strand: its handlers never run concurrently.
  core->acceptor->async_accept(net::make_strand(core->ioc),
                               [core](beast::error_code ec, tcp::socket socket) {
                                 OnAccept(core, ec, std::move(socket));
                               });
}

absl::Status ConfigureTls(Core& core, const TlsCredentials& creds) {
  try {
    core.tls.emplace(ssl::context::tls_server);
    ssl::context& ctx = *core.tls;
    ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                    ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                    ssl::context::single_dh_use);
    ctx.use_certificate_chain(net::buffer(creds.cert_chain_pem));
    ctx.use_private_key(net::buffer(creds.private_key_pem), ssl::context::pem);
    if (creds.mutual()) {
      ctx.add_certificate_authority(net::buffer(creds.client_ca_pem));
      ctx.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(core.options.name, " listener: TLS setup failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options, Router router) {
  const int threads = std::max(1, options.threads);
  auto core = std::make_shared<Core>(threads);
  core->options = std::move(options);
  core->router = std::move(router);
  const ServerOptions& o = core->options;
  if (o.tls != nullptr) {
    if (absl::Status s = ConfigureTls(*core, *o.tls); !s.ok()) return s;
  }
  const std::string where = absl::StrCat(o.name, " listener on ", o.host, ":", o.port);
  beast::error_code ec;
  const net::ip::address addr =
      o.host == "localhost" ? net::ip::address(net::ip::address_v4::loopback())
                            : net::ip::make_address(o.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(where, ": ", ec.message()));
  const tcp::endpoint endpoint(addr, static_cast<unsigned short>(o.port));
  // On a strand of its own: accept completions and the close at Stop never run concurrently.
  tcp::acceptor& acceptor = core->acceptor.emplace(net::make_strand(core->ioc));
  // SO_REUSEADDR lets a restarted node bind while old connections sit in TIME_WAIT; unlike
  // SO_REUSEPORT it never lets two live listeners share the port.
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot listen: ", where, ": ", ec.message()));
  }
  std::unique_ptr<Server> server(new Server());
  server->port_ = acceptor.local_endpoint().port();
  server->core_ = core;
  Accept(core);
  for (int i = 0; i < threads; ++i) {
    core->threads.emplace_back([c = core.get()] { c->ioc.run(); });
  }
  return server;
}

Server::~Server() { Stop(); }

ServerStats Server::stats() const {
  ServerStats s;
  s.open_connections = core_->open.load();
  s.accepted = core_->accepted.load();
  s.refused = core_->refused.load();
  s.evicted = core_->evicted.load();
  s.requests = core_->requests.load();
  return s;
}

void Server::Stop() {
  if (!core_) return;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (core_->stopping.exchange(true)) return;
  }
  net::post(core_->acceptor->get_executor(), [c = core_.get()] {
    beast::error_code ignored;
    c->acceptor->close(ignored);
  });
  // Answers already handed to a connection (the last chunks of a drained stream) get a moment to
  // reach their clients before their connections close; idle ones close at once.
  const auto grace = std::chrono::steady_clock::now() + core_->options.stop_grace;
  for (;;) {
    std::vector<std::shared_ptr<SessionBase>> idle;
    bool answering = false;
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      for (auto& w : core_->sessions) {
        auto s = w.lock();
        if (!s || s->closing.load()) continue;
        if (s->answering.load()) answering = true;
        else idle.push_back(std::move(s));
      }
    }
    for (auto& s : idle) s->Close();
    idle.clear();
    if (!answering || std::chrono::steady_clock::now() >= grace) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::vector<std::shared_ptr<SessionBase>> open;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    for (auto& w : core_->sessions) {
      if (auto s = w.lock()) open.push_back(std::move(s));
    }
    core_->sessions.clear();
  }
  // Outside the mutex: a session's destructor takes it.
  for (auto& s : open) s->Close();
  open.clear();
  // Closing cancels every pending operation; give their handlers a moment to run and release the
  // sessions, then stop.
  for (int i = 0; i < 200 && core_->open.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  core_->ioc.stop();
  for (std::thread& t : core_->threads) t.join();
  core_->threads.clear();
  // Handlers still queued hold sessions, which hold the core: run them out so nothing is left.
  core_->ioc.restart();
  core_->ioc.poll();
}

}  // namespace dsv4::http
