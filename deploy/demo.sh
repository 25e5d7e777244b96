#!/usr/bin/env bash
# The demo: spikeguardd on its embedded SQLite default supervises a run of the
# reference worker on a synthetic corpus with poisoned documents at data
# position 300, in auto mode. The daemon detects the spike, rewinds the worker
# to an earlier checkpoint, replays, skips the batches around the spike,
# concludes DATA, keeps the hole, quarantines the culprit documents, verifies
# the fix and closes the incident.
# With "torch", the same incident with the PyTorch trainer
# (worker/examples/torch_gpt): two torch.distributed ranks (gloo, CPU) that
# report through the Python client, poisoned batch at data position 160.
# Usage: deploy/demo.sh [BUILD_DIR] [cpp|torch]
set -euo pipefail
BUILD="${1:-build}"
TRAINER="${2:-cpp}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD="$(cd "$BUILD" && pwd)"
DEMO="$(mktemp -d "${TMPDIR:-/tmp}/spikeguard-demo-XXXXXX")"
DATA="$DEMO/data"
PORT_FILE="$DEMO/port"
WORKER="$BUILD/worker/spikeguard-worker"

cleanup() {
  if [ -n "${WATCH_PID:-}" ]; then kill "$WATCH_PID" 2>/dev/null || true; fi
  if [ -n "${DAEMON_PID:-}" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT

if [ "$TRAINER" = torch ]; then POISON_AT=160; SEED=23; else POISON_AT=300; SEED=7; fi
echo "== 1. a synthetic corpus with bytes the model never saw at data position $POISON_AT"
"$WORKER" corpus synth --out "$DEMO/corpus" --seed "$SEED" --poison "highbytes@$POISON_AT" \
  --poison-echoes 2 | tee "$DEMO/synth.txt"

echo "== 2. spikeguardd on the embedded SQLite catalog ($DATA/catalog.db), over TLS, with tokens"
# A throwaway CA and the daemon's certificate; the daemon makes its tokens file
# and an admin token ($DATA/admin.token) on first start. The workers it
# launches get a token of their own run and the CA from their environment.
"$ROOT/tests/testdata/make_test_certs.sh" "$DEMO/tls"
# The launch profiles: the only command lines the daemon runs (a run spec
# names a profile and gives its parameters; nothing sent over the wire is
# executed). Checkpoints and corpora are confined to the demo's directory.
cat > "$DEMO/profiles.textproto" <<PB
profile {
  name: "ref-worker"
  argv: "$WORKER" argv: "train" argv: "--corpus={corpus_dir}"
  argv: "--checkpoint-dir=$DEMO/ckpt-{rank}" argv: "--config=$ROOT/tests/e2e/scenarios/{scenario}.conf"
  argv: "--addr={addr}" argv: "--run={run}" argv: "--rank={rank}" argv: "--world-size={world_size}"
  argv: "--generation={generation}" argv: "--resume={resume}" argv: "--plan={plan}"
  argv: "--linger-s=120" argv: "{args}"
  env_allow: "PATH"
  checkpoint_root: "$DEMO"
  corpus_root: "$DEMO"
  max_world_size: 8
  max_restarts: 3
  param { name: "scenario" enum { value: "data" value: "small" value: "numerics" } }
  param { name: "args" flags { allow: "steps" allow: "set" } default_value: "" }
}
profile {
  name: "torch-gpt"
  argv: "/usr/bin/python3" argv: "$ROOT/worker/examples/torch_gpt/train.py"
  argv: "--corpus={corpus_dir}" argv: "--checkpoint-dir=$DEMO/ckpt"
  argv: "--addr={addr}" argv: "--run={run}" argv: "--generation={generation}"
  argv: "--resume={resume}" argv: "--plan={plan}" argv: "--linger-s=120" argv: "{args}"
  env_allow: "PATH" env_allow: "HOME"
  env { key: "PYTHONPATH" value: "$BUILD/python" }
  checkpoint_root: "$DEMO"
  corpus_root: "$DEMO"
  max_world_size: 4
  param { name: "args" flags { allow: "steps" allow: "checkpoint-every" } default_value: "" }
}
PB
"$BUILD/daemon/spikeguardd" --listen=127.0.0.1:0 --data-dir="$DATA" --port-file="$PORT_FILE" \
  --tls-cert="$DEMO/tls/server.pem" --tls-key="$DEMO/tls/server.key" \
  --worker-tls-ca="$DEMO/tls/ca.pem" --launch-profiles="$DEMO/profiles.textproto" \
  2>"$DEMO/daemon.log" &
DAEMON_PID=$!
for _ in $(seq 1 250); do [ -s "$PORT_FILE" ] && break; sleep 0.02; done
[ -s "$PORT_FILE" ] || { cat "$DEMO/daemon.log"; echo "spikeguardd did not start"; exit 1; }
ADDR="127.0.0.1:$(cat "$PORT_FILE")"
SECURE=("--token-file=$DATA/admin.token" "--tls-ca=$DEMO/tls/ca.pem")
SPIKECTL=("$BUILD/cli/spikectl" "--addr=$ADDR" "${SECURE[@]}")

echo "== 3. policy: probe horizons sized for a small demo run; bisect the skip window to the culprit batch"
cat > "$DEMO/policy.textproto" <<'PB'
probe { min_steps_before_onset: 50 max_steps_before_onset: 500 replay_steps_past_onset: 5
        skip_before: 2 skip_after: 2 skip_horizon: 100 bisect: true }
fix { verify_steps: 100 }
PB
"${SPIKECTL[@]}" policy set --file "$DEMO/policy.textproto" >/dev/null

if [ "$TRAINER" = torch ]; then
echo "== 4. spikectl runs create demo --world-size=2 --mode=auto --spec=... (the daemon launches"
echo "      two ranks of worker/examples/torch_gpt/train.py with torch.distributed's environment)"
cat > "$DEMO/spec.textproto" <<PB
profile: "torch-gpt"
params { key: "args" value: "--steps=300 --checkpoint-every=50" }
restart_all_ranks: true
manifest { corpus_dir: "$DEMO/corpus" }
PB
"${SPIKECTL[@]}" runs create demo --world-size=2 --mode=auto --spec="$DEMO/spec.textproto"
else
echo "== 4. spikectl runs create demo --mode=auto --spec=... (the daemon launches the worker from"
echo "      its launch profile \"ref-worker\")"
cat > "$DEMO/spec.textproto" <<PB
profile: "ref-worker"
params { key: "scenario" value: "data" }
params { key: "args" value: "--steps=600" }
manifest { corpus_dir: "$DEMO/corpus" }
PB
"${SPIKECTL[@]}" runs create demo --world-size=1 --mode=auto --spec="$DEMO/spec.textproto"
fi

echo "== 5. the incident as it progresses (spikectl incidents watch --run demo)"
"${SPIKECTL[@]}" incidents watch --run demo &
WATCH_PID=$!

ID=""
for _ in $(seq 1 1200); do
  STATE="$("${SPIKECTL[@]}" --output=json incidents list --run demo 2>/dev/null || true)"
  if echo "$STATE" | grep -q '"CLOSED"\|"ABORTED"'; then
    ID="$(echo "$STATE" | grep -o '"id": *"[0-9]*"' | head -1 | grep -o '[0-9]\+')"
    break
  fi
  sleep 0.5
done
sleep 0.5
kill "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
if [ -z "$ID" ]; then
  echo "demo: the incident did not close in time; daemon log: $DEMO/daemon.log"
  "${SPIKECTL[@]}" incidents list --run demo || true
  exit 1
fi

echo
echo "== 6. spikectl incidents show $ID"
"${SPIKECTL[@]}" incidents show "$ID"
echo
echo "== 7. spikectl quarantine list --run demo"
"${SPIKECTL[@]}" quarantine list --run demo
echo
echo "Placed poison (from step 1): $(grep '^poison' "$DEMO/synth.txt")"
echo "Its near-copies later in the corpus: $(grep '^echo' "$DEMO/synth.txt")"
PLACED="$(grep '^poison' "$DEMO/synth.txt" | cut -d: -f2- | tr ' ' '\n' | grep . | sort | tr '\n' ' ')"
QUARANTINED="$("${SPIKECTL[@]}" --output=json quarantine list --run demo \
  | tr -d ' \n' | grep -o '"domain":"[a-z]*","document_id":"[0-9]*"' \
  | sed 's/"domain":"\([a-z]*\)","document_id":"\([0-9]*\)"/\1:\2/' | sort -u | tr '\n' ' ')"
if [ "$PLACED" = "$QUARANTINED" ]; then
  echo "Quarantined exactly the poison's documents: $QUARANTINED"
else
  echo "demo: quarantined [$QUARANTINED] but the poison is [$PLACED]"
  exit 1
fi
echo
echo "== 8. spikectl audit --run demo --limit 8 (who did what: the operator's calls, the daemon's rewinds)"
"${SPIKECTL[@]}" audit --run demo --limit 8
echo
echo "While a daemon runs, query it with spikectl, e.g.:"
echo "  $BUILD/cli/spikectl --addr=$ADDR ${SECURE[*]} incidents list"
echo "  $BUILD/cli/spikectl --addr=$ADDR ${SECURE[*]} --output=json incidents show $ID"
echo "  $BUILD/cli/spikectl --addr=$ADDR ${SECURE[*]} telemetry --run demo --gen 0 --from $((POISON_AT - 5)) --to $((POISON_AT + 5))"
echo "(this demo's daemon stops now; its catalog stays in $DATA/catalog.db)"
