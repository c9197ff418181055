"""What a GPU node pool is made of, and the kubelet topology policy it gets.

Pure functions over the instance catalog and the pool settings, shared by the pool's
settings (which refuse a node shape the catalog cannot resolve), the plan (which decides
each pool's shape and policy, stacks/plan/pools.py) and the policy pack.
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.instances import InstanceType, get_instance_type, is_hpc_family, resolve_instance_type

# The scope the provider accepts (provider contract: kubeletConfig.topologyManagerScope).
TOPOLOGY_SCOPE = "container"


def instance_type_rdma(instance_type: str) -> bool:
    """VolcEngine's HPC GPU instance types (ecs.hpc*, ecs.ebmhpc*) sit in an HPC cluster with
    RDMA NICs between nodes (ecs.hpcpni2.28xlarge, ecs.hpcpni3ln.45xlarge: RDMA)."""
    family = instance_type.split(".")
    return len(family) > 1 and family[1].startswith(("hpc", "ebmhpc"))


def pool_gpu(instance_type: str, gpu: str | None, gpus_per_node: int | None) -> tuple[str, int]:
    """(GPU model, GPUs per node) of a pool: as stated, else from the instance-type catalog
    (the pool's settings refuse an instance type the catalog cannot resolve)."""
    if gpu is not None and gpus_per_node is not None:
        return gpu, gpus_per_node
    resolved = resolve_instance_type(instance_type)
    if resolved is None:
        raise ValueError(f"{instance_type!r}: GPU model and count unknown; set gpu and gpus_per_node")
    return resolved


@dataclass(frozen=True)
class PoolHardware:
    """The node shape of a pool: the settings' statements over the catalog's."""

    instance_type: str
    gpu: str
    gpus_per_node: int
    numa_nodes: int | None
    rdma: bool
    rdma_nics: int | None
    hpc: bool
    record: InstanceType | None

    @property
    def gpus_per_numa_node(self) -> int | None:
        if self.numa_nodes is None:
            return None
        return max(1, self.gpus_per_node // self.numa_nodes)


def pool_hardware(instance_type: str, gpu: str, gpus_per_node: int, *, numa_nodes: int | None = None,
                  rdma_nics: int | None = None) -> PoolHardware:
    """`gpu` and `gpus_per_node` are already resolved (settings or catalog); NUMA nodes and
    RDMA NICs come from the settings when stated, else from the catalog."""
    rec = get_instance_type(instance_type)
    hpc = rec.hpc_only if rec is not None else is_hpc_family(instance_type)
    rdma = (rec.rdma if rec is not None else hpc) or bool(rdma_nics)
    return PoolHardware(
        instance_type=instance_type,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        numa_nodes=numa_nodes if numa_nodes is not None else (rec.numa_nodes if rec else None),
        rdma=rdma,
        rdma_nics=rdma_nics if rdma_nics is not None else (rec.rdma_nics if rec else None),
        hpc=hpc,
        record=rec,
    )


def topology_policy(gpus_per_pod: int, hw: PoolHardware) -> str:
    """The kubelet topology-manager policy for pods taking `gpus_per_pod` GPUs.

    `single-numa-node` admits a pod only when all its GPUs sit on one NUMA node: right
    for one GPU, or when the NUMA layout is known and the pod fits in one node's share.
    Otherwise `restricted`: it still prefers the narrowest set of NUMA nodes, and admits
    a pod that spans them when no narrower set exists (an 8-GPU pod on a two-socket host),
    which `single-numa-node` refuses at admission."""
    if gpus_per_pod <= 1:
        return "single-numa-node"
    per_numa = hw.gpus_per_numa_node
    if per_numa is not None and gpus_per_pod <= per_numa:
        return "single-numa-node"
    return "restricted"


def single_numa_refusal(gpus_per_pod: int, hw: PoolHardware) -> str | None:
    """Why `single-numa-node` cannot admit such pods on this hardware (None: it can)."""
    if gpus_per_pod <= 1:
        return None
    per_numa = hw.gpus_per_numa_node
    if per_numa is None:
        return (f"the NUMA layout of {hw.instance_type} is not known (state numa_nodes), so a pod of "
                f"{gpus_per_pod} GPUs may span NUMA nodes and kubelet would refuse it at admission")
    if gpus_per_pod > per_numa:
        return (f"a pod of {gpus_per_pod} GPUs spans NUMA nodes on {hw.instance_type} ({hw.gpus_per_node} GPUs "
                f"over {hw.numa_nodes} NUMA nodes, {per_numa} per node) and kubelet would refuse it at admission")
    return None


def rdma_per_pod(gpus_per_pod: int, hw: PoolHardware) -> int:
    """RDMA NICs a pod of `gpus_per_pod` GPUs attaches: its share of the node's NICs."""
    if not hw.rdma or not hw.rdma_nics:
        return 0
    return max(1, hw.rdma_nics * gpus_per_pod // hw.gpus_per_node)
