"""The public edge: an APIG gateway in the VPC that forwards `/v1/` to the in-cluster
serving entry, with weighted upstreams and header-based A/B routing.

Where the split happens: with the in-cluster Envoy gateway enabled (the default, it is
where JWT and rate limits live), the edge has one upstream, the Envoy service, and the
HTTPRoute splits stable/canary. Without it, the edge splits between the stable and canary
Services itself. Either way the weight comes from `gateway.canary_weight`; it is applied
once, never at both hops.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list

# APIG weights run 0..10000 (pulumi-volcengine ApigRoute.upstream_lists).
APIG_WEIGHT_SCALE = 100


@dataclass(frozen=True)
class EdgeUpstream:
    """A Kubernetes Service the edge forwards to, and its share of traffic in percent."""

    role: str
    namespace: str
    service: str
    port: int
    weight: int


@dataclass(frozen=True)
class EdgeArgs:
    gateway_name: str
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[list[str]]
    cluster_id: pulumi.Input[str]
    flannel_pod_cidr: str | None
    instance_spec: str
    replicas: int
    public_bandwidth_mbps: int
    upstreams: list[EdgeUpstream]
    ab_header_name: str
    ab_header_value: str
    ab_upstream_role: str
    timeout_seconds: int
    project_name: str
    tags: dict[str, str]
    # TLS project and topic of the edge's access logs (infra/logging.py); none when None
    log_project_id: pulumi.Input[str] | None = None
    log_topic_id: pulumi.Input[str] | None = None


def upstream_weights(upstreams: list[EdgeUpstream]) -> list[int]:
    """Percent weights -> APIG weights; zero-weight upstreams stay listed so a canary can be
    dialled up without re-creating the route."""
    total = sum(u.weight for u in upstreams)
    if total != 100:
        raise ValueError(f"edge upstream weights must add up to 100, got {total}")
    return [u.weight * APIG_WEIGHT_SCALE for u in upstreams]


class EdgeGateway(pulumi.ComponentResource):
    gateway_id: pulumi.Output[str]
    route_ids: list[pulumi.Output[str]]

    def __init__(self, name: str, args: EdgeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:gateway:EdgeGateway", name, None, opts)
        weights = upstream_weights(args.upstreams)

        gateway = volc.apig.ApigGateway(
            f"{name}-apig",
            name=args.gateway_name,
            type="standard",
            comments="DeepSeek serving edge",
            network_spec={"vpc_id": args.vpc_id, "subnet_ids": args.subnet_ids},
            resource_spec={
                "instance_spec_code": args.instance_spec,
                "replicas": args.replicas,
                "clb_spec_code": "small_1",
                "network_type": {"enable_public_network": True, "enable_private_network": True},
                "public_network_billing_type": "bandwidth",
                "public_network_bandwidth": args.public_bandwidth_mbps,
            },
            **(
                {"backend_spec": {"is_vke_with_flannel_cni_supported": True, "vke_pod_cidr": args.flannel_pod_cidr}}
                if args.flannel_pod_cidr
                else {}
            ),
            **(
                {"log_spec": {"enable": True, "project_id": args.log_project_id, "topic_id": args.log_topic_id}}
                if args.log_project_id is not None
                else {}
            ),
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        service = volc.apig.ApigGatewayService(
            f"{name}-service",
            gateway_id=gateway.id,
            service_name=f"{args.gateway_name}-api",
            protocols=["HTTP", "HTTPS"],
            # APIG's own auth stays off: JWT is verified by the in-cluster gateway, which
            # the provider can configure (pulumi-volcengine has no APIG JWT resource).
            auth_spec={"enable": False},
            comments="OpenAI-compatible API",
            opts=child(self),
        )
        source = volc.apig.ApigUpstreamSource(
            f"{name}-vke-source",
            gateway_id=gateway.id,
            source_type="K8S",
            source_spec={"k8s_source": {"cluster_id": args.cluster_id}},
            comments="services of the serving cluster",
            opts=child(self),
        )
        upstream_ids: dict[str, pulumi.Output[str]] = {}
        for up in args.upstreams:
            upstream = volc.apig.ApigUpstream(
                f"{name}-upstream-{up.role}",
                gateway_id=gateway.id,
                name=f"{args.gateway_name}-{up.role}",
                source_type="K8S",
                protocol="HTTP",
                upstream_spec={"k8s_service": {"namespace": up.namespace, "name": up.service, "port": up.port}},
                load_balancer_settings={"lb_policy": "SimpleLB", "simple_lb": "LEAST_CONN"},
                comments=f"{up.role} track: {up.namespace}/{up.service}:{up.port}",
                opts=child(self, depends_on=[source]),
            )
            upstream_ids[up.role] = upstream.id

        # LLM responses stream for minutes; retries only for failures before a response
        # started (connect errors, 503 from a draining pod), never for 5xx mid-generation.
        advanced = {
            "timeout_setting": {"enable": True, "timeout": args.timeout_seconds},
            "retry_policy_setting": {
                "enable": True,
                "attempts": 2,
                "retry_ons": ["connect-failure", "refused-stream", "reset"],
                "http_codes": [503],
                "per_try_timeout": args.timeout_seconds,
            },
        }
        default_route = volc.apig.ApigRoute(
            f"{name}-route-default",
            service_id=service.id,
            name=f"{args.gateway_name}-default",
            priority=10,
            enable=True,
            match_rule={"path": {"match_type": "Prefix", "match_content": "/v1/"}},
            upstream_lists=[
                {"upstream_id": upstream_ids[up.role], "weight": w} for up, w in zip(args.upstreams, weights)
            ],
            advanced_setting=advanced,
            opts=child(self),
        )
        ab_route = volc.apig.ApigRoute(
            f"{name}-route-ab",
            service_id=service.id,
            name=f"{args.gateway_name}-ab",
            priority=1,  # the header rule is more specific than the default route's prefix
            enable=True,
            match_rule={
                "path": {"match_type": "Prefix", "match_content": "/v1/"},
                "headers": [
                    {"key": args.ab_header_name, "value": {"match_type": "Exact", "match_content": args.ab_header_value}}
                ],
            },
            upstream_lists=[{"upstream_id": upstream_ids[args.ab_upstream_role], "weight": 100 * APIG_WEIGHT_SCALE}],
            advanced_setting=advanced,
            opts=child(self),
        )
        self.gateway_id = gateway.id
        self.route_ids = [default_route.id, ab_route.id]
        self.register_outputs({"gateway_id": self.gateway_id})
