"""stacks/pod_security.py against Pod Security Admission's own fixtures: every pod that
kubernetes/pod-security-admission v0.32.13 says passes a level at policy version v1.32
passes it here, and every pod it says fails is refused here, by the control the fixture
is named after (tests/data/pod-security, SOURCES.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from stacks import pod_security

DATA = Path(__file__).resolve().parent / "data" / "pod-security"
VERSION = "v1.32"
# the restricted control evaluated in place of a baseline one at the restricted level
REPLACED = {"hostpathvolumes": "restrictedvolumes", "capabilities_baseline": "capabilities_restricted",
            "seccompprofile_baseline": "seccompprofile_restricted"}


def fixtures(level: str, outcome: str) -> list[Path]:
    return sorted((DATA / level / outcome).glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def control(path: Path) -> str:
    """The check a fixture exercises: its name without the trailing number."""
    return re.sub(r"\d+$", "", path.stem)


def test_the_fixtures_are_there():
    counts = {(lv, oc): len(fixtures(lv, oc)) for lv in ("baseline", "restricted") for oc in ("pass", "fail")}
    assert counts == {("baseline", "pass"): 11, ("baseline", "fail"): 29,
                      ("restricted", "pass"): 19, ("restricted", "fail"): 69}, counts


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_pods_that_pass_upstream_pass_here(level):
    wrong = {}
    for path in fixtures(level, "pass"):
        pod = load(path)
        found = pod_security.meets(pod["spec"], pod["metadata"], level, VERSION)
        if found:
            wrong[path.name] = [str(f) for f in found]
    assert wrong == {}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_pods_that_fail_upstream_fail_here_for_the_same_control(level):
    wrong = {}
    for path in fixtures(level, "fail"):
        pod = load(path)
        found = {f.check.lower() for f in pod_security.meets(pod["spec"], pod["metadata"], level, VERSION)}
        expected = control(path)
        if level == "restricted":
            expected = REPLACED.get(expected, expected)
        if expected not in found:
            wrong[path.name] = sorted(found)
    assert wrong == {}


def test_every_upstream_control_is_exercised():
    """The fixtures name every control of v1.32 but the newer probe/lifecycle host check."""
    names = {control(p) for lv in ("baseline", "restricted") for oc in ("pass", "fail") for p in fixtures(lv, oc)}
    assert {"allowprivilegeescalation", "apparmorprofile", "capabilities_baseline", "capabilities_restricted",
            "hostnamespaces", "hostpathvolumes", "hostports", "privileged", "procmount", "restrictedvolumes",
            "runasnonroot", "runasuser", "seccompprofile_baseline", "seccompprofile_restricted", "selinuxoptions",
            "sysctls", "windowshostprocess"} <= names


def test_strictest_level():
    pod = load(DATA / "restricted" / "pass" / "base.yaml")
    host = load(DATA / "baseline" / "fail" / "hostpathvolumes0.yaml")
    root = load(DATA / "restricted" / "fail" / "runasuser0.yaml")
    assert pod_security.strictest_level([(pod["spec"], pod["metadata"])], VERSION) == "restricted"
    assert pod_security.strictest_level([(pod["spec"], {}), (root["spec"], {})], VERSION) == "baseline"
    assert pod_security.strictest_level([(pod["spec"], {}), (host["spec"], {})], VERSION) == "privileged"
    assert pod_security.strictest_level([], VERSION) == "restricted"


def test_versioned_rules():
    """A sysctl made safe in 1.32 is refused at 1.31; a bad version is a clear error."""
    pod = load(DATA / "baseline" / "pass" / "sysctls1.yaml")
    assert pod_security.meets(pod["spec"], {}, "baseline", "v1.32") == []
    assert [f.check for f in pod_security.meets(pod["spec"], {}, "baseline", "v1.31")] == ["sysctls"]
    with pytest.raises(ValueError, match="Pod Security version"):
        pod_security.meets(pod["spec"], {}, "baseline", "one-thirty-two")
    with pytest.raises(ValueError, match="Pod Security level"):
        pod_security.meets(pod["spec"], {}, "strict", "v1.32")
