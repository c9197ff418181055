"""The providers' SDKs imported with postponed annotations (dsvolc/lazy_annotations.py)
change nothing a preview reports, and the SDK hooks the preview relies on are still there.

Each case needs fresh processes: an SDK module is imported once per interpreter."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.loader import shipped_stacks
from test_preview_paths import _facts

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.xdist_group("lazy_annotations")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DSVOLC_PLAIN_IMPORTS", "PYTHONDONTWRITEBYTECODE")}
    env["DSVOLC_CACHE_DIR"] = str(tmp_path / "cache")
    env["DSVOLC_WARM"] = "0"
    env.update(extra)
    return env


def _python(code: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


PROBE = """
import json, sys
from dsvolc import lazy_annotations
print(json.dumps({"installed": lazy_annotations.install()}))
import pulumi._types as t
import pulumi_kubernetes as k8s
cls = k8s.core.v1.ContainerArgs
ann = cls.__init__.__annotations__
print(json.dumps({
    "strings": sorted({type(v).__name__ for v in ann.values()}),
    "types": {k: repr(v) for k, v in sorted(t.input_type_types(cls).items())},
    "outputs": {k: repr(v) for k, v in sorted(t.resource_types(k8s.apps.v1.Deployment).items())},
}))
"""


def _probe(env) -> tuple[dict, dict]:
    first, second = _python(PROBE, env).strip().splitlines()[-2:]
    return json.loads(first), json.loads(second)


def test_annotations_stay_strings_and_resolve_to_the_same_types(tmp_path):
    installed, lazy = _probe(_env(tmp_path))
    plain_installed, plain = _probe(_env(tmp_path, DSVOLC_PLAIN_IMPORTS="1"))
    assert installed == {"installed": True} and plain_installed == {"installed": False}
    assert lazy["strings"] == ["str"]  # nothing evaluated at import
    assert plain["strings"] != ["str"]
    # what the SDK reads from them (input and resource property types) is the same
    assert lazy["types"] == plain["types"] and lazy["types"]
    assert lazy["outputs"] == plain["outputs"] and "spec" in lazy["outputs"]


def test_the_bytecode_cache_is_its_own_and_is_checked(tmp_path):
    env = _env(tmp_path)
    _python("from dsvolc import lazy_annotations; lazy_annotations.install(); import pulumi_random", env)
    cached = sorted((tmp_path / "cache" / "pep563").rglob("*.pyc"))
    assert cached, "nothing cached"
    assert all(b"p563" == p.read_bytes()[4:8] for p in cached)
    # a torn file is compiled again, not trusted
    victim = next(p for p in cached if p.name.startswith("__init__-"))
    victim.write_bytes(victim.read_bytes()[:40])
    out = _python("from dsvolc import lazy_annotations; lazy_annotations.install(); import pulumi_random;"
                  "print(pulumi_random.RandomPassword.__name__)", env)
    assert out.strip() == "RandomPassword"
    assert len(victim.read_bytes()) > 40


def test_a_provider_imported_first_turns_it_off(tmp_path):
    out = _python("import pulumi_random; from dsvolc import lazy_annotations; print(lazy_annotations.install())",
                  _env(tmp_path))
    assert out.strip() == "False"  # its modules would be compiled both ways


def test_the_sdk_still_captures_stack_traces_where_the_preview_skips_them():
    """dsvolc.engine.stack_traces_skipped swaps this function while the program runs."""
    from pulumi.runtime import resource

    assert inspect.signature(resource._get_stack_trace).parameters == {}
    assert "_get_stack_trace()" in inspect.getsource(resource.register_resource)


PREVIEWS = """
import json, sys
from dsvolc import lazy_annotations
if sys.argv[1] == "lazy":
    assert lazy_annotations.install()
from dsvolc import preview
print(json.dumps({s: preview.run_both(s).as_json() for s in sys.argv[2:]}))
"""


@pytest.mark.slow
def test_preview_json_is_the_same_with_plain_imports(tmp_path):
    """Every shipped stack, both deploy phases, in one process per way of importing."""
    stacks = shipped_stacks()
    docs = {}
    for label in ("lazy", "plain"):
        proc = subprocess.run([sys.executable, "-c", PREVIEWS, label, *stacks], cwd=ROOT, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        docs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    for stack in stacks:
        assert docs["lazy"][stack]["resources"] and docs["lazy"][stack]["first_apply"]["resources"]
        assert _facts(docs["lazy"][stack]) == _facts(docs["plain"][stack]), stack
