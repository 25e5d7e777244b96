#!/usr/bin/env bash
# The demo: spikeguardd on its embedded SQLite default supervises a run of the
# reference worker on a synthetic corpus with poisoned documents at data
# position 300, in auto mode. The daemon detects the spike, rewinds the worker
# to an earlier checkpoint, replays, skips the batches around the spike,
# concludes DATA, keeps the hole, quarantines the culprit documents, verifies
# the fix and closes the incident.
# With "torch", a user's own PyTorch loop on its own dataset (no spikeguard
# corpus) under spikeguard.supervise.Supervisor
# (worker/examples/own_data/supervised.py): two torch.distributed ranks (gloo,
# CPU) launched from a launch profile; two samples of the global batch at data
# position 130 are garbage, and the daemon names exactly their documents
# (document bisect on the samples the trainer reports).
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

if [ "$TRAINER" = torch ]; then
POISON_AT=130
echo "== 1. the user's own dataset (8000 byte documents, worker/examples/own_data/common.py):"
echo "      samples 1 and 9 of the global batch at data position $POISON_AT are garbage bytes"
# Which dataset indices those samples are: the sampler's order (seed 0, batch 16).
GARBAGE="$(PYTHONPATH="$BUILD/python" /usr/bin/python3 -c "
from spikeguard.data import PlanSampler
s = PlanSampler(8000, 16, seed=0)
print(','.join(str(s.index_of($POISON_AT, j)) for j in (1, 9)))")"
{ echo "poison: $(echo "$GARBAGE" | tr ',' '\n' | sed 's/^/data:/' | tr '\n' ' ')"; echo "echo:"; } \
  | tee "$DEMO/synth.txt"
else
POISON_AT=300; SEED=7
echo "== 1. a synthetic corpus with bytes the model never saw at data position $POISON_AT"
"$WORKER" corpus synth --out "$DEMO/corpus" --seed "$SEED" --poison "highbytes@$POISON_AT" \
  --poison-echoes 2 | tee "$DEMO/synth.txt"
fi

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
  name: "own-data"
  argv: "/usr/bin/env" argv: "SPIKEGUARD_RESUME={resume}" argv: "SPIKEGUARD_PLAN={plan}"
  argv: "SPIKEGUARD_CHECKPOINT_DIR=$DEMO/ckpt" argv: "SPIKEGUARD_LINGER_S=120"
  argv: "/usr/bin/python3" argv: "$ROOT/worker/examples/own_data/supervised.py"
  argv: "--threads=1" argv: "{args}"
  env_allow: "PATH" env_allow: "HOME"
  env { key: "PYTHONPATH" value: "$BUILD/python" }
  checkpoint_root: "$DEMO"
  max_world_size: 4
  param { name: "args" flags { allow: "steps" allow: "garbage" } default_value: "" }
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
if [ "$TRAINER" = torch ]; then
# This small model undoes a garbage batch at its next step (a blip under the
# default policy): here every excursion opens an incident.
cat > "$DEMO/policy.textproto" <<'PB'
loss_spike { blip_steps: 0 }
probe { min_steps_before_onset: 50 max_steps_before_onset: 500 replay_steps_past_onset: 5
        skip_before: 2 skip_after: 2 skip_horizon: 100 max_document_probes: 24 }
budget { max_probes: 48 max_reexecuted_steps: 20000 }
fix { verify_steps: 100 }
PB
else
cat > "$DEMO/policy.textproto" <<'PB'
probe { min_steps_before_onset: 50 max_steps_before_onset: 500 replay_steps_past_onset: 5
        skip_before: 2 skip_after: 2 skip_horizon: 100 bisect: true }
fix { verify_steps: 100 }
PB
fi
"${SPIKECTL[@]}" policy set --file "$DEMO/policy.textproto" >/dev/null

if [ "$TRAINER" = torch ]; then
echo "== 4. spikectl runs create demo --world-size=2 --mode=auto --spec=... (the daemon launches"
echo "      two ranks of worker/examples/own_data/supervised.py, the user's loop plus the"
echo "      lines spikeguard.supervise.Supervisor needs, with torch.distributed's environment)"
cat > "$DEMO/spec.textproto" <<PB
profile: "own-data"
params { key: "args" value: "--steps=240 --garbage=$GARBAGE" }
restart_all_ranks: true
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
[ "$TRAINER" = torch ] || echo "Its near-copies later in the corpus: $(grep '^echo' "$DEMO/synth.txt")"
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
