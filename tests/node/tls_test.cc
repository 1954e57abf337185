// TLS on the public gRPC API and the metrics listener, with certificates made at test time by
// the openssl command (a CA, a server certificate for localhost/127.0.0.1, two client
// certificates): plaintext clients are refused, verified clients served; with --tls-client-ca a
// client without a certificate is refused, and a request belongs to its certificate's identity.
#include <atomic>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "gtest/gtest.h"
#include "node/serving_node.h"
#include "worker/in_process_worker.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/http_get.h"

namespace dsv4 {
namespace {

struct Pki {
  std::string dir, ca, server_cert, server_key, client_cert, client_key, other_cert, other_key;
};

// Makes the certificates; empty dir when openssl is missing.
Pki MakePki() {
  Pki p;
  const std::string dir = testing::TempDir("pki");
  std::string out;
  if (testing::RunCommand("command -v openssl", &out) != 0) return p;
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  auto sign = [&](const std::string& name, const std::string& cn, const std::string& ext) {
    return absl::StrCat("openssl req ", ec, " -keyout ", dir, "/", name, ".key -out ", dir, "/",
                        name, ".csr -subj /CN=", cn, " && printf '", ext, "' > ", dir, "/", name,
                        ".ext && openssl x509 -req -in ", dir, "/", name, ".csr -CA ", dir,
                        "/ca.pem -CAkey ", dir, "/ca.key -CAcreateserial -days 2 -out ", dir, "/",
                        name, ".pem -extfile ", dir, "/", name, ".ext");
  };
  const std::string cmd = absl::StrCat(
      "set -e; openssl req -x509 ", ec, " -keyout ", dir, "/ca.key -out ", dir,
      "/ca.pem -days 2 -subj /CN=dsv4-test-ca && ",
      sign("server", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1"), " && ",
      sign("client", "client-a", "extendedKeyUsage=clientAuth"), " && ",
      sign("other", "client-b", "extendedKeyUsage=clientAuth"));
  if (testing::RunCommand(cmd, &out) != 0) {
    ADD_FAILURE() << "openssl failed: " << out;
    return p;
  }
  p.dir = dir;
  p.ca = dir + "/ca.pem";
  p.server_cert = dir + "/server.pem";
  p.server_key = dir + "/server.key";
  p.client_cert = dir + "/client.pem";
  p.client_key = dir + "/client.key";
  p.other_cert = dir + "/other.pem";
  p.other_key = dir + "/other.key";
  return p;
}

std::string Read(const std::string& path) { return *ReadFileToString(path, 1 << 20); }

NodeOptions TlsOptions(const Pki& p, bool mutual) {
  NodeOptions o;
  o.worker_factory = CreateInProcessWorker;
  o.model_dir = testing::TestData("dsv4-tiny");
  o.tokenizer_path = testing::TestData("tok-tiny/tokenizer.json");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.device = "cpu";
  o.max_model_len = 512;
  o.max_num_seqs = 8;
  o.tls.cert = p.server_cert;
  o.tls.key = p.server_key;
  if (mutual) o.tls.client_ca = p.ca;
  return o;
}

std::shared_ptr<grpc::Channel> TlsChannel(int port, const Pki& p, const std::string& cert,
                                          const std::string& key, const std::string& tag = "") {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Read(p.ca);
  if (!cert.empty()) {
    ssl.pem_cert_chain = Read(cert);
    ssl.pem_private_key = Read(key);
  }
  grpc::ChannelArguments args;
  args.SetString("dsv4.test.client", tag);  // its own connection
  return grpc::CreateCustomChannel(absl::StrCat("localhost:", port), grpc::SslCredentials(ssl),
                                   args);
}

grpc::Status ModelInfo(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Dsv4::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ModelInfo info;
  return stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = MakePki();
    if (pki_.dir.empty()) GTEST_SKIP() << "openssl is not installed";
  }
  Pki pki_;
};

TEST_F(TlsTest, ServerTlsServesVerifiedClientsOnly) {
  auto node = ServingNode::Start(TlsOptions(pki_, /*mutual=*/false));
  ASSERT_TRUE(node.ok()) << node.status();
  const int port = (*node)->grpc_port();
  EXPECT_TRUE(ModelInfo(TlsChannel(port, pki_, "", "", "tls")).ok());
  const grpc::Status plain = ModelInfo(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                           grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // The metrics listener uses the same certificate.
  const int mport = (*node)->metrics_port();
  std::string out;
  EXPECT_EQ(testing::RunCommand(absl::StrCat("curl -sS --fail --max-time 10 --cacert ", pki_.ca,
                                             " https://localhost:", mport, "/metrics"),
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("dsv4_node_ready 1"), std::string::npos);
  EXPECT_NE(testing::HttpRaw(mport, "GET /metrics HTTP/1.0\r\n\r\n").status, 200);
  // The CLI client speaks TLS too.
  out.clear();
  EXPECT_EQ(testing::RunCommand(absl::StrCat(DSV4_NODE_BINARY, " client --target localhost:", port,
                                             " --tls-ca ", pki_.ca,
                                             " --prompt-ids 5,6 --max-tokens 2 --wait-ready 10"),
                                &out),
            0)
      << out;
  EXPECT_NE(out.find("finish_reason=LENGTH"), std::string::npos) << out;
}

// The OpenAI-compatible API takes the same certificate: a streamed chat over HTTPS, and plain
// HTTP on that port gets no answer.
TEST_F(TlsTest, TheHttpApiServesTlsWithTheSameCertificate) {
  NodeOptions o = TlsOptions(pki_, /*mutual=*/false);
  o.http_listen = "127.0.0.1:0";
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  const int hport = (*node)->http_port();
  std::string out;
  EXPECT_EQ(testing::RunCommand(
                absl::StrCat("curl -sS -N --fail --max-time 20 --cacert ", pki_.ca,
                             " https://localhost:", hport, "/v1/chat/completions -d "
                             "'{\"model\":\"dsv4-tiny\",\"stream\":true,\"max_tokens\":3,"
                             "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"),
                &out),
            0)
      << out;
  EXPECT_NE(out.find("\"finish_reason\":\"length\""), std::string::npos) << out;
  EXPECT_NE(out.find("data: [DONE]"), std::string::npos) << out;
  EXPECT_NE(testing::HttpRaw(hport, "GET /health HTTP/1.0\r\n\r\n").status, 200);
}

TEST_F(TlsTest, MutualTlsNeedsAClientCertificateAndScopesAbort) {
  auto node = ServingNode::Start(TlsOptions(pki_, /*mutual=*/true));
  ASSERT_TRUE(node.ok()) << node.status();
  const int port = (*node)->grpc_port();
  EXPECT_FALSE(ModelInfo(TlsChannel(port, pki_, "", "", "no-cert")).ok());
  auto a1 = TlsChannel(port, pki_, pki_.client_cert, pki_.client_key, "a1");
  ASSERT_TRUE(ModelInfo(a1).ok());
  std::string out;
  EXPECT_EQ(testing::RunCommand(absl::StrCat(DSV4_NODE_BINARY, " client --target localhost:", port,
                                             " --tls-ca ", pki_.ca, " --tls-cert ", pki_.client_cert,
                                             " --tls-key ", pki_.client_key,
                                             " --prompt-ids 5,6 --max-tokens 2"),
                                &out),
            0)
      << out;
  // Client A starts a request on one connection; B cannot abort it, A can from another.
  std::atomic<bool> started{false};
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  std::thread running([&] {
    auto stub = v1::Dsv4::NewStub(a1);
    grpc::ClientContext ctx;
    v1::GenerateRequest r;
    for (int id : {5, 6, 7}) r.mutable_token_ids()->add_ids(id);
    r.set_max_tokens(400);
    r.set_ignore_eos(true);
    r.set_request_id("job-1");
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      started = true;
      if (resp.has_finished()) reason = resp.finished().finish_reason();
    }
    EXPECT_TRUE(reader->Finish().ok());
  });
  for (int i = 0; i < 3000 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(started);
  auto abort = [&](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    v1::AbortRequest a;
    a.set_request_id("job-1");
    v1::AbortResponse resp;
    EXPECT_TRUE(v1::Dsv4::NewStub(ch)->Abort(&ctx, a, &resp).ok());
    return resp.found();
  };
  EXPECT_FALSE(abort(TlsChannel(port, pki_, pki_.other_cert, pki_.other_key, "b")));
  EXPECT_TRUE(abort(TlsChannel(port, pki_, pki_.client_cert, pki_.client_key, "a2")));
  running.join();
  EXPECT_EQ(reason, v1::CANCELLED);
}

TEST_F(TlsTest, MismatchedKeyIsRefusedAtStart) {
  NodeOptions o = TlsOptions(pki_, false);
  o.tls.key = pki_.client_key;
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().ToString().find("--tls-key"), std::string::npos) << node.status();
  EXPECT_NE(node.status().ToString().find("does not match"), std::string::npos) << node.status();
  o = TlsOptions(pki_, false);
  o.tls.cert = testing::TestData("dsv4-tiny/config.json");
  node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().ToString().find("no PEM certificate"), std::string::npos) << node.status();
}

}  // namespace
}  // namespace dsv4
