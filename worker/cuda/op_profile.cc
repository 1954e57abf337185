#include "worker/cuda/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "common/status.h"
#include "kernels/cuda/elementwise.h"

namespace dsv4 {

absl::StatusOr<std::unique_ptr<OpProfile>> OpProfile::Create() {
  std::unique_ptr<OpProfile> p(new OpProfile());
  void* host = nullptr;
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped));
  p->flag_ = PinnedBuffer(host, sizeof(int));
  *static_cast<volatile int*>(host) = 1;
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p->flag_dev_), host, 0));
  return p;
}

cudaEvent_t OpProfile::Event() {
  if (used_ == events_.size()) {
    absl::StatusOr<CudaEvent> e = CudaEvent::Create(cudaEventDefault);
    if (!e.ok()) return nullptr;
    events_.push_back(*std::move(e));
  }
  return events_[used_++].get();
}

absl::Status OpProfile::Open(cudaStream_t stream) {
  *static_cast<volatile int*>(flag_.get()) = 0;
  return cuda::Gate(flag_dev_, stream);
}

void OpProfile::Begin(std::string key, cudaStream_t stream) {
  Span s;
  s.key = std::move(key);
  s.begin = Event();
  if (s.begin != nullptr) cudaEventRecord(s.begin, stream);
  open_.push_back(std::move(s));
}

void OpProfile::End(cudaStream_t stream) {
  if (open_.empty()) return;
  Span s = std::move(open_.back());
  open_.pop_back();
  s.end = Event();
  if (s.end != nullptr) cudaEventRecord(s.end, stream);
  // Nested spans (an op inside another) are attributed to the outer one only.
  if (open_.empty() && s.begin != nullptr && s.end != nullptr) spans_.push_back(std::move(s));
}

void OpProfile::Release() { *static_cast<volatile int*>(flag_.get()) = 1; }

absl::Status OpProfile::Collect() {
  for (const Span& s : spans_) {
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, s.begin, s.end));
    samples_[s.key].push_back(ms);
  }
  if (!spans_.empty()) ++steps_;
  spans_.clear();
  open_.clear();
  used_ = 0;
  return absl::OkStatus();
}

std::string OpProfile::Report() const {
  struct Row {
    std::string key;
    double calls_per_step, median_us, us_per_step;
  };
  std::vector<Row> rows;
  double all = 0;
  for (const auto& [key, v] : samples_) {
    std::vector<float> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    Row r;
    r.key = key;
    r.calls_per_step = static_cast<double>(v.size()) / std::max<int64_t>(steps_, 1);
    r.median_us = sorted[sorted.size() / 2] * 1e3;
    r.us_per_step = r.median_us * r.calls_per_step;
    all += r.us_per_step;
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(),
            [](const Row& a, const Row& b) { return a.us_per_step > b.us_per_step; });
  char line[256];
  std::snprintf(line, sizeof(line),
                "op profile (DSV4_PROFILE_OPS=1): %lld eager steps, %.1f us of GPU time per step\n",
                static_cast<long long>(steps_), all);
  std::string out = line;
  std::snprintf(line, sizeof(line), "%-52s %10s %12s %10s %7s\n", "op", "calls/step", "median us",
                "us/step", "share");
  out += line;
  for (const Row& r : rows) {
    std::snprintf(line, sizeof(line), "%-52s %10.2f %12.2f %10.1f %6.1f%%\n", r.key.c_str(),
                  r.calls_per_step, r.median_us, r.us_per_step,
                  100.0 * r.us_per_step / std::max(all, 1e-12));
    out += line;
  }
  return out;
}

}  // namespace dsv4
