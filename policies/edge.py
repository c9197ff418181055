"""The APIG edge as APIG accepts it and as clients with bearer tokens need it: at most two
subnets, HTTPS only on the public service (plain HTTP closed, or only redirected), every
public domain with a certificate.

APIG limits: terraform-provider-volcenginecc docs/resources/apig_gateway.md at 3a525a11
(`subnet_ids` "Length limit: 1-2"); protocols and custom domains: terraform-provider-
volcengine volcengine/apig at 8cff1813.
"""

from __future__ import annotations

from collections.abc import Sequence

import re

from .common import APIG_SERVICE, as_list, dig, of_type, resource_policy, stack_policy
from .gateway import reserved_domain

APIG_GATEWAY = "volcengine:apig/apigGateway:ApigGateway"
APIG_DOMAIN = "volcengine:apig/apigCustomDomain:ApigCustomDomain"
APIG_MAX_SUBNETS = 2
# Ids the certificate service (Certificate Center) issues: `cert-` and lower-case letters and
# digits, as in the provider's own examples (terraform-provider-volcengine at 8cff1813:
# example/albListenerDomainExtension/main.tf `cert-1iidd2pahdyio74adhfr9ajwg` and
# `cert-1iidd2r9ii0hs74adhfeodxo1`; example/albListener/main.tf names the certificate center's
# ids `cert-***`).
CERTIFICATE_ID = re.compile(r"cert-[0-9a-z]{20,32}")


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


def _domain_not_placeholder(args, report):
    if args.resource_type != APIG_DOMAIN:
        return
    domain = str(dig(args.props, "domain", default=""))
    reserved = reserved_domain(domain) if domain else None
    if reserved:
        report(f"gateway.tls.domain is {domain!r}, in the reserved example domain {reserved} (RFC 2606): no client "
               "resolves it and no certificate is issued for it, so the public API is unreachable. Fix: set "
               "gateway.tls.domain to the API's real host name, with a DNS record to the edge (docs/deploy.md, "
               "Certificate and DNS).")
    cert = dig(args.props, "certificateId", default="")
    if isinstance(cert, str) and cert and not CERTIFICATE_ID.fullmatch(cert):
        report(f"gateway.tls.certificate_id is {cert!r}, not an id the certificate service issues (cert- and 20-32 "
               "lower-case letters and digits, e.g. cert-1iidd2pahdyio74adhfr9ajwg): APIG refuses the domain. Fix: "
               "upload or issue the domain's certificate in VolcEngine's Certificate Center and set its id "
               "(docs/deploy.md, Certificate and DNS).")


POLICIES = [
    resource_policy(
        "edge-domain-not-placeholder",
        "The public domain is a real one (no RFC 2606 example name) with a certificate id the certificate service "
        "issues.",
        _domain_not_placeholder,
        fix="Set gateway.tls.domain to the API's host name and gateway.tls.certificate_id to its certificate's id.",
        tags=["gateway"],
    ),
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
