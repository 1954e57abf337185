// The HTTP server's streamed answers (node/http/http_server.h: StartStream/Send/End, chunked
// transfer encoding) and its client-gone notification, on loopback with raw sockets.
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "node/http/http_server.h"
#include "tests/testing/http_get.h"

namespace dsv4::http {
namespace {

using dsv4::testing::ConnectLoopback;

void SendAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    off += static_cast<size_t>(n);
  }
}

// Reads until `until` appears (or the peer closes / 5 s pass).
std::string ReadUntil(int fd, const std::string& until) {
  std::string got;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// The body of a chunked answer, de-framed.
std::string Unchunk(const std::string& reply) {
  size_t at = reply.find("\r\n\r\n");
  if (at == std::string::npos) return "";
  at += 4;
  std::string body;
  while (at < reply.size()) {
    const size_t eol = reply.find("\r\n", at);
    if (eol == std::string::npos) break;
    const size_t len = std::stoul(reply.substr(at, eol - at), nullptr, 16);
    if (len == 0) break;
    body += reply.substr(eol + 2, len);
    at = eol + 2 + len + 2;
  }
  return body;
}

struct Fixture {
  std::unique_ptr<Server> server;
  std::promise<void> gone;
  std::promise<std::shared_ptr<Responder>> held;
  std::promise<bool> send_failed;
};

std::unique_ptr<Server> Start(Fixture* f, uint64_t stream_buffer = 8 << 20) {
  Router r;
  r.Add("POST", "/stream", [](const Request& req, std::shared_ptr<Responder> resp) {
    Response head;
    head.content_type = "text/event-stream";
    head.body = "first;";
    resp->StartStream(std::move(head));
    // From another thread, as the engine does.
    std::thread([resp, n = std::stoi(req.body.empty() ? "3" : req.body)] {
      for (int i = 0; i < n; ++i) resp->Send("chunk" + std::to_string(i) + ";");
      if (n >= 0) resp->End();
    }).detach();
  });
  r.Add("POST", "/dropped", [](const Request&, std::shared_ptr<Responder> resp) {
    resp->StartStream(Response{});
    resp->Send("only;");
    // Dropped without End(): the responder ends the stream.
  });
  r.Add("POST", "/hang", [f](const Request&, std::shared_ptr<Responder> resp) {
    resp->OnClientGone([f] { f->gone.set_value(); });
    f->held.set_value(resp);
  });
  r.Add("POST", "/flood", [f](const Request&, std::shared_ptr<Responder> resp) {
    resp->OnClientGone([f] { f->gone.set_value(); });
    resp->StartStream(Response{});
    std::thread([resp, f] {
      const std::string mib(1 << 20, 'x');
      bool ok = true;
      for (int i = 0; i < 64 && ok; ++i) ok = resp->Send(mib);
      f->send_failed.set_value(!ok);
      resp->End();
    }).detach();
  });
  r.Add("GET", "/ok", [](const Request&, std::shared_ptr<Responder> resp) {
    Response ok;
    ok.body = "fine";
    resp->Respond(std::move(ok));
  });
  ServerOptions o;
  o.max_stream_buffer_bytes = stream_buffer;
  o.request_timeout = std::chrono::milliseconds(3000);
  auto s = Server::Start(o, std::move(r));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HttpStream, ChunksArriveInOrderAndTheConnectionServesTheNextRequest) {
  Fixture f;
  auto server = Start(&f);
  const int fd = ConnectLoopback(server->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n200");
  const std::string reply = ReadUntil(fd, "\r\n0\r\n\r\n");
  EXPECT_NE(reply.find("Transfer-Encoding: chunked"), std::string::npos) << reply.substr(0, 300);
  EXPECT_NE(reply.find("Content-Type: text/event-stream"), std::string::npos);
  std::string want = "first;";
  for (int i = 0; i < 200; ++i) want += "chunk" + std::to_string(i) + ";";
  EXPECT_EQ(Unchunk(reply), want);
  // Keep-alive: the same connection answers again.
  SendAll(fd, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string second = ReadUntil(fd, "fine");
  EXPECT_NE(second.find("200 OK"), std::string::npos) << second;
  EXPECT_NE(second.find("fine"), std::string::npos);
  ::close(fd);
}

TEST(HttpStream, AResponderDroppedMidStreamEndsTheStream) {
  Fixture f;
  auto server = Start(&f);
  const int fd = ConnectLoopback(server->port());
  SendAll(fd, "POST /dropped HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  const std::string reply = ReadUntil(fd, "\r\n0\r\n\r\n");
  EXPECT_EQ(Unchunk(reply), "only;");
  EXPECT_NE(reply.find("\r\n0\r\n\r\n"), std::string::npos) << "the stream was not terminated";
  ::close(fd);
}

TEST(HttpStream, AClientThatClosesWhileItsAnswerIsPendingIsReported) {
  Fixture f;
  auto server = Start(&f);
  const int fd = ConnectLoopback(server->port());
  SendAll(fd, "POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  auto held = f.held.get_future();
  ASSERT_EQ(held.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  std::shared_ptr<Responder> responder = held.get();
  EXPECT_FALSE(responder->client_gone());
  ::close(fd);
  auto gone = f.gone.get_future();
  ASSERT_EQ(gone.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "closing the connection did not reach the handler";
  EXPECT_TRUE(responder->client_gone());
  // Answering a gone client is harmless.
  responder->Respond(Response{});
}

TEST(HttpStream, AClientThatDoesNotReadIsCutOffNotBufferedWithoutEnd) {
  Fixture f;
  auto server = Start(&f, /*stream_buffer=*/4 << 20);
  const int fd = ConnectLoopback(server->port());
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  SendAll(fd, "POST /flood HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  // Never read: 64 MiB cannot all wait in a 4 MiB buffer.
  auto failed = f.send_failed.get_future();
  ASSERT_EQ(failed.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(failed.get()) << "Send() kept accepting bytes the client never read";
  EXPECT_EQ(f.gone.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready);
  ::close(fd);
}

TEST(HttpStream, AClientThatClosesRightAfterItsRequestIsReported) {
  Fixture f;
  auto server = Start(&f);
  const int fd = ConnectLoopback(server->port());
  // The close may arrive before the handler runs, or with the request itself.
  SendAll(fd, "POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  ::close(fd);
  auto gone = f.gone.get_future();
  EXPECT_EQ(gone.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "a close that came with the request was missed";
}

TEST(HttpStream, AConnectionThatIsNotKeptAliveIsClosedAfterItsAnswer) {
  Fixture f;
  auto server = Start(&f);
  const int fd = ConnectLoopback(server->port());
  SendAll(fd, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string reply = ReadUntil(fd, "\r\n\r\nfine");
  EXPECT_NE(reply.find("fine"), std::string::npos);
  // The server ends the connection: the next read sees its end, not a timeout.
  char c;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the connection was left open";
  ::close(fd);
}

TEST(HttpStream, AnHttp10ClientGetsABodyEndedByTheClose) {
  Fixture f;
  auto server = Start(&f);
  const std::string reply =
      dsv4::testing::HttpRaw(server->port(), "POST /stream HTTP/1.0\r\nContent-Length: 1\r\n\r\n2").body;
  EXPECT_EQ(reply, "first;chunk0;chunk1;") << "HTTP/1.0 has no chunked encoding";
}

}  // namespace
}  // namespace dsv4::http
