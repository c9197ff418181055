"""Creation order: every cloud resource that names a Kubernetes object depends on it. The
APIG K8S upstreams name Services of the cluster (the in-cluster gateway's entry, or the
stable and canary Services): each is registered after, and depending on, its Service."""

from __future__ import annotations

import pytest

from dsvolc import engine
from stacks import read_raw
from tests.test_provider_contract import variant


def _services(rec):
    return {(r.inputs["metadata"].get("namespace"), r.inputs["metadata"]["name"]): r.urn
            for r in rec.resources if r.type == "kubernetes:core/v1:Service"}


@pytest.mark.parametrize("stack,raw", [
    ("prod", read_raw("prod")),
    ("staging", variant("staging", serving__in_cluster_gateway=False)),  # the edge splits to stable/canary
])
def test_each_apig_upstream_depends_on_the_service_it_names(stack, raw):
    rec = engine.run(stack, raw, mode="existing")
    services = _services(rec)
    upstreams = [r for r in rec.resources if r.type == "volcengine:apig/apigUpstream:ApigUpstream"]
    assert upstreams
    for up in upstreams:
        k8s = up.inputs["upstreamSpec"]["k8sService"]
        svc = services.get((k8s["namespace"], k8s["name"]))
        assert svc is not None, f"{up.name} names {k8s['namespace']}/{k8s['name']}, which the program does not register"
        assert svc in up.dependencies, f"{up.name} does not depend on {svc}"


def test_the_first_apply_registers_no_upstream():
    rec = engine.run("prod", read_raw("prod"), mode="new")
    assert not [r for r in rec.resources if r.type == "volcengine:apig/apigUpstream:ApigUpstream"]
