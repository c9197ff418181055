"""Constants that cross the infra/workloads boundary, defined once.

The node (infra: what the GPU pools' init script prepares, which labels and taints a pool
carries) and the pod (workloads: where it mounts the cache, which uid it runs as, which
labels it selects) must agree on these; so must the policies that check both.

May import: nothing of the project.
"""

from __future__ import annotations

# --------------------------------------------------------------------------- labels
PART_OF = "deepseek-volc"  # app.kubernetes.io/part-of on every object we render
MANAGED_BY = "pulumi"  # app.kubernetes.io/managed-by
LABEL_PREFIX = "deepseek-volc"
POOL_LABEL = f"{LABEL_PREFIX}/pool"  # node label: which GPU pool a node belongs to
GPU_MODEL_LABEL = f"{LABEL_PREFIX}/gpu-model"  # node label: catalog GPU key (A10, H20, ...)
GPU_COUNT_LABEL = f"{LABEL_PREFIX}/gpus-per-node"  # node label: GPUs on the node
ROLE_LABEL = f"{LABEL_PREFIX}/role"  # pod label: leader or worker of a multi-node group
# node label: the weights revision whose files the pre-warm verified in the node's cache
WEIGHTS_LABEL = f"{LABEL_PREFIX}/weights"
PREWARM_SUFFIX = "-prewarm"  # the pre-warm DaemonSet and its ServiceAccount: <serving.name>-prewarm
TRACK_LABEL = f"{LABEL_PREFIX}/track"  # pod label: stable or canary groups of a staged multi-node release

# --------------------------------------------------------------------------- GPUs
GPU_RESOURCE = "nvidia.com/gpu"  # extended resource the NVIDIA device plugin advertises
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

# --------------------------------------------------------------------------- MIG
# A pool cut into MIG slices carries its profile as a node label (what the policies and
# the serving pods read) and the labels NVIDIA's tools act on: mig-manager's layout
# (`all-<profile>`) and the device plugin's per-node config, which selects the "mixed"
# strategy so each slice is advertised as nvidia.com/mig-<profile>.
MIG_PROFILE_LABEL = f"{LABEL_PREFIX}/mig-profile"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEVICE_PLUGIN_MIG_CONFIG = "mig-mixed"  # config name in the device plugin's ConfigMap
DEVICE_PLUGIN_DEFAULT_CONFIG = "default"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def mig_resource(profile: str) -> str:
    """The extended resource one slice of `profile` is advertised as (mixed strategy)."""
    return f"{MIG_RESOURCE_PREFIX}{profile}"

# --------------------------------------------------------------------------- model cache
# The GPU pools' data disk is mounted here on the node (infra/cluster.py's init script),
# owned by SERVING_UID so that the serving pods (which run as that uid) can write it.
MODEL_CACHE_HOST_PATH = "/mnt/model-cache"
SERVING_UID = 1000
# Where the pods mount the node's cache (the whole MODEL_CACHE_HOST_PATH, never a
# subdirectory: the kubelet would create a missing one root-owned). The weights tool creates
# <MODEL_CACHE_DIR>/<model> itself, as SERVING_UID, and the engine reads it from there.
MODEL_CACHE_DIR = "/model-cache"

# --------------------------------------------------------------------------- identity
# Audience of the projected service-account token that VolcEngine STS accepts for
# AssumeRoleWithOIDC (docs 6460/1324604); the reader role's trust policy checks it.
STS_AUDIENCE = "sts.volcengine.com"

# --------------------------------------------------------------------------- serving
# The port vLLM serves /health, /v1/* and /metrics on, and the serving Services expose.
HTTP_PORT = 8000
# A Triton pod's template carries the engine's settings as vLLM flags (JSON list) in this
# annotation, the same arguments its model.json holds as fields.
ENGINE_ARGS_ANNOTATION = f"{LABEL_PREFIX}/engine-args"
# Envoy Gateway runs its proxies in its controller namespace; a stable-named Service there
# selects the proxies of our Gateway, so the edge has a fixed target.
ENTRY_NAMESPACE = "envoy-gateway-system"
# Namespaces of the platform controllers' charts (workloads/platform/controllers.py); the platform log
# topic collects them (infra/logging.py).
KEDA_NAMESPACE = "keda"
ROLLOUTS_NAMESPACE = "argo-rollouts"
LWS_NAMESPACE = "lws-system"
# The in-cluster gateway copies the verified JWT's consumer claim into this request header
# (the rate-limit key); the access log and the spans record it.
CONSUMER_HEADER = "x-deepseek-consumer"


def entry_service(release: str) -> str:
    """The stable Service in ENTRY_NAMESPACE the edge forwards to."""
    return f"{release}-entry"
