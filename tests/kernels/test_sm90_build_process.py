"""The build process the Gluon kernels' sm_90a build tests share (tests/sm90_build.py): one per
test process, kept between builds, so what one build leaves must not reach the next. A build
that raises names its error, a process that dies is told with its stderr and replaced, and a
reply that arrives after its build gave up is never taken for a later build's."""

import pytest
from engine_extra import require

require("torch", "triton")
import sm90_build  # noqa: E402


def _fresh():
    sm90_build._stop()


def test_a_build_that_raises_fails_with_its_error_and_the_process_serves_on():
    _fresh()
    with pytest.raises(AssertionError, match="AttributeError.*no_such_report"):
        sm90_build.build("no_such_report")
    first = sm90_build._worker
    assert first is not None and first.poll() is None  # the same process, still serving
    with pytest.raises(AssertionError, match="ValueError: mla_sm90 config"):
        sm90_build.build("mla_sm90_build", dict(LEFT=64))
    assert sm90_build._worker is first


def test_a_dead_build_process_is_told_and_replaced():
    _fresh()
    with pytest.raises(AssertionError, match="no_such_report"):
        sm90_build.build("no_such_report")  # starts the process
    dead = sm90_build._worker
    dead.stdin.write(b'{"id": 0, "report": "x", "args": [], "kwargs": {}}\n')  # read before the exit below
    dead.stdin.write(b"import-os-and-exit\n")  # not JSON: the serving loop raises and the process exits
    dead.stdin.flush()
    with pytest.raises(AssertionError, match=r"(?s)build process exited \(1\).*JSONDecodeError"):
        sm90_build.build("no_such_report")
    assert sm90_build._worker is None
    with pytest.raises(AssertionError, match="AttributeError"):
        sm90_build.build("no_such_report")
    assert sm90_build._worker is not dead and sm90_build._worker.poll() is None


def test_a_late_reply_is_not_taken_for_the_next_build(monkeypatch):
    _fresh()
    with pytest.raises(AssertionError, match="no_such_report"):
        sm90_build.build("no_such_report")
    # a build that gave up leaves its reply in the pipe: the next one must skip it by its id
    sm90_build._asked += 1
    sm90_build._worker.stdin.write(b'{"id": %d, "report": "no_such_report", "args": [], "kwargs": {}}\n'
                                   % sm90_build._asked)
    sm90_build._worker.stdin.flush()
    with pytest.raises(AssertionError, match="has no attribute 'other_missing_report'"):
        sm90_build.build("other_missing_report")
