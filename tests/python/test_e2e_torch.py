"""The PyTorch trainer taken end to end to a verdict: a real spikeguardd on
its SQLite catalog launches two torch.distributed (gloo) ranks of
worker/examples/torch_gpt/train.py from a run spec, they report through
spikeguard.Client, and the incident engine rewinds them in place (rank 0's
commands broadcast to both), classifies and fixes.

    DATA       a batch of bytes the model never saw -> the culprit batch found
               by bisection, exactly its documents named and quarantined
    FRAGILITY  a high lr with no QK-norm -> lr fix verified, the run finishes
    kill -9    one rank killed mid-run -> both restarted from the newest
               checkpoint of the generation, no step stored twice
    clean      no incident

Each test prints a `[figures]` line (probes, steps re-executed, seconds to
verdict) for the closing note.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import PYTHON, PYTHON_DIR, REPO, SPIKEGUARD_WORKER, Daemon, wait_until

TRAIN = REPO / "worker" / "examples" / "torch_gpt" / "train.py"

# The probe policy of the C++ end-to-end tests (tests/e2e/probe_policy.h).
POLICY = """
probe {
  min_steps_before_onset: 50
  max_steps_before_onset: 500
  replay_steps_past_onset: 5
  skip_before: 2
  skip_after: 2
  skip_horizon: 100
}
fix { verify_steps: 100 }
"""


def synth(directory: Path, seed: int, poisons: List[str]) -> Dict[int, List[str]]:
    """Synthesizes a corpus; returns position -> the poison's documents."""
    argv = [str(SPIKEGUARD_WORKER), "corpus", "synth", "--out", str(directory), "--seed", str(seed)]
    for p in poisons:
        argv += ["--poison", p]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    placed: Dict[int, List[str]] = {}
    for line in out.splitlines():
        if line.startswith("poison "):
            head, docs = line.split(":", 1)
            placed[int(head.split()[-1])] = docs.split()
    return placed


def profiles(tmp: Path) -> Path:
    """The launch profile the daemon starts the trainer from (it executes
    nothing a run spec sends): the trainer with the test's options as the
    "flags" parameter "args", checkpoints and corpora confined to `tmp`."""
    argv = [PYTHON, str(TRAIN), "--corpus={corpus}", f"--checkpoint-dir={tmp / 'ckpt'}",
            "--addr={addr}", "--run={run}", "--generation={generation}", "--resume={resume}",
            "--plan={plan}", "--threads=1", "{args}"]
    text = 'profile {\n  name: "torch-gpt"\n'
    text += "".join(f"  argv: {json.dumps(a)}\n" for a in argv)
    for name in ("PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "USER",
                 "OMP_NUM_THREADS", "MKL_NUM_THREADS", "VIRTUAL_ENV"):
        text += f'  env_allow: "{name}"\n'
    text += f'  env {{ key: "PYTHONPATH" value: {json.dumps(str(PYTHON_DIR))} }}\n'
    text += f"  checkpoint_root: {json.dumps(str(tmp))}\n"
    text += f"  corpus_root: {json.dumps(str(tmp))}\n"
    text += "  max_world_size: 4\n"
    text += f'  param {{ name: "corpus" path {{ root: {json.dumps(str(tmp))} }} }}\n'
    text += ('  param { name: "args" flags { allow: "steps" allow: "checkpoint-every" '
             'allow: "linger-s" allow: "report-documents" allow: "lr" allow: "warmup" '
             'allow: "beta2" } default_value: "" }\n')
    text += "}\n"
    path = tmp / "profiles.textproto"
    path.write_text(text)
    return path


@pytest.fixture
def daemon(tmp_path):
    """A running spikeguardd with the trainer's launch profile."""
    d = Daemon(tmp_path / "daemon", [f"--launch-profiles={profiles(tmp_path)}"])
    d.start()
    try:
        yield d
    finally:
        if d.running:
            d.stop()


def flags(args: List[str]) -> str:
    """["--steps", "300", "--report-documents"] -> "--steps=300 --report-documents"."""
    items, i = [], 0
    while i < len(args):
        item = args[i]
        if item.startswith("--") and "=" not in item and i + 1 < len(args) \
                and not args[i + 1].startswith("--"):
            item, i = f"{item}={args[i + 1]}", i + 1
        items.append(item)
        i += 1
    return " ".join(items)


