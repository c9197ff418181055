"""The guard that keeps tools the quick start lacks out of the fast tier (tests/tool_guard.py).

These tests run under the guard itself: an unmarked test that starts promtool is refused
before the process starts, whether the test or a module-scoped fixture starts it, and a test
with the integration marker starts it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tool_guard


def test_an_unmarked_test_cannot_start_a_tool_the_quick_start_lacks():
    with pytest.raises(tool_guard.UnmarkedTool, match=r"test_tool_guard\.py::test_an_unmarked.* starts 'promtool'.*"
                                                      r"mark it integration so the fast tier leaves it out"):
        subprocess.run(["/usr/bin/promtool", "--version"], capture_output=True)
    with pytest.raises(tool_guard.UnmarkedTool, match="starts 'redis-server'"):
        subprocess.Popen("redis-server --port 0", shell=True)


@pytest.fixture(scope="module")
def started_by_a_module_fixture():
    try:
        subprocess.run(["amtool", "--version"], capture_output=True)
    except tool_guard.UnmarkedTool as e:
        return e
    return None


def test_a_module_fixture_is_checked_against_the_test_that_sets_it_up(started_by_a_module_fixture):
    assert isinstance(started_by_a_module_fixture, tool_guard.UnmarkedTool)
    assert "test_a_module_fixture_is_checked" in str(started_by_a_module_fixture)


def test_other_processes_start():
    out = subprocess.run([sys.executable, "-c", "import json; print(json.dumps(1))"], capture_output=True, text=True)
    assert out.stdout.strip() == "1"


@pytest.mark.integration
def test_a_marked_test_starts_the_tool():
    out = subprocess.run(["promtool", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "promtool" in (out.stdout + out.stderr)


@pytest.mark.parametrize("args,what,markers", [
    (["/usr/bin/prometheus", "--config.file=x"], "'prometheus'", ("integration",)),
    ("prometheus-alertmanager --config.file=x", "'prometheus-alertmanager'", ("integration",)),
    (["/opt/venv/bin/vllm-router", "--port", "1"], "'vllm-router'", ("integration", "engine")),
    ([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], "python -m vllm.entrypoints.openai.api_server",
     ("integration", "engine")),
    ([sys.executable, "-c", "import sys\nfrom vllm.config import VllmConfig"], "python -c (importing the engine extra)",
     ("engine",)),
    ([sys.executable, "-c", "import torchx_not_torch"], "'" + sys.executable.rsplit("/", 1)[-1] + "'", ()),
    ([sys.executable, "-m", "dsvolc", "preview", "dev"], "'" + sys.executable.rsplit("/", 1)[-1] + "'", ()),
    (["git", "status"], "'git'", ()),
])
def test_what_each_command_needs(args, what, markers):
    assert tool_guard.required_markers(args) == (what, markers)
