#include "parallel/rendezvous_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {
namespace {

constexpr size_t kMaxGroupNameBytes = 64;
constexpr size_t kMinTokenBytes = 16;
// How often a waiter looks at its RPC's cancellation.
constexpr auto kCancelPoll = std::chrono::milliseconds(100);

bool IsGroupChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}
bool IsKeyChar(char c) { return IsGroupChar(c) || c == ':' || c == '/'; }

// Constant-time comparison: the token's prefix must not be learnable from response times.
bool TokensEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string Who(const RendezvousCaller& caller) {
  return absl::StrCat("rank ", caller.rank, " of group '", AV(caller.group), "'");
}

}  // namespace

absl::StatusOr<std::string> NewRendezvousToken() {
  unsigned char bytes[32];
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("open /dev/urandom: ", std::strerror(errno)));
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      ::close(fd);
      return absl::InternalError("read /dev/urandom failed");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

absl::Status ValidateRendezvousGroupName(std::string_view group, std::string_view field) {
  if (group.empty() || group.size() > kMaxGroupNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": group name must have 1..",
                                                   kMaxGroupNameBytes, " characters, got ",
                                                   group.size()));
  }
  if (!std::all_of(group.begin(), group.end(), IsGroupChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": group name may only hold [A-Za-z0-9_.-]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRendezvousKey(std::string_view key, size_t max_bytes, std::string_view field) {
  if (key.empty() || key.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": key must have 1..", max_bytes,
                                                   " characters, got ", key.size()));
  }
  if (!std::all_of(key.begin(), key.end(), IsKeyChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": key may only hold [A-Za-z0-9_.:/-]"));
  }
  return absl::OkStatus();
}

RendezvousStore::RendezvousStore(RendezvousLimits limits) : limits_(limits) {}

RendezvousStore::~RendezvousStore() { Shutdown(); }

absl::Status RendezvousStore::OpenGroup(std::string_view group, int world_size, std::string token) {
  RETURN_IF_ERROR(ValidateRendezvousGroupName(group, "group"));
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", world_size));
  }
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("token must have at least ", kMinTokenBytes, " bytes"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return absl::UnavailableError("rendezvous store is shutting down");
  if (groups_.count(group) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("group '", AV(group), "' is already open"));
  }
  if (static_cast<int>(groups_.size()) >= limits_.max_groups) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store holds its maximum of ", limits_.max_groups, " groups"));
  }
  auto g = std::make_shared<Group>();
  g->world_size = world_size;
  g->token = std::move(token);
  groups_.emplace(std::string(group), std::move(g));
  return absl::OkStatus();
}

void RendezvousStore::CloseGroup(std::string_view group) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(group);
  if (it == groups_.end()) return;
  it->second->closed = true;
  it->second->values.clear();
  groups_.erase(it);
  changed_.notify_all();
}

void RendezvousStore::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  for (auto& [name, g] : groups_) g->closed = true;
  groups_.clear();
  changed_.notify_all();
}

absl::StatusOr<std::shared_ptr<RendezvousStore::Group>> RendezvousStore::Authorize(
    const RendezvousCaller& caller, std::string_view token) const {
  if (shut_down_) return absl::UnavailableError("rendezvous store is shutting down");
  RETURN_IF_ERROR(ValidateRendezvousGroupName(caller.group, "caller.group"));
  auto it = groups_.find(caller.group);
  if (it == groups_.end()) {
    return absl::NotFoundError(
        absl::StrCat("group '", AV(caller.group), "' is not open on this rendezvous store"));
  }
  const Group& g = *it->second;
  if (token.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat("no rendezvous token presented for group '", AV(caller.group), "'"));
  }
  if (!TokensEqual(token, g.token)) {
    return absl::UnauthenticatedError(
        absl::StrCat("wrong rendezvous token for group '", AV(caller.group), "'"));
  }
  if (caller.world_size != g.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("caller.world_size ", caller.world_size, " does not match group '",
                     AV(caller.group), "' (world size ", g.world_size, ")"));
  }
  if (caller.rank < 0 || caller.rank >= g.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("caller.rank ", caller.rank,
                                                   " is out of range [0, ", g.world_size, ")"));
  }
  return it->second;
}

