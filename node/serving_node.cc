#include "node/serving_node.h"

#include <functional>
#include <mutex>

#include <google/protobuf/stubs/logging.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "node/chat_format.h"

namespace dsv4 {

namespace {

// protobuf logs a parse failure of hostile bytes (a string field that is not UTF-8) at ERROR on
// stderr; the client already gets INVALID_ARGUMENT, so the log gets a debug line.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  LogDebug("protobuf", {{"level", static_cast<int64_t>(level)}, {"message", message}});
}

// The last path component of `path` ("/models/dsv4-tiny/" -> "dsv4-tiny"): what GetModelInfo
// tells clients instead of host paths.
std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The worker's lifecycle up to its first step (worker.h), logged: model_loading once configured,
// model_load_progress at every tenth of the layers.
absl::Status BringUpWorker(Worker& worker, const WorkerConfig& wc) {
  if (absl::Status s = worker.Configure(wc); !s.ok()) return Annotate(s, "configuring the worker");
  const WorkerInfo info = worker.info();
  LogInfo("model_loading", {{"dir", wc.source},
                            {"weights", wc.synthetic ? "synthetic" : "checkpoint"},
                            {"weight_format", wc.weight_format},
                            {"batch_invariant", wc.batch_invariant},
                            {"device", info.device},
                            {"precision", info.precision},
                            {"config", wc.model.Summary()}});
  int64_t logged = -1;
  auto progress = [&logged](const LoadProgress& p) {
    const int64_t tenth = p.total > 0 ? p.done * 10 / p.total : 10;
    if (p.phase == "weights" && tenth == logged) return;
    logged = tenth;
    LogInfo("model_load_progress", {{"phase", p.phase}, {"done", p.done}, {"total", p.total}});
  };
  if (absl::Status s = worker.Load(progress); !s.ok()) return Annotate(s, "loading the model");
  if (absl::Status s = worker.WarmUp(); !s.ok()) return Annotate(s, "warming up the worker");
  return absl::OkStatus();
}

}  // namespace

absl::Status ServingNode::StartListeners(const NodeOptions& o) {
  ASSIGN_OR_RETURN(const ListenAddress grpc_at, ParseListenAddress("--listen", o.listen));
  ASSIGN_OR_RETURN(const ListenAddress metrics_at,
                   ParseListenAddress("--metrics-listen", o.metrics_listen));
  if (o.tls.enabled()) {
    ASSIGN_OR_RETURN(tls_, LoadTlsCredentials(o.tls));
  }
  const TlsCredentials* tls = o.tls.enabled() ? &tls_ : nullptr;
  registry_ = std::make_shared<prometheus::Registry>();
  metrics_ = std::make_unique<NodeMetrics>(registry_);
  http::ServerOptions mo;
  mo.host = metrics_at.host;
  mo.port = metrics_at.port;
  mo.max_connections = o.metrics_max_connections;
  mo.tls = o.metrics_plaintext ? nullptr : tls;
  auto metrics_server = MetricsServer::Start(mo, registry_);
  if (!metrics_server.ok()) return Annotate(metrics_server.status(), "--metrics-listen");
  metrics_server_ = std::move(*metrics_server);
  AdmissionOptions admission = o.admission;
  if (admission.max_requests_per_client <= 0) {
    // Half of what the node holds, but never less than a full batch.
    admission.max_requests_per_client =
        std::max(o.max_num_seqs, (o.max_num_seqs + o.max_waiting) / 2);
  }
  service_ = std::make_unique<Dsv4Service>(metrics_.get(), admission);
  GrpcServerOptions go;
  go.listen = grpc_at;
  go.tls = tls;
  go.max_concurrent_streams = o.max_concurrent_streams;
  ASSIGN_OR_RETURN(grpc_, GrpcServer::Start(go, service_.get()));
  if (!o.http_listen.empty()) {
    ASSIGN_OR_RETURN(const ListenAddress http_at, ParseListenAddress("--http-listen", o.http_listen));
    openai::OpenAiOptions ho;
    ho.http.host = http_at.host;
    ho.http.port = http_at.port;
    ho.http.tls = tls;
    ho.http.threads = 2;
    ho.http.max_connections = o.http_max_connections;
    ho.http.max_connections_per_client = std::max(1, o.http_max_connections / 4);
    ho.http.max_body_bytes = o.http_max_body_bytes;
    // A keep-alive connection may wait between requests as long as a client's pool keeps it.
    ho.http.idle_timeout = std::chrono::seconds(120);
    ho.api_key = o.api_key;
    ho.max_requests_per_client = admission.max_requests_per_client;
    ho.threads = std::max(1, o.admission.tokenizer_threads);
    ho.queue = std::max(o.max_waiting, 64);
    auto http = openai::OpenAiServer::Start(std::move(ho), metrics_.get());
    if (!http.ok()) return Annotate(http.status(), "--http-listen");
    openai_ = std::move(*http);
  }
  LogInfo("listening", {{"grpc_port", grpc_->port()},
                        {"metrics_port", metrics_server_->port()},
                        {"http_port", openai_ ? openai_->port() : 0},
                        {"tls", tls == nullptr ? "off" : tls->mutual() ? "mutual" : "on"}});
  return absl::OkStatus();
}

