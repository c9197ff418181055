"""The routing tier: vLLM Router between the gateway's proxies and the engines.

    Envoy proxies (JWT, rate limits, canary split) -> router Service -> vLLM Router pods
      -> engine pods, found by Kubernetes service discovery (label selectors)

vLLM Router (vllm-project/router, PyPI `vllm-router` 0.1.17, image
`docker.io/vllm/vllm-router:v0.1.17` from the project's release pipeline, mirrored into the
stack's registry like every other image) chooses an engine per request:

* aggregated replicas: `cache_aware` (a request goes to the engine whose radix tree holds
  the longest prefix of its prompt, unless the load is imbalanced), so conversations and
  shared system prompts hit the engine's prefix cache (benchmarks/results/routing.json);
* data-parallel engines behind one API server (wide EP): the same, DP-aware
  (`--intra-node-data-parallel-size`): the router addresses each engine by its rank;
* prefill/decode disaggregation: `--vllm-pd-disaggregation`, cache-aware over prefill
  groups, then a decode group with the prefill's `kv_transfer_params` (NIXL).

The router watches pods (get/list/watch) in the serving namespace only: a Role, never a
ClusterRole. It runs as a non-root user on a read-only root filesystem with no capability,
at least two replicas spread over nodes and zones, behind a PodDisruptionBudget.
"""

from __future__ import annotations

from stacks.constants import HTTP_PORT
from workloads.engine import disaggregation
from workloads.engine.context import ServingContext
from workloads.engine.manifests import pull_secrets, serving_selector
from workloads.supply_chain import mirror

COMPONENT = "router"
JOB = "vllm-router"  # job label of the router's series (PodMonitor relabeling)
IMAGE_KEY = "vllm-router"
UID = 65534  # nobody: the image's binary is world-executable, it writes nothing but /tmp


def enabled(ctx: ServingContext) -> bool:
    return ctx.routed


def name(ctx: ServingContext) -> str:
    return ctx.router_service


def service_name(ctx: ServingContext) -> str:
    return name(ctx)


def _selector_args(labels: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(labels.items())]


def phase_selector(ctx: ServingContext, role: str) -> dict[str, str]:
    """Pods of one side that answer HTTP (group leaders when a side spans nodes)."""
    return disaggregation.http_selector(ctx, role)


def policies(ctx: ServingContext) -> tuple[str, str]:
    """(prefill or aggregated policy, decode policy)."""
    r = ctx.settings.serving.router
    first = r.policy or "cache_aware"
    d = ctx.plan.disaggregation
    # vllm-router refuses power_of_two with fewer than two workers of a kind
    decode = "power_of_two" if d is not None and d.decode.min_replicas >= 2 else "round_robin"
    return first, (r.policy or decode)


def request_timeout_seconds(ctx: ServingContext) -> int:
    """A generation's longest run: the gateway's idle budget (a whole non-streamed answer) or a
    stream's drain budget, whichever is longer (the router's timeout is a total)."""
    s = ctx.settings
    return max(s.gateway.request_timeout_seconds, s.serving.inflight_drain_seconds)


def args(ctx: ServingContext) -> list[str]:
    r = ctx.settings.serving.router
    plan = ctx.plan.router
    first, decode = policies(ctx)
    out = ["--host", "0.0.0.0", "--port", str(r.port),
           "--prometheus-host", "0.0.0.0", "--prometheus-port", str(r.metrics_port),
           "--service-discovery", "--service-discovery-namespace", ctx.namespace,
           "--service-discovery-port", str(HTTP_PORT)]
    if plan.mode == "pd":
        out += ["--vllm-pd-disaggregation", "--kv-connector", "nixl",
                "--prefill-selector", *_selector_args(phase_selector(ctx, "prefill")),
                "--decode-selector", *_selector_args(phase_selector(ctx, "decode")),
                "--prefill-policy", first, "--decode-policy", decode]
    else:
        out += ["--selector", *_selector_args(serving_selector(ctx)), "--policy", first]
        if plan.mode == "dp_aware":
            out += ["--intra-node-data-parallel-size", str(plan.data_parallel_size)]
    out += ["--request-timeout-secs", str(request_timeout_seconds(ctx)),
            # an engine that fails its health check three times in a row (10 s apart) leaves
            # the rotation; one that answers twice is back
            "--health-check-interval-secs", "10", "--health-failure-threshold", "3",
            "--health-success-threshold", "2",
            # the edge's request id names the request in the router's log too
            "--request-id-headers", "x-request-id",
            "--log-level", "info"]
    return out


