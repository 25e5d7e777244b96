"""spikeguard.control: the daemon's commands at step boundaries, with a fake
client; one rank in process, and two gloo ranks that must act on rank 0's
commands at the same step."""
import collections
import os
import socket
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spikeguard.control import Controller, HParamState, RejectedError, plan_text
from spikeguard.v1 import worker_pb2

K = worker_pb2.Command


class FakeClient:
    """The parts of spikeguard.Client the controller uses, recording calls."""

    def __init__(self):
        self.commands = collections.deque()
        self.results = []
        self.ended = []
        self.generations = []
        self.flushes = 0
        self.rejection = None
        self.lock = threading.Lock()

    def push(self, **kw):
        with self.lock:
            self.commands.append(worker_pb2.Command(**kw))

    def poll_command(self, timeout=0.0):
        with self.lock:
            return self.commands.popleft() if self.commands else None

    def command_result(self, command_id, ok, message="", step=0):
        self.results.append((command_id, ok, message, step))

    def generation_ended(self, generation, last_step, reason):
        self.ended.append((generation, last_step, reason))

    def set_generation(self, g):
        self.generations.append(g)

    def flush(self, timeout=30.0):
        self.flushes += 1


class FakeTrainer:
    """Steps, checkpoints as {step: state}, and a log of what it trained."""

    def __init__(self):
        self.step = 0
        self.trained = []
        self.plans = []
        self.saved = {}

    def rewind(self, uri, plan, command):
        if not uri.startswith("file:///ck/"):
            raise FileNotFoundError(f"no checkpoint {uri}")
        self.step = int(uri.rsplit("/", 1)[1])
        self.plans.append(plan)


class PendingSteps:
    """A piggyback whose values are the steps trained since the last look:
    `taken` holds what each look took, `shapes` the rows each put got."""

    def __init__(self):
        self.pending, self.taken, self.shapes = [], [], []

    def take(self):
        if not self.pending:
            return None
        self.taken.append(list(self.pending))
        self.pending = []
        return torch.tensor(self.taken[-1], dtype=torch.float64)

    def put(self, rows):
        self.shapes.append(tuple(rows.shape))


def make(client, total=10, **kw):
    tr = FakeTrainer()
    ctl = Controller(client, total_steps=total, get_step=lambda: tr.step, rewind=tr.rewind,
                     poll_interval_s=0.01, **kw)
    return tr, ctl


def drive(tr, ctl, on_step=None, limit=200):
    """The trainer's loop; on_step(step) may push commands (the daemon)."""
    while ctl.step_boundary():
        tr.trained.append((ctl.generation, tr.step))
        if on_step:
            on_step(tr.step)
        tr.step += 1
        assert len(tr.trained) < limit


def test_plan_text():
    p = worker_pb2.DataPlan(ranges=[worker_pb2.DataRange(begin=0, end=300),
                                    worker_pb2.DataRange(begin=305, end=-1)])
    assert plan_text(p) == "0-300,305-"
    assert plan_text(worker_pb2.DataPlan()) == ""


def test_no_daemon_runs_the_schedule_or_up_to_the_horizon():
    tr, ctl = make(None, total=5)
    drive(tr, ctl)
    assert [s for _, s in tr.trained] == [0, 1, 2, 3, 4]
    tr, ctl = make(None, total=5, stop_after_step=2)
    drive(tr, ctl)
    assert [s for _, s in tr.trained] == [0, 1, 2]


