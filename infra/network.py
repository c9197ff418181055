"""VPC with one private node subnet (and one VPC-CNI pod subnet) per zone, a node security
group that admits only in-VPC traffic, and NAT gateways + EIPs + SNAT for egress.

Egress per zone (`network.nat: per_zone`): each zone has its own NAT gateway in its node
subnet, its own EIP, SNAT entries for its node and pod subnets, and a route table that sends
those subnets' default route to that NAT gateway, so losing a zone cuts no other zone's
egress. `shared` (dev-class stacks) keeps one NAT gateway in the first zone for every
subnet, reached through the VPC's system route table (VolcEngine routes 0.0.0.0/0 there to
a VPC's first NAT gateway).

Nothing here has a public address except the NATs' EIPs, which carry egress only: nodes
pull images and reach TOS through them (or through the in-VPC TOS endpoint) and are never
reachable from the internet.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_volcengine as volc

from infra.common import child, tag_list


@dataclass(frozen=True)
class NetworkArgs:
    vpc_cidr: str
    node_subnets: dict[str, str]  # zone -> CIDR
    pod_subnets: dict[str, str]  # zone -> CIDR (empty with Flannel)
    nat_zones: list[str]  # zones with a NAT gateway: every zone (per_zone) or the first (shared)
    per_zone_routes: bool  # a route table per zone to its own NAT gateway (per_zone)
    nat_spec: str
    egress_bandwidth_mbps: int
    project_name: str
    tags: dict[str, str]


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    node_subnet_ids: pulumi.Output[list[str]]
    pod_subnet_ids: pulumi.Output[list[str]]
    subnet_ids_by_zone: dict[str, pulumi.Output[str]]
    node_security_group_id: pulumi.Output[str]
    nat_gateway_ids: dict[str, pulumi.Output[str]]  # zone -> NAT gateway
    egress_ips: dict[str, pulumi.Output[str]]  # zone of the NAT gateway -> its EIP address

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepseek-volc:network:Network", name, None, opts)
        tags = tag_list(args.tags)

        vpc = volc.vpc.Vpc(
            f"{name}-vpc",
            vpc_name=f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            project_name=args.project_name,
            tags=tags,
            opts=child(self),
        )

        self.subnet_ids_by_zone = {}
        node_subnets = []
        node_subnet_by_zone = {}
        for zone, cidr in args.node_subnets.items():
            subnet = volc.vpc.Subnet(
                f"{name}-nodes-{zone}",
                subnet_name=f"{name}-nodes-{zone}",
                vpc_id=vpc.id,
                zone_id=zone,
                cidr_block=cidr,
                opts=child(self),
            )
            self.subnet_ids_by_zone[zone] = subnet.id
            node_subnets.append(subnet)
            node_subnet_by_zone[zone] = subnet
        pod_subnet_by_zone = {
            zone: volc.vpc.Subnet(
                f"{name}-pods-{zone}",
                subnet_name=f"{name}-pods-{zone}",
                vpc_id=vpc.id,
                zone_id=zone,
                cidr_block=cidr,
                opts=child(self),
            )
            for zone, cidr in args.pod_subnets.items()
        }
        pod_subnets = list(pod_subnet_by_zone.values())

        # Nodes talk to each other, to pods and to the VKE control plane inside the VPC
        # only. No rule admits 0.0.0.0/0: the edge gateway reaches pods over the VPC.
        sg = volc.vpc.SecurityGroup(
            f"{name}-nodes-sg",
            security_group_name=f"{name}-nodes",
            description="VKE nodes, in-VPC ingress only",
            vpc_id=vpc.id,
            project_name=args.project_name,
            tags=tag_list(args.tags),
            opts=child(self),
        )
        volc.vpc.SecurityGroupRule(
            f"{name}-nodes-ingress-vpc",
            security_group_id=sg.id,
            direction="ingress",
            protocol="all",
            port_start=-1,
            port_end=-1,
            cidr_ip=args.vpc_cidr,
            policy="accept",
            priority=1,
            description="node, pod and control-plane traffic inside the VPC",
            opts=child(self),
        )
        volc.vpc.SecurityGroupRule(
            f"{name}-nodes-egress",
            security_group_id=sg.id,
            direction="egress",
            protocol="all",
            port_start=-1,
            port_end=-1,
            cidr_ip="0.0.0.0/0",
            policy="accept",
            priority=1,
            description="egress leaves through the NAT gateway",
            opts=child(self),
        )

        # One NAT gateway, EIP and association per NAT zone. The first zone's keep the names
        # they had when the stack had a single NAT gateway (aliases), so its EIP, the egress
        # address allow-lists know, survives the move to per-zone egress.
        self.nat_gateway_ids, self.egress_ips = {}, {}
        nats: dict[str, tuple[volc.nat.Gateway, volc.eip.Address, volc.eip.Associate]] = {}
        for i, zone in enumerate(args.nat_zones):
            def legacy(old: str) -> list[pulumi.Alias]:
                return [pulumi.Alias(name=old)] if i == 0 else []

            nat = volc.nat.Gateway(
                f"{name}-nat-{zone}",
                nat_gateway_name=f"{name}-nat-{zone}",
                vpc_id=vpc.id,
                # the NAT gateway lives in its own zone: in that zone's node subnet
                subnet_id=node_subnet_by_zone[zone].id,
                spec=args.nat_spec,
                billing_type="PostPaid",
                project_name=args.project_name,
                tags=tag_list(args.tags),
                opts=child(self, aliases=legacy(f"{name}-nat")),
            )
            eip = volc.eip.Address(
                f"{name}-nat-eip-{zone}",
                name=f"{name}-nat-eip-{zone}",
                bandwidth=args.egress_bandwidth_mbps,
                billing_type="PostPaidByTraffic",
                isp="BGP",
                project_name=args.project_name,
                tags=tag_list(args.tags),
                opts=child(self, aliases=legacy(f"{name}-nat-eip")),
            )
            assoc = volc.eip.Associate(
                f"{name}-nat-eip-assoc-{zone}",
                allocation_id=eip.id,
                instance_id=nat.id,
                instance_type="Nat",
                opts=child(self, aliases=legacy(f"{name}-nat-eip-assoc")),
            )
            nats[zone] = (nat, eip, assoc)
            self.nat_gateway_ids[zone] = nat.id
            self.egress_ips[zone] = eip.eip_address

        # Each subnet's egress: SNAT on its own zone's NAT gateway (the first zone's when shared).
        subnets_by_zone = {z: [node_subnet_by_zone[z], *([pod_subnet_by_zone[z]] if z in pod_subnet_by_zone else [])]
                           for z in args.node_subnets}
        for zone, subnets in subnets_by_zone.items():
            nat, eip, assoc = nats[zone] if zone in nats else nats[args.nat_zones[0]]
            for subnet in subnets:
                volc.nat.SnatEntry(
                    f"{subnet._name}-snat",
                    snat_entry_name=f"{subnet._name}-snat",
                    nat_gateway_id=nat.id,
                    subnet_id=subnet.id,
                    eip_id=eip.id,
                    opts=child(self, depends_on=[assoc]),
                )
        if args.per_zone_routes:
            # The VPC's system route table sends 0.0.0.0/0 to one NAT gateway; each zone's
            # subnets get a route table of their own whose default route is their zone's.
            for zone, subnets in subnets_by_zone.items():
                nat, _, assoc = nats[zone]
                table = volc.vpc.RouteTable(
                    f"{name}-routes-{zone}",
                    route_table_name=f"{name}-routes-{zone}",
                    description=f"egress of {zone} through its own NAT gateway",
                    vpc_id=vpc.id,
                    project_name=args.project_name,
                    tags=tag_list(args.tags),
                    opts=child(self),
                )
                volc.vpc.RouteEntry(
                    f"{name}-routes-{zone}-default",
                    route_entry_name=f"{name}-default-{zone}",
                    description=f"internet egress through the NAT gateway of {zone}",
                    route_table_id=table.id,
                    destination_cidr_block="0.0.0.0/0",
                    next_hop_type="NatGW",
                    next_hop_id=nat.id,
                    opts=child(self, depends_on=[assoc]),
                )
                for subnet in subnets:
                    volc.vpc.RouteTableAssociate(
                        f"{subnet._name}-routes",
                        route_table_id=table.id,
                        subnet_id=subnet.id,
                        opts=child(self),
                    )

        self.vpc_id = vpc.id
        self.node_subnet_ids = pulumi.Output.all(*[s.id for s in node_subnets])
        self.pod_subnet_ids = pulumi.Output.all(*[s.id for s in pod_subnets])
        self.node_security_group_id = sg.id
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "node_subnet_ids": self.node_subnet_ids,
                "pod_subnet_ids": self.pod_subnet_ids,
                "node_security_group_id": self.node_security_group_id,
                "nat_gateway_ids": self.nat_gateway_ids,
                "egress_ips": self.egress_ips,
            }
        )
