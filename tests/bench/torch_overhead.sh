#!/usr/bin/env bash
# torch_overhead.sh BUILD OUT — the own_data example plain vs under
# spikeguard.supervise (2 gloo ranks, a real spikeguardd), in alternating
# pairs; writes OUT/torch_overhead.json (plain_steps_per_s,
# supervised_steps_per_s, overhead_pct: medians over pairs; ms/step per
# component). PAIRS, STEPS and PIN override the defaults (30, 110, off; PIN=auto or on:
# each rank pinned to a core of its own when there are two).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
out="${2:-$build/bench-results}"
mkdir -p "$out"
PYTHONPATH="$build/python" exec /usr/bin/python3 "$repo/tests/bench/python/bench_torch_overhead.py" \
  --build "$build" --out "$out" --pairs "${PAIRS:-30}" --steps "${STEPS:-110}" --pin "${PIN:-off}"
