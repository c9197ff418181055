"""The README's fast tier in the README's quick-start environment.

The quick start installs ``.[dev]`` only; the engine extra (vLLM, torch, transformers,
Triton and what they bring) is not there. A child pytest collects the README's fast-tier
selection with every module that only the engine extra installs made unimportable, as it
is in that environment: nothing may fail to import. Tests that need the extra at run time
(its fixtures, tests/conftest.py) carry the ``engine`` marker, which the command leaves out.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine_extra import engine_only

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def readme_fast_tier_args() -> list[str]:
    """The pytest arguments of the README's fast-tier command."""
    text = (ROOT / "README.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("python -m pytest") and " -m " in ln]
    assert len(lines) == 1, f"README: expected one fast-tier command (python -m pytest ... -m ...), got {lines}"
    return shlex.split(lines[0])[3:]


BLOCKER = """
import json, os, sys

# What is not installed: `import x` raises ModuleNotFoundError, importlib.util.find_spec
# answers None.
for name in json.loads(os.environ["ENGINE_ONLY_MODULES"]):
    sys.modules[name] = None


def pytest_collection_finish(session):
    with open(os.environ["FAST_TIER_ITEMS"], "w") as f:
        json.dump([i.nodeid for i in session.items], f)
"""


@pytest.mark.slow  # a child pytest session collecting the whole suite
def test_the_fast_tier_collects_without_the_engine_extra_and_needs_none_of_it(tmp_path):
    blocked, plugins = engine_only()
    try:
        md.distribution("torch")
        assert {"torch", "vllm", "transformers", "triton"} <= blocked, sorted(blocked)
    except md.PackageNotFoundError:
        pass  # the quick-start environment itself: nothing to hide
    (tmp_path / "engine_blocker.py").write_text(BLOCKER)
    items_file = tmp_path / "items.json"
    env = {k: v for k, v in os.environ.items() if k not in ("CI",) and not k.startswith("PYTEST_")}
    env.update(ENGINE_ONLY_MODULES=json.dumps(sorted(blocked)), FAST_TIER_ITEMS=str(items_file),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    args = [a for a in readme_fast_tier_args() if a not in ("-n", "2", "--dist", "loadgroup")]
    out = subprocess.run([sys.executable, "-m", "pytest", *args, "--collect-only", "-p", "no:cacheprovider",
                          "-p", "no:xdist", *(f"-pno:{p}" for p in sorted(plugins)), "-p", "engine_blocker"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "error" not in out.stdout.splitlines()[-1], out.stdout[-5000:] + out.stderr[-2000:]
    items = json.loads(items_file.read_text())
    assert len(items) > 500, len(items)  # the fast tier, not an empty selection


def test_the_readme_fast_tier_leaves_out_what_the_quick_start_lacks():
    args = readme_fast_tier_args()
    expr = args[args.index("-m") + 1]
    assert re.search(r"\bnot engine\b", expr) and re.search(r"\bnot integration\b", expr), expr
    quick_start = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "python3 -m venv" in ln)
    assert "pip install -e '.[dev]'" in quick_start, quick_start


def test_what_only_the_engine_brings_is_known_from_pyproject_where_the_project_is_not_installed(monkeypatch):
    """The GPU machine runs the kernel tests from a checkout, the project not installed: the
    quick-start guard (a child process's imports) must still know the engine extra's modules, from
    pyproject.toml, and know the same ones as the installed metadata gives."""
    import engine_extra

    installed = engine_only()

    def not_installed(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(engine_extra.md, "requires", not_installed)
    engine_only.cache_clear()
    try:
        assert engine_only() == installed
    finally:
        engine_only.cache_clear()
