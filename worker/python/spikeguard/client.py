"""The worker-side client of spikeguardd: one WorkerService.Attach stream per rank.

The same delivery contract as the C++ client library (worker/client/worker_client.h):

- ``report()`` appends a StepReport to the open batch and returns; a background
  thread seals batches (``max_batch_reports`` reports or ``flush_interval``
  seconds; ``report_many()`` seals its reports' batch at once), numbers them,
  and sends them with checkpoint notices, command results and heartbeats
  (after ``heartbeat_interval`` without a batch).
- Reports are kept until the daemon acknowledges their batch, which it does
  only after committing it. When the stream breaks (daemon restart, network
  blip) the thread reconnects with exponential backoff and resends every
  unacknowledged batch (except those the Welcome's ``committed_step`` says are
  already stored); the daemon drops what it already committed. Nothing
  acknowledged is lost and nothing is stored twice. Recent checkpoint notices,
  deletions and the end of the generation are resent after a reconnect too
  (the daemon's handling of them is idempotent).
- Backpressure: when ``max_queued_reports`` reports wait for an
  acknowledgement, ``report()`` blocks until the daemon catches up, and logs a
  warning (once) saying so. Otherwise the training step never waits for the
  network.
- Commands from the daemon are queued by the thread and handed to the training
  loop only through ``poll_command()``, i.e. at a step boundary the trainer
  chooses. After a reconnect the daemon resends the commands it has no result
  for, so an id may arrive twice: execute it once, and send its result again.
- A Reject (unknown run, stale generation, invalid hello, ...) is final: the
  thread stops, and ``start()``, ``report()`` and ``flush()`` raise
  :class:`Rejected`. A refused token (Reject BAD_TOKEN, or a stream the daemon
  ends with UNAUTHENTICATED or PERMISSION_DENIED) is final too: they raise
  :class:`Unauthorized` (a Rejected) saying what to set.
- Security (as the C++ client, worker/client/client_security.h): the token
  goes on the Attach stream as ``authorization: Bearer <token>`` metadata; a
  CA turns TLS on. Unless given, the settings come from the environment the
  daemon's launcher sets: SPIKEGUARD_TOKEN (else the first line of
  SPIKEGUARD_TOKEN_FILE), SPIKEGUARD_TLS_CA, SPIKEGUARD_TLS_CERT and
  SPIKEGUARD_TLS_KEY (mutual TLS), SPIKEGUARD_TLS_SERVER_NAME. A file that
  cannot be read raises ValueError naming it; the token is never logged.

    from spikeguard import Client
    from spikeguard.v1 import telemetry_pb2

    client = Client("127.0.0.1:7070", "gpt-small", rank=0, world_size=8)
    client.start()
    for step in ...:
        while (cmd := client.poll_command()) is not None:
            handle(cmd)
        client.report(telemetry_pb2.StepReport(step=step, loss=loss, ...))
        client.set_current_step(step)
    client.flush()
    client.close()
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import socket
import threading
import time
import weakref
from typing import Deque, Dict, List, Optional

import grpc

from spikeguard._priority import lower_thread_priority
from spikeguard.v1 import telemetry_pb2, worker_pb2, worker_pb2_grpc

__all__ = ["Client", "Rejected", "Unauthorized"]

_log = logging.getLogger("spikeguard.client")

# Checkpoint notices (and deletions) remembered for resending after a reconnect.
_RECENT_CHECKPOINTS = 16
# The daemon's limit on reports in one batch (daemon/ingest/limits.h).
_MAX_BATCH_REPORTS = 4096
# How long a thread waiting on a stream's state sleeps between checks when
# no notification comes (see _wait_patiently).
_STATE_WAIT_SLICE_S = 5.0


class Rejected(Exception):
    """spikeguardd refused this rank (final): the client has stopped.

    ``reason`` is the Reject.Reason name ("STALE_GENERATION", "UNKNOWN_RUN",
    "BAD_TOKEN", "VERSION_SKEW", "INVALID_HELLO", "DATA_ORDER_MISMATCH"),
    ``message`` the daemon's explanation, ``current_generation`` the generation
    the daemon considers current, ``reject`` the message itself.
    """

    def __init__(self, reject: worker_pb2.Reject):
        self.reject = reject
        self.reason = worker_pb2.Reject.Reason.Name(reject.reason)
        self.message = reject.message
        self.current_generation = reject.current_generation
        super().__init__(f"rejected by spikeguardd ({self.reason}): {self.message}")


class Unauthorized(Rejected):
    """spikeguardd refused this rank's token (final): Reject BAD_TOKEN, or the
    stream ended with UNAUTHENTICATED or PERMISSION_DENIED (``code`` says which;
    "BAD_TOKEN" for a Reject). ``hint`` says what to set.
    """

    def __init__(self, reject: worker_pb2.Reject, code: str = "BAD_TOKEN", hint: str = ""):
        super().__init__(reject)
        self.code = code
        self.hint = hint
        if hint:
            self.args = (f"{self.args[0]} ({hint})",)


_AUTH_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def _read_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read {what} '{path}': {e.strerror or e}") from None


def _check_token(token: str, what: str) -> str:
    if not token:
        raise ValueError(f"the token from {what} is empty")
    if any(not 0x20 < ord(c) < 0x7f for c in token):
        # The token itself is never echoed.
        raise ValueError(f"the token from {what} has a character a bearer token cannot have "
                         "(want printable ASCII, no spaces)")
    return token


def read_token_file(path: str, what: str = "token_file") -> str:
    """The first line of ``path``, trimmed: the token (ValueError naming the file)."""
    text = _read_file(path, what).decode("utf-8", errors="replace")
    first = text.split("\n", 1)[0].strip()
    if not first:
        raise ValueError(f"{what} '{path}' holds no token (its first line is empty)")
    return _check_token(first, f"{what} '{path}'")


def _read_pem(path: str, what: str, kind: str) -> bytes:
    pem = _read_file(path, what)
    if b"-----BEGIN " not in pem:
        raise ValueError(f"{what} '{path}' is not PEM (want a {kind})")
    return pem


class _Security:
    """The token and the channel credentials of a client (resolved once)."""

    def __init__(self, token, token_file, tls_ca, tls_cert, tls_key, tls_server_name):
        # An argument (even "") wins over the environment; a token over a file.
        if token is not None or token_file is not None:
            if token:
                self.token = _check_token(token, "token")
                self.token_origin = "token"
            elif token_file:
                self.token = read_token_file(token_file, "token_file")
                self.token_origin = f"token_file '{token_file}'"
            else:
                self.token, self.token_origin = None, ""
        elif _env("SPIKEGUARD_TOKEN"):
            self.token = _check_token(_env("SPIKEGUARD_TOKEN"), "SPIKEGUARD_TOKEN")
            self.token_origin = "SPIKEGUARD_TOKEN"
        elif _env("SPIKEGUARD_TOKEN_FILE"):
            path = _env("SPIKEGUARD_TOKEN_FILE")
            self.token = read_token_file(path, "SPIKEGUARD_TOKEN_FILE")
            self.token_origin = f"SPIKEGUARD_TOKEN_FILE '{path}'"
        else:
            self.token, self.token_origin = None, ""

        def pick(value, arg, env):
            if value is not None:
                return (value or None), arg
            return _env(env), env

        ca, ca_what = pick(tls_ca, "tls_ca", "SPIKEGUARD_TLS_CA")
        cert, cert_what = pick(tls_cert, "tls_cert", "SPIKEGUARD_TLS_CERT")
        key, key_what = pick(tls_key, "tls_key", "SPIKEGUARD_TLS_KEY")
        name, name_what = pick(tls_server_name, "tls_server_name", "SPIKEGUARD_TLS_SERVER_NAME")
        if bool(cert) != bool(key):
            raise ValueError(f"{cert_what if cert else key_what} needs "
                             f"{'a key (tls_key or SPIKEGUARD_TLS_KEY)' if cert else 'a certificate (tls_cert or SPIKEGUARD_TLS_CERT)'}"
                             ": mutual TLS takes both")
        self.tls = bool(ca)
        self.mutual_tls = False
        self.tls_origin = ""
        self.server_name = None
        self.credentials = None
        if not ca:
            if cert:
                raise ValueError(f"{cert_what} needs tls_ca or SPIKEGUARD_TLS_CA "
                                 "(the CA that signed spikeguardd's certificate)")
            if name:
                raise ValueError(f"{name_what} needs tls_ca or SPIKEGUARD_TLS_CA "
                                 "(TLS is off without it)")
            return
        roots = _read_pem(ca, ca_what, "certificate")
        chain = private_key = None
        if cert:
            chain = _read_pem(cert, cert_what, "certificate")
            private_key = _read_pem(key, key_what, "private key")
            self.mutual_tls = True
        self.credentials = grpc.ssl_channel_credentials(
            root_certificates=roots, private_key=private_key, certificate_chain=chain)
        self.tls_origin = f"{ca_what} '{ca}'"
        self.server_name = name

    @property
    def metadata(self):
        return (("authorization", f"Bearer {self.token}"),) if self.token else None

    def channel(self, address: str, options):
        if not self.tls:
            return grpc.insecure_channel(address, options=options)
        options = list(options)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(address, self.credentials, options=options)

    def hint(self, code: str) -> str:
        if code == "UNAUTHENTICATED" or code == "BAD_TOKEN":
            if not self.token:
                return ("no token was sent: set SPIKEGUARD_TOKEN or SPIKEGUARD_TOKEN_FILE, "
                        "or pass token= / token_file=")
            return (f"the token from {self.token_origin} was not accepted: check that the "
                    "daemon's tokens file has its hash")
        if code == "PERMISSION_DENIED":
            origin = f" from {self.token_origin}" if self.token else ""
            return (f"the token{origin} is valid but its role or runs do not allow this: use "
                    "one that does (an admin makes one with 'spikectl token new')")
        if code == "UNAVAILABLE":
            if self.tls:
                return (f"TLS with the CA of {self.tls_origin}: check that spikeguardd serves "
                        "TLS, that this CA signed its certificate, and the name checked "
                        "(tls_server_name)"
                        + (", and that it accepts the client certificate"
                           if self.mutual_tls else ""))
            return "if spikeguardd serves TLS, pass tls_ca= or set SPIKEGUARD_TLS_CA"
        return ""


def _wait_patiently(call) -> None:
    """Lets the threads that wait on a stream's state (this client's
    connection thread for the next response, gRPC's request thread for a
    write to finish) sleep until they are notified instead of waking every
    0.1 s: grpcio's blocking calls wait in 0.1 s slices so that a signal
    reaches a main thread blocked in them, which neither thread is. Every
    change of the state is notified, so a longer slice delays nothing; on a
    training node's busy cores each needless wakeup costs a rank's step
    time. Left alone where grpcio's internals differ."""
    cond = getattr(getattr(call, "_state", None), "condition", None)
    slice_s = getattr(getattr(grpc, "_common", None), "MAXIMUM_WAIT_TIMEOUT", None)
    if not isinstance(cond, threading.Condition) or not isinstance(slice_s, float):
        return
    wait = cond.wait

    def patient_wait(timeout=None):
        # grpcio passes its slice for an open-ended wait, and the time left
        # (at most a slice) towards a deadline: a deadline wait with more
        # than a slice left would overshoot it by up to the long slice.
        # This client makes none on its stream (it iterates and cancels).
        return wait(timeout=_STATE_WAIT_SLICE_S if timeout == slice_s else timeout)

    try:
        cond.wait = patient_wait
    except AttributeError:  # pragma: no cover - a Condition without instance attributes
        pass