void ServingNode::FillModelInfo(const NodeOptions& o, const ModelConfig& mc,
                                const WorkerInfo& winfo, const std::string& tokenizer_path) {
  const NodeLimits& lim = runtime_.limits;
  v1::ModelInfo& info = runtime_.model_info;
  info.set_model_name(!o.served_model_name.empty() ? o.served_model_name
                      : !o.synthetic_config.empty() ? BaseName(o.synthetic_config)
                                                    : BaseName(o.model_dir));
  info.set_tokenizer_name(BaseName(tokenizer_path));
  info.set_vocab_size(mc.vocab_size);
  info.set_max_model_len(lim.max_model_len);
  info.set_num_layers(mc.num_layers);
  info.set_hidden_size(mc.hidden_size);
  for (AttnType t : mc.layer_types) info.add_layer_types(std::string(AttnTypeName(t)));
  info.set_bos_token_id(static_cast<int32_t>(mc.bos_token_id));
  for (int32_t e : lim.eos_token_ids) info.add_eos_token_ids(e);
  info.set_device(winfo.device);
  info.set_max_num_seqs(o.max_num_seqs);
  info.set_default_max_tokens(o.default_max_tokens);
  info.set_think_start_token_id(lim.think_start_id);
  info.set_think_end_token_id(lim.think_end_id);
}

