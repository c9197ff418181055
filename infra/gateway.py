"""The public edge: an APIG gateway in the VPC that forwards `/v1/` to the in-cluster
serving entry, with weighted upstreams and header-based A/B routing.

Where the split happens: with the in-cluster Envoy gateway enabled (the default, it is
where JWT and rate limits live), the edge has one upstream, the Envoy service, and the
HTTPRoute splits stable/canary. Without it, the edge splits between the stable and canary
Services itself. Either way the weight comes from `gateway.canary_weight`; it is applied
once, never at both hops.

What APIG accepts (terraform-provider-volcenginecc docs/resources/apig_gateway.md at
3a525a11: `subnet_ids` "Length limit: 1-2", `replicas` "2-100", public bandwidth "0-500"
Mbps; terraform-provider-volcengine volcengine/apig at 8cff1813 for the route schema):
- at most two subnets, the node subnets of `gateway.zones` (settings refuse more);
- retry `http_codes` are strings, `per_try_timeout` is in milliseconds (the provider's
  example pairs `per_try_timeout = 1000` with a route `timeout = 10`, whose unit it
  documents as seconds); settings take seconds and integers and convert here;
- clients send bearer tokens, so the public service speaks HTTPS only, on the stack's
  domain with a certificate from VolcEngine's certificate service; plain HTTP is closed
  (default) or answered with a redirect (`gateway.tls.plain_http`);
- APIG's own metrics go to the stack's VMP workspace (`monitor_spec`) when there is one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list

# APIG weights run 0..10000 (pulumi-volcengine ApigRoute.upstream_lists).
APIG_WEIGHT_SCALE = 100
APIG_MAX_SUBNETS = 2
MS_PER_SECOND = 1000


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
    retry: "EdgeRetry"
    tls: "EdgeTls"
    vmp_workspace_id: pulumi.Input[str] | None
    project_name: str
    tags: dict[str, str]
    # Upstreams and routes name Kubernetes Services: they come with the Kubernetes layer
    # (deploy phase 2, infra/identity.py) through attach_routes; phase 1 builds the gateway,
    # service and domain only.

    # TLS project and topic of the edge's access logs (infra/logging.py); none when None
    log_project_id: pulumi.Input[str] | None = None
    log_topic_id: pulumi.Input[str] | None = None


@dataclass(frozen=True)
class EdgeRetry:
    """Retries of one route, in the units of the settings (seconds, integer status codes)."""

    enabled: bool
    attempts: int
    per_try_timeout_seconds: int
    retry_on: tuple[str, ...]
    http_codes: tuple[int, ...]


@dataclass(frozen=True)
class EdgeTls:
    domain: str
    certificate_id: str
    plain_http: str  # "closed" or "redirect"


def retry_policy(r: EdgeRetry) -> dict:
    """APIG's retry_policy_setting: status codes as strings, the per-try timeout in ms."""
    if not r.enabled:
        return {"enable": False}
    return {
        "enable": True,
        "attempts": r.attempts,
        "retry_ons": list(r.retry_on),
        "http_codes": [str(c) for c in r.http_codes],
        "per_try_timeout": r.per_try_timeout_seconds * MS_PER_SECOND,
    }


def protocols(tls: EdgeTls) -> list[str]:
    """What the public service listens to: HTTPS, plus HTTP only to redirect it."""
    return ["HTTP", "HTTPS"] if tls.plain_http == "redirect" else ["HTTPS"]


def upstream_weights(upstreams: list[EdgeUpstream]) -> list[int]:
    """Percent weights -> APIG weights; zero-weight upstreams stay listed so a canary can be
    dialled up without re-creating the route."""
    total = sum(u.weight for u in upstreams)
    if total != 100:
        raise ValueError(f"edge upstream weights must add up to 100, got {total}")
    return [u.weight * APIG_WEIGHT_SCALE for u in upstreams]


