// The key-value store behind the coordinator's rendezvous service (rendezvous.proto): groups
// opened by the coordinator, each with a world size and a secret token; write-once keys; bounded
// waits. No gRPC here: rendezvous_service.h serves it, tests drive it directly.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4 {

struct RendezvousLimits {
  int max_groups = 64;
  int max_keys_per_group = 4096;
  size_t max_key_bytes = 256;
  size_t max_value_bytes = 1 << 20;
  size_t max_group_bytes = 64 << 20;  // all values of one group
  int max_wait_keys = 1024;
  std::chrono::milliseconds max_timeout{600000};
};

// Who calls, as the request says.
struct RendezvousCaller {
  std::string group;
  int rank = -1;
  int world_size = 0;
};

// 32 random bytes from the OS, hex-encoded: a group's token.
absl::StatusOr<std::string> NewRendezvousToken();

// Field checks shared by the store, the service and the client (errors name `field`).
absl::Status ValidateRendezvousGroupName(std::string_view group, std::string_view field);
absl::Status ValidateRendezvousKey(std::string_view key, size_t max_bytes, std::string_view field);

class RendezvousStore {
 public:
  explicit RendezvousStore(RendezvousLimits limits = {});
  ~RendezvousStore();  // Shutdown()
  RendezvousStore(const RendezvousStore&) = delete;
  RendezvousStore& operator=(const RendezvousStore&) = delete;

  const RendezvousLimits& limits() const { return limits_; }

  // Coordinator side. An open group cannot be opened again (ALREADY_EXISTS): close it first, or
  // better, name each generation anew. token: at least 16 bytes.
  absl::Status OpenGroup(std::string_view group, int world_size, std::string token);
  // Drops the group's keys; its waiters end with UNAVAILABLE. Unknown groups are ignored.
  void CloseGroup(std::string_view group);
  // Every waiter ends with UNAVAILABLE; later calls fail the same way.
  void Shutdown();

  // Rank side. `cancelled` (may be empty) is polled while waiting: the RPC went away.
  using CancelledFn = std::function<bool()>;
  absl::Status Set(const RendezvousCaller& caller, std::string_view token, std::string_view key,
                   std::string value);
  absl::StatusOr<std::string> Get(const RendezvousCaller& caller, std::string_view token,
                                  std::string_view key, std::chrono::milliseconds timeout,
                                  const CancelledFn& cancelled);
  absl::Status Wait(const RendezvousCaller& caller, std::string_view token,
                    const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                    const CancelledFn& cancelled);

 private:
  struct Group {
    int world_size = 0;
    std::string token;
    bool closed = false;
    size_t bytes = 0;
    std::map<std::string, std::string, std::less<>> values;
  };

  // Checks the caller against its group (under mu_); returns the group.
  absl::StatusOr<std::shared_ptr<Group>> Authorize(const RendezvousCaller& caller,
                                                   std::string_view token) const;
  absl::Status CheckTimeout(std::chrono::milliseconds timeout) const;
  // Waits (holding `lock`) until every key is in `group`, the deadline passes or the wait is
  // cancelled.
  absl::Status WaitLocked(std::unique_lock<std::mutex>& lock, const Group& group,
                          const RendezvousCaller& caller, const std::vector<std::string>& keys,
                          std::chrono::milliseconds timeout, const CancelledFn& cancelled);

  const RendezvousLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool shut_down_ = false;
  std::map<std::string, std::shared_ptr<Group>, std::less<>> groups_;
};

}  // namespace dsv4
