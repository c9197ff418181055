"""KV cache offload to CPU memory, sized from the node's RAM, and a serving pod's host memory.

vLLM 0.32's `--kv-offloading-size` is "Size of the KV cache offloading buffer in GiB. When
TP > 1, this is the total buffer size summed across all TP ranks" (vllm/config/cache.py),
one buffer per engine (a data-parallel rank); with `--kv-offloading-backend native` it
becomes the OffloadingConnector with `cpu_bytes_to_use = size x 2^30`
(vllm/config/vllm.py, _post_init_kv_transfer_config). On CUDA the buffer is one shared
mmap region per engine, `/dev/shm/vllm_offload_{engine_id}.mmap`, whose free space vLLM
checks before it truncates the file to the full size (vllm/v1/kv_offload/cpu/spec.py,
shared_offload_region.py). So a pod's /dev/shm (an emptyDir in memory, counted in the
pod's memory) must hold every one of its engines' buffers on top of what NCCL uses there,
and the pod's memory request and limit must hold that /dev/shm: else vLLM refuses to start
or the pod is OOM-killed.

Sizing (`plan`): on a node of `node_ram_gib`, the pods may use NODE_ALLOCATABLE_SHARE of it
(kubelet and system reserves, eviction threshold, daemonsets: an estimate, VKE's exact
reservation is not published per type); each pod takes its share; of what its engine
processes leave, KV_OFFLOAD_FREE_SHARE becomes offload buffer (the rest stays free for
the page cache, which holds the checkpoint the engines load from the node cache). A size
set in the settings is checked against the same bound and refused naming the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.memory import PlanError
from capacity.specs import GiB

NODE_ALLOCATABLE_SHARE = 0.9
KV_OFFLOAD_FREE_SHARE = 0.5
BACKEND = "native"  # vLLM's own CPU offloading; lmcache needs a separate LMCache server

# A serving pod's host memory besides offload (workloads/engine/manifests.py requests it)
ENGINE_BASE_BYTES = 16 * GiB  # engine process, tokenizer workers, pinned staging buffers
PER_GPU_BYTES = 16 * GiB  # each per-rank worker
API_SERVER_BYTES = 2 * GiB  # each API server process beyond the first (Python, vLLM, tokenizer)
MIG_POD_BYTES = 8 * GiB  # a MIG slice's pod holds a small model


def shm_base_bytes(gpus_per_pod: int, mig: bool) -> int:
    """/dev/shm for NCCL and the engine's worker IPC: the 64 MiB container default breaks
    tensor parallelism (vllm#1710). 2 GiB base + 2 GiB per GPU in the pod; 1 GiB on a MIG
    slice (one process, no NCCL)."""
    return GiB if mig else (2 + 2 * gpus_per_pod) * GiB


def host_bytes(gpus_per_pod: int, mig: bool, api_servers: int = 1) -> int:
    """Host memory of a serving pod without offload buffers: the engine process plus ~16 GiB
    per GPU for the per-rank workers, the extra API servers, and the shm that counts against
    the container's memory. A MIG slice's pod gets 8 GiB plus its shm."""
    if mig:
        return MIG_POD_BYTES + shm_base_bytes(gpus_per_pod, mig)
    return (ENGINE_BASE_BYTES + PER_GPU_BYTES * gpus_per_pod + API_SERVER_BYTES * max(api_servers - 1, 0)
            + shm_base_bytes(gpus_per_pod, mig))


def engines_per_pod(tensor_parallel_size: int, pipeline_parallel_size: int, gpus_per_pod: int) -> int:
    """Engines (data-parallel ranks) with a buffer in one pod's /dev/shm: each engine's ranks
    on the pod share its region; an engine spanning pods (pipeline stages on several nodes)
    has the whole region in each."""
    return max(1, gpus_per_pod // (tensor_parallel_size * pipeline_parallel_size))


@dataclass(frozen=True)
class KvOffload:
    """The offload buffers of one serving pod."""

    gib_per_engine: int  # --kv-offloading-size
    engines_per_pod: int
    planned: bool  # sized here (True) or set in the settings

    @property
    def pod_bytes(self) -> int:
        return self.gib_per_engine * GiB * self.engines_per_pod

    @property
    def backend(self) -> str:
        return BACKEND


def plan(*, enabled: bool, gib: int | None, node_ram_gib: int | None, instance_type: str, pods_per_node: int,
         pod_host_bytes: int, engines: int, field: str = "serving.engine.kv_offload_gib") -> KvOffload | None:
    """The pod's offload buffers (None when off); PlanError naming `field` and the numbers
    when a set size does not fit the node, or when none can be sized."""
    if not enabled:
        return None
    if node_ram_gib is None:
        if gib is None:
            raise PlanError(f"{field}: {instance_type} has no memory figure in capacity/instances.py to size the "
                            "offload from; expected a size in GiB per engine")
        return KvOffload(gib, engines, planned=False)
    allocatable = NODE_ALLOCATABLE_SHARE * node_ram_gib * GiB
    per_pod = allocatable / max(pods_per_node, 1)
    free = per_pod - pod_host_bytes
    most = int(free // (engines * GiB)) if free > 0 else 0
    if gib is None:
        size = int(KV_OFFLOAD_FREE_SHARE * free // (engines * GiB)) if free > 0 else 0
        if size < 1:
            raise PlanError(f"{field}: a pod's {pod_host_bytes / GiB:.0f} GiB already takes its share of "
                            f"{instance_type}'s RAM ({per_pod / GiB:.0f} GiB of {node_ram_gib} GiB); no room to "
                            "offload the KV cache: expected kv_offload off")
        return KvOffload(size, engines, planned=True)
    if gib > most:
        raise PlanError(
            f"{field}: {gib} GiB x {engines} engine(s) per pod + {pod_host_bytes / GiB:.0f} GiB for the engine "
            f"processes = {(gib * engines * GiB + pod_host_bytes) / GiB:.0f} GiB, more than one pod may use on "
            f"{instance_type} ({node_ram_gib} GiB RAM, {NODE_ALLOCATABLE_SHARE:.0%} allocatable"
            + (f", {pods_per_node} pods per node" if pods_per_node > 1 else "")
            + f" = {per_pod / GiB:.0f} GiB); expected at most {most}")
    return KvOffload(gib, engines, planned=False)
