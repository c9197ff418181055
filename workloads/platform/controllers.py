"""Cluster controllers the serving stack relies on, as Helm releases (+ a small Redis).

`releases(plan)` describes each release as a plain dict
{name, namespace, chart, version, repository_url, values}; `workloads.serving` wraps them
in `pulumi_kubernetes.helm.v3.Release` (the chart is fetched at `pulumi up`). A chart
given as `oci://...` has `repository_url` None. Versions live in `workloads.supply_chain.versions`.

`manifests(plan)` renders the Redis that Envoy Gateway's global rate limit counts in,
with a password from a generated Secret (`workloads/platform/secrets.py`) and a NetworkPolicy that
admits only Envoy Gateway's rate-limit pods.

Availability of the rate limit (a documented choice, docs/serving.md): no single pod stops
the API. The rate-limit service (envoy-ratelimit) runs RATELIMIT_REPLICAS pods spread over
nodes behind a PodDisruptionBudget, so a drain or node-pool upgrade keeps one answering.
Its Redis stays one pod (counters of windows of at most an hour, nothing worth
replicating), and the limiter fails *open* (`failClosed: false`): while Redis or every
envoy-ratelimit pod is gone, requests pass the global per-consumer limit unchecked and
each proxy's own local limit (`serving.rate_limits.backstop_requests`, workloads/edge/gateway.py)
caps what it admits in all. Failure mode: for that time one consumer can take more than
its share, up to the backstop; `RateLimitStoreDown` and `RateLimitServiceDown` page.

VKE offers some of these as cluster add-ons (Prometheus/VMP agent, KEDA-like autoscaling);
we ship pinned charts instead so a stack is self-contained and its CRDs match the schemas
our tests validate against (tests/data/crds, sources in tests/data/SOURCES.md).
"""

from __future__ import annotations

from stacks.plan import StackPlan
from workloads.supply_chain import mirror
from workloads.observability import telemetry
from workloads.supply_chain import versions
from workloads.supply_chain.mirror import merge_values, mirrored_release  # noqa: F401  (re-exported)
from workloads.platform.features import global_rate_limit  # noqa: F401  (re-exported)
from workloads.platform.secrets import (
    GRAFANA_ADMIN_SECRET,
    GRAFANA_PASSWORD_KEY,
    GRAFANA_USER_KEY,
    REDIS_AUTH_KEY,
    REDIS_AUTH_SECRET,
)
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
# Labels Envoy Gateway puts on its rate-limit service's pods (envoyproxy/gateway
# internal/infrastructure/kubernetes/ratelimit/resource.go, rateLimitLabels).
RATELIMIT_POD_LABELS = {"app.kubernetes.io/name": "envoy-ratelimit", "app.kubernetes.io/component": "ratelimit",
                        "app.kubernetes.io/managed-by": "envoy-gateway"}
# The environment variable envoyproxy/ratelimit authenticates to Redis with.
RATELIMIT_REDIS_AUTH_ENV = "REDIS_AUTH"
# The Deployment Envoy Gateway runs its rate-limit service as (same source, ratelimit.go).
RATELIMIT_DEPLOYMENT = "envoy-ratelimit"
# Two pods on two nodes: one survives an eviction, a drain or the loss of a node.
RATELIMIT_REPLICAS = 2
HOSTNAME_KEY = "kubernetes.io/hostname"
GATEWAYAPI_PLUGIN = "argoproj-labs/gatewayAPI"


def redis_url() -> str:
    return f"{REDIS_NAME}.{ENTRY_NAMESPACE}.svc.cluster.local:{REDIS_PORT}"


def _release(name: str, namespace: str, chart: versions.Chart, values: dict,
             plan: StackPlan | None = None) -> dict:
    if plan is None:  # as published upstream
        return {"name": name, "namespace": namespace, "chart": chart.chart, "version": chart.version,
                "repository_url": chart.repository_url, "values": values}
    return mirrored_release(name, namespace, chart, values, plan)


def rate_limit_config() -> dict:
    """The EnvoyGateway config for the global rate limit: this Redis, its password from the
    generated Secret (REDIS_AUTH of envoyproxy/ratelimit), fail open, and the service's
    pods replicated and spread over nodes (Envoy Gateway runs one by default)."""
    auth = {"name": RATELIMIT_REDIS_AUTH_ENV,
            "valueFrom": {"secretKeyRef": {"name": REDIS_AUTH_SECRET, "key": REDIS_AUTH_KEY}}}
    spread = {"maxSkew": 1, "topologyKey": HOSTNAME_KEY, "whenUnsatisfiable": "DoNotSchedule",
              "labelSelector": {"matchLabels": dict(RATELIMIT_POD_LABELS)}}
    deployment = {"replicas": RATELIMIT_REPLICAS,
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                  "pod": {"topologySpreadConstraints": [spread]},
                  "container": {"env": [auth]}}
    return {
        "rateLimit": {"backend": {"type": "Redis", "redis": {"url": redis_url()}}, "failClosed": False},
        "provider": {"type": "Kubernetes", "kubernetes": {"rateLimitDeployment": deployment}},
    }


