"""A test that starts a tool the quick-start environment lacks must say so with its markers.

The fast tier (`-m "not integration and not slow and not engine"`) runs in the README's
quick-start environment, where neither the Debian packages `.ci/run` installs (prometheus,
promtool, alertmanager, amtool, redis-server), nor checkov (its own virtualenv), nor the
engine extra's commands and modules exist. A test that starts one of them (or a Python child
that imports the engine extra) without the markers that leave it out of the fast tier passes
here and in CI, and fails on the quick start's machine. While a test runs (its setup, call
and teardown: module-scoped fixtures are set up inside the first test that uses them), every
process started through `subprocess.Popen` is checked against TOOLS (and a Python child's
`-m` or `-c`) and refused, naming the missing markers, before it starts.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

# command -> the markers a test that starts it must carry
_APT = ("integration",)  # .ci/run: apt-get install prometheus prometheus-alertmanager redis-server
TOOLS: dict[str, tuple[str, ...]] = {
    "prometheus": _APT, "promtool": _APT, "prometheus-alertmanager": _APT, "alertmanager": _APT,
    "amtool": _APT, "redis-server": _APT,
    "checkov": ("integration",),  # .ci/run: its own virtualenv
    "vllm": ("integration", "engine"), "vllm-router": ("integration", "engine"),  # the engine extra
}

# a Python child (`sys.executable -c CODE` or `-m MODULE`) that imports the engine extra
_ENGINE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:vllm|torch|transformers|triton)\b", re.M)

_current: list[pytest.Item | None] = [None]


class UnmarkedTool(RuntimeError):
    pass


def command_name(args) -> str:
    """The program a Popen call runs, without its directory."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        try:
            first = shlex.split(text)[0] if text.strip() else text
        except ValueError:
            first = text.split()[0]
    else:
        first = os.fsdecode(list(args)[0]) if args else ""
    return os.path.basename(first)


def required_markers(args) -> tuple[str, tuple[str, ...]]:
    """(what it runs, the markers a test that starts it must carry)."""
    command = command_name(args)
    if isinstance(args, (list, tuple)) and len(args) > 2 and os.fsdecode(args[0]) == sys.executable:
        flag, what = os.fsdecode(args[1]), os.fsdecode(args[2])
        if flag == "-m" and what.split(".")[0] == "vllm":
            return f"python -m {what}", ("integration", "engine")
        if flag == "-c" and _ENGINE_IMPORT.search(what):
            return "python -c (importing the engine extra)", ("engine",)
    return repr(command), TOOLS.get(command, ())


def check(args) -> None:
    item = _current[0]
    if item is None:
        return
    what, markers = required_markers(args)
    missing = [m for m in markers if item.get_closest_marker(m) is None]
    if missing:
        raise UnmarkedTool(
            f"{item.nodeid} starts {what}, which the quick-start environment lacks "
            f"(tests/tool_guard.py): mark it {' and '.join(missing)} so the fast tier leaves it out")


_popen_init = subprocess.Popen.__init__


def _guarded_init(self, args, *a, **kw):
    check(kw.get("executable") or args)
    _popen_init(self, args, *a, **kw)


def install() -> None:
    subprocess.Popen.__init__ = _guarded_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _current[0] = item
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current[0] = item
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _current[0] = item
    yield
    _current[0] = None