class _Batch:
    __slots__ = ("seq", "generation", "message", "count", "max_step", "sent")

    def __init__(self, seq: int, generation: int, message: worker_pb2.WorkerMessage,
                 count: int, max_step: int):
        self.seq = seq
        self.generation = generation
        self.message = message  # WorkerMessage with .reports set
        self.count = count
        self.max_step = max_step
        self.sent = False  # on the current connection


class _Connection:
    """One Attach stream: its call, its generation and what is in flight on it."""

    __slots__ = ("generation", "call", "welcomed", "done", "inflight")

    def __init__(self, generation: int):
        self.generation = generation
        self.call = None
        self.welcomed = False
        self.done = False
        # The message last handed to gRPC and not yet known to be written.
        self.inflight: Optional[object] = None


_live_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


@atexit.register
def _close_live_clients() -> None:
    # The connection thread is a daemon thread; close what is still open so
    # that no stream is torn down by interpreter shutdown.
    for client in list(_live_clients):
        try:
            client.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


class Client:
    """A rank's connection to spikeguardd (see the module docstring).

    address: "host:port" of spikeguardd. run, rank, world_size, generation: who
    this rank is (the generation it believes it runs: 0, or the one it was
    relaunched into). token (or token_file, whose first line is the token):
    sent as "authorization: Bearer <token>" metadata (default
    $SPIKEGUARD_TOKEN, else $SPIKEGUARD_TOKEN_FILE; "" sends none). tls_ca:
    PEM roots that verify the daemon, turning TLS on (default
    $SPIKEGUARD_TLS_CA); tls_cert and tls_key: the client certificate for
    mutual TLS ($SPIKEGUARD_TLS_CERT, $SPIKEGUARD_TLS_KEY); tls_server_name:
    the name checked in the daemon's certificate ($SPIKEGUARD_TLS_SERVER_NAME).
    host (default the hostname), device_id,
    config_fingerprint, manifest_version, resume_step, data_order (a
    worker_pb2.DataOrder: the daemon refuses a rank whose order contradicts
    the run's manifest or the other ranks', and names documents with it) and
    total_steps go in the Hello. A batch is sealed at max_batch_reports
    reports or flush_interval seconds; a heartbeat goes after
    heartbeat_interval seconds without a batch or a heartbeat; report()
    blocks while max_queued_reports reports are unacknowledged; reconnects
    back off from initial_backoff to max_backoff seconds; close() waits up to
    close_grace seconds for the daemon to read what was written. nice: the
    CPU priority of the client's own threads (its connection thread, and
    the gRPC threads that thread starts for the stream), lowered so that
    where training keeps every core busy their sending and heartbeats take
    the time the training threads leave idle; None leaves it.
    """

    def __init__(self, address: str, run: str, rank: int = 0, world_size: int = 1,
                 generation: int = 0, *,
                 token: Optional[str] = None,
                 token_file: Optional[str] = None,
                 tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 tls_server_name: Optional[str] = None,
                 host: Optional[str] = None,
                 device_id: int = -1,
                 config_fingerprint: str = "",
                 manifest_version: int = 0,
                 resume_step: int = 0,
                 data_order: Optional[worker_pb2.DataOrder] = None,
                 total_steps: int = 0,
                 max_batch_reports: int = 64,
                 flush_interval: float = 0.05,
                 heartbeat_interval: float = 1.0,
                 # As the C++ client's Options::max_queued_reports (and why):
                 # ~0.3 KB plus ~0.11 KB per layer a queued report, 40-120 MB
                 # per rank at 32-96 layers; at one report a step of 0.1-10 s
                 # that rides out a daemon outage of 17 minutes to a day.
                 max_queued_reports: int = 10000,
                 initial_backoff: float = 0.1,
                 max_backoff: float = 2.0,
                 close_grace: float = 2.0,
                 nice: Optional[int] = None):
        if not run:
            raise ValueError("run: empty")
        if world_size <= 0 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world size {world_size})")
        if generation < 0:
            raise ValueError(f"generation {generation} is negative")
        self.address = address
        self.run = run
        self.rank = int(rank)
        self.world_size = int(world_size)
        self._security = _Security(token, token_file, tls_ca, tls_cert, tls_key,
                                   tls_server_name)
        self._host = host if host is not None else socket.gethostname()
        self._device_id = int(device_id)
        self._config_fingerprint = config_fingerprint
        self._manifest_version = int(manifest_version)
        self._resume_step = int(resume_step)
        self._data_order = data_order
        self._total_steps = int(total_steps)
        self._max_batch_reports = max(1, min(int(max_batch_reports), _MAX_BATCH_REPORTS))
        self._flush_interval = float(flush_interval)
        self._heartbeat_interval = float(heartbeat_interval)
        self._max_queued_reports = max(1, int(max_queued_reports))
        self._initial_backoff = float(initial_backoff)
        self._max_backoff = max(float(max_backoff), self._initial_backoff)
        self._close_grace = float(close_grace)
        self._nice = None if nice is None else int(nice)

        self._cond = threading.Condition(threading.Lock())
        # Everything below is guarded by _cond.
        self._started = False
        self._stopping = False
        self._closed = False
        self._welcome: Optional[worker_pb2.Welcome] = None
        self._rejection: Optional[worker_pb2.Reject] = None
        self._generation = int(generation)
        self._current_step = -1
        self._next_seq = 1
        self._open = telemetry_pb2.StepReportBatch()
        self._open_count = 0
        self._open_last_step: Optional[int] = None
        self._open_since = 0.0
        self._unacked: "collections.OrderedDict[int, _Batch]" = collections.OrderedDict()
        self._unacked_reports = 0
        # What the stream writes next, in order: _Batch entries and
        # WorkerMessages (notices).
        self._outbox: Deque[object] = collections.deque()
        self._recent_checkpoints: Deque[worker_pb2.WorkerMessage] = collections.deque()
        self._recent_deletions: Deque[worker_pb2.WorkerMessage] = collections.deque()
        # Resent after a reconnect while the generation is its generation.
        self._generation_ended: Optional[worker_pb2.WorkerMessage] = None
        self._commands: Deque[worker_pb2.Command] = collections.deque()
        self._conn: Optional[_Connection] = None
        self._connected = False
        self._reconnect_now = False
        self._warned_backpressure = False
        self._last_error = ""  # why the last stream or attempt failed
        # The status code that ended a refused stream ("BAD_TOKEN" for a Reject).
        self._auth_code = "BAD_TOKEN"
        # The run's pinned checkpoint URIs from the daemon's last answer to a
        # checkpoint notice, until take_pins() takes them.
        self._pins: Optional[List[str]] = None
        # Checkpoint notices written on the current stream and not yet
        # answered (by pins, or refused).
        self._notices_unanswered = 0
        self._stats = {
            "reports_acked": 0,
            "reports_duplicate": 0,
            "reports_rejected": 0,
            "reports_dropped_stale": 0,
            # Unacknowledged reports the Welcome's committed_step showed were
            # already stored (their ack was lost with a stream): not resent.
            "reports_already_committed": 0,
            "batches_sent": 0,
            "heartbeats_sent": 0,
            "connects": 0,
            "backpressure_waits": 0,
            "commands_received": 0,
            "last_ack_message": "",
        }

        self._channel_options = [
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20),
            # Reconnect quickly after a daemon restart: gRPC's own backoff
            # and re-resolution of the address are kept within the loop's.
            ("grpc.initial_reconnect_backoff_ms", max(1, int(self._initial_backoff * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(self._max_backoff * 1000))),
            ("grpc.dns_min_time_between_resolutions_ms", max(1, int(self._max_backoff * 1000))),
        ]
        self._channel = self._security.channel(address, self._channel_options)
        self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        self._metadata = self._security.metadata
        self._thread = threading.Thread(
            target=self._connection_loop, name=f"spikeguard-client-{run}-{rank}", daemon=True)
        _live_clients.add(self)

    # ------------------------------------------------------------------ public

    def start(self, timeout: float = 60.0) -> worker_pb2.Welcome:
        """Starts the connection thread and waits for the daemon's first Welcome.

        Raises Rejected when the daemon refuses this rank, TimeoutError when no
        Welcome came within ``timeout`` seconds (the thread keeps trying; call
        close() to give up).
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("spikeguard client is closed")
            if not self._started:
                self._started = True
                self._thread.start()
            self._cond.wait_for(lambda: self._welcome is not None or self._rejection is not None,
                                timeout=timeout)
            if self._rejection is not None:
                raise self._rejected_error()
            if self._welcome is None:
                raise TimeoutError(f"no welcome from spikeguardd at {self.address} within "
                                   f"{timeout:g} s (run '{self.run}', rank {self.rank})"
                                   + self._why_disconnected_locked())
            return self._welcome

    def report(self, report: telemetry_pb2.StepReport) -> None:
        """Queues one StepReport. Blocks only under backpressure (see the module)."""
        self.report_many((report,), send_now=False)

    def report_many(self, reports, *, send_now: bool = True) -> None:
        """Queues StepReports in order, as report() queues each; send_now:
        they go out at once instead of after flush_interval (a trainer that
        hands over several steps at a time wakes the sending thread once,
        not once for the batch and once for its timer)."""
        with self._cond:
            wake = False
            for report in reports:
                if not self._wait_for_room_locked():
                    break  # the client is closing: the rest is not queued
                wake |= self._add_report_locked(report)
            if send_now and self._open_count > 0:
                self._seal_locked()
                wake = True
            # The sender wakes for a sealed batch or a new open one only: a
            # report added to the open batch changes nothing it waits for
            # (waking it for each costs the trainer's thread the GIL).
            if wake:
                self._cond.notify_all()

    def _wait_for_room_locked(self) -> bool:
        """Waits while max_queued_reports reports are queued (backpressure);
        False when the client closes meanwhile."""
        self._check_usable_locked()
        if self._queued_locked() >= self._max_queued_reports:
            if not self._started:
                raise RuntimeError(f"{self._queued_locked()} reports queued before start(): "
                                   "call start() to deliver them")
            self._stats["backpressure_waits"] += 1
            if not self._warned_backpressure:
                self._warned_backpressure = True
                _log.warning(
                    "spikeguard: %d reports of run '%s' rank %d wait for an acknowledgement "
                    "from spikeguardd at %s (%s); report() blocks until the daemon catches "
                    "up (backpressure, max_queued_reports=%d)",
                    self._queued_locked(), self.run, self.rank, self.address,
                    "connected" if self._connected else "not connected",
                    self._max_queued_reports)
            # A batch report_many opened before it filled up is the
            # sender's to seal: it may not have been woken for it yet.
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._stopping or self._queued_locked() < self._max_queued_reports)
            if self._rejection is not None:
                raise self._rejected_error()
            if self._stopping:
                return False
        return True

    def _add_report_locked(self, report: telemetry_pb2.StepReport) -> bool:
        """Adds a report to the open batch; True when the sender has to wake for it."""
        wake = False
        if self._open_count > 0 and report.step <= self._open_last_step:
            # The daemon refuses a batch whose steps do not increase; a
            # repeated or earlier step goes in a batch of its own (and is
            # counted as a duplicate there).
            self._seal_locked()
            wake = True
        if self._open_count == 0:
            self._open_since = time.monotonic()
            wake = True  # the sender's flush timer starts
        self._open.reports.add().CopyFrom(report)
        self._open_count += 1
        self._open_last_step = report.step
        if self._open_count >= self._max_batch_reports:
            self._seal_locked()
            wake = True
        return wake

    def checkpoint_saved(self, step: int, uri: str, *, data_position: int = 0,
                         size_bytes: int = 0, checksum: str = "", has_rng_state: bool = True,
                         has_data_loader_state: bool = True, complete: bool = True) -> None:
        """Registers a checkpoint with the daemon (after the reports queued before it)."""
        msg = worker_pb2.WorkerMessage()
        msg.checkpoint.CopyFrom(worker_pb2.CheckpointSaved(
            step=step, data_position=data_position, uri=uri, bytes=size_bytes,
            checksum=checksum, has_rng_state=has_rng_state,
            has_data_loader_state=has_data_loader_state, complete=complete))
        with self._cond:
            # Resent on a later generation's stream, it still names its saver.
            msg.checkpoint.generation = self._generation
            if not self._accepting_notices_locked():
                return
            self._seal_locked()
            # Saved again: an older deletion notice must not be resent after it.
            self._recent_deletions = collections.deque(
                m for m in self._recent_deletions if m.checkpoint_deleted.uri != uri)
            self._recent_checkpoints = collections.deque(
                m for m in self._recent_checkpoints if m.checkpoint.uri != uri)
            self._recent_checkpoints.append(msg)
            while len(self._recent_checkpoints) > _RECENT_CHECKPOINTS:
                self._recent_checkpoints.popleft()
            self._outbox.append(msg)
            self._cond.notify_all()

    def checkpoint_deleted(self, step: int, uri: str) -> None:
        """Tells the daemon that retention deleted a checkpoint file."""
        msg = worker_pb2.WorkerMessage()
        msg.checkpoint_deleted.CopyFrom(worker_pb2.CheckpointDeleted(step=step, uri=uri))
        with self._cond:
            if not self._accepting_notices_locked():
                return
            self._seal_locked()
            self._recent_checkpoints = collections.deque(
                m for m in self._recent_checkpoints if m.checkpoint.uri != uri)
            self._recent_deletions = collections.deque(
                m for m in self._recent_deletions if m.checkpoint_deleted.uri != uri)
            self._recent_deletions.append(msg)
            while len(self._recent_deletions) > _RECENT_CHECKPOINTS:
                self._recent_deletions.popleft()
            self._outbox.append(msg)
            self._cond.notify_all()

    def command_result(self, command_id: str, ok: bool, message: str = "", step: int = 0) -> None:
        """The outcome of a command (sent after the reports queued before it)."""
        msg = worker_pb2.WorkerMessage()
        msg.command_result.CopyFrom(worker_pb2.CommandResult(
            command_id=command_id, ok=ok, message=message, step=step))
        self._queue_notice(msg)

    def generation_ended(self, generation: int, last_step: int, reason: str) -> None:
        """The generation ended before any horizon (end of the training schedule).

        Sent after the reports queued before it, and again after a reconnect
        until the generation changes.
        """
        msg = worker_pb2.WorkerMessage()
        msg.generation_ended.CopyFrom(worker_pb2.GenerationEnded(
            generation=generation, last_step=last_step, reason=reason))
        with self._cond:
            if not self._accepting_notices_locked():
                return
            self._seal_locked()
            self._outbox.append(msg)
            self._generation_ended = msg
            self._cond.notify_all()

    def set_current_step(self, step: int) -> None:
        """The step the trainer is at, sent with heartbeats."""
        with self._cond:
            self._current_step = int(step)

    def set_generation(self, generation: int) -> None:
        """Adopts a new generation (after a REWIND).

        The next Hello and every new batch carry it; unacknowledged reports of
        other generations are dropped (counted in stats["reports_dropped_stale"]).
        The stream reconnects at once.
        """
        with self._cond:
            self._seal_locked()
            generation = int(generation)
            for seq in [s for s, b in self._unacked.items() if b.generation != generation]:
                b = self._unacked.pop(seq)
                self._stats["reports_dropped_stale"] += b.count
                self._unacked_reports -= b.count
            self._generation = generation
            if (self._generation_ended is not None
                    and self._generation_ended.generation_ended.generation != generation):
                self._generation_ended = None
            # The next Hello must carry the new generation.
            if self._conn is not None and not self._conn.done:
                self._reconnect_now = True
                self._end_connection_locked(self._conn)
            self._cond.notify_all()

    def poll_command(self, timeout: float = 0.0) -> Optional[worker_pb2.Command]:
        """The next command from the daemon, if one is queued or arrives within ``timeout``."""
        with self._cond:
            if not self._commands and timeout > 0:
                self._cond.wait_for(lambda: self._commands or self._stopping, timeout=timeout)
            return self._commands.popleft() if self._commands else None

    def flush(self, timeout: float = 30.0) -> None:
        """Seals the open batch and waits until every report is acknowledged and
        every notice queued so far is written to the stream.

        Raises Rejected, or TimeoutError naming what is still pending.
        """
        with self._cond:
            if self._rejection is not None:
                raise self._rejected_error()
            self._seal_locked()
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: (not self._pending_locked() or self._rejection is not None
                         or self._stopping), timeout=timeout)
            if self._rejection is not None:
                raise self._rejected_error()
            if self._unacked:
                raise TimeoutError(
                    f"{self._unacked_reports} reports still unacknowledged by spikeguardd at "
                    f"{self.address} after {timeout:g} s"
                    + self._why_disconnected_locked()
                    + (" (client closed)" if self._closed else ""))
            if self._pending_locked():
                raise TimeoutError(
                    f"{self._pending_notices_locked()} notices still unsent to spikeguardd at "
                    f"{self.address} after {timeout:g} s"
                    + self._why_disconnected_locked()
                    + (" (client closed)" if self._closed else ""))

    def close(self) -> None:
        """Stops the connection thread without waiting for acknowledgements.

        When connected, what is queued is written and the stream half-closed;
        the daemon then ends it once it has read everything (up to
        ``close_grace`` seconds, after which the stream is cancelled).
        Idempotent.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cond.notify_all()
            deadline = time.monotonic() + self._close_grace
            self._cond.wait_for(lambda: self._conn is None or not self._connected,
                                timeout=max(0.0, deadline - time.monotonic()))
            if self._conn is not None:
                self._end_connection_locked(self._conn)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self._close_grace))
        with self._cond:
            channel = self._channel  # not renewed once stopping
        channel.close()
        _live_clients.discard(self)

    def __enter__(self) -> "Client":
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def take_pins(self) -> Optional[List[str]]:
        """The run's pinned checkpoint URIs as the daemon last sent them in
        answer to a checkpoint_saved (the rolling rewind target among them),
        once: None when none arrived since the last call. Retention must keep
        them."""
        with self._cond:
            pins, self._pins = self._pins, None
            return pins

    def await_checkpoint_answers(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds until the daemon has answered every
        checkpoint notice queued or written on the current stream, so
        retention does not delete a checkpoint the daemon is about to pin.
        False on timeout; True at once when not connected (the last pins
        known then stand)."""
        def pending() -> bool:
            if not self._connected or self._stopping:
                return False
            return self._notices_unanswered > 0 or any(
                isinstance(m, worker_pb2.WorkerMessage) and m.HasField("checkpoint")
                for m in self._outbox)
        with self._cond:
            return self._cond.wait_for(lambda: not pending(), timeout=timeout)

    @property
    def rejection(self) -> Optional[worker_pb2.Reject]:
        with self._cond:
            return self._rejection

    @property
    def connected(self) -> bool:
        with self._cond:
            return self._connected

    @property
    def welcome(self) -> Optional[worker_pb2.Welcome]:
        """The last Welcome received (None before the first)."""
        with self._cond:
            return self._welcome

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    @property
    def stats(self) -> Dict[str, object]:
        with self._cond:
            out = dict(self._stats)
            out["reports_unacked"] = self._unacked_reports + self._open_count
            return out

    # ----------------------------------------------------------------- helpers

    def _why_disconnected_locked(self) -> str:
        if self._connected:
            return ""
        if not self._last_error:
            return " (not connected)"
        hint = ""
        if self._last_error.startswith("UNAVAILABLE"):
            hint = "; " + self._security.hint("UNAVAILABLE")
        return f" (not connected; last error {self._last_error}{hint})"

    def _rejected_error(self) -> Rejected:
        reject = self._rejection
        if reject.reason != worker_pb2.Reject.BAD_TOKEN:
            return Rejected(reject)
        code = self._auth_code
        # A synthesized rejection's message has the hint already. The daemon
        # refuses with BAD_TOKEN an unknown token and a token whose role or
        # runs do not cover this rank alike.
        if code in _AUTH_CODES or "SPIKEGUARD_TOKEN" in reject.message:
            hint = ""
        elif not self._security.token:
            hint = self._security.hint("UNAUTHENTICATED")
        else:
            hint = (f"check the token from {self._security.token_origin}: the daemon's tokens "
                    "file must have its hash, for a principal with the role worker (or above) "
                    f"and run '{self.run}'")
        return Unauthorized(reject, code=code, hint=hint)

    def _check_usable_locked(self) -> None:
        if self._rejection is not None:
            raise self._rejected_error()
        if self._closed:
            raise RuntimeError("spikeguard client is closed")

    def _accepting_notices_locked(self) -> bool:
        if self._rejection is not None or self._closed:
            _log.debug("spikeguard: notice dropped (client %s)",
                       "rejected" if self._rejection is not None else "closed")
            return False
        return True

    def _queue_notice(self, msg: worker_pb2.WorkerMessage) -> None:
        with self._cond:
            if not self._accepting_notices_locked():
                return
            self._seal_locked()
            self._outbox.append(msg)
            self._cond.notify_all()

    def _queued_locked(self) -> int:
        return self._unacked_reports + self._open_count

    def _pending_notices_locked(self) -> int:
        n = sum(1 for m in self._outbox if not isinstance(m, _Batch))
        if self._conn is not None and self._conn.inflight is not None:
            n += 1
        return n

    def _pending_locked(self) -> bool:
        return bool(self._unacked) or self._open_count > 0 or self._pending_notices_locked() > 0

    def _seal_locked(self) -> None:
        if self._open_count == 0:
            return
        batch = self._open
        batch.seq = self._next_seq
        batch.generation = self._generation
        msg = worker_pb2.WorkerMessage()
        msg.reports.CopyFrom(batch)
        b = _Batch(self._next_seq, self._generation, msg, self._open_count, self._open_last_step)
        self._next_seq += 1
        self._unacked[b.seq] = b
        self._unacked_reports += b.count
        self._outbox.append(b)
        self._open = telemetry_pb2.StepReportBatch()
        self._open_count = 0
        self._open_last_step = None

    def _end_connection_locked(self, conn: _Connection) -> None:
        conn.done = True
        if conn.call is not None:
            conn.call.cancel()
        self._cond.notify_all()

    def _hello(self, generation: int) -> worker_pb2.WorkerMessage:
        msg = worker_pb2.WorkerMessage()
        h = msg.hello
        h.run = self.run
        h.rank = self.rank
        h.world_size = self.world_size
        h.generation = generation
        h.host = self._host
        h.device_id = self._device_id
        h.config_fingerprint = self._config_fingerprint
        h.manifest_version = self._manifest_version
        h.resume_step = self._resume_step
        h.protocol = "spikeguard.v1"
        if self._data_order is not None:
            h.data_order.CopyFrom(self._data_order)
        h.total_steps = self._total_steps
        return msg

    # ------------------------------------------------------- connection thread

    def _connection_loop(self) -> None:
        if self._nice is not None:
            # Before the first call: the threads gRPC starts for the stream
            # (its request thread, the channel's polling thread) are started
            # from this one and inherit its priority.
            lower_thread_priority(self._nice)
        backoff = self._initial_backoff
        while True:
            try:
                keep_going, welcomed = self._run_connection()
            except Exception:  # pragma: no cover - a bug; do not die silently
                _log.exception("spikeguard: connection thread failed")
                keep_going, welcomed = True, False
            if not keep_going:
                return
            if welcomed:
                backoff = self._initial_backoff
            with self._cond:
                if self._reconnect_now:
                    self._reconnect_now = False
                    continue
            # A channel whose connection failed waits out gRPC's own backoff
            # (seconds, whatever the channel options say) before it dials
            # again; a fresh one dials at once, so the retries follow this
            # loop's backoff.
            self._renew_channel()
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._reconnect_now,
                                    timeout=backoff)
                if self._stopping:
                    return
                self._reconnect_now = False
            backoff = min(backoff * 2, self._max_backoff)

    def _renew_channel(self) -> None:
        with self._cond:
            if self._stopping:
                return
            old = self._channel
            self._channel = self._security.channel(self.address, self._channel_options)
            self._stub = worker_pb2_grpc.WorkerServiceStub(self._channel)
        old.close()

    def _run_connection(self):
        """Runs one stream until it ends. Returns (keep_going, was_welcomed)."""
        with self._cond:
            if self._stopping:
                return False, False
            conn = _Connection(self._generation)
            self._conn = conn
            stub = self._stub
        welcomed = False
        try:
            call = stub.Attach(self._requests(conn, self._hello(conn.generation)),
                               metadata=self._metadata)
            _wait_patiently(call)
            with self._cond:
                conn.call = call
                if conn.done:  # closed or regenerated meanwhile
                    call.cancel()
            try:
                for msg in call:
                    kind = msg.WhichOneof("body")
                    if kind == "welcome":
                        welcomed = True
                        self._on_welcome(conn, msg.welcome)
                    elif kind == "reject":
                        self._on_reject(msg.reject)
                        return False, welcomed
                    elif kind == "ack":
                        self._on_ack(msg.ack)
                    elif kind == "command":
                        with self._cond:
                            self._commands.append(msg.command)
                            # The command's pins are newer than any answer
                            # to a notice read before it.
                            self._pins = None
                            self._stats["commands_received"] += 1
                            self._cond.notify_all()
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                details = e.details() if hasattr(e, "details") else str(e)
                name = getattr(code, "name", None)
                if name in _AUTH_CODES:
                    # The same token would be refused again: final.
                    reject = worker_pb2.Reject(
                        reason=worker_pb2.Reject.BAD_TOKEN,
                        message=f"{name}: {details} ({self._security.hint(name)})")
                    with self._cond:
                        self._auth_code = name
                        self._last_error = f"{name}: {details}"
                    self._on_reject(reject)
                    return False, welcomed
                if code != grpc.StatusCode.CANCELLED:
                    with self._cond:
                        self._last_error = f"{getattr(code, 'name', code)}: {details}"
                    # Said once per outage; the retries that follow are debug.
                    level = logging.WARNING if welcomed else logging.DEBUG
                    _log.log(level, "spikeguard: stream of run '%s' rank %d to spikeguardd at %s "
                             "ended (%s: %s); reconnecting", self.run, self.rank, self.address,
                             getattr(code, "name", code), details)
        finally:
            with self._cond:
                self._end_connection_locked(conn)
                # A notice handed to gRPC but not known to be written goes
                # again on the next stream (report batches are resent from the
                # unacknowledged ones, heartbeats are not needed).
                if isinstance(conn.inflight, worker_pb2.WorkerMessage) and (
                        conn.inflight.WhichOneof("body") not in ("heartbeat", "reports")):
                    self._outbox.appendleft(conn.inflight)
                conn.inflight = None
                if self._conn is conn:
                    self._conn = None
                self._connected = False
                # Unanswered notices are resent on the next stream.
                self._notices_unanswered = 0
                self._cond.notify_all()
        with self._cond:
            return not self._stopping, welcomed

    def _on_welcome(self, conn: _Connection, welcome: worker_pb2.Welcome) -> None:
        with self._cond:
            first = self._stats["connects"] == 0
            self._stats["connects"] += 1
            if not first:
                _log.info("spikeguard: run '%s' rank %d reattached to spikeguardd at %s "
                          "(generation %d, committed step %d, %d reports unacknowledged)",
                          self.run, self.rank, self.address, welcome.generation,
                          welcome.committed_step, self._unacked_reports)
            self._welcome = welcome
            self._connected = True
            conn.welcomed = True
            # What the daemon already stored needs no resend.
            for seq in [s for s, b in self._unacked.items()
                        if b.generation == welcome.generation
                        and b.max_step <= welcome.committed_step]:
                b = self._unacked.pop(seq)
                self._unacked_reports -= b.count
                self._stats["reports_already_committed"] += b.count
            for b in self._unacked.values():
                b.sent = False
            # The new order: every unacknowledged batch (in sequence), then on
            # a reconnect the notices that may have died with the last stream
            # (checkpoints saved, then deleted), then the notices not written
            # yet, then the end of the generation.
            pending: List[object] = [m for m in self._outbox if not isinstance(m, _Batch)]
            outbox: List[object] = list(self._unacked.values())
            if not first:
                queued = {id(m) for m in pending}
                outbox += [m for m in self._recent_checkpoints if id(m) not in queued]
                outbox += [m for m in self._recent_deletions if id(m) not in queued]
            outbox += pending
            ended = self._generation_ended
            if (not first and ended is not None and id(ended) not in {id(m) for m in pending}
                    and ended.generation_ended.generation == conn.generation):
                outbox.append(ended)
            self._outbox = collections.deque(outbox)
            self._cond.notify_all()

    def _on_reject(self, reject: worker_pb2.Reject) -> None:
        with self._cond:
            self._rejection = reject
            self._stopping = True
            self._connected = False
            if self._conn is not None:
                self._end_connection_locked(self._conn)
            self._cond.notify_all()
        _log.error("spikeguard: spikeguardd rejected rank %d of run '%s' (%s): %s", self.rank,
                   self.run, worker_pb2.Reject.Reason.Name(reject.reason), reject.message)

    def _on_ack(self, ack: worker_pb2.Ack) -> None:
        with self._cond:
            if ack.has_pins:
                self._pins = list(ack.pinned_uris)
            # A notice is answered by its pins, or refused by an Ack naming
            # no batch.
            if (ack.has_pins or (ack.seq == 0 and ack.rejected > 0)) and self._notices_unanswered:
                self._notices_unanswered -= 1
            b = self._unacked.pop(ack.seq, None)
            if b is not None:
                self._unacked_reports -= b.count
            self._stats["reports_acked"] += ack.accepted
            self._stats["reports_duplicate"] += ack.duplicates
            self._stats["reports_rejected"] += ack.rejected
            if ack.message:
                self._stats["last_ack_message"] = ack.message
                if ack.rejected > 0:
                    # Reports of a generation the run has left (sent before
                    # this rank acted on the REWIND) are refused at every
                    # rewind: expected, not worth a warning.
                    stale = ack.message.startswith("stale generation")
                    _log.log(logging.INFO if stale else logging.WARNING,
                             "spikeguard: spikeguardd refused batch %d: %s", ack.seq, ack.message)
            self._cond.notify_all()

    def _next_message_locked(self, conn: _Connection):
        while self._outbox:
            item = self._outbox[0]
            if isinstance(item, _Batch):
                if item.seq not in self._unacked or item.sent:
                    self._outbox.popleft()  # acknowledged, dropped or already sent
                    continue
                if item.generation != conn.generation:
                    return None  # goes on the next stream, with its generation
                self._outbox.popleft()
                item.sent = True
                self._stats["batches_sent"] += 1
                return item.message
            msg = self._outbox.popleft()
            if isinstance(msg, worker_pb2.WorkerMessage) and msg.HasField("checkpoint"):
                self._notices_unanswered += 1
            return msg
        return None

    def _requests(self, conn: _Connection, hello: worker_pb2.WorkerMessage):
        """The request stream of one connection, consumed by a gRPC thread.

        gRPC asks for the next message only once the previous one is written,
        so resuming here means conn.inflight went out.
        """
        yield hello
        with self._cond:
            self._cond.wait_for(lambda: conn.welcomed or conn.done)
            if conn.done:
                return
        last_heartbeat = time.monotonic()
        while True:
            with self._cond:
                if conn.inflight is not None:
                    conn.inflight = None
                    self._cond.notify_all()
                while True:
                    if conn.done:
                        return
                    now = time.monotonic()
                    finishing = self._stopping
                    if self._open_count > 0 and (
                            finishing or now - self._open_since >= self._flush_interval):
                        self._seal_locked()
                    msg = self._next_message_locked(conn)
                    if msg is not None:
                        if msg.WhichOneof("body") == "reports":
                            # A batch is a sign of life as a heartbeat is
                            # (the daemon takes both as one): the next
                            # heartbeat after heartbeat_interval of none.
                            last_heartbeat = now
                        break
                    if finishing:
                        # Everything queued is written: half-close, and the
                        # daemon ends the stream once it has read it all.
                        return
                    if now - last_heartbeat >= self._heartbeat_interval:
                        msg = worker_pb2.WorkerMessage()
                        msg.heartbeat.step = self._current_step
                        msg.heartbeat.unix_ms = int(time.time() * 1000)
                        last_heartbeat = now
                        self._stats["heartbeats_sent"] += 1
                        break
                    wake = last_heartbeat + self._heartbeat_interval
                    if self._open_count > 0:
                        wake = min(wake, self._open_since + self._flush_interval)
                    self._cond.wait(timeout=max(0.0, wake - now))
                conn.inflight = msg
            yield msg
