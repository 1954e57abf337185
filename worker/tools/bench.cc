// dsv4-node bench: prefill and decode throughput of one worker on this process (CPU or GPU),
// through the same Worker::Launch / Collect path as serving (sampling included: on the GPU only
// token ids come back; --overlap-steps: each decode step launched before the previous one's
// tokens are read, as serving overlaps them). Decode can start from a synthetic context:
// `--contexts 1024,16384` places every sequence at that position with its cache pages allocated
// (their contents are whatever the pools hold), so a step reads and attends over a context of that
// length without a prefill. Each row also prints the HBM roofline of the bytes the decode step must
// read (and each prefill row a line with the prefill's FLOPs and bytes, step_cost.h, and their
// times at --peak-tflops and --hbm-tbps next to the measured time), and the graph mode the worker actually ran for the prefill and the timed decode steps
// (chosen per step as serving does: --cudagraph-mode, --cudagraph-capture-sizes; the CPU worker
// always runs eagerly).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/cli_command.h"
#include "common/flag_checks.h"
#include "worker/tools/model_loader.h"
#include "worker/tools/model_tools.h"
#include "worker/tools/step_cost.h"
#include "node/engine.h"
#include "node/scheduler/graph_policy.h"

namespace dsv4::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Bench final : public Command {
 public:
  explicit Bench(CLI::App& app) {
    flags_.Register(app);
    app.add_option("--batches", batches_, "batch sizes")->delimiter(',');
    app.add_option("--contexts", contexts_,
                   "decode from these context lengths (0 = after a real prefill of --prompt-len)")
        ->delimiter(',');
    app.add_option("--prompt-len", prompt_len_, "prompt tokens per sequence")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--decode-steps", decode_steps_, "decode steps")->check(CLI::Range(1, 1 << 20));
    app.add_option("--repeats", repeats_, "repetitions; the best is reported")
        ->check(CLI::Range(1, 1000));
    app.add_option("--peak-tflops", peak_tflops_,
                   "tensor-core peak for the prefill roofline (TFLOP/s; 0 = by precision on the GPU: "
                   "bf16 790, fp32 67; not printed on the CPU)")
        ->check(FiniteRange(0.0, 1e6));
    app.add_option("--hbm-tbps", hbm_tbps_, "HBM bandwidth for the roofline column (TB/s)")
        ->check(FiniteRange(0.01, 100.0));
    app.add_option("--cudagraph-mode", graph_mode_,
                   "none|piecewise|full|full_decode_only|full_and_piecewise (as serve); a comma "
                   "list runs the table once per mode on the same loaded worker");
    app.add_option("--cudagraph-capture-sizes", graph_sizes_,
                   "graph batch sizes in tokens (default 1,2,4,8,16,24,...,512)");
    app.add_option("--overlap-steps", overlap_,
                   "decode as serving with --overlap-steps does: each step launched before the "
                   "previous one's tokens are read, fed them on the device (auto: when the worker "
                   "supports it; as serving, on is off with a worker that takes one step at a "
                   "time)")
        ->check(CLI::IsMember({"auto", "on", "off"}));
  }

