"""The GPU node pools, resolved: node shape, zones, MIG slices, what a pod takes, the
kubelet topology policy; refused where VKE or kubelet would refuse them."""

from __future__ import annotations

from types import MappingProxyType

from capacity.mig import MigProfile, mig_profile
from capacity.planner import Plan
from stacks.errors import Refusal
from stacks.nodepools import (
    PoolHardware,
    instance_type_rdma,
    pool_gpu,
    pool_hardware,
    single_numa_refusal,
    topology_policy,
)
from stacks.plan.types import PoolPlan
from stacks.regions import refuse_unsold
from stacks.sections.cluster import GpuPoolSettings
from stacks.settings import StackSettings


def pool_hw(pool: GpuPoolSettings) -> PoolHardware:
    """The node shape of a GPU pool: GPU model and count, NUMA layout, RDMA, HPC."""
    gpu, per_node = pool_gpu(pool.instance_type, pool.gpu, pool.gpus_per_node)
    return pool_hardware(pool.instance_type, gpu, per_node, numa_nodes=pool.numa_nodes, rdma_nics=pool.rdma_nics)


def pool_mig(pool: GpuPoolSettings) -> MigProfile | None:
    """The MIG profile a pool's GPUs are cut into, or None for whole GPUs."""
    return mig_profile(pool_hw(pool).gpu, pool.mig.profile) if pool.mig is not None else None


def check_pool_zones(s: StackSettings) -> None:
    """Each pool within the stack's zones; an HPC pool in exactly one (an ecs.HpcCluster sits
    in one zone: provider contract ecs/hpcCluster zoneId, nodePool nodeConfig.hpcClusterIds)."""
    for name, pool in s.cluster.gpu_pools.items():
        path = f"cluster.gpu_pools.{name}"
        for i, zone in enumerate(pool.zones or []):
            if zone not in s.zones:
                raise Refusal(f"{path}.zones[{i}]: {zone!r} is not a stack zone; expected one of {', '.join(s.zones)}")
        if pool_hw(pool).hpc and (pool.zones is None or len(pool.zones) != 1):
            got = ", ".join(pool.zones) if pool.zones else "every stack zone"
            raise Refusal(
                f"{path}.zones: {pool.instance_type} is an HPC instance type, which lives in a single-zone "
                f"HPC cluster; expected exactly one of {', '.join(s.zones)}, got {got}"
            )
        try:
            refuse_unsold(path, pool.instance_type, s.region, list(pool.zones or s.zones))
        except ValueError as exc:
            raise Refusal(str(exc)) from None


def plan_pools(s: StackSettings, engine: Plan) -> MappingProxyType:
    """Every pool's plan, once the serving engine's layout is known (it sets what a serving
    pod takes); refuses a node shape kubelet would not admit."""
    out = {}
    for name, pool in s.cluster.gpu_pools.items():
        path = f"cluster.gpu_pools.{name}"
        hw = pool_hw(pool)
        serving = name == s.serving.gpu_pool
        # on the serving pool the replica's GPUs spread over its nodes (a TP group, one
        # pipeline stage, or the node's share of the data-parallel engines); a whole node
        # elsewhere (the most a pod can take)
        per_pod = engine.total_gpus // engine.nodes if serving else hw.gpus_per_node
        multi_node = serving and engine.nodes > 1
        if pool.topology_manager_policy == "single-numa-node":
            why = single_numa_refusal(per_pod, hw)
            if why:
                raise Refusal(f"{path}.topology_manager_policy: 'single-numa-node' refused: {why}; expected "
                              "restricted, best-effort or none, or leave it unset to have it chosen")
        if multi_node and hw.rdma and hw.rdma_nics is None:
            raise Refusal(f"{path}.rdma_nics: multi-node serving on {pool.instance_type} uses its RDMA NICs, "
                          "whose count the catalog does not state; expected the count (e.g. 4 or 8)")
        out[name] = PoolPlan(
            name=name,
            hardware=hw,
            zones=tuple(pool.zones or s.zones),
            mig=pool_mig(pool),
            gpus_per_pod=per_pod,
            topology_policy=pool.topology_manager_policy or topology_policy(per_pod, hw),
            multi_node=multi_node,
            rdma=instance_type_rdma(pool.instance_type),
        )
    return MappingProxyType(out)
