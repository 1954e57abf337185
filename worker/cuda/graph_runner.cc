#include "worker/cuda/graph_runner.h"

#include <chrono>
#include <cstdio>
#include <string>

#include "common/status.h"
#include "kernels/cuda/elementwise.h"

namespace dsv4 {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

GraphMode GraphRunner::Choose(const StepPlan& plan, int32_t padded_seqs, bool enforce_eager,
                              GraphRun* run) {
  GraphMode mode = plan.graph_mode;
  if (mode != GraphMode::kEager) {
    const int64_t T = plan.num_tokens(), S = static_cast<int64_t>(plan.seqs.size());
    const int32_t padded = plan.padded_tokens;
    const bool fits = padded >= T && S + (T < padded ? 1 : 0) <= padded_seqs;
    const bool full_ok = mode != GraphMode::kFull || !full_[padded].failed;
    // Op profiling times eager launches only; in-step snapshots are not captured.
    if (enforce_eager || !fits || !full_ok || backend_->profile() != nullptr ||
        HasInStepSnapshots(plan)) {
      mode = GraphMode::kEager;
      run->fallback = true;
      ++stats_.fallbacks;
    }
  }
  run->mode = mode;
  return mode;
}

void GraphRunner::Clear() {
  full_.clear();
  piecewise_.clear();
}

absl::Status GraphRunner::RunFull(int32_t padded, int64_t rows, std::vector<uintptr_t> baked,
                                  void* host_outs, const IssueFull& issue, GraphRun* run,
                                  const void** outs, bool* copied) {
  cudaStream_t stream = backend_->stream();
  FullGraph& g = full_[padded];
  const size_t outs_bytes = sizeof(cuda::SampleOut) * rows;
  if (g.io.get() == nullptr || g.rows != rows) {
    ASSIGN_OR_RETURN(g.io, AllocDevice(outs_bytes));
    g.rows = static_cast<int32_t>(rows);
    g.captured = false;
  }
  auto* dev_outs = static_cast<cuda::SampleOut*>(g.io.get());
  *outs = dev_outs;
  *copied = host_outs != nullptr;
  // A graph this size cannot use (its capture or its update failed; nothing of it was queued):
  // the size runs eagerly from now on, this step included, and the step reports the fallback.
  auto run_eagerly = [&]() -> absl::Status {
    g.failed = true;
    g.captured = false;
    ++run->capture_failures;
    ++stats_.fallbacks;
    run->fallback = true;
    run->mode = GraphMode::kEager;
    return issue(dev_outs);
  };
  std::vector<uintptr_t> all = backend_->Baked(/*with_head=*/true);
  all.insert(all.end(), baked.begin(), baked.end());
  all.push_back(host_outs != nullptr ? 1 : 0);
  if (!g.captured || g.baked != all) {
    if (g.captured) ++stats_.recaptures;
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = backend_->BeginCapture();
    if (st.ok()) st = issue(dev_outs);
    absl::StatusOr<CudaGraphExec> exec =
        st.ok() ? CudaGraphExec::EndCapture(stream, /*keep_graph=*/host_outs != nullptr)
                : absl::StatusOr<CudaGraphExec>(st);
    cudaGraphNode_t copy_node = nullptr;
    if (exec.ok() && host_outs != nullptr) {
      copy_node = exec->SinkNode();
      if (copy_node == nullptr || !cuda::IsCopyWordsNode(copy_node)) {
        exec = absl::InternalError("the FULL graph does not end in its results' copy");
      }
    }
    if (!exec.ok()) {
      // Nothing ran during the capture: the staged step still runs, eagerly.
      backend_->AbortGraphs();
      return run_eagerly();
    }
    g.exec = *std::move(exec);
    g.copy_node = copy_node;
    g.baked = std::move(all);
    g.captured = true;
    ++run->captures;
    ++stats_.full_captures;
    run->capture_seconds += Since(t0);
  }
  if (g.copy_node != nullptr) {
    const absl::Status set =
        cuda::SetCopyWordsNode(g.exec.get(), g.copy_node, dev_outs, host_outs, outs_bytes);
    if (!set.ok()) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "cuda worker: %s; FULL graphs of %d tokens run eagerly\n",
                   std::string(set.message()).c_str(), padded);
      return run_eagerly();
    }
  }
  RETURN_IF_ERROR(g.exec.Launch(stream));
  ++run->replays;
  ++stats_.full_replays;
  run->mode = GraphMode::kFull;
  return absl::OkStatus();
}

absl::StatusOr<Tensor> GraphRunner::RunPiecewise(int32_t padded, EagerRegion region,
                                                 const Forward& forward, GraphRun* run) {
  PiecewiseEntry& e = piecewise_[padded];
  std::vector<uintptr_t> baked = backend_->Baked(/*with_head=*/false);
  const bool capture = !e.graph.captured || e.baked != baked;
  if (capture && e.graph.captured) ++stats_.recaptures;
  const auto tc = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(backend_->BeginPiecewise(&e.graph, capture, region));
  absl::StatusOr<Tensor> logits = forward();
  if (!logits.ok()) {
    backend_->AbortGraphs();
    return logits.status();
  }
  if (capture) {
    e.baked = std::move(baked);
    ++run->captures;
    ++stats_.piecewise_captures;
    run->capture_seconds += Since(tc);
  } else {
    ++stats_.piecewise_replays;
  }
  for (const CudaGraphExec& seg : e.graph.segments) run->replays += seg.empty() ? 0 : 1;
  return logits;
}

}  // namespace dsv4
