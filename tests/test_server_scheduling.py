"""The parallel run's handling of the real vLLM servers (tests/server_scheduling.py), run
as pytest itself runs it: a child pytest process with the project's own conftest.

* Under ``-n 2 --dist loadgroup`` every test of the files that start servers runs on one
  worker, first there, and every other file stays on one worker: the child records
  where each collected test was sent (without running it).
* Waiting for the server lock, held by another process, does not count against a
  test's timeout, while a test that hangs once it holds the lock still times out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest

from server_scheduling import SERVER_GROUP, work_unit
from vllm_harness import VLLM_SERVER_FILES

# The child runs are whole pytest sessions (two workers for the first): the full run's.
child_run = pytest.mark.slow
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# Files beside the server files in the child run: a parametrized one, a plain one and a
# module with module-scoped fixtures.
OTHER_FILES = ["test_catalog.py", "test_planner.py", "test_size_cli.py"]

RECORDER = """
import json, os
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    with open(os.environ["SCHEDULE_RECORD"], "a") as f:
        f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), item.nodeid]) + "\\n")
    return True  # recorded, not run: no server starts
"""


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT), env.get("PYTHONPATH", "")])
    return {**env, **extra}


@child_run
def test_server_files_run_on_one_worker_first_and_other_files_stay_whole(tmp_path):
    (tmp_path / "schedule_recorder.py").write_text(RECORDER)
    record = tmp_path / "record.jsonl"
    server_files = sorted(str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py") if p.name in VLLM_SERVER_FILES)
    assert len(server_files) == len(VLLM_SERVER_FILES), "a listed server file is missing"
    # The kernels' server files import vLLM to collect (half a minute per worker); the
    # scheduler decides by file name alone, which test_every_server_file_is_in_the_unit covers.
    files = [f for f in server_files if not f.startswith("tests/kernels/")] + [f"tests/{f}" for f in OTHER_FILES]
    env = _child_env(SCHEDULE_RECORD=str(record))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "schedule_recorder",
                          "-n", "2", "--dist", "loadgroup", *files],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert record.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    by_worker: dict[str, list[str]] = defaultdict(list)
    for worker, nodeid in runs:
        by_worker[worker].append(nodeid)

    def is_server(nodeid: str) -> bool:
        return Path(nodeid.split("::", 1)[0]).name in VLLM_SERVER_FILES

    server_workers = {w for w, nodeid in runs if is_server(nodeid)}
    assert any(is_server(n) for _, n in runs), "no server test was collected"
    assert len(server_workers) == 1, {w: sorted({n.split("::")[0] for n in ids if is_server(n)})
                                      for w, ids in by_worker.items()}
    (server_worker,) = server_workers
    ids = by_worker[server_worker]
    first_other = next((i for i, n in enumerate(ids) if not is_server(n)), len(ids))
    assert all(not is_server(n) for n in ids[first_other:]), "the server unit did not run first on its worker"
    for f in OTHER_FILES:
        workers = {w for w, n in runs if n.startswith(f"tests/{f}::")}
        assert len(workers) == 1, (f, workers)
    assert len(by_worker) == 2, "the other worker ran nothing"


def test_every_server_file_is_in_the_server_unit():
    for p in TESTS.rglob("test_*.py"):
        nodeid = f"{p.relative_to(ROOT).as_posix()}::test_x[a-b]"
        expected = SERVER_GROUP if p.name in VLLM_SERVER_FILES else p.relative_to(ROOT).as_posix()
        assert work_unit(nodeid) == expected, nodeid
    # an xdist_group mark, where xdist's node id suffix survives, still groups
    assert work_unit("tests/test_catalog.py::test_x[a@b]@g") == "g"
    assert work_unit("tests/test_catalog.py::test_x[a@b]") == "tests/test_catalog.py"


CHILD_TESTS = """
import time
from pathlib import Path

import pytest

import conftest
import vllm_harness

conftest.VLLM_AVAILABLE = True  # stand-in servers: the pool and the timer are under test


class _Proc:
    def poll(self):
        return None


def _start(self):
    self.proc = _Proc()
    return self


