// Child processes of this executable (the rank processes the model tools and the coordinator
// start): spawned with a line handed over on standard input (a secret: never on a command line),
// reaped with a deadline, killed when their owner goes away.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4 {

class ChildProcess {
 public:
  // Starts `binary` (default: this executable, /proc/self/exe) with `argv` (argv[0] included)
  // and writes `stdin_line` + "\n" to its standard input, then closes it.
  static absl::StatusOr<ChildProcess> SpawnSelf(const std::vector<std::string>& argv,
                                                const std::string& stdin_line,
                                                const std::string& binary = "/proc/self/exe");
  ChildProcess() = default;
  ChildProcess(ChildProcess&& o) noexcept : pid_(o.pid_), status_(o.status_) { o.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ~ChildProcess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  bool running();
  // Waits up to `timeout`; OK when it exited 0, else an error with its exit status or signal
  // (DEADLINE_EXCEEDED when it did not end: it is then killed). `what` names it ("rank 2").
  absl::Status Wait(std::chrono::milliseconds timeout, const std::string& what);
  void Kill();

 private:
  pid_t pid_ = -1;
  int status_ = 0;
};

}  // namespace dsv4