def launch(daemon, tmp: Path, run: str, corpus: Path, args: List[str], policy: str = POLICY,
           world_size: int = 2, manifest: bool = True) -> None:
    """Sets the policy and creates the run: the daemon launches the ranks
    from the "torch-gpt" profile."""
    (tmp / "policy.textproto").write_text(policy)
    daemon.spikectl("policy", "set", "--file", str(tmp / "policy.textproto"), check=True)
    spec = 'profile: "torch-gpt"\n'
    spec += f'params {{ key: "corpus" value: {json.dumps(str(corpus))} }}\n'
    spec += f'params {{ key: "args" value: {json.dumps(flags(args))} }}\n'
    spec += "restart_all_ranks: true\n"
    if manifest:
        spec += f"manifest {{ corpus_dir: {json.dumps(str(corpus))} }}\n"
    (tmp / "spec.textproto").write_text(spec)
    daemon.create_run(run, world_size=world_size, mode="auto", spec=tmp / "spec.textproto")


def rank_log(daemon, run: str, rank: int) -> str:
    path = daemon.data_dir / "runs" / run / f"rank-{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def incidents(daemon, run: str) -> List[Dict]:
    return daemon.spikectl_json("incidents", "list", "--run", run).get("incidents", [])


def settle(daemon, run: str, timeout: float) -> List[Dict]:
    """Waits until the run has incidents and all are closed (then 3 s more,
    so that an incident a probe would wrongly open shows up)."""
    def closed():
        got = incidents(daemon, run)
        return got if got and all(i.get("state") in ("CLOSED", "ABORTED") for i in got) else None
    try:
        wait_until(closed, timeout=timeout, interval=1.0, what=f"closed incidents of {run}")
    except AssertionError:
        raise AssertionError(f"incidents: {incidents(daemon, run)}\nrank 0 log tail:\n"
                             f"{rank_log(daemon, run, 0)[-3000:]}\ndaemon log tail:\n"
                             f"{daemon.log()[-3000:]}")
    time.sleep(3)
    return incidents(daemon, run)


def show(daemon, incident_id) -> Dict:
    return daemon.spikectl_json("incidents", "show", str(incident_id))


def figures(name: str, inc: Dict) -> None:
    verdict_ms = next((int(e["unix_ms"]) for e in inc.get("events", []) if e.get("kind") == "verdict"), 0)
    opened = int(inc.get("opened_unix_ms", 0))
    cost = inc.get("cost", {})
    print(f"[figures] torch {name}: verdict {inc.get('verdict')}, probes {cost.get('probes', 0)}, "
          f"steps re-executed {cost.get('steps_reexecuted', 0)}, seconds to verdict "
          f"{(verdict_ms - opened) / 1000.0 if verdict_ms else -1:.1f}, seconds to close "
          f"{cost.get('wall_time_s', 0)}")


def named(inc: Dict) -> List[str]:
    return sorted({f"{d['domain']}:{d['document_id']}" for d in inc.get("documents", [])})


def run_state(daemon, run: str) -> str:
    """The run's state as spikectl's text shows it ("finished"); its JSON
    carries the RunState enumerator ("RUN_FINISHED")."""
    state = daemon.spikectl_json("runs", "show", run).get("state", "")
    return state.removeprefix("RUN_").lower()


