// Gloo's rendezvous::Store over the coordinator's rendezvous service (RendezvousClient). Gloo
// expects its store to throw: failures become RendezvousStoreError, a gloo::IoException that
// keeps the absl::Status, so GlooCommunicator::Create reports the store's own code and message
// (UNAUTHENTICATED for a wrong token, FAILED_PRECONDITION for a wrong world size, ...).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "absl/status/status.h"
#include "parallel/rendezvous_client.h"

namespace dsv4 {

class RendezvousStoreError : public gloo::IoException {
 public:
  explicit RendezvousStoreError(absl::Status status)
      : gloo::IoException(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class GlooRendezvousStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and wait() without a timeout of their own.
  GlooRendezvousStore(std::unique_ptr<RendezvousClient> client, std::chrono::milliseconds timeout)
      : client_(std::move(client)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the timeout for the key (Gloo's full-mesh connect reads keys without waiting).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::unique_ptr<RendezvousClient> client_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dsv4
