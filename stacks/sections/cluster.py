"""`cluster`: the VKE cluster, its system pool and GPU node pools."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from capacity.catalog import GPUS
from capacity.instances import get_instance_type, resolve_instance_type, suggest_instance_type
from capacity.mig import MigError, mig_profile
from capacity.suggest import did_you_mean
from stacks.addons import ADDONS
from stacks.names import ClusterName, PoolName
from stacks.nodepools import pool_gpu, pool_hardware
from stacks.regions import SUPPORTED_KUBERNETES_VERSIONS
from stacks.sections.common import (
    _C,
    KUBECONFIG,
    DiskType,
    InstanceTypeName,
    Model,
    Name,
    PodNetworkMode,
    TopologyPolicy,
)

# What a deploy's kubeconfig has left at the least (valid_hours - rotate_hours): longer
# than the longest `pulumi up` (prod: a node scale-up, a ~335 GB weight sync per node and
# a canary of several analysis steps take a few hours), so it never expires mid-update.
KUBECONFIG_MARGIN_HOURS = 12


class SystemPoolSettings(Model):
    instance_type: InstanceTypeName = Field("ecs.g3i.xlarge", description="ECS instance type of the CPU system pool")
    min_nodes: int = Field(2, ge=1, le=100, description="minimum system nodes")
    max_nodes: int = Field(3, ge=1, le=100, description="maximum system nodes")
    system_disk_gib: int = Field(80, ge=40, le=2048, description="system disk size in GiB")

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        return self


class MigSettings(Model):
    profile: str = Field(
        pattern=r"^[1-7]g\.[0-9]+gb$",
        description="MIG profile every GPU of the pool is cut into (e.g. 1g.10gb); the pool's GPU must offer it "
        "(A100-40G/80G, H100, H800, H20, H200: see capacity/mig.py). Each serving replica takes one slice.",
    )


class AutoRepairSettings(Model):
    enabled: bool = Field(
        False,
        description="VKE node check and self-healing on the pool (node pool management.remedy_config): GPU and "
        "node faults get the node cordoned, drained and repaired by VKE",
    )
    remedy_policy_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="VKE remedy policy to apply; the cluster's default policy when unset",
    )


class GpuPoolSettings(Model):
    instance_type: InstanceTypeName = Field(description="ECS GPU instance type, e.g. ecs.gni2.3xlarge")
    gpu: str | None = Field(
        None, description="GPU model (catalog key such as A10, H20); required when the instance type is not in the catalog"
    )
    gpus_per_node: int | None = Field(
        None, ge=1, le=16, description="GPUs per node; required when the instance type is not in the catalog"
    )
    zones: list[str] | None = Field(
        None, description="zones the pool spans; all stack zones when unset; exactly one for HPC instance types"
    )
    numa_nodes: int | None = Field(
        None, ge=1, le=8, description="NUMA nodes of the instance type (lscpu); the catalog's when unset"
    )
    rdma_nics: int | None = Field(
        None, ge=0, le=16, description="RDMA NICs per node for GPU traffic between nodes; the catalog's when unset"
    )
    hpc_cluster_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="existing ECS HPC cluster for an HPC instance type; the stack creates one in the pool's zone when unset",
    )
    topology_manager_policy: TopologyPolicy | None = Field(
        None, description="kubelet topology manager policy; chosen from GPUs per pod and the NUMA layout when unset"
    )
    min_nodes: int = Field(0, ge=0, le=500, description="minimum nodes (autoscaling lower bound)")
    max_nodes: int = Field(ge=1, le=500, description="maximum nodes (autoscaling upper bound)")
    desired_nodes: int | None = Field(None, ge=0, le=500, description="initial node count; min_nodes when unset")
    data_disk_gib: int = Field(
        500, ge=100, le=32768, description="data disk for the node's model cache (mounted at /mnt/model-cache)"
    )
    data_disk_type: DiskType = Field(
        "ESSD_PL0", description="model-cache disk type (as VKE node pools accept it): its throughput bounds how fast "
        "a large model loads"
    )
    system_disk_gib: int = Field(200, ge=40, le=2048, description="system disk (container images are large)")
    labels: dict[str, str] = Field(default_factory=dict, description="extra node labels")
    mig: MigSettings | None = Field(
        None, description="cut every GPU into MIG slices of one profile (small models); whole GPUs when unset"
    )
    auto_repair: AutoRepairSettings = Field(
        default_factory=AutoRepairSettings, description="VKE auto-repair of faulty GPU nodes"
    )

    @model_validator(mode="after")
    def _bounds(self):
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must be <= max_nodes ({self.max_nodes})")
        if self.desired_nodes is not None and not self.min_nodes <= self.desired_nodes <= self.max_nodes:
            raise ValueError(
                f"desired_nodes ({self.desired_nodes}) must lie between min_nodes ({self.min_nodes}) "
                f"and max_nodes ({self.max_nodes})"
            )
        if self.zones is not None and not self.zones:
            raise ValueError("zones: expected at least one zone, or leave unset for all stack zones")
        if (self.gpu is None) != (self.gpus_per_node is None):
            raise ValueError("gpu and gpus_per_node go together: set both, or neither to use the catalog")
        return self

    @model_validator(mode="after")
    def _hardware(self):
        """The pool's node shape must be known (catalog or settings), and what it offers
        must match what the pool asks of it (HPC cluster, MIG profile)."""
        if self.gpu is None:
            if resolve_instance_type(self.instance_type) is None:
                rec = get_instance_type(self.instance_type)
                why = ("is catalogued but its GPU count is unconfirmed" if rec is not None else
                       f"is not in the GPU instance catalog{suggest_instance_type(self.instance_type, aside=True)}")
                raise ValueError(f"instance_type: {self.instance_type!r} {why}; set gpu and gpus_per_node for it")
        elif self.gpu not in GPUS:
            raise ValueError(f"gpu: {self.gpu!r} is not a known GPU; expected one of {', '.join(GPUS)}"
                             f"{did_you_mean(self.gpu, GPUS)}")
        gpu, per_node = pool_gpu(self.instance_type, self.gpu, self.gpus_per_node)
        hw = pool_hardware(self.instance_type, gpu, per_node, numa_nodes=self.numa_nodes, rdma_nics=self.rdma_nics)
        if not hw.hpc and self.hpc_cluster_id is not None:
            raise ValueError(f"hpc_cluster_id: {self.instance_type} is not an HPC instance type "
                             "(ecs.hpc* / ecs.ebmhpc*); remove hpc_cluster_id")
        if self.mig is not None:
            try:
                mig_profile(gpu, self.mig.profile)
            except MigError as exc:
                raise ValueError(f"mig.profile: {exc}") from None
        return self


class DeployKubeconfigSettings(Model):
    """The kubeconfig `pulumi up` deploys the Kubernetes layer with (VKE's CreateKubeconfig
    for the deploying identity). Short-lived and rotated by `pulumi up` itself: each update
    in a new rotation window replaces it (create before delete) with a fresh one."""

    valid_hours: int = Field(
        48, ge=1, le=_C.argument(KUBECONFIG, "validDuration").range[1],
        description="hours the kubeconfig is valid for (VKE accepts 1-43800; the policy pack's "
        "kubeconfig-short-lived caps it, 168 by default); at least rotate_hours + 12",
    )
    rotate_hours: int = Field(
        24, ge=1, le=8760,
        description="a `pulumi up` in a new window of this many hours (UTC, counted from the Unix epoch) "
        "replaces the kubeconfig, so a deploy never holds one with less than valid_hours - rotate_hours left",
    )

    @model_validator(mode="after")
    def _margin(self):
        left = self.valid_hours - self.rotate_hours
        if left < KUBECONFIG_MARGIN_HOURS:
            raise ValueError(
                f"valid_hours: {self.valid_hours} h leaves a deploy as little as {left} h of a kubeconfig rotated "
                f"every {self.rotate_hours} h; expected at least rotate_hours + {KUBECONFIG_MARGIN_HOURS} "
                f"({self.rotate_hours + KUBECONFIG_MARGIN_HOURS}), so none expires during an update")
        return self


class ClusterSettings(Model):
    name: ClusterName | None = Field(None, description="cluster name; deepseek-<env> when unset")
    kubernetes_version: str = Field("1.32", description="VKE Kubernetes minor version")
    api_server_public: bool = Field(False, description="expose the API server on a public EIP")
    pod_network_mode: PodNetworkMode = Field(
        "VpcCniShared", description="VKE pod network mode"
    )
    delete_protection: bool = Field(False, description="refuse to delete the cluster")
    control_plane_logging: bool = Field(True, description="ship API server, audit and scheduler logs to TLS")
    irsa: bool = Field(
        True,
        description="weights reader through IAM roles for service accounts; false: the IAM-user fallback (a static "
        "key in a Secret). Either way the reader identity comes in deploy phase 2, once the cluster exists "
        "(VKE enables IRSA on existing clusters only; see docs/deploy.md)",
    )
    ssh_key_pair: str | None = Field(None, description="ECS key pair for node login; none (no SSH) when unset")
    deploy_kubeconfig: DeployKubeconfigSettings = Field(
        default_factory=DeployKubeconfigSettings,
        description="the short-lived kubeconfig `pulumi up` deploys with (operators get their own: docs/deploy.md)",
    )
    addon_versions: dict[str, str] = Field(
        default_factory=dict,
        description="VKE add-on versions to pin where stacks/addons.py has none (add-on name -> version)",
    )
    system_pool: SystemPoolSettings = Field(default_factory=SystemPoolSettings, description="CPU pool for system pods")
    gpu_pools: dict[PoolName, GpuPoolSettings] = Field(description="GPU node pools keyed by pool name")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v not in SUPPORTED_KUBERNETES_VERSIONS:
            raise ValueError(f"expected one of {', '.join(SUPPORTED_KUBERNETES_VERSIONS)}, got {v!r}")
        return v

    @field_validator("addon_versions")
    @classmethod
    def _addons(cls, v: dict[str, str]) -> dict[str, str]:
        for name, version in v.items():
            if name not in ADDONS:
                raise ValueError(f"{name!r} is not an add-on the stack installs; expected one of {', '.join(ADDONS)}")
            if not version.strip():
                raise ValueError(f"{name}: expected a version such as v1.1.4")
        return v

    @field_validator("gpu_pools")
    @classmethod
    def _some_pool(cls, v: dict) -> dict:
        if not v:
            raise ValueError("expected at least one GPU pool")
        return v
