// The stages of a worker's life (worker.h), for the workers that go through them (CPU, GPU): each
// call checks that it comes at its turn.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4 {

class Lifecycle {
 public:
  enum Stage { kCreated, kConfigured, kLoaded, kReady, kShutDown };
  explicit Lifecycle(Stage stage = kCreated) : stage_(stage) {}

  // `call` may run in stage `from` only; OK moves on to `to` (the caller does so after the call's
  // work succeeded, with Enter).
  absl::Status Check(const char* call, Stage from) const {
    if (stage_ == from) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(call, " on a worker that is ", Name(stage_), " (it needs one ", Name(from),
                     ")"));
  }
  void Enter(Stage stage) { stage_ = stage; }
  Stage stage() const { return stage_; }
  bool ready() const { return stage_ == kReady; }

  static const char* Name(Stage s) {
    switch (s) {
      case kCreated: return "created, not configured";
      case kConfigured: return "configured, not loaded";
      case kLoaded: return "loaded, not warmed up";
      case kReady: return "ready";
      case kShutDown: return "shut down";
    }
    return "?";
  }

 private:
  Stage stage_;
};

}  // namespace dsv4
