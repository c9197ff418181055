"""What every rendered pod runs with: read-only roots, CPU and memory limits, least privilege
for dcgm-exporter.

The objects are those `dsvolc manifests` writes (dsvolc/export.py: the program's Kubernetes
objects under the offline engine, deploy phase 2), for every shipped stack, filled in.
"""

from __future__ import annotations

import pytest

from dsvolc import export
from stacks import load, loader
from tests.stack_fixtures import filled_raw
from workloads import monitoring
from workloads.context import build_context

STACKS = loader.shipped_stacks()


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {s: export.render(s, filled_raw(s)) for s in STACKS}


def _templates(obj):
    """(where, pod template) of a workload object."""
    kind, spec, name = obj["kind"], obj.get("spec") or {}, obj["metadata"]["name"]
    if "template" in spec:
        yield f"{kind} {name}", spec["template"]
    for role, t in (spec.get("leaderWorkerTemplate") or {}).items():
        if role.endswith("Template"):
            yield f"{kind} {name} {role}", t


def _containers(objs):
    for obj in objs:
        for where, t in _templates(obj):
            spec = t.get("spec") or {}
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                yield obj, f"{where} container {c['name']}", c


def test_every_shipped_stack_renders_pods(rendered):
    for stack, objs in rendered.items():
        assert len(list(_containers(objs))) >= 3, stack


def test_every_container_has_cpu_and_memory_requests_and_limits(rendered):
    missing = []
    for stack, objs in rendered.items():
        for _, where, c in _containers(objs):
            res = c.get("resources") or {}
            for part in ("requests", "limits"):
                for key in ("cpu", "memory"):
                    if key not in (res.get(part) or {}):
                        missing.append(f"{stack}: {where} {part}.{key}")
    assert missing == []


def test_every_container_but_dcgm_exporter_has_a_read_only_root(rendered):
    writable = set()
    for stack, objs in rendered.items():
        for obj, where, c in _containers(objs):
            if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
                writable.add(obj["metadata"]["name"])
    # the one documented exception (docs/observability.md, policies/workload.py exempt)
    assert writable == {monitoring.DCGM_NAME}


def _dcgm(settings) -> dict:
    ctx = build_context(settings, image_repository="r.example/ns/repo", weights_bucket=settings.bucket_name)
    ds = next(o for o in monitoring.dcgm_exporter(ctx) if o["kind"] == "DaemonSet")
    return ds["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("profiling", [False, True])
def test_dcgm_exporter_adds_sys_admin_only_for_profiling_metrics(profiling):
    s = load("prod")
    s = s.model_copy(update={"monitoring": s.monitoring.model_copy(update={"dcgm_profiling_metrics": profiling})})
    c = _dcgm(s)
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["capabilities"].get("add", []) == (["SYS_ADMIN"] if profiling else [])
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc.get("privileged") is not True
    env = {e["name"]: e.get("value") for e in c["env"]}
    # without the capability the entrypoint's setcap would only fail
    assert ("NO_SETCAP" in env) is (not profiling)
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"


def test_dcgm_exporter_profiling_is_off_in_the_shipped_stacks():
    # no rule, dashboard or autoscaler reads DCGM_FI_PROF_*: the capability would serve nothing
    for stack in STACKS:
        assert load(stack).monitoring.dcgm_profiling_metrics is False, stack
