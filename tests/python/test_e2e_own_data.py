"""A user's own PyTorch loop on its own dataset under spikeguard, end to end:
a real spikeguardd launches two torch.distributed (gloo) ranks of
worker/examples/own_data/supervised.py (the plain loop plus the lines
spikeguard.supervise.Supervisor needs; no spikeguard corpus, no manifest)
from a launch profile. Two samples of one global batch of 16 are garbage:
the daemon bisects the window to that batch, then feeds its samples apart
(the trainer reports each sample's documents) and names exactly the two
garbage documents. (With four, the probe judge's bar loses the last one: xfail.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import PYTHON, PYTHON_DIR, REPO, Daemon, wait_until

EXAMPLE = REPO / "worker" / "examples" / "own_data" / "supervised.py"
# A garbage batch of this model is a one-step excursion that its next step
# undoes (nothing corroborates it): a blip under the default policy. Here
# every excursion opens an incident (the loss is smooth, so only the garbage
# gets past the 5 % floor).
POLICY = """
loss_spike { blip_steps: 0 }
probe {
  min_steps_before_onset: 50
  max_steps_before_onset: 500
  replay_steps_past_onset: 5
  skip_before: 2
  skip_after: 2
  skip_horizon: 100
  max_document_probes: 24
}
# Four culprit documents among 16 take more group tests than one does.
budget { max_probes: 48 max_reexecuted_steps: 20000 }
fix { verify_steps: 100 }
"""


def profiles(tmp: Path) -> Path:
    """The launch profile: spikeguard.supervise reads the resume point, the
    plan and the checkpoint directory from SPIKEGUARD_* (set here through
    env, since a profile's placeholders expand in argv only)."""
    argv = ["/usr/bin/env", "SPIKEGUARD_RESUME={resume}", "SPIKEGUARD_PLAN={plan}",
            f"SPIKEGUARD_CHECKPOINT_DIR={tmp / 'ckpt'}", "SPIKEGUARD_LINGER_S=120",
            PYTHON, str(EXAMPLE), "--threads=1", "{args}"]
    text = 'profile {\n  name: "own-data"\n'
    text += "".join(f"  argv: {json.dumps(a)}\n" for a in argv)
    for name in ("PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "USER"):
        text += f'  env_allow: "{name}"\n'
    text += f'  env {{ key: "PYTHONPATH" value: {json.dumps(str(PYTHON_DIR))} }}\n'
    text += f"  checkpoint_root: {json.dumps(str(tmp))}\n"
    text += "  max_world_size: 4\n"
    text += ('  param { name: "args" flags { allow: "steps" allow: "garbage" allow: "lr" } '
             'default_value: "" }\n')
    text += "}\n"
    path = tmp / "profiles.textproto"
    path.write_text(text)
    return path


def garbage_indices(position: int, slots: List[int], n: int, batch: int, seed: int) -> List[int]:
    sys.path.insert(0, str(PYTHON_DIR))
    from spikeguard.data import PlanSampler
    sampler = PlanSampler(n, batch, seed=seed)
    return [sampler.index_of(position, j) for j in slots]


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path / "daemon", [f"--launch-profiles={profiles(tmp_path)}"])
    d.start()
    try:
        yield d
    finally:
        if d.running:
            d.stop()


def incidents(daemon, run: str) -> List[Dict]:
    return daemon.spikectl_json("incidents", "list", "--run", run).get("incidents", [])


def rank_log(daemon, run: str, rank: int) -> str:
    path = daemon.data_dir / "runs" / run / f"rank-{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize("slots", [
    [1, 9],
    # Four culprits of 16: the group test that feeds the last one with the
    # twelve clean samples is judged clean, since a probe counts as spiked
    # only above half the incident's log ratio and one garbage row in
    # thirteen stays under it: three of the four are named.
    pytest.param([1, 6, 9, 14], marks=pytest.mark.xfail(
        reason="a diluted culprit falls under the probe judge's half-log-ratio bar", strict=False)),
])
def test_own_dataset_partly_garbage_batch_names_exactly_the_garbage_documents(
        daemon, tmp_path, slots):
    position = 130
    bad = garbage_indices(position, slots, n=8000, batch=16, seed=0)
    (tmp_path / "policy.textproto").write_text(POLICY)
    daemon.spikectl("policy", "set", "--file", str(tmp_path / "policy.textproto"), check=True)
    args = f"--steps=240 --garbage={','.join(map(str, bad))}"
    spec = 'profile: "own-data"\n'
    spec += f'params {{ key: "args" value: {json.dumps(args)} }}\n'
    spec += "restart_all_ranks: true\n"
    (tmp_path / "spec.textproto").write_text(spec)
    daemon.create_run("own", world_size=2, mode="auto", spec=tmp_path / "spec.textproto")

    def closed():
        got = incidents(daemon, "own")
        return got if got and all(i.get("state") in ("CLOSED", "ABORTED") for i in got) else None
    try:
        wait_until(closed, timeout=900, interval=1.0, what="closed incidents of own")
    except AssertionError:
        raise AssertionError(f"incidents: {incidents(daemon, 'own')}\nrank 0 log tail:\n"
                             f"{rank_log(daemon, 'own', 0)[-3000:]}\ndaemon log tail:\n"
                             f"{daemon.log()[-3000:]}")
    got = incidents(daemon, "own")
    assert len(got) == 1, got
    inc = daemon.spikectl_json("incidents", "show", str(got[0]["id"]))
    cost = inc.get("cost", {})
    print(f"[figures] own dataset: verdict {inc.get('verdict')}, probes {cost.get('probes', 0)}, "
          f"steps re-executed {cost.get('steps_reexecuted', 0)}")
    assert inc["verdict"] == "DATA", inc.get("note")
    assert [int(x) for x in inc.get("culprit_positions", [])] == [position], inc.get("note")
    named = sorted({(d["domain"], int(d["document_id"])) for d in inc.get("documents", [])})
    assert named == sorted(("data", i) for i in bad), inc.get("note")
    kinds = [p["kind"] for p in inc["probes"]]
    assert "bisect" in kinds, kinds
    # Both ranks took part in every probe generation.
    for p in inc["probes"]:
        records = daemon.telemetry("own", gen=int(p["generation"]), limit=5)
        assert records and all(int(r.get("ranks_reported", 0)) == 2 for r in records), p
