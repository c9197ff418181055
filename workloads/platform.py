"""Cluster controllers the serving stack relies on, as Helm releases (+ a small Redis).

`releases(settings)` describes each release as a plain dict
{name, namespace, chart, version, repository_url, values}; `workloads.serving` wraps them
in `pulumi_kubernetes.helm.v3.Release` (the chart is fetched at `pulumi up`). A chart
given as `oci://...` has `repository_url` None. Versions live in `workloads.versions`.

`manifests(settings)` renders the Redis that Envoy Gateway's global rate limit counts in.

VKE offers some of these as cluster add-ons (Prometheus/VMP agent, KEDA-like autoscaling);
we ship pinned charts instead so a stack is self-contained and its CRDs match the schemas
our tests validate against (tests/data/crds, sources in tests/data/SOURCES.md).
"""

from __future__ import annotations

from stacks.settings import StackSettings
from workloads import telemetry, versions
from stacks.constants import (
    DEVICE_PLUGIN_DEFAULT_CONFIG,
    DEVICE_PLUGIN_MIG_CONFIG,
    ENTRY_NAMESPACE,
    GPU_MODEL_LABEL,
    GPU_RESOURCE,
    KEDA_NAMESPACE,
    LWS_NAMESPACE,
    MANAGED_BY,
    PART_OF,
    ROLLOUTS_NAMESPACE,
)

REDIS_NAME = "envoy-ratelimit-redis"
REDIS_PORT = 6379
# Where the Rollouts controller finds the traffic-router plugin (Linux nodes, amd64).
GATEWAYAPI_PLUGIN_URL = (
    "https://github.com/argoproj-labs/rollouts-plugin-trafficrouter-gatewayapi/releases/download/"
    f"{versions.ARGO_GATEWAYAPI_PLUGIN}/gatewayapi-plugin-linux-amd64"
)
GATEWAYAPI_PLUGIN = "argoproj-labs/gatewayAPI"


def redis_url() -> str:
    return f"{REDIS_NAME}.{ENTRY_NAMESPACE}.svc.cluster.local:{REDIS_PORT}"


def global_rate_limit(settings: StackSettings) -> bool:
    """Envoy Gateway's global rate limit is in use (needs Redis and the EnvoyGateway config)."""
    sv = settings.serving
    return sv.in_cluster_gateway and sv.auth.enabled and sv.rate_limits.enabled


def _release(name: str, namespace: str, chart: versions.Chart, values: dict) -> dict:
    return {
        "name": name,
        "namespace": namespace,
        "chart": chart.chart,
        "version": chart.version,
        "repository_url": chart.repository_url,
        "values": values,
    }


def envoy_gateway(settings: StackSettings) -> dict:
    values: dict = {}
    if global_rate_limit(settings):
        # Helm merges maps, so this adds to the chart's default EnvoyGateway config
        # (provider, controllerName, ...) instead of replacing it. Envoy Gateway then runs
        # its rate-limit service (envoy-ratelimit) against this Redis; it fails open when
        # Redis is unreachable (Envoy's rate-limit filter default), so an outage of the
        # counter store never takes the API down.
        values["config"] = {"envoyGateway": {"rateLimit": {"backend": {"type": "Redis", "redis": {"url": redis_url()}}}}}
    return _release("envoy-gateway", ENTRY_NAMESPACE, versions.ENVOY_GATEWAY, values)


def keda(settings: StackSettings) -> dict:
    return _release("keda", KEDA_NAMESPACE, versions.KEDA, {})


def argo_rollouts(settings: StackSettings) -> dict:
    values = {
        "controller": {
            "trafficRouterPlugins": [{"name": GATEWAYAPI_PLUGIN, "location": GATEWAYAPI_PLUGIN_URL}],
        },
        # RBAC for the Gateway API plugin only; the chart grants every mesh by default.
        "providerRBAC": {
            "enabled": True,
            "providers": {
                "istio": False, "smi": False, "ambassador": False, "awsLoadBalancerController": False,
                "awsAppMesh": False, "traefik": False, "apisix": False, "contour": False,
                "glooPlatform": False, "gatewayAPI": True,
            },
        },
    }
    return _release("argo-rollouts", ROLLOUTS_NAMESPACE, versions.ARGO_ROLLOUTS, values)


