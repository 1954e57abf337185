#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/json_util.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4::testing {

std::unique_ptr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv) {
  static int counter = 0;
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->log_path_ = TempDir("subprocess") + "/out-" + std::to_string(::getpid()) + "-" +
                 std::to_string(counter++) + ".log";
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return nullptr;
  if (pid == 0) {
    const int fd = ::open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // The test process may block signals in its threads; the child starts clean.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(args[0], args.data());
    std::_Exit(127);
  }
  p->pid_ = pid;
  return p;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

void Subprocess::Signal(int sig) const {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

bool Subprocess::running() {
  if (reaped_) return false;
  const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
  if (r == pid_) reaped_ = true;
  return !reaped_;
}

int Subprocess::Wait(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() > end) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

std::string Subprocess::Output() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitForPortFile(const std::string& path, Subprocess* child, int* grpc_port, int* metrics_port,
                     std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (child != nullptr && !child->running()) return false;
    auto text = ReadFileToString(path, 1 << 16);
    if (text.ok()) {
      auto j = ParseJson(*text, "port file");
      if (j.ok() && j->contains("grpc") && j->contains("metrics")) {
        *grpc_port = (*j)["grpc"].get<int>();
        *metrics_port = (*j)["metrics"].get<int>();
        return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace dsv4::testing
