"""How a parallel run keeps the real vLLM servers from waiting on each other.

Only one vLLM server runs at a time, machine-wide (``vllm_harness.ServerPool`` holds a
file lock while one runs). Two things keep that lock from costing a test its timeout:

* Scheduling. Under ``-n N --dist loadgroup`` the files that start servers
  (``vllm_harness.VLLM_SERVER_FILES``) are one work unit: one worker runs all of them,
  starting with them (they are the longest unit), while the other workers take every
  other file, a file per unit (so a module's fixtures are computed once). Within a run
  the lock is then never contended. The unit is decided from each test's node id by the
  scheduler below, not by ``xdist_group`` marks: pytest-xdist 3.8 reads those marks by
  rewriting the node id, which pytest 9.2's structured node ids ignore
  (pytest-dev/pytest-xdist#1386), and marks a conftest adds at collection come after
  xdist has read them anyway. An ``xdist_group`` mark written in a file still groups.
* Timeouts. When another process holds the lock (a second checkout's run on the same
  machine), the wait is not the test's: pytest-timeout's timer is stopped while the pool
  waits and started again, with the time that was left, once the lock is held. A test
  that hangs after that still times out.

At the end of a parallel run the terminal summary prints each worker's busy time and when it
finished, and the server unit's: whether the server unit is the run's critical path (and so
what a cut of the full run's time must shorten) reads from there.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import pytest

from vllm_harness import SERVER_FILE_ORDER, VLLM_SERVER_FILES

SERVER_GROUP = "vllm-servers"


def work_unit(nodeid: str) -> str:
    """The scheduling unit of a test: the server group, an explicit xdist_group, or its file."""
    path = nodeid.split("::", 1)[0]
    if path.rsplit("/", 1)[-1] in VLLM_SERVER_FILES:
        return SERVER_GROUP
    if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's own suffix, where pytest keeps it
        return nodeid.rsplit("@", 1)[1]
    return path


def order_server_files(items: list) -> None:
    """Sort, in place, the server files' tests into SERVER_FILE_ORDER (each file's own order
    kept), in the slots they held; every other test stays where it was."""
    def name(item) -> str:
        return item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]

    slots = [i for i, item in enumerate(items) if name(item) in VLLM_SERVER_FILES]
    rank = {f: r for r, f in enumerate(SERVER_FILE_ORDER)}
    ordered = sorted((items[i] for i in slots), key=lambda it: rank.get(name(it), len(rank)))  # stable
    for i, item in zip(slots, ordered):
        items[i] = item


def _scheduler_class():
    from xdist.scheduler import LoadScopeScheduling

    class ServerFileScheduling(LoadScopeScheduling):
        """xdist's scope scheduling with :func:`work_unit` as the scope, the server unit first."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if SERVER_GROUP in self.workqueue:
                self.workqueue.move_to_end(SERVER_GROUP, last=False)
            super()._assign_work_unit(node)

    return ServerFileScheduling


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") == "loadgroup":
        return _scheduler_class()(config, log)
    return None


# -- timeouts ---------------------------------------------------------------------------

_CURRENT = pytest.StashKey["pytest.Item"]()
_TIMER = pytest.StashKey[tuple[float, Any]]()  # (when the timer started, its settings)


@pytest.hookimpl(hookwrapper=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any):
    item.stash[_TIMER] = (time.monotonic(), settings)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    item.config.stash[_CURRENT] = item
    try:
        yield
    finally:
        del item.config.stash[_CURRENT]


@contextlib.contextmanager
def timeout_paused(config: pytest.Config) -> Iterator[None]:
    """Stop the running test's pytest-timeout timer for the block; restart it with what was left."""
    item = config.stash.get(_CURRENT, None)
    timer = item.stash.get(_TIMER, None) if item is not None else None
    if timer is None:  # no test running, or no timeout set for it
        yield
        return
    started, settings = timer
    hook = item.config.hook
    hook.pytest_timeout_cancel_timer(item=item)
    paused = time.monotonic()
    try:
        yield
    finally:
        left = max(settings.timeout - (paused - started), 0.001)
        hook.pytest_timeout_set_timer(item=item, settings=settings._replace(timeout=left))
        item.stash[_TIMER] = (started + (time.monotonic() - paused), settings)


# -- where the run's time went ------------------------------------------------------------

_SPANS = pytest.StashKey[dict]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set on the controller of an xdist run
    config = getattr(node, "config", None)
    if config is None or not hasattr(report, "start"):
        return
    spans = config.stash.setdefault(_SPANS, {})
    worker = node.gateway.id
    unit = work_unit(report.nodeid)
    spans.setdefault(("worker", worker), []).append((report.start, report.stop))
    if unit == SERVER_GROUP:
        spans.setdefault(("unit", SERVER_GROUP), []).append((report.start, report.stop))


def timeline_lines(spans: dict, t0: float) -> list[str]:
    """One line per worker (and the server unit): busy seconds, first start and last stop from t0."""
    out = []
    for (kind, name), items in sorted(spans.items()):
        busy = sum(b - a for a, b in items)
        first, last = min(a for a, _ in items) - t0, max(b for _, b in items) - t0
        out.append(f"{kind} {name}: busy {busy:.0f} s, from {first:.0f} s to {last:.0f} s")
    return out


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    spans = config.stash.get(_SPANS, None)
    if not spans:
        return
    t0 = min(a for items in spans.values() for a, _ in items)
    terminalreporter.write_sep("-", "time per worker (tests/server_scheduling.py)")
    for line in timeline_lines(spans, t0):
        terminalreporter.write_line(line)
