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
    # Named by generation (0, no daemon) and step.
    assert sorted(os.listdir(ck)) == ["g000000-step-000000004.pt", "g000000-step-000000008.pt",
                                      "g000000-step-000000012.pt"]
    replay = run_ranks(2, str(tmp_path), "replay",
                       common + ["--steps", "12", "--resume",
                                 os.path.join(ck, "g000000-step-000000004.pt")])
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
        # Retention kept the two newest checkpoints (and whatever the
        # daemon's rolling pin asked it to keep) and told the daemon of every
        # one it deleted: the catalog lists exactly the files left.
        def registered_is_on_disk():
            listed = sorted(os.path.basename(c["uri"]) for c in daemon.checkpoints("tg"))
            on_disk = sorted(f for f in os.listdir(ck) if f.endswith(".pt"))
            return listed == on_disk and {"g000000-step-000000008.pt",
                                          "g000000-step-000000012.pt"} <= set(on_disk)
        wait_until(registered_is_on_disk, timeout=30, what="checkpoints")
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
        # Generation 1 saved step 12 too: into its own file, next to (not
        # over) generation 0's, whose registered checksum still holds; its
        # retention deleted none of generation 0's checkpoints.
        assert {"g000000-step-000000008.pt", "g000000-step-000000012.pt",
                "g000001-step-000000012.pt"} <= set(os.listdir(ck))
        from spikeguard.checkpoint import verify_checkpoint
        at12 = wait_until(lambda: (lambda cs: cs if len(cs) == 2 else None)(
            [c for c in daemon.checkpoints("tg") if int(c["step"]) == 12]),
            timeout=30, what="both generations' step-12 checkpoints")
        assert sorted(os.path.basename(c["uri"]) for c in at12) == [
            "g000000-step-000000012.pt", "g000001-step-000000012.pt"]
        for c in at12:
            assert verify_checkpoint(c["uri"])["sha256"] == c["checksum"]
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
    os.unlink(os.path.join(ck, "g000000-step-000000006.pt"))  # newest left: step 3
    # ... under the name an earlier version gave it (no generation): a
    # directory it left still resumes.
    os.rename(os.path.join(ck, "g000000-step-000000003.pt"), os.path.join(ck, "step-000000003.pt"))
    # Hidden temporaries of interrupted saves are cleaned, not loaded.
    open(os.path.join(ck, ".g000000-step-000000007.pt.tmp-1-ab"), "w").close()
    open(os.path.join(ck, ".step-000000007.pt.tmp-2-cd"), "w").close()
    resumed = run_ranks(1, str(tmp_path), "resumed", common + ["--steps", "8", "--resume", "newest"])
    assert [int(d["step"]) for d in resumed[0]] == [3, 4, 5, 6, 7]
    assert [d["loss_hash"] for d in resumed[0]] == [d["loss_hash"] for d in full[0][3:]]
    assert not any(n.startswith(".") for n in os.listdir(ck))
    assert sorted(os.listdir(ck)) == ["g000000-step-000000006.pt", "step-000000003.pt"]