def test_data_poison_is_data_with_its_documents(daemon, tmp_path):
    placed = synth(tmp_path / "corpus", 23, ["highbytes@160"])
    launch(daemon, tmp_path, "tdata", tmp_path / "corpus",
           ["--steps", "300", "--checkpoint-every", "50", "--linger-s", "120"])
    got = settle(daemon, "tdata", timeout=600)
    assert len(got) == 1, got
    inc = show(daemon, got[0]["id"])
    figures("data", inc)
    assert inc["verdict"] == "DATA", inc.get("note")
    assert [int(x) for x in inc.get("culprit_positions", [])] == [160]
    assert named(inc) == sorted(placed[160])
    quarantined = daemon.spikectl_json("quarantine", "list", "--run", "tdata").get("entries", [])
    assert sorted(f"{e['domain']}:{e['document_id']}" for e in quarantined) == sorted(placed[160])
    kinds = [p["kind"] for p in inc["probes"]]
    assert kinds[:2] == ["replay", "skip"] and "bisect" in kinds, kinds
    # Two ranks replayed the same batches bit-exactly: no non-determinism.
    assert not any(e.get("kind") == "nondeterminism" for e in inc.get("events", [])), inc["note"]
    # Both ranks acted on every command: each probe generation has two ranks.
    for p in inc["probes"]:
        records = daemon.telemetry("tdata", gen=int(p["generation"]), limit=5)
        assert records and all(int(r.get("ranks_reported", 0)) == 2 for r in records), p


def test_documents_reported_by_the_trainer_are_named_without_a_manifest(daemon, tmp_path):
    """A user's own dataset: the run has no manifest, the trainer reports
    each step's documents, and the daemon names the culprit's from those."""
    placed = synth(tmp_path / "corpus", 37, ["highbytes@130"])
    launch(daemon, tmp_path, "tdocs", tmp_path / "corpus",
           ["--steps", "240", "--checkpoint-every", "50", "--linger-s", "60",
            "--report-documents"], manifest=False)
    got = settle(daemon, "tdocs", timeout=600)
    assert len(got) == 1, got
    inc = show(daemon, got[0]["id"])
    figures("data, documents reported", inc)
    assert inc["verdict"] == "DATA", inc.get("note")
    assert [int(x) for x in inc.get("culprit_positions", [])] == [130]
    assert named(inc) == sorted(placed[130])
    # The trainer's reports resolve the original generation's step 130; the
    # run's current generation went on with a hole there, so its step 130 is
    # another batch.
    def docs_at_130(*gen):
        resolved = daemon.spikectl_json("manifest", "--run", "tdocs", "--from", "130", "--to",
                                        "130", *gen)
        return sorted(f"{d['domain']}:{d['document_id']}" for s in resolved["steps"]
                      for d in s.get("documents", []))
    assert docs_at_130("--gen", "0") == sorted(placed[130])
    assert not set(docs_at_130()) & set(placed[130])


def test_clean_run_has_no_incident(daemon, tmp_path):
    synth(tmp_path / "corpus", 29, [])
    launch(daemon, tmp_path, "tclean", tmp_path / "corpus",
           ["--steps", "160", "--checkpoint-every", "50", "--linger-s", "1"])
    wait_until(lambda: run_state(daemon, "tclean") == "finished", timeout=300, interval=1.0,
               what="the clean run to finish")
    assert incidents(daemon, "tclean") == []
    records = daemon.telemetry("tclean", gen=0)
    assert len(records) == 160
    assert all(int(r.get("ranks_reported", 0)) == 2 for r in records)


