"""The rate-limit Redis, as rendered, refuses clients without the password: a real
redis-server (Debian `redis-server`; CI's .ci/run installs it) started with the rendered
container arguments, the kubelet's $(VAR) expansion done as the kubelet does it."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time

import pytest

import stacks
from stacks.plan import build_plan
from workloads.platform import controllers as platform

pytestmark = pytest.mark.integration


def _command(sock: socket.socket, *parts: str) -> bytes:
    msg = f"*{len(parts)}\r\n" + "".join(f"${len(p.encode())}\r\n{p}\r\n" for p in parts)
    sock.sendall(msg.encode())
    return sock.recv(4096)


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args (unknown names stay as written)."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


@pytest.fixture
def redis(tmp_path):
    binary = shutil.which("redis-server")
    assert binary, "redis-server not found: apt-get install -y redis-server (CI's .ci/run does)"
    dep = next(o for o in platform.manifests(build_plan(stacks.load("staging"))) if o["kind"] == "Deployment"
               and o["metadata"]["name"] == platform.REDIS_NAME)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    password = "Zq3xTestPassword0123456789abcdef"  # what RandomPassword would put in the Secret
    env = {e["name"]: password for e in c["env"]}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, *_expand(c["args"], env), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=2)
            break
        except OSError:
            assert time.time() < deadline, "redis-server did not start"
            time.sleep(0.1)
    try:
        yield sock, password
    finally:
        sock.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_refuses_commands_without_the_password(redis):
    sock, password = redis
    assert _command(sock, "INCR", "ratelimit-counter").startswith(b"-NOAUTH")
    assert _command(sock, "AUTH", "wrong-password").startswith(b"-WRONGPASS")
    assert _command(sock, "AUTH", password) == b"+OK\r\n"
    assert _command(sock, "INCR", "ratelimit-counter") == b":1\r\n"
