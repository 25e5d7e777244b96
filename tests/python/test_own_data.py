"""Any dataset under spikeguard: the corpus-free plan (spikeguard.data.Plan),
the plan's batch sampler (PlanSampler), the high-level Supervisor without a
daemon on two real gloo ranks, and the own_data example's line count."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYTHON, PYTHON_DIR, REPO, free_port

from spikeguard import checkpoint as sgckpt
from spikeguard.data import Plan, PlanSampler
from spikeguard.v1 import worker_pb2

EXAMPLE = REPO / "worker" / "examples" / "own_data"


def added_lines(plain: Path, supervised: Path) -> list:
    a = plain.read_text().splitlines()
    b = supervised.read_text().splitlines()
    return [l[1:] for l in difflib.unified_diff(a, b, lineterm="", n=0)
            if l.startswith("+") and not l.startswith("+++")]


def test_supervised_example_adds_at_most_fifteen_lines_to_the_plain_loop():
    added = added_lines(EXAMPLE / "plain.py", EXAMPLE / "supervised.py")
    print(f"[figures] own_data: supervised.py adds {len(added)} lines to plain.py")
    assert len(added) <= 15, "\n".join(added)
    assert any("Supervisor(" in l for l in added)


# ---- Plan ----------------------------------------------------------------------

def test_plan_maps_steps_to_positions_across_holes_and_masks():
    p = Plan("0-600,610-;drop=300:0.1.5")
    assert p.text == "0-600,610-;drop=300:0.1.5"
    assert [p.position_for_step(s) for s in (0, 599, 600, 601)] == [0, 599, 610, 611]
    assert p.checkpoint_position(600) == 610       # what a checkpoint before step 600 stores
    assert p.first_step_for_position(610) == 600
    assert p.first_step_for_position(605) is None
    assert p.dropped_slots(300) == [0, 1, 5] and p.dropped_slots(301) == []
    assert p.kept_slots(300, 8) == [2, 3, 4, 6, 7]
    assert p.step_count is None


def test_plan_defaults_bounds_and_messages():
    assert Plan("").text == Plan(None).text == "0-"
    b = Plan("5-10,20-22")
    assert b.step_count == 7
    assert b.position_for_step(6) == 21
    assert b.checkpoint_position(7) == -1
    with pytest.raises(IndexError):
        b.position_for_step(7)
    msg = worker_pb2.DataPlan(ranges=[worker_pb2.DataRange(begin=0, end=100),
                                      worker_pb2.DataRange(begin=105, end=-1)])
    msg.masks.add(position=3, slots=[2])
    assert Plan(msg).text == "0-100,105-;drop=3:2"
    assert Plan(Plan(msg)) == Plan(msg)
    with pytest.raises(ValueError):
        Plan("10-5")


# ---- PlanSampler -------------------------------------------------------------------

def test_sampler_shards_the_global_batch_and_honours_holes_and_masks():
    plan = "0-2,4-;drop=4:0.3"
    ranks = [PlanSampler(100, 8, rank=r, world_size=2, plan=plan, seed=7, total_steps=4)
             for r in range(2)]
    per_rank = [list(s) for s in ranks]
    assert [len(x) for x in per_rank] == [4, 4]
    full = PlanSampler(100, 8, plan=plan, seed=7)
    for step, position in enumerate([0, 1, 4, 5]):
        glob = [i for _, i in full.global_indices(position)]
        assert per_rank[0][step] + per_rank[1][step] == glob
    # Step 2 feeds position 4 without slots 0 and 3: six rows, three a rank.
    b = ranks[0].batch_for_step(2)
    assert (b.position, b.slots, b.rows, b.global_rows) == (4, [1, 2, 4], 6, 8)
    assert ranks[1].batch_for_step(2).slots == [5, 6, 7]
    # A mask leaving one row: rank 0 has none, and gets one placeholder
    # index (a collate cannot build an empty batch) with no slots.
    one = [PlanSampler(100, 8, rank=r, world_size=2, plan="0-;drop=0:1.2.3.4.5.6.7", seed=7)
           for r in range(2)]
    assert [o.batch_for_step(0).slots for o in one] == [[], [0]]
    assert next(iter(one[0])) == [full.index_of(0, 0)] and one[0].last.slots == []
    # Every sample once per epoch (100 samples, 8 a batch).
    seen = [full.index_of(p, j) for p in range(13) for j in range(8)][:100]
    assert sorted(seen) == list(range(100))


def test_sampler_state_dict_and_documents_per_sample():
    s = PlanSampler(50, 4, rank=1, world_size=2, seed=3, plan="0-")
    it = iter(s)
    next(it), next(it)
    state = s.state_dict()
    assert state["step"] == 2
    t = PlanSampler(50, 4, rank=1, world_size=2, seed=3)
    t.load_state_dict(state)
    assert next(iter(t)) == next(it)
    with pytest.raises(ValueError):
        PlanSampler(50, 8, seed=3).load_state_dict(state)
    docs = t.documents_for()
    assert [(d, slot) for d, _, slot in docs] == [("data", 2), ("data", 3)]
    assert [i for _, i, _ in docs] == t.last.indices
    named = t.documents_for(document_of=lambda i: [("web", i * 10), ("code", i)])
    assert len(named) == 4 and named[0][0] == "web" and named[1][0] == "code"


# ---- Supervisor without a daemon, two gloo ranks ----------------------------------------

def _example(tmp: Path, steps: int, extra_env=None, rank_args=()):
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(PYTHON_DIR),
                   SPIKEGUARD_CHECKPOINT_DIR=str(tmp / "ckpt"))
        for k in ("SPIKEGUARD_ADDR", "SPIKEGUARD_RUN"):
            env.pop(k, None)
        env.update(extra_env or {})
        procs.append(subprocess.Popen(
            [PYTHON, str(EXAMPLE / "supervised.py"), f"--steps={steps}", "--documents=500",
             "--threads=1", *rank_args], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


def test_supervisor_runs_two_ranks_saves_and_resumes_under_a_plan(tmp_path):
    outs = _example(tmp_path, 60)
    assert all("step 60" in o for o in outs), outs
    saved = sgckpt.list_checkpoints(tmp_path / "ckpt", rank=0)
    assert [c["step"] for c in saved] == [50]
    header = sgckpt.read_header(saved[-1]["path"])
    assert header["data_position"] == 50
    # Resumed from the newest checkpoint under a plan with a hole: the
    # checkpoint it saves at 100 stores the position step 100 consumes.
    outs = _example(tmp_path, 101, {"SPIKEGUARD_RESUME": "newest",
                                     "SPIKEGUARD_PLAN": "0-70,80-"})
    assert all("step 101" in o for o in outs), outs
    newest = sgckpt.latest_checkpoint(tmp_path / "ckpt", rank=0)
    assert newest["step"] == 100
    assert sgckpt.read_header(newest["path"])["data_position"] == 110


# ---- Supervisor: checkpoints written in the background ------------------------------------

class RecordingClient:
    """The parts of spikeguard.Client the Supervisor uses, recording what it is told."""

    def __init__(self, pins=()):
        import collections
        self.events = []
        self.commands = collections.deque()
        self.rejection = None
        self.pins = list(pins)
        self.reports = []

    def report_many(self, reports):
        for r in reports:
            self.events.append(("report", r.step))
            self.reports.append(r)

    def set_current_step(self, step):
        pass

    def flush(self, timeout=None):
        self.events.append(("flush",))

    def close(self):
        pass

    def poll_command(self, timeout=0.0):
        return self.commands.popleft() if self.commands else None

    def generation_ended(self, generation, last_step, reason):
        self.events.append(("ended", last_step))

    def checkpoint_saved(self, step, uri, **kw):
        self.events.append(("saved", step, uri, kw["checksum"]))

    def checkpoint_deleted(self, step, uri):
        self.events.append(("deleted", step, uri))

    def await_checkpoint_answers(self, timeout):
        return True

    def take_pins(self):
        return list(self.pins)

    def command_result(self, command_id, ok, message="", step=0):
        self.events.append(("result", command_id, ok, step))

    def set_generation(self, generation):
        pass


def test_supervisor_applies_the_daemons_hparams_for_each_step_and_restores_the_users():
    """A SET_HPARAMS (lr scale, beta2, eps) holds for the optimizer's steps
    from the step after it came; the param groups hold the user's own values
    again after each step, and steps without an override leave them alone."""
    import sys

    import torch
    from spikeguard.supervise import Supervisor
    sys.path.insert(0, str(EXAMPLE))
    from common import ByteDocuments, TinyLM

    seen = []

    class Adam(torch.optim.Adam):
        def step(self, closure=None):
            g = self.param_groups[0]
            seen.append((g["lr"], g["betas"], g["eps"]))
            return super().step(closure)

    torch.manual_seed(0)
    model = TinyLM(layers=1, width=16, heads=2, context=8)
    opt = Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    client = RecordingClient()
    sg = Supervisor(model, opt, ByteDocuments(64, 8), global_batch_size=2, steps=6,
                    checkpoint_every=0, client=client)
    after = []
    for step, (x, y) in sg.steps():
        loss = sg.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        g = opt.param_groups[0]
        after.append((g["lr"], g["betas"], g["eps"]))
        if step == 2:
            client.commands.append(worker_pb2.Command(
                id="h", kind=worker_pb2.Command.SET_HPARAMS,
                hparams=worker_pb2.HParams(lr_scale=0.5, beta2=0.95, eps=1e-6)))
    sg.close()
    user = (1e-2, (0.9, 0.999), 1e-8)
    assert seen == [user] * 3 + [(5e-3, (0.9, 0.95), 1e-6)] * 3
    assert after == [user] * 6
    assert [r.lr for r in client.reports] == [lr for lr, _, _ in seen]


def test_supervisor_writes_checkpoints_in_the_background_in_order(tmp_path, monkeypatch):
    """Training goes on while a checkpoint is written; the file holds the
    state of its step; registrations come in order, each after the reports
    of the steps before it, retention keeps the daemon's pins, and the last
    one is registered before the generation ends."""
    import sys
    import threading
    import time

    import torch
    from spikeguard.supervise import Supervisor
    sys.path.insert(0, str(EXAMPLE))
    from common import ByteDocuments, TinyLM

    ckdir = tmp_path / "ck"
    pinned = sgckpt.checkpoint_path(ckdir, 2, generation=0)
    client = RecordingClient(pins=["file://" + pinned])
    torch.manual_seed(0)
    model = TinyLM(layers=2, width=32, heads=2, context=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sg = Supervisor(model, opt, ByteDocuments(200, 16), global_batch_size=4, steps=7,
                    checkpoint_dir=str(ckdir), checkpoint_every=2, keep_checkpoints=1,
                    client=client)
    real_write = sgckpt.write_checkpoint
    written = []  # (checkpoint step, trainer step when its write ended, thread)

    def slow_write(directory, captured):
        time.sleep(0.3)
        info = real_write(directory, captured)
        written.append((captured.step, sg.step, threading.current_thread().name))
        priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return info

    priorities = []
    trainer_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    monkeypatch.setattr(sgckpt, "write_checkpoint", slow_write)
    at_6 = None
    for step, (x, y) in sg.steps():
        if step == 6:
            at_6 = {k: v.clone() for k, v in model.state_dict().items()}
        loss = sg.loss(torch.nn.functional.cross_entropy(
            model(x).flatten(0, 1), y.flatten(), reduction="none"))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sg.close()

    assert [w[0] for w in written] == [2, 4, 6]
    assert all(name == "spikeguard-checkpoint" for _, _, name in written)
    # The writer yields the CPU to training (nice 19, the trainer's own
    # priority unchanged), and its CPU time is counted.
    assert priorities == [19, 19, 19]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == trainer_nice
    assert sg.timings()["checkpoint_writer_cpu"] > 0
    # The trainer went on while checkpoints 2 and 4 were written.
    assert written[0][1] > 2 and written[1][1] > 4
    ev = client.events
    kinds = [e[:2] for e in ev if e[0] in ("saved", "deleted", "ended")]
    assert kinds == [("saved", 2), ("saved", 4), ("deleted", 4), ("saved", 6), ("ended", 6)]
    for e in ev:
        if e[0] == "saved":
            # Each after the reports of the steps before it.
            assert ev.index(("report", e[1] - 1)) < ev.index(e)
    saved = {e[1]: e for e in ev if e[0] == "saved"}
    assert [c["step"] for c in sgckpt.list_checkpoints(ckdir)] == [2, 6]  # 2 is pinned
    for step in (2, 6):
        assert sgckpt.verify_checkpoint(saved[step][2])["sha256"] == saved[step][3]
    # Checkpoint 6 holds the weights before step 6 trained, though step 6
    # trained while it was written.
    fresh = TinyLM(layers=2, width=32, heads=2, context=16)
    sgckpt.load_checkpoint(saved[6][2], model=fresh,
                           optimizer=torch.optim.AdamW(fresh.parameters(), lr=1e-3))
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, at_6[k]), k
    assert not torch.equal(model.state_dict()["head.weight"], at_6["head.weight"])


def test_supervisor_cross_entropy_trains_and_reports_as_the_loss_of_f_cross_entropy():
    """sg.cross_entropy(logits, y) is sg.loss(F.cross_entropy(...)): the
    same weights after training, bit-identical losses in the reports, and
    the same output log-sum-exp (from the loss's log-probabilities instead
    of the forward hook's pass over the logits), which leaves out the
    logits of an evaluation pass as the hook does."""
    import sys

    import torch
    from spikeguard.supervise import Supervisor
    sys.path.insert(0, str(EXAMPLE))
    from common import ByteDocuments, TinyLM

    def train(use_helper):
        torch.manual_seed(0)
        model = TinyLM(layers=2, width=32, heads=2, context=16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        client = RecordingClient()
        sg = Supervisor(model, opt, ByteDocuments(200, 16), global_batch_size=4, steps=6,
                        checkpoint_every=0, client=client, exchange_every=3)
        def objective(logits, y):
            if use_helper:
                return sg.cross_entropy(logits, y)
            return sg.loss(torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), y.flatten(), reduction="none"))

        for step, (x, y) in sg.steps():
            if step == 3:  # an evaluation pass: its logits are no training step's
                model.eval()
                with torch.no_grad():
                    objective(model(x.flip(0)) * 3.0, y)
                model.train()
            loss = objective(model(x), y)
            # The logits hook stays on the user's model only while it is
            # what records them: the helper takes over after its first step.
            assert len(model._forward_hooks) == (0 if use_helper else 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
        sg.close()
        assert not model._forward_hooks
        return model, client.reports

    m_hook, r_hook = train(False)
    m_ce, r_ce = train(True)
    assert [r.step for r in r_ce] == [r.step for r in r_hook] == list(range(6))
    for a, b in zip(r_hook, r_ce):
        assert a.loss == b.loss and a.loss_hash == b.loss_hash
        assert b.lse_mean == pytest.approx(a.lse_mean, rel=1e-6) and a.lse_mean > 0
        assert b.lse_max == pytest.approx(a.lse_max, rel=1e-6)
        assert a.nonfinite_count == b.nonfinite_count == 0
    for (k, v), w in zip(m_hook.state_dict().items(), m_ce.state_dict().values()):
        assert torch.equal(v, w), k
