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
