"""The APIG edge as APIG accepts it and as clients with bearer tokens need it: at most two
subnets, HTTPS only on the public service (plain HTTP closed, or only redirected), every
public domain with a certificate.

APIG limits: terraform-provider-volcenginecc docs/resources/apig_gateway.md at 3a525a11
(`subnet_ids` "Length limit: 1-2"); protocols and custom domains: terraform-provider-
volcengine volcengine/apig at 8cff1813.
"""

from __future__ import annotations

from collections.abc import Sequence

from .common import APIG_SERVICE, as_list, dig, of_type, resource_policy, stack_policy

APIG_GATEWAY = "volcengine:apig/apigGateway:ApigGateway"
APIG_DOMAIN = "volcengine:apig/apigCustomDomain:ApigCustomDomain"
APIG_MAX_SUBNETS = 2


def _subnets(args, report):
    if args.resource_type != APIG_GATEWAY:
        return
    # count without reading the ids: on a new stack they are unknown until the subnets exist
    subnets = dig(args.props, "networkSpec", "subnetIds", default=[])
    count = len(subnets) if isinstance(subnets, Sequence) and not isinstance(subnets, str) else 0
    if not 1 <= count <= APIG_MAX_SUBNETS:
        report(f"APIG gateway {dig(args.props, 'name')!r} is given {count} subnets; APIG accepts 1 to "
               f"{APIG_MAX_SUBNETS}. Fix: choose at most two zones in gateway.zones.")


def _https_only(args, report):
    domains = of_type(args.resources, APIG_DOMAIN)
    for d in domains:
        protos = [str(p) for p in as_list(dig(d.props, "protocols"))]
        name = dig(d.props, "domain")
        if "HTTPS" not in protos or not dig(d.props, "certificateId"):
            report(f"APIG domain {name!r} is served without HTTPS and a certificate (protocols {protos}). Fix: set "
                   "gateway.tls.certificate_id to the domain's certificate.", d.urn)
        if "HTTP" in protos and dig(d.props, "sslRedirect") is not True:
            report(f"APIG domain {name!r} answers plain HTTP without redirecting it: bearer tokens would cross the "
                   "network in clear. Fix: gateway.tls.plain_http: closed (or redirect).", d.urn)
    for svc in of_type(args.resources, APIG_SERVICE):
        protos = [str(p) for p in as_list(dig(svc.props, "protocols"))]
        name = dig(svc.props, "serviceName")
        if "HTTPS" not in protos:
            report(f"APIG service {name!r} does not serve HTTPS (protocols {protos}). Fix: gateway.tls.", svc.urn)
        elif "HTTP" in protos and not any(dig(d.props, "sslRedirect") is True for d in domains):
            report(f"APIG service {name!r} listens on plain HTTP and nothing redirects it to HTTPS. Fix: "
                   "gateway.tls.plain_http: closed.", svc.urn)
        if not domains:
            report(f"APIG service {name!r} has no custom domain with a certificate. Fix: set gateway.tls.domain and "
                   "gateway.tls.certificate_id.", svc.urn)


POLICIES = [
    resource_policy(
        "edge-subnet-limit",
        "The APIG gateway gets one or two subnets (APIG accepts no more).",
        _subnets,
        fix="Choose at most two zones in gateway.zones.",
        tags=["gateway"],
    ),
    stack_policy(
        "edge-https-only",
        "The public edge serves HTTPS with a certificate; plain HTTP is closed or redirected.",
        _https_only,
        fix="Set gateway.tls (domain, certificate_id) and keep plain_http closed or redirect.",
        tags=["gateway"],
    ),
]