def leader_worker_set(settings: StackSettings) -> dict:
    return _release("lws", LWS_NAMESPACE, versions.LWS, {})


def kube_prometheus_stack(settings: StackSettings) -> dict:
    values = {
        # Select every ServiceMonitor/PodMonitor/PrometheusRule in the cluster, not only
        # those labelled with this release (the chart's default), so the serving stack's
        # monitors need no Helm-specific label.
        "prometheus": {
            "prometheusSpec": {
                "serviceMonitorSelectorNilUsesHelmValues": False,
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
            }
        },
        "grafana": {
            "sidecar": {
                # ConfigMaps labelled grafana_dashboard=1 in any namespace become dashboards.
                "dashboards": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1",
                               "searchNamespace": "ALL"},
            }
        },
        "kubeStateMetrics": {"enabled": True},
    }
    return _release("kube-prometheus-stack", settings.monitoring.namespace, versions.KUBE_PROMETHEUS_STACK, values)


def uses_mig(settings: StackSettings) -> bool:
    return any(p.mig is not None for p in settings.cluster.gpu_pools.values())


def device_plugin(settings: StackSettings) -> dict:
    """NVIDIA's device plugin on every GPU node: whole GPUs by default, and the "mixed" MIG
    strategy on nodes labelled nvidia.com/device-plugin.config=mig-mixed (the MIG pools), so
    each slice is advertised as nvidia.com/mig-<profile>."""
    def flags(strategy: str) -> str:
        return f"version: v1\nflags:\n  migStrategy: {strategy}\n"

    values = {
        "config": {
            "map": {DEVICE_PLUGIN_DEFAULT_CONFIG: flags("none"), DEVICE_PLUGIN_MIG_CONFIG: flags("mixed")},
            "default": DEVICE_PLUGIN_DEFAULT_CONFIG,
        },
        # The chart's default affinity wants node-feature-discovery labels; our GPU pools
        # carry their own.
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": GPU_MODEL_LABEL, "operator": "Exists"}]}]}}},
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
    }
    return _release("nvidia-device-plugin", "nvidia-device-plugin", versions.NVIDIA_DEVICE_PLUGIN, values)


def releases(settings: StackSettings, trace_topic_id=None) -> list[dict]:
    """The Helm releases, in install order (controllers before the objects that use them).
    `trace_topic_id` is the TLS trace topic the collector writes to (infra/logging.py; a
    Pulumi output in the program, a literal in tests)."""
    out = []
    if uses_mig(settings):  # VKE's device plugin add-on is left out then (infra/cluster.py)
        out.append(device_plugin(settings))
    if settings.serving.in_cluster_gateway:
        out.append(envoy_gateway(settings))
    if settings.autoscaling.enabled:
        out.append(keda(settings))
    if settings.uses_argo_rollouts:  # not for multi-node stacks: Argo cannot manage a LeaderWorkerSet
        out.append(argo_rollouts(settings))
    if settings.serving_plan.nodes > 1:  # LeaderWorkerSet only runs multi-node replicas
        out.append(leader_worker_set(settings))
    if settings.monitoring.enabled:
        out.append(kube_prometheus_stack(settings))
    if telemetry.tracing_on(settings):
        out.append(telemetry.collector_release(settings, trace_topic_id))
    return out


# --------------------------------------------------------------------------- Redis


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "redis",
        "app.kubernetes.io/instance": REDIS_NAME,
        "app.kubernetes.io/component": "ratelimit-store",
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def redis(settings: StackSettings) -> list[dict]:
    """One Redis, no persistence: it holds rate-limit counters whose windows are at most an
    hour, so losing them on a restart only resets the windows."""
    labels = _labels()
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    md = {"name": REDIS_NAME, "namespace": ENTRY_NAMESPACE, "labels": labels}
    container = {
        "name": "redis",
        "image": versions.REDIS_IMAGE,
        "args": ["--save", "", "--appendonly", "no"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": md,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "automountServiceAccountToken": False,
                        # 999 is the redis user of the official image.
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 999,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [container],
                        "volumes": [{"name": "data", "emptyDir": {}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": md,
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
            },
        },
    ]


def manifests(settings: StackSettings) -> list[dict]:
    """Plain objects the controllers need besides their charts."""
    return redis(settings) if global_rate_limit(settings) else []
