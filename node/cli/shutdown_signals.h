// What SIGTERM and SIGINT do to `dsv4-node serve` (docs/serving.md "Signals"):
//   while loading   the first one exits at once (128 + signal): nothing is in flight yet;
//   while serving   the first one (either) starts the drain: health NOT_SERVING, new calls
//                   UNAVAILABLE, in-flight requests finish within --drain-timeout;
//   while draining  SIGTERM again is logged and ignored (the drain goes on, no stream is dropped:
//                   Kubernetes and supervisors repeat SIGTERM); SIGINT again forces: in-flight
//                   requests end now with CANCELLED and a final message, and the exit code is 130;
//   when forced     a third SIGINT exits at once (130).
// The handlers are process-wide (sigaction), so it does not matter which thread the kernel picks;
// they only write the signal number to a pipe, which a watcher thread reads.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace dsv4::cli {

class ShutdownSignals {
 public:
  ShutdownSignals();   // installs the handlers and starts the watcher
  ~ShutdownSignals();  // restores the default dispositions

  // The node is up: the next signal starts a drain instead of exiting. `force` runs (on the
  // watcher thread) when a SIGINT arrives during the drain.
  void Serving(std::function<void()> force);
  // Blocks until the signal that starts the drain; returns it.
  int WaitForDrain();
  bool forced() const;

 private:
  enum class State { kLoading, kServing, kDraining, kForced };
  void Watch();
  void OnSignal(int sig);

  int pipe_[2] = {-1, -1};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kLoading;
  int drain_signal_ = 0;
  std::mutex force_mu_;  // held while the force action runs; taken before mu_
  std::function<void()> force_;  // guarded by force_mu_ (and mu_ when set)
  std::thread watcher_;
};

}  // namespace dsv4::cli
