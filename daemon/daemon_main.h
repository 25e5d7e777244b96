// daemon_main.h
// -----------------------------------------------------------------------------
// spikeguardd's whole program: parse the daemon's flags into
// Daemon::Options, start the daemon, serve until SIGTERM/SIGINT (SIGHUP
// re-reads the tokens file), shut down. Returns the process exit code.
//
// `customize`, when set, edits the options after the flags are parsed and
// before the daemon starts. spikeguardd passes none; test-only daemon
// binaries (tests/e2e/spikeguardd_crash_point.cc) use it to inject hooks
// such as Daemon::Options::after_group_commit, so production code carries
// no test switches.
#pragma once

#include <functional>

#include "daemon/daemon.h"

namespace spikeguard::daemon {

int DaemonMain(int argc, char** argv,
               const std::function<void(Daemon::Options&)>& customize = nullptr);

}  // namespace spikeguard::daemon
