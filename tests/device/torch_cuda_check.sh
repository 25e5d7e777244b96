#!/usr/bin/env bash
# torch_cuda_check.sh [PYTHONPATH_DIR] — on a machine with a GPU and a
# PyTorch with CUDA: runs worker/examples/own_data/supervised.py (world size
# 1) on the CPU with gloo and on cuda:0 with NCCL, no daemon, and compares
# their telemetry step by step (spikeguard.supervise's JSON lines): every
# field present in both, losses within 2 % (different kernels), update
# ratios and norms finite, one host transfer per step. Prints the table and
# exits non-zero when the CUDA run fails or disagrees.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
pyroot="${1:-$repo/build/python}"
py="${PYTHON:-python3}"
out="$(mktemp -d)"
steps="${STEPS:-30}"
run() {  # DEVICE BACKEND
  env CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONPATH="$pyroot" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$((20000 + RANDOM % 20000))" SPIKEGUARD_TELEMETRY_JSONL="$out/$1.jsonl" \
    "$py" "$repo/worker/examples/own_data/supervised.py" --steps="$steps" --documents=2000 \
    --device="$1" --backend="$2"
}
"$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
run cpu gloo
run cuda nccl
"$py" - "$out/cpu.jsonl.rank0" "$out/cuda.jsonl.rank0" <<'PY'
import json, math, sys
cpu = [json.loads(l) for l in open(sys.argv[1])]
gpu = [json.loads(l) for l in open(sys.argv[2])]
assert len(cpu) == len(gpu) > 0, (len(cpu), len(gpu))
worst = 0.0
print(f"{'step':>4} {'loss cpu':>10} {'loss cuda':>10} {'grad_norm cpu':>14} {'grad_norm cuda':>14}")
for a, b in zip(cpu, gpu):
    assert set(a) == set(b), set(a) ^ set(b)
    rel = abs(a["loss"] - b["loss"]) / max(1e-9, abs(a["loss"]))
    worst = max(worst, rel)
    for l in b["layers"]:
        assert all(math.isfinite(float(l[k])) for k in ("grad_norm", "update_ratio", "param_norm", "act_rms"))
    print(f"{a['step']:>4} {a['loss']:>10.5f} {b['loss']:>10.5f} {a['grad_norm']:>14.5f} {b['grad_norm']:>14.5f}")
print(f"worst relative loss difference {100 * worst:.3f} %")
assert worst < 0.02, worst
print("CUDA telemetry agrees with the CPU run")
PY
