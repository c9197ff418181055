"""What DeepEP's all-to-all needs in a serving pod on VKE's RDMA pools.

vLLM's `deepep_low_latency` / `deepep_high_throughput` backends (capacity/wide_ep.py) run
DeepEP's NVSHMEM kernels, which talk GPU to NIC with InfiniBand GPUDirect Async (IBGDA).
The serving image is vLLM's own (vllm/vllm-openai), which ships DeepEP, NVSHMEM and
DeepGEMM since vllm-project/vllm#21976. What the pod adds, each with where it was read
(2026-12-01):

* `NVSHMEM_IB_ENABLE_IBGDA=1`: "Set to enable GPU-initiated communication transport"
  (NVIDIA/nvshmem src/include/bootstrap_host_transport/env_defs_internal.h); DeepEP's
  internode kernels need it (deepseek-ai/DeepEP third-party/README.md, "Enable NVSHMEM
  IBGDA support"; llm-d guides/wide-ep-lws decode.yaml and prefill.yaml set it).
* `NVSHMEM_IBGDA_NIC_HANDLER=auto`: the GPU rings the NIC's doorbell where the node's
  NVIDIA driver allows it (`NVreg_EnableStreamMemOPs=1`, `PeerMappingOverride=1`: DeepEP's
  README, 2.1), else the CPU does (CPU-assisted IBGDA, NVSHMEM 3.4.5 release notes: no
  GDRCopy and no driver regkey needed). VKE's node images are not known to set the
  regkeys; `gpu` would fail on a node without them, `auto` runs on both (NVSHMEM's own
  default, written out so a pod spec shows the choice).
* `NVSHMEM_HCA_PE_MAPPING` with `NVSHMEM_ENABLE_NIC_PE_MAPPING=1`: the pod's RDMA NICs,
  each shared by the same number of GPUs in order (`hca:port:count`, NVSHMEM's format;
  the mapping variable is ignored unless the switch is 1). It keeps NVSHMEM off mlx5_0,
  the VPC NIC, as NCCL_IB_HCA does (workloads/engine/rdma.py). That consecutive GPUs share
  a NIC is the usual 8-GPU/4-NIC layout, not stated for these instance types.
* `NVSHMEM_IB_GID_INDEX`: "Source GID Index for ROCE": VKE's RoCE v2 GID, as NCCL's
  (rdma.NCCL_IB_GID_INDEX).
* `NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=eth0`: NVSHMEM's bootstrap over the pod network, as
  GLOO/NCCL_SOCKET_IFNAME (llm-d sets the same).

Privileges: only `IPC_LOCK`, which the RDMA pod has already (registering memory with a NIC
pins it: `ibv_reg_mr`; llm-d#2442 ran its RoCE pods with IPC_LOCK alone after dropping
SYS_RAWIO). No root, no privileged container, no host network; the `serving-rdma-privileges`
policy (policies/pods.py) holds the engine to exactly that.
"""

from __future__ import annotations

from workloads.engine import rdma
from workloads.engine.context import ServingContext


def mapping(nics: int, gpus: int) -> str:
    """NVSHMEM_HCA_PE_MAPPING: `gpus` local PEs spread in order over the pod's RDMA NICs."""
    per_nic, extra = divmod(gpus, nics)
    return ",".join(f"mlx5_{rdma.FIRST_RDMA_HCA + i}:1:{per_nic + (1 if i < extra else 0)}"
                    for i in range(nics) if per_nic + (1 if i < extra else 0))


def env(ctx: ServingContext, nics: int, all2all_backend: str | None) -> list[dict]:
    """NVSHMEM's environment for a pod with `nics` RDMA NICs running `all2all_backend`;
    nothing unless that is a DeepEP backend."""
    if not all2all_backend or not all2all_backend.startswith("deepep") or not nics:
        return []
    return [
        {"name": "NVSHMEM_IB_ENABLE_IBGDA", "value": "1"},
        {"name": "NVSHMEM_IBGDA_NIC_HANDLER", "value": "auto"},
        {"name": "NVSHMEM_ENABLE_NIC_PE_MAPPING", "value": "1"},
        {"name": "NVSHMEM_HCA_PE_MAPPING", "value": mapping(nics, ctx.gpus_per_pod)},
        {"name": "NVSHMEM_IB_GID_INDEX", "value": rdma.NCCL_IB_GID_INDEX},
        {"name": "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "value": "eth0"},
    ]
