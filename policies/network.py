"""Network: nothing reachable from the internet but the gateway's listener, a private API
server, and egress only through the NAT gateway."""

from __future__ import annotations

import re

from .common import (
    EIP_ASSOC,
    SG,
    SG_RULE,
    SNAT,
    SUBNET,
    VKE_CLUSTER,
    cfg,
    dig,
    k8s_kind,
    number,
    of_type,
    resource_policy,
    stack_policy,
)

ANYWHERE = ("0.0.0.0/0", "::/0")
# The VKE annotation that keeps a LoadBalancer Service's CLB on the private network.
LB_ADDRESS_TYPE = "service.beta.kubernetes.io/volcengine-loadbalancer-address-type"


def _public_ingress(args, report):
    listener_ports = {int(p) for p in cfg(args, "listenerPorts", [80, 443])}
    pattern = re.compile(cfg(args, "listenerSecurityGroupPattern", r"-gateway$"))
    groups = {r.urn: r for r in of_type(args.resources, SG)}
    for rule in of_type(args.resources, SG_RULE):
        p = rule.props
        if dig(p, "direction") != "ingress" or dig(p, "policy", default="accept") != "accept":
            continue
        if str(dig(p, "cidrIp", default="")) not in ANYWHERE:
            continue
        lo, hi = number(dig(p, "portStart"), -1), number(dig(p, "portEnd"), -1)
        ports_ok = lo is not None and lo > 0 and hi is not None and hi >= lo and all(
            port in listener_ports for port in range(int(lo), int(hi) + 1))
        sg_names = [str(dig(groups[d.urn].props, "securityGroupName", default=""))
                    for d in rule.dependencies if d.urn in groups]
        if ports_ok and sg_names and all(pattern.search(n) for n in sg_names):
            continue  # the gateway listener
        report(f"security group rule {rule.name!r} admits {dig(p, 'cidrIp')} on ports "
               f"{dig(p, 'portStart')}..{dig(p, 'portEnd')} ({', '.join(sg_names) or 'unknown group'}). Fix: "
               "restrict cidr_ip to the VPC CIDR; only the gateway listener's security group may admit "
               f"the internet, on ports {sorted(listener_ports)}.", rule.urn)
    for svc in args.resources:
        if k8s_kind(svc.resource_type) != "Service" or dig(svc.props, "spec", "type") != "LoadBalancer":
            continue
        ann = dig(svc.props, "metadata", "annotations", default={})
        if str(dig(ann, LB_ADDRESS_TYPE, default="")).upper() != "PRIVATE":
            report(f"Service {dig(svc.props, 'metadata', 'name')!r} is a public LoadBalancer. Fix: annotate "
                   f"it with {LB_ADDRESS_TYPE}: PRIVATE; public traffic enters through the APIG edge.", svc.urn)


def _private_api_server(args, report):
    if args.resource_type != VKE_CLUSTER:
        return
    if not cfg(args, "required", True):
        args.not_applicable("a public API server is allowed by this stack's policy config")
    if dig(args.props, "clusterConfig", "apiServerPublicAccessEnabled", default=False) is not False:
        report("the VKE API server is reachable from the internet. Fix: set cluster.api_server_public: false "
               "in the stack settings and reach the cluster through the VPC (bastion or VPN).")


def _egress_through_nat(args, report):
    for a in of_type(args.resources, EIP_ASSOC):
        kind = dig(a.props, "instanceType")
        if kind != "Nat":
            report(f"EIP association {a.name!r} attaches a public IP to a {kind!r}, bypassing the NAT "
                   "gateway. Fix: give instances no EIP; egress leaves through the NAT's SNAT entries.", a.urn)
    for c in of_type(args.resources, VKE_CLUSTER):
        if dig(c.props, "clusterConfig", "resourcePublicAccessDefaultEnabled", default=False) is not False:
            report("the cluster gives new nodes public IPs by default. Fix: set "
                   "cluster_config.resource_public_access_default_enabled=False.", c.urn)
    snat_subnets = {d.urn for s in of_type(args.resources, SNAT) for d in s.dependencies}
    for sub in of_type(args.resources, SUBNET):
        if sub.urn not in snat_subnets:
            report(f"subnet {dig(sub.props, 'subnetName')!r} has no SNAT entry: its nodes and pods cannot reach "
                   "the registry or TOS, or will need public IPs. Fix: add a nat.SnatEntry for the subnet "
                   "(infra/network.py).", sub.urn)


POLICIES = [
    stack_policy(
        "no-public-ingress",
        "Nothing admits 0.0.0.0/0 but the gateway listener.",
        _public_ingress,
        fix="Restrict ingress to the VPC CIDR; only the gateway listener faces the internet.",
        config={
            "listenerPorts": {"type": "array", "items": {"type": "integer"}, "default": [80, 443],
                              "description": "ports the gateway listener may open to the internet"},
            "listenerSecurityGroupPattern": {"type": "string", "default": "-gateway$",
                                             "description": "regex naming the listener's security group"},
        },
        tags=["network"],
    ),
    resource_policy(
        "vke-private-api-server",
        "The VKE API server must not be public (required in prod).",
        _private_api_server,
        fix="Set cluster.api_server_public: false.",
        config={"required": {"type": "boolean", "default": True,
                             "description": "whether this stack requires a private API server"}},
        tags=["network", "cluster"],
    ),
    stack_policy(
        "egress-through-nat",
        "Egress leaves through the NAT gateway: every subnet has SNAT, no node has a public IP.",
        _egress_through_nat,
        fix="Add SNAT entries for every subnet; attach EIPs only to the NAT gateway.",
        tags=["network"],
    ),
]
