"""A test that needs what the quick-start environment lacks must say so with its markers.

The fast tier (`-m "not integration and not slow and not engine"`) runs in the README's
quick-start environment (`pip install -e '.[dev]'`), which has neither the Debian packages
`.ci/run` installs (prometheus, promtool, alertmanager, amtool, redis-server), nor checkov
(its own virtualenv), nor anything only the engine extra brings (vLLM, torch, tokenizers,
vllm-router and the rest: tests/engine_extra.py's `engine_only`). A test that uses one of
them without the markers that leave it out of the fast tier passes here and in CI and fails
on the quick start's machine. While a test runs (its setup, call and teardown: a
module-scoped fixture is set up inside the first test that uses it), the guard refuses,
naming the missing markers:

* a process started through `subprocess.Popen` whose program is in TOOLS, or a Python child
  that runs (`-m`) or imports (`-c`) an engine-only module;
* an import, by the repository's own code (tests or product), of an engine-only module, or
  of one of the repository's modules that holds one (`kernels.bench.bench_kernels` imports
  torch at its top: importing it again, from a test, needs the engine all the same).

What it does not see: `importlib.import_module` and imports by third-party code.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine_extra import engine_only

ROOT = Path(__file__).resolve().parent.parent

# program -> the markers a test that starts it must carry
_APT = ("integration",)  # .ci/run: apt-get install prometheus prometheus-alertmanager redis-server
TOOLS: dict[str, tuple[str, ...]] = {
    "prometheus": _APT, "promtool": _APT, "prometheus-alertmanager": _APT, "alertmanager": _APT,
    "amtool": _APT, "redis-server": _APT,
    "checkov": ("integration",),  # .ci/run: its own virtualenv
    "vllm": ("integration", "engine"), "vllm-router": ("integration", "engine"),  # the engine extra
}
_IMPORTS = re.compile(r"(?:^|;)\s*(?:from|import)\s+([A-Za-z_]\w*)", re.M)

_current: list[pytest.Item | None] = [None]
# the running test when it lacks the engine marker (the one whose imports are checked): the
# import check runs on every import statement, hundreds of thousands a file, so it is cheap
_without_engine: list[pytest.Item | None] = [None]


class QuickStartLacks(RuntimeError):
    """A test used what the quick-start environment lacks without the markers that say so."""


def engine_modules() -> frozenset[str]:
    return engine_only()[0]


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
    """(what a Popen call runs, the markers a test that starts it must carry)."""
    command = command_name(args)
    if isinstance(args, (list, tuple)) and len(args) > 2 and os.fsdecode(args[0]) == sys.executable:
        flag, what = os.fsdecode(args[1]), os.fsdecode(args[2])
        top = what.split(".")[0]
        if flag == "-m" and top in TOOLS:  # `python -m vllm...` is the `vllm` command
            return f"python -m {what}", TOOLS[top]
        if flag == "-m" and top in engine_modules():
            return f"python -m {what}", ("engine",)
        if flag == "-c" and set(_IMPORTS.findall(what)) & engine_modules():
            return "python -c (importing the engine extra)", ("engine",)
    return repr(command), TOOLS.get(command, ())


def _refuse(item: pytest.Item, what: str, missing: list[str]) -> None:
    raise QuickStartLacks(
        f"{item.nodeid} {what}, which the quick-start environment lacks "
        f"(tests/quick_start_guard.py): mark it {' and '.join(missing)} so the fast tier leaves it out")


def check_process(args) -> None:
    item = _current[0]
    if item is None:
        return
    what, markers = required_markers(args)
    missing = [m for m in markers if item.get_closest_marker(m) is None]
    if missing:
        _refuse(item, f"starts {what}", missing)


# -- imports -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _own(file: str | None) -> bool:
    """Whether a module's file is the repository's own code (not a virtualenv inside it)."""
    if not file:
        return False
    path = Path(file).resolve()
    if ROOT not in path.parents:
        return False
    return not any(part.startswith(".") for part in path.relative_to(ROOT).parts[:-1])


_holds: dict[str, str | None] = {}  # module -> the engine module it holds (None: none)


def engine_module_held(name: str) -> str | None:
    """The engine-only module that the loaded module `name` holds, directly or through the
    repository's modules it holds (None: none, or not loaded, or not the repository's)."""
    if name in _holds:
        return _holds[name]
    mod = sys.modules.get(name)
    if mod is None or getattr(getattr(mod, "__spec__", None), "_initializing", False):
        return None  # not loaded, or still running its body: what it holds is not known yet
    if not _own(getattr(mod, "__file__", None)):
        _holds[name] = None
        return None
    _holds[name] = None  # a cycle answers "none" until this one is known
    engine = engine_modules()
    found = None
    for value in list(vars(mod).values()):
        if isinstance(value, types.ModuleType) and value.__name__.startswith(name + "."):
            continue  # a package's submodule, set by whoever imported it: asked for by its own name
        if isinstance(value, types.ModuleType):
            of = value.__name__
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            of = getattr(value, "__module__", None)  # `from torch import Tensor`
        else:
            continue
        if not isinstance(of, str):
            continue
        if of.split(".")[0] in engine:
            found = of
            break
        if isinstance(value, types.ModuleType) and (held := engine_module_held(of)):
            found = held
            break
    _holds[name] = found
    return found


def check_import(name: str, importer: dict | None, fromlist, level: int) -> None:
    item = _without_engine[0]
    if item is None or level or not importer or not _own(importer.get("__file__")):
        return
    if name.split(".")[0] in engine_modules():
        _refuse(item, f"imports {name}", ["engine"])
    for full in [name, *(f"{name}.{f}" for f in fromlist or () if f != "*")]:
        if held := engine_module_held(full):
            _refuse(item, f"imports {full}, which holds {held}", ["engine"])


@contextlib.contextmanager
def paused():
    """No checks inside (tests of the guard load what a test of theirs must then be refused)."""
    item = _current[0]
    _enter(None)
    try:
        yield
    finally:
        _enter(item)


def _enter(item: pytest.Item | None) -> None:
    _current[0] = item
    _without_engine[0] = item if item is not None and item.get_closest_marker("engine") is None else None


# -- installing --------------------------------------------------------------------------

_popen_init = subprocess.Popen.__init__
_import = builtins.__import__


def _guarded_init(self, args, *a, **kw):
    check_process(kw.get("executable") or args)
    _popen_init(self, args, *a, **kw)


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    check_import(name, globals, fromlist, level)
    return _import(name, globals, locals, fromlist, level)


def install() -> None:
    subprocess.Popen.__init__ = _guarded_init
    builtins.__import__ = _guarded_import


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _enter(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _enter(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    _enter(item)
    yield
    _enter(None)
