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

Single-node replicas get nothing from here: their GPUs talk over NVLink.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from workloads.engine.context import ServingContext

RDMA_RESOURCE = "vke.volcengine.com/rdma"
POD_NETWORKS_ANNOTATION = "k8s.volcengine.com/pod-networks"
NCCL_IB_GID_INDEX = "7"  # RoCE v2 GID of the pod's RDMA interface on VKE (aibrix 1p1d.yaml)
FIRST_RDMA_HCA = 1  # mlx5_0 is the VPC NIC; RDMA NICs follow it


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
            {"name": "NCCL_IB_HCA", "value": hca_list(nics)},
            {"name": "NCCL_IB_GID_INDEX", "value": NCCL_IB_GID_INDEX},
            {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
        ],
        capabilities=["IPC_LOCK"],
    )
