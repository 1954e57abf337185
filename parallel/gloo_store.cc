#include "parallel/gloo_store.h"

namespace dsv4 {

void GlooRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = client_->Set(key, std::string(data.begin(), data.end()), timeout_);
  if (!s.ok()) throw RendezvousStoreError(std::move(s));
}

std::vector<char> GlooRendezvousStore::get(const std::string& key) {
  auto value = client_->Get(key, timeout_);
  if (!value.ok()) throw RendezvousStoreError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  // Gloo passes kNoTimeout (0) for "no timeout": bound it by ours.
  const auto t = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
  absl::Status s = client_->Wait(keys, t);
  if (!s.ok()) throw RendezvousStoreError(std::move(s));
}

}  // namespace dsv4
