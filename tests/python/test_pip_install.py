"""`pip install ./worker/python` into a venv that sees Debian's packages
(python3 -m venv --system-site-packages), offline (--no-index): the installed
package imports without PYTHONPATH, carries the wire contract's stubs and the
corpus binding, and its binding gives the same data order as the build's."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SPIKEGUARD_BUILD_DIR", REPO / "build"))
PYTHON = os.environ.get("SPIKEGUARD_PYTHON", "/usr/bin/python3")
WORKER = BUILD / "worker" / "spikeguard-worker"

# What a user's script does with the package; prints what the test compares.
PROBE = r"""
import json, sys
import spikeguard, spikeguard._corpus
from spikeguard import Client
from spikeguard.v1 import worker_pb2, worker_pb2_grpc, supervisor_pb2_grpc
from spikeguard.data import Corpus, DataOrder, Plan
order = DataOrder(Corpus.open(sys.argv[1]), plan="0-20,25-")
steps = {s: [order.position_for_step(s), order.documents_at(order.position_for_step(s))]
         for s in (0, 19, 20, 21, 40)}
plan = Plan("0-70,80-;drop=75:1")
print(json.dumps({"package": spikeguard.__file__, "binding": spikeguard._corpus.__file__,
                  "steps": steps, "checkpoint_position": plan.checkpoint_position(71),
                  "service": hasattr(worker_pb2_grpc, "WorkerServiceStub")}))
"""


def _clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SPIKEGUARD_"))}
    env["PIP_NO_INPUT"] = "1"
    return env


@pytest.mark.skipif(not WORKER.exists(), reason="needs the build's spikeguard-worker")
def test_pip_installs_the_package_offline_into_a_venv_with_the_same_data_order(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-index",
                          str(REPO / "worker" / "python")],
                         env=_clean_env(), capture_output=True, text=True, timeout=1200)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]

    corpus = tmp_path / "corpus"
    subprocess.run([str(WORKER), "corpus", "synth", "--out", str(corpus), "--seed", "5",
                    "--positions", "60"], check=True, capture_output=True)
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    # Installed: no PYTHONPATH, run from elsewhere than the repo.
    inst = subprocess.run([str(venv / "bin" / "python"), str(probe), str(corpus)],
                          env=_clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert inst.returncode == 0, inst.stderr[-3000:]
    got = json.loads(inst.stdout)
    site = str(venv / "lib")
    assert got["package"].startswith(site) and got["binding"].startswith(site), got
    assert got["service"], "the gRPC stubs were not generated into the package"
    # The build tree's package (CMake) computes the same.
    env = dict(_clean_env(), PYTHONPATH=str(BUILD / "python"))
    built = subprocess.run([PYTHON, str(probe), str(corpus)], env=env, cwd=tmp_path,
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    want = json.loads(built.stdout)
    assert got["steps"] == want["steps"]
    assert got["steps"]["20"][0] == 25, "the plan's hole moved step 20 to position 25"
    assert got["checkpoint_position"] == want["checkpoint_position"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
