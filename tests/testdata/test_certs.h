// test_certs.h
// -----------------------------------------------------------------------------
// TLS material for tests, made at test time by tests/testdata/make_test_certs.sh
// (fresh keys, nothing secret committed) into a private temp dir, once per
// test process, removed when the process's tests are done. The target must
// define SPIKEGUARD_SOURCE_DIR (the checkout):
//
//   target_compile_definitions(t PRIVATE SPIKEGUARD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
//
//   const TestCerts& certs = GetTestCerts();
//   TestServer server(&service, certs.ServerCredentials(/*require_client_cert=*/true));
//   spikectl --tls-ca=certs.Path("ca.pem") --tls-cert=certs.Path("client.pem") ...
#pragma once

#include <stdlib.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "tests/storage/corpus/test_dir.h"

namespace spikeguard::testing {

struct TestCerts {
  std::string dir;  // ca.pem ca.key server.pem server.key client.pem client.key other-ca.pem

  std::string Path(const std::string& name) const { return dir + "/" + name; }
  std::string Read(const std::string& name) const {
    std::ifstream in(Path(name));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // The daemon's side: server.pem/server.key; with require_client_cert, a
  // client must present a certificate that ca.pem signed.
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials(bool require_client_cert = false) const {
    grpc::SslServerCredentialsOptions options(
        require_client_cert ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    options.pem_root_certs = Read("ca.pem");
    options.pem_key_cert_pairs.push_back({Read("server.key"), Read("server.pem")});
    return grpc::SslServerCredentials(options);
  }
};

inline const TestCerts& GetTestCerts() {
  static const TestCerts* certs = [] {
    auto* c = new TestCerts;
    std::string base = ::testing::TempDir();
    if (base.empty() || base.back() != '/') base += '/';
    std::string pattern = base + "sg-certs-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp " << pattern << " failed";
      return c;
    }
    c->dir = pattern;
    // The keys are made fresh for every test process.
    storage::testing_util::RemoveWhenTestsEnd(c->dir);
    const std::string command = std::string("bash '") + SPIKEGUARD_SOURCE_DIR +
                                "/tests/testdata/make_test_certs.sh' '" + c->dir + "'";
    if (std::system(command.c_str()) != 0) ADD_FAILURE() << command << " failed";
    return c;
  }();
  return *certs;
}

}  // namespace spikeguard::testing