  int Run() override {
    for (int b : batches_) {
      if (b < 1 || b > 4096)
        return Fail(absl::InvalidArgumentError("--batches: sizes in [1, 4096]"));
    }
    for (int c : contexts_) {
      if (c < 0 || c > (1 << 24))
        return Fail(absl::InvalidArgumentError("--contexts: in [0, 2^24]"));
    }
    std::vector<GraphConfig> modes;
    for (absl::string_view m : absl::StrSplit(graph_mode_, ',')) {
      auto graphs = GraphConfigFromFlags(std::string(m), graph_sizes_, /*enforce_eager=*/false,
                                         kMaxDefaultCaptureSize);
      if (!graphs.ok()) return Fail(graphs.status());
      modes.push_back(*std::move(graphs));
    }
    const GraphConfig* graphs = &modes[0];
    const int max_batch = *std::max_element(batches_.begin(), batches_.end());
    const int max_ctx = *std::max_element(contexts_.begin(), contexts_.end());
    const int64_t max_len = std::max(prompt_len_, max_ctx) + decode_steps_ + 2;
    ModelLoader loader(flags_);
    // The largest step: a real prefill of every sequence's prompt at once, or a decode batch.
    const bool prefills = std::find(contexts_.begin(), contexts_.end(), 0) != contexts_.end();
    const int64_t max_step = prefills ? int64_t{max_batch} * std::max(prompt_len_, 1) : max_batch;
    // The largest graph step: a decode batch, or the prefill when it fits a capture size.
    int32_t max_graph = 0;
    for (const GraphConfig& mode : modes) {
      max_graph = std::max(max_graph, MaxGraphTokens(mode, max_batch, max_batch));
      if (prefills && !mode.capture_sizes.empty() && max_step <= mode.capture_sizes.back()) {
        max_graph = std::max(max_graph, MaxGraphTokens(mode, max_step, max_batch));
      }
    }
    loader.set_step_budget(max_step, max_graph);
    auto worker = loader.LoadWorker(max_batch, max_len);
    if (!worker.ok()) return Fail(worker.status());
    const WorkerInfo info = (*worker)->info();
    const ModelConfig& config = loader.config();
    const bool gpu = info.device != "cpu";
    auto overlap_mode = ParseOverlapMode(overlap_);
    if (!overlap_mode.ok()) return Fail(overlap_mode.status());
    const bool overlap = OverlapActive(*overlap_mode, info);
    const WeightBytes wbytes = StepWeightBytes(gpu, flags_.precision, flags_.weight_format);
    std::printf("model: %s\n", config.Summary().c_str());
    std::printf("device=%s precision=%s weight_format=%s prompt_len=%d decode_steps=%d repeats=%d "
                "overlap=%s batch_invariant=%s\n",
                info.device.c_str(), gpu ? flags_.precision.c_str() : "fp32",
                flags_.weight_format.c_str(), prompt_len_, decode_steps_, repeats_,
                overlap ? "on" : "off", flags_.batch_invariant ? "on" : "off");
    for (const GraphConfig& mode : modes) {
      graphs = &mode;
      std::printf(
          "cudagraph_mode=%s capture_sizes=%s worker_graphs=%s\n", CudaGraphModeName(graphs->mode),
          CaptureSizesString(graphs->capture_sizes).c_str(), info.cuda_graphs ? "yes" : "no");
      std::printf("%6s %8s %14s %12s %14s %14s %12s %10s %13s %12s %10s %10s\n", "batch", "context",
                  "prefill_tok/s", "prefill_ms", "decode_tok/s", "decode_ms/step", "roofline_ms",
                  "x_roofline", "prefill_graph", "decode_graph", "device_ms", "execute_ms");
      const int64_t per_seq = (max_len + info.block_size - 1) / info.block_size;
      std::mt19937 rng(1234);
      auto spec = std::make_shared<SamplingSpec>();  // greedy
      uint64_t step_id = 0;
      // The graph the coordinator would choose for a step.
      auto choose = [&](StepPlan& plan) {
        const GraphChoice g = ChooseGraph(plan, *graphs, info.cuda_graphs);
        plan.graph_mode = g.mode;
        plan.padded_tokens = g.padded_tokens;
        plan.step_id = ++step_id;
      };
      // (Launch + Collect: the worker then knows the step's samples for a deferred next step.)
      auto execute = [&](StepPlan& plan) -> absl::StatusOr<StepResult> {
        choose(plan);
        RETURN_IF_ERROR((*worker)->Launch(plan));
        return (*worker)->Collect();
      };
      // The modes that ran, over every repeat: one name, or "mixed" when steps differed.
      auto note = [](std::string* seen, GraphMode m) {
        if (seen->empty()) {
          *seen = GraphModeName(m);
        } else if (*seen != GraphModeName(m)) {
          *seen = "mixed";
        }
      };
      for (int batch : batches_) {
        for (int ctx : contexts_) {
          // In the best repeat, per decode step: device_ms, the worker's measure of the forward
          // and sampling on the device (StepResult::device_seconds, DSV4_STEP_DEVICE_TIME=1);
          // execute_ms, the worker's Execute call (host wall). decode_ms/step minus execute_ms is
          // the loop's own time between steps.
          double best_prefill = 1e30, best_decode = 1e30, best_device = 0, best_execute = 0;
          std::string prefill_graph, decode_graph;
          for (int rep = 0; rep < repeats_; ++rep) {
            StepPlan plan;
            plan.force_indexer_scoring = flags_.force_indexer_scoring;
            for (int i = 0; i < batch; ++i) {
              ScheduledSeq s;
              s.request_id = static_cast<uint64_t>(i) + 1;
              s.state_slot = i;
              for (int64_t b = 0; b < per_seq; ++b) {
                s.block_table.push_back(static_cast<int32_t>(i * per_seq + b));
              }
              s.sample = true;
              s.sampling = spec;
              if (ctx == 0) {
                for (int t = 0; t < prompt_len_; ++t) {
                  s.tokens.push_back(static_cast<int32_t>(rng() % config.vocab_size));
                }
                s.prompt_len = prompt_len_;
              } else {
                s.start_pos = ctx;
                s.prompt_len = ctx;
              }
              plan.seqs.push_back(std::move(s));
            }
            if (ctx == 0) {
              const auto t0 = Clock::now();
              auto r = execute(plan);
              if (!r.ok()) return Fail(r.status());
              best_prefill = std::min(best_prefill, Seconds(t0, Clock::now()));
              note(&prefill_graph, r->graph.mode);
              for (int i = 0; i < batch; ++i) {
                plan.seqs[i].start_pos = prompt_len_;
                plan.seqs[i].tokens = {r->sampled[i].token};
              }
            } else {
              for (auto& s : plan.seqs)
                s.tokens = {static_cast<int32_t>(rng() % config.vocab_size)};
            }
            // One untimed step (first-use plans and allocations), then the timed ones.
            Clock::time_point t2;
            double device = 0, execute_s = 0;
            auto account = [&](const StepResult& r) {
              note(&decode_graph, r.graph.mode);
              device += r.device_seconds;
              execute_s += r.execute_seconds;
            };
            auto advance = [&](StepPlan& p) {
              for (auto& s : p.seqs) {
                s.start_pos += 1;
                s.output_index += 1;
              }
            };
            for (int d = 0; d <= (overlap ? 1 : decode_steps_); ++d) {
              if (d == 1) t2 = Clock::now();
              auto r = execute(plan);
              if (!r.ok()) return Fail(r.status());
              if (d >= 1) account(*r);
              advance(plan);
              for (int i = 0; i < batch; ++i) plan.seqs[i].tokens = {r->sampled[i].token};
            }
            if (overlap) {
              // Steps 2..: each launched while the previous one runs, fed its tokens on the
              // device; the last one is collected after the loop.
              for (auto& s : plan.seqs) {
                s.tokens = {kDeferredToken};
                s.deferred_token = true;
              }
              for (int d = 2; d <= decode_steps_; ++d) {
                choose(plan);
                if (absl::Status st = (*worker)->Launch(plan); !st.ok()) return Fail(st);
                advance(plan);
                if (d > 2) {
                  auto r = (*worker)->Collect();
                  if (!r.ok()) return Fail(r.status());
                  account(*r);
                }
              }
              if (decode_steps_ >= 2) {
                auto r = (*worker)->Collect();
                if (!r.ok()) return Fail(r.status());
                account(*r);
              }
            }
            const double step = Seconds(t2, Clock::now()) / decode_steps_;
            if (step < best_decode) {
              best_decode = step;
              best_device = device / decode_steps_;
              best_execute = execute_s / decode_steps_;
            }
          }
          const int64_t at = ctx == 0 ? prompt_len_ : ctx;
          const double roof_ms =
              DecodeStepBytes(config, batch, at, wbytes) / (hbm_tbps_ * 1e12) * 1e3;
          if (ctx == 0) {
            std::printf("%6d %8d %14.1f %12.2f", batch, ctx, batch * prompt_len_ / best_prefill,
                        best_prefill * 1e3);
          } else {
            std::printf("%6d %8d %14s %12s", batch, ctx, "-", "-");
          }
          const std::string device_ms =
              best_device > 0 ? absl::StrFormat("%.3f", best_device * 1e3) : "-";
          std::printf(" %14.1f %14.3f %12.3f %10.2f %13s %12s %10s %10.3f\n", batch / best_decode,
                      best_decode * 1e3, roof_ms, best_decode * 1e3 / roof_ms,
                      ctx == 0 ? prefill_graph.c_str() : "-", decode_graph.c_str(),
                      device_ms.c_str(), best_execute * 1e3);
          if (ctx == 0) PrintPrefillRoofline(config, batch, wbytes, gpu, best_prefill);
          std::fflush(stdout);
        }
      }
    }
    return 0;
  }