def test_rewind_with_horizon_then_continue_then_end_of_schedule():
    c = FakeClient()
    tr, ctl = make(c, total=8)
    pushed = set()

    def daemon(step):
        if step == 5 and "r1" not in pushed:
            pushed.add("r1")
            c.push(id="r1", kind=K.REWIND, new_generation=1, stop_after_step=4,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/2"),
                   data_plan=worker_pb2.DataPlan(ranges=[worker_pb2.DataRange(begin=0, end=3),
                                                         worker_pb2.DataRange(begin=4, end=-1)]),
                   hparams=worker_pb2.HParams(lr_scale=0.5), pinned_uris=["file:///ck/2"])
        if step == 4 and ctl.generation == 1 and "c1" not in pushed:
            # Re-sent rewind (a reconnect) and a continue, after the horizon.
            pushed.add("c1")
            c.push(id="r1", kind=K.REWIND, new_generation=1,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/2"))
            c.push(id="c1", kind=K.CONTINUE)

    drive(tr, ctl, daemon)
    assert tr.trained == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5),
                          (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7)]
    assert tr.plans == ["0-3,4-"]
    assert c.generations == [1]
    assert ctl.pinned_uris == []  # the CONTINUE carried no pins
    assert [(r[0], r[1], r[3]) for r in c.results] == [("r1", True, 2), ("r1", True, 5),
                                                       ("c1", True, 5)]
    assert c.results[1][2] == "already executed"
    assert ctl.hparams.lr_scale == 0.5
    # The end of the schedule: one GenerationEnded for generation 1.
    assert c.ended == [(1, 7, "end of training schedule (steps=8)")]


