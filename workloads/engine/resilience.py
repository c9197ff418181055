"""GPU node health, pre-warm and warm capacity (settings.resilience).

    render(ctx, role_trn) -> list[dict]

* gpu-health: the controller of runtime/gpu_health.py (DCGM XID/ECC and device-plugin
  signals from Prometheus -> a NoSchedule taint on the node, serving pods evicted through
  the Eviction API), with the RBAC it needs: nodes get/list/patch, pods list and evict in
  the serving namespace. It runs on the system pool, in the monitoring namespace, from the
  serving image (which carries runtime/).
* prewarm: a DaemonSet on the serving pool. Its init containers pull the serving image and,
  with weights_mode sync, run the same weights sync the serving pod runs, into the node's
  model cache; it then sleeps on the serving image so the kubelet's image GC keeps it. A
  node that joins (autoscaling, repair, warm capacity) is warmed before a serving pod is
  placed there; a serving pod that lands meanwhile waits on the cache lock and finds the
  files there (runtime/weights.py). For multi-node groups it then labels the node with the
  weights revision it verified (WEIGHTS_LABEL, groups.weights_revision; the groups prefer such nodes): its
  own ServiceAccount may get and patch nodes, nothing else, and only the sync container
  gets the API token.
* warm capacity: a PriorityClass below every other pod's (-1, preemptionPolicy Never) and
  placeholder pods that hold one serving pod's GPUs each. A new serving replica preempts a
  placeholder at once instead of waiting minutes for a node; the evicted placeholder goes
  Pending and the cluster autoscaler grows the pool for it (it scales up for pods of
  priority >= -10, its expendable-pods cutoff; cluster-autoscaler FAQ, "How can I configure
  overprovisioning with Cluster Autoscaler?").
"""

from __future__ import annotations

from stacks.constants import GPU_MODEL_LABEL, GPU_RESOURCE, POOL_LABEL, PREWARM_SUFFIX, WEIGHTS_LABEL
from workloads.engine import groups, manifests
from workloads.engine.context import ServingContext

HEALTH_NAME = "gpu-health"
WARM_PRIORITY = -1


def _affinity(pool: str) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [pool]}]}]}}}


GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
SLEEP = ["sleep", "infinity"]


def _pod_security() -> dict:
    return {"runAsNonRoot": True, "runAsUser": manifests.SERVING_UID, "fsGroup": manifests.SERVING_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


# --------------------------------------------------------------------------- gpu health


def gpu_health(ctx: ServingContext) -> list[dict]:
    s = ctx.settings
    h = s.resilience.gpu_health
    if not (h.enabled and s.monitoring.enabled):
        return []
    ns = s.monitoring.namespace
    name = f"{ctx.release}-{HEALTH_NAME}"
    labels = ctx.labels(HEALTH_NAME)
    rules = [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
    ]
    serving_rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    args = ["--prometheus", s.monitoring.prometheus_url, "--node-selector", GPU_MODEL_LABEL,
            "--namespace", ctx.namespace, "--interval", str(h.interval_seconds),
            "--max-fraction", f"{h.max_unhealthy_fraction:g}"] + ([] if h.evict else ["--no-evict"])
    subject = [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": ctx.metadata(name, HEALTH_NAME, ns)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name, "labels": labels}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": subject},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": ctx.metadata(name, HEALTH_NAME), "rules": serving_rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": ctx.metadata(name, HEALTH_NAME),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": subject},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": ctx.metadata(name, HEALTH_NAME, ns),
            "spec": {
                "replicas": 1,
                # never two controllers deciding at once
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": ctx.selector(HEALTH_NAME)},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": name,
                        "securityContext": _pod_security(),
                        "affinity": _affinity("system"),
                        "containers": [{
                            "name": HEALTH_NAME,
                            "image": ctx.image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-m", "runtime.gpu_health"],
                            "args": args,
                            "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
                            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                          "limits": {"cpu": "500m", "memory": "256Mi"}},
                            "securityContext": manifests.container_security(),
                        }],
                    },
                },
            },
        },
    ]


# --------------------------------------------------------------------------- pre-warm


KUBE_API_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # where in-cluster clients look


