"""VKE cluster, a CPU system pool and the GPU node pools (HPC instance types inside an ECS
HPC cluster of their zone), the add-ons GPU serving needs, and the short-lived kubeconfig
that `workloads/` deploys with, rotated by `pulumi up` itself.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list
from stacks.constants import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    DEVICE_PLUGIN_MIG_CONFIG,
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_TAINT,
    MIG_CONFIG_LABEL,
    MIG_PROFILE_LABEL,
    MODEL_CACHE_HOST_PATH,
    POOL_LABEL,
    SERVING_UID,
)
from stacks.nodepools import TOPOLOGY_SCOPE

MODEL_CACHE_MOUNT = MODEL_CACHE_HOST_PATH
MODEL_CACHE_OWNER = SERVING_UID
MODEL_CACHE_SCRIPT = (
    f"#!/bin/bash\nset -e\nmkdir -p {MODEL_CACHE_MOUNT}\n"
    f"chown {MODEL_CACHE_OWNER}:{MODEL_CACHE_OWNER} {MODEL_CACHE_MOUNT}\nchmod 0750 {MODEL_CACHE_MOUNT}\n"
)
MODEL_CACHE_INIT_SCRIPT = base64.b64encode(MODEL_CACHE_SCRIPT.encode()).decode()


def mig_script(profile: str, per_gpu: int) -> str:
    """Cut every GPU of the node into `per_gpu` instances of `profile` with the driver's own
    nvidia-smi (MIG user guide, "Getting Started with MIG": enable MIG mode, create GPU
    instances with their default compute instance, -C). Old instances are removed first so
    a re-run converges on the same layout."""
    instances = ",".join([profile] * per_gpu)
    return (
        "# MIG: every GPU becomes " f"{per_gpu} x {profile}\n"
        "nvidia-smi -mig 1\n"
        "nvidia-smi mig -dci || true\nnvidia-smi mig -dgi || true\n"
        "for i in $(nvidia-smi --query-gpu=index --format=csv,noheader); do\n"
        f"  nvidia-smi mig -i \"$i\" -cgi {instances} -C\n"
        "done\n"
    )


def init_script(mig_profile: str | None, mig_per_gpu: int) -> str:
    """The GPU pool's node initialisation script, base64 as VKE takes it."""
    text = MODEL_CACHE_SCRIPT + (mig_script(mig_profile, mig_per_gpu) if mig_profile else "")
    return base64.b64encode(text.encode()).decode()

# What `pulumi up` reads the time from for the kubeconfig's rotation (tests pin it).
CLOCK = time.time


