#!/usr/bin/env bash
# Regenerates the reference-worker traces in this directory (detector_bench
# scores them as the "workers" split by default). Takes ~8 minutes on 2 CPU
# cores; the outputs are deterministic up to the trainers' floating point.
#
#   tests/testdata/detect_traces/make_traces.sh BUILD_DIR
#
# C++ reference worker (tests/bench/detect/worker_traces.sh): poisoned
# batches at 300 and 700 (corpus seeds 7, 11), a bit flip at 400, a clean
# run (its first 1000 steps kept). PyTorch trainer (worker/examples/torch_gpt,
# python3-torch 1.13 on CPU, one process, --no-daemon --telemetry-out): a
# highbytes poison at 160 (seed 23, 300 steps), a junk poison at 220 (seed
# 31, 300 steps), and the e2e fragility settings (lr 2e-2, warmup 50, seed 7,
# 400 steps: grad-norm blow-ups at 245 and 313, the second followed by a
# +12 % loss rise that holds ~30 steps, attention logits past 1e4). Each
# trace is shrunk by compact.py to the fields the detectors read.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
build="$(cd "${1:-$repo/build}" && pwd)"
worker="$build/worker/spikeguard-worker"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$repo/tests/bench/detect/worker_traces.sh" "$worker" "$repo/tests/e2e/scenarios" "$tmp/cpp"
for f in "$tmp"/cpp/*.jsonl; do
  n="$(basename "$f" .jsonl)"
  /usr/bin/python3 "$here/compact.py" "$f" "$here/$n.jsonl"
  cp "$tmp/cpp/$n.labels.json" "$here/$n.labels.json"
done
head -1000 "$here/worker_clean-s7.jsonl" >"$tmp/clean" && mv "$tmp/clean" "$here/worker_clean-s7.jsonl"
printf '{"trace":"worker_clean-s7","steps":1000,"labels":[]}\n' >"$here/worker_clean-s7.labels.json"

torch_run() {  # NAME CORPUS_SEED STEPS [POISON] -- [TRAIN ARGS...]
  local name="$1" seed="$2" steps="$3" poison="$4"
  shift 5
  local synth=("$worker" corpus synth --out "$tmp/c-$name" --seed "$seed")
  [[ -n "$poison" ]] && synth+=(--poison "$poison")
  "${synth[@]}" >/dev/null
  PYTHONPATH="$build/python" /usr/bin/python3 "$repo/worker/examples/torch_gpt/train.py" \
    --corpus "$tmp/c-$name" --no-daemon --telemetry-out "$tmp/$name.jsonl" --steps "$steps" \
    --threads 1 "$@" >/dev/null 2>&1
  /usr/bin/python3 "$here/compact.py" "$tmp/$name.jsonl" "$here/$name.jsonl"
}
label() {  # KIND SIGNAL ONSET PEAK END -> one JSON label
  printf '{"kind":"%s","signal":"%s","onset":%d,"peak":%d,"end":%d}' "$@"
}
torch_run torch_data-s23 23 300 highbytes@160 --
printf '{"trace":"torch_data-s23","steps":300,"labels":[%s]}\n' \
  "$(label spike loss 160 160 163)" >"$here/torch_data-s23.labels.json"
torch_run torch_data-s31 31 300 junk@220 --
printf '{"trace":"torch_data-s31","steps":300,"labels":[%s]}\n' \
  "$(label spike loss 220 220 223)" >"$here/torch_data-s31.labels.json"
torch_run torch_fragile-s7 7 400 "" -- --lr 2e-2 --warmup 50 --beta2 0.999
printf '{"trace":"torch_fragile-s7","steps":400,"labels":[%s,%s]}\n' \
  "$(label spike grad_norm 245 245 249)" "$(label spike loss 313 318 340)" \
  >"$here/torch_fragile-s7.labels.json"
echo "traces in $here"
