// Admission limits of the public API that one client cannot get around by opening more
// connections or streams (docs/serving.md "Limits"):
//   ClientQuota  requests in flight per client (its IP address, or its certificate identity under
//                mutual TLS); over the cap a new request gets RESOURCE_EXHAUSTED.
//   WorkQueue    a bounded queue with its own threads, where large inputs are tokenized, so that
//                a flood of megabyte prompts never occupies the gRPC threads that health checks
//                and small requests need; a full queue is RESOURCE_EXHAUSTED.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dsv4 {

class ClientQuota {
 public:
  explicit ClientQuota(int32_t per_client) : per_client_(per_client) {}
  // Takes one slot of `client`; false (nothing taken) at the cap.
  bool Acquire(const std::string& client);
  void Release(const std::string& client);
  int32_t in_flight(const std::string& client) const;
  int32_t limit() const { return per_client_; }

 private:
  const int32_t per_client_;
  mutable std::mutex mu_;
  std::map<std::string, int32_t> counts_;
};

class WorkQueue {
 public:
  WorkQueue(int threads, int32_t capacity);
  ~WorkQueue() { Stop(); }
  // Runs what is queued, then joins the threads; later Posts fail. Idempotent.
  void Stop();
  // Queues `task`; false (not queued) when `capacity` tasks are already waiting.
  bool Post(std::function<void()> task);
  int32_t capacity() const { return capacity_; }

 private:
  void Run();
  const int32_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace dsv4
