// The e2e tests run the daemon as it is deployed: TLS with the test CA's
// certificate, a tokens file, and clients (spikectl, the test's own stubs)
// that present the admin token over TLS. The workers the daemon launches get
// their run-scoped token and the CA from the launcher's environment.
//
//   TestSecurity security(dir_);
//   argv += security.DaemonArgs();        // --tokens --tls-cert --tls-key ...
//   spikectl_argv += security.ClientArgs();  // --token-file --tls-ca
//   auto stub = v1::SupervisorService::NewStub(security.Channel(addr));
//   security.Authorize(&ctx);
#pragma once

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "base/secret.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tests/e2e/process.h"

#ifndef TEST_TLS_DIR
#error "TEST_TLS_DIR: the tests' TLS material (tests/CMakeLists.txt, test_tls_material)"
#endif

namespace spikeguard::testing {

class TestSecurity {
 public:
  explicit TestSecurity(const TempDir& dir)
      : tokens_file_(dir.File("tokens")), token_file_(dir.File("admin.token")),
        token_(NewToken()) {
    std::ofstream(tokens_file_) << "e2e-admin admin * " << HashToken(token_) << "\n";
    std::ofstream(token_file_) << token_ << "\n";
  }

  static std::string Tls(const std::string& name) { return std::string(TEST_TLS_DIR) + "/" + name; }

  std::vector<std::string> DaemonArgs() const {
    return {"--tokens=" + tokens_file_, "--tls-cert=" + Tls("server.pem"),
            "--tls-key=" + Tls("server.key"), "--worker-tls-ca=" + Tls("ca.pem")};
  }

  std::vector<std::string> ClientArgs() const {
    return {"--token-file=" + token_file_, "--tls-ca=" + Tls("ca.pem")};
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& addr) const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(Tls("ca.pem"));
    return grpc::CreateChannel(addr, grpc::SslCredentials(ssl));
  }

  void Authorize(grpc::ClientContext* ctx) const {
    ctx->AddMetadata("authorization", "Bearer " + token_);
  }

  const std::string& token_file() const { return token_file_; }

 private:
  std::string tokens_file_;
  std::string token_file_;
  std::string token_;
};

}  // namespace spikeguard::testing
