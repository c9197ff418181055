"""Gateway: every public route is authenticated with a JWT and rate-limited.

Public traffic enters at the APIG edge, whose own auth is off (the provider has no JWT
resource), and is forwarded to the in-cluster Envoy Gateway, where SecurityPolicy (JWT)
and BackendTrafficPolicy (rate limits) attach to the HTTPRoutes. A route or an edge
upstream that skips them is a public, unauthenticated model endpoint.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .common import (
    APIG_SERVICE,
    APIG_UPSTREAM,
    dig,
    items,
    mapping,
    name_of,
    number,
    k8s_kind,
    of_kind,
    of_type,
    resource_policy,
    stack_policy,
)

GATEWAY_API_GROUP = "gateway.networking.k8s.io"
OWNING_GATEWAY_NAME = "gateway.envoyproxy.io/owning-gateway-name"
OWNING_GATEWAY_NAMESPACE = "gateway.envoyproxy.io/owning-gateway-namespace"


def _ns(r) -> str:
    return str(dig(r.props, "metadata", "namespace", default="default"))


def _targets(policy) -> list[tuple[str, str]]:
    refs = items(dig(policy.props, "spec", "targetRefs"))
    single = dig(policy.props, "spec", "targetRef")
    if single is not None:
        refs.append(single)
    return [(str(dig(r, "kind", default="")), str(dig(r, "name", default=""))) for r in refs]


def _route_gateways(route) -> list[str]:
    return [str(dig(p, "name")) for p in items(dig(route.props, "spec", "parentRefs"))
            if dig(p, "kind", default="Gateway") == "Gateway"]


def _covers(policy, route) -> bool:
    """An Envoy Gateway policy applies to a route when it targets the route or one of the
    Gateways it attaches to (same namespace; policies cannot target across namespaces)."""
    if _ns(policy) != _ns(route):
        return False
    name = dig(route.props, "metadata", "name")
    targets = _targets(policy)
    return ("HTTPRoute", name) in targets or any(("Gateway", g) in targets for g in _route_gateways(route))


def _jwt_policies(resources) -> list:
    out = []
    for p in of_kind(resources, "SecurityPolicy"):
        providers = items(dig(p.props, "spec", "jwt", "providers"))
        if providers and dig(p.props, "spec", "jwt", "optional") is not True:
            out.append(p)
    return out


def _unauthenticated_routes(resources) -> list:
    jwt = _jwt_policies(resources)
    return [r for r in of_kind(resources, "HTTPRoute") if not any(_covers(p, r) for p in jwt)]


def _jwt(args, report):
    for route in _unauthenticated_routes(args.resources):
        report(f"HTTPRoute {name_of(route.props)} is reachable without a JWT: anyone on the internet can spend "
               "the GPUs. Fix: enable serving.auth (a SecurityPolicy with a jwt provider targeting the route or "
               "its Gateway).", route.urn)
    if any(dig(s.props, "authSpec", "enable") is True for s in of_type(args.resources, APIG_SERVICE)):
        return  # the edge authenticates by itself
    for up, ns, name in _edge_bypasses(args.resources):
        report(f"APIG upstream {dig(up.props, 'name')!r} forwards public traffic to {ns}/{name}, which is not "
               "behind the authenticating gateway. Fix: set serving.in_cluster_gateway: true so the edge targets "
               "the Envoy Gateway entry Service.", up.urn)


def _edge_bypasses(resources) -> list:
    """APIG upstreams whose Kubernetes Service is not the entry of an Envoy Gateway (the
    proxies that carry JWT and rate limits): public traffic reaching pods directly."""
    services = {(_ns(s), str(dig(s.props, "metadata", "name"))): s for s in of_kind(resources, "Service")}
    out = []
    for up in of_type(resources, APIG_UPSTREAM):
        ref = dig(up.props, "upstreamSpec", "k8sService", default={})
        ns, name = str(dig(ref, "namespace", default="")), str(dig(ref, "name", default=""))
        svc = services.get((ns, name))
        selector = mapping(dig(svc.props, "spec", "selector", default={})) if svc is not None else {}
        if OWNING_GATEWAY_NAME not in selector:
            out.append((up, ns, name))
    return out


def _rate_limited(args, report):
    limits = []
    for p in of_kind(args.resources, "BackendTrafficPolicy"):
        rl = dig(p.props, "spec", "rateLimit", default={})
        rules = items(dig(rl, "global", "rules")) + items(dig(rl, "local", "rules"))
        if rules and all(number(dig(r, "limit", "requests"), 0) > 0 for r in rules):
            limits.append(p)
    for route in of_kind(args.resources, "HTTPRoute"):
        if not any(_covers(p, route) for p in limits):
            report(f"HTTPRoute {name_of(route.props)} has no rate limit: one client can starve every other. Fix: "
                   "enable serving.rate_limits (a BackendTrafficPolicy with rateLimit rules targeting the route).",
                   route.urn)
    for up, ns, name in _edge_bypasses(args.resources):
        report(f"APIG upstream {dig(up.props, 'name')!r} forwards public traffic to {ns}/{name} past the gateway "
               "that rate-limits. Fix: set serving.in_cluster_gateway: true.", up.urn)


# RFC 2606 (and RFC 6761) reserves these names for documentation and testing: no real
# identity provider lives there, so a JWT provider naming one rejects every token.
RESERVED_TLDS = ("example", "test", "invalid", "localhost")
RESERVED_DOMAINS = ("example.com", "example.net", "example.org")


def reserved_domain(value: str) -> str | None:
    """The reserved name `value` (a URL, or a bare host) lies in, or None."""
    text = str(value).strip()
    host = urlsplit(text).hostname if "://" in text else text.split("/", 1)[0].split(":", 1)[0]
    host = (host or "").lower().rstrip(".")
    if not host:
        return None
    for d in RESERVED_DOMAINS:
        if host == d or host.endswith("." + d):
            return d
    tld = host.rsplit(".", 1)[-1]
    return f".{tld}" if tld in RESERVED_TLDS else None


def _identity_provider(args, report):
    if k8s_kind(args.resource_type) != "SecurityPolicy":
        return
    for p in items(dig(args.props, "spec", "jwt", "providers")):
        fields = [("serving.auth.issuer", dig(p, "issuer", default="")),
                  ("serving.auth.jwks_uri", dig(p, "remoteJWKS", "uri", default=""))]
        fields += [(f"serving.auth.audiences[{i}]", a) for i, a in enumerate(items(dig(p, "audiences")))]
        for field, value in fields:
            domain = reserved_domain(str(value)) if value else None
            if domain:
                report(f"{field} is {value!r}, in the reserved example domain {domain} (RFC 2606): no real identity "
                       f"provider answers there, so the gateway of {name_of(args.props)} would reject every token. "
                       f"Fix: set {field} in the stack file to your identity provider's value "
                       "(docs/serving.md, Identity).")


POLICIES = [
    resource_policy(
        "identity-provider-not-placeholder",
        "The JWT provider is a real one: no issuer, JWKS URL or audience in an RFC 2606 example domain.",
        _identity_provider,
        fix="Set serving.auth.issuer, audiences and jwks_uri (or jwks_configmap) to your identity provider's.",
        tags=["gateway", "identity"],
    ),
    stack_policy(
        "gateway-jwt-auth",
        "Every public route requires a JWT (Envoy Gateway SecurityPolicy), and the edge only forwards to it.",
        _jwt,
        fix="Enable serving.auth and serving.in_cluster_gateway.",
        tags=["gateway"],
    ),
    stack_policy(
        "gateway-rate-limits",
        "Every public route is rate-limited (Envoy Gateway BackendTrafficPolicy).",
        _rate_limited,
        fix="Enable serving.rate_limits.",
        tags=["gateway"],
    ),
]