def test_failed_rewind_answers_not_ok_and_pauses_until_the_next_command():
    c = FakeClient()
    tr, ctl = make(c, total=6)

    def daemon(step):
        if step == 1:
            c.push(id="bad", kind=K.REWIND, new_generation=1,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///gone/0"))
            # Arrives while paused: the worker must still be at step 2.
            threading.Timer(0.2, lambda: c.push(id="go", kind=K.CONTINUE)).start()

    drive(tr, ctl, daemon)
    assert c.results[0][:2] == ("bad", False) and "no checkpoint file:///gone/0" in c.results[0][2]
    assert c.results[0][3] == 2 and c.results[1] == ("go", True, "ok", 2)
    assert ctl.generation == 0 and c.generations == []
    assert [s for _, s in tr.trained] == [0, 1, 2, 3, 4, 5]


def test_rewind_checkpoint_at_step_is_due_once_at_that_step_of_the_new_generation():
    """REWIND's checkpoint_at_step: checkpoint_due(step) is True once, at that
    step of the new generation (asked after each trained step with the next
    step, as train.py does); a later REWIND replaces the request, 0 clears it,
    a step not after the rewind's checkpoint is ignored, a re-sent REWIND
    does not re-arm it."""
    c = FakeClient()
    tr, ctl = make(c, total=10)
    assert ctl.checkpoint_at == -1
    pushed = set()
    due = []

    def rewind(cid, gen, to, at, **kw):
        c.push(id=cid, kind=K.REWIND, new_generation=gen, checkpoint_at_step=at,
               checkpoint=worker_pb2.CheckpointRef(uri=f"file:///ck/{to}"), **kw)

    def daemon(step):
        g = ctl.generation
        once = (g, step) not in pushed
        pushed.add((g, step))
        if not once:
            return
        if g == 0 and step == 5:
            rewind("r1", 1, 2, 6)       # asks for step 6 of generation 1 ...
        elif g == 1 and step == 4:
            rewind("r2", 2, 3, 5)       # ... replaced before it gets there: step 5
        elif g == 2 and step == 6:
            rewind("r1", 1, 2, 6)       # re-sent (a reconnect): answered, not re-armed
        elif g == 2 and step == 7:
            rewind("r3", 3, 6, 8)       # asks for step 8 of generation 3 ...
        elif g == 3 and step == 6:
            rewind("r4", 4, 6, 0)       # ... cleared by a rewind with 0
        elif g == 4 and step == 8:
            rewind("r5", 5, 7, 7)       # the rewind's own checkpoint step: ignored
        elif g == 5 and step == 8:
            rewind("r6", 6, 7, 3)       # before it: ignored

    while ctl.step_boundary():
        tr.trained.append((ctl.generation, tr.step))
        daemon(tr.step)
        tr.step += 1
        if ctl.checkpoint_due(tr.step):
            due.append((ctl.generation, tr.step))
            assert not ctl.checkpoint_due(tr.step)  # once
        assert len(tr.trained) < 100

    assert [r[:2] for r in c.results] == [("r1", True), ("r2", True), ("r1", True), ("r3", True),
                                          ("r4", True), ("r5", True), ("r6", True)]
    assert c.results[2][2] == "already executed"
    assert c.generations == [1, 2, 3, 4, 5, 6]
    assert due == [(2, 5)]
    assert ctl.checkpoint_at == -1
    # Generation 2 got past step 5 (the rewind to step 3 trained 3..7).
    assert [s for g, s in tr.trained if g == 2] == [3, 4, 5, 6, 7]


def test_checkpoint_due_with_the_default_step_and_a_failed_rewind():
    """checkpoint_due() asks about get_step(); a failed REWIND leaves the
    request of the last successful one (as the C++ worker does)."""
    c = FakeClient()
    tr, ctl = make(c, total=10)
    c.push(id="r", kind=K.REWIND, new_generation=1, checkpoint_at_step=4,
           checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/1"))
    assert ctl.step_boundary() and tr.step == 1 and ctl.checkpoint_at == 4
    c.push(id="bad", kind=K.REWIND, new_generation=2, checkpoint_at_step=0,
           checkpoint=worker_pb2.CheckpointRef(uri="file:///gone/0"))
    c.push(id="go", kind=K.CONTINUE)
    assert ctl.step_boundary()
    assert c.results[1][:2] == ("bad", False) and ctl.generation == 1
    assert ctl.checkpoint_at == 4
    for step in (1, 2, 3):
        tr.step = step
        assert not ctl.checkpoint_due()
    tr.step = 4
    assert ctl.checkpoint_due() and not ctl.checkpoint_due()
    # No daemon: never due.
    _, ctl0 = make(None)
    assert not any(ctl0.checkpoint_due(s) for s in range(10))


def test_pause_stop_unknown_and_linger():
    c = FakeClient()
    tr, ctl = make(c, total=3, linger_s=5.0)

    def daemon(step):
        if step == 0:
            c.push(id="x", kind=K.KIND_UNSPECIFIED)
        if step == 2:
            # After the schedule ends, while the worker lingers: a stop.
            threading.Timer(0.3, lambda: c.push(id="s", kind=K.STOP)).start()

    drive(tr, ctl, daemon)
    assert c.results[0][:2] == ("x", False) and "unknown command kind" in c.results[0][2]
    assert c.results[1] == ("s", True, "ok", 3)
    assert len(c.ended) == 1


def test_settle_runs_before_each_command_and_each_flush():
    """Controller.settle (the Supervisor: finish a checkpoint being written
    in the background) runs before a command executes and before the
    client is flushed, so the daemon hears of the checkpoint first."""
    c = FakeClient()
    tr, ctl = make(c, total=3)
    log = []
    ctl.settle = lambda: log.append(("settle", len(c.results), c.flushes))
    drive(tr, ctl, lambda step: step == 0 and c.push(id="p", kind=K.SET_HPARAMS))
    # Before the command's result, and before the end-of-schedule flushes.
    assert log[0] == ("settle", 0, 0)
    assert c.results[0][:2] == ("p", True)
    assert c.flushes >= 1 and len(log) >= 1 + c.flushes


def test_no_linger_ends_without_waiting_a_poll_interval():
    """linger_s=0: at the end of the schedule rank 0 takes the commands that
    already came and does not wait poll_interval_s for more."""
    class WaitingClient(FakeClient):
        def __init__(self):
            super().__init__()
            self.timeouts = []

        def poll_command(self, timeout=0.0):
            self.timeouts.append(timeout)
            return super().poll_command(timeout)

    c = WaitingClient()
    tr = FakeTrainer()
    ctl = Controller(c, total_steps=2, get_step=lambda: tr.step, rewind=tr.rewind,
                     poll_interval_s=5.0, linger_s=0.0)
    drive(tr, ctl)
    assert [s for _, s in tr.trained] == [0, 1] and len(c.ended) == 1
    assert max(c.timeouts) == 0.0
    # A command already there at the end is still executed.
    c = WaitingClient()
    tr = FakeTrainer()
    ctl = Controller(c, total_steps=2, get_step=lambda: tr.step, rewind=tr.rewind,
                     poll_interval_s=5.0, linger_s=0.0)
    drive(tr, ctl, lambda step: step == 1 and c.push(id="s", kind=K.STOP))
    assert c.results == [("s", True, "ok", 2)] and max(c.timeouts) == 0.0


def test_set_hparams_and_absolute_rewind_hparams():
    hp = HParamState()
    hp.apply(worker_pb2.HParams(lr_scale=0.7, extra_warmup_steps=4, clip_norm=1.0, beta2=0.95,
                                eps=1e-6))
    assert hp.rewarm_start_step == -1
    hp.begin_step(10)
    assert [round(hp.lr_factor(s), 6) for s in (9, 10, 11, 13, 20)] == [0.7, 0.175, 0.35, 0.7, 0.7]
    hp2 = HParamState()
    hp2.apply(worker_pb2.HParams(extra_warmup_steps=4, warmup_start_step=8))
    hp2.begin_step(10)
    assert hp2.lr_factor(10) == 0.75
    assert HParamState.from_dict(hp.to_dict()) == hp
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0, betas=(0.9, 0.999))
    hp.apply_to_optimizer(opt, 0.5, betas=(0.9, 0.999), eps=1e-8)
    g = opt.param_groups[0]
    assert g["lr"] == 0.5 and g["betas"] == (0.9, 0.95) and g["eps"] == 1e-6
    assert hp.clip(0.0) == 1.0 and HParamState().clip(2.0) == 2.0

    c = FakeClient()
    tr, ctl = make(c, total=4, base_hparams=HParamState(lr_scale=2.0))

    def daemon(step):
        if step == 0:
            c.push(id="h", kind=K.SET_HPARAMS, hparams=worker_pb2.HParams(beta2=0.9))
        if step == 1:
            c.push(id="r", kind=K.REWIND, new_generation=3,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/3"),
                   hparams=worker_pb2.HParams(clip_norm=0.5))

    seen = []
    while ctl.step_boundary():
        seen.append((tr.step, ctl.hparams.lr_scale, ctl.hparams.beta2, ctl.hparams.clip_norm))
        daemon(tr.step)
        tr.step += 1
    # SET_HPARAMS changes one field; REWIND's are absolute over the base.
    assert seen == [(0, 2.0, None, None), (1, 2.0, 0.9, None), (3, 2.0, None, 0.5)]


def test_rejection_raises():
    c = FakeClient()
    tr, ctl = make(c)
    c.rejection = worker_pb2.Reject(message="stale generation")
    with pytest.raises(RejectedError, match="stale generation"):
        ctl.step_boundary()


# ---- two ranks over gloo ---------------------------------------------------------

def _run_two_ranks(target, *args):
    """Runs target(rank, port, out, *args) as gloo ranks 0 and 1 (spawned
    processes), each putting (rank, *results) on out; returns {rank:
    results} once both exited cleanly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, out, *args)) for r in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in range(2)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return {r[0]: r[1:] for r in got}

def _rank_main(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    c = FakeClient()
    tr, ctl = make(c, total=12, rank=rank, world_size=2)
    stop_at = {}

    def daemon(step):
        # The daemon sends every command to every rank's stream; rank 1's
        # copies arrive at other steps than rank 0's, and a stray one only
        # rank 1 got is never acted on.
        delay = 0 if rank == 0 else 3
        if step == 2 + delay:
            c.push(id="p", kind=K.SET_HPARAMS, hparams=worker_pb2.HParams(lr_scale=0.25))
        if step == 4 + delay:
            c.push(id="r", kind=K.REWIND, new_generation=1, stop_after_step=6,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/1"))
        if rank == 1 and step == 1:
            c.push(id="stray", kind=K.STOP)
        if rank == 0 and ctl.generation == 1 and step == 6 and "c" not in stop_at:
            stop_at["c"] = True
            threading.Timer(0.3, lambda: c.push(id="c", kind=K.CONTINUE)).start()

    drive(tr, ctl, daemon)
    out.put((rank, tr.trained, c.results, c.ended, ctl.hparams.lr_scale))
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_act_on_rank0s_commands_at_the_same_step():
    got = _run_two_ranks(_rank_main)
    t0, res0, end0, lr0 = got[0]
    t1, res1, end1, lr1 = got[1]
    assert t0 == t1
    assert [s for _, s in t0] == [0, 1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    # Rank 0's daemon re-sends p and r when the replay passes steps 2 and 4
    # again: answered, not executed twice.
    assert res0 == [("p", True, "ok", 3), ("r", True, "ok", 1), ("p", True, "already executed", 3),
                    ("r", True, "already executed", 5), ("c", True, "ok", 7)]
    assert res1 == res0
    assert end0 == end1 == [(1, 11, "end of training schedule (steps=12)")]
    assert lr0 == lr1 == 1.0


def _rank_main_looks(rank, port, out, async_looks):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    c = FakeClient()
    tr = FakeTrainer()
    ctl = Controller(c, total_steps=14, get_step=lambda: tr.step, rewind=tr.rewind, rank=rank,
                     world_size=2, poll_interval_s=0.01, exchange_every=3,
                     async_looks=async_looks)

    class Values:
        """Piggybacked values: each rank's step numbers, reported in order."""
        def __init__(self):
            self.pending, self.taken, self.got = [], [], []

        def take(self):
            if not self.pending:
                return None
            self.taken, self.pending = self.pending, []
            return torch.tensor(self.taken, dtype=torch.float64) + 100 * rank

        def put(self, rows):
            assert rows.shape == (2, len(self.taken))
            # The generation the values are delivered in.
            self.got.append([(ctl.generation,) + tuple(int(v) for v in col)
                             for col in rows.t()])
            self.taken = []

    vals = Values()
    ctl.piggyback = vals

    def daemon(step):
        if rank == 0 and step == 1:
            c.push(id="p", kind=K.SET_HPARAMS, hparams=worker_pb2.HParams(lr_scale=0.5))
        if rank == 0 and step == 5:
            c.push(id="r", kind=K.REWIND, new_generation=1, stop_after_step=4,
                   checkpoint=worker_pb2.CheckpointRef(uri="file:///ck/3"))
        if rank == 0 and ctl.generation == 1 and step == 4:
            c.push(id="c", kind=K.CONTINUE)

    while ctl.step_boundary():
        tr.trained.append((ctl.generation, tr.step))
        daemon(tr.step)
        vals.pending.append(tr.step)
        tr.step += 1
    out.put((rank, tr.trained, c.results, vals.got))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("async_looks", [True, False])
def test_two_ranks_looking_every_few_steps_agree_with_looks_in_flight(async_looks):
    """exchange_every=3: looks at every third boundary; with async_looks a
    look's collective finishes at the next boundary, so its commands run one
    step later, on both ranks at the same step; a horizon makes every
    boundary look at once. The piggybacked values of every step arrive, in
    order and in the generation that trained the step, gathered from both
    ranks."""
    got = _run_two_ranks(_rank_main_looks, async_looks)
    t0, res0, vals0 = got[0]
    t1, res1, vals1 = got[1]
    assert t0 == t1 and res1 == res0 and vals0 == vals1
    # Looks at boundaries 3, 6, 9, ... (before steps 2, 5, 8, ...): p (pushed
    # at step 1) runs before step 2, or step 3 with the look in flight; r
    # (pushed at step 5) before step 8 or 9.
    late = 1 if async_looks else 0
    p_step, r_step = 2 + late, 8 + late
    assert res0[0] == ("p", True, "ok", p_step)
    assert res0[1] == ("r", True, "ok", 3)  # answered at the step it rewound to
    # After the rewind to step 3 with a horizon at 4: every boundary looks.
    assert [s for _, s in t0] == list(range(r_step)) + [3, 4] + list(range(5, 14))
    assert res0[2] == ("c", True, "ok", 5)
    # Each step's values arrive in order, in the generation that trained
    # it: those trained after the last look before the rewind are delivered
    # before it, not in the new generation.
    steps = [(g, s) for batch in vals0 for g, s, _ in batch]
    assert steps == t0[:len(steps)] and len(steps) >= len(t0) - 3
    assert all(b == a + 100 for batch in vals0 for _, a, b in batch)


def _rank_main_paced(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    c = FakeClient()
    tr = FakeTrainer()
    ctl = Controller(c, total_steps=44, get_step=lambda: tr.step, rewind=tr.rewind, rank=rank,
                     world_size=2, poll_interval_s=0.01, exchange_every=8,
                     exchange_interval_s=0.1, min_exchange_every=2)
    vals = PendingSteps()
    taken = vals.taken
    ctl.piggyback = vals
    while ctl.step_boundary():
        if rank == 0 and tr.step >= 24:
            time.sleep(0.06)  # rank 0 slows down; rank 1 keeps its pace
        vals.pending.append(tr.step)
        tr.step += 1
    out.put((rank, taken))
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_pace_their_looks_by_the_slowest_rank_and_agree():
    """exchange_interval_s=0.1 within 2..8 boundaries: fast steps look every
    8th boundary (the most), and once rank 0 takes 60 ms a step every 2nd
    (ceil(0.1 / 0.06)), though rank 1 alone is fast; both ranks look at the
    same boundaries, so they take the same steps at each look."""
    got = {r: taken for r, (taken,) in _run_two_ranks(_rank_main_paced).items()}
    assert got[0] == got[1]
    sizes = [len(t) for t in got[0]]
    # The first look comes at the second boundary, then the fast steps' looks
    # at the most distance, until the looks that measured the slow steps.
    assert sizes[:4] == [1, 8, 8, 8], sizes
    slow = [len(t) for t in got[0] if t[0] >= 26]
    assert len(slow) >= 4 and all(n == 2 for n in slow[:-1]), got[0]
    assert [s for t in got[0] for s in t] == list(range(sum(sizes)))


def test_one_rank_polls_every_boundary_and_sends_pending_values_at_the_looks():
    """One rank: commands are polled at every boundary (a command pushed
    during step s runs at the boundary before step s + 1), but the
    piggyback's values go at the periodic looks, as with several ranks
    (every 8th boundary while fast, every 2nd once a step takes 120 ms with
    exchange_interval_s=0.2), and always before a command runs; the end of
    the schedule sends the rest, in order, none twice."""
    c = FakeClient()
    tr = FakeTrainer()
    seen_at_command = []
    ctl = Controller(c, total_steps=40, get_step=lambda: tr.step, rewind=tr.rewind,
                     poll_interval_s=0.01, exchange_every=8, exchange_interval_s=0.2,
                     min_exchange_every=2,
                     on_hparams=lambda hp: seen_at_command.append((tr.step, list(vals.pending))))
    vals = PendingSteps()
    taken = vals.taken
    ctl.piggyback = vals
    while ctl.step_boundary():
        if tr.step == 13:
            c.push(id="h1", kind=K.SET_HPARAMS, hparams=worker_pb2.HParams(lr_scale=0.5))
        if tr.step >= 24:
            time.sleep(0.12)
        vals.pending.append(tr.step)
        tr.step += 1
    # The command ran at the boundary after step 13, with nothing pending.
    assert seen_at_command == [(14, [])]
    assert c.results[0][:2] == ("h1", True)
    sizes = [len(t) for t in taken]
    # First look at the second boundary, then every 8th, the command's
    # boundary sending what was pending (steps 9..13) early.
    assert sizes[:3] == [1, 8, 5], taken
    # Once a look has measured only slow steps (from step 33 on here).
    slow = [len(t) for t in taken if t[0] >= 33]
    assert len(slow) >= 3 and all(n == 2 for n in slow[:-1]), taken
    assert [s for t in taken for s in t] == list(range(40))
    assert vals.shapes == [(1, len(t)) for t in taken]  # one rank's row per look
