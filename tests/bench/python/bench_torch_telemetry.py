#!/usr/bin/python3
"""Step time of the torch_gpt example with spikeguard.torch telemetry on vs
off (target: <= 3 % on CPU). Prints figures; fails only when it
cannot run.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/python/bench_torch_telemetry.py \
        [--steps 30] [--rounds 6] [--threads 1] [--out build/bench-results]

One process, the example's default shape (4 layers, width 128, 4 heads,
context 64, batch 16), fp32, AdamW, deterministic algorithms. The two modes
alternate step by step on the same model, so the load of a shared machine
hits both; the overhead is the median of the paired differences (on - off)
over the median off step, beside each mode's median step time.
"on" is everything a trainer calls per step: forward hooks (residual RMS),
exact max attention logits, logits' log-sum-exp, per-token/domain losses,
the pre-clip grad norm with per-layer norms and clipping, the update ratio
(weights before/after the optimizer step) and building the StepReport.
"off" computes the loss and clips with torch.nn.utils.clip_grad_norm_ only.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "worker", "examples", "torch_gpt"))
from model import GPT, GPTConfig, token_losses  # noqa: E402
from spikeguard.torch import Telemetry  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    tel = Telemetry(model, domain_names=["a", "b", "c"])
    tel_on = True
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 128, (a.batch, cfg.context + 1), generator=g) for _ in range(8)]
    domains = torch.arange(a.batch) % 3
    parts = {"telemetry calls": 0.0}

    def step(i, on):
        x = data[i % len(data)]
        inp, tgt = x[:, :-1], x[:, 1:]
        t0 = time.perf_counter()
        spent = 0.0
        if on:
            s = time.perf_counter(); tel.before_step(); spent += time.perf_counter() - s
        logits = model(inp)
        ce, obj = token_losses(logits, tgt)
        if on:
            s = time.perf_counter(); tel.logits(logits); tel.losses(ce, domains)
            spent += time.perf_counter() - s
        loss = obj.mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if on:
            s = time.perf_counter(); tel.after_backward(1.0); tel.before_optimizer_step()
            spent += time.perf_counter() - s
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if on:
            s = time.perf_counter(); tel.after_optimizer_step(); tel.report(i, i, 1e-3)
            spent += time.perf_counter() - s
        else:
            float(loss)
        dt = time.perf_counter() - t0
        return dt, spent

    # Telemetry off must not pay for hooks either: close() removes them.
    def set_mode(on):
        nonlocal tel
        if on and tel is None:
            tel = Telemetry(model, domain_names=["a", "b", "c"])
        if not on and tel is not None:
            tel.close()
            tel = None

    for i in range(6):  # warm-up
        set_mode(i % 2 == 0)
        step(i, i % 2 == 0)
    # Steps alternate on/off one by one (the order flips every pair), so the
    # load of a shared machine hits both; the overhead is the median of the
    # paired differences.
    times = {True: [], False: []}
    diffs = []
    spent_on = []
    k = 0
    for r in range(a.rounds * a.steps):
        pair = {}
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            set_mode(on)
            dt, spent = step(k, on)
            k += 1
            times[on].append(dt)
            pair[on] = dt
            if on:
                spent_on.append(spent)
        diffs.append(pair[True] - pair[False])
    on_ms = statistics.median(times[True]) * 1e3
    off_ms = statistics.median(times[False]) * 1e3
    tel_ms = statistics.median(spent_on) * 1e3
    ratio = 1.0 + statistics.median(diffs) * 1e3 / off_ms
    lines = [
        "| mode | median step ms | steps |",
        "| --- | --- | --- |",
        f"| telemetry off | {off_ms:.2f} | {len(times[False])} |",
        f"| telemetry on | {on_ms:.2f} | {len(times[True])} |",
        "",
        f"overhead (median of paired on-off differences): {(ratio - 1) * 100:+.2f} %; time inside the "
        f"telemetry calls: {tel_ms:.2f} ms/step ({tel_ms / off_ms * 100:.2f} % of an off step); "
        f"threads {a.threads}, batch {a.batch}x{cfg.context}, model {cfg.fingerprint()}",
    ]
    print("\n".join(lines))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "torch_telemetry.md"), "w") as f:
            f.write("# spikeguard.torch telemetry overhead (torch_gpt, CPU)\n\n" + "\n".join(lines) + "\n")
        with open(os.path.join(a.out, "torch_telemetry.json"), "w") as f:
            json.dump({"on_ms": on_ms, "off_ms": off_ms, "ratio": ratio, "telemetry_calls_ms": tel_ms,
                       "threads": a.threads, "batch": a.batch, "model": cfg.fingerprint()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
