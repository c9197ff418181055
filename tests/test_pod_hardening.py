"""What every rendered pod runs with: read-only roots, CPU and memory limits, least privilege
for dcgm-exporter, and Pod Security Admission labels that match the pods of each namespace.

The objects are those `dsvolc manifests` writes (dsvolc/export.py: the program's Kubernetes
objects under the offline engine, deploy phase 2), for every shipped stack, filled in.
"""

from __future__ import annotations

import pytest

from dsvolc import export
from stacks import load, loader, pod_security
from tests.stack_fixtures import filled_raw
from workloads.observability import monitoring
from workloads.platform import namespaces
from stacks.plan import build_plan
from workloads.engine.context import build_context

STACKS = loader.shipped_stacks()
PSA = "pod-security.kubernetes.io"


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
    # the one documented exception (docs/operations.md, policies/workload.py exempt)
    assert writable == {monitoring.DCGM_NAME}


def _dcgm(settings) -> dict:
    ctx = build_context(build_plan(settings), image_repository="r.example/ns/repo")
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


def test_every_namespace_carries_audit_and_warn_restricted_with_pinned_versions(rendered):
    for stack, objs in rendered.items():
        version = f"v{load(stack).cluster.kubernetes_version}"
        nss = [o for o in objs if o["kind"] == "Namespace"]
        assert nss, stack
        for ns in nss:
            labels = ns["metadata"]["labels"]
            for mode in ("audit", "warn"):
                assert labels[f"{PSA}/{mode}"] == "restricted", (stack, ns["metadata"]["name"])
                assert labels[f"{PSA}/{mode}-version"] == version
            if f"{PSA}/enforce" in labels:
                assert labels[f"{PSA}/enforce-version"] == version


def test_every_namespace_the_charts_use_is_created_labelled(rendered):
    for stack, objs in rendered.items():
        created = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
        assert namespaces.chart_namespaces(build_plan(load(stack))) <= created, stack


def test_each_namespace_enforces_the_strictest_level_its_pods_meet(rendered):
    """Where the stack renders every pod of a namespace, enforce is the strictest level they
    all meet, and each pod meets it (checked by stacks/pod_security.py, itself checked
    against Pod Security Admission's own fixtures in tests/test_pod_security.py)."""
    seen = {}
    for stack, objs in rendered.items():
        charts = namespaces.chart_namespaces(build_plan(load(stack)))
        pods = namespaces.pods_by_namespace(objs)
        for ns in (o for o in objs if o["kind"] == "Namespace"):
            name, labels = ns["metadata"]["name"], ns["metadata"]["labels"]
            enforce = labels.get(f"{PSA}/enforce")
            if name in charts:
                assert enforce is None, (stack, name)  # the charts' pods are not seen here
                continue
            version = labels[f"{PSA}/enforce-version"]
            for where, t in pods.get(name, []):
                assert pod_security.meets(t["spec"], t.get("metadata"), enforce, version) == [], (stack, where)
            stricter = pod_security.LEVELS[pod_security.LEVELS.index(enforce) + 1:]
            for level in stricter:
                assert any(pod_security.meets(t["spec"], t.get("metadata"), level, version)
                           for _, t in pods.get(name, [])), (stack, name, level)
            seen[(stack, name)] = enforce
    # stream mode (staging) has no hostPath: its serving pods meet restricted; sync mode's
    # node model cache is a hostPath (docs/limits.md)
    serving_ns = load("staging").serving.namespace
    assert seen[("staging", serving_ns)] == "restricted"
    assert seen[("prod", load("prod").serving.namespace)] == "privileged"