// One short request through the whole path before the node reports ready.
absl::Status ServingNode::WarmUp(int64_t bos_token_id) {
  v1::GenerateRequest warm;
  warm.mutable_token_ids()->add_ids(static_cast<int32_t>(bos_token_id));
  warm.set_max_tokens(2);
  warm.set_ignore_eos(true);
  warm.set_request_id("warmup");
  ASSIGN_OR_RETURN(ValidatedRequest validated,
                   ValidateRequest(warm, *tokenizer_, runtime_.limits, 0));
  validated.internal = true;
  validated.owner = "node";
  auto sink = std::make_shared<PromiseSink>();
  auto done = sink->future();
  RETURN_IF_ERROR(engine_->Submit(std::move(validated), sink));
  const v1::GenerateResponse last = done.get();
  if (!last.has_finished()) {
    return absl::InternalError(absl::StrCat("warm-up failed: ", last.error().message()));
  }
  // The final response is emitted before the engine retires the request: wait until it is gone,
  // so that the node reports ready with nothing in flight (stats and drains start clean).
  if (!engine_->WaitIdle(std::chrono::seconds(30))) {
    return absl::InternalError("warm-up request did not retire");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServingNode>> ServingNode::Start(const NodeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // Flags first: a typo must fail before minutes of model loading.
  ASSIGN_OR_RETURN(GraphConfig graphs,
                   GraphConfigFromFlags(o.cudagraph_mode, o.cudagraph_capture_sizes,
                                        o.enforce_eager, o.max_batched_tokens));
  ASSIGN_OR_RETURN(const OverlapMode overlap, ParseOverlapMode(o.overlap));
  if (!o.worker_factory) {
    return absl::InvalidArgumentError("NodeOptions.worker_factory: no worker factory given");
  }
  // The worker on its device first: a device that is not there fails before anything listens.
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, o.worker_factory(o.device));
  static std::once_flag protobuf_log;
  std::call_once(protobuf_log, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
  std::unique_ptr<ServingNode> n(new ServingNode());
  RETURN_IF_ERROR(n->StartListeners(o));

  const std::string tok_path =
      o.tokenizer_path.empty() ? o.model_dir + "/tokenizer.json" : o.tokenizer_path;
  ASSIGN_OR_RETURN(n->tokenizer_, Tokenizer::Load(tok_path));
  const bool synthetic = !o.synthetic_config.empty();
  ASSIGN_OR_RETURN(ModelConfig mc, LoadModelConfig(synthetic ? o.synthetic_config
                                                             : o.model_dir + "/config.json"));
  const int64_t model_len =
      o.max_model_len > 0 ? o.max_model_len : std::min<int64_t>(mc.max_position_embeddings, 8192);
  if (model_len > mc.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--max-model-len ", model_len,
                                                   " exceeds max_position_embeddings ",
                                                   mc.max_position_embeddings));
  }
  if (n->tokenizer_->vocab_size() > mc.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer ", tok_path, " has ",
                                                   n->tokenizer_->vocab_size(),
                                                   " tokens; the model's vocabulary is ",
                                                   mc.vocab_size));
  }
  CacheConfig cache;
  cache.block_size = o.block_size > 0 ? o.block_size : DefaultBlockSize(mc);
  cache.num_slots = o.max_num_seqs;
  cache.max_model_len = static_cast<int32_t>(model_len);
  cache.max_step_tokens = o.max_batched_tokens;
  cache.max_graph_tokens = MaxGraphTokens(graphs, o.max_batched_tokens, o.max_num_seqs);
  const int64_t per_seq = (model_len + cache.block_size - 1) / cache.block_size;
  cache.num_blocks = o.kv_blocks > 0 ? o.kv_blocks : static_cast<int32_t>(per_seq * o.max_num_seqs);
  // Every cached block keeps the sequence's state at its end in a snapshot row (as large as a
  // state slot): the rows bound the cache.
  if (o.enable_prefix_caching) {
    cache.num_state_snapshots =
        o.prefix_cache_max_blocks > 0
            ? std::min(o.prefix_cache_max_blocks, cache.num_blocks)
            : static_cast<int32_t>(std::min<int64_t>(cache.num_blocks, 4 * int64_t{o.max_num_seqs}));
  }
  WorkerConfig wc;
  wc.precision = o.precision;
  wc.weight_format = o.weight_format;
  wc.batch_invariant = o.batch_invariant;
  wc.threads = o.threads;
  wc.model_dir = o.model_dir;
  wc.synthetic = synthetic;
  wc.synthetic_seed = o.seed;
  wc.source = synthetic ? o.synthetic_config : o.model_dir;
  wc.model = mc;
  wc.cache = cache;
  RETURN_IF_ERROR(BringUpWorker(*worker, wc));
  const WorkerInfo winfo = worker->info();

  NodeLimits& lim = n->runtime_.limits;
  lim.vocab_size = mc.vocab_size;
  lim.max_model_len = winfo.max_model_len;
  lim.kv_capacity_tokens = static_cast<int64_t>(winfo.num_blocks) * winfo.block_size;
  lim.default_max_tokens = o.default_max_tokens;
  for (int64_t e : mc.eos_token_ids) lim.eos_token_ids.push_back(static_cast<int32_t>(e));
  lim.think_start_id = n->tokenizer_->TokenId(kThinkStartText).value_or(-1);
  lim.think_end_id = n->tokenizer_->TokenId(kThinkEndText).value_or(-1);
  lim.repetition_mode = o.repetition_mode;
  lim.repetition = o.repetition;
  n->FillModelInfo(o, mc, winfo, tok_path);

  EngineConfig ec;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_batched_tokens = o.max_batched_tokens;
  ec.scheduler.max_prefill_chunk = o.max_prefill_chunk;
  ec.max_waiting = o.max_waiting;
  ec.force_indexer_scoring = o.force_indexer_scoring;
  ec.graphs = graphs;
  ec.overlap = overlap;
  ec.enable_prefix_caching = o.enable_prefix_caching;
  // Cache keys start from what makes the state: the weights and how they are computed.
  ec.prefix_cache_salt = std::hash<std::string>{}(absl::StrCat(
      wc.source, "|", o.precision, "|", o.weight_format, "|", o.seed, "|", cache.block_size, "|",
      o.batch_invariant));
  LogInfo("prefix_cache", {{"enabled", o.enable_prefix_caching && winfo.num_state_snapshots > 0},
                           {"max_blocks", static_cast<int64_t>(winfo.num_state_snapshots)},
                           {"block_size", static_cast<int64_t>(winfo.block_size)}});
  // A lost worker rank takes the node out of service (grpc.health.v1 NOT_SERVING) until the
  // worker recovers; a drain keeps it out.
  ServingNode* self = n.get();
  ec.on_worker_health = [self](bool healthy, const absl::Status& why) {
    const bool serving = healthy && !self->engine_->draining();
    LogEvent(healthy ? LogLevel::kInfo : LogLevel::kError, healthy ? "worker_healthy" : "worker_unhealthy",
             {{"detail", healthy ? std::string("serving again") : std::string(why.message())}});
    self->SetServing(serving);
  };
  // worker_graphs=false (the CPU worker) means every step runs eagerly whatever the mode says.
  LogInfo("cuda_graphs", {{"mode", CudaGraphModeName(graphs.mode)},
                          {"enforce_eager", o.enforce_eager},
                          {"worker_graphs", winfo.cuda_graphs},
                          {"capture_sizes", CaptureSizesString(graphs.capture_sizes)}});
  n->engine_ = std::make_unique<Engine>(ec, std::move(worker),
                                        n->tokenizer_.get(), n->metrics_.get());
  LogInfo("overlap_steps", {{"mode", o.overlap}, {"active", n->engine_->overlap()}});
  n->engine_->Start();
  n->runtime_.engine = n->engine_.get();
  n->runtime_.tokenizer = n->tokenizer_.get();
  RETURN_IF_ERROR(n->WarmUp(mc.bos_token_id));
  n->service_->Attach(&n->runtime_);
  if (n->openai_) n->openai_->Attach(&n->runtime_);
  n->SetServing(true);
  LogInfo("serving",
          {{"model", n->runtime_.model_info.model_name()},
           {"load_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
           {"max_model_len", lim.max_model_len},
           {"kv_blocks", cache.num_blocks},
           {"max_num_seqs", o.max_num_seqs}});
  return n;
}

ServingNode::~ServingNode() { Shutdown(); }

void ServingNode::SetServing(bool serving) {
  if (grpc_) grpc_->SetServing(serving);
  if (openai_) openai_->SetServing(serving);
  if (metrics_) metrics_->ready->Set(serving ? 1 : 0);
}

bool ServingNode::Drain(std::chrono::milliseconds timeout) {
  SetServing(false);
  if (!engine_) return true;
  engine_->BeginDrain();
  if (engine_->WaitIdle(timeout)) return true;
  LogWarning("drain_timeout", {{"cancelled", engine_->stats().in_flight}});
  engine_->CancelAll("cancelled: drain timeout");
  engine_->WaitIdle(std::chrono::seconds(10));
  return false;
}

void ServingNode::Shutdown() {
  // The tokenizer queue first (what waits there is refused; it uses the engine), then the
  // server (its calls end), then the engine.
  if (service_) service_->Shutdown();
  if (openai_) openai_->Shutdown();
  if (grpc_) grpc_->Shutdown(std::chrono::milliseconds(2000));
  grpc_.reset();
  if (engine_) engine_->Stop();
  metrics_server_.reset();
}

}  // namespace dsv4
