"""Shared pytest fixtures of the Python tests: a real spikeguardd on a free
loopback port with a temp data dir, and spikectl against it.

    def test_something(daemon):
        daemon.create_run("r", world_size=1, mode="observe")
        client = Client(daemon.address, "r")
        ...
        records = daemon.telemetry("r", gen=0)        # list of StepRecord dicts
        daemon.kill9(); daemon.start()                # crash and restart, same port and data

The binaries come from SPIKEGUARD_BUILD_DIR (set by ctest; default: build/
of this checkout). ctest also puts the assembled package on PYTHONPATH; when
run by hand, build/python is added here.

The daemons run as deployed: TLS with the tests' certificate (made by the
build in build/tests/tls) and a tokens file with one admin principal whose
token this process exports as SPIKEGUARD_TOKEN (with SPIKEGUARD_TLS_CA), so
spikeguard.Client, spikectl and any worker the test starts itself connect as
a user would. Workers the daemon launches get their own run-scoped token.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ.get("SPIKEGUARD_BUILD_DIR", REPO / "build"))
PYTHON_DIR = BUILD_DIR / "python"
if str(PYTHON_DIR) not in sys.path and (PYTHON_DIR / "spikeguard").is_dir():
    sys.path.insert(0, str(PYTHON_DIR))

SPIKEGUARDD = BUILD_DIR / "daemon" / "spikeguardd"
SPIKECTL = BUILD_DIR / "cli" / "spikectl"
SPIKEGUARD_WORKER = BUILD_DIR / "worker" / "spikeguard-worker"
PYTHON = os.environ.get("SPIKEGUARD_PYTHON", "/usr/bin/python3")

TLS_DIR = BUILD_DIR / "tests" / "tls"
# One admin token for the whole test session: every daemon made here trusts
# it, and every client of this process presents it by default.
ADMIN_TOKEN = secrets.token_hex(32)
ADMIN_TOKEN_HASH = "sha256:" + hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()
os.environ["SPIKEGUARD_TOKEN"] = ADMIN_TOKEN
os.environ["SPIKEGUARD_TLS_CA"] = str(TLS_DIR / "ca.pem")
os.environ.pop("SPIKEGUARD_TOKEN_FILE", None)


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):
    """Polls predicate() until it returns a true value, which is returned."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Daemon:
    """A spikeguardd process serving on 127.0.0.1:<port> with data in <dir>/data.

    The port and the data dir stay the same across stop()/kill9()/start(), so
    clients reconnect to the restarted daemon and find its catalog.
    """

    def __init__(self, directory: Path, extra_args: Optional[List[str]] = None):
        if not SPIKEGUARDD.exists():
            pytest.skip(f"{SPIKEGUARDD} is not built")
        if not (TLS_DIR / "server.pem").exists():
            pytest.skip(f"{TLS_DIR} has no TLS material (build the test_tls_material target)")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.tokens_file = self.dir / "tokens"
        self.tokens_file.write_text(f"tests admin * {ADMIN_TOKEN_HASH}\n")
        self.token = ADMIN_TOKEN
        self.data_dir = self.dir / "data"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.extra_args = list(extra_args or [])
        self.proc: Optional[subprocess.Popen] = None
        self.starts = 0

    # -------------------------------------------------------------- lifecycle

    def start(self, timeout: float = 30.0) -> "Daemon":
        assert not self.running, "spikeguardd already running"
        port_file = self.dir / "port"
        if port_file.exists():
            port_file.unlink()
        self.starts += 1
        out = open(self.dir / f"daemon-{self.starts}.out", "wb")
        err = open(self.dir / f"daemon-{self.starts}.err", "wb")
        try:
            self.proc = subprocess.Popen(
                [str(SPIKEGUARDD), f"--listen={self.address}", f"--data-dir={self.data_dir}",
                 f"--port-file={port_file}", *self.security_args(), *self.extra_args],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        finally:
            out.close()
            err.close()
        deadline = time.monotonic() + timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"spikeguardd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"spikeguardd did not start within {timeout:g} s:\n{self.log()}")
            time.sleep(0.02)
        return self

    def security_args(self) -> List[str]:
        """TLS with the tests' certificate, the tokens file, and the CA the
        workers the daemon launches verify it with."""
        return [f"--tokens={self.tokens_file}", f"--tls-cert={TLS_DIR / 'server.pem'}",
                f"--tls-key={TLS_DIR / 'server.key'}", f"--worker-tls-ca={TLS_DIR / 'ca.pem'}"]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit code (SIGKILL after the timeout)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill9(self) -> None:
        """SIGKILL: the daemon dies without any shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> "Daemon":
        """Graceful stop (when running), then start on the same port and data dir."""
        self.stop()
        return self.start()

    def log(self) -> str:
        """stderr of the current (or last) daemon process."""
        path = self.dir / f"daemon-{self.starts}.err"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---------------------------------------------------------------- spikectl

    def spikectl(self, *args, check: bool = False, timeout: float = 60.0,
                 output: Optional[str] = None) -> subprocess.CompletedProcess:
        argv = [str(SPIKECTL), f"--addr={self.address}", f"--tls-ca={TLS_DIR / 'ca.pem'}"]
        if output is not None:
            argv.append(f"--output={output}")
        argv += [str(a) for a in args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited with {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def spikectl_json(self, *args, timeout: float = 60.0):
        """spikectl --output=json ARGS, parsed (must succeed)."""
        result = self.spikectl(*args, check=True, timeout=timeout, output="json")
        return json.loads(result.stdout) if result.stdout.strip() else {}

    def create_run(self, name: str, world_size: int = 1, mode: Optional[str] = "observe",
                   spec: Optional[Path] = None) -> None:
        args = ["runs", "create", name, f"--world-size={world_size}"]
        if mode:
            args.append(f"--mode={mode}")
        if spec is not None:
            args.append(f"--spec={spec}")
        self.spikectl(*args, check=True)

    def telemetry(self, run: str, gen: Optional[int] = None, limit: int = 100000) -> List[Dict]:
        """The run-level StepRecords of a generation (JSON dicts, ordered by step)."""
        args = ["telemetry", f"--run={run}", f"--limit={limit}"]
        if gen is not None:
            args.append(f"--gen={gen}")
        return self.spikectl_json(*args).get("records", [])

    def checkpoints(self, run: str) -> List[Dict]:
        return self.spikectl_json("checkpoints", "list", f"--run={run}").get("checkpoints", [])

    def status(self) -> Dict:
        return self.spikectl_json("status")

    def command_state(self, command_id: str) -> Optional[str]:
        """A command's state in the catalog ('pending', 'sent', 'acked',
        'failed'; None when unknown). spikectl does not show commands; this
        reads the daemon's SQLite catalog directly (read-only)."""
        import sqlite3

        db = sqlite3.connect(f"file:{self.data_dir / 'catalog.db'}?mode=ro", uri=True, timeout=10)
        try:
            row = db.execute("SELECT state FROM commands WHERE id = ?", (command_id,)).fetchone()
        finally:
            db.close()
        return row[0] if row else None


@pytest.fixture
def daemon(tmp_path):
    """A running spikeguardd, stopped (or killed) at the end of the test."""
    d = Daemon(tmp_path)
    d.start()
    try:
        yield d
    finally:
        if d.running:
            code = d.stop()
            if code != 0:
                print(f"spikeguardd exited with {code}:\n{d.log()[-4000:]}", file=sys.stderr)


@pytest.fixture
def daemon_factory(tmp_path):
    """Makes daemons that are not started yet: factory(extra_args=[...]) -> Daemon."""
    made: List[Daemon] = []

    def make(extra_args: Optional[List[str]] = None, name: Optional[str] = None) -> Daemon:
        directory = tmp_path / (name or f"daemon{len(made)}")
        directory.mkdir(parents=True, exist_ok=True)
        d = Daemon(directory, extra_args)
        made.append(d)
        return d

    yield make
    for d in made:
        if d.running:
            d.stop()
