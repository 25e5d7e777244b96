"""worker/examples/torch_gpt: DDP over gloo on CPU, bit-exact replay from a
checkpoint with two ranks, a rank with an empty shard, the telemetry the
ranks must agree on."""
import json
import os
import socket
import subprocess
import time
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "worker", "examples", "torch_gpt", "train.py")
BUILD = os.environ.get("SPIKEGUARD_BUILD_DIR", os.path.join(ROOT, "build"))
PYTHON = os.environ.get("SPIKEGUARD_PYTHON", "/usr/bin/python3")
WORKER = os.path.join(BUILD, "worker", "spikeguard-worker")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not os.path.exists(WORKER):
        pytest.skip(f"{WORKER} not built (cmake --build build --target spikeguard-worker)")
    out = tmp_path_factory.mktemp("corpus") / "c"
    subprocess.run([WORKER, "corpus", "synth", "--out", str(out), "--seed", "5",
                    "--positions", "200"], check=True, capture_output=True)
    return str(out)


def run_ranks(world, tmp, name, args, timeout=240):
    """Runs train.py with `world` ranks (no daemon); returns each rank's reports."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ)
        env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        if world == 1:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k)
        log = open(os.path.join(tmp, f"{name}.r{r}.log"), "w")
        procs.append((subprocess.Popen(
            [PYTHON, TRAIN, "--no-daemon", "--telemetry-jsonl",
             os.path.join(tmp, f"{name}.r{r}.jsonl")] + args,
            env=env, stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            raise
        log.close()
        if rc != 0:
            with open(log.name) as f:
                pytest.fail(f"{log.name}: exit {rc}\n{f.read()[-4000:]}")
    out = []
    for r in range(world):
        with open(os.path.join(tmp, f"{name}.r{r}.jsonl")) as f:
            out.append([json.loads(line) for line in f])
    return out


def by_step(reports):
    return {int(d["step"]): d for d in reports}


def test_two_rank_replay_from_checkpoint_is_bit_exact(corpus, tmp_path):
    ck = str(tmp_path / "ck")
    common = ["--corpus", corpus, "--checkpoint-dir", ck, "--checkpoint-every", "4",
              "--keep-checkpoints", "5", "--lr", "3e-3", "--warmup", "3", "--clip-norm", "1.0"]
    first = run_ranks(2, str(tmp_path), "first", common + ["--steps", "12"])
    assert [len(r) for r in first] == [12, 12]
    a0, a1 = by_step(first[0]), by_step(first[1])
    for s in range(12):
        # What the ranks must agree on: the global loss (and its hash), the
        # grad norm (DDP averaged the gradients), lse, per-layer statistics.
        for key in ("loss", "loss_hash", "grad_norm", "clipped", "lr", "lse_mean", "lse_max",
                    "data_position"):
            assert a0[s][key] == a1[s][key], (s, key)
        assert a0[s]["layers"] == a1[s]["layers"] or all(
            x[k] == y[k] for x, y in zip(a0[s]["layers"], a1[s]["layers"])
            for k in ("grad_norm", "update_ratio", "param_norm", "max_attn_logit", "act_rms"))
        assert int(a0[s]["tokens"]) + int(a1[s]["tokens"]) == 16 * 64
    assert sorted(os.listdir(ck)) == ["step-000000004.pt", "step-000000008.pt",
                                      "step-000000012.pt"]
    replay = run_ranks(2, str(tmp_path), "replay",
                       common + ["--steps", "12", "--resume", os.path.join(ck, "step-000000004.pt")])
    for r in range(2):
        got = by_step(replay[r])
        assert sorted(got) == list(range(4, 12))
        orig = by_step(first[r])
        for s in range(4, 12):
            assert got[s]["loss_hash"] == orig[s]["loss_hash"], (r, s)
            assert got[s]["grad_norm"] == orig[s]["grad_norm"], (r, s)
            assert got[s]["layers"] == orig[s]["layers"] or all(
                x[k] == y[k] for x, y in zip(got[s]["layers"], orig[s]["layers"])
                for k in ("grad_norm", "update_ratio", "param_norm", "max_attn_logit"))


def test_a_rank_with_no_rows_trains_like_one_process(corpus, tmp_path):
    # Four rows per global batch, the plan's masks drop three: one row left,
    # which rank 1 takes; rank 0's shard is empty. The loss scaling (sum ×
    # world / global tokens) makes DDP's average the full batch's mean, and
    # with scale factors that are powers of two the two-rank run is
    # bit-identical to one process.
    plan = "0-;drop=0:0.1.2;drop=1:1.2.3;drop=2:0.2.3"
    args = ["--corpus", corpus, "--batch-size", "4", "--steps", "3", "--lr", "3e-3",
            "--warmup", "2", "--plan", plan]
    two = run_ranks(2, str(tmp_path), "two", args)
    one = run_ranks(1, str(tmp_path), "one", args)
    for s in range(3):
        assert two[0][s]["tokens"] == "0"
        assert two[1][s]["tokens"] == "64"
        assert two[0][s]["loss_hash"] == two[1][s]["loss_hash"] == one[0][s]["loss_hash"], s
        assert two[0][s]["grad_norm"] == one[0][s]["grad_norm"], s
        assert two[0][s]["domain_losses"] == []
        assert two[1][s]["domain_losses"] == one[0][s]["domain_losses"]


def test_plan_holes_and_qk_norm_z_loss(corpus, tmp_path):
    # A plan with a hole: step 2 consumes position 5; QK-norm and z-loss run.
    out = run_ranks(1, str(tmp_path), "plan",
                    ["--corpus", corpus, "--steps", "4", "--plan", "0-2,5-", "--qk-norm",
                     "--z-loss", "1e-4"])
    assert [int(d["data_position"]) for d in out[0]] == [0, 1, 5, 6]
    assert all(d["nonfinite_count"] == "0" for d in out[0])
    assert all(0 < d["layers"][0]["max_attn_logit"] < 50 for d in out[0])


def test_two_ranks_under_spikeguardd_rewind_with_horizon_replays_bit_exact(corpus, tmp_path,
                                                                             daemon_factory):
    from conftest import wait_until
    # Ranks started by hand, as torchrun would: the run names an external
    # launch profile (no argv) whose root holds their checkpoint dir.
    profiles = tmp_path / "profiles.textproto"
    profiles.write_text(f'profile {{ name: "torchrun" checkpoint_root: "{tmp_path}" }}\n')
    daemon = daemon_factory([f"--launch-profiles={profiles}"]).start()
    spec = tmp_path / "spec.textproto"
    spec.write_text('profile: "torchrun"\n')
    daemon.create_run("tg", world_size=2, mode="observe", spec=spec)
    ck = str(tmp_path / "ck")
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        log = open(tmp_path / f"d.r{r}.log", "w")
        procs.append((subprocess.Popen(
            [PYTHON, TRAIN, "--corpus", corpus, "--checkpoint-dir", ck, "--addr", daemon.address,
             "--run", "tg", "--steps", "12", "--checkpoint-every", "4", "--keep-checkpoints", "2",
             "--lr", "3e-3", "--warmup", "3", "--linger-s", "8"],
            env=env, stdout=log, stderr=subprocess.STDOUT), log))

    def logs():
        return "\n".join(open(l.name).read()[-3000:] for _, l in procs)

    def gen_steps(gen):
        return {int(rec["step"]): rec for rec in daemon.telemetry("tg", gen=gen)
                if int(rec.get("ranks_reported", 0)) == 2}

    try:
        wait_until(lambda: len(gen_steps(0)) == 12, timeout=120, what="generation 0\n" + logs())
        # Retention kept two checkpoints and told the daemon of the deleted one.
        wait_until(lambda: sorted(int(c["step"]) for c in daemon.checkpoints("tg")) == [8, 12],
                   timeout=30, what="checkpoints")
        # While the ranks linger at the end of the schedule: replay 8..10.
        daemon.spikectl("rewind", "--run=tg", "--to-step=8", "--stop-after=10", check=True)
        wait_until(lambda: len(gen_steps(1)) == 3, timeout=60, what="generation 1\n" + logs())
        time.sleep(1.0)
        assert sorted(gen_steps(1)) == [8, 9, 10]  # the horizon holds
        g0, g1 = gen_steps(0), gen_steps(1)
        for s in (8, 9, 10):
            assert g1[s]["loss_hash"] == g0[s]["loss_hash"], s
        daemon.spikectl("resume", "--run=tg", check=True)
        for p, log in procs:
            assert p.wait(timeout=90) == 0, logs()
        assert sorted(gen_steps(1)) == list(range(8, 12))
        assert gen_steps(1)[11]["loss_hash"] == g0[11]["loss_hash"]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
            log.close()


def test_resume_newest_continues_after_the_newest_checkpoint(corpus, tmp_path):
    ck = str(tmp_path / "ck")
    common = ["--corpus", corpus, "--checkpoint-dir", ck, "--checkpoint-every", "3",
              "--batch-size", "8", "--lr", "3e-3", "--warmup", "2"]
    full = run_ranks(1, str(tmp_path), "full", common + ["--steps", "8"])
    os.unlink(os.path.join(ck, "step-000000006.pt"))  # newest left: step 3
    # A hidden temporary of an interrupted save is cleaned, not loaded.
    open(os.path.join(ck, ".step-000000007.pt.tmp-1-ab"), "w").close()
    resumed = run_ranks(1, str(tmp_path), "resumed", common + ["--steps", "8", "--resume", "newest"])
    assert [int(d["step"]) for d in resumed[0]] == [3, 4, 5, 6, 7]
    assert [d["loss_hash"] for d in resumed[0]] == [d["loss_hash"] for d in full[0][3:]]
    assert not any(n.startswith(".") for n in os.listdir(ck))
