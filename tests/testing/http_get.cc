#include "tests/testing/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dsv4::testing {

std::string HttpGet(int port, const std::string& path, int* status) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (status != nullptr) {
    *status = 0;
    std::sscanf(resp.c_str(), "HTTP/%*s %d", status);
  }
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

int RunCommand(const std::string& cmd, std::string* output) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) {
    if (output != nullptr) output->append(buf, n);
  }
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace dsv4::testing

namespace dsv4::testing {

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

RawReply HttpRaw(int port, const std::string& request, int timeout_ms, bool half_close) {
  RawReply r;
  const int fd = ConnectLoopback(port);
  if (fd < 0) return r;
  r.connected = true;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer (413, 431) and close before reading it all
    sent += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd, SHUT_WR);
  std::string resp;
  char buf[8192];
  const bool head_request = request.rfind("HEAD ", 0) == 0;
  // A complete response (head, then Content-Length bytes) ends the exchange even when the server
  // keeps the connection open.
  auto complete = [&] {
    const size_t split = resp.find("\r\n\r\n");
    if (split == std::string::npos) return false;
    const size_t cl = resp.find("Content-Length: ");
    if (cl == std::string::npos || cl > split) return false;
    const size_t len = std::strtoul(resp.c_str() + cl + 16, nullptr, 10);
    return head_request || resp.size() >= split + 4 + len;
  };
  while (!complete()) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      resp.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) r.timed_out = true;
    break;
  }
  ::close(fd);
  std::sscanf(resp.c_str(), "HTTP/%*s %d", &r.status);
  const size_t split = resp.find("\r\n\r\n");
  r.head = resp.substr(0, split);
  if (split != std::string::npos) r.body = resp.substr(split + 4);
  return r;
}

}  // namespace dsv4::testing
