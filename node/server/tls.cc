#include "node/server/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/status.h"

namespace dsv4 {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  auto pem = ReadFileToString(path, kMaxPemBytes);
  if (!pem.ok()) return Annotate(pem.status(), flag);
  return *pem;
}

// Leaf certificate of a PEM chain (and the count of certificates in it).
absl::StatusOr<std::unique_ptr<X509, X509Free>> FirstCertificate(const char* flag,
                                                                const std::string& path,
                                                                const std::string& pem,
                                                                int* count) {
  Bio bio = MemBio(pem);
  std::unique_ptr<X509, X509Free> first;
  *count = 0;
  while (true) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    if (!first) {
      first.reset(cert);
    } else {
      X509_free(cert);
    }
    ++*count;
  }
  ERR_clear_error();
  if (!first) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", path, " holds no PEM certificate"));
  }
  return first;
}

}  // namespace

absl::StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: give both (the server's certificate chain and its key)");
  }
  if (files.cert.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  TlsCredentials out;
  ASSIGN_OR_RETURN(out.cert_chain_pem, ReadPem("--tls-cert", files.cert));
  ASSIGN_OR_RETURN(out.private_key_pem, ReadPem("--tls-key", files.key));
  int count = 0;
  ASSIGN_OR_RETURN(auto leaf, FirstCertificate("--tls-cert", files.cert, out.cert_chain_pem, &count));
  Bio key_bio = MemBio(out.private_key_pem);
  std::unique_ptr<EVP_PKEY, KeyFree> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-key: ", files.key, " holds no PEM private key (or it is encrypted)"));
  }
  if (X509_check_private_key(leaf.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--tls-key: ", files.key,
                                                   " does not match the certificate in --tls-cert ",
                                                   files.cert));
  }
  if (!files.client_ca.empty()) {
    ASSIGN_OR_RETURN(out.client_ca_pem, ReadPem("--tls-client-ca", files.client_ca));
    ASSIGN_OR_RETURN(auto ca, FirstCertificate("--tls-client-ca", files.client_ca,
                                               out.client_ca_pem, &count));
    (void)ca;
  }
  return out;
}

}  // namespace dsv4
