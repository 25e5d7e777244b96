#!/usr/bin/env bash
# The demo: spikeguardd on its embedded SQLite default, a synthetic 4-rank run
# with a loss spike streamed into it, and what spikectl shows of it.
# Usage: deploy/demo.sh [BUILD_DIR]
set -euo pipefail
BUILD="${1:-build}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BIN="$BUILD"
DATA="$(mktemp -d "${TMPDIR:-/tmp}/spikeguard-demo-XXXXXX")"
PORT_FILE="$DATA/port"

cleanup() {
  if [ -n "${DAEMON_PID:-}" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" || true
  fi
}
trap cleanup EXIT

echo "== starting spikeguardd (catalog: $DATA/catalog.db)"
"$BIN/daemon/spikeguardd" --listen=127.0.0.1:0 --data-dir="$DATA" --port-file="$PORT_FILE" \
  2>"$DATA/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 1 250); do [ -s "$PORT_FILE" ] && break; sleep 0.02; done
[ -s "$PORT_FILE" ] || { cat "$DATA/daemon.log"; echo "spikeguardd did not start"; exit 1; }
ADDR="127.0.0.1:$(cat "$PORT_FILE")"
SPIKECTL=("$BIN/cli/spikectl" "--addr=$ADDR")

echo "== spikectl runs create demo --world-size=4"
"${SPIKECTL[@]}" runs create demo --world-size=4

echo "== streaming a synthetic run: 4 ranks x 1500 steps, a loss spike at step 1200"
"$BIN/worker/tracegen/spikeguard-tracegen" --addr="$ADDR" --run=demo --ranks=4 --steps=1500 \
  --layers=4 --seed=7 --spike-at=1200 --checkpoint-every=250

echo "== spikectl status"
"${SPIKECTL[@]}" status
echo "== spikectl runs show demo"
"${SPIKECTL[@]}" runs show demo
echo "== spikectl checkpoints list --run demo"
"${SPIKECTL[@]}" checkpoints list --run demo
echo "== spikectl telemetry --run demo --from 1190 --to 1215 (the spike and its precursors)"
"${SPIKECTL[@]}" telemetry --run demo --from 1190 --to 1215 --metrics loss,grad_norm,clipped,max_attn_logit,lse_max
echo
echo "Query it yourself while a daemon runs, e.g.:"
echo "  $BIN/cli/spikectl --addr=$ADDR --output=json telemetry --run demo --from 1195 --to 1205"
echo "(this demo's daemon stops now; its catalog stays in $DATA)"