def _train_module():
    """train.py as a module (it needs the assembled package: spikeguard.data's
    C++ binding and the generated protos)."""
    import importlib.util
    try:
        import spikeguard.data  # noqa: F401
        import spikeguard.v1.telemetry_pb2  # noqa: F401
    except ImportError as e:
        pytest.skip(f"the assembled spikeguard package is not built: {e}")
    spec = importlib.util.spec_from_file_location("torch_gpt_train", TRAIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_save_registers_each_generations_own_file_and_prunes_only_its_own(tmp_path):
    """What the daemon hears from the trainer's checkpoint cadence across a
    rewind: every CheckpointSaved names the step and the file that was
    written for it by that generation, and retention's CheckpointDeleted
    notices name only the saving generation's files."""
    import argparse
    import types

    import torch
    from spikeguard.checkpoint import verify_checkpoint
    from spikeguard.control import HParamState
    train = _train_module()

    class FakeClient:
        def __init__(self):
            self.notices = []

        def checkpoint_saved(self, step, uri, **kw):
            self.notices.append(("saved", step, uri, kw["checksum"]))

        def checkpoint_deleted(self, step, uri):
            self.notices.append(("deleted", step, uri))

    ck = tmp_path / "ck"
    t = train.Trainer.__new__(train.Trainer)
    t.args = argparse.Namespace(checkpoint_dir=str(ck), keep_checkpoints=1)
    t.rank, t.client = 0, FakeClient()
    t.order = types.SimpleNamespace(plan="0-", position_for_step=lambda s: 2 * s)
    t.cfg = types.SimpleNamespace(fingerprint=lambda: "fp")
    t.hparams = HParamState()
    t.model = torch.nn.Linear(3, 2)
    t.optimizer = torch.optim.SGD(t.model.parameters(), lr=0.1)
    t.controller = types.SimpleNamespace(pinned_uris=[])

    def save(generation, step):
        t.generation, t.step = generation, step
        with torch.no_grad():
            t.model.weight.add_(1.0)  # every save holds other weights
        t.save()

    def uri(name):
        return "file://" + str(ck / name)

    save(0, 4)
    save(0, 8)
    g0_8 = ck / "g000000-step-000000008.pt"
    g0_8_bytes = g0_8.read_bytes()
    save(1, 4)  # rewound to step 4: generation 1 saves 4 and 8 again
    save(1, 8)
    notices = [n[:3] for n in t.client.notices]
    assert notices == [
        ("saved", 4, uri("g000000-step-000000004.pt")),
        ("deleted", 4, uri("g000000-step-000000004.pt")),
        ("saved", 8, uri("g000000-step-000000008.pt")),
        ("saved", 4, uri("g000001-step-000000004.pt")),
        ("deleted", 4, uri("g000001-step-000000004.pt")),
        ("saved", 8, uri("g000001-step-000000008.pt")),
    ]
    assert sorted(os.listdir(ck)) == ["g000000-step-000000008.pt", "g000001-step-000000008.pt"]
    # Generation 0's step 8 is what was registered: same bytes, same checksum.
    assert g0_8.read_bytes() == g0_8_bytes
    registered = {n[2]: n[3] for n in t.client.notices if n[0] == "saved"}
    for name in os.listdir(ck):
        assert verify_checkpoint(uri(name))["sha256"] == registered[uri(name)]
    assert registered[uri("g000000-step-000000008.pt")] != registered[uri("g000001-step-000000008.pt")]


def test_rewind_checkpoint_at_step_is_saved_and_registered_once_besides_the_cadence(tmp_path):
    """Trainer.run under a REWIND with checkpoint_at_step: the trainer writes
    the new generation's checkpoint of that step (the state after steps
    0..s-1) and registers it, once, besides its cadence."""
    import argparse
    import collections
    import types

    import torch
    from spikeguard.checkpoint import load_checkpoint, verify_checkpoint
    from spikeguard.control import Controller, HParamState
    from spikeguard.v1 import worker_pb2
    train = _train_module()

    class FakeClient:
        rejection = None

        def __init__(self):
            self.commands = collections.deque()
            self.notices = []
            self.results = []

        def poll_command(self, timeout=0.0):
            return self.commands.popleft() if self.commands else None

        def command_result(self, command_id, ok, message="", step=0):
            self.results.append((command_id, ok, message, step))

        def set_generation(self, g):
            pass

        def generation_ended(self, generation, last_step, reason):
            self.notices.append(("ended", generation, last_step))

        def flush(self, timeout=30.0):
            pass

        def checkpoint_saved(self, step, uri, **kw):
            self.notices.append(("saved", step, uri, kw["checksum"]))

        def checkpoint_deleted(self, step, uri):
            self.notices.append(("deleted", step, uri))

    ck = tmp_path / "ck"
    ck.mkdir()
    t = train.Trainer.__new__(train.Trainer)
    t.args = argparse.Namespace(checkpoint_dir=str(ck), keep_checkpoints=10, checkpoint_every=4)
    t.rank, t.world, t.client, t.jsonl = 0, 1, FakeClient(), None

    def order(plan):
        return types.SimpleNamespace(plan=plan or "0-", position_for_step=lambda s: 2 * s)

    t.base_order = types.SimpleNamespace(with_plan=order)
    t.order = order("")
    t.cfg = types.SimpleNamespace(fingerprint=lambda: "fp")
    t.hparams = HParamState()
    t.model = torch.nn.Linear(3, 2)
    torch.nn.init.zeros_(t.model.weight)
    t.optimizer = torch.optim.SGD(t.model.parameters(), lr=0.1)
    t.step, t.generation = 0, 0
    t.controller = Controller(t.client, total_steps=10, get_step=lambda: t.step, rewind=t.rewind,
                              generation=0, poll_interval_s=0.01)
    t.emit = lambda report: None
    trained = []

    def uri(name):
        return "file://" + str(ck / name)

    def train_step():
        # Every step adds 1 to the weights: a checkpoint of step s holds s.
        trained.append((t.generation, t.step))
        if (t.generation, t.step) == (0, 6):
            # The daemon's replay probe: back to step 4, a checkpoint at 7.
            t.client.commands.append(worker_pb2.Command(
                id="r", kind=worker_pb2.Command.REWIND, new_generation=1,
                checkpoint=worker_pb2.CheckpointRef(uri=uri("g000000-step-000000004.pt")),
                checkpoint_at_step=7))
        with torch.no_grad():
            t.model.weight.add_(1.0)
        t.step += 1

    t.train_step = train_step
    t.run()

    assert trained == [(0, s) for s in range(7)] + [(1, s) for s in range(4, 10)]
    assert t.client.results == [("r", True, "ok", 4)]
    assert [n[:3] for n in t.client.notices] == [
        ("saved", 4, uri("g000000-step-000000004.pt")),
        ("saved", 7, uri("g000001-step-000000007.pt")),   # asked for, off the cadence
        ("saved", 8, uri("g000001-step-000000008.pt")),   # the cadence
        ("ended", 1, 9),
    ]
    assert sorted(os.listdir(ck)) == ["g000000-step-000000004.pt", "g000001-step-000000007.pt",
                                      "g000001-step-000000008.pt"]
    registered = {n[2]: n[3] for n in t.client.notices if n[0] == "saved"}
    for name in os.listdir(ck):
        assert verify_checkpoint(uri(name))["sha256"] == registered[uri(name)]
    state = load_checkpoint(uri("g000001-step-000000007.pt"), model=t.model, optimizer=t.optimizer)
    assert state["step"] == 7 and state["generation"] == 1 and state["data_position"] == 14
    assert torch.equal(t.model.weight, torch.full((2, 3), 7.0))
    assert t.controller.checkpoint_at == -1
