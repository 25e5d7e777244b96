// spikectl: the operators' command line for spikeguardd. See cli/spikectl.h.
#include <iostream>

#include "cli/spikectl.h"

int main(int argc, char** argv) {
  return spikeguard::cli::RunSpikectl(argc, argv, std::cout, std::cerr);
}
