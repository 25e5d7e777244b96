#!/usr/bin/python3
"""What supervising a PyTorch loop costs: worker/examples/own_data/plain.py
against supervised.py (the same loop under spikeguard.supervise.Supervisor,
reporting to a real spikeguardd), both on 2 gloo ranks, in alternating pairs
(plain first in even pairs, supervised first in odd ones) so the load of a
shared machine hits both. The pairs are many and short (30 of 110 steps, each
run timed after its first 10 steps): this machine's pace drifts by 10-20 %
over minutes, so the medians of many adjacent pairs are steadier than a few
long runs. Both loops save a checkpoint every 50 steps (plain.py on rank 0
with torch.save on its training thread, as an ordinary loop does; the
Supervisor its own, which it registers), so what is compared is the cost of
supervising a loop that checkpoints. More measurements follow: the
same loops alternating in blocks inside one 2-rank job (interleaved), once
under the daemon and once without one (what the client and the daemon
cost these cores, by difference), and spikeguard's fixed cost per step in
one process with the model at a negligible size (torch_fixed_cost.py,
without and with a daemon), which this machine's drift cannot hide. Prints
figures and writes OUT/torch_overhead.json:
plain_steps_per_s, supervised_steps_per_s and overhead_pct (medians over the
pairs; overhead from each pair's ratio), and the supervised ranks' ms/step
per spikeguard component (Supervisor.timings(), rank 0, median over pairs).
Fails only when it cannot run.

    PYTHONPATH=build/python /usr/bin/python3 tests/bench/python/bench_torch_overhead.py \
        --build build --out build/bench-results [--pairs 30] [--steps 110] [--pin auto|on|off]
"""
import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "worker" / "examples" / "own_data"
# The example's defaults: a checkpoint every 50 steps (--checkpoint-every),
# its pace timed after the first 10 steps (common.Timer).
CHECKPOINT_EVERY = 50
WARMUP_STEPS = 10
# The steps around a checkpoint whose wall time is its cost: this many
# before it and after it (checkpoint_excess_ms).
CHECKPOINT_WINDOW = (3, 7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_interval(values: list, level: float = 0.9, resamples: int = 4000) -> list:
    """[low, high]: the bootstrap interval of the median of `values` at
    `level` (percentile method, a fixed seed, so the same values give the
    same interval): how far the median of this many pairs can move on this
    machine's noise alone."""
    if len(values) < 2:
        return [values[0], values[0]] if values else [float("nan")] * 2
    rng = random.Random(0)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return [medians[int(tail * (resamples - 1))], medians[int((1.0 - tail) * (resamples - 1))]]


def start_daemon(build: Path, tmp: Path):
    exe = build / "daemon" / "spikeguardd"
    port_file = tmp / "port"
    addr = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([str(exe), f"--listen={addr}", f"--data-dir={tmp / 'data'}",
                             f"--port-file={port_file}", "--allow_anonymous"],
                            stdout=open(tmp / "daemon.out", "wb"),
                            stderr=open(tmp / "daemon.err", "wb"), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"spikeguardd did not start:\n{(tmp / 'daemon.err').read_text()}")
        time.sleep(0.05)
    return proc, addr


def spikectl(build: Path, addr: str, *args):
    subprocess.run([str(build / "cli" / "spikectl"), f"--addr={addr}", *args], check=True,
                   capture_output=True, text=True, timeout=60)


def launch_ranks(argv: list, threads: int, env_extra: dict, cpus: list) -> list:
    """Runs argv as ranks 0 and 1 of a 2-rank gloo job; returns their
    (returncode, output)."""
    port = free_port()
    procs = []
    for r in range(2):
        # Pinned: rank r's threads (the trainer's, gloo's and, supervised,
        # the client's) share core cpus[r], so what the client costs is
        # taken from its own rank and the scheduler does not stack both
        # ranks on one core; the daemon is not pinned.
        pin = (lambda c=cpus[r]: os.sched_setaffinity(0, {c})) if cpus else None
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads))
        env.update(env_extra)
        procs.append(subprocess.Popen([sys.executable, *argv, f"--threads={threads}"], env=env,
                                      text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, preexec_fn=pin))
    outs = [p.communicate(timeout=3600)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def run_pair_member(script: str, steps: int, threads: int, env_extra: dict,
                    cpus: list, extra_args: tuple = ()):
    """One run of a loop on 2 ranks: (steps/s of the slower rank, both
    ranks' CPU ms per step, rank 0's wall ms of each step)."""
    rates, cpu, step_ms = [], 0.0, []
    env = dict(env_extra, EXAMPLE_STEP_TIMES="1")
    for code, out in launch_ranks([str(EXAMPLE / script), f"--steps={steps}", *extra_args],
                                  threads, env, cpus):
        m = re.search(r"([0-9.]+) steps/s", out)
        if code != 0 or not m:
            raise SystemExit(f"{script} failed ({code}):\n{out[-3000:]}")
        rates.append(float(m.group(1)))
        c = re.search(r"([0-9.]+) cpu ms/step", out)
        cpu += float(c.group(1)) if c else float("nan")
        t = re.search(r"^step ms: (.*)$", out, re.MULTILINE)
        if t and not step_ms:  # rank 0's (the ranks step together through DDP)
            step_ms = [float(x) for x in t.group(1).split()]
    # The pair of ranks runs at the slower one's pace; CPU: both ranks'
    # processes (all their threads) over the training loop, per step.
    return min(rates), cpu, step_ms


def checkpoint_excess_ms(step_ms: list, every: int, warmup: int,
                         window: tuple = CHECKPOINT_WINDOW) -> list:
    """For each checkpoint (saved at the end of step every*k - 1) whose
    window of steps fits in the run after the warm-up: the wall time the
    steps from window[0] steps before it to window[1] after took beyond
    the run's median step. What a checkpoint costs the loop in wall time,
    wherever it is paid (the training thread, the writer's thread, the other
    rank waiting)."""
    if len(step_ms) <= warmup:
        return []
    before, after = window
    median = statistics.median(step_ms[warmup:])
    out = []
    for c in range(every, len(step_ms), every):
        lo, hi = c - before, c + after
        if lo >= warmup and hi <= len(step_ms):
            out.append(sum(d - median for d in step_ms[lo:hi]))
    return out


def run_interleaved(build: Path, addr: Optional[str], tmp: Path, pairs: int, block_steps: int,
                    threads: int, cpus: list) -> dict:
    """torch_overhead_interleaved.py on 2 gloo ranks: the plain and the
    supervised loop alternating in blocks within one job, under the daemon
    at `addr` (None: the Supervisor without a daemon, its checkpoints
    written and retained but registered nowhere)."""
    if addr is not None:
        run = "interleaved"
        spikectl(build, addr, "runs", "create", run, "--world-size=2", "--mode=observe")
        env = {"SPIKEGUARD_ADDR": addr, "SPIKEGUARD_RUN": run,
               "SPIKEGUARD_CHECKPOINT_DIR": str(tmp / "data" / "runs" / run / "checkpoints")}
    else:
        env = {"SPIKEGUARD_CHECKPOINT_DIR": str(tmp / "interleaved-without-daemon")}
    argv = [str(Path(__file__).with_name("torch_overhead_interleaved.py")), f"--pairs={pairs}",
            f"--block-steps={block_steps}", f"--checkpoint-dir={tmp / 'plain-checkpoints'}"]
    got = []
    for code, out in launch_ranks(argv, threads, env, cpus):
        lines = [l for l in out.splitlines() if l.startswith("{")]
        if code != 0 or not lines:
            raise SystemExit(f"the interleaved run failed ({code}):\n{out[-3000:]}")
        got.append(json.loads(lines[-1]))
    rank0 = next(g for g in got if g["rank"] == 0)
    shutil.rmtree(tmp / "plain-checkpoints", ignore_errors=True)
    blocks = rank0["pairs"]
    plain_s = [p["plain"] for p in blocks]
    sup_s = [p["supervised"] for p in blocks]
    overheads = [100.0 * (s / p - 1.0) for p, s in zip(plain_s, sup_s)]

    def against(dropped):  # the median overhead against the plain blocks less those calls
        return statistics.median(100.0 * (p["supervised"] / (p["plain"] - sum(p[k] for k in dropped))
                                          - 1.0) for p in blocks)
    return {
        "pairs": pairs, "block_steps": block_steps,
        "plain_steps_per_s": 1.0 / statistics.median(plain_s),
        "supervised_steps_per_s": 1.0 / statistics.median(sup_s),
        "overhead_pct": statistics.median(overheads),
        "overhead_pct_quartiles": statistics.quantiles(overheads, n=4),
        "overhead_pct_ci90": median_interval(overheads),
        "overhead_pct_per_pair": overheads,
        "component_ms_per_step": rank0["timings"],
        # In the plain blocks: clip_grad_norm_, which the supervised loop's
        # telemetry_optimizer (gradient norms and clipping) replaces, and
        # the checkpoint saves (rank 0), which the Supervisor's replace.
        "plain_clip_ms_per_step": rank0["plain_clip_ms_per_step"],
        "plain_checkpoint_ms_per_step": rank0["plain_checkpoint_ms_per_step"],
        # Of the supervised blocks' time: their settling at the end (the
        # reports delivered to the daemon, the checkpoint written).
        "supervised_settle_ms_per_step": 1000.0 * statistics.median(
            p["supervised_settle"] for p in blocks),
        # The same pairs against a plain loop without those calls (its
        # block time less what they took): what supervising costs a loop
        # that neither checkpoints nor clips.
        "overhead_pct_against_plain_without_checkpoints": against(["plain_checkpoint"]),
        "overhead_pct_against_plain_without_checkpoints_or_clipping":
            against(["plain_checkpoint", "plain_clip"]),
    }


def run_fixed_cost(build: Path, addr: str, pairs: int) -> dict:
    """torch_fixed_cost.py in one process, without a daemon and with one
    (a world-size-1 run): spikeguard's cost per step beyond the model's
    arithmetic."""
    script = str(Path(__file__).with_name("torch_fixed_cost.py"))
    got = {}
    for name, env in (("without_daemon", {}),
                      ("with_daemon", {"SPIKEGUARD_ADDR": addr, "SPIKEGUARD_RUN": "fixed-cost"})):
        if env:
            spikectl(build, addr, "runs", "create", "fixed-cost", "--world-size=1",
                     "--mode=observe")
        # One process, no checkpoints, and a daemon only where named.
        full = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "SPIKEGUARD_ADDR", "SPIKEGUARD_RUN",
                             "SPIKEGUARD_CHECKPOINT_DIR")}
        full.update(OMP_NUM_THREADS="1", **env)
        proc = subprocess.run([sys.executable, script, f"--pairs={pairs}"], env=full, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"torch_fixed_cost.py failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}")
        got[name] = json.loads(lines[-1])
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--interleaved-pairs", type=int, default=40,
                    help="block pairs of the interleaved measurement (fewer than 2: skip it)")
    ap.add_argument("--block-steps", type=int, default=25)
    ap.add_argument("--fixed-cost-pairs", type=int, default=30,
                    help="block pairs of the fixed-cost measurement (fewer than 2: skip it)")
    ap.add_argument("--pin", choices=["auto", "on", "off"], default="off",
                    help="pin rank r to the r-th core this process may use (auto: when "
                         "there are at least as many cores as ranks x threads)")
    args = ap.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    pin = args.pin == "on" or (args.pin == "auto" and args.threads == 1 and len(allowed) >= 2)
    cpus = allowed[:2] if pin else []
    build = Path(args.build).resolve()
    out = Path(args.out or build / "bench-results")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sg-torch-overhead-"))
    daemon, addr = start_daemon(build, tmp)
    plain, supervised, components = [], [], []
    plain_cpu, supervised_cpu = [], []
    excess = {"plain": [], "supervised": []}
    measured = False
    try:
        for i in range(args.pairs):
            run = f"bench{i}"
            spikectl(build, addr, "runs", "create", run, "--world-size=2", "--mode=observe")
            timings = tmp / f"timings{i}"
            sup_env = {"SPIKEGUARD_ADDR": addr, "SPIKEGUARD_RUN": run,
                       "SPIKEGUARD_TIMINGS_OUT": str(timings),
                       # Under the run's checkpoint root, where the daemon
                       # accepts their registration.
                       "SPIKEGUARD_CHECKPOINT_DIR": str(tmp / "data" / "runs" / run / "checkpoints")}
            order = ["plain", "supervised"] if i % 2 == 0 else ["supervised", "plain"]
            got, cpu = {}, {}
            for which in order:
                if which == "plain":
                    # Its checkpoints at the Supervisor's cadence (plain.py's
                    # default, every 50 steps), into a directory of its own.
                    saves = tmp / f"plain-checkpoints{i}"
                    got[which], cpu[which], step_ms = run_pair_member(
                        "plain.py", args.steps, args.threads, {}, cpus,
                        (f"--checkpoint-dir={saves}",))
                    shutil.rmtree(saves, ignore_errors=True)
                else:
                    got[which], cpu[which], step_ms = run_pair_member(
                        "supervised.py", args.steps, args.threads, sup_env, cpus)
                excess[which] += checkpoint_excess_ms(step_ms, CHECKPOINT_EVERY, WARMUP_STEPS)
            plain.append(got["plain"])
            supervised.append(got["supervised"])
            plain_cpu.append(cpu["plain"])
            supervised_cpu.append(cpu["supervised"])
            components.append(json.loads(Path(f"{timings}.rank0.json").read_text())["ms_per_step"])
            print(f"pair {i}: plain {got['plain']:.2f} steps/s, supervised "
                  f"{got['supervised']:.2f} steps/s; CPU ms/step plain {cpu['plain']:.1f}, "
                  f"supervised {cpu['supervised']:.1f}", flush=True)
        interleaved = (run_interleaved(build, addr, tmp, args.interleaved_pairs,
                                       args.block_steps, args.threads, cpus)
                       if args.interleaved_pairs > 1 else None)
        # The same without a daemon: what the client and the daemon's
        # share of these cores cost, by difference.
        interleaved_alone = (run_interleaved(build, None, tmp, args.interleaved_pairs,
                                             args.block_steps, args.threads, cpus)
                             if args.interleaved_pairs > 1 else None)
        fixed = (run_fixed_cost(build, addr, args.fixed_cost_pairs)
                 if args.fixed_cost_pairs > 1 else None)
        measured = True
    finally:
        daemon.terminate()
        daemon.wait(30)
        # The daemon's data directory holds every run's checkpoints (some
        # 350 MB): removed once measured, kept to look into otherwise.
        if measured:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"the daemon's directory is kept: {tmp}", file=sys.stderr)
    overheads = [100.0 * (p / s - 1.0) for p, s in zip(plain, supervised)]
    result = {
        "pairs": args.pairs, "steps": args.steps, "world_size": 2, "backend": "gloo",
        "threads_per_rank": args.threads, "ranks_pinned_to_cpus": cpus,
        "plain_steps_per_s": statistics.median(plain),
        "supervised_steps_per_s": statistics.median(supervised),
        "overhead_pct": statistics.median(overheads),
        "overhead_pct_quartiles": statistics.quantiles(overheads, n=4) if len(overheads) > 1
        else overheads * 3,
        # The median's 90 % bootstrap interval over the pairs.
        "overhead_pct_ci90": median_interval(overheads),
        "overhead_pct_per_pair": overheads,
        # Each run's pace is timed after its first steps (Timer in the
        # example's common.py), so start-up costs are not in the figures.
        "warmup_steps": WARMUP_STEPS,
        "plain_steps_per_s_per_pair": plain, "supervised_steps_per_s_per_pair": supervised,
        "component_ms_per_step": {k: statistics.median(c[k] for c in components)
                                  for k in components[0]},
        "plain_ms_per_step": 1000.0 / statistics.median(plain),
        # CPU time of both ranks' processes over the loop, per step: less
        # sensitive than wall time to other load on a shared machine.
        "plain_cpu_ms_per_step": statistics.median(plain_cpu),
        "supervised_cpu_ms_per_step": statistics.median(supervised_cpu),
        "cpu_overhead_pct": statistics.median(
            100.0 * (s / p - 1.0) for p, s in zip(plain_cpu, supervised_cpu)),
        "load_average_1m_at_end": os.getloadavg()[0],
        # What each checkpoint costs the loop in wall time (rank 0's steps
        # around it, beyond the run's median step;
        # checkpoint_excess_ms), medians over every checkpoint of the pairs:
        # the plain loop's torch.save on the training thread against the
        # Supervisor's capture, flush and background write.
        "checkpoint_excess_ms": {
            "every": CHECKPOINT_EVERY,
            "window_steps": [-CHECKPOINT_WINDOW[0], CHECKPOINT_WINDOW[1]],
            "checkpoints": len(excess["plain"]),
            "plain": statistics.median(excess["plain"]) if excess["plain"] else None,
            "supervised": (statistics.median(excess["supervised"])
                           if excess["supervised"] else None),
        },
        # The same two loops alternating in blocks inside one 2-rank job
        # (torch_overhead_interleaved.py): drift cancels within a pair.
        "interleaved": interleaved,
        # The same blocks with the Supervisor reporting to no daemon (no
        # client, no registration; the daemon idle on the machine).
        "interleaved_without_daemon": interleaved_alone,
        # spikeguard's cost per step beyond the model's arithmetic, one
        # process, the example's model at a negligible size
        # (torch_fixed_cost.py): ms per step more than the plain loop.
        "fixed_cost": fixed,
    }
    (out / "torch_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ci = result["overhead_pct_ci90"]
    print(f"overhead {result['overhead_pct']:.1f} % (median of {args.pairs} pairs of runs, 90 % "
          f"interval {ci[0]:.1f} .. {ci[1]:.1f} %; the time per step a trainer under "
          f"spikeguard takes more than the same plain loop, 2 gloo ranks)")
    ex = result["checkpoint_excess_ms"]
    if ex["plain"] is not None and ex["supervised"] is not None:
        print(f"a checkpoint costs the loop {ex['supervised']:.1f} ms supervised, "
              f"{ex['plain']:.1f} ms plain (median wall time beyond the median step, the "
              f"{sum(CHECKPOINT_WINDOW)} steps around each of {ex['checkpoints']} checkpoints "
              f"per loop)")
    if interleaved is not None:
        q = interleaved["overhead_pct_quartiles"]
        print(f"overhead {interleaved['overhead_pct']:.1f} % interleaved (median of "
              f"{interleaved['pairs']} pairs of {interleaved['block_steps']}-step blocks in one "
              f"job; quartiles {q[0]:.1f} .. {q[2]:.1f} %, the median's 90 % interval "
              f"{interleaved['overhead_pct_ci90'][0]:.1f} .. "
              f"{interleaved['overhead_pct_ci90'][1]:.1f} %); against a plain loop without "
              f"checkpoints {interleaved['overhead_pct_against_plain_without_checkpoints']:.1f} %, "
              f"without checkpoints or clipping "
              f"{interleaved['overhead_pct_against_plain_without_checkpoints_or_clipping']:.1f} %")
    if interleaved_alone is not None:
        ci = interleaved_alone["overhead_pct_ci90"]
        print(f"overhead {interleaved_alone['overhead_pct']:.1f} % interleaved without a daemon "
              f"(the median's 90 % interval {ci[0]:.1f} .. {ci[1]:.1f} %)")
    if fixed is not None:
        parts = []
        for name in ("without_daemon", "with_daemon"):
            f = fixed[name]["thread_cpu"]
            q = f["extra_ms_per_step_quartiles"]
            parts.append(f"{name.replace('_', ' ')} {f['extra_ms_per_step']:+.2f} ms "
                         f"(quartiles {q[0]:+.2f} .. {q[2]:+.2f}; plain "
                         f"{f['plain_ms_per_step']:.2f} ms)")
        print("fixed cost per step (one process, the model at a negligible size, training "
              "thread's CPU): " + "; ".join(parts))


if __name__ == "__main__":
    main()
