"""Platform controllers: pinned charts whose versions match the CRDs we validate against."""

from __future__ import annotations

import re

import pytest

import stacks
from tests.k8s_schema import CRD_DIR, validate_all
from workloads.platform import controllers as platform
from workloads.platform import secrets
from workloads.supply_chain import versions
from stacks.constants import ENTRY_NAMESPACE
from stacks.plan import build_plan

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
    rels = platform.releases(build_plan(stacks.load(env)))
    names = [r["name"] for r in rels]
    assert len(names) == len(set(names))
    for r in rels:
        assert set(r) == {"name", "namespace", "chart", "version", "repository_url", "values"}
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", r["version"]), r
        # every chart is the stack mirror's OCI copy (workloads/supply_chain/mirror.py): no repository
        assert r["repository_url"] is None and r["chart"].startswith("oci://"), r


def test_lws_only_for_multi_node():
    assert "lws" in [r["name"] for r in platform.releases(build_plan(stacks.load("prod")))]
    assert "lws" not in [r["name"] for r in platform.releases(build_plan(stacks.load("dev")))]


def test_optional_controllers_follow_settings():
    s = stacks.load("staging")
    assert {"envoy-gateway", "keda", "argo-rollouts", "kube-prometheus-stack"} <= {r["name"] for r in platform.releases(build_plan(s))}
    s = _with(s, "serving", in_cluster_gateway=False)
    s = _with(s, "autoscaling", enabled=False)
    s = _with(s, "rollout", enabled=False)
    s = _with(s, "observability", vmp_enabled=False)  # VMP's metrics come from the in-cluster Prometheus
    s = _with(s, "monitoring", enabled=False)
    s = _with(s, "observability.tracing", enabled=False)
    assert platform.releases(build_plan(s)) == []


def test_envoy_gateway_uses_redis_for_global_rate_limit():
    s = stacks.load("staging")
    (eg,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "envoy-gateway"]
    assert eg["namespace"] == ENTRY_NAMESPACE
    backend = eg["values"]["config"]["envoyGateway"]["rateLimit"]["backend"]
    assert backend == {"type": "Redis", "redis": {"url": platform.redis_url()}}
    objs = platform.manifests(build_plan(s))
    svc = next(o for o in objs if o["kind"] == "Service")
    host, port = platform.redis_url().split(":")
    assert host == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert int(port) == svc["spec"]["ports"][0]["port"]


def test_no_redis_without_rate_limits():
    s = _with(stacks.load("staging"), "serving.rate_limits", enabled=False)
    assert not [o for o in platform.manifests(build_plan(s)) if o["metadata"]["name"] == platform.REDIS_NAME]
    assert secrets.REDIS_AUTH_SECRET not in {g.name for g in secrets.generated(s)}
    (eg,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "envoy-gateway"]
    assert "config" not in eg["values"]


def _redis(s):
    objs = [o for o in platform.manifests(build_plan(s)) if o["metadata"]["name"] == platform.REDIS_NAME]
    return {o["kind"]: o for o in objs}


def test_redis_requires_the_generated_password():
    s = stacks.load("staging")
    dep = _redis(s)["Deployment"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][-2:] == ["--requirepass", "$(REDIS_PASSWORD)"]
    (env,) = c["env"]
    ref = {"name": secrets.REDIS_AUTH_SECRET, "key": secrets.REDIS_AUTH_KEY}
    assert env == {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}}
    (gen,) = [g for g in secrets.generated(s) if g.name == secrets.REDIS_AUTH_SECRET]
    assert gen.namespace == ENTRY_NAMESPACE and gen.random_keys == (secrets.REDIS_AUTH_KEY,)
    # ... and Envoy Gateway's rate-limit service authenticates with the same Secret
    (eg,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "envoy-gateway"]
    deploy = eg["values"]["config"]["envoyGateway"]["provider"]["kubernetes"]["rateLimitDeployment"]
    assert deploy["container"]["env"] == [{"name": "REDIS_AUTH", "valueFrom": {"secretKeyRef": ref}}]
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_the_rate_limit_fails_closed():
    (eg,) = [r for r in platform.releases(build_plan(stacks.load("prod"))) if r["name"] == "envoy-gateway"]
    assert eg["values"]["config"]["envoyGateway"]["rateLimit"]["failClosed"] is True


def test_only_the_rate_limit_service_reaches_redis():
    s = stacks.load("staging")
    pol = _redis(s)["NetworkPolicy"]
    assert pol["metadata"]["namespace"] == ENTRY_NAMESPACE
    assert pol["spec"]["podSelector"]["matchLabels"].items() <= \
        _redis(s)["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    assert pol["spec"]["policyTypes"] == ["Ingress", "Egress"] and "egress" not in pol["spec"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "envoy-ratelimit", "app.kubernetes.io/component": "ratelimit",
        "app.kubernetes.io/managed-by": "envoy-gateway"}}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": platform.REDIS_PORT}]


