"""What the Gluon Hopper kernels' tests share: whether a Hopper GPU is here, and their sm_90a
build (kernels/bench/sm90.py's reports) in a separate process, one per test process and kept
between builds, started without TRITON_INTERPRET: the interpreter, which the CPU test runs set,
patches Triton's language for the process it runs in. The build process takes the environment
of its start, so a test that changes the environment for a build must ``_stop()`` it first."""

import atexit
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernels run only on a Hopper (sm_90) GPU")


# One build process per test process, kept between builds: importing torch and Triton costs
# about as much as one sm_90a build (2.5 s each on 2 cores), and a test file asks for dozens.
# Replies are the lines that start with _MARK, each with its request's id (whatever else the
# compiler prints is skipped).
_MARK = "@@sm90-build@@ "
_SERVE = (
    "import json, sys, traceback\n"
    "from kernels.bench import sm90\n"
    "for line in sys.stdin:\n"
    "    req = json.loads(line)\n"
    "    try:\n"
    "        info = getattr(sm90, req['report'])(*req['args'], **req['kwargs'])\n"
    "        info.pop('ptx', None)\n"
    "        out = {'id': req['id'], 'ok': info}\n"
    "    except Exception:\n"
    "        out = {'id': req['id'], 'error': traceback.format_exc()[-3000:]}\n"
    f"    print({_MARK!r} + json.dumps(out), flush=True)\n")
BUILD_TIMEOUT_S = 300
_worker: subprocess.Popen | None = None
_stderr = None  # the build process's stderr, a temporary file: its tail is told if the process dies
_asked = 0  # requests sent: a reply to an earlier one (its test timed out meanwhile) is skipped


def _start() -> subprocess.Popen:
    global _stderr
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    _stderr = tempfile.TemporaryFile()
    return subprocess.Popen([sys.executable, "-u", "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=_stderr, env=env, cwd=ROOT)


def _stderr_tail() -> str:
    _stderr.seek(0)
    return _stderr.read()[-3000:].decode(errors="replace")


def _stop() -> None:
    global _worker
    if _worker is not None:
        _worker.kill()
        _worker.wait()
        _worker = None


atexit.register(_stop)


def _died(report, args):
    global _worker
    code, tail = _worker.wait(), _stderr_tail()
    _worker = None
    raise AssertionError(f"sm90 build {report}{args}: the build process exited ({code}): {tail}")


def build(report: str, *args, **kwargs) -> dict:
    """``kernels.bench.sm90.<report>(*args, **kwargs)`` (JSON-able arguments) in a process
    without TRITON_INTERPRET (one per test process, reused): its registers, spills, MMA counts
    and shared memory, without the PTX. A build that raises fails the test with its traceback;
    one that outlasts ``BUILD_TIMEOUT_S`` or kills the process fails it too, and the next build
    starts a fresh process."""
    global _worker, _asked
    if _worker is None or _worker.poll() is not None:
        _worker = _start()
    _asked += 1
    try:
        _worker.stdin.write((json.dumps(dict(id=_asked, report=report, args=args, kwargs=kwargs)) + "\n").encode())
        _worker.stdin.flush()
    except BrokenPipeError:
        _died(report, args)
    deadline, buf, reply = time.monotonic() + BUILD_TIMEOUT_S, b"", None
    with selectors.DefaultSelector() as sel:  # raw reads: a buffered reader hides lines from select
        sel.register(_worker.stdout, selectors.EVENT_READ)
        while reply is None:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                _stop()
                raise AssertionError(f"sm90 build {report}{args}: no reply in {BUILD_TIMEOUT_S} s")
            chunk = os.read(_worker.stdout.fileno(), 1 << 16)
            if not chunk:
                _died(report, args)
            *lines, buf = (buf + chunk).split(b"\n")
            replies = [json.loads(line[len(_MARK):]) for line in lines if line.startswith(_MARK.encode())]
            reply = next((r for r in replies if r["id"] == _asked), None)  # earlier ids: builds given up
    assert "ok" in reply, reply.get("error")
    return reply["ok"]
