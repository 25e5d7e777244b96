#!/usr/bin/env bash
# Labeled traces from the reference worker (real spikes from real mechanisms)
# for the detector benchmark: poisoned batches at known positions with two
# corpus seeds, a transient bit flip, and a clean run.
# Also two parametric runs from spikeguard-tracegen (spikes with grad-norm
# blow-ups and attention-logit precursors, a NaN step) when TRACEGEN is given.
# Usage: worker_traces.sh WORKER SCENARIO_DIR OUT_DIR [TRACEGEN]
set -euo pipefail
worker="$1"; scen="$2"; out="$3"; tracegen="${4:-}"
mkdir -p "$out"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

label() {  # KIND SIGNAL ONSET END -> one JSON label
  printf '{"kind":"%s","signal":"%s","onset":%d,"peak":%d,"end":%d}' "$1" "$2" "$3" "$3" "$4"
}

for seed in 7 11; do
  "$worker" corpus synth --out "$tmp/c$seed" --seed "$seed" --poison highbytes@300 \
    --poison junk@700 >/dev/null
  "$worker" train --corpus "$tmp/c$seed" --no-daemon --config "$scen/data.conf" --steps 1000 \
    --telemetry-out "$out/worker_data-s$seed.jsonl" >/dev/null 2>&1
  printf '{"trace":"worker_data-s%d","steps":1000,"labels":[%s,%s]}\n' "$seed" \
    "$(label spike loss 300 310)" "$(label spike loss 700 710)" >"$out/worker_data-s$seed.labels.json"
done

"$worker" corpus synth --out "$tmp/clean" --seed 7 >/dev/null
"$worker" train --corpus "$tmp/clean" --no-daemon --config "$scen/transient.conf" --steps 600 \
  --fault bitflip:step=400 --telemetry-out "$out/worker_transient-s7.jsonl" >/dev/null 2>&1
printf '{"trace":"worker_transient-s7","steps":600,"labels":[%s]}\n' \
  "$(label spike grad_norm 400 402)" >"$out/worker_transient-s7.labels.json"

"$worker" train --corpus "$tmp/clean" --no-daemon --config "$scen/clean.conf" \
  --telemetry-out "$out/worker_clean-s7.jsonl" >/dev/null 2>&1
printf '{"trace":"worker_clean-s7","steps":2000,"labels":[]}\n' >"$out/worker_clean-s7.labels.json"
if [[ -n "$tracegen" ]]; then
  "$tracegen" --out "$out/tracegen_spikes-s3.jsonl" --steps 5000 --layers 4 --seed 3 \
    --spike-at 1200,2600,4100 >/dev/null
  "$tracegen" --out "$out/tracegen_nan-s5.jsonl" --steps 3000 --layers 4 --seed 5 \
    --spike-at 1800 --nan-at 2500 >/dev/null
fi
echo "labeled traces in $out"