absl::Status RendezvousStore::CheckTimeout(std::chrono::milliseconds timeout) const {
  if (timeout.count() < 0 || timeout > limits_.max_timeout) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be in [0, ",
                                                   limits_.max_timeout.count(), "], got ",
                                                   timeout.count()));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const RendezvousCaller& caller, std::string_view token,
                                  std::string_view key, std::string value) {
  RETURN_IF_ERROR(ValidateRendezvousKey(key, limits_.max_key_bytes, "key"));
  if (value.size() > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value: ", value.size(),
                                                   " bytes exceed the limit of ",
                                                   limits_.max_value_bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Group> g, Authorize(caller, token));
  if (g->values.count(key) != 0) {
    return absl::AlreadyExistsError(absl::StrCat("key '", AV(key), "' of group '",
                                                 AV(caller.group),
                                                 "' is already set (a duplicate rank?)"));
  }
  if (static_cast<int>(g->values.size()) >= limits_.max_keys_per_group ||
      g->bytes + value.size() > limits_.max_group_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group '", AV(caller.group), "' is full (", g->values.size(), " keys, ",
                     g->bytes, " bytes)"));
  }
  g->bytes += value.size();
  g->values.emplace(std::string(key), std::move(value));
  changed_.notify_all();
  return absl::OkStatus();
}

absl::Status RendezvousStore::WaitLocked(std::unique_lock<std::mutex>& lock, const Group& group,
                                         const RendezvousCaller& caller,
                                         const std::vector<std::string>& keys,
                                         std::chrono::milliseconds timeout,
                                         const CancelledFn& cancelled) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (group.closed || shut_down_) {
      return absl::UnavailableError(
          absl::StrCat("group '", AV(caller.group), "' was closed while ", Who(caller), " waited"));
    }
    const std::string* missing = nullptr;
    for (const std::string& k : keys) {
      if (group.values.count(k) == 0) {
        missing = &k;
        break;
      }
    }
    if (missing == nullptr) return absl::OkStatus();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          Who(caller), " waited ", timeout.count(), " ms for key '", AV(*missing),
          "', which no rank set (a rank missing or of another world size?)"));
    }
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("the wait of ", Who(caller), " was cancelled"));
    }
    changed_.wait_until(lock, std::min(deadline, now + kCancelPoll));
  }
}

absl::StatusOr<std::string> RendezvousStore::Get(const RendezvousCaller& caller,
                                                 std::string_view token, std::string_view key,
                                                 std::chrono::milliseconds timeout,
                                                 const CancelledFn& cancelled) {
  RETURN_IF_ERROR(ValidateRendezvousKey(key, limits_.max_key_bytes, "key"));
  RETURN_IF_ERROR(CheckTimeout(timeout));
  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Group> g, Authorize(caller, token));
  RETURN_IF_ERROR(WaitLocked(lock, *g, caller, {std::string(key)}, timeout, cancelled));
  return g->values.find(key)->second;
}

absl::Status RendezvousStore::Wait(const RendezvousCaller& caller, std::string_view token,
                                   const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout,
                                   const CancelledFn& cancelled) {
  if (keys.empty() || static_cast<int>(keys.size()) > limits_.max_wait_keys) {
    return absl::InvalidArgumentError(absl::StrCat("keys: must hold 1..", limits_.max_wait_keys,
                                                   " keys, got ", keys.size()));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(
        ValidateRendezvousKey(keys[i], limits_.max_key_bytes, absl::StrCat("keys[", i, "]")));
  }
  RETURN_IF_ERROR(CheckTimeout(timeout));
  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(std::shared_ptr<Group> g, Authorize(caller, token));
  return WaitLocked(lock, *g, caller, keys, timeout, cancelled);
}

}  // namespace dsv4