def rate_limit_pdb() -> dict:
    """Voluntary evictions (drains, node-pool upgrades) leave one rate-limit pod answering."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": RATELIMIT_DEPLOYMENT, "namespace": ENTRY_NAMESPACE,
                     "labels": {"app.kubernetes.io/name": "envoy-ratelimit",
                                "app.kubernetes.io/instance": RATELIMIT_DEPLOYMENT,
                                "app.kubernetes.io/component": "ratelimit",
                                "app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": MANAGED_BY}},
        "spec": {"minAvailable": RATELIMIT_REPLICAS - 1, "selector": {"matchLabels": dict(RATELIMIT_POD_LABELS)}},
    }


def envoy_gateway(plan: StackPlan) -> dict:
    settings = plan.settings
    values: dict = {}
    if global_rate_limit(settings):
        # Helm merges maps, so this adds to the chart's default EnvoyGateway config
        # (controllerName, ...) instead of replacing it. Envoy Gateway then runs its
        # rate-limit service (envoy-ratelimit) against this Redis.
        values["config"] = {"envoyGateway": rate_limit_config()}
    return _release("envoy-gateway", ENTRY_NAMESPACE, versions.ENVOY_GATEWAY, values, plan)


def keda(plan: StackPlan) -> dict:
    return _release("keda", KEDA_NAMESPACE, versions.KEDA, {}, plan)


def argo_rollouts(plan: StackPlan) -> dict:
    values = {
        # The Gateway API traffic-router plugin comes from the mirror (workloads/supply_chain/mirror.py
        # argo_plugin_values), not from GitHub at start.
        "controller": {},
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
    return _release("argo-rollouts", ROLLOUTS_NAMESPACE, versions.ARGO_ROLLOUTS, values, plan)


def leader_worker_set(plan: StackPlan) -> dict:
    return _release("lws", LWS_NAMESPACE, versions.LWS, {}, plan)


def kube_prometheus_stack(plan: StackPlan) -> dict:
    settings = plan.settings
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
        # VKE runs the control plane for us: no controller-manager or scheduler target can
        # be scraped, so their ServiceMonitors find nothing and the chart's absent() rules
        # (KubeControllerManagerDown, KubeSchedulerDown, critical) would fire for ever. Off:
        # the targets (`<component>.enabled`, which also gates the rule files) and the rule
        # groups (`defaultRules.rules.*`), as kube-prometheus-stack's values.yaml names them.
        "kubeControllerManager": {"enabled": False},
        "kubeScheduler": {"enabled": False},
        "defaultRules": {"rules": {"kubeControllerManager": False, "kubeSchedulerAlerting": False,
                                   "kubeSchedulerRecording": False}},
    }
    for extra in (prometheus_storage_values(plan), grafana_admin_values(plan),
                  alertmanager_values(plan)):
        values = merge_values(values, extra)
    return _release("kube-prometheus-stack", settings.monitoring.namespace, versions.KUBE_PROMETHEUS_STACK, values,
                    plan)


# --------------------------------------------------------------------------- Prometheus, Grafana

# Prometheus stores a sample in 1-2 bytes after compression (prometheus.io/docs/prometheus/
# latest/storage/, "Operational aspects": needed_disk_space = retention_time_seconds *
# ingested_samples_per_second * bytes_per_sample); take the upper end, and a quarter more
# for the WAL and compaction's temporary blocks.
BYTES_PER_SAMPLE = 2
STORAGE_HEADROOM = 1.25
# Prometheus deletes the oldest blocks past retentionSize, before the volume fills.
RETENTION_SIZE_FRACTION = 0.85
MIN_VOLUME_GIB = 10


def prometheus_volume_gib(plan: StackPlan) -> int:
    """The Prometheus volume, sized from retention and ingestion rate."""
    settings = plan.settings
    m = settings.monitoring
    need = m.retention_days * 86400 * m.samples_per_second * BYTES_PER_SAMPLE * STORAGE_HEADROOM
    return max(MIN_VOLUME_GIB, -(-int(need) // 2**30))


def prometheus_storage_values(plan: StackPlan) -> dict:
    """A persistent volume (the regression alert's day-old baseline survives restarts),
    retention by time and, before the volume fills, by size ("GB" is GiB to Prometheus)."""
    settings = plan.settings
    m, gib = settings.monitoring, prometheus_volume_gib(plan)
    claim: dict = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{gib}Gi"}}}
    if m.storage_class:
        claim["storageClassName"] = m.storage_class
    return {"prometheus": {"prometheusSpec": {
        "retention": f"{m.retention_days}d",
        "retentionSize": f"{int(gib * RETENTION_SIZE_FRACTION)}GB",
        "storageSpec": {"volumeClaimTemplate": {"spec": claim}},
    }}}


def grafana_admin_values(plan: StackPlan) -> dict:
    """Grafana's admin login from the generated Secret, not the chart's default password."""
    return {"grafana": {"admin": {"existingSecret": GRAFANA_ADMIN_SECRET, "userKey": GRAFANA_USER_KEY,
                                  "passwordKey": GRAFANA_PASSWORD_KEY}}}


def alertmanager_values(plan: StackPlan) -> dict:
    """Alertmanager's receivers, routes and inhibitions from settings.alerting."""
    settings = plan.settings
    from workloads.observability import alerting

    return alerting.chart_values(settings)


def uses_mig(plan: StackPlan) -> bool:
    settings = plan.settings
    return any(p.mig is not None for p in settings.cluster.gpu_pools.values())


def device_plugin(plan: StackPlan) -> dict:
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
    return _release("nvidia-device-plugin", "nvidia-device-plugin", versions.NVIDIA_DEVICE_PLUGIN, values, plan)


def releases(plan: StackPlan, trace_topic_id=None) -> list[dict]:
    """The Helm releases, in install order (controllers before the objects that use them).
    `trace_topic_id` is the TLS trace topic the collector writes to (infra/logging.py; a
    Pulumi output in the program, a literal in tests)."""
    settings = plan.settings
    out = []
    if uses_mig(plan):  # VKE's device plugin add-on is left out then (infra/cluster.py)
        out.append(device_plugin(plan))
    if settings.serving.in_cluster_gateway:
        out.append(envoy_gateway(plan))
    if settings.autoscaling.enabled:
        out.append(keda(plan))
    if plan.rollout.argo:  # not for multi-node stacks: Argo cannot manage a LeaderWorkerSet
        out.append(argo_rollouts(plan))
    if plan.serving.multi_node:  # LeaderWorkerSet only runs multi-node replicas
        out.append(leader_worker_set(plan))
    if settings.monitoring.enabled:
        out.append(kube_prometheus_stack(plan))
    if telemetry.tracing_on(plan):
        out.append(telemetry.collector_release(plan, trace_topic_id))
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


def redis(plan: StackPlan) -> list[dict]:
    """One Redis, no persistence: it holds rate-limit counters whose windows are at most an
    hour, so losing them on a restart only resets the windows. It requires the password of
    the generated Secret (`--requirepass`, expanded by the kubelet from the env)."""
    labels = _labels()
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
    md = {"name": REDIS_NAME, "namespace": ENTRY_NAMESPACE, "labels": labels}
    container = {
        "name": "redis",
        "image": _mirror_ref(plan, "redis"),
        "args": ["--save", "", "--appendonly", "no", "--requirepass", "$(REDIS_PASSWORD)"],
        "env": [{"name": "REDIS_PASSWORD",
                 "valueFrom": {"secretKeyRef": {"name": REDIS_AUTH_SECRET, "key": REDIS_AUTH_KEY}}}],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
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
                # The new pod is up before the old one stops: counting goes on through a rollout.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
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


def _mirror_ref(plan: StackPlan, key: str) -> str:
    return mirror.ref(plan, key)


def redis_network_policy(plan: StackPlan) -> dict:
    """Only Envoy Gateway's rate-limit pods reach Redis, on its port; Redis reaches nothing."""
    labels = _labels()
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": REDIS_NAME, "namespace": ENTRY_NAMESPACE, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": {k: labels[k] for k in ("app.kubernetes.io/name",
                                                                   "app.kubernetes.io/instance")}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": dict(RATELIMIT_POD_LABELS)}}],
                         "ports": [{"protocol": "TCP", "port": REDIS_PORT}]}],
        },
    }


def manifests(plan: StackPlan) -> list[dict]:
    """Plain objects the controllers need besides their charts: the rate-limit Redis and
    the alert relay (workloads/observability/alerting.py)."""
    settings = plan.settings
    from workloads.observability import alerting

    out = ([*redis(plan), redis_network_policy(plan), rate_limit_pdb()]
           if global_rate_limit(settings) else [])
    return out + alerting.relay(settings, _mirror_ref(plan, "alert-relay"))
