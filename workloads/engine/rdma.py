"""RDMA for a serving replica that spans nodes on VKE.

Pipeline-parallel stages exchange activations and NCCL sets up its communicators across
nodes; over the RDMA NICs of an HPC instance type instead of the VPC network. On VKE a pod
gets RDMA NICs by requesting the `vke.volcengine.com/rdma` resource (advertised by the
rdma-device-plugin add-on) and naming one `rdma` network per NIC in the
`k8s.volcengine.com/pod-networks` annotation; NCCL is told which HCAs and which GID index
to use. What was read where (vllm-project/aibrix@e3e10f9e4aebe9aac5e7d992fb87d2648e01628b,
its VKE deployments):
- samples/deepseek-r1/README.md: the annotation, the resource, and IPC_LOCK (RDMA pins
  memory);
- samples/deepseek-r1/deepseek-r1-huggingface.yaml: `vke.volcengine.com/rdma: "8"` with 8
  `rdma` networks, NCCL_IB_DISABLE=0, NCCL_IB_HCA=mlx5_1:1..mlx5_8:1 (mlx5_0 is the VPC
  NIC), NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME=eth0;
- samples/disaggregation/vllm/README.md: the resource, the annotation and NCCL_IB_GID_INDEX
  are specific to VolcEngine; samples/disaggregation/vllm/1p1d.yaml: NCCL_IB_GID_INDEX=7.

NCCL is held to the RDMA NICs. Left to itself it falls back to TCP sockets when the IB
devices it is told about do not work (a wrong NCCL_IB_HCA, no RDMA resource), and the group
serves at a fraction of its speed with nothing failing. NCCL_NET=IB forces the IB verbs
transport, so NCCL fails instead ("NCCL_NET: Forces NCCL to use a specific network ...
and doesn't automatically fall back", NVIDIA/nccl docs/userguide/source/env.rst); and
NCCL's INFO log of its start (subsystems INIT and NET) goes to one file per process under
the container's /tmp (NCCL_DEBUG_FILE, `%h` host, `%p` pid), where the start-up probes
(runtime/health.py) require the IB transport before the pod counts as started.

Single-node replicas get nothing from here: their GPUs talk over NVLink.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from stacks.constants import HTTP_PORT
from workloads.engine.context import ServingContext

RDMA_RESOURCE = "vke.volcengine.com/rdma"
POD_NETWORKS_ANNOTATION = "k8s.volcengine.com/pod-networks"
NCCL_IB_GID_INDEX = "7"  # RoCE v2 GID of the pod's RDMA interface on VKE (aibrix 1p1d.yaml)
FIRST_RDMA_HCA = 1  # mlx5_0 is the VPC NIC; RDMA NICs follow it
# NCCL's own log, one file per process in the engine container's /tmp emptyDir
# (workloads/engine/manifests.py TMP_DIR); what the start-up check reads.
NCCL_LOG_FILE = "/tmp/nccl.%h.%p.log"
NCCL_LOG_GLOB = "/tmp/nccl.*.log"


@dataclass(frozen=True)
class RdmaExtras:
    """What a serving pod needs on top of its template to use `nics` RDMA NICs."""

    nics: int
    annotations: dict[str, str]
    resources: dict[str, str]
    env: list[dict]
    capabilities: list[str]


def hca_list(nics: int) -> str:
    return ",".join(f"mlx5_{FIRST_RDMA_HCA + i}:1" for i in range(nics))


def extras(ctx: ServingContext) -> RdmaExtras | None:
    """The RDMA additions for this stack's serving pods, or None when they use no RDMA
    (single-node serving, or a pool without RDMA NICs)."""
    nics = ctx.plan.serving.rdma_per_pod
    if not nics:
        return None
    return RdmaExtras(
        nics=nics,
        annotations={POD_NETWORKS_ANNOTATION: json.dumps([{"cniConf": {"name": "rdma"}}] * nics)},
        resources={RDMA_RESOURCE: str(nics)},
        env=[
            {"name": "NCCL_IB_DISABLE", "value": "0"},
            # IB or nothing: never a silent fall-back to TCP sockets
            {"name": "NCCL_NET", "value": "IB"},
            {"name": "NCCL_DEBUG", "value": "INFO"},
            {"name": "NCCL_DEBUG_SUBSYS", "value": "INIT,NET"},
            {"name": "NCCL_DEBUG_FILE", "value": NCCL_LOG_FILE},
            {"name": "NCCL_IB_HCA", "value": hca_list(nics)},
            {"name": "NCCL_IB_GID_INDEX", "value": NCCL_IB_GID_INDEX},
            {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
        ],
        capabilities=["IPC_LOCK"],
    )


def startup_probe(ctx: ServingContext, probe: dict) -> dict:
    """The start-up probe of an engine on RDMA, which also requires NCCL's log to show the
    IB transport (runtime/health.py): a leader's /health, or a worker's engine processes,
    and the IB lines. A worker's probe waits up to the model load for them (its
    communicators start with the group, after the handshake)."""
    if "httpGet" in probe:
        url = f"http://127.0.0.1:{HTTP_PORT}{probe['httpGet']['path']}"
        check = ["python3", "-m", "runtime.health", "startup", "--url", url]
        out = {k: v for k, v in probe.items() if k != "httpGet"}
    else:
        check = list(probe["exec"]["command"])
        out = {k: v for k, v in probe.items() if k != "exec"}
        out["failureThreshold"] = max(out["failureThreshold"],
                                      -(-ctx.settings.serving.startup_timeout_seconds // out["periodSeconds"]))
    return {"exec": {"command": check + ["--nccl-logs", NCCL_LOG_GLOB]}, **out}

