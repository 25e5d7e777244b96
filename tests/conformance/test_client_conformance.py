"""One conformance suite for both worker clients: the C++ WorkerClient
(worker/client/worker_client.h) and the Python spikeguard.Client
(worker/python/spikeguard/client.py) run the same scenarios against a real
spikeguardd on loopback (tests/python/conftest.py starts it, with TLS and a
token, on a real SQLite catalog), and must behave alike: the delivery rules
of docs/ARCHITECTURE.md (the wire contract).

Each client sits behind a thin driver process that speaks one line protocol:
client_driver (C++, built from client_driver.cc) and client_driver.py. One
JSON object per line on stdin, one JSON answer per line on stdout, "ok"
always present ("error", and "reason" when the daemon refused the rank, when
not ok). StepReports and Commands travel as protobuf JSON.

  {"op": "defaults"}                       -> the client's default options
  {"op": "start", "address", "run", "rank", "world_size", "generation",
   "options": {max_batch_reports, flush_interval, heartbeat_interval,
               initial_backoff, max_backoff, max_queued_reports,
               close_grace (seconds)}, "timeout_s"}
                                           -> waits for the Welcome
  {"op": "report", "reports": [...]}       -> {"reported": n}
  {"op": "report_async", "reports": [...], "interval_s"}
  {"op": "progress"}                       -> {"reported": n, "done": bool}
  {"op": "flush", "timeout_s"}
  {"op": "stats"}                          -> acked, duplicate, rejected,
       already_committed, batches_sent, heartbeats_sent, connects, connected,
       last_ack_message
  {"op": "poll_command", "timeout_s"}      -> {"command": {...} or null}
  {"op": "command_result", "id", "ok", "message", "step"}
  {"op": "checkpoint_saved", "step", "uri", "data_position"}
  {"op": "checkpoint_deleted", "step", "uri"}
  {"op": "generation_ended", "generation", "last_step", "reason"}
  {"op": "await_checkpoint_answers", "timeout_s"}  -> ok: all answered
  {"op": "take_pins"}                      -> {"pins": [...] or null}
  {"op": "close"}
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))

from conftest import BUILD_DIR, PYTHON, PYTHON_DIR, daemon, wait_until  # noqa: E402,F401
from google.protobuf import json_format  # noqa: E402
from test_client import step_report  # noqa: E402

CPP_DRIVER = BUILD_DIR / "tests" / "conformance" / "client_driver"
PY_DRIVER = HERE / "client_driver.py"
KINDS = ["cpp", "python"]

# Short intervals, so that the scenarios take seconds.
FAST = {"max_batch_reports": 16, "flush_interval": 0.01, "initial_backoff": 0.05,
        "max_backoff": 0.2, "close_grace": 1.0}


class Driver:
    """One client behind its driver process; calling it sends one request."""

    def __init__(self, kind: str, log_dir: Path, n: int):
        if kind == "cpp":
            if not CPP_DRIVER.exists():
                pytest.skip(f"{CPP_DRIVER} is not built")
            argv = [str(CPP_DRIVER)]
        else:
            argv = [PYTHON, str(PY_DRIVER)]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(PYTHON_DIR)
        self.kind = kind
        self.err_path = log_dir / f"driver-{kind}-{n}.err"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def __call__(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        wait = args.get("timeout_s", 0) + 20
        try:
            line = self.lines.get(timeout=wait)
        except queue.Empty:
            raise AssertionError(f"{self.kind} driver: no answer to {op} within {wait} s; "
                                 f"stderr:\n{self.stderr()}") from None
        if not line:
            raise AssertionError(f"{self.kind} driver exited during {op}:\n{self.stderr()}")
        return json.loads(line)

    def start(self, daemon, run: str, timeout_s: float = 20, **options) -> dict:
        return self("start", address=daemon.address, run=run, options={**FAST, **options},
                    timeout_s=timeout_s)

    def report(self, steps, **kw) -> dict:
        return self("report", reports=reports(steps, **kw))

    def stats(self) -> dict:
        return self("stats")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")[-4000:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self("close")
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def reports(steps, layers: int = 2, **fields):
    out = []
    for s in steps:
        r = step_report(s, layers=layers)
        for k, v in fields.items():
            setattr(r, k, v)
        out.append(json_format.MessageToDict(r))
    return out


@pytest.fixture(params=KINDS)
def client(request, tmp_path):
    """Makes clients of one kind (the test runs once per kind)."""
    made = []

    def make() -> Driver:
        d = Driver(request.param, tmp_path, len(made))
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def stored_steps(daemon, run: str):
    return [int(r["step"]) for r in daemon.telemetry(run, gen=0)]


def test_both_clients_have_the_same_defaults(tmp_path):
    drivers = [Driver(kind, tmp_path, 0) for kind in KINDS]
    try:
        cpp, py = [d("defaults") for d in drivers]
    finally:
        for d in drivers:
            d.close()
    assert cpp == py
    assert cpp == {"ok": True, "max_batch_reports": 64, "flush_interval_s": 0.05,
                   "heartbeat_interval_s": 1.0, "initial_backoff_s": 0.1, "max_backoff_s": 2.0,
                   "max_queued_reports": 10000, "close_grace_s": 2.0,
                   "welcome_timeout_s": 60.0, "flush_timeout_s": 30.0}


def test_kill9_mid_stream_every_report_is_acknowledged_once_and_stored_once(daemon, client):
    daemon.create_run("crash")
    c = client()
    assert c.start(daemon, "crash")["ok"]
    steps = 400
    assert c("report_async", reports=reports(range(steps)), interval_s=0.002)["ok"]
    wait_until(lambda: c.stats()["acked"] >= 100, timeout=20, what="the first acknowledgements")
    daemon.kill9()
    wait_until(lambda: not c.stats()["connected"], timeout=10, what="the client to notice")
    time.sleep(0.2)  # reports pile up unacknowledged while the client retries
    daemon.start()
    wait_until(lambda: c("progress")["done"], timeout=30, what="the reports to be queued")
    assert c("flush", timeout_s=30)["ok"]
    s = c.stats()
    assert s["connects"] >= 2 and s["rejected"] == 0
    # Every report answered exactly once: stored by a daemon, or found stored
    # (its ack died with the first daemon) and dropped by the client or by
    # the daemon as a duplicate.
    assert s["acked"] + s["duplicate"] + s["already_committed"] == steps, s
    assert stored_steps(daemon, "crash") == list(range(steps)), "a step is missing or doubled"
    records = daemon.telemetry("crash", gen=0)
    assert all(r["ranks_reported"] == 1 for r in records)
    assert records[321]["loss"] == pytest.approx(step_report(321).loss, rel=1e-12)


def test_backpressure_blocks_report_while_the_daemon_is_away_then_drains(daemon, client):
    daemon.create_run("full")
    c = client()
    assert c.start(daemon, "full", max_queued_reports=5, max_batch_reports=1)["ok"]
    daemon.kill9()
    wait_until(lambda: not c.stats()["connected"], timeout=10, what="the client to notice")
    assert c("report_async", reports=reports(range(12)))["ok"]
    # Five reports fit; the sixth waits for the daemon.
    wait_until(lambda: c("progress")["reported"] >= 5, timeout=10, what="five reports")
    time.sleep(0.3)
    assert c("progress") == {"ok": True, "reported": 5, "done": False}
    flush = c("flush", timeout_s=0.2)
    assert not flush["ok"] and "5 reports still unacknowledged" in flush["error"]
    daemon.start()
    wait_until(lambda: c("progress")["done"], timeout=20,
               what="report() to unblock after the daemon came back")
    assert c("flush", timeout_s=20)["ok"]
    assert stored_steps(daemon, "full") == list(range(12))
    s = c.stats()
    assert s["acked"] + s["duplicate"] + s["already_committed"] == 12


def test_refused_reports_say_why_and_the_stream_goes_on(daemon, client):
    daemon.create_run("refused")
    c = client()
    # A batch stays open for a second: the reports of one call share it.
    assert c.start(daemon, "refused", flush_interval=1.0)["ok"]
    assert c.report(range(5))["ok"] and c("flush")["ok"]
    # An invalid report: its batch is refused with the daemon's reason.
    assert c.report([5], tokens=-1)["ok"] and c("flush")["ok"]
    s = c.stats()
    assert s["rejected"] == 1
    assert "tokens: -1 is negative" in s["last_ack_message"]
    # The stream goes on: later reports are stored. An earlier step among
    # them is a duplicate, and costs the reports around it nothing.
    assert c.report([6, 7, 8, 9, 10, 11, 8, 12])["ok"] and c("flush")["ok"]
    s = c.stats()
    assert s["rejected"] == 1 and s["duplicate"] == 1 and s["acked"] == 12, s
    assert s["connects"] == 1 and s["connected"] and "reason" not in s
    assert stored_steps(daemon, "refused") == [0, 1, 2, 3, 4] + list(range(6, 13))


def test_a_batch_size_above_the_daemons_limit_is_cut_to_it(daemon, client):
    daemon.create_run("big")
    c = client()
    # The daemon refuses a batch of more than 4096 reports.
    assert c.start(daemon, "big", max_batch_reports=5000, flush_interval=30.0)["ok"]
    assert c.report(range(5000), layers=0)["ok"]
    assert c("flush", timeout_s=30)["ok"]
    s = c.stats()
    assert s["rejected"] == 0 and s["acked"] == 5000, s
    assert s["batches_sent"] == 2  # 4096 + 904
    assert len(daemon.telemetry("big", gen=0)) == 5000


def test_heartbeats_go_only_when_no_batch_went_for_the_interval(daemon, client):
    daemon.create_run("alive")
    c = client()
    assert c.start(daemon, "alive", heartbeat_interval=0.5)["ok"]
    # A report every 0.05 s, each its own batch: two seconds of steady
    # reporting, no silence a heartbeat would fill (one is allowed for a
    # stall of this machine).
    assert c("report_async", reports=reports(range(40)), interval_s=0.05)["ok"]
    wait_until(lambda: c("progress")["done"], timeout=30, what="the reports to be queued")
    assert c("flush", timeout_s=20)["ok"]
    s = c.stats()
    assert s["batches_sent"] >= 20 and s["heartbeats_sent"] <= 1, s
    # Silent for 1.8 s: a heartbeat each 0.5 s.
    time.sleep(1.8)
    idle = c.stats()["heartbeats_sent"] - s["heartbeats_sent"]
    assert 2 <= idle <= 4, idle
    assert stored_steps(daemon, "alive") == list(range(40))


def test_a_rejected_rank_is_told_why_and_stays_stopped(daemon, client):
    c = client()
    started = c.start(daemon, "no-such-run")
    assert not started["ok"]
    assert started["reason"] == "UNKNOWN_RUN" and "no-such-run" in started["error"]
    reported = c.report([0])
    assert not reported["ok"] and reported["reason"] == "UNKNOWN_RUN"
    flushed = c("flush", timeout_s=1)
    assert not flushed["ok"] and flushed["reason"] == "UNKNOWN_RUN"
    assert "UNKNOWN_RUN" in flushed["error"]
    s = c.stats()
    assert s["connects"] == 0 and not s["connected"]


def test_a_command_is_handed_out_once_and_not_again_after_its_result(daemon, client):
    daemon.create_run("cmds")
    c = client()
    assert c.start(daemon, "cmds")["ok"]
    out = daemon.spikectl("pause", "--run=cmds", check=True).stdout
    first = c("poll_command", timeout_s=20)["command"]
    assert first is not None and first["kind"] == "PAUSE" and first["id"] in out
    assert c("poll_command", timeout_s=0.3)["command"] is None  # once on a stream
    # No result yet: after a restart the daemon hands it out again, same id.
    daemon.kill9()
    daemon.start()
    again = c("poll_command", timeout_s=20)["command"]
    assert again is not None and again["id"] == first["id"]
    assert daemon.command_state(first["id"]) == "sent"
    assert c("command_result", id=again["id"], ok=True, message="paused", step=0)["ok"]
    assert c("flush", timeout_s=20)["ok"]
    wait_until(lambda: daemon.command_state(first["id"]) == "acked", timeout=10,
               what="the daemon to record the command result")
    # Its result stored, the command is not sent again after a reconnect.
    connects = c.stats()["connects"]
    daemon.kill9()
    daemon.start()
    wait_until(lambda: c.stats()["connects"] > connects and c.stats()["connected"], timeout=20,
               what="a reconnect")
    assert c("poll_command", timeout_s=1.0)["command"] is None


def test_notices_queued_during_an_outage_arrive_after_it(daemon, client):
    daemon.create_run("late")
    uri = (daemon.data_dir / "runs" / "late" / "step10.pt").as_uri()
    c = client()
    assert c.start(daemon, "late")["ok"]
    assert c.report(range(12))["ok"] and c("flush")["ok"]
    daemon.kill9()
    wait_until(lambda: not c.stats()["connected"], timeout=10, what="the client to notice")
    assert c("checkpoint_saved", step=10, uri=uri, data_position=11)["ok"]
    assert c("generation_ended", generation=0, last_step=11, reason="end of schedule")["ok"]
    daemon.start()
    assert c("flush", timeout_s=20)["ok"]
    wait_until(lambda: c("take_pins")["pins"] is not None, timeout=10,
               what="the answer to the notice")
    assert [(int(x["step"]), x["uri"]) for x in daemon.checkpoints("late")] == [(10, uri)]
    wait_until(lambda: "generation 0 ended at step 11" in daemon.log(), timeout=10,
               what="the end of the generation")


def test_recent_notices_are_sent_again_after_a_reconnect(daemon, client):
    daemon.create_run("notices")
    uris = {s: (daemon.data_dir / "runs" / "notices" / f"step{s}.pt").as_uri() for s in (5, 10)}
    c = client()
    assert c.start(daemon, "notices")["ok"]
    assert c.report(range(6))["ok"]
    assert c("checkpoint_saved", step=5, uri=uris[5], data_position=6)["ok"]
    assert c.report(range(6, 12))["ok"]
    assert c("checkpoint_saved", step=10, uri=uris[10], data_position=11)["ok"]
    assert c("checkpoint_deleted", step=5, uri=uris[5])["ok"]
    assert c("generation_ended", generation=0, last_step=11, reason="end of schedule")["ok"]
    assert c("flush", timeout_s=20)["ok"]
    wait_until(lambda: "generation 0 ended at step 11" in daemon.log(), timeout=10,
               what="the end of the generation")
    # Each checkpoint notice is answered with the run's pins (whatever the
    # rolling pin keeps), handed over once.
    assert c("await_checkpoint_answers", timeout_s=10)["ok"]
    assert c("take_pins")["pins"] is not None
    assert c("take_pins")["pins"] is None
    daemon.kill9()
    daemon.start()  # a new process: its log starts empty
    # The daemon answers the checkpoint notice sent again (the test sends
    # none), and logs the end of the generation again; the deleted
    # checkpoint stays deleted.
    wait_until(lambda: c("take_pins")["pins"] is not None, timeout=20,
               what="the answer to a notice sent again")
    wait_until(lambda: "generation 0 ended at step 11" in daemon.log(), timeout=10,
               what="the end of the generation, sent again")
    assert c.stats()["connects"] >= 2
    assert [int(x["step"]) for x in daemon.checkpoints("notices")] == [10]
