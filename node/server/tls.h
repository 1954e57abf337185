// TLS material of the node's listeners (--tls-cert, --tls-key, --tls-client-ca), read and checked
// once at start: the certificate chain and key are PEM, the key matches the leaf certificate, the
// client CA bundle (mutual TLS) holds at least one certificate. The same credentials serve the
// public gRPC API and, where they apply, the metrics and HTTP listeners.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dsv4 {

struct TlsFiles {
  std::string cert;       // PEM certificate chain, leaf first
  std::string key;        // PEM private key of the leaf
  std::string client_ca;  // PEM CA bundle; set = clients must present a certificate it signed
  bool enabled() const { return !cert.empty() || !key.empty() || !client_ca.empty(); }
};

struct TlsCredentials {
  std::string cert_chain_pem;
  std::string private_key_pem;
  std::string client_ca_pem;  // empty: no client certificates asked for
  bool mutual() const { return !client_ca_pem.empty(); }
};

// Reads and validates the files. Errors name the flag and the file: "--tls-key: /k.pem does not
// match the certificate in --tls-cert".
absl::StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files);

}  // namespace dsv4