@pytest.mark.parametrize("days, sps, gib", [(15, 20000, 61), (2, 1000, 10), (30, 100000, 604)])
def test_prometheus_volume_is_sized_from_retention(days, sps, gib):
    """retention x samples/s x 2 bytes x 1.25, in GiB rounded up: 15 d at 20k/s is
    15*86400*20000*2*1.25 = 64.8e9 B = 60.35 GiB -> 61; at least 10 GiB."""
    s = _with(stacks.load("prod"), "monitoring", retention_days=days, samples_per_second=sps)
    assert platform.prometheus_volume_gib(build_plan(s)) == gib
    (kps,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "kube-prometheus-stack"]
    spec = kps["values"]["prometheus"]["prometheusSpec"]
    assert spec["retention"] == f"{days}d" and spec["retentionSize"] == f"{int(gib * 0.85)}GB"
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == f"{gib}Gi" and "storageClassName" not in claim
    # the chart's own selectors are still there: the merge adds, it does not replace
    assert spec["ruleSelectorNilUsesHelmValues"] is False


def test_prometheus_retention_must_cover_the_regression_baseline():
    with pytest.raises(Exception, match="greater than or equal to 2"):
        _with(stacks.load("prod"), "monitoring", retention_days=1)


def test_grafana_admin_comes_from_a_generated_secret():
    s = stacks.load("prod")
    (kps,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "kube-prometheus-stack"]
    admin = kps["values"]["grafana"]["admin"]
    (gen,) = [g for g in secrets.generated(s) if g.name == admin["existingSecret"]]
    assert gen.namespace == s.monitoring.namespace
    assert admin["passwordKey"] in gen.random_keys and admin["userKey"] in gen.fixed
    assert "adminPassword" not in kps["values"]["grafana"]


@pytest.mark.parametrize("env", ENVS)
def test_manifests_schema_valid(env):
    s = stacks.load(env)
    validate_all(platform.manifests(build_plan(s)), s.cluster.kubernetes_version)


def test_argo_rollouts_only_where_a_stack_runs_canaries():
    for env in ENVS:
        s = stacks.load(env)
        names = [r["name"] for r in platform.releases(build_plan(s))]
        assert ("argo-rollouts" in names) == build_plan(s).rollout.argo, env
    # prod's replicas span nodes (a LeaderWorkerSet, which Argo cannot manage): no controller
    prod = stacks.load("prod")
    assert prod.rollout.enabled and "argo-rollouts" not in [r["name"] for r in platform.releases(build_plan(prod))]


def test_rollouts_plugin_and_rbac():
    (ar,) = [r for r in platform.releases(build_plan(stacks.load("staging"))) if r["name"] == "argo-rollouts"]
    (plugin,) = ar["values"]["controller"]["trafficRouterPlugins"]
    assert plugin["name"] == "argoproj-labs/gatewayAPI"
    assert plugin["location"].startswith("file://")  # from the mirror (tests/test_mirror.py)
    providers = ar["values"]["providerRBAC"]["providers"]
    assert [k for k, v in providers.items() if v] == ["gatewayAPI"]


def test_monitoring_release_in_monitoring_namespace_with_dashboard_sidecar():
    s = stacks.load("prod")
    (kps,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "kube-prometheus-stack"]
    assert kps["namespace"] == s.monitoring.namespace
    assert kps["values"]["grafana"]["sidecar"]["dashboards"]["enabled"] is True
    assert kps["values"]["kubeStateMetrics"]["enabled"] is True


def test_the_managed_control_planes_rules_are_off():
    """VKE manages the controller manager and scheduler: nothing of theirs can be scraped, so
    kube-prometheus-stack's absent() rules (KubeControllerManagerDown, KubeSchedulerDown,
    critical) would fire for ever. The chart renders those rule files only when
    `<component>.enabled` and, for the scheduler, `defaultRules.rules.kubeSchedulerAlerting`
    are true (templates/prometheus/rules-1.14/kubernetes-system-{controller-manager,scheduler}.yaml)."""
    for stack in ("dev", "prod"):
        (kps,) = [r for r in platform.releases(build_plan(stacks.load(stack))) if r["name"] == "kube-prometheus-stack"]
        v = kps["values"]
        assert v["kubeControllerManager"]["enabled"] is False and v["kubeScheduler"]["enabled"] is False
        rules = v["defaultRules"]["rules"]
        assert rules["kubeControllerManager"] is False and rules["kubeSchedulerAlerting"] is False
        assert rules["kubeSchedulerRecording"] is False
