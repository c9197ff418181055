"""The guard that keeps what the quick start lacks out of the fast tier (tests/quick_start_guard.py).

These tests run under the guard itself: an unmarked test that starts promtool, or imports
torch or a module of ours that holds it, is refused before the process starts or the import
runs, whether the test or a module-scoped fixture does it; a test with the markers goes on."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types

import pytest

import quick_start_guard as guard

PYTHON = "'" + os.path.basename(sys.executable) + "'"


def engine_installed() -> None:
    """The import cases need the engine extra: without it nothing is engine-only, so there is
    nothing to refuse (the quick start itself). CI installs it: there this fails instead."""
    if "torch" not in guard.engine_modules():
        if os.environ.get("CI"):
            pytest.fail("the engine extra is not installed in CI")
        pytest.skip("the engine extra is not installed: no import is engine-only here")


def test_an_unmarked_test_cannot_start_a_tool_the_quick_start_lacks():
    with pytest.raises(guard.QuickStartLacks, match=r"test_quick_start_guard\.py::test_an_unmarked.* starts "
                                                    r"'promtool'.*mark it integration so the fast tier leaves it out"):
        subprocess.run(["/usr/bin/promtool", "--version"], capture_output=True)
    with pytest.raises(guard.QuickStartLacks, match="starts 'redis-server'"):
        subprocess.Popen("redis-server --port 0", shell=True)


@pytest.fixture(scope="module")
def started_by_a_module_fixture():
    try:
        subprocess.run(["amtool", "--version"], capture_output=True)
    except guard.QuickStartLacks as e:
        return e
    return None


def test_a_module_fixture_is_checked_against_the_test_that_sets_it_up(started_by_a_module_fixture):
    assert isinstance(started_by_a_module_fixture, guard.QuickStartLacks)
    assert "test_a_module_fixture_is_checked" in str(started_by_a_module_fixture)


def test_other_processes_and_imports_go_on():
    out = subprocess.run([sys.executable, "-c", "import json; print(json.dumps(1))"], capture_output=True, text=True)
    assert out.stdout.strip() == "1"
    from capacity import planner  # the quick start has everything the product's planner needs
    assert planner.__name__ == "capacity.planner"


@pytest.mark.integration
def test_a_marked_test_starts_the_tool():
    out = subprocess.run(["promtool", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "promtool" in (out.stdout + out.stderr)


def test_an_unmarked_test_cannot_import_the_engine():
    engine_installed()
    with pytest.raises(guard.QuickStartLacks, match=r"imports torch, which the quick-start .* mark it engine"):
        import torch  # noqa: F401
    with pytest.raises(guard.QuickStartLacks, match="imports tokenizers"):
        from tokenizers import Tokenizer  # noqa: F401
    # one of ours that holds torch, loaded already (as another test may have loaded it)
    with guard.paused():
        importlib.import_module("kernels.bench.harness")
    with pytest.raises(guard.QuickStartLacks, match=r"imports kernels\.bench\.harness, which holds torch"):
        from kernels.bench import harness  # noqa: F401


@pytest.mark.engine
def test_a_marked_test_imports_the_engine():
    engine_installed()
    import torch

    from kernels.bench import harness
    assert harness.torch is torch


@pytest.mark.engine
def test_which_of_our_modules_hold_the_engine():
    engine_installed()
    importlib.import_module("kernels.bench.bench_kernels")
    importlib.import_module("stacks.vllm_flags")
    assert guard.engine_module_held("kernels.bench.bench_kernels").split(".")[0] == "torch"
    assert guard.engine_module_held("stacks.vllm_flags") is None  # vLLM only inside build_spec()
    assert guard.engine_module_held("json") is None  # not ours
    assert guard.engine_module_held("no.such.module") is None


@pytest.mark.engine
def test_a_class_taken_from_the_engine_is_held_once_the_module_has_run(monkeypatch):
    engine_installed()
    import torch

    probe = types.ModuleType("guard_probe")
    probe.__file__ = str(guard.ROOT / "tests" / "guard_probe.py")
    probe.__spec__ = types.SimpleNamespace(_initializing=True)
    probe.Tensor = torch.Tensor  # `from torch import Tensor`
    monkeypatch.setitem(sys.modules, "guard_probe", probe)
    assert guard.engine_module_held("guard_probe") is None  # its body still runs: not known yet
    probe.__spec__._initializing = False
    assert guard.engine_module_held("guard_probe") == "torch"
    monkeypatch.delitem(guard._holds, "guard_probe")


@pytest.mark.parametrize("args,what,markers", [
    (["/usr/bin/prometheus", "--config.file=x"], "'prometheus'", ("integration",)),
    ("prometheus-alertmanager --config.file=x", "'prometheus-alertmanager'", ("integration",)),
    (["/opt/venv/bin/vllm-router", "--port", "1"], "'vllm-router'", ("integration", "engine")),
    ([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], "python -m vllm.entrypoints.openai.api_server",
     ("integration", "engine")),
    ([sys.executable, "-m", "dsvolc", "preview", "dev"], PYTHON, ()),
    ([sys.executable, "-c", "import torchx_not_torch"], PYTHON, ()),
    (["git", "status"], "'git'", ()),
])
def test_what_each_command_needs(args, what, markers):
    assert guard.required_markers(args) == (what, markers)


def test_a_python_child_that_imports_the_engine_needs_it():
    engine_installed()
    child = "python -c (importing the engine extra)", ("engine",)
    assert guard.required_markers([sys.executable, "-c", "import sys\nfrom vllm.config import VllmConfig"]) == child
    assert guard.required_markers([sys.executable, "-c", "import sys; import torch"]) == child
    assert guard.required_markers([sys.executable, "-m", "torch.utils.collect_env"]) == (
        "python -m torch.utils.collect_env", ("engine",))
