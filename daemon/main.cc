// spikeguardd: the spikeguard daemon (daemon_main.h).
#include "daemon/daemon_main.h"

int main(int argc, char** argv) { return spikeguard::daemon::DaemonMain(argc, argv); }
