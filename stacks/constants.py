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

# --------------------------------------------------------------------------- GPUs
GPU_RESOURCE = "nvidia.com/gpu"  # extended resource the NVIDIA device plugin advertises
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}

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
# Envoy Gateway runs its proxies in its controller namespace; a stable-named Service there
# selects the proxies of our Gateway, so the edge has a fixed target.
ENTRY_NAMESPACE = "envoy-gateway-system"


def entry_service(release: str) -> str:
    """The stable Service in ENTRY_NAMESPACE the edge forwards to."""
    return f"{release}-entry"