def service_account(ctx: ServingContext) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": ctx.metadata(name(ctx), COMPONENT),
            # the router reads the API (service discovery); nothing else in the namespace does
            "automountServiceAccountToken": True}


def role(ctx: ServingContext) -> dict:
    """What service discovery reads: pods of the serving namespace, nothing else."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": ctx.metadata(name(ctx), COMPONENT),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}


def role_binding(ctx: ServingContext) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": ctx.metadata(name(ctx), COMPONENT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name(ctx)},
            "subjects": [{"kind": "ServiceAccount", "name": name(ctx), "namespace": ctx.namespace}]}


def container(ctx: ServingContext) -> dict:
    r = ctx.settings.serving.router
    tcp = {"tcpSocket": {"port": "http"}}
    return {
        "name": "router",
        "image": mirror.ref(ctx.plan, IMAGE_KEY),
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm-router"],
        "args": args(ctx),
        "ports": [{"name": "http", "containerPort": r.port, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": r.metrics_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}},
        # The router's /health answers 503 while any engine is unhealthy: probing it would take
        # every router out (or restart it) when one engine restarts. The socket says the
        # router itself is up; which engines it sends to is its own health check.
        "startupProbe": {**tcp, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 60},
        "readinessProbe": {**tcp, "periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3},
        "livenessProbe": {**tcp, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": UID,
                            "runAsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
        # the gateway stops sending here before SIGTERM; streams in flight then finish
        "lifecycle": {"preStop": {"sleep": {"seconds": ctx.settings.serving.drain_seconds}}},
    }


def deployment(ctx: ServingContext) -> dict:
    sel = ctx.selector(COMPONENT)
    spread = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
               "labelSelector": {"matchLabels": sel}}
              for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")]
    sv = ctx.settings.serving
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.metadata(name(ctx), COMPONENT),
        "spec": {
            "replicas": sv.router.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": sel},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": ctx.labels(COMPONENT)},
                "spec": {
                    "serviceAccountName": name(ctx),
                    **pull_secrets(ctx),
                    "automountServiceAccountToken": True,
                    "terminationGracePeriodSeconds": sv.drain_seconds + sv.inflight_drain_seconds + 30,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container(ctx)],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}],
                    "topologySpreadConstraints": spread,
                },
            },
        },
    }


def service(ctx: ServingContext) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": ctx.metadata(service_name(ctx), COMPONENT),
            "spec": {"type": "ClusterIP", "selector": ctx.selector(COMPONENT),
                     "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}]}}


def pod_disruption_budget(ctx: ServingContext) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": ctx.metadata(name(ctx), COMPONENT),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": ctx.selector(COMPONENT)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def pod_monitor(ctx: ServingContext) -> dict:
    labels = {**ctx.labels("monitoring"), **ctx.settings.monitoring.selector_labels}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name(ctx), "namespace": ctx.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": ctx.selector(COMPONENT)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s",
                                     "relabelings": [{"targetLabel": "job", "replacement": JOB,
                                                      "action": "replace"}]}],
        },
    }


def selector(ctx: ServingContext) -> str:
    """PromQL label matchers of the router's series."""
    return f'namespace="{ctx.namespace}",job="{JOB}"'


def render(ctx: ServingContext) -> list[dict]:
    if not enabled(ctx):
        return []
    objs = [service_account(ctx), role(ctx), role_binding(ctx), deployment(ctx), service(ctx),
            pod_disruption_budget(ctx)]
    if ctx.settings.monitoring.enabled:
        objs.append(pod_monitor(ctx))
    return objs
