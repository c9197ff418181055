"""The real-vLLM harness's pool: one server at a time, machine-wide, and no log ever lost.

The servers here are stand-ins (VllmServer.start/stop patched): what is under test is the
pool's bookkeeping, which decides whether two 2-4 GiB engines ever run together and
whether a failed start leaves its log behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import vllm_harness
from vllm_harness import ServerPool, VllmStartupError


class _Proc:
    def __init__(self):
        self.alive = True

    def poll(self):
        return None if self.alive else 0


@pytest.fixture
def fake_servers(monkeypatch):
    started, stopped, fail = [], [], []

    def start(self):
        self.log_path.write_text(f"log of {self.model}\n")
        if fail and fail.pop(0):
            raise VllmStartupError(f"died; log {self.log_path}")
        self.proc = _Proc()
        started.append(self)
        return self

    def stop(self, timeout: float = 30.0):
        if self.proc is not None and self.proc.alive:
            self.proc.alive = False
            stopped.append(self)

    monkeypatch.setattr(vllm_harness.VllmServer, "start", start)
    monkeypatch.setattr(vllm_harness.VllmServer, "stop", stop)
    return started, stopped, fail


def test_one_server_at_a_time_and_reuse_of_the_same_one(tmp_path, fake_servers):
    started, stopped, _ = fake_servers
    pool = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock")
    a = pool.get(tmp_path / "model-a", ["--x", "1"])
    assert pool.get(tmp_path / "model-a", ["--x", "1"]) is a and len(started) == 1
    b = pool.get(tmp_path / "model-b")
    assert stopped == [a] and not a.proc.alive and b.proc.alive
    pool.stop_all()
    assert stopped == [a, b]


def test_a_default_asked_for_explicitly_is_the_same_server(tmp_path, fake_servers):
    started, _, _ = fake_servers
    pool = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock")
    a = pool.get(tmp_path / "model-a")
    kv = vllm_harness.DEFAULT_SERVER_ENV["VLLM_CPU_KVCACHE_SPACE"]
    assert pool.get(tmp_path / "model-a", env={"VLLM_CPU_KVCACHE_SPACE": kv}) is a and len(started) == 1
    b = pool.get(tmp_path / "model-a", env={"VLLM_CPU_KVCACHE_SPACE": str(int(kv) + 1)})
    assert b is not a and len(started) == 2
    pool.stop_all()


def test_a_failed_start_keeps_its_log_and_the_retry_writes_a_new_one(tmp_path, fake_servers):
    _, _, fail = fake_servers
    fail.append(True)
    pool = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock")
    with pytest.raises(VllmStartupError):
        pool.get(tmp_path / "model-a")
    srv = pool.get(tmp_path / "model-a")
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(logs) == 2 and srv.log_path.name == logs[1]
    pool.stop_all()


def test_the_lock_keeps_a_second_process_from_starting_a_server(tmp_path, fake_servers):
    first = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock")
    second = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock", lock_timeout=0.1)
    first.get(tmp_path / "model-a")
    with pytest.raises(VllmStartupError, match="held .*lock"):
        second.get(tmp_path / "model-b")
    first.stop_all()  # releases the lock
    second.get(tmp_path / "model-b")
    second.stop_all()


def test_a_failed_start_releases_the_lock(tmp_path, fake_servers):
    _, _, fail = fake_servers
    fail.append(True)
    first = ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock")
    with pytest.raises(VllmStartupError):
        first.get(tmp_path / "model-a")
    ServerPool(tmp_path / "logs", lock_path=tmp_path / "lock", lock_timeout=0.1).get(tmp_path / "model-b")


# Files whose servers are all stand-ins (VllmServer.start patched): this one, and the
# child runs of tests/test_server_scheduling.py.
STAND_IN_ONLY = {Path(__file__).name, "test_server_scheduling.py"}


def test_every_file_that_starts_a_vllm_server_is_in_the_vllm_group():
    """A file that starts real servers outside the group would block the other worker on
    the server lock under `-n 2 --dist loadgroup` (tests/server_scheduling.py)."""
    import re

    starts = re.compile(r"\bvllm_server\b|\bVllmServer\(|\(VllmServer\)")
    users = {p.name for p in Path(__file__).parent.rglob("test_*.py")
             if p.name not in STAND_IN_ONLY and starts.search(p.read_text())}
    assert users, "no test starts a vLLM server: the pattern is stale"
    assert users <= vllm_harness.VLLM_SERVER_FILES, sorted(users - vllm_harness.VLLM_SERVER_FILES)


# --------------------------------------------------------------------------- ports taken under a start

# A stand-in for vLLM's two listeners: NIXL's handshake thread on the port in $SIDE (it dies on
# a taken port and the process goes on waiting, as vLLM's engine did in a CI run) and the HTTP
# server with /health on the harness's port.
_FAKE = r"""
import http.server, os, socket, sys, time
side = socket.socket()
try:
    side.bind(("127.0.0.1", int(os.environ["SIDE"])))
except OSError as e:
    print("zmq.error.ZMQError: Address already in use", e, flush=True)
    while True:
        time.sleep(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class _FakeVllm(vllm_harness.VllmServer):
    @property
    def command(self):
        return [vllm_harness.sys.executable, "-c", _FAKE, str(self.port)]


def test_a_taken_listener_port_is_picked_again_at_once(tmp_path, monkeypatch):
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = vllm_harness.free_port
    picks = iter([taken.getsockname()[1]])
    monkeypatch.setattr(vllm_harness, "free_port", lambda: next(picks, None) or real())
    server = _FakeVllm(tmp_path, port=real(), port_env=("SIDE",), log_path=tmp_path / "fake.log",
                       startup_timeout=120)
    try:
        server.start()
        assert int(server.env["SIDE"]) != taken.getsockname()[1]
        assert server.startup_seconds < 60  # not the 120 s timeout
        first = tmp_path / "fake.log.port-in-use-1"
        assert "Address already in use" in first.read_text()  # the failed attempt's log is kept
    finally:
        server.stop()
        taken.close()


def test_a_port_in_use_fails_fast_without_ports_to_pick(tmp_path):
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    server = _FakeVllm(tmp_path, env={"SIDE": str(taken.getsockname()[1])}, log_path=tmp_path / "f.log",
                       startup_timeout=120)
    t0 = vllm_harness.time.monotonic()
    try:
        with pytest.raises(vllm_harness.VllmPortInUse, match="port taken"):
            server.start()
        assert vllm_harness.time.monotonic() - t0 < 60
        assert server.proc.poll() is not None  # stopped, not left waiting
    finally:
        server.stop()
        taken.close()


def test_free_ports_lie_below_the_ephemeral_range_and_are_not_repeated():
    from ports import ephemeral_low, free_port
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(1024 <= p < ephemeral_low() for p in ports)
