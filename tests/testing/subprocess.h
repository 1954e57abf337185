// A child process for tests that run the dsv4-node executable as an operator would: signals,
// exit codes, and what it printed (stdout and stderr to one temporary file).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dsv4::testing {

class Subprocess {
 public:
  // Starts argv[0] (a path) with the arguments; null if fork/exec failed.
  static std::unique_ptr<Subprocess> Start(const std::vector<std::string>& argv);
  ~Subprocess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Waits up to `timeout`: the exit code, 128 + the signal that killed it, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);
  bool running();
  std::string Output() const;

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int status_ = -1;
  bool reaped_ = false;
  std::string log_path_;
};

// Waits until a --port-file appears with both ports; false on timeout (or if `child` exits).
bool WaitForPortFile(const std::string& path, Subprocess* child, int* grpc_port, int* metrics_port,
                     std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dsv4::testing
