// spikectl.h
// -----------------------------------------------------------------------------
// spikectl, the operators' command line for spikeguardd, as a library so
// tests drive it in-process and capture what it prints.
//
//   spikectl [--addr=HOST:PORT] [--output=table|json] [--timeout=SECONDS]
//            COMMAND [SUBCOMMAND] [ARGS...]
//
// Commands: status; runs list|create|show|set-profile; checkpoints list; telemetry;
// incidents list|show|watch; report; rewind; replay; skip; pause; resume; approve;
// abort; policy get|set; manifest; quarantine list; audit; token new.
// `spikectl --help` lists them and `spikectl COMMAND --help` explains one.
//
// The address defaults to $SPIKEGUARD_ADDR, else 127.0.0.1:7070. Global flags
// may also follow the command (`spikectl runs list --output=json`).
//
// Security (worker/client/client_security.h): the bearer token from --token,
// --token-file, $SPIKEGUARD_TOKEN or $SPIKEGUARD_TOKEN_FILE goes with every
// call as `authorization: Bearer <token>`; --tls-ca or $SPIKEGUARD_TLS_CA
// turns TLS on (--tls-cert/--tls-key: mutual TLS; --tls-server-name). The
// token is never printed; UNAUTHENTICATED and PERMISSION_DENIED are followed
// by a "spikectl: hint: ..." line saying what to set.
//
// Exit codes, which scripts may rely on:
//   0  success (also --help on any command);
//   1  the daemon refused or failed the request, or could not be reached:
//      stderr has "spikectl: <CODE>: <message>", e.g.
//      "spikectl: NOT_FOUND: run 'x' not found";
//   2  usage error: stderr has "spikectl: <reason>" and the command's usage.
//
// Results go to `out`: aligned tables, or with --output=json one JSON object
// per response (one per line for `incidents watch`).
//
//   std::ostringstream out, err;
//   int code = RunSpikectl({"--addr=127.0.0.1:7070", "runs", "list"}, out, err);
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace spikeguard::cli {

// `args` excludes the program name.
int RunSpikectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// main()'s form: argv[0] is the program name.
int RunSpikectl(int argc, char** argv, std::ostream& out, std::ostream& err);

// The address used when --addr is not given: $SPIKEGUARD_ADDR or
// 127.0.0.1:7070.
std::string DefaultAddress();

}  // namespace spikeguard::cli
