#!/usr/bin/env bash
# Runs one libFuzzer target of tests/fuzz.
#
#   run_fuzzer.sh --replay BINARY SRC_DIR WORK_DIR
#       every input in SRC_DIR/corpus/NAME and SRC_DIR/regressions/NAME once
#   run_fuzzer.sh BINARY SRC_DIR WORK_DIR SECONDS
#       fuzz for SECONDS, starting from those inputs; new inputs go to
#       WORK_DIR/corpus/NAME (never into the source tree), a crash to
#       WORK_DIR/crashes/NAME/ (copy it to SRC_DIR/regressions/NAME/ once fixed)
#
# NAME is BINARY's file name. Exit status: the fuzzer's (non-zero on a crash,
# a leak, a timeout or an out-of-memory).
set -euo pipefail
replay=0
if [ "${1:-}" = "--replay" ]; then replay=1; shift; fi
bin=$1 src=$2 work=$3 seconds=${4:-5}
name=$(basename "$bin")
seeds=$src/corpus/$name
regressions=$src/regressions/$name
mkdir -p "$work/corpus/$name" "$work/crashes/$name"

# The uninstrumented system libraries (gRPC, protobuf, Abseil) make ASan's
# container-overflow checks unreliable; see cmake/Sanitize.cmake.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_container_overflow=0:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The daemon's own log (supervisor_request_fuzz runs one): errors only.
export SPIKEGUARD_LOG_LEVEL=${SPIKEGUARD_LOG_LEVEL:-ERROR}

# Bounds that keep a run honest: 2 GiB, 10 s per input.
common=(-rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=0)
# SPIKEGUARD_FUZZ_SEED: 0 (the default) = random; ctest's bounded runs fix it.
common+=(-seed="${SPIKEGUARD_FUZZ_SEED:-0}")
# A dictionary of the format's tokens, when the target has one.
if [ -f "$src/$name.dict" ]; then common+=(-dict="$src/$name.dict"); fi
dirs=()
for d in "$seeds" "$regressions"; do
  if [ -d "$d" ] && [ -n "$(ls -A "$d")" ]; then dirs+=("$d"); fi
done

if [ "$replay" = 1 ]; then
  if [ ${#dirs[@]} -eq 0 ]; then
    echo "$name: no seeds or regression inputs"
    exit 0
  fi
  # -runs=0: read every input (running each once), fuzz nothing.
  exec "$bin" "${common[@]}" -runs=0 -artifact_prefix="$work/crashes/$name/" "${dirs[@]}"
fi

echo "$name: fuzzing for ${seconds}s (corpus $work/corpus/$name, crashes $work/crashes/$name/)"
exec "$bin" "${common[@]}" -max_total_time="$seconds" \
  -artifact_prefix="$work/crashes/$name/" "$work/corpus/$name" "${dirs[@]}"
