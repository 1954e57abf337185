#include "node/cli/shutdown_signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "common/log.h"

namespace dsv4::cli {
namespace {

int g_write_fd = -1;

void Handler(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_write_fd >= 0) {
    [[maybe_unused]] const ssize_t n = ::write(g_write_fd, &b, 1);
  }
  errno = saved;
}

const char* Name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "?"; }

}  // namespace

ShutdownSignals::ShutdownSignals() {
  if (::pipe2(pipe_, O_CLOEXEC) == 0) {
    ::fcntl(pipe_[1], F_SETFL, O_NONBLOCK);  // a full pipe never blocks the handler
    g_write_fd = pipe_[1];
  }
  struct sigaction sa = {};
  sa.sa_handler = Handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  watcher_ = std::thread([this] { Watch(); });
}

ShutdownSignals::~ShutdownSignals() {
  ::signal(SIGTERM, SIG_DFL);
  ::signal(SIGINT, SIG_DFL);
  g_write_fd = -1;
  const unsigned char stop = 0;
  [[maybe_unused]] const ssize_t n = ::write(pipe_[1], &stop, 1);
  watcher_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

void ShutdownSignals::Watch() {
  while (true) {
    unsigned char b = 0;
    const ssize_t n = ::read(pipe_[0], &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || b == 0) return;
    OnSignal(b);
  }
}

void ShutdownSignals::OnSignal(int sig) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    switch (state_) {
      case State::kLoading:
        LogWarning("stopping_while_loading", {{"signal", Name(sig)}});
        std::_Exit(128 + sig);
      case State::kServing:
        state_ = State::kDraining;
        drain_signal_ = sig;
        cv_.notify_all();
        return;
      case State::kDraining:
        if (sig != SIGINT) {
          LogInfo("signal_during_drain_ignored",
                  {{"signal", Name(sig)}, {"hint", "SIGINT forces the shutdown"}});
          return;
        }
        state_ = State::kForced;
        break;
      case State::kForced:
        if (sig != SIGINT) return;
        LogWarning("exiting_now", {{"signal", Name(sig)}});
        std::_Exit(130);
    }
  }
  LogWarning("forced_shutdown", {{"signal", Name(sig)}});
  // Under force_mu_, which Serving() takes to replace the action: once Serving(nullptr)
  // returns, no action runs (the node it points to may go away).
  std::lock_guard<std::mutex> guard(force_mu_);
  if (force_) force_();
}

void ShutdownSignals::Serving(std::function<void()> force) {
  std::lock_guard<std::mutex> guard(force_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  force_ = std::move(force);
  if (state_ == State::kLoading) state_ = State::kServing;
}

int ShutdownSignals::WaitForDrain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return state_ != State::kLoading && state_ != State::kServing; });
  return drain_signal_;
}

bool ShutdownSignals::forced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kForced;
}

}  // namespace dsv4::cli
