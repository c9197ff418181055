"""Platform controllers: pinned charts whose versions match the CRDs we validate against."""

from __future__ import annotations

import re

import pytest

import stacks
from tests.k8s_schema import CRD_DIR, validate_all
from workloads import platform, versions
from stacks.constants import ENTRY_NAMESPACE

ENVS = ("dev", "staging", "prod")


def _with(settings, section, **fields):
    data = settings.model_dump()
    node = data
    *path, last = section.split(".")
    for key in path:
        node = node[key]
    node[last] = {**node[last], **fields}
    return type(settings).model_validate(data)


def _sources() -> dict[str, str]:
    """tests/data/SOURCES.md: CRD file -> release tag."""
    out = {}
    for line in (CRD_DIR.parent / "SOURCES.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.split("|")]
        if len(cells) > 5 and cells[1].endswith(".yaml"):
            out[cells[1]] = cells[4]
    return out


@pytest.mark.parametrize(
    "chart, crd_file",
    [
        (versions.ENVOY_GATEWAY, "gateway.envoyproxy.io_securitypolicies.yaml"),
        (versions.KEDA, "keda.sh_scaledobjects.yaml"),
        (versions.ARGO_ROLLOUTS, "argoproj.io_rollouts.yaml"),
        (versions.LWS, "leaderworkerset.x-k8s.io_leaderworkersets.yaml"),
        (versions.KUBE_PROMETHEUS_STACK, "monitoring.coreos.com_servicemonitors.yaml"),
    ],
)
def test_chart_app_version_matches_crd_source(chart, crd_file):
    assert chart.app_version.lstrip("v") == _sources()[crd_file].lstrip("v")


@pytest.mark.parametrize("env", ENVS)
def test_release_shape(env):
    rels = platform.releases(stacks.load(env))
    names = [r["name"] for r in rels]
    assert len(names) == len(set(names))
    for r in rels:
        assert set(r) == {"name", "namespace", "chart", "version", "repository_url", "values"}
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", r["version"]), r
        # OCI charts carry their registry in the chart reference, others need a repository.
        assert (r["repository_url"] is None) == r["chart"].startswith("oci://"), r


def test_lws_only_for_multi_node():
    assert "lws" in [r["name"] for r in platform.releases(stacks.load("prod"))]
    assert "lws" not in [r["name"] for r in platform.releases(stacks.load("dev"))]


def test_optional_controllers_follow_settings():
    s = stacks.load("staging")
    assert {"envoy-gateway", "keda", "argo-rollouts", "kube-prometheus-stack"} <= {r["name"] for r in platform.releases(s)}
    s = _with(s, "serving", in_cluster_gateway=False)
    s = _with(s, "autoscaling", enabled=False)
    s = _with(s, "rollout", enabled=False)
    s = _with(s, "observability", vmp_enabled=False)  # VMP's metrics come from the in-cluster Prometheus
    s = _with(s, "monitoring", enabled=False)
    s = _with(s, "observability.tracing", enabled=False)
    assert platform.releases(s) == []


def test_envoy_gateway_uses_redis_for_global_rate_limit():
    s = stacks.load("staging")
    (eg,) = [r for r in platform.releases(s) if r["name"] == "envoy-gateway"]
    assert eg["namespace"] == ENTRY_NAMESPACE
    backend = eg["values"]["config"]["envoyGateway"]["rateLimit"]["backend"]
    assert backend == {"type": "Redis", "redis": {"url": platform.redis_url()}}
    objs = platform.manifests(s)
    svc = next(o for o in objs if o["kind"] == "Service")
    host, port = platform.redis_url().split(":")
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert int(port) == svc["spec"]["ports"][0]["port"]


def test_no_redis_without_rate_limits():
    s = _with(stacks.load("staging"), "serving.rate_limits", enabled=False)
    assert platform.manifests(s) == []
    (eg,) = [r for r in platform.releases(s) if r["name"] == "envoy-gateway"]
    assert "config" not in eg["values"]


@pytest.mark.parametrize("env", ENVS)
def test_manifests_schema_valid(env):
    s = stacks.load(env)
    validate_all(platform.manifests(s), s.cluster.kubernetes_version)


def test_argo_rollouts_only_where_a_stack_runs_canaries():
    for env in ENVS:
        s = stacks.load(env)
        names = [r["name"] for r in platform.releases(s)]
        assert ("argo-rollouts" in names) == s.uses_argo_rollouts, env
    # prod's replicas span nodes (a LeaderWorkerSet, which Argo cannot manage): no controller
    prod = stacks.load("prod")
    assert prod.rollout.enabled and "argo-rollouts" not in [r["name"] for r in platform.releases(prod)]


def test_rollouts_plugin_and_rbac():
    (ar,) = [r for r in platform.releases(stacks.load("staging")) if r["name"] == "argo-rollouts"]
    (plugin,) = ar["values"]["controller"]["trafficRouterPlugins"]
    assert plugin["name"] == "argoproj-labs/gatewayAPI"
    assert f"/download/{versions.ARGO_GATEWAYAPI_PLUGIN}/" in plugin["location"]
    providers = ar["values"]["providerRBAC"]["providers"]
    assert [k for k, v in providers.items() if v] == ["gatewayAPI"]


def test_monitoring_release_in_monitoring_namespace_with_dashboard_sidecar():
    s = stacks.load("prod")
    (kps,) = [r for r in platform.releases(s) if r["name"] == "kube-prometheus-stack"]
    assert kps["namespace"] == s.monitoring.namespace
    assert kps["values"]["grafana"]["sidecar"]["dashboards"]["enabled"] is True
    assert kps["values"]["kubeStateMetrics"]["enabled"] is True
