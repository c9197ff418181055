"""The headless worker's liveness check, on real processes titled the way vLLM titles its
engine processes (setproctitle, as vllm/utils/system_utils.py does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime import health

ROOT = Path(__file__).resolve().parents[1]
TITLED = ("import setproctitle, sys, time\n"
          "setproctitle.setproctitle(sys.argv[1])\n"
          "print('up', flush=True)\n"
          "time.sleep(300)\n")


@pytest.fixture()
def workers():
    prefix = f"VLLMT{os.getpid()}::"
    procs = []
    for rank in range(3):
        p = subprocess.Popen([sys.executable, "-c", TITLED, f"{prefix}Worker_PP1_TP{rank}"], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == b"up"
        procs.append(p)
    try:
        yield prefix, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def probe(prefix: str, expect: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.health", "workers", "--expect", str(expect),
                           "--prefix", prefix], cwd=ROOT, capture_output=True, text=True)


def test_all_engine_processes_alive_passes(workers):
    prefix, procs = workers
    assert set(health.engine_processes(prefix)) == {p.pid for p in procs}
    assert probe(prefix, 3).returncode == 0


def test_a_dead_engine_process_fails_the_probe(workers):
    prefix, procs = workers
    procs[1].kill()
    procs[1].wait()
    out = probe(prefix, 3)
    assert out.returncode == 1
    assert "2 of 3 vLLM engine processes alive" in out.stderr
    assert f"{prefix}Worker_PP1_TP1" not in out.stderr and f"{prefix}Worker_PP1_TP0" in out.stderr


def test_a_zombie_engine_process_counts_as_dead(workers):
    prefix, procs = workers
    os.kill(procs[2].pid, signal.SIGKILL)  # not reaped: stays a zombie until wait()
    deadline = time.monotonic() + 10
    while procs[2].pid in health.engine_processes(prefix) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{procs[2].pid}").exists()  # still there, as a zombie
    assert health.check(3, prefix) and not health.check(2, prefix)
