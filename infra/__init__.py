"""The VolcEngine layer: one ComponentResource per unit, built from `StackSettings`.

May import: `stacks`, `capacity`, pulumi and pulumi_volcengine. Never `workloads`:
the serving layer receives infra only through the component outputs gathered in `Infra`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.cluster import Cluster, ClusterArgs, GpuPoolArgs
from infra.gateway import EdgeArgs, EdgeGateway, EdgeUpstream
from infra.network import Network, NetworkArgs
from infra.observability import Observability, ObservabilityArgs
from infra.registry import Registry, RegistryArgs
from infra.weights import WeightStore, WeightStoreArgs
from stacks.settings import StackSettings


@dataclass
class Infra:
    """What `workloads/` may use of the VolcEngine layer: component outputs only."""

    provider: volc.Provider
    network: Network
    cluster: Cluster
    weights: WeightStore
    registry: Registry
    observability: Observability | None


def build_infra(s: StackSettings) -> Infra:
    name = s.resource_prefix
    tags = s.resource_tags()
    # An explicit provider: the region comes from the validated settings, credentials from
    # VOLCENGINE_ACCESS_KEY / VOLCENGINE_SECRET_KEY in the environment.
    provider = volc.Provider(f"{name}-volcengine", region=s.region)
    opts = pulumi.ResourceOptions(providers=[provider])

    node_subnets = s.node_subnets()
    vpc_cni = s.cluster.pod_network_mode == "VpcCniShared"
    network = Network(
        name,
        NetworkArgs(
            vpc_cidr=str(s.network.vpc_cidr),
            node_subnets={z: str(c) for z, c in node_subnets.items()},
            pod_subnets={z: str(c) for z, c in s.pod_subnets().items()} if vpc_cni else {},
            nat_spec=s.network.nat_spec,
            egress_bandwidth_mbps=s.network.egress_bandwidth_mbps,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    gpu_pools = {}
    for pool_name, pool in s.cluster.gpu_pools.items():
        gpu_model, gpus_per_node = pool.hardware()
        gpu_pools[pool_name] = GpuPoolArgs(
            instance_type=pool.instance_type,
            gpu_model=gpu_model,
            gpus_per_node=gpus_per_node,
            subnet_ids=[network.subnet_ids_by_zone[z] for z in s.pool_zones(pool_name)],
            min_nodes=pool.min_nodes,
            max_nodes=pool.max_nodes,
            desired_nodes=pool.desired_nodes if pool.desired_nodes is not None else pool.min_nodes,
            data_disk_gib=pool.data_disk_gib,
            system_disk_gib=pool.system_disk_gib,
            data_disk_type=pool.data_disk_type,
            labels=pool.labels,
        )
    c = s.cluster
    cluster = Cluster(
        name,
        ClusterArgs(
            cluster_name=s.cluster_name,
            kubernetes_version=c.kubernetes_version,
            api_server_public=c.api_server_public,
            pod_network_mode=c.pod_network_mode,
            delete_protection=c.delete_protection,
            control_plane_logging=c.control_plane_logging,
            irsa=c.irsa,
            vpc_id=network.vpc_id,
            node_subnet_ids=network.node_subnet_ids,
            pod_subnet_ids=network.pod_subnet_ids,
            service_cidr=str(s.network.service_cidr),
            flannel_pod_cidr=str(s.network.flannel_pod_cidr),
            security_group_id=network.node_security_group_id,
            system_instance_type=c.system_pool.instance_type,
            system_min_nodes=c.system_pool.min_nodes,
            system_max_nodes=c.system_pool.max_nodes,
            system_disk_gib=c.system_pool.system_disk_gib,
            system_subnet_ids=network.node_subnet_ids,
            gpu_pools=gpu_pools,
            ssh_key_pair=c.ssh_key_pair,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    weights = WeightStore(
        name,
        WeightStoreArgs(
            bucket_name=s.bucket_name,
            prefix=s.weights.prefix,
            noncurrent_version_days=s.weights.noncurrent_version_days,
            sse_algorithm=s.weights.sse_algorithm,
            kms_key_id=s.weights.kms_key_id,
            irsa=c.irsa,
            oidc_provider_trn=cluster.oidc_provider_trn,
            namespace=s.serving_namespace,
            service_account=s.serving_service_account,
            protect=c.delete_protection,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    registry = Registry(
        name,
        RegistryArgs(
            registry_name=s.registry_name,
            namespace=s.registry.namespace,
            repository=s.registry.repository,
            region=s.region,
            mirror_namespace=s.registry.mirror_namespace,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    observability = None
    if s.observability.vmp_enabled:
        observability = Observability(
            name,
            ObservabilityArgs(
                workspace_name=f"{name}-metrics",
                instance_type=s.observability.vmp_instance_type,
                protect=c.delete_protection,
                project_name=s.project_name,
                tags=tags,
            ),
            opts=opts,
        )

    if s.gateway.edge_enabled:
        g = s.gateway
        upstreams = [EdgeUpstream(**u) for u in s.edge_upstreams()]
        EdgeGateway(
            name,
            EdgeArgs(
                gateway_name=name,
                vpc_id=network.vpc_id,
                subnet_ids=network.node_subnet_ids,
                cluster_id=cluster.cluster_id,
                flannel_pod_cidr=None if vpc_cni else str(s.network.flannel_pod_cidr),
                instance_spec=g.instance_spec,
                replicas=g.replicas,
                public_bandwidth_mbps=g.public_bandwidth_mbps,
                upstreams=upstreams,
                ab_header_name=g.ab_header.name,
                ab_header_value=g.ab_header.value,
                # the canary when the edge splits, else the in-cluster gateway's one upstream
                ab_upstream_role=upstreams[-1].role,
                timeout_seconds=g.request_timeout_seconds,
                project_name=s.project_name,
                tags=tags,
            ),
            opts=opts,
        )

    return Infra(
        provider=provider,
        network=network,
        cluster=cluster,
        weights=weights,
        registry=registry,
        observability=observability,
    )


def export_outputs(infra: Infra, serving=None) -> None:
    """The stack outputs, in one place."""
    pulumi.export("vpc_id", infra.network.vpc_id)
    pulumi.export("egress_ip", infra.network.egress_ip)
    pulumi.export("cluster_id", infra.cluster.cluster_id)
    pulumi.export("kubeconfig", infra.cluster.kubeconfig)
    pulumi.export("weights_bucket", infra.weights.bucket_name)
    pulumi.export("weights_reader", infra.weights.role_trn)
    pulumi.export("image_repository", infra.registry.image_repository)
    if infra.observability is not None:
        pulumi.export("vmp_workspace_id", infra.observability.workspace_id)
    if serving is not None:
        pulumi.export("serving_endpoint", serving.endpoint)
