"""VolcEngine GPU instance types: GPU model and count, CPU and memory, NUMA layout, RDMA.

One record per instance type, each with the source it was read from. VolcEngine's own
instance-type pages render client-side and were not readable here, so most figures come
from public projects that run these types (GitHub code index; where the index gave no
repository name the file id is cited) and from VolcEngine's ML-platform flavours of the
same family and size (`ml.<family>.<size>` mirrors `ecs.<family>.<size>`).

`confirmed` means a public source names this family and size with its GPU model and
count. Unconfirmed rows are listed for their family facts (HPC-only, RDMA) but never
resolve on their own: a stack using one states `gpu` and `gpus_per_node` itself.
`numa_nodes` and `rdma_nics` are None where no source states them; the node-pool
settings can state them (`cluster.gpu_pools.<pool>.numa_nodes` / `.rdma_nics`).

Check a type against an account with `vke.get_support_resource_types` (what a cluster
accepts) and `ecs.get_instance_types` (vCPU, memory, GPU and RDMA of each type).
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.suggest import did_you_mean

AIBRIX = "vllm-project/aibrix@e3e10f9e4aebe9aac5e7d992fb87d2648e01628b"


READ = "2026-12-01"  # the date the availability sources below were read


@dataclass(frozen=True)
class Sighting:
    """A public source showing an instance type (or its ML-platform mirror) running in a
    region, in the zones it names (empty: the source names no zone)."""

    region: str
    zones: tuple[str, ...]
    source: str
    read: str = READ


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str  # capacity.catalog.GPUS key
    gpus: int
    vcpus: int | None
    memory_gib: int | None
    numa_nodes: int | None  # None: no source states the NUMA layout
    rdma: bool  # RDMA NICs for GPU traffic between nodes
    rdma_nics: int | None  # RDMA NICs per node; None: RDMA present, count not stated
    hpc_only: bool  # lives in a zonal ecs.HpcCluster (node_config.hpc_cluster_ids)
    source: str
    confirmed: bool
    notes: str = ""
    # Where a public source shows the type: VolcEngine's per-region sale tables render
    # client-side and were not readable, so this lists sightings, not the sale list. A
    # region not listed is unknown (stacks.regions.refuse_unsold warns), not refused.
    seen_in: tuple[Sighting, ...] = ()

    @property
    def gpus_per_numa_node(self) -> int | None:
        if self.numa_nodes is None:
            return None
        return max(1, self.gpus // self.numa_nodes)


# ML-platform queue "robot-task" in cn-shanghai, zone cn-shanghai-a: 1 x ml.pni2.14xlarge and
# 3 x ml.hpcpni2.28xlarge, Tesla-A100-80G (GitHub code index, file id 55127256013).
_SH_QUEUE = Sighting("cn-shanghai", ("cn-shanghai-a",),
                     "ML-platform queue robot-task in cn-shanghai, zone cn-shanghai-a: ml.pni2.14xlarge and "
                     "ml.hpcpni2.28xlarge, A100-80G (GitHub code index, file id 55127256013)")

_ROWS = [
    # ----------------------------------------------------------------- A10 (gni2)
    InstanceType(
        "ecs.gni2.3xlarge", "A10", 1, 14, 56, None, False, 0, False,
        "\"Ecs.gni2.3xlarge: 14 vCPUs, 56 GB, GPU: A10 x 1\": server specification in a public "
        "project README (GitHub code index, file id 24125668149)",
        True,
    ),
    # ----------------------------------------------------------------- L20 (gni3cl)
    InstanceType(
        "ecs.gni3cl.45xlarge", "L20", 8, 180, None, None, False, 0, False,
        "ML-platform flavour ml.gni3cl.45xlarge run with GpuType NVIDIA-L20 (GitHub code index, "
        "file ids 54514793768, 54727167125)",
        False,
        "GPU count inferred from the 45xlarge size (180 vCPU, like hpcpni3ln.45xlarge); not stated",
    ),
    # ----------------------------------------------------------------- A100 80 GB (pni2, hpcpni2)
    *[
        InstanceType(
            f"ecs.pni2.{size}", "A100-80G", gpus, vcpus, mem, None, False, 0, False,
            f"ML-platform flavour table \"ml.pni2.{size} | {vcpus} / {mem}G\", all A100-80G, measured "
            "(GitHub code index, file id 59207179090)",
            True,
            "ECS name mirrors the ML-platform flavour; the A800 variants are the `l` families "
            "(pni2l, hpcpni2l)",
            seen_in=(_SH_QUEUE,) if size == "14xlarge" else (),
        )
        for size, gpus, vcpus, mem in (("3xlarge", 1, 14, 245), ("7xlarge", 2, 28, 490),
                                       ("14xlarge", 4, 56, 980), ("28xlarge", 8, 112, 1960))
    ],
    InstanceType(
        "ecs.hpcpni2.28xlarge", "A100-80G", 8, 112, 1960, None, True, 4, True,
        "ML-platform flavour ml.hpcpni2.28xlarge: \"A100x8 + RDMA\", \"112 / 1960G + 4x200Gbps RoCE\" "
        "(GitHub code index, file ids 55330912066, 59207179090); family ecs.hpcpni2 = HPC GPU type "
        "with RDMA (file id 35173161245)",
        True,
        "a queue listing of the same flavour reports 1715 GiB (file id 55127256013): allocatable, "
        "not installed, memory",
        seen_in=(_SH_QUEUE,),
    ),
    # ----------------------------------------------------------------- A800 (ebmhpcpni2l)
    InstanceType(
        "ecs.ebmhpcpni2l.32xlarge", "A800", 8, 128, 2048, None, True, None, True,
        "\"A800x8 GPU bare metal (ecs.ebmhpcpni2l.32xlarge), 128 CPU / 2TB RAM / 8x NVIDIA "
        "A800-SXM4-80GB\" on a VKE cluster (GitHub code index, file id 52587277029); ML-platform "
        "flavour ml.hpcpni2l.28xlarge: \"8x A800 80GB, 1960 GiB, RDMA\" (file id 59683788669)",
        True,
        "RDMA NIC count not stated",
        seen_in=(Sighting("cn-shanghai", ("cn-shanghai-b",),
                          "VKE GPU node ecs.ebmhpcpni2l.32xlarge, 8x A800-SXM4-80GB, in zone cn-shanghai-b, "
                          "HPC cluster subnet, opened 2026-03-09 (GitHub code index, file ids 52587277029, "
                          "53066048398)"),),
    ),
    # ----------------------------------------------------------------- H20 96 GB (hpcpni3ln, ebmhpcpni3l)
    InstanceType(
        "ecs.hpcpni3ln.45xlarge", "H20", 8, 180, 1960, None, True, 4, True,
        "\"ecs.hpcpni3ln.45xlarge (H20 x 8)\" as a VKE node selector (GitHub code index, file id "
        "63189191927); ML-platform flavour ml.hpcpni3ln.45xlarge: \"8 x H20-SXM5-96GB / 180 vCPU / "
        "1960 GiB\", RDMA 4x (file id 55127256013); RDMA devices mlx5_1..mlx5_4 on this type "
        "(file id 53525685346)",
        True,
        seen_in=(Sighting("cn-beijing", ("cn-beijing-e",),
                          "ML-platform queue Robot-North-H20 in cn-beijing, zone cn-beijing-e: 7 x "
                          "ml.hpcpni3ln.45xlarge (GitHub code index, file id 55127256013)"),),
    ),
    InstanceType(
        "ecs.ebmhpcpni3l.48xlarge", "H20", 8, 192, 2048, None, True, 8, True,
        f"\"ecs.ebmhpcpni3l.48xlarge: 192vCPU, 2048GiB, NVIDIA H20-SXM5-96GB*8, 400 Gbps * 8 RDMA\" "
        f"({AIBRIX}, samples/deepseek-r1/README.md)",
        True,
    ),
]

# No public source found names a VolcEngine H800, H100 or H200 instance type (searched
# 2026-12-01: the GitHub code index and stored documentation pages for ecs.* families with
# those GPUs); none is listed, and docs/limits.md says so. ecs.gni2, ecs.gni3cl and
# ecs.ebmhpcpni3l have no region in any source found: their seen_in is empty.
INSTANCE_CATALOG: dict[str, InstanceType] = {r.name: r for r in _ROWS}

# (GPU key, GPUs per node) of every confirmed type: what the planner and `dsvolc size` use.
INSTANCE_TYPES: dict[str, tuple[str, int]] = {
    r.name: (r.gpu, r.gpus) for r in _ROWS if r.confirmed
}


def get_instance_type(instance_type: str) -> InstanceType | None:
    """The catalog record of an instance type (confirmed or not), else None."""
    if not instance_type:
        return None
    return INSTANCE_CATALOG.get(instance_type.strip().lower())


def resolve_instance_type(instance_type: str) -> tuple[str, int] | None:
    """(GPU key, GPUs per node) for a confirmed VolcEngine instance type, else None."""
    if not instance_type:
        return None
    return INSTANCE_TYPES.get(instance_type.strip().lower())


def suggest_instance_type(instance_type: str, *, confirmed_only: bool = False, aside: bool = False) -> str:
    """'; did you mean ecs.gni2.3xlarge?' for a near-miss of a catalogued type, else '' (see
    capacity.suggest). Every name shares `ecs.` and `.<n>xlarge`, so only a near-identical one
    counts as meant."""
    known = INSTANCE_TYPES if confirmed_only else INSTANCE_CATALOG
    return did_you_mean(instance_type, known, cutoff=0.85, aside=aside)


def is_hpc_family(instance_type: str) -> bool:
    """`ecs.hpc*` and `ecs.ebmhpc*` types live in a zonal HPC cluster (the family name says
    so: VolcEngine's high-performance-computing GPU families, file id 35173161245)."""
    family = instance_type.strip().lower().split(".")[1] if instance_type.count(".") >= 2 else ""
    return family.startswith(("hpc", "ebmhpc"))
