"""VKE cluster, a CPU system pool and the GPU node pools, the add-ons GPU serving needs,
and the kubeconfig that `workloads/` deploys with.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list
from stacks.constants import (
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_TAINT,
    MODEL_CACHE_HOST_PATH,
    POOL_LABEL,
    SERVING_UID,
)

MODEL_CACHE_MOUNT = MODEL_CACHE_HOST_PATH
MODEL_CACHE_OWNER = SERVING_UID
MODEL_CACHE_INIT_SCRIPT = base64.b64encode(
    f"#!/bin/bash\nset -e\nmkdir -p {MODEL_CACHE_MOUNT}\n"
    f"chown {MODEL_CACHE_OWNER}:{MODEL_CACHE_OWNER} {MODEL_CACHE_MOUNT}\nchmod 0750 {MODEL_CACHE_MOUNT}\n".encode()
).decode()

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
    data_disk_type: str = "ESSD_PL0"
    labels: dict[str, str] = field(default_factory=dict)


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
    ssh_key_pair: str | None
    project_name: str
    tags: dict[str, str]
    # TLS project the control-plane logs go to (infra/logging.py); VKE's default when None
    log_project_id: pulumi.Input[str] | None = None
    log_ttl_days: int = 30


class Cluster(pulumi.ComponentResource):
    cluster_id: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_pool_ids: dict[str, pulumi.Output[str]]
    oidc_provider_trn: pulumi.Output[str]
    oidc_issuer: pulumi.Output[str]

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
            # VKE applies irsa_enabled only to an existing cluster (docs 6460/1324604):
            # the first `pulumi up` creates the cluster, the second enables IRSA.
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
            opts=child(self, protect=args.delete_protection),
        )

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
            opts=child(self),
        )

        self.node_pool_ids = {"system": system.id}
        for pool_name, pool in args.gpu_pools.items():
            labels = {
                POOL_LABEL: pool_name,
                GPU_MODEL_LABEL: pool.gpu_model,
                GPU_COUNT_LABEL: str(pool.gpus_per_node),
                **pool.labels,
            }
            gpu_pool = volc.vke.NodePool(
                f"{name}-gpu-{pool_name}",
                name=f"{args.cluster_name}-{pool_name}",
                cluster_id=cluster.id,
                node_config={
                    "instance_type_ids": [pool.instance_type],
                    "subnet_ids": pool.subnet_ids,
                    "security": security,
                    "system_volume": {"type": "ESSD_PL0", "size": pool.system_disk_gib},
                    # The model cache: weights synced from TOS survive pod restarts here.
                    "data_volumes": [
                        {"type": pool.data_disk_type, "size": pool.data_disk_gib, "mount_point": MODEL_CACHE_MOUNT}
                    ],
                    "instance_charge_type": "PostPaid",
                    # The serving pods run as uid 1000 and write the cache (base64 script).
                    "initialize_script": MODEL_CACHE_INIT_SCRIPT,
                },
                kubernetes_config={
                    "labels": [{"key": k, "value": v} for k, v in sorted(labels.items())],
                    "taints": [GPU_TAINT],
                    "cordon": False,
                    # Keep a pod's GPUs, CPUs and NIC on one NUMA node; scope "pod" so a
                    # multi-GPU vLLM pod is aligned as a whole, not container by container.
                    "kubelet_config": {
                        "topology_manager_policy": "single-numa-node",
                        "topology_manager_scope": "pod",
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
                opts=child(self),
            )
            self.node_pool_ids[pool_name] = gpu_pool.id

        # Add-ons the GPU pools need: the device plugin advertises nvidia.com/gpu, the
        # cluster autoscaler grows pools for pending GPU pods, metrics-server feeds HPAs.
        # (No pod-identity-webhook: the serving pods project their IRSA token themselves.)
        addons = ["nvidia-device-plugin", "cluster-autoscaler", "metrics-server"]
        for addon in addons:
            volc.vke.Addon(
                f"{name}-addon-{addon}",
                cluster_id=cluster.id,
                name=addon,
                deploy_node_type="Node",
                deploy_mode="Unmanaged",
                opts=child(self, depends_on=[system]),
            )

        access = volc.vke.Kubeconfig(
            f"{name}-kubeconfig",
            cluster_id=cluster.id,
            type="Public" if args.api_server_public else "Private",
            valid_duration=26280,  # hours (3 years); rotate by replacing this resource
            opts=child(self),
        )
        # vke.Kubeconfig does not output the document; the data source does (base64).
        kubeconfigs = volc.vke.get_kubeconfigs_output(ids=[access.id])
        self.kubeconfig = pulumi.Output.secret(
            kubeconfigs.kubeconfigs.apply(lambda ks: base64.b64decode(ks[0].kubeconfig).decode())
        )

        self.cluster_id = cluster.id
        irsa = cluster.irsa_configs.apply(lambda cs: cs[0] if cs else None)
        self.oidc_provider_trn = irsa.apply(lambda c: (c.oidc_trn if c else "") or "")
        self.oidc_issuer = irsa.apply(lambda c: (c.issuer if c else "") or "")
        self.register_outputs(
            {
                "cluster_id": self.cluster_id,
                "kubeconfig": self.kubeconfig,
                "node_pool_ids": self.node_pool_ids,
                "oidc_provider_trn": self.oidc_provider_trn,
            }
        )
