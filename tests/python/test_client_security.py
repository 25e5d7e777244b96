"""spikeguard.Client's side of security, against a Python gRPC WorkerService.

The token travels as ``authorization: Bearer <token>`` metadata on the Attach
stream; TLS (and mutual TLS) verify the daemon with the given CA; the
settings default to the environment the daemon's launcher sets
(SPIKEGUARD_TOKEN[_FILE], SPIKEGUARD_TLS_*); a refused token stops the client
at once with Unauthorized, and the token never shows in what it says.
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from conftest import REPO, wait_until
from spikeguard import Client, Rejected, Unauthorized
from spikeguard.v1 import telemetry_pb2, worker_pb2, worker_pb2_grpc

TOKEN = "py-t0ken-0123456789abcdef"
ENV = ["SPIKEGUARD_TOKEN", "SPIKEGUARD_TOKEN_FILE", "SPIKEGUARD_TLS_CA", "SPIKEGUARD_TLS_CERT",
       "SPIKEGUARD_TLS_KEY", "SPIKEGUARD_TLS_SERVER_NAME"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(REPO / "tests" / "testdata" / "make_test_certs.sh"), str(out)],
                   check=True)
    return out


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


class Service(worker_pb2_grpc.WorkerServiceServicer):
    """Welcomes, acknowledges and records each stream's authorization metadata.

    With ``expected`` set, a stream without that bearer token is refused with
    ``refusal`` (a grpc.StatusCode), or with Reject(BAD_TOKEN) when None.
    """

    def __init__(self, expected=None, refusal=None):
        self.expected = expected
        self.refusal = refusal
        self.lock = threading.Lock()
        self.authorizations = []
        self.reports = 0

    def Attach(self, request_iterator, context):
        auth = dict(context.invocation_metadata()).get("authorization", "")
        with self.lock:
            self.authorizations.append(auth)
        if self.expected is not None and auth != f"Bearer {self.expected}":
            if self.refusal is not None:
                context.abort(self.refusal, "the daemon says no")
            next(request_iterator, None)
            yield worker_pb2.ControllerMessage(reject=worker_pb2.Reject(
                reason=worker_pb2.Reject.BAD_TOKEN, message="unknown bearer token"))
            return
        hello = next(request_iterator, None)
        if hello is None:
            return
        yield worker_pb2.ControllerMessage(welcome=worker_pb2.Welcome(
            run=hello.hello.run, generation=hello.hello.generation, committed_step=-1))
        for msg in request_iterator:
            if msg.WhichOneof("body") == "reports":
                with self.lock:
                    self.reports += len(msg.reports.reports)
                yield worker_pb2.ControllerMessage(ack=worker_pb2.Ack(
                    seq=msg.reports.seq, accepted=len(msg.reports.reports)))


class Server:
    def __init__(self, service: Service, certs: Path = None, require_client_cert: bool = False):
        self.service = service
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, self.server)
        if certs is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            creds = grpc.ssl_server_credentials(
                [((certs / "server.key").read_bytes(), (certs / "server.pem").read_bytes())],
                root_certificates=(certs / "ca.pem").read_bytes(),
                require_client_auth=require_client_cert)
            port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.address = f"127.0.0.1:{port}"
        self.server.start()

    def stop(self):
        self.server.stop(grace=None)


@pytest.fixture
def serve():
    servers = []

    def make(*args, **kw) -> Server:
        s = Server(*args, **kw)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


def client(address: str, **kw) -> Client:
    kw.setdefault("max_backoff", 0.1)
    kw.setdefault("initial_backoff", 0.02)
    kw.setdefault("close_grace", 0.5)
    return Client(address, "run", **kw)


def test_token_and_tls_from_arguments(serve, certs):
    server = serve(Service(expected=TOKEN), certs)
    c = client(server.address, token=TOKEN, tls_ca=str(certs / "ca.pem"))
    c.start(timeout=20)
    for s in range(20):
        c.report(telemetry_pb2.StepReport(step=s, loss=1.0))
    c.flush(timeout=20)
    c.close()
    assert server.service.reports == 20
    assert server.service.authorizations == [f"Bearer {TOKEN}"]


def test_everything_from_the_environment_with_mutual_tls(serve, certs, monkeypatch, tmp_path):
    server = serve(Service(expected=TOKEN), certs, require_client_cert=True)
    token_file = tmp_path / "token"
    token_file.write_text(f"  {TOKEN}  \nsecond line\n")
    monkeypatch.setenv("SPIKEGUARD_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("SPIKEGUARD_TLS_CA", str(certs / "ca.pem"))
    monkeypatch.setenv("SPIKEGUARD_TLS_CERT", str(certs / "client.pem"))
    monkeypatch.setenv("SPIKEGUARD_TLS_KEY", str(certs / "client.key"))
    monkeypatch.setenv("SPIKEGUARD_TLS_SERVER_NAME", "localhost")
    c = client(server.address)
    c.start(timeout=20)
    c.close()
    assert server.service.authorizations == [f"Bearer {TOKEN}"]

    # Without the client certificate the server is never reached.
    monkeypatch.delenv("SPIKEGUARD_TLS_CERT")
    monkeypatch.delenv("SPIKEGUARD_TLS_KEY")
    anonymous = client(server.address)
    with pytest.raises(TimeoutError, match="not connected"):
        anonymous.start(timeout=1)
    anonymous.close()
    assert len(server.service.authorizations) == 1


def test_arguments_win_over_the_environment(serve, monkeypatch, tmp_path):
    server = serve(Service())
    monkeypatch.setenv("SPIKEGUARD_TOKEN", "from-env")
    for kw, expected in [({}, "Bearer from-env"), ({"token": "from-arg"}, "Bearer from-arg"),
                         ({"token": ""}, ""), ({"token_file": str(tmp_path / "t")}, "Bearer from-file")]:
        (tmp_path / "t").write_text("from-file\n")
        c = client(server.address, **kw)
        c.start(timeout=20)
        c.close()
        assert server.service.authorizations[-1] == expected, kw
    # SPIKEGUARD_TOKEN wins over SPIKEGUARD_TOKEN_FILE; the file alone is read.
    monkeypatch.setenv("SPIKEGUARD_TOKEN_FILE", str(tmp_path / "t"))
    c = client(server.address)
    c.start(timeout=20)
    c.close()
    assert server.service.authorizations[-1] == "Bearer from-env"
    monkeypatch.delenv("SPIKEGUARD_TOKEN")
    c = client(server.address)
    c.start(timeout=20)
    c.close()
    assert server.service.authorizations[-1] == "Bearer from-file"


def test_bad_token_reject_is_final_and_says_what_to_set(serve, caplog):
    server = serve(Service(expected="the-right-one"))
    c = client(server.address, token=TOKEN)
    with pytest.raises(Unauthorized) as info:
        c.start(timeout=20)
    assert isinstance(info.value, Rejected)
    assert info.value.reason == "BAD_TOKEN" and info.value.code == "BAD_TOKEN"
    assert "unknown bearer token" in str(info.value)
    assert "check the token from token: the daemon's tokens file must have its hash" \
        in str(info.value)
    time.sleep(0.5)  # backoff is 20 ms: no retry happened
    assert len(server.service.authorizations) == 1
    with pytest.raises(Unauthorized):
        c.flush(timeout=1)
    c.close()
    assert TOKEN not in str(info.value) and TOKEN not in caplog.text


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED])
def test_auth_status_ends_the_client(serve, caplog, code, monkeypatch):
    server = serve(Service(expected="the-right-one", refusal=code))
    if code == grpc.StatusCode.PERMISSION_DENIED:
        monkeypatch.setenv("SPIKEGUARD_TOKEN", TOKEN)
    c = client(server.address)
    with pytest.raises(Unauthorized) as info:
        c.start(timeout=20)
    assert info.value.code == code.name
    assert info.value.reason == "BAD_TOKEN"
    assert f"{code.name}: the daemon says no" in str(info.value)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        assert "no token was sent: set SPIKEGUARD_TOKEN" in str(info.value)
    else:
        assert "the token from SPIKEGUARD_TOKEN is valid but its role" in str(info.value)
    assert c.rejection is not None
    time.sleep(0.5)
    assert len(server.service.authorizations) == 1
    c.close()
    assert TOKEN not in str(info.value) and TOKEN not in caplog.text


def test_another_ca_is_retried_and_explained(serve, certs):
    server = serve(Service(), certs)
    c = client(server.address, tls_ca=str(certs / "other-ca.pem"))
    with pytest.raises(TimeoutError) as info:
        c.start(timeout=1.5)
    assert "last error UNAVAILABLE" in str(info.value)
    assert f"TLS with the CA of tls_ca '{certs / 'other-ca.pem'}'" in str(info.value)
    assert c.rejection is None  # not final: the daemon may get the right certificate
    c.close()
    assert server.service.authorizations == []

    # A client in clear against a TLS server is told TLS may be the cause.
    plain = client(server.address)
    with pytest.raises(TimeoutError, match="set SPIKEGUARD_TLS_CA"):
        plain.start(timeout=1.5)
    plain.close()


def test_unreadable_or_incomplete_settings_name_the_file(certs, monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="cannot read token_file '/nonexistent/tok'"):
        Client("127.0.0.1:1", "run", token_file="/nonexistent/tok")
    monkeypatch.setenv("SPIKEGUARD_TOKEN_FILE", "/nonexistent/env-tok")
    with pytest.raises(ValueError, match="cannot read SPIKEGUARD_TOKEN_FILE '/nonexistent/env-tok'"):
        Client("127.0.0.1:1", "run")
    monkeypatch.delenv("SPIKEGUARD_TOKEN_FILE")
    empty = tmp_path / "empty"
    empty.write_text("\n" + TOKEN)
    with pytest.raises(ValueError, match="holds no token") as info:
        Client("127.0.0.1:1", "run", token_file=str(empty))
    assert TOKEN not in str(info.value)
    with pytest.raises(ValueError, match="cannot have") as info:
        Client("127.0.0.1:1", "run", token=TOKEN + " x")
    assert TOKEN not in str(info.value)
    monkeypatch.setenv("SPIKEGUARD_TLS_CA", "/nonexistent/ca.pem")
    with pytest.raises(ValueError, match="cannot read SPIKEGUARD_TLS_CA '/nonexistent/ca.pem'"):
        Client("127.0.0.1:1", "run")
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("hello\n")
    with pytest.raises(ValueError, match="is not PEM"):
        Client("127.0.0.1:1", "run", tls_ca=str(not_pem))
    with pytest.raises(ValueError, match="tls_cert needs a key"):
        Client("127.0.0.1:1", "run", tls_ca=str(certs / "ca.pem"), tls_cert=str(certs / "client.pem"))
    monkeypatch.delenv("SPIKEGUARD_TLS_CA")
    with pytest.raises(ValueError, match="needs tls_ca"):
        Client("127.0.0.1:1", "run", tls_cert=str(certs / "client.pem"),
               tls_key=str(certs / "client.key"))
