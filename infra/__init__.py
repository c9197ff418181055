"""The VolcEngine layer: one ComponentResource per unit, built from the `StackPlan`
(`stacks.plan`): derived values from the plan, what the user wrote from `plan.settings`.

May import: `stacks`, `capacity`, pulumi and pulumi_volcengine. Never `workloads`:
the serving layer receives infra only through the component outputs gathered in `Infra`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import pulumi
import pulumi_volcengine as volc

from infra.availability import PoolPlacement, require_available
from infra.cluster import AddonArgs, Cluster, ClusterArgs, GpuPoolArgs
from infra.gateway import EdgeArgs, EdgeGateway, EdgeRetry, EdgeTls, EdgeUpstream
from infra.identity import DeployPhase, decide, lookup_cluster
from infra.logging import LogCollection, LogCollectionArgs, LogStore, LogStoreArgs, collection_rules
from infra.network import Network, NetworkArgs
from infra.observability import Observability, ObservabilityArgs
from infra.registry import Registry, RegistryArgs
from infra.weights import WeightStore, WeightStoreArgs
from stacks.constants import ENTRY_NAMESPACE, KEDA_NAMESPACE, LWS_NAMESPACE, PREWARM_SUFFIX, ROLLOUTS_NAMESPACE
from stacks.plan import StackPlan

BOOTSTRAP_ENV = "DSVOLC_BOOTSTRAP"


@dataclass
class Infra:
    """What `workloads/` may use of the VolcEngine layer: component outputs only."""

    provider: volc.Provider
    network: Network
    cluster: Cluster
    weights: WeightStore
    registry: Registry
    observability: Observability | None
    phase: DeployPhase
    logs: LogStore | None = None
    edge: EdgeGateway | None = None


def build_infra(plan: StackPlan) -> Infra:
    s = plan.settings
    name = plan.names.prefix
    tags = dict(plan.tags)
    # An explicit provider: the region comes from the validated settings, credentials from
    # VOLCENGINE_ACCESS_KEY / VOLCENGINE_SECRET_KEY in the environment.
    provider = volc.Provider(f"{name}-volcengine", region=s.region)
    opts = pulumi.ResourceOptions(providers=[provider])
    # Decided before anything registers, from what VKE reports for this stack's cluster
    # (infra/identity.py): phase 1 builds the cloud layer, phase 2 the identity and workloads.
    phase = decide(s.cluster.irsa, lookup_cluster(plan.names.cluster, provider))
    if os.environ.get(BOOTSTRAP_ENV) == "1" and phase.number != 1:
        # deploy.yml's bootstrap runs outside the VPC; past phase 1 it could not reach the API server
        raise pulumi.RunError(f"{BOOTSTRAP_ENV}=1 but cluster {plan.names.cluster!r} exists ({phase.describe()}): "
                              "bootstrap is for a new stack only; deploy from the stack's runner in its VPC "
                              "(docs/deploy.md)")

    # Every GPU pool's type is sold in each zone it is placed in, as VolcEngine answers
    # (infra/availability.py): refused here, not when node creation fails after the VPC and
    # the cluster exist.
    require_available([PoolPlacement(n, p.hardware.instance_type, p.zones) for n, p in plan.pools.items()],
                      s.region, provider)

    net = plan.network
    vpc_cni = net.vpc_cni
    network = Network(
        name,
        NetworkArgs(
            vpc_cidr=str(s.network.vpc_cidr),
            node_subnets={z: str(c) for z, c in net.node_subnets.items()},
            pod_subnets={z: str(c) for z, c in net.pod_subnets.items()},
            nat_zones=list(net.nat_zones),
            per_zone_routes=net.nat_mode == "per_zone",
            nat_spec=s.network.nat_spec,
            egress_bandwidth_mbps=s.network.egress_bandwidth_mbps,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    logs = build_log_store(plan, opts) if s.observability.logs.enabled else None

    gpu_pools = {}
    for pool_name, pool in s.cluster.gpu_pools.items():
        pp = plan.pools[pool_name]
        mig = pp.mig
        gpu_pools[pool_name] = GpuPoolArgs(
            instance_type=pool.instance_type,
            gpu_model=pp.gpu,
            gpus_per_node=pp.gpus_per_node,
            subnet_ids=[network.subnet_ids_by_zone[z] for z in pp.zones],
            min_nodes=pool.min_nodes,
            max_nodes=pool.max_nodes,
            desired_nodes=pool.desired_nodes if pool.desired_nodes is not None else pool.min_nodes,
            data_disk_gib=pool.data_disk_gib,
            system_disk_gib=pool.system_disk_gib,
            data_disk_type=pool.data_disk_type,
            topology_policy=pp.topology_policy,
            labels=pool.labels,
            hpc_zone=pp.zones[0] if pp.hardware.hpc else None,
            hpc_cluster_id=pool.hpc_cluster_id,
            mig_profile=mig.name if mig else None,
            mig_per_gpu=mig.per_gpu if mig else 0,
            auto_repair=pool.auto_repair.enabled,
            remedy_policy_id=pool.auto_repair.remedy_policy_id,
        )
    c = s.cluster
    cluster = Cluster(
        name,
        ClusterArgs(
            cluster_name=plan.names.cluster,
            kubernetes_version=c.kubernetes_version,
            api_server_public=c.api_server_public,
            pod_network_mode=c.pod_network_mode,
            delete_protection=c.delete_protection,
            control_plane_logging=c.control_plane_logging,
            log_project_id=logs.project_id if logs else None,
            log_ttl_days=s.observability.logs.retention_days,
            # VKE takes irsa_enabled on an existing cluster only: switched on in phase 2
            irsa=c.irsa and phase.number >= 2,
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
            addons=[AddonArgs(a.name, a.deploy_mode, a.deploy_node_type, a.version) for a in plan.addons],
            ssh_key_pair=c.ssh_key_pair,
            project_name=s.project_name,
            tags=tags,
            kubeconfig_valid_hours=c.deploy_kubeconfig.valid_hours,
            kubeconfig_rotate_hours=c.deploy_kubeconfig.rotate_hours,
        ),
        opts=opts,
    )

    if logs is not None:
        build_log_collection(plan, cluster, logs, opts)

    weights = WeightStore(
        name,
        WeightStoreArgs(
            bucket_name=plan.names.bucket,
            prefix=s.weights.prefix,
            noncurrent_version_days=s.weights.noncurrent_version_days,
            sse_algorithm=s.weights.sse_algorithm,
            kms_key_id=s.weights.kms_key_id,
            irsa=c.irsa,
            create_reader=phase.reader_identity,
            # known at preview when VKE already reports IRSA on; else from this update's cluster
            oidc_provider_trn=phase.existing.oidc_provider_trn if phase.irsa_ready else cluster.oidc_provider_trn,
            oidc_issuer=phase.existing.issuer if phase.irsa_ready else cluster.oidc_issuer,
            namespace=s.serving.namespace,
            service_account=s.serving.service_account,
            also_trusted=(f"{s.serving.name}{PREWARM_SUFFIX}",) if s.resilience.prewarm.enabled else (),
            protect=c.delete_protection,
            project_name=s.project_name,
            tags=tags,
        ),
        opts=opts,
    )

    registry = Registry(
        name,
        RegistryArgs(
            registry_name=plan.names.registry,
            namespace=s.registry.namespace,
            repository=s.registry.repository,
            region=s.region,
            vpc_id=network.vpc_id,
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

    edge = None
    if s.gateway.edge_enabled:
        g = s.gateway
        upstreams = [EdgeUpstream(**asdict(u)) for u in plan.edge.upstreams]
        edge = EdgeGateway(
            name,
            EdgeArgs(
                gateway_name=name,
                vpc_id=network.vpc_id,
                subnet_ids=[network.subnet_ids_by_zone[z] for z in plan.edge.zones],
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
                # behind the in-cluster gateway its idle timeout bounds a request; the edge
                # sets no total, which would cut a long stream (workloads/edge/gateway.py)
                timeout_seconds=None if s.serving.in_cluster_gateway else g.request_timeout_seconds,
                retry=EdgeRetry(
                    enabled=g.retry.enabled,
                    attempts=g.retry.attempts,
                    per_try_timeout_seconds=g.retry.per_try_timeout_seconds,
                    retry_on=tuple(g.retry.retry_on),
                    http_codes=tuple(g.retry.http_codes),
                ),
                tls=EdgeTls(domain=g.tls.domain, certificate_id=g.tls.certificate_id, plain_http=g.tls.plain_http),
                vmp_workspace_id=observability.workspace_id if observability is not None else None,
                log_project_id=logs.project_id if logs else None,
                log_topic_id=logs.topic_ids["edge"] if logs else None,
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
        phase=phase,
        logs=logs,
        edge=edge,
    )


def build_log_store(plan: StackPlan, opts: pulumi.ResourceOptions) -> LogStore:
    """The TLS project, topics, indexes and (for the tls backend) the trace instance."""
    s = plan.settings
    t, lg = s.observability.tracing, s.observability.logs
    return LogStore(
        plan.names.prefix,
        LogStoreArgs(
            project_name=plan.names.log_project,
            region=s.region,
            retention_days=lg.retention_days,
            shard_count=lg.shard_count,
            trace_instance_name=plan.names.trace_instance if t.enabled and t.backend == "tls" else None,
            trace_retention_days=t.retention_days,
            iam_project_name=s.project_name,
            tags=dict(plan.tags),
        ),
        opts=opts,
    )


def build_log_collection(plan: StackPlan, cluster: Cluster, logs: LogStore, opts: pulumi.ResourceOptions) -> None:
    """Container stdout of the serving pods, the gateway's proxies and the platform into
    their topics. The selections follow the workloads' labels: the serving pods carry
    app.kubernetes.io/instance=<serving.name>; Envoy Gateway labels our Gateway's proxies
    (workloads/edge/gateway.py proxy_selector)."""
    s = plan.settings
    platform_namespaces = [ENTRY_NAMESPACE, KEDA_NAMESPACE, ROLLOUTS_NAMESPACE, LWS_NAMESPACE,
                           s.monitoring.namespace, s.observability.tracing.collector_namespace, "kube-system"]
    LogCollection(
        plan.names.prefix,
        LogCollectionArgs(
            cluster_id=cluster.cluster_id,
            topic_ids=logs.topic_ids,
            host_group_name=plan.names.node_group,
            host_identifier=plan.names.log_collector,
            rules=collection_rules(
                serving_namespace=s.serving.namespace,
                release=s.serving.name,
                entry_namespace=ENTRY_NAMESPACE,
                platform_namespaces=platform_namespaces,
                gateway_proxy_labels={"app.kubernetes.io/component": "proxy",
                                      "gateway.envoyproxy.io/owning-gateway-name": s.serving.name},
            ),
            iam_project_name=s.project_name,
            after=(cluster,),
        ),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[cluster])),
    )


def export_outputs(infra: Infra, serving=None) -> None:
    """The stack outputs, in one place."""
    pulumi.export("vpc_id", infra.network.vpc_id)
    # where the stack's deploy runner goes (docs/deploy.md): a node subnet and the node group
    pulumi.export("runner_subnet_id", next(iter(infra.network.subnet_ids_by_zone.values())))
    pulumi.export("runner_security_group_id", infra.network.node_security_group_id)
    # every address the stack's egress leaves from (one per NAT zone): allow-lists need them all
    pulumi.export("egress_ips", infra.network.egress_ips)
    pulumi.export("cluster_id", infra.cluster.cluster_id)
    pulumi.export("deploy_phase", infra.phase.as_dict())
    pulumi.export("weights_bucket", infra.weights.bucket_name)
    if infra.weights.role_trn is not None:
        pulumi.export("weights_reader", infra.weights.role_trn)
    pulumi.export("image_repository", infra.registry.image_repository)
    if infra.observability is not None:
        pulumi.export("vmp_workspace_id", infra.observability.workspace_id)
    if infra.logs is not None:
        pulumi.export("log_project_id", infra.logs.project_id)
        if infra.logs.trace_instance_id is not None:
            pulumi.export("trace_instance_id", infra.logs.trace_instance_id)
    if infra.edge is not None:
        # what clients call, and where the domain's DNS record points (docs/deploy.md)
        pulumi.export("public_endpoint", {
            "domain": infra.edge.domain,
            "url": f"https://{infra.edge.domain}/v1/",
            "dns_record": {"type": "CNAME", "name": infra.edge.domain, "target": infra.edge.dns_target},
        })
    if serving is not None:
        # the in-cluster entry (what the edge forwards to), not reachable from outside the VPC
        pulumi.export("serving_endpoint", serving.endpoint)