def _kube_api_token() -> dict:
    """What automountServiceAccountToken would mount (token, cluster CA, namespace), as a
    volume that only the container that marks the node mounts."""
    return {"name": "kube-api-token", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


def prewarm_rbac(ctx: ServingContext, name: str) -> list[dict]:
    """Nodes get and patch for the pre-warm's ServiceAccount (its label on its own node;
    RBAC cannot narrow a DaemonSet's nodes by name)."""
    labels = ctx.labels("prewarm")
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}]},
    ]


def prewarm(ctx: ServingContext, role_env: dict) -> list[dict]:
    s = ctx.settings
    if not s.resilience.prewarm.enabled:
        return []
    name = f"{ctx.release}{PREWARM_SUFFIX}"
    mark = groups.marks_nodes(ctx)
    init = [{
        "name": "pull",
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", "pass"],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": manifests.container_security(),
    }]
    keep = {"home", "volcengine-token"}
    if s.serving.weights_mode == "sync":
        sync = dict(manifests.init_containers(ctx, role_env)[0])
        # Light requests: the DaemonSet pod's request stays on the node beside the server's.
        sync["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
        if mark:
            sync["command"] = sync["command"] + ["--mark-node", f"{WEIGHTS_LABEL}={groups.weights_revision(ctx)}"]
            sync["env"] = sync["env"] + [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
            sync["volumeMounts"] = sync["volumeMounts"] + [
                {"name": "kube-api-token", "mountPath": KUBE_API_TOKEN_DIR, "readOnly": True}]
        init.append(sync)
        keep.add("model-cache")
    volumes = [v for v in manifests.volumes(ctx) if v["name"] in keep]
    if mark and s.serving.weights_mode == "sync":
        volumes.append(_kube_api_token())
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": ctx.metadata(name, "prewarm"),
               "automountServiceAccountToken": False}
    return [account, *(prewarm_rbac(ctx, name) if mark else []), {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": ctx.metadata(name, "prewarm"),
        "spec": {
            "selector": {"matchLabels": ctx.selector("prewarm")},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": ctx.labels("prewarm")},
                "spec": {
                    # its own identity: TOS trusts it like the serving one (infra/weights.py)
                    "serviceAccountName": name,
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(),
                    "affinity": _affinity(ctx.gpu_pool),
                    "tolerations": [GPU_TOLERATION],
                    "initContainers": init,
                    "containers": [{
                        "name": "hold",
                        "image": ctx.image,
                        "imagePullPolicy": "IfNotPresent",
                        "command": SLEEP,
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "50m", "memory": "64Mi"}},
                        "securityContext": manifests.container_security(),
                    }],
                    "volumes": volumes,
                },
            },
        },
    }]


# --------------------------------------------------------------------------- warm capacity


def warm_capacity(ctx: ServingContext) -> list[dict]:
    n = ctx.settings.resilience.warm_capacity.replicas
    if n == 0:
        return []
    name = f"{ctx.release}-warm-capacity"
    gpus = str(ctx.gpus_per_pod)
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": ctx.labels("warm-capacity")},
            "value": WARM_PRIORITY,
            "preemptionPolicy": "Never",
            "globalDefault": False,
            "description": "Placeholders holding GPUs for the next serving replica; preempted by any other pod.",
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": ctx.metadata(name, "warm-capacity"),
            "spec": {
                "replicas": n,
                "selector": {"matchLabels": ctx.selector("warm-capacity")},
                "template": {
                    "metadata": {"labels": ctx.labels("warm-capacity")},
                    "spec": {
                        "priorityClassName": name,
                        "terminationGracePeriodSeconds": 0,
                        "automountServiceAccountToken": False,
                        "securityContext": _pod_security(),
                        "affinity": _affinity(ctx.gpu_pool),
                        "tolerations": [GPU_TOLERATION],
                        "containers": [{
                            # the serving image: a warm node has it pulled already
                            "name": "placeholder",
                            "image": ctx.image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": SLEEP,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "64Mi", ctx.gpu_resource: gpus},
                                "limits": {"cpu": "100m", "memory": "64Mi", ctx.gpu_resource: gpus},
                            },
                            "securityContext": manifests.container_security(),
                        }],
                    },
                },
            },
        },
    ]


def render(ctx: ServingContext, role_trn: str | None = None) -> list[dict]:
    role_env = {"name": "VOLCENGINE_OIDC_ROLE_TRN", "value": role_trn if role_trn is not None else ""}
    return [*gpu_health(ctx), *prewarm(ctx, role_env), *warm_capacity(ctx)]
