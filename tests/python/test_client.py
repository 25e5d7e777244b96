"""spikeguard.Client against a real spikeguardd: what a trainer notices.

Reports arrive and are stored once, also across a kill -9 of the daemon;
refusals are final and say why; a full queue blocks report() and says so;
commands reach the training loop with their ids; checkpoints are registered;
the interpreter exits cleanly with a client still open.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import textwrap
import threading
import time

import pytest

from conftest import PYTHON, PYTHON_DIR, free_port, wait_until
from spikeguard import Client, Rejected
from spikeguard.client import Unauthorized
from spikeguard.v1 import telemetry_pb2, worker_pb2


def step_report(step: int, rank: int = 0, layers: int = 2) -> telemetry_pb2.StepReport:
    r = telemetry_pb2.StepReport(
        step=step, data_position=step, loss=2.0 + 0.001 * step + 0.0001 * rank,
        grad_norm=1.0 + 0.01 * step, lr=3e-4, tokens=1024, step_time_s=0.01,
        loss_hash=(step * 2654435761 + rank) % (1 << 64))
    for layer in range(layers):
        r.layers.add(layer=layer, max_attn_logit=5.0 + layer, grad_norm=0.1 * (layer + 1),
                     update_ratio=1e-3, act_rms=1.0, param_norm=10.0)
    return r


def client(daemon, run: str, **kw) -> Client:
    kw.setdefault("max_backoff", 0.2)
    kw.setdefault("close_grace", 1.0)
    return Client(daemon.address, run, **kw)


def test_report_wakes_the_sender_only_for_a_new_or_sealed_batch():
    """report() into the open batch does not wake the connection thread (it
    waits for nothing a report changes); a report that opens or seals a
    batch does."""
    c = Client("127.0.0.1:1", "r", max_batch_reports=3)
    wakes = []
    real = c._cond.notify_all
    c._cond.notify_all = lambda: (wakes.append(c._open_count), real())
    try:
        for s in range(5):
            c.report(step_report(s))
        # Step 0 opens a batch, step 2 seals it (3 reports), step 3 opens one.
        assert wakes == [1, 0, 1]
        c.report(step_report(2))  # an earlier step: sealed, and a new batch opens
        assert wakes == [1, 0, 1, 1]
    finally:
        c.close()


def test_report_many_seals_its_batch_and_wakes_the_sender_once():
    """A trainer handing over several steps at once wakes the sender once,
    with the batch sealed (not again at flush_interval); a step that does
    not increase still starts a batch of its own."""
    c = Client("127.0.0.1:1", "r", max_batch_reports=64)
    wakes = []
    real = c._cond.notify_all
    c._cond.notify_all = lambda: (wakes.append(len(c._outbox)), real())
    try:
        c.report_many([step_report(s) for s in range(10)])
        assert wakes == [1] and c._open_count == 0
        assert [b.count for b in c._outbox] == [10]
        c.report_many([step_report(10), step_report(11), step_report(11)])
        assert [b.count for b in c._outbox] == [10, 2, 1]
        assert wakes == [1, 3]
    finally:
        c.close()


def test_report_many_goes_out_without_waiting_for_the_flush_timer(daemon):
    daemon.create_run("many")
    # A flush timer of a minute: only report_many's sealing sends these.
    with client(daemon, "many", flush_interval=60.0) as c:
        c.report_many([step_report(s) for s in range(10)])
        wait_until(lambda: c.stats["reports_acked"] == 10, timeout=10)
        assert c.stats["batches_sent"] == 1
        c.report(step_report(10))  # report() still waits for the timer
        time.sleep(0.5)
        assert c.stats["batches_sent"] == 1
        c.flush(timeout=20)
    assert [int(r["step"]) for r in daemon.telemetry("many", gen=0)] == list(range(11))


def _wakeups(native_id: int) -> int:
    """How many times the kernel has run a thread of this process (its
    third schedstat field: timeslices)."""
    with open(f"/proc/self/task/{native_id}/schedstat") as f:
        return int(f.read().split()[2])


def test_an_idle_connection_thread_sleeps_and_still_answers_at_once(daemon):
    """Connected and idle, the thread that reads the daemon's answers does
    not wake ten times a second (grpcio's 0.1 s slices would): on a
    training node's busy cores every wakeup takes a rank's time. Its sleep
    ends at once when an answer arrives."""
    daemon.create_run("idle")
    with client(daemon, "idle", heartbeat_interval=0.5) as c:
        time.sleep(0.5)
        before = _wakeups(c._thread.native_id)
        time.sleep(3.0)
        woke = _wakeups(c._thread.native_id) - before
        assert woke <= 10, f"the connection thread woke {woke} times in 3 s of idling"
        t = time.monotonic()
        c.report_many([step_report(s) for s in range(3)])
        wait_until(lambda: c.stats["reports_acked"] == 3, timeout=10)
        assert time.monotonic() - t < 2.0, "the ack waited for a polling slice"
        assert c.stats["heartbeats_sent"] >= 4  # the stream was alive meanwhile


def _nice_of(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice


def test_nice_lowers_the_client_threads_and_only_them(daemon):
    """Client(nice=) runs the connection thread and the Python threads gRPC
    starts for its stream at that priority; the trainer's thread keeps its
    own, and reports still flow."""
    daemon.create_run("nice")
    mine = _nice_of(threading.get_native_id())
    before = set(os.listdir("/proc/self/task"))
    with client(daemon, "nice", nice=19) as c:
        c.report_many([step_report(s) for s in range(3)])
        wait_until(lambda: c.stats["reports_acked"] == 3, timeout=10)
        started = [int(t) for t in set(os.listdir("/proc/self/task")) - before]
        lowered = [t for t in started if _nice_of(t) == 19]
        assert _nice_of(c._thread.native_id) == 19
        # The connection thread, gRPC's request thread and its channel's
        # polling thread (C-core's own threads are started elsewhere).
        assert len(lowered) >= 3, [(t, _nice_of(t)) for t in started]
        assert _nice_of(threading.get_native_id()) == mine


def test_reports_are_batched_acknowledged_and_stored(daemon):
    daemon.create_run("basic")
    with client(daemon, "basic", max_batch_reports=64, host="trainer-0", device_id=3) as c:
        assert c.connected
        assert c.welcome.run == "basic" and c.welcome.generation == 0
        assert c.welcome.committed_step == -1
        for s in range(300):
            c.report(step_report(s))
            c.set_current_step(s)
        c.flush(timeout=20)
        stats = c.stats
    assert stats["reports_acked"] == 300
    assert stats["reports_duplicate"] == 0 and stats["reports_rejected"] == 0
    assert stats["batches_sent"] >= 5  # at most 64 reports a batch
    assert stats["connects"] == 1

    records = daemon.telemetry("basic", gen=0)
    assert [int(r["step"]) for r in records] == list(range(300))
    assert records[123]["loss"] == pytest.approx(step_report(123).loss)
    assert [layer["layer"] for layer in records[7]["layers"]] == [0, 1]
    shown = daemon.spikectl("runs", "show", "basic", check=True).stdout
    assert "trainer-0" in shown and "299" in shown


def test_kill9_of_the_daemon_mid_stream_stores_every_report_exactly_once(daemon):
    daemon.create_run("crash", world_size=2)
    steps = 600
    clients = [client(daemon, "crash", rank=r, world_size=2, max_batch_reports=16,
                      flush_interval=0.01) for r in range(2)]
    for c in clients:
        c.start(timeout=20)
    killed = threading.Event()
    errors = []

    def train(c: Client, rank: int):
        try:
            for s in range(steps):
                c.report(step_report(s, rank=rank))
                c.set_current_step(s)
                if s == steps // 2:
                    # The second half goes in while the daemon is dead or
                    # coming back.
                    killed.wait(timeout=20)
                time.sleep(0.001)
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(c, r)) for r, c in enumerate(clients)]
    for t in threads:
        t.start()
    wait_until(lambda: all(c.stats["reports_acked"] >= 100 for c in clients), timeout=30,
               what="the first acknowledgements")
    acked_before_kill = [c.stats["reports_acked"] for c in clients]
    daemon.kill9()
    killed.set()
    wait_until(lambda: not any(c.connected for c in clients), timeout=10,
               what="the clients to notice")
    time.sleep(0.3)  # reports pile up unacknowledged, the clients retry
    daemon.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for c in clients:
        c.flush(timeout=30)
    stats = [c.stats for c in clients]
    for c in clients:
        c.close()

    for before, s in zip(acked_before_kill, stats):
        assert s["connects"] >= 2
        assert s["reports_rejected"] == 0
        # Every report was acknowledged once by a daemon, or found committed
        # (its ack died with the first daemon) and not resent.
        assert s["reports_acked"] + s["reports_duplicate"] + s["reports_already_committed"] >= steps
        assert s["reports_acked"] >= before
    records = daemon.telemetry("crash", gen=0)
    assert [int(r["step"]) for r in records] == list(range(steps)), "a step is missing or doubled"
    for r in records:
        # Both ranks merged once each: a report stored twice would count a
        # rank twice (or fold its loss in twice).
        assert r["ranks_reported"] == 2, r
        s = int(r["step"])
        expected = (step_report(s, 0).loss + step_report(s, 1).loss) / 2
        assert r["loss"] == pytest.approx(expected, rel=1e-12), r


def test_unknown_run_is_rejected_for_good_with_a_clear_message(daemon, caplog):
    c = client(daemon, "no-such-run")
    with pytest.raises(Rejected) as info:
        c.start(timeout=20)
    e = info.value
    assert e.reason == "UNKNOWN_RUN"
    assert "no-such-run" in e.message and "spikectl runs create" in e.message
    assert "UNKNOWN_RUN" in str(e) and "no-such-run" in str(e)
    assert c.rejection is not None and c.rejection.reason == worker_pb2.Reject.UNKNOWN_RUN
    assert not c.connected
    # Final: the thread is gone, and the training loop hears it at once.
    wait_until(lambda: not c._thread.is_alive(), timeout=5, what="the client thread to stop")
    with pytest.raises(Rejected):
        c.report(step_report(0))
    with pytest.raises(Rejected):
        c.flush(timeout=1)
    with pytest.raises(Rejected):
        c.start(timeout=1)
    assert "UNKNOWN_RUN" in caplog.text
    c.close()


def test_a_stale_generation_is_fenced_and_a_rewind_switches_generations(daemon, tmp_path):
    """PAUSE and REWIND reach poll_command() with their ids; after a rewind the
    old generation is refused, and the client carries on in the new one."""
    daemon.create_run("cmds")
    # Inside the run's checkpoint root (a run without a launch profile:
    # DATA_DIR/runs/RUN), with the checksum a rewind verifies.
    ckpt = daemon.data_dir / "runs" / "cmds" / "step10.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"weights")
    checksum = hashlib.sha256(b"weights").hexdigest()
    c = client(daemon, "cmds")
    c.start(timeout=20)
    assert c.poll_command() is None
    for s in range(20):
        c.report(step_report(s))
        if s == 10:
            c.checkpoint_saved(10, ckpt.as_uri(), data_position=11, size_bytes=7, checksum=checksum)
    c.flush(timeout=20)
    listed = daemon.checkpoints("cmds")
    assert [(int(x["step"]), x["uri"], x["complete"]) for x in listed] == \
        [(10, ckpt.as_uri(), True)]
    assert listed[0]["checksum"] == checksum and int(listed[0]["data_position"]) == 11

    out = daemon.spikectl("pause", "--run=cmds", check=True).stdout
    pause = c.poll_command(timeout=20)
    assert pause is not None and pause.kind == worker_pb2.Command.PAUSE
    assert pause.id and pause.id in out
    c.command_result(pause.id, True, "paused at step 19", step=19)
    c.flush(timeout=20)
    wait_until(lambda: daemon.command_state(pause.id) == "acked", timeout=10,
               what="the daemon to record the command result")

    out = daemon.spikectl("rewind", "--run=cmds", "--to-step=10", "--stop-after=15",
                          check=True).stdout
    rewind = c.poll_command(timeout=20)
    assert rewind is not None and rewind.kind == worker_pb2.Command.REWIND
    assert rewind.id in out
    assert rewind.new_generation == 1 and rewind.stop_after_step == 15
    assert rewind.checkpoint.uri == ckpt.as_uri() and rewind.checkpoint.step == 10
    assert c.poll_command() is None  # each command handed out once

    # The trainer loads the checkpoint, acknowledges, and adopts generation 1.
    c.command_result(rewind.id, True, "rewound to step 10", step=10)
    c.flush(timeout=20)
    c.report(step_report(20))  # a straggler of generation 0, never acknowledged
    c.set_generation(rewind.new_generation)
    assert c.stats["reports_dropped_stale"] == 1
    wait_until(lambda: c.connected and c.welcome.generation == 1, timeout=20,
               what="the client to reattach in generation 1")
    for s in range(11, 16):
        c.report(step_report(s))
    c.flush(timeout=20)
    assert [int(r["step"]) for r in daemon.telemetry("cmds", gen=1)] == list(range(11, 16))
    assert len(daemon.telemetry("cmds", gen=0)) == 20

    # A zombie rank still in generation 0 does not get in.
    stale = client(daemon, "cmds", generation=0)
    with pytest.raises(Rejected) as info:
        stale.start(timeout=20)
    assert info.value.reason == "STALE_GENERATION"
    assert info.value.current_generation == 1
    assert "generation 0" in info.value.message and "generation 1" in info.value.message
    stale.close()
    c.close()


def test_an_unacknowledged_command_comes_again_after_a_reconnect(daemon):
    daemon.create_run("again")
    c = client(daemon, "again")
    c.start(timeout=20)
    daemon.spikectl("pause", "--run=again", check=True)
    first = c.poll_command(timeout=20)
    assert first is not None
    daemon.kill9()
    daemon.start()
    # No result was sent: the daemon hands it out again, the trainer runs it
    # at most once and answers again.
    again = c.poll_command(timeout=20)
    assert again is not None and again.id == first.id
    assert daemon.command_state(first.id) == "sent"
    c.command_result(again.id, True, "already executed")
    c.flush(timeout=20)
    wait_until(lambda: daemon.command_state(first.id) == "acked", timeout=10,
               what="the daemon to record the command result")
    daemon.kill9()
    daemon.start()
    wait_until(lambda: c.connected, timeout=20, what="a reconnect")
    assert c.poll_command(timeout=0.5) is None  # acknowledged: not sent again
    c.close()


def test_backpressure_blocks_report_and_says_so(daemon, caplog):
    daemon.create_run("full")
    c = client(daemon, "full", max_queued_reports=5, max_batch_reports=1)
    c.start(timeout=20)
    daemon.kill9()
    wait_until(lambda: not c.connected, timeout=10, what="the client to notice")
    done = threading.Event()

    def train():
        for s in range(12):
            c.report(step_report(s))
        done.set()

    caplog.set_level(logging.WARNING, logger="spikeguard.client")
    t = threading.Thread(target=train, daemon=True)
    t.start()
    # Five reports fit; the sixth waits for the daemon.
    wait_until(lambda: c.stats["backpressure_waits"] >= 1, timeout=10, what="backpressure")
    assert not done.wait(timeout=0.3)
    assert c.stats["reports_unacked"] == 5
    warnings = [r for r in caplog.records if "backpressure" in r.getMessage()]
    assert len(warnings) == 1
    assert "max_queued_reports=5" in warnings[0].getMessage()
    assert "not connected" in warnings[0].getMessage()

    daemon.start()
    assert done.wait(timeout=30), "report() stayed blocked after the daemon came back"
    c.flush(timeout=20)
    assert c.stats["backpressure_waits"] >= 1
    assert len([r for r in caplog.records if "backpressure" in r.getMessage()]) == 1  # once
    assert [int(r["step"]) for r in daemon.telemetry("full", gen=0)] == list(range(12))
    c.close()


def test_a_relaunched_rank_does_not_resend_what_the_daemon_committed(daemon):
    daemon.create_run("relaunch")
    with client(daemon, "relaunch") as first:
        for s in range(10):
            first.report(step_report(s))
        first.flush(timeout=20)
    # The relaunched trainer resumes from an older checkpoint and reports
    # steps 5..14 before it is connected; the Welcome says 0..9 are stored.
    second = client(daemon, "relaunch", max_batch_reports=5, resume_step=5)
    for s in range(5, 15):
        second.report(step_report(s))
    welcome = second.start(timeout=20)
    assert welcome.committed_step == 9
    second.flush(timeout=20)
    stats = second.stats
    assert stats["reports_already_committed"] == 5  # the batch of steps 5..9
    assert stats["reports_acked"] == 5 and stats["reports_duplicate"] == 0
    second.close()
    assert [int(r["step"]) for r in daemon.telemetry("relaunch", gen=0)] == list(range(15))


def test_checkpoint_notices_and_the_end_of_a_generation(daemon, tmp_path):
    daemon.create_run("notices")
    c = client(daemon, "notices")
    c.start(timeout=20)
    uris = [(daemon.data_dir / "runs" / "notices" / f"step{s}.pt").as_uri() for s in (5, 10)]
    for s in range(12):
        c.report(step_report(s))
        if s in (5, 10):
            c.checkpoint_saved(s, uris[s // 10], data_position=s + 1)
    c.checkpoint_deleted(5, uris[0])
    c.generation_ended(0, 11, "end of training schedule (steps=12)")
    c.flush(timeout=20)
    wait_until(lambda: "generation 0 ended at step 11" in daemon.log(), timeout=10,
               what="the end of the generation")
    assert [int(x["step"]) for x in daemon.checkpoints("notices")] == [10]
    # A daemon restarted without its catalog's last notices still gets them:
    # recent notices are resent after a reconnect.
    daemon.kill9()
    daemon.start()
    wait_until(lambda: c.connected, timeout=20, what="a reconnect")
    c.flush(timeout=20)
    wait_until(lambda: daemon.log().count("generation 0 ended at step 11") >= 1, timeout=10,
               what="the end of the generation, resent")
    assert [int(x["step"]) for x in daemon.checkpoints("notices")] == [10]
    c.close()


def test_the_answer_to_a_checkpoint_notice_carries_the_pins_retention_keeps(daemon):
    """Each checkpoint_saved is answered with the run's pins: the rolling
    rewind target (at least min_steps_before_onset = 100 steps behind) and
    the checkpoint just saved; take_pins() hands them over once."""
    daemon.create_run("pins")
    c = client(daemon, "pins")
    c.start(timeout=20)
    assert c.take_pins() is None
    uri = {s: (daemon.data_dir / "runs" / "pins" / f"g0-step{s}.pt").as_uri()
           for s in (50, 150)}
    for s in range(151):
        c.report(step_report(s))
        if s == 50:
            c.checkpoint_saved(50, uri[50], data_position=51)
            c.flush(timeout=20)
            wait_until(lambda: c._pins is not None, timeout=10, what="the pins")
            assert c.take_pins() == [uri[50]]  # only the one just saved
            assert c.take_pins() is None
    c.checkpoint_saved(150, uri[150], data_position=151)
    c.flush(timeout=20)
    wait_until(lambda: c._pins is not None, timeout=10, what="the pins")
    assert sorted(c.take_pins()) == sorted([uri[50], uri[150]])
    rolling = [int(x["step"]) for x in daemon.checkpoints("pins")
               if x.get("rolling_pin") or x.get("rollingPin")]
    assert rolling == [50]
    c.close()


def test_flush_times_out_while_the_daemon_is_away(daemon):
    daemon.create_run("away")
    c = client(daemon, "away")
    c.start(timeout=20)
    daemon.kill9()
    c.report(step_report(0))
    with pytest.raises(TimeoutError, match="1 reports still unacknowledged"):
        c.flush(timeout=0.5)
    daemon.start()
    c.flush(timeout=20)
    assert c.stats["reports_acked"] == 1
    c.close()


def test_ranks_that_disagree_on_the_data_order_are_refused(daemon):
    daemon.create_run("order", world_size=2)
    order = worker_pb2.DataOrder(dataset_fingerprint="corpus-abc", seed=7, global_batch_size=8,
                                 sequence_length=64)
    rank0 = client(daemon, "order", rank=0, world_size=2, data_order=order, total_steps=100)
    rank0.start(timeout=20)
    other = worker_pb2.DataOrder()
    other.CopyFrom(order)
    other.seed = 8
    rank1 = client(daemon, "order", rank=1, world_size=2, data_order=other)
    with pytest.raises(Rejected) as info:
        rank1.start(timeout=20)
    assert info.value.reason == "DATA_ORDER_MISMATCH"
    assert "seed" in info.value.message
    rank1.close()
    rank0.close()


def test_start_times_out_when_no_daemon_listens_and_says_why():
    c = Client(f"127.0.0.1:{free_port()}", "nobody", max_backoff=0.1)
    with pytest.raises(TimeoutError, match="not connected; last error UNAVAILABLE"):
        c.start(timeout=0.5)
    c.close()
    assert not c._thread.is_alive()


def test_token_is_sent_as_bearer_metadata_and_checked_by_the_daemon(monkeypatch, daemon):
    daemon.create_run("tok")
    # The daemon's token (conftest exports it) opens the stream.
    monkeypatch.setenv("SPIKEGUARD_TOKEN", daemon.token)
    c = client(daemon, "tok")
    assert c._metadata == (("authorization", f"Bearer {daemon.token}"),)
    c.start(timeout=20)
    c.close()
    # Another token is refused for good: Unauthorized, no retry loop, and
    # the token is not repeated in the error.
    monkeypatch.setenv("SPIKEGUARD_TOKEN", "s3cret")
    wrong = client(daemon, "tok")
    assert wrong._metadata == (("authorization", "Bearer s3cret"),)
    with pytest.raises(Unauthorized) as refused:
        wrong.start(timeout=20)
    assert "s3cret" not in str(refused.value)
    wrong.close()
    # No token at all: refused too.
    anonymous = client(daemon, "tok", token="")
    assert anonymous._metadata is None
    with pytest.raises(Unauthorized):
        anonymous.start(timeout=20)
    anonymous.close()


SCRIPT = textwrap.dedent("""
    import sys
    from spikeguard import Client
    from spikeguard.v1 import telemetry_pb2
    c = Client(sys.argv[1], sys.argv[2], max_backoff=0.2)
    c.start(timeout=20)
    for s in range(50):
        c.report(telemetry_pb2.StepReport(step=s, loss=1.0))
    if sys.argv[3] == "flush":
        c.flush(timeout=20)
    print("done", flush=True)
    if sys.argv[3] == "daemon-gone":
        sys.stdin.readline()  # the test kills the daemon meanwhile
    # exits without close()
""")


@pytest.mark.parametrize("mode", ["flush", "no-flush", "daemon-gone"])
def test_the_interpreter_exits_cleanly_with_an_open_client(daemon, tmp_path, mode):
    daemon.create_run("exit")
    script = tmp_path / "trainer.py"
    script.write_text(SCRIPT)
    env = {"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin",
           "SPIKEGUARD_TOKEN": daemon.token, "SPIKEGUARD_TLS_CA": os.environ["SPIKEGUARD_TLS_CA"]}
    proc = subprocess.Popen([PYTHON, str(script), daemon.address, "exit", mode],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    if mode == "daemon-gone":
        assert proc.stdout.readline().strip() == "done"
        daemon.kill9()  # the client is left reconnecting at exit
        time.sleep(0.3)
    out, err = proc.communicate(input="\n", timeout=30)
    assert proc.returncode == 0, err
    # Nothing from gRPC or a dying thread; only the client's own warning that
    # it lost the daemon, when it did.
    lines = [line for line in err.splitlines() if line.strip()]
    assert all(line.startswith("spikeguard: ") for line in lines), err
    assert "Traceback" not in err and "Exception" not in err
    if mode == "flush":
        assert len(daemon.telemetry("exit", gen=0)) == 50


def test_stale_generation_refusals_after_a_rewind_are_not_warnings(caplog):
    """Every rewind makes the daemon refuse the reports a rank sent before it
    acted on the REWIND: logged at INFO; any other refusal stays a warning."""
    c = Client(f"127.0.0.1:{free_port()}", "nobody", tls_ca="")
    try:
        with caplog.at_level(logging.INFO, logger="spikeguard"):
            c._on_ack(worker_pb2.Ack(seq=3, rejected=2, message=(
                "stale generation: reports of generation 0 refused; the run is at generation 1")))
            c._on_ack(worker_pb2.Ack(seq=4, rejected=1, message="step 7: loss is not a number"))
        levels = {r.getMessage().split(": ", 2)[-1][:16]: r.levelno for r in caplog.records
                  if "refused batch" in r.getMessage()}
        assert levels == {"stale generation": logging.INFO, "step 7: loss is ": logging.WARNING}
    finally:
        c.close()