 private:
  // The prefill row's roofline: its FLOPs (GEMMs, attention, indexer) and bytes, and the time each
  // takes at the peak and the bandwidth, next to the measured time.
  void PrintPrefillRoofline(const ModelConfig& config, int batch, const WeightBytes& w, bool gpu,
                            double measured_s) const {
    const PrefillCost c = PrefillStepCost(config, batch, prompt_len_, w);
    const double peak = peak_tflops_ > 0 ? peak_tflops_
                        : gpu             ? (flags_.precision != "fp32" ? 790.0 : 67.0)
                                          : 0.0;
    std::printf("       prefill: gemm %.2f GFLOP (routed experts %.2f), attention %.2f GFLOP, "
                "indexer %.2f GFLOP, %.3f GB", c.gemm_flops * 1e-9, c.routed_expert_flops * 1e-9,
                c.attention_flops * 1e-9, c.indexer_flops * 1e-9, c.bytes * 1e-9);
    const double bytes_ms = c.bytes / (hbm_tbps_ * 1e12) * 1e3;
    if (peak <= 0) {
      std::printf("; at %.1f TB/s %.3f ms; measured %.3f ms (%.1f TFLOP/s)\n", hbm_tbps_, bytes_ms,
                  measured_s * 1e3, c.flops() / measured_s * 1e-12);
      return;
    }
    const double flops_ms = c.flops() / (peak * 1e12) * 1e3;
    const double roof_ms = std::max(flops_ms, bytes_ms);
    std::printf("; at %.0f TFLOP/s %.3f ms, at %.1f TB/s %.3f ms; roofline %.3f ms, measured "
                "%.3f ms = %.2fx (%.1f TFLOP/s)\n", peak, flops_ms, hbm_tbps_, bytes_ms, roof_ms,
                measured_s * 1e3, measured_s * 1e3 / roof_ms, c.flops() / measured_s * 1e-12);
  }

  ModelFlags flags_;
  std::vector<int> batches_ = {1, 8, 32};
  std::vector<int> contexts_ = {0};
  int prompt_len_ = 128;
  int decode_steps_ = 32;
  int repeats_ = 3;
  double hbm_tbps_ = 4.8;
  double peak_tflops_ = 0;
  std::string graph_mode_ = "full_and_piecewise";
  std::string graph_sizes_;  // "" = the defaults
  std::string overlap_ = "auto";
};

}  // namespace

std::unique_ptr<Command> AddBench(CLI::App& app) { return std::make_unique<Bench>(app); }

}  // namespace dsv4::cli