def rotation_window(now: float, hours: int) -> str:
    """The start (UTC) of the rotation window `now` falls in: windows of `hours` counted
    from the Unix epoch, so every update inside one window sees the same value."""
    period = hours * 3600
    start = int(now // period) * period
    return datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


# Control-plane logs worth paying for: who changed what (Audit) and why pods did not
# schedule (KubeScheduler); the API server log helps with webhook and admission failures.
LOG_TYPES = ("Audit", "KubeApiServer", "KubeScheduler", "KubeControllerManager")


@dataclass(frozen=True)
class GpuPoolArgs:
    instance_type: str
    gpu_model: str
    gpus_per_node: int
    subnet_ids: list[pulumi.Input[str]]
    min_nodes: int
    max_nodes: int
    desired_nodes: int
    data_disk_gib: int
    system_disk_gib: int
    topology_policy: str
    data_disk_type: str = "ESSD_PL0"
    labels: dict[str, str] = field(default_factory=dict)
    # HPC instance types: the pool's one zone, and an existing HPC cluster (None: create one)
    hpc_zone: str | None = None
    hpc_cluster_id: str | None = None

    mig_profile: str | None = None  # every GPU cut into slices of this profile
    mig_per_gpu: int = 0  # slices of the profile per GPU
    auto_repair: bool = False  # VKE node check and self-healing (remedy config)
    remedy_policy_id: str | None = None  # VKE remedy policy; the cluster's default when None


@dataclass(frozen=True)
class AddonArgs:
    name: str
    deploy_mode: str  # Managed | Unmanaged
    deploy_node_type: str | None
    version: str | None


@dataclass(frozen=True)
class ClusterArgs:
    cluster_name: str
    kubernetes_version: str
    api_server_public: bool
    pod_network_mode: str
    delete_protection: bool
    control_plane_logging: bool
    irsa: bool
    vpc_id: pulumi.Input[str]
    node_subnet_ids: pulumi.Input[list[str]]
    pod_subnet_ids: pulumi.Input[list[str]]
    service_cidr: str
    flannel_pod_cidr: str
    security_group_id: pulumi.Input[str]
    system_instance_type: str
    system_min_nodes: int
    system_max_nodes: int
    system_disk_gib: int
    system_subnet_ids: pulumi.Input[list[str]]
    gpu_pools: dict[str, GpuPoolArgs]
    addons: list[AddonArgs]
    ssh_key_pair: str | None
    project_name: str
    tags: dict[str, str]
    # TLS project the control-plane logs go to (infra/logging.py); VKE's default when None
    log_project_id: pulumi.Input[str] | None = None
    log_ttl_days: int = 30
    kubeconfig_valid_hours: int = 48  # validity of the deploy kubeconfig
    kubeconfig_rotate_hours: int = 24  # a `pulumi up` in a new window of this many hours replaces it


class Cluster(pulumi.ComponentResource):
    cluster_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_pool_ids: dict[str, pulumi.Output[str]]
    oidc_provider_trn: pulumi.Output[str | None]
    oidc_issuer: pulumi.Output[str | None]
    hpc_cluster_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:cluster:Cluster", name, None, opts)

        if args.pod_network_mode == "VpcCniShared":
            pods_config = {
                "pod_network_mode": "VpcCniShared",
                "vpc_cni_config": {"subnet_ids": args.pod_subnet_ids},
            }
        else:
            pods_config = {
                "pod_network_mode": "Flannel",
                "flannel_config": {"pod_cidrs": [args.flannel_pod_cidr], "max_pods_per_node": 64},
            }

        cluster = volc.vke.Cluster(
            f"{name}-vke",
            name=args.cluster_name,
            description="DeepSeek serving",
            kubernetes_version=args.kubernetes_version,
            delete_protection_enabled=args.delete_protection,
            # VKE applies irsa_enabled only to an existing cluster (docs 6460/1324613): true
            # from deploy phase 2 on (infra/identity.py), when the cluster exists.
            irsa_enabled=args.irsa,
            project_name=args.project_name,
            cluster_config={
                "subnet_ids": args.node_subnet_ids,
                "api_server_public_access_enabled": args.api_server_public,
                "resource_public_access_default_enabled": False,
                **(
                    {
                        "api_server_public_access_config": {
                            "public_access_network_config": {"billing_type": "PostPaidByTraffic", "bandwidth": 10}
                        }
                    }
                    if args.api_server_public
                    else {}
                ),
            },
            pods_config=pods_config,
            services_config={"service_cidrsv4s": [args.service_cidr]},
            logging_config={
                **({"log_project_id": args.log_project_id} if args.log_project_id is not None else {}),
                "log_setups": [
                    {"log_type": t, "enabled": args.control_plane_logging, "log_ttl": args.log_ttl_days}
                    for t in LOG_TYPES
                ],
            },
            tags=tag_list(args.tags),
            # kubernetes_version is ForceNew in the pinned provider (stacks/provider_changes.yaml):
            # a bump would replace the cluster. VKE upgrades a cluster in place instead
            # (docs/deploy.md, "Upgrading Kubernetes"); the program leaves the version the
            # cloud reports alone rather than fight that upgrade.
            opts=child(self, protect=args.delete_protection, ignore_changes=["kubernetesVersion"]),
        )

        # Add-ons. cluster-autoscaler is a managed add-on that node-pool autoscaling needs
        # in place first, so every pool depends on it; the Unmanaged ones run on nodes and
        # wait for the system pool (created below). Versions are pinned where VKE's
        # changelog names one (stacks/addons.py).
        managed = [a for a in args.addons if a.deploy_mode == "Managed"]
        on_nodes = [a for a in args.addons if a.deploy_mode != "Managed"]
        managed_addons = [self._addon(name, cluster, a, []) for a in managed]

        security = {
            "security_group_ids": [args.security_group_id],
            "security_strategies": ["Hids"],
            **({"login": {"ssh_key_pair_name": args.ssh_key_pair}} if args.ssh_key_pair else {}),
        }

        system = volc.vke.NodePool(
            f"{name}-system",
            name=f"{args.cluster_name}-system",
            cluster_id=cluster.id,
            node_config={
                "instance_type_ids": [args.system_instance_type],
                "subnet_ids": args.system_subnet_ids,
                "security": security,
                "system_volume": {"type": "ESSD_PL0", "size": args.system_disk_gib},
                "instance_charge_type": "PostPaid",
            },
            kubernetes_config={
                "labels": [{"key": POOL_LABEL, "value": "system"}],
                "cordon": False,
            },
            auto_scaling={
                "enabled": True,
                "min_replicas": args.system_min_nodes,
                "max_replicas": args.system_max_nodes,
                "desired_replicas": args.system_min_nodes,
                "subnet_policy": "ZoneBalance",
            },
            tags=tag_list(args.tags),
            opts=child(self, depends_on=managed_addons),
        )

        self.node_pool_ids = {"system": system.id}
        self.hpc_cluster_ids = {}
        for pool_name, pool in args.gpu_pools.items():
            labels = {
                POOL_LABEL: pool_name,
                GPU_MODEL_LABEL: pool.gpu_model,
                GPU_COUNT_LABEL: str(pool.gpus_per_node),
                **pool.labels,
            }
            hpc = {}
            if pool.hpc_zone is not None:
                # An HPC instance type joins an HPC cluster of its zone: one the stack names,
                # else one it creates for the pool (one ID per pool, provider contract).
                hpc_id = pool.hpc_cluster_id
                if hpc_id is None:
                    hpc_id = volc.ecs.HpcCluster(
                        f"{name}-hpc-{pool_name}",
                        zone_id=pool.hpc_zone,
                        name=f"{args.cluster_name}-{pool_name}",
                        description=f"RDMA-fabric-of-GPU-pool-{pool_name}",
                        project_name=args.project_name,
                        tags=tag_list(args.tags),
                        opts=child(self),
                    ).id
                self.hpc_cluster_ids[pool_name] = pulumi.Output.from_input(hpc_id)
                hpc = {"hpc_cluster_ids": [hpc_id]}
            if pool.mig_profile:
                labels.update({
                    MIG_PROFILE_LABEL: pool.mig_profile,
                    # mig-manager's layout name, should the GPU operator run here too
                    MIG_CONFIG_LABEL: f"all-{pool.mig_profile}",
                    # the device plugin's per-node config: strategy mixed
                    DEVICE_PLUGIN_CONFIG_LABEL: DEVICE_PLUGIN_MIG_CONFIG,
                })
            management = {}
            if pool.auto_repair:
                # VKE's node check and self-healing (docs 6460/1148783): GPU faults (card
                # fallen off the bus, uncorrectable memory errors, NVLink, driver) and node
                # faults are detected, then the pool's remedy policy cordons, drains and
                # repairs the node.
                remedy = {"enabled": True, **({"id": pool.remedy_policy_id} if pool.remedy_policy_id else {})}
                management = {"management": {"enabled": True, "remedy_config": remedy}}
            gpu_pool = volc.vke.NodePool(
                f"{name}-gpu-{pool_name}",
                name=f"{args.cluster_name}-{pool_name}",
                cluster_id=cluster.id,
                node_config={
                    "instance_type_ids": [pool.instance_type],
                    "subnet_ids": pool.subnet_ids,
                    **hpc,
                    "security": security,
                    "system_volume": {"type": "ESSD_PL0", "size": pool.system_disk_gib},
                    # The model cache: weights synced from TOS survive pod restarts here.
                    "data_volumes": [
                        {"type": pool.data_disk_type, "size": pool.data_disk_gib, "mount_point": MODEL_CACHE_MOUNT}
                    ],
                    "instance_charge_type": "PostPaid",
                    # The serving pods run as uid 1000 and write the cache; MIG pools cut
                    # their GPUs here (base64 script).
                    "initialize_script": init_script(pool.mig_profile, pool.mig_per_gpu),
                },
                kubernetes_config={
                    "labels": [{"key": k, "value": v} for k, v in sorted(labels.items())],
                    "taints": [GPU_TAINT],
                    "cordon": False,
                    # Align a pod's GPUs (and NICs) on as few NUMA nodes as its GPU count
                    # allows: the policy is chosen from GPUs per pod against the node's NUMA
                    # layout (stacks.nodepools.topology_policy). Scope "container", the only
                    # one VKE accepts: the vLLM container holds all of the pod's GPUs.
                    "kubelet_config": {
                        "topology_manager_policy": pool.topology_policy,
                        "topology_manager_scope": TOPOLOGY_SCOPE,
                    },
                },
                auto_scaling={
                    "enabled": True,
                    "min_replicas": pool.min_nodes,
                    "max_replicas": pool.max_nodes,
                    "desired_replicas": pool.desired_nodes,
                    "subnet_policy": "ZoneBalance",
                },
                tags=tag_list(args.tags),
                opts=child(self, depends_on=managed_addons),
                **management,
            )
            self.node_pool_ids[pool_name] = gpu_pool.id

        # (No pod-identity-webhook: the serving pods project their IRSA token themselves.)
        for a in on_nodes:
            self._addon(name, cluster, a, [system])

        # The deploy kubeconfig: VKE issues it to the identity running `pulumi up`, valid for
        # kubeconfig_valid_hours. Every argument of vke.Kubeconfig forces a new one, so the
        # rotation is a replacement: the window start is the replacement trigger, and the first
        # update of each window creates a fresh kubeconfig before the old one is deleted
        # (Pulumi's default order), so a deploy never holds one with less than
        # valid_hours - rotate_hours left. Operators use their own (docs/deploy.md).
        access = volc.vke.Kubeconfig(
            f"{name}-kubeconfig",
            cluster_id=cluster.id,
            type="Public" if args.api_server_public else "Private",
            valid_duration=args.kubeconfig_valid_hours,
            opts=child(self, replacement_trigger=rotation_window(CLOCK(), args.kubeconfig_rotate_hours)),
        )
        # vke.Kubeconfig does not output the document; the data source does (base64).
        kubeconfigs = volc.vke.get_kubeconfigs_output(ids=[access.id])
        self.kubeconfig = pulumi.Output.secret(
            kubeconfigs.kubeconfigs.apply(lambda ks: base64.b64decode(ks[0].kubeconfig).decode())
        )

        self.cluster_id = cluster.id
        # VKE fills the IRSA config once IRSA is on (an update of an existing cluster): None
        # until then, never an empty string that would end up as a principal.
        irsa = cluster.irsa_configs.apply(lambda cs: cs[0] if cs else None)
        self.oidc_provider_trn = irsa.apply(lambda c: (c.oidc_trn or None) if c else None)
        self.oidc_issuer = irsa.apply(lambda c: (c.issuer or None) if c else None)
        self.register_outputs(
            {
                "cluster_id": self.cluster_id,
                "node_pool_ids": self.node_pool_ids,
                "oidc_provider_trn": self.oidc_provider_trn,
            }
        )

    def _addon(self, name: str, cluster: volc.vke.Cluster, a: AddonArgs, depends_on: list) -> volc.vke.Addon:
        return volc.vke.Addon(
            f"{name}-addon-{a.name}",
            cluster_id=cluster.id,
            name=a.name,
            deploy_mode=a.deploy_mode,
            **({"deploy_node_type": a.deploy_node_type} if a.deploy_node_type else {}),
            **({"version": a.version} if a.version else {}),
            opts=child(self, depends_on=depends_on),
        )