def public_default_domain(services) -> str:
    """The public one of the default domains APIG gives a service: the CNAME target of the
    stack's domain. The provider does not document the spelling of a domain's `type`, so
    any type naming "public" counts; "" while APIG reports none (docs/deploy.md says where
    to look in the console then)."""
    for svc in services or []:
        for d in svc.domains or []:
            if "public" in (d.type or "").lower() and d.domain:
                return d.domain
    return ""


class EdgeGateway(pulumi.ComponentResource):
    gateway_id: pulumi.Output[str]
    route_ids: list[pulumi.Output[str]]
    # the stack's public API: the domain clients call, and the APIG address its DNS record
    # (a CNAME) points at
    domain: str
    dns_target: pulumi.Output[str]

    def __init__(self, name: str, args: EdgeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:gateway:EdgeGateway", name, None, opts)
        weights = upstream_weights(args.upstreams)
        if isinstance(args.subnet_ids, list) and not 1 <= len(args.subnet_ids) <= APIG_MAX_SUBNETS:
            raise ValueError(f"APIG takes 1 to {APIG_MAX_SUBNETS} subnets, got {len(args.subnet_ids)}")

        gateway = volc.apig.ApigGateway(
            f"{name}-apig",
            name=args.gateway_name,
            type="standard",
            comments="DeepSeek serving edge",
            network_spec={"vpc_id": args.vpc_id, "subnet_ids": args.subnet_ids},
            monitor_spec=(
                {"enable": True, "workspace_id": args.vmp_workspace_id}
                if args.vmp_workspace_id is not None
                else {"enable": False}
            ),
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
            protocols=protocols(args.tls),
            # APIG's own auth stays off: JWT is verified by the in-cluster gateway, which
            # the provider can configure (pulumi-volcengine has no APIG JWT resource).
            auth_spec={"enable": False},
            comments="OpenAI-compatible API",
            opts=child(self),
        )
        # ApigGatewayService does not output its default domains; the data source does,
        # once the service exists (its id and name are this update's outputs).
        found = volc.apig.get_gateway_services_output(
            gateway_id=service.gateway_id, name=service.service_name, opts=pulumi.InvokeOptions(parent=self))
        self.domain = args.tls.domain
        self.dns_target = found.gateway_services.apply(public_default_domain)
        volc.apig.ApigCustomDomain(
            f"{name}-domain",
            service_id=service.id,
            domain=args.tls.domain,
            certificate_id=args.tls.certificate_id,
            protocols=protocols(args.tls),
            ssl_redirect=args.tls.plain_http == "redirect",
            comments="public API domain, HTTPS only",
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
        self.gateway_id = gateway.id
        self.route_ids = []
        self._name, self._args, self._gateway, self._service, self._source = name, args, gateway, service, source
        self.register_outputs({"gateway_id": self.gateway_id})

    def attach_routes(self, services: dict[tuple[str, str], pulumi.Resource]) -> None:
        """The upstreams and routes, registered once the Kubernetes layer has registered the
        Services they name (`services`: (namespace, name) -> resource): APIG resolves a K8S
        upstream against the cluster, so each depends on its Service as well as on the
        upstream source (docs/infrastructure.md, The public edge)."""
        name, args, gateway, service, source = self._name, self._args, self._gateway, self._service, self._source
        weights = upstream_weights(args.upstreams)
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
                opts=child(self, depends_on=[source, *([services[(up.namespace, up.service)]]
                                                       if (up.namespace, up.service) in services else [])]),
            )
            upstream_ids[up.role] = upstream.id

        # LLM responses stream for minutes; by default retries only for failures before a
        # response started (connect errors, 503 from a draining pod), never for 5xx
        # mid-generation. The route timeout is in seconds, the per-try timeout in ms.
        advanced = {
            "timeout_setting": {"enable": True, "timeout": args.timeout_seconds},
            "retry_policy_setting": retry_policy(args.retry),
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
        self.route_ids = [default_route.id, ab_route.id]