def pids_of_rank(run: str, rank: int) -> List[int]:
    """Processes the launcher started for (run, rank), by their environment."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SPIKEGUARD_RUN={run}".encode() in env and f"RANK={rank}".encode() in env:
            out.append(int(entry.name))
    return out


def test_kill9_of_one_rank_restarts_both_from_the_newest_checkpoint(daemon, tmp_path):
    synth(tmp_path / "corpus", 31, [])
    launch(daemon, tmp_path, "tkill", tmp_path / "corpus",
           ["--steps", "220", "--checkpoint-every", "50", "--linger-s", "1"])
    # Past the checkpoint at step 100, short of the next.
    wait_until(lambda: len(daemon.telemetry("tkill", gen=0)) >= 120, timeout=300, interval=0.5,
               what="step 120")
    victims = pids_of_rank("tkill", 1)
    assert victims, "rank 1 not found"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: run_state(daemon, "tkill") == "finished", timeout=400, interval=1.0,
               what="the run to finish after the kill")
    records = daemon.telemetry("tkill", gen=0)
    steps = [int(r.get("step", 0)) for r in records]
    assert steps == list(range(220)), "every step once"
    assert all(int(r.get("ranks_reported", 0)) == 2 for r in records), \
        [r for r in records if int(r.get("ranks_reported", 0)) != 2][:3]
    # Both ranks were started again, from the newest checkpoint (step 100).
    for rank in (0, 1):
        log = rank_log(daemon, "tkill", rank)
        assert "g000000-step-000000100.pt" in log and "loaded checkpoint" in log, log[-2000:]
    assert "restart all of them together" in daemon.log()
    assert incidents(daemon, "tkill") == []


# Fragile settings (measured on this model, two ranks): no QK-norm, no
# clipping, lr 2e-2 after a 50-step warmup, β2 0.999. Max attention logits
# climb from ~0.3 to ~1e3 by step 100 (the precursor fires near step 90) and
# the grad norm spikes ×8 at step 260. Retention keeps 3 checkpoints (every
# 25 steps), so the probes start at step 200: the lr fix alone (rung 1)
# spikes again; rung 2 (lr×0.7, +200 warmup, clip 0.5) holds through the
# verification (step 360). The model stays fragile: trained on, it spikes
# again at step 384 (FRAGILITY again, lr×0.49 from step 325), and a batch of
# bytes it never saw sits at position 540.
FRAGILE = ["--lr", "2e-2", "--warmup", "50", "--beta2", "0.999", "--checkpoint-every", "25"]
LONG_STEPS = 640
LATE_POISON = 540


def test_a_fragile_run_is_fixed_and_trains_on_through_later_incidents(daemon, tmp_path):
    """A run's life on the PyTorch trainer: a FRAGILITY fix changes the
    trajectory, the run trains on through another fragility episode and a
    later DATA incident, whose probes start on the fixed line (after the
    fix's branch step: from an older checkpoint they would replay with the
    fix's hparams where the run did not and differ at once), and reaches the
    end of its schedule."""
    placed = synth(tmp_path / "corpus", 7, [f"highbytes@{LATE_POISON}"])
    launch(daemon, tmp_path, "tfrag", tmp_path / "corpus",
           FRAGILE + ["--steps", str(LONG_STEPS), "--linger-s", "30"])
    wait_until(lambda: run_state(daemon, "tfrag") in ("finished", "paused", "failed"),
               timeout=2400, interval=2.0, what="the fragile run to end")
    got = settle(daemon, "tfrag", timeout=300)
    shown = sorted((show(daemon, g["id"]) for g in got), key=lambda i: int(i["onset_step"]))
    for inc in shown:
        figures(f"long run, {inc['verdict']} at step {inc['onset_step']}", inc)
    summary = [(i["verdict"], int(i["onset_step"]), i.get("note", "")) for i in shown]
    assert run_state(daemon, "tfrag") == "finished", summary

    first = shown[0]
    assert first["verdict"] == "FRAGILITY", summary
    assert first.get("precursor") == "max_attn_logit", first.get("precursor")
    kinds = [f"{p['kind']}:{p.get('outcome')}" for p in first["probes"]]
    assert kinds[:2] == ["replay:spiked", "skip:spiked"], kinds
    assert "lr" in first.get("fix", ""), first.get("fix")
    assert any("qk" in r.lower() for r in first.get("recommendations", [])), \
        first.get("recommendations")

    data = [i for i in shown if i["verdict"] == "DATA"]
    assert len(data) == 1, summary
    assert [int(x) for x in data[0].get("culprit_positions", [])] == [LATE_POISON], summary
    assert named(data[0]) == sorted(placed[LATE_POISON])
    assert int(data[0]["onset_step"]) > int(first["onset_step"])
    # Every other incident is the model's fragility, each fixed by a fix
    # probe that stayed clean through its verification.
    for inc in shown:
        assert inc["verdict"] in ("FRAGILITY", "DATA"), summary
        if inc["verdict"] == "FRAGILITY":
            last = inc["probes"][-1]
            assert f"{last['kind']}:{last.get('outcome')}" == "fix:clean", summary
        # Each incident's probes replayed the run's own line bit-exactly.
        assert not any(e.get("kind") == "nondeterminism" for e in inc.get("events", [])), \
            inc.get("note")
