"""checkov, the real scanner, over the rendered Kubernetes objects of every shipped stack.

Each stack (filled in, as tests/stack_fixtures.py does) is written out the way `dsvolc
manifests` writes it, and checkov's kubernetes framework scans the directory. Every failed
check must be covered by an entry of tests/data/checkov-skips.yaml (check id, resources,
the reason it stays), and every entry must still cover a finding.

checkov runs from its own virtualenv (its dependencies clash with the project's): the
`DSVOLC_CHECKOV` environment variable names the executable, else the virtualenv .ci/run
creates outside the checkout (`$XDG_CACHE_HOME/dsvolc/checkov-3.3.30`, `~/.cache` by default),
else `checkov` on the PATH.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsvolc import export
from stacks import loader
from tests.stack_fixtures import filled_raw

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SKIPS = Path(__file__).resolve().parent / "data" / "checkov-skips.yaml"
VERSION = "3.3.30"
STACKS = loader.shipped_stacks()


def default_venv() -> Path:
    """Where .ci/run puts checkov's virtualenv (its CHECKOV_VENV default)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dsvolc" / f"checkov-{VERSION}"


def checkov() -> str | None:
    for candidate in (os.environ.get("DSVOLC_CHECKOV"), str(default_venv() / "bin" / "checkov"),
                      shutil.which("checkov")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def load_skips() -> list[dict]:
    entries = yaml.safe_load(SKIPS.read_text())
    for i, e in enumerate(entries):
        missing = {"check", "resources", "reason"} - set(e)
        assert not missing, f"{SKIPS.name} entry {i}: missing {sorted(missing)}"
        assert len(e["reason"].split()) >= 8, f"{SKIPS.name} entry {i} ({e['check']}): give a real reason"
    return entries


@functools.lru_cache(maxsize=None)
def _class(stack: str) -> str:
    return loader.load(stack).environment_class


def covering(skips: list[dict], stack: str, check: str, resource: str) -> list[int]:
    return [i for i, e in enumerate(skips)
            if e["check"] == check and ("classes" not in e or _class(stack) in e["classes"])
            and any(fnmatch.fnmatchcase(resource, pat) for pat in e["resources"])]


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> list[tuple[str, str, str, str]]:
    """(stack, check id, resource, file) of every failed check."""
    exe = checkov()
    if exe is None:
        # CI creates checkov's virtualenv (.ci/run): there a missing checkov is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail(f"checkov is not installed in CI: .ci/run creates {default_venv()}")
        pytest.skip(f"checkov is not installed: run .ci/run (it creates {default_venv()}) or set DSVOLC_CHECKOV")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120).stdout.strip()
    assert version == VERSION, f"checkov {version}; the skips were judged with {VERSION}"
    root = tmp_path_factory.mktemp("manifests")
    for stack in STACKS:
        written = export.write(export.render(stack, filled_raw(stack)), root / stack)
        assert written, stack
    proc = subprocess.run([exe, "-d", str(root), "--framework", "kubernetes", "--output", "json", "--quiet",
                           "--skip-download"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    out = []
    for report in reports:
        assert report["check_type"] == "kubernetes", report["check_type"]
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        assert report["summary"]["passed"] > 0
        for f in report["results"]["failed_checks"]:
            stack = Path(f["file_path"]).parts[1]  # "/<stack>/<namespace>/<kind>-<name>.yaml"
            out.append((stack, f["check_id"], f["resource"], f["file_path"]))
    return out


def test_the_scan_saw_every_stack(findings):
    assert {s for s, *_ in findings} == set(STACKS)


def test_every_finding_is_a_documented_skip(findings):
    skips = load_skips()
    new = sorted({(s, c, r) for s, c, r, _ in findings if not covering(skips, s, c, r)})
    assert new == [], f"checkov findings without an entry in {SKIPS.name} (fix them or document why they stay): {new}"


def test_every_skip_still_covers_a_finding(findings):
    skips = load_skips()
    used = {i for s, c, r, _ in findings for i in covering(skips, s, c, r)}
    stale = [(i, skips[i]["check"]) for i in range(len(skips)) if i not in used]
    assert stale == [], f"{SKIPS.name} entries no finding needs any more (remove them): {stale}"


def test_the_findings_the_hardening_closed_stay_closed(findings):
    """What the scan of the prod objects reported before the hardening (issue 19) and the
    renderers now set: CPU limits, no escalation, seccomp, no SYS_ADMIN, dcgm-exporter's
    liveness probe, digests in prod."""
    closed = {"CKV_K8S_11",  # CPU limits should be set
              "CKV_K8S_20",  # containers should not run with allowPrivilegeEscalation
              "CKV_K8S_31",  # seccomp profile runtime/default
              "CKV_K8S_39"}  # do not use CAP_SYS_ADMIN
    reopened = sorted({(s, c, r) for s, c, r, _ in findings if c in closed})
    assert reopened == []
    assert not [f for f in findings if f[0] == "prod" and f[1] == "CKV_K8S_43"]
    assert not [f for f in findings if f[1] == "CKV_K8S_8" and "dcgm-exporter" in f[2]]
