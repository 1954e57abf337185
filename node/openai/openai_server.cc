#include "node/openai/openai_server.h"

#include <chrono>
#include <random>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "node/openai/api_error.h"
#include "node/openai/response.h"

namespace dsv4::openai {
namespace {

using Json = nlohmann::ordered_json;

http::Response JsonResponse(int status, const Json& body) {
  http::Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  r.body += "\n";
  return r;
}

ApiError Unavailable(const std::string& message) {
  return MakeError(503, "service_unavailable", "unavailable", message);
}

ApiError TooMany(const std::string& message) {
  return MakeError(429, "rate_limit_error", "rate_limit_exceeded", message);
}

// "127.0.0.1:40404" -> "127.0.0.1", "::1:40404" -> "::1": the client's quota key.
std::string ClientOf(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

// An id nobody can guess (they name requests in logs and in Abort's namespace).
std::string NewId(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

const char* EndpointPath(Endpoint e) {
  return e == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
}

}  // namespace

// One request between the HTTP handler and the engine.
struct OpenAiServer::Call {
  http::Request request;
  std::shared_ptr<http::Responder> responder;
  std::string client;
  std::atomic<bool> released{false};
  ClientQuota* quota = nullptr;
  void Release() {
    if (!released.exchange(true)) quota->Release(client);
  }
};

OpenAiServer::OpenAiServer(OpenAiOptions options, NodeMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      quota_(options_.max_requests_per_client),
      work_(options_.threads, options_.queue) {}

OpenAiServer::~OpenAiServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(OpenAiOptions options,
                                                                  NodeMetrics* metrics) {
  options.http.name = "http";
  options.http.error_response = [](int status, std::string_view message) {
    return MakeError(status, status >= 500 ? "server_error" : "invalid_request_error",
                     status == 404   ? "not_found"
                     : status == 405 ? "method_not_allowed"
                     : status == 413 ? "request_too_large"
                     : status == 431 ? "headers_too_large"
                                     : "",
                     std::string(message))
        .ToResponse();
  };
  std::unique_ptr<OpenAiServer> s(new OpenAiServer(std::move(options), metrics));
  auto server = http::Server::Start(s->options_.http, s->Routes());
  if (!server.ok()) return server.status();
  s->server_ = std::move(*server);
  return s;
}

void OpenAiServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  work_.Stop();
  if (server_) server_->Stop();
}

bool OpenAiServer::Authorized(const http::Request& request) const {
  if (options_.api_key.empty()) return true;
  const std::string* auth = request.Header("authorization");
  static const char kBearer[] = "Bearer ";
  if (auth == nullptr || auth->size() != options_.api_key.size() + sizeof(kBearer) - 1 ||
      auth->compare(0, sizeof(kBearer) - 1, kBearer) != 0) {
    return false;
  }
  // Constant time: the comparison does not tell how much of a guess was right.
  return CRYPTO_memcmp(auth->data() + sizeof(kBearer) - 1, options_.api_key.data(),
                       options_.api_key.size()) == 0;
}

void OpenAiServer::Answer(const std::shared_ptr<http::Responder>& responder, const char* endpoint,
                          http::Response response) {
  if (metrics_) metrics_->HttpResponses(endpoint, response.status).Increment();
  responder->Respond(std::move(response));
}

http::Router OpenAiServer::Routes() {
  http::Router router;
  // Every /v1 route checks the key first.
  auto guarded = [this](const char* endpoint, auto handler) {
    return [this, endpoint, handler](const http::Request& req, std::shared_ptr<http::Responder> r) {
      if (!Authorized(req)) {
        if (metrics_) metrics_->Rejected("unauthenticated").Increment();
        http::Response resp = MakeError(401, "authentication_error", "invalid_api_key",
                                        "a valid API key is required: Authorization: Bearer <key>")
                                  .ToResponse();
        resp.headers.emplace_back("WWW-Authenticate", "Bearer");
        return Answer(r, endpoint, std::move(resp));
      }
      handler(req, std::move(r));
    };
  };
  router.Add("GET", "/health", [this](const http::Request&, std::shared_ptr<http::Responder> r) {
    const bool up = serving_.load() && runtime_.load() != nullptr;
    Answer(r, "/health", JsonResponse(up ? 200 : 503, Json{{"status", up ? "ok" : "unavailable"}}));
  });
  router.Add("GET", "/v1/models", guarded("/v1/models", [this](const http::Request&,
                                                                std::shared_ptr<http::Responder> r) {
    const ServingRuntime* rt = runtime_.load();
    if (rt == nullptr) return Answer(r, "/v1/models", Unavailable("the model is still loading").ToResponse());
    Json model = {{"id", rt->model_info.model_name()},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "dsv4-node"},
                  {"max_model_len", rt->model_info.max_model_len()}};
    Answer(r, "/v1/models", JsonResponse(200, Json{{"object", "list"}, {"data", Json::array({model})}}));
  }));
  for (Endpoint e : {Endpoint::kChat, Endpoint::kCompletion}) {
    router.Add("POST", EndpointPath(e),
               guarded(EndpointPath(e), [this, e](const http::Request& req,
                                                  std::shared_ptr<http::Responder> r) {
                 Generate(e, req, std::move(r));
               }));
  }
  return router;
}

void OpenAiServer::Generate(Endpoint endpoint, const http::Request& request,
                            std::shared_ptr<http::Responder> responder) {
  const char* path = EndpointPath(endpoint);
  const ServingRuntime* rt = runtime_.load();
  if (rt == nullptr) {
    if (metrics_) metrics_->Rejected("not_ready").Increment();
    return Answer(responder, path, Unavailable("the model is still loading").ToResponse());
  }
  if (!serving_.load() || stopping_.load()) {
    if (metrics_) metrics_->Rejected("draining").Increment();
    return Answer(responder, path, Unavailable("the node is not serving (draining, or a worker is down)").ToResponse());
  }
  auto call = std::make_shared<Call>();
  call->client = ClientOf(request.peer);
  call->quota = &quota_;
  if (!quota_.Acquire(call->client)) {
    if (metrics_) metrics_->Rejected("client_limit").Increment();
    return Answer(responder, path,
                  TooMany(absl::StrCat("this client has ", quota_.limit(),
                                       " requests in flight, the limit (--max-requests-per-client)"))
                      .ToResponse());
  }
  call->request = request;
  call->responder = responder;
  // Parsing and tokenizing off the I/O threads, on a bounded queue.
  const bool queued = work_.Post([this, endpoint, rt, call] { Admit(endpoint, rt, call); });
  if (!queued) {
    call->Release();
    if (metrics_) metrics_->Rejected("queue_full").Increment();
    Answer(responder, path,
           stopping_.load() ? Unavailable("the node is shutting down").ToResponse()
                            : TooMany(absl::StrCat("the request queue is full (", work_.capacity(),
                                                   " waiting)")).ToResponse());
  }
}

void OpenAiServer::Admit(Endpoint endpoint, const ServingRuntime* rt,
                         const std::shared_ptr<Call>& call) {
  const char* path = EndpointPath(endpoint);
  auto refuse = [&](const ApiError& e, const char* reason) {
    call->Release();
    if (metrics_ && reason != nullptr) metrics_->Rejected(reason).Increment();
    Answer(call->responder, path, e.ToResponse());
  };
  if (stopping_.load()) return refuse(Unavailable("the node is shutting down"), nullptr);
  if (call->responder->client_gone()) return call->Release();
  auto parsed = endpoint == Endpoint::kChat ? ParseChatRequest(call->request.body, options_.parse)
                                            : ParseCompletionRequest(call->request.body, options_.parse);
  // The body is not needed past here (the call lives as long as its generation).
  std::string().swap(call->request.body);
  if (!parsed.ok()) return refuse(FromStatus(parsed.status()), "invalid_argument");
  ApiRequest& req = *parsed;
  if (req.model != rt->model_info.model_name()) {
    ApiError e;
    e.status = 404;
    e.code = "model_not_found";
    e.param = "model";
    e.message = absl::StrCat("model: \"", req.model.substr(0, 128), "\" is not served here; this node serves \"",
                             rt->model_info.model_name(), "\"");
    return refuse(e, "invalid_argument");
  }
  const std::string id = NewId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  req.generate.set_request_id(id);
  const uint64_t seed = seed_counter_.fetch_add(0x9e3779b97f4a7c15ull);
  auto validated = ValidateRequest(req.generate, *rt->tokenizer, rt->limits, seed);
  if (!validated.ok()) {
    return refuse(FromStatus(validated.status(),
                             endpoint == Endpoint::kChat ? &ChatFieldName : &CompletionFieldName),
                  "invalid_argument");
  }
  const std::string owner = absl::StrCat("http:", call->request.peer);
  validated->owner = owner;
  ResponseMeta meta;
  meta.id = id;
  meta.model = rt->model_info.model_name();
  meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count();
  NodeMetrics* metrics = metrics_;
  auto sink = std::make_shared<ResponseSink>(
      req, meta, call->responder, rt->tokenizer, [call, metrics, path](int status) {
        call->Release();
        if (metrics) metrics->HttpResponses(path, status).Increment();
      });
  auto name = rt->engine->Submit(std::move(*validated), sink);
  if (!name.ok()) {
    // The engine did not take it: the sink never answers.
    return refuse(FromStatus(name.status()), nullptr);
  }
  sink->Begin();
  Engine* engine = rt->engine;
  call->responder->OnClientGone([engine, id, owner] {
    engine->Abort(id, "client closed the connection", owner);
  });
}

}  // namespace dsv4::openai