vllm_harness.VllmServer.start = _start
vllm_harness.VllmServer.stop = lambda self, timeout=30.0: None
HERE = Path(__file__).parent


def test_session_fixtures_are_set_up_first():
    # The session's autouse fixtures (the program-run cache) are set up here, outside
    # the short timeouts below, which a busy machine could otherwise spend on imports.
    pass


@pytest.mark.timeout(3)
def test_waits_for_the_lock_longer_than_its_timeout(vllm_server):
    (HERE / "waiting").write_text("")  # the holder keeps the lock 5 s more from now
    t0 = time.monotonic()
    vllm_server(HERE / "model-a")
    assert time.monotonic() - t0 > 4


@pytest.mark.timeout(3)
def test_a_hang_while_holding_the_lock_times_out(vllm_server):
    vllm_server(HERE / "model-a")
    time.sleep(30)
"""

HOLDER = """
import fcntl, os, sys, time
from pathlib import Path
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
waiting = Path(sys.argv[2])
deadline = time.monotonic() + 120
while not waiting.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(5)
"""


@child_run
def test_waiting_for_the_server_lock_is_not_a_tests_time_but_a_hang_is(tmp_path):
    child = tmp_path / "child"
    child.mkdir()
    (child / "test_child.py").write_text(textwrap.dedent(CHILD_TESTS))
    lock = tmp_path / "vllm.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(child / "waiting")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        report = tmp_path / "report.xml"
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "conftest",
             "--rootdir", str(child), "-c", os.devnull, f"--junitxml={report}", str(child / "test_child.py")],
            cwd=child, env=_child_env(DSVOLC_VLLM_LOCK=str(lock), DSVOLC_TEST_LOGS=str(tmp_path / "logs")),
            capture_output=True, text=True, timeout=300)
    finally:
        holder.kill()
        holder.wait()
    assert report.exists(), out.stdout[-3000:] + out.stderr[-3000:]
    cases = {c.get("name"): c for c in ET.parse(report).iter("testcase")}
    assert len(cases) == 3, out.stdout[-3000:]
    waited = cases["test_waits_for_the_lock_longer_than_its_timeout"]
    assert not list(waited), out.stdout[-3000:]  # no failure, error or skip element
    hung = cases["test_a_hang_while_holding_the_lock_times_out"]
    failure = hung.find("failure")
    assert failure is not None and "Timeout" in (failure.get("message", "") + (failure.text or "")), out.stdout[-3000:]
    assert float(hung.get("time")) < 10


def test_the_timeline_sums_each_workers_busy_time_from_the_first_start():
    from server_scheduling import timeline_lines
    spans = {("worker", "gw0"): [(100.0, 130.0), (140.0, 150.0)], ("worker", "gw1"): [(101.0, 200.0)],
             ("unit", "vllm-servers"): [(100.0, 130.0)]}
    assert timeline_lines(spans, 100.0) == [
        "unit vllm-servers: busy 30 s, from 0 s to 30 s",
        "worker gw0: busy 40 s, from 0 s to 50 s",
        "worker gw1: busy 99 s, from 1 s to 100 s",
    ]


def test_the_server_files_run_in_the_order_that_shares_servers():
    from types import SimpleNamespace

    from server_scheduling import order_server_files
    from vllm_harness import SERVER_FILE_ORDER, VLLM_SERVER_FILES

    assert set(SERVER_FILE_ORDER) == VLLM_SERVER_FILES  # every server file has its place
    ids = ["tests/a_test.py::x", "tests/test_serving_vllm.py::t1", "tests/test_bench_vllm.py::b",
           "tests/kernels/test_vllm_plugin.py::p1", "tests/z_test.py::y", "tests/test_metrics_contract.py::m",
           "tests/kernels/test_vllm_plugin.py::p2", "tests/test_serving_vllm.py::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    order_server_files(items)
    assert [i.nodeid for i in items] == [
        "tests/a_test.py::x", "tests/kernels/test_vllm_plugin.py::p1", "tests/kernels/test_vllm_plugin.py::p2",
        "tests/test_serving_vllm.py::t1", "tests/z_test.py::y", "tests/test_serving_vllm.py::t2",
        "tests/test_metrics_contract.py::m", "tests/test_bench_vllm.py::b"]
