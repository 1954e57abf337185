#include "node/server/admission.h"

namespace dsv4 {

bool ClientQuota::Acquire(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  int32_t& n = counts_[client];
  if (n >= per_client_) {
    if (n == 0) counts_.erase(client);
    return false;
  }
  ++n;
  return true;
}

void ClientQuota::Release(const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(client);
  if (it == counts_.end()) return;
  if (--it->second <= 0) counts_.erase(it);
}

int32_t ClientQuota::in_flight(const std::string& client) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = counts_.find(client);
  return it == counts_.end() ? 0 : it->second;
}

WorkQueue::WorkQueue(int threads, int32_t capacity) : capacity_(capacity) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

void WorkQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool WorkQueue::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || static_cast<int32_t>(tasks_.size()) >= capacity_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void WorkQueue::Run() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace dsv4
