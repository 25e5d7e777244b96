#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one run of a few minutes:
#   1. builds the kernels-only project (kernels/: no Abseil, gRPC or protobuf)
#   2. spikeguard_cuda_compare: CPU vs CUDA forward, backward and AdamW per
#      tensor against stated tolerances; replay determinism (bit-exact reruns
#      and a replay from a mid-run snapshot on a fresh backend); throughput in
#      FP32 and TF32 (tokens/s, TFLOP/s, % of the dense peak)
#   3. compute-sanitizer memcheck over the small compare (out-of-bounds and
#      misaligned accesses, API errors)
# Figures go to stdout and, when $OUT is set, to $OUT/cuda_checks.log.
# Exit status: 0 all passed; otherwise that of the first failing stage.
#
#   tests/device/cuda_checks.sh                  # from the repository root
#   SG_CUDA_ARCH=native SG_MEMCHECK=0 tests/device/cuda_checks.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${SG_BUILD:-build-kernels-gpu}
ARCH=${SG_CUDA_ARCH:-90}
MEMCHECK=${SG_MEMCHECK:-1}
LOG=${OUT:+$OUT/cuda_checks.log}
LOG=${LOG:-/dev/null}

say() { echo "== $*" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
say "machine"
run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
run nvcc --version | tail -2
run cmake --version | head -1
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

say "configure and build kernels/ (architecture $ARCH)"
CONF=(-S kernels -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DSPIKEGUARD_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH")
if ! run cmake "${CONF[@]}"; then
  say "configure failed; CUDA libraries on this machine:"
  run ls /usr/local/cuda/lib64 /usr/local/cuda/include 2>&1 | grep -i -E "cublas|cudart" | head -20
  # cuBLAS from PyTorch's pip wheel (nvidia-cublas), when the toolkit has none.
  wheel=$(python3 -c 'import nvidia.cublas, os; print(list(nvidia.cublas.__path__)[0])' 2>/dev/null)
  lib=$(ls "$wheel"/lib/libcublas.so* 2>/dev/null | head -1)
  [ -n "$lib" ] || exit 3
  say "retrying with the wheel's cuBLAS: $lib"
  rm -rf "$BUILD"
  run cmake "${CONF[@]}" -DCUDA_cublas_LIBRARY="$lib" -DCMAKE_CUDA_FLAGS="-I$wheel/include" || exit 3
fi
start=$(date +%s%N)
run cmake --build "$BUILD" -j "${SG_JOBS:-16}" || { say "build failed"; exit 3; }
say "build took $(( ($(date +%s%N) - start) / 1000000 )) ms"

status=0
say "compare, determinism, throughput"
run timeout 420 "$BUILD/cuda/spikeguard_cuda_compare" || status=$?
say "spikeguard_cuda_compare exited $status"

if [ "$MEMCHECK" = 1 ] && command -v compute-sanitizer >/dev/null; then
  say "compute-sanitizer memcheck over the small compare"
  mstatus=0
  run timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/cuda/spikeguard_cuda_compare" --quick --only=compare --threads=16 || mstatus=$?
  say "memcheck exited $mstatus"
  [ "$status" = 0 ] && status=$mstatus
fi
say "cuda_checks: exit $status"
exit "$status"
