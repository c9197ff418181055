"""Real vLLM Router processes and vLLM metrics, for the tests and benchmarks that run several
vLLM servers at once (P/D disaggregation over NIXL, cache-aware routing).

* ``VllmRouter``: the ``vllm-router`` binary (PyPI ``vllm-router``, the engine extra) on a
  free loopback port, in its own process group, logged to a file, stopped on exit.
* ``metric_sum``: one vLLM counter summed over the samples whose labels match, read from
  the live ``/metrics`` text with prometheus_client's parser.
* ``machine_server_lock``: the machine-wide vLLM lock of tests/vllm_harness.py, held while
  a test runs more than one server (two tiny servers and the router fit in a few GiB; no
  other vLLM test may start its own meanwhile).
* ``nixl_kv_transfer_config``: the ``--kv-transfer-config`` of a NIXL P/D server on a CPU
  build of vLLM (KV in host memory, moved by UCX over loopback).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from ports import free_port
from vllm_harness import SERVER_LOCK, ManagedProcess, VllmStartupError


def router_binary() -> str | None:
    """The ``vllm-router`` console script of this interpreter's environment, else PATH's."""
    here = Path(sys.executable).parent / "vllm-router"
    return str(here) if here.exists() else shutil.which("vllm-router")


def nixl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("nixl") is not None


def nixl_kv_transfer_config() -> str:
    # kv_both: either role; the router's request decides which side prefills. kv_buffer_device
    # cpu: the CPU build keeps its KV in host memory and NIXL registers that memory.
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"})


class VllmRouter(ManagedProcess):
    """A real ``vllm-router`` process (context manager)."""

    stop_timeout = 15.0
    tail_lines = 40

    def __init__(self, args: Sequence[str], *, log_path: str | os.PathLike[str] | None = None,
                 startup_timeout: float = 120.0, env: Mapping[str, str] | None = None) -> None:
        binary = router_binary()
        if binary is None:
            raise VllmStartupError("vllm-router is not installed (pip install -e '.[engine]')")
        self.port = free_port()
        self.prometheus_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [binary, "--host", "127.0.0.1", "--port", str(self.port),
                        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prometheus_port),
                        *args]
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm-router-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.startup_timeout = startup_timeout
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "VllmRouter":
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)
        log.close()
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < self.startup_timeout:
                if self.proc.poll() is not None:
                    raise VllmStartupError(f"vllm-router exited with {self.proc.returncode}; "
                                           f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                        if r.status == 200:
                            return self
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
                time.sleep(0.5)
            raise VllmStartupError(f"vllm-router not healthy after {self.startup_timeout:.0f}s; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
        except BaseException:
            self.stop()
            raise



def metrics_text(base_url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (a counter's ``_total`` sample included) whose labels
    include ``labels``. KeyError when the metric is not exposed at all."""
    from prometheus_client.parser import text_string_to_metric_families

    found, total = False, 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name not in (name, name + "_total"):
                continue
            found = True
            if all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    if not found:
        raise KeyError(f"metric {name} not in the /metrics text")
    return total


@contextlib.contextmanager
def running(*servers) -> Iterator[tuple]:
    """Start the servers (VllmServer or VllmRouter) side by side, wait for all, stop all on
    exit, also when one fails to start."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            for f in [pool.submit(s.start) for s in servers]:
                f.result()
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def machine_server_lock(timeout: float = 3600.0) -> Iterator[None]:
    """Hold the machine-wide vLLM server lock (tests/vllm_harness.py SERVER_LOCK)."""
    import fcntl

    path = Path(os.environ.get("DSVOLC_VLLM_LOCK", SERVER_LOCK))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise VllmStartupError(f"another process held {path} (a vLLM server) for {timeout:.0f}s")
                time.sleep(2.0)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)


__all__ = ["VllmRouter", "running", "metric_sum", "metrics_text", "machine_server_lock", "nixl_kv_transfer_config",
           "router_binary", "nixl_available"]
