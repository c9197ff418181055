"""Network: nothing reachable from the internet but the gateway's listener, a private API
server, egress only through NAT gateways and surviving the loss of a zone, and address
ranges VolcEngine takes as private."""

from __future__ import annotations

import re

from stacks.contract import load as load_contract

from .common import (
    EIP_ASSOC,
    SG,
    SG_RULE,
    SNAT,
    SUBNET,
    NAT,
    VKE_CLUSTER,
    cfg,
    dig,
    items,
    k8s_kind,
    number,
    of_type,
    resource_policy,
    stack_policy,
)

VPC = "volcengine:vpc/vpc:Vpc"
ROUTE_TABLE = "volcengine:vpc/routeTable:RouteTable"
ROUTE_ENTRY = "volcengine:vpc/routeEntry:RouteEntry"
ROUTE_ASSOC = "volcengine:vpc/routeTableAssociate:RouteTableAssociate"
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


# The CIDR arguments held to VolcEngine's private ranges (stacks/provider_contract.yaml:
# blocks, masks and the documentation page), with the setting each comes from.
CIDR_ARGUMENTS = {
    VPC: [("cidrBlock", "network.vpc_cidr")],
    SUBNET: [("cidrBlock", "network.subnets / network.pod_subnets")],
    VKE_CLUSTER: [("podsConfig.flannelConfig.podCidrs", "network.flannel_pod_cidr"),
                  ("servicesConfig.serviceCidrsv4s", "network.service_cidr")],
}


def _private_cidrs(args, report):
    arguments = CIDR_ARGUMENTS.get(args.resource_type)
    if not arguments:
        return
    contract = load_contract()
    for path, setting in arguments:
        value = dig(args.props, *path.split("."))
        if value is None:
            continue
        arg = contract.argument(args.resource_type, path)
        values = [str(v) for v in items(value)] if arg.type.startswith("list") else [str(value)]
        for v in values:
            for problem in arg.problems([v] if arg.type.startswith("list") else v):
                problem = re.sub(r"^\[\d+\]: ", "", problem)
                report(f"{path} {problem}: VolcEngine takes only private ranges here ({arg.doc}), and addresses "
                       f"outside them belong to hosts on the internet the stack could then not reach. "
                       f"Fix: set {setting} to a block in the accepted ranges.")


def _zone_of_nat(nat, subnet_zone: dict[str, str]) -> str | None:
    """A NAT gateway's zone: the zone of the subnet it is created in."""
    return next((subnet_zone[d.urn] for d in nat.dependencies if d.urn in subnet_zone), None)


def _egress_per_zone(args, report):
    if not cfg(args, "required", True):
        args.not_applicable("one NAT gateway for every zone is allowed by this stack's policy config")
    subnets = of_type(args.resources, SUBNET)
    subnet_zone = {s.urn: str(dig(s.props, "zoneId", default="")) for s in subnets}
    if len(set(subnet_zone.values())) < 2:
        return  # one zone: its loss takes the whole stack anyway
    nat_zone = {n.urn: _zone_of_nat(n, subnet_zone) for n in of_type(args.resources, NAT)}
    names = {r.urn: r.name for r in args.resources}

    def dep(r, among) -> str | None:
        return next((d.urn for d in r.dependencies if d.urn in among), None)

    # the NAT gateway each route table's default route goes to, and each subnet's route table
    tables = {t.urn for t in of_type(args.resources, ROUTE_TABLE)}
    table_nat = {}
    for e in of_type(args.resources, ROUTE_ENTRY):
        if dig(e.props, "destinationCidrBlock") == "0.0.0.0/0" and dig(e.props, "nextHopType") == "NatGW":
            table_nat[dep(e, tables)] = dep(e, nat_zone)
    subnet_table = {dep(a, subnet_zone): dep(a, tables) for a in of_type(args.resources, ROUTE_ASSOC)}
    snat_nat: dict[str, list[str]] = {}
    for e in of_type(args.resources, SNAT):
        snat_nat.setdefault(dep(e, subnet_zone), []).append(dep(e, nat_zone))

    fix = ("Fix: each zone's subnets SNAT and route through a NAT gateway in their own zone, as network.nat: "
           "per_zone (the default outside the dev class) builds them (infra/network.py).")
    for s in subnets:
        zone = subnet_zone[s.urn]
        for nat in snat_nat.get(s.urn, []):
            if nat is not None and nat_zone.get(nat) != zone:
                report(f"subnet {s.name!r} ({zone}) egresses through NAT gateway {names[nat]!r} in "
                       f"{nat_zone.get(nat) or 'an unknown zone'}: losing that zone cuts this subnet's egress to TOS, "
                       f"STS and the registry. {fix}", s.urn)
        table = subnet_table.get(s.urn)
        if table is None:
            report(f"subnet {s.name!r} ({zone}) has no route table of its own: the VPC's system route table sends "
                   f"its 0.0.0.0/0 to a single NAT gateway, whichever zone that is in. {fix}", s.urn)
        elif nat_zone.get(table_nat.get(table)) != zone:
            nat = table_nat.get(table)
            where = f"{names[nat]!r} in {nat_zone.get(nat)}" if nat else "no NAT gateway"
            report(f"subnet {s.name!r} ({zone}) routes 0.0.0.0/0 to {where}: its egress does not survive the loss "
                   f"of another zone. {fix}", s.urn)


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
    resource_policy(
        "private-cidrs",
        "The VPC, its subnets and the cluster's pod and service CIDRs lie in the private ranges VolcEngine accepts.",
        _private_cidrs,
        fix="Set network.vpc_cidr, subnets, pod_subnets, service_cidr and flannel_pod_cidr inside the private "
            "ranges (docs/infrastructure.md, provider contract).",
        tags=["network"],
    ),
    stack_policy(
        "egress-per-zone",
        "Each zone's subnets SNAT and route through a NAT gateway in their own zone (required outside dev).",
        _egress_per_zone,
        fix="Set network.nat: per_zone.",
        config={"required": {"type": "boolean", "default": True,
                             "description": "whether this stack's egress must survive the loss of a zone"}},
        tags=["network"],
    ),
]
