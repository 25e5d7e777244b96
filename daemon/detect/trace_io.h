// trace_io.h
// -----------------------------------------------------------------------------
// Forwarding header: the live adapter FromStepMessage is in step_message.h;
// trace files, labels and the synthetic traces are evaluation code in
// daemon/detect/eval/ (spikeguard::detect_eval, which the daemon does not
// link). Kept only because daemon/control/supervisor.cc still includes this
// path; once it includes "daemon/detect/step_message.h", delete this file.
#pragma once

#include "daemon/detect/step_message.h"
