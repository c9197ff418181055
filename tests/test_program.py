"""The real program under Pulumi's mock engine, one run per stack, asserted against the
values in the stack's settings. `runs` previews new stacks (computed outputs unknown), as
the first `pulumi preview` does; `existing` runs against stacks whose resources exist."""

from __future__ import annotations

import json

import pytest

from dsvolc import engine
from stacks import load, read_raw
from stacks.plan import build_plan

STACKS = ["dev", "staging", "prod"]


@pytest.fixture(scope="module")
def existing() -> dict[str, engine.Recording]:
    """The stacks as deployed: every resource (deploy phase 2), computed outputs known."""
    return {s: engine.run(s, read_raw(s), mode="existing") for s in STACKS}


@pytest.fixture(scope="module")
def runs(existing) -> dict[str, engine.Recording]:
    return existing


@pytest.fixture(scope="module")
def new() -> dict[str, engine.Recording]:
    """Each stack's first `pulumi up`: deploy phase 1, computed outputs unknown."""
    return {s: engine.run(s, read_raw(s), mode="new") for s in STACKS}


def of(rec: engine.Recording, short: str) -> list[engine.Recorded]:
    return [r for r in rec.resources if r.type.endswith(short)]


@pytest.mark.parametrize("stack", STACKS)
def test_one_subnet_per_zone_inside_the_vpc(runs, stack):
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    vpc = of(rec, "vpc/vpc:Vpc")[0]
    assert vpc.inputs["cidrBlock"] == str(s.network.vpc_cidr)
    node = {r.inputs["zoneId"]: r.inputs["cidrBlock"] for r in of(rec, "vpc/subnet:Subnet") if "-nodes-" in r.name}
    assert node == {z: str(c) for z, c in p.network.node_subnets.items()}
    pods = {r.inputs["zoneId"] for r in of(rec, "vpc/subnet:Subnet") if "-pods-" in r.name}
    assert pods == set(s.zones)  # VPC-CNI in every shipped stack


def _dep(r: engine.Recorded, among: dict[str, engine.Recorded]) -> engine.Recorded:
    (found,) = [among[d] for d in r.dependencies if d in among]
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_egress_through_the_nat_gateway_of_each_zone(runs, stack):
    """per_zone (staging, prod): a NAT gateway in each zone's node subnet, every subnet
    SNATs and routes 0.0.0.0/0 through its own zone's; shared (dev): one NAT gateway in the
    first zone for every subnet, through the VPC's system route table."""
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    subnets = {r.urn: r for r in of(rec, "vpc/subnet:Subnet")}
    nats = {r.urn: r for r in of(rec, "nat/gateway:Gateway")}
    nat_zone = {u: _dep(n, subnets).inputs["zoneId"] for u, n in nats.items()}
    assert all("-nodes-" in _dep(n, subnets).name for n in nats.values())
    assert sorted(nat_zone.values()) == sorted(p.network.nat_zones)
    assert len(nats) == (len(s.zones) if stack != "dev" else 1)
    assert {n.inputs["spec"] for n in nats.values()} == {s.network.nat_spec}
    egress_zone = (lambda z: z) if p.network.nat_mode == "per_zone" else (lambda z: s.zones[0])

    snat = of(rec, "nat/snatEntry:SnatEntry")
    assert len(snat) == len(subnets)
    for e in snat:
        subnet = _dep(e, subnets)
        assert nat_zone[_dep(e, nats).urn] == egress_zone(subnet.inputs["zoneId"]), e.name

    tables = {r.urn: r for r in of(rec, "vpc/routeTable:RouteTable")}
    routes = of(rec, "vpc/routeEntry:RouteEntry")
    associations = of(rec, "vpc/routeTableAssociate:RouteTableAssociate")
    if p.network.nat_mode == "shared":
        assert tables == {} and routes == [] and associations == []
    else:
        default = {}
        for r in routes:
            assert r.inputs["destinationCidrBlock"] == "0.0.0.0/0" and r.inputs["nextHopType"] == "NatGW"
            default[_dep(r, tables).urn] = nat_zone[_dep(r, nats).urn]
        assert len(associations) == len(subnets)
        for a in associations:
            assert default[_dep(a, tables).urn] == _dep(a, subnets).inputs["zoneId"], a.name

    eips = of(rec, "eip/address:Address")
    assert {e.inputs["bandwidth"] for e in eips} == {s.network.egress_bandwidth_mbps}
    assert {a.inputs["instanceType"] for a in of(rec, "eip/associate:Associate")} == {"Nat"}
    # one egress address per NAT zone, exported for allow-lists
    ips = rec.outputs["egress_ips"]
    assert sorted(ips) == sorted(p.network.nat_zones) and len(set(ips.values())) == len(ips) == len(eips)


@pytest.mark.parametrize("stack", STACKS)
def test_first_zone_nat_keeps_its_single_nat_name(new, stack):
    """The first zone's NAT gateway, EIP and association are aliased to the names the
    stack's one NAT gateway had, so moving to per-zone egress keeps that EIP (and the
    address allow-lists hold)."""
    rec = new[stack]
    first = load(stack).zones[0]
    prefix = f"deepseek-{stack}"
    for suffix in ("nat", "nat-eip", "nat-eip-assoc"):
        r = rec.named(f"{prefix}-{suffix}-{first}")
        assert r.aliases == [f"{prefix}-{suffix}"]
    assert all(not r.aliases for r in of(rec, "nat/gateway:Gateway") if not r.name.endswith(first))


@pytest.mark.parametrize("stack", STACKS)
def test_no_public_ingress(runs, stack):
    s = load(stack)
    for rule in of(runs[stack], "vpc/securityGroupRule:SecurityGroupRule"):
        if rule.inputs["direction"] == "ingress":
            assert rule.inputs["cidrIp"] == str(s.network.vpc_cidr)


@pytest.mark.parametrize("stack", STACKS)
def test_cluster_settings(runs, stack):
    s = load(stack)
    cluster = of(runs[stack], "vke/cluster:Cluster")[0].inputs
    assert cluster["kubernetesVersion"] == s.cluster.kubernetes_version
    assert cluster["clusterConfig"]["apiServerPublicAccessEnabled"] is s.cluster.api_server_public
    assert cluster["deleteProtectionEnabled"] is s.cluster.delete_protection
    assert cluster["podsConfig"]["podNetworkMode"] == s.cluster.pod_network_mode
    assert all(x["enabled"] for x in cluster["loggingConfig"]["logSetups"]) is s.cluster.control_plane_logging


def test_prod_api_server_is_private_and_protected(runs):
    cluster = of(runs["prod"], "vke/cluster:Cluster")[0].inputs
    assert cluster["clusterConfig"]["apiServerPublicAccessEnabled"] is False
    assert cluster["deleteProtectionEnabled"] is True


@pytest.mark.parametrize("stack", STACKS)
def test_gpu_pools_follow_the_map(runs, stack):
    s = load(stack)
    p = build_plan(s)
    pools = {r.name.rsplit("-gpu-", 1)[1]: r.inputs for r in of(runs[stack], "vke/nodePool:NodePool") if "-gpu-" in r.name}
    assert set(pools) == set(s.cluster.gpu_pools)
    for name, pool in s.cluster.gpu_pools.items():
        got = pools[name]
        gpu, per_node = p.pools[name].gpu, p.pools[name].gpus_per_node
        assert got["nodeConfig"]["instanceTypeIds"] == [pool.instance_type]
        assert got["autoScaling"]["minReplicas"] == pool.min_nodes
        assert got["autoScaling"]["maxReplicas"] == pool.max_nodes
        assert got["kubernetesConfig"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        labels = {x["key"]: x["value"] for x in got["kubernetesConfig"]["labels"]}
        assert labels["deepseek-volc/gpu-model"] == gpu and labels["deepseek-volc/gpus-per-node"] == str(per_node)
        kubelet = got["kubernetesConfig"]["kubeletConfig"]
        assert kubelet == {"topologyManagerPolicy": p.pools[name].topology_policy, "topologyManagerScope": "container"}
        assert got["nodeConfig"]["dataVolumes"][0]["size"] == pool.data_disk_gib
        assert got["nodeConfig"]["dataVolumes"][0]["type"] == pool.data_disk_type
        assert len(got["nodeConfig"]["subnetIds"]) == len(p.pools[name].zones)
    system = next(r.inputs for r in of(runs[stack], "vke/nodePool:NodePool") if r.name.endswith("-system"))
    assert "taints" not in system["kubernetesConfig"]
    assert system["autoScaling"]["minReplicas"] == s.cluster.system_pool.min_nodes


@pytest.mark.parametrize("stack", STACKS)
def test_bucket_is_private_encrypted_versioned(runs, stack):
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    bucket = of(rec, "tos/bucket:Bucket")[0].inputs
    assert bucket["bucketName"] == p.names.bucket
    assert bucket["publicAcl"] == "private" and bucket["enableVersion"] is True
    enc = of(rec, "tos/bucketEncryption:BucketEncryption")[0].inputs
    assert enc["rule"]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == s.weights.sse_algorithm
    life = of(rec, "tos/bucketLifecycle:BucketLifecycle")[0].inputs["rules"][0]
    assert life["nonCurrentVersionExpiration"]["nonCurrentDays"] == s.weights.noncurrent_version_days


@pytest.mark.parametrize("stack", STACKS)
def test_reader_policy_is_least_privilege(runs, stack):
    s = load(stack)
    p = build_plan(s)
    doc = json.loads(of(runs[stack], "iam/policy:Policy")[0].inputs["policyDocument"])
    by_action = {a: st for st in doc["Statement"] for a in st["Action"]}
    assert set(by_action) == {"tos:GetObject", "tos:ListBucket"}
    assert by_action["tos:GetObject"]["Resource"] == [f"trn:tos:::{p.names.bucket}/{s.weights.prefix}/*"]
    listing = by_action["tos:ListBucket"]
    assert listing["Resource"] == [f"trn:tos:::{p.names.bucket}"]
    assert listing["Condition"] == {"StringLike": {"tos:prefix": [f"{s.weights.prefix}/*"]}}
    assert all(st["Effect"] == "Allow" for st in doc["Statement"])


@pytest.mark.parametrize("stack", STACKS)
def test_reader_role_trusts_only_the_serving_service_account(existing, stack):
    s = load(stack)
    rec = existing[stack]
    role = of(rec, "iam/role:Role")[0].inputs
    trust = json.loads(role["trustPolicyDocument"])["Statement"][0]
    assert trust["Action"] == ["sts:AssumeRoleWithOIDC"]
    # and the pre-warm's, which syncs the same weights under its own identity
    assert trust["Condition"]["StringEquals"]["oidc:sub"] == [
        f"system:serviceaccount:{s.serving.namespace}:{s.serving.service_account}",
        f"system:serviceaccount:{s.serving.namespace}:{s.serving.name}-prewarm"]
    attach = of(rec, "iam/rolePolicyAttachment:RolePolicyAttachment")[0].inputs
    policy = of(rec, "iam/policy:Policy")[0].inputs
    assert attach["roleName"] == role["roleName"] and attach["policyName"] == policy["policyName"]


@pytest.mark.parametrize("stack", STACKS)
def test_edge_routes_to_the_in_cluster_entry(runs, stack):
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    upstreams = of(rec, "apig/apigUpstream:ApigUpstream")
    assert [u.inputs["upstreamSpec"]["k8sService"]["name"] for u in upstreams] == [
        u.service for u in p.edge.upstreams]
    routes = {r.name.rsplit("-", 1)[1]: r.inputs for r in of(rec, "apig/apigRoute:ApigRoute")}
    assert sum(u["weight"] for u in routes["default"]["upstreamLists"]) == 10000
    header = routes["ab"]["matchRule"]["headers"][0]
    assert header == {"key": s.gateway.ab_header.name,
                      "value": {"matchType": "Exact", "matchContent": s.gateway.ab_header.value}}


def test_edge_splits_by_weight_without_the_in_cluster_gateway():
    raw = json.loads(json.dumps(read_raw("staging")))
    raw["serving"]["in_cluster_gateway"] = False
    raw.setdefault("gateway", {})["canary_weight"] = 10
    rec = engine.run("staging", raw, mode="existing")
    route = next(r.inputs for r in rec.resources if r.name.endswith("-route-default"))
    weights = [u["weight"] for u in route["upstreamLists"]]
    w = raw["gateway"]["canary_weight"]
    assert weights == [(100 - w) * 100, w * 100]


@pytest.mark.parametrize("stack", STACKS)
def test_registry_and_vmp(runs, stack):
    s = load(stack)
    rec = runs[stack]
    repo = of(rec, "cr/repository:Repository")[0].inputs
    assert repo["name"] == s.registry.repository and repo["accessLevel"] == "Private"
    assert bool(of(rec, "vmp/workspace:Workspace")) is s.observability.vmp_enabled


@pytest.mark.parametrize("stack", STACKS)
def test_every_cloud_resource_has_a_component_parent(runs, stack):
    rec = runs[stack]
    components = {r.urn for r in rec.resources if not r.custom}
    for r in rec.resources:
        if r.custom and not r.type.startswith("pulumi:providers:"):
            assert r.parent in components, r.name


@pytest.mark.parametrize("stack", STACKS)
def test_secrets_are_masked(existing, stack):
    k8s_provider = next(r for r in existing[stack].resources if r.type == "pulumi:providers:kubernetes")
    assert k8s_provider.inputs["kubeconfig"] == engine.MASK
    assert k8s_provider.raw_inputs["kubeconfig"] not in (engine.MASK, engine.UNKNOWN)


# --------------------------------------------------------------------------- deploy credentials


def test_rotation_windows_count_from_the_epoch():
    from infra.cluster import rotation_window

    assert rotation_window(0, 24) == rotation_window(86399, 24) == "1970-01-01T00:00Z"
    assert rotation_window(86400, 24) == "1970-01-02T00:00Z"
    assert rotation_window(7 * 3600, 6) == "1970-01-01T06:00Z"


@pytest.mark.parametrize("stack", STACKS)
def test_deploy_kubeconfig_is_short_lived_secret_and_not_exported(existing, stack):
    s = load(stack)
    rec = existing[stack]
    (kc,) = of(rec, "vke/kubeconfig:Kubeconfig")
    assert kc.inputs["validDuration"] == s.cluster.deploy_kubeconfig.valid_hours
    assert kc.inputs["type"] == ("Public" if s.cluster.api_server_public else "Private")
    assert kc.replacement_trigger is not None
    assert "kubeconfig" not in rec.outputs  # operators get their own (docs/deploy.md)
    provider = next(r for r in rec.resources if r.type == "pulumi:providers:kubernetes")
    # the rotated kubeconfig updates the provider; only another cluster would replace it
    assert provider.inputs["clusterIdentifier"] == of(rec, "vke/cluster:Cluster")[0].id


def test_pulumi_up_in_a_new_window_replaces_the_kubeconfig(monkeypatch):
    """Two updates in one rotation window register the same trigger; the first update of the
    next window a new one (the engine replaces the kubeconfig, create before delete)."""
    import infra.cluster

    run = getattr(engine.run, "__wrapped__", engine.run)  # unshared: each run reads the clock
    hours = load("dev").cluster.deploy_kubeconfig.rotate_hours
    start = 1_800_000_000 // (hours * 3600) * (hours * 3600)
    seen = {}
    for label, at in (("start", start), ("later", start + hours * 3600 - 60), ("next", start + hours * 3600)):
        monkeypatch.setattr(infra.cluster, "CLOCK", lambda at=at: at)
        (kc,) = of(run("dev", read_raw("dev"), mode="existing"), "vke/kubeconfig:Kubeconfig")
        seen[label] = (kc.urn, kc.replacement_trigger, kc.inputs["validDuration"])
    assert seen["start"] == seen["later"]
    assert seen["next"][0] == seen["start"][0] and seen["next"][1] != seen["start"][1]
    assert seen["next"][1] == infra.cluster.rotation_window(start + hours * 3600, hours)


def test_runs_do_not_leak_into_each_other(runs):
    engine.run.__wrapped__("prod", read_raw("prod"), mode="existing")  # another stack in between
    again = getattr(engine.run, "__wrapped__", engine.run)("dev", read_raw("dev"), mode="existing")
    assert sorted(r.urn for r in again.resources) == sorted(r.urn for r in runs["dev"].resources)


# --------------------------------------------------------------------------- node pools, add-ons


def _deps(rec: engine.Recording, r: engine.Recorded) -> set[str]:
    names = {x.urn: x.name for x in rec.resources}
    return {names[d] for d in r.dependencies if d in names}


@pytest.mark.parametrize("stack", STACKS)
def test_cluster_autoscaler_is_managed_and_comes_before_every_pool(runs, stack):
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    addons = {r.inputs["name"]: r for r in of(rec, "vke/addon:Addon")}
    ca = addons["cluster-autoscaler"]
    assert ca.inputs["deployMode"] == "Managed" and "deployNodeType" not in ca.inputs
    pools = of(rec, "vke/nodePool:NodePool")
    assert len(pools) == 1 + len(s.cluster.gpu_pools)
    for pool in pools:
        assert pool.inputs["autoScaling"]["enabled"] is True
        assert ca.name in _deps(rec, pool), pool.name
    for name, a in addons.items():
        if name != "cluster-autoscaler":
            assert a.inputs["deployMode"] == "Unmanaged" and a.inputs["deployNodeType"] == "Node"
            assert f"{p.names.prefix}-system" in _deps(rec, a)


@pytest.mark.parametrize("stack", STACKS)
def test_addon_versions_are_the_pinned_ones(runs, stack):
    s = load(stack)
    p = build_plan(s)
    got = {r.inputs["name"]: r.inputs.get("version") for r in of(runs[stack], "vke/addon:Addon")}
    assert got == {a.name: a.version for a in p.addons}
    assert got["nvidia-device-plugin"] == "v1.1.4"  # VKE changelog, docs 6460/350800


def test_addon_version_setting_pins_an_unpinned_addon():
    raw = json.loads(json.dumps(read_raw("dev")))
    raw["cluster"]["addon_versions"] = {"metrics-server": "v0.7.1"}
    rec = engine.run("dev", raw)
    got = {r.inputs["name"]: r.inputs.get("version") for r in of(rec, "vke/addon:Addon")}
    assert got["metrics-server"] == "v0.7.1"


def test_rdma_device_plugin_only_where_a_replica_spans_nodes(runs):
    names = {s: {r.inputs["name"] for r in of(runs[s], "vke/addon:Addon")} for s in STACKS}
    assert "rdma-device-plugin" in names["prod"]  # 2 H20 nodes per replica over RDMA
    assert "rdma-device-plugin" not in names["staging"] | names["dev"]
    rdma = next(r for r in of(runs["prod"], "vke/addon:Addon") if r.inputs["name"] == "rdma-device-plugin")
    assert rdma.inputs["version"] == "v3.5.1-vke.8"  # VKE changelog, docs 6460/1125998


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_hpc_pool_is_single_zone_inside_an_hpc_cluster_of_that_zone(new, stack):
    s = load(stack)
    p = build_plan(s)
    rec = new[stack]
    (pool_name,) = s.cluster.gpu_pools
    hpc = of(rec, "ecs/hpcCluster:HpcCluster")
    assert len(hpc) == 1 and hpc[0].inputs["zoneId"] == list(p.pools[pool_name].zones)[0]
    pool = next(r for r in of(rec, "vke/nodePool:NodePool") if r.name.endswith(f"-gpu-{pool_name}"))
    assert len(pool.inputs["nodeConfig"]["subnetIds"]) == 1
    assert pool.inputs["nodeConfig"]["hpcClusterIds"] == [engine.UNKNOWN_SHOWN]  # the new cluster's id
    assert hpc[0].name in _deps(rec, pool)


def test_named_hpc_cluster_is_used_not_created():
    raw = json.loads(json.dumps(read_raw("staging")))
    raw["cluster"]["gpu_pools"]["a100"]["hpc_cluster_id"] = "hpcCluster-existing01"
    rec = engine.run("staging", raw)
    assert not of(rec, "ecs/hpcCluster:HpcCluster")
    pool = next(r for r in of(rec, "vke/nodePool:NodePool") if r.name.endswith("-gpu-a100"))
    assert pool.inputs["nodeConfig"]["hpcClusterIds"] == ["hpcCluster-existing01"]


def test_dev_pool_is_not_in_an_hpc_cluster(runs):
    assert not of(runs["dev"], "ecs/hpcCluster:HpcCluster")
    pool = next(r for r in of(runs["dev"], "vke/nodePool:NodePool") if "-gpu-" in r.name)
    assert "hpcClusterIds" not in pool.inputs["nodeConfig"]


# --------------------------------------------------------------------------- a new stack


def _walk(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk(x)
    else:
        yield v


@pytest.mark.parametrize("stack", STACKS)
def test_new_stack_leaves_computed_outputs_unknown(new, stack):
    rec = new[stack]
    cluster = of(rec, "vke/cluster:Cluster")[0]
    assert cluster.id is None  # the engine has not created it
    pool = next(r for r in of(rec, "vke/nodePool:NodePool") if "-gpu-" in r.name)
    assert pool.raw_inputs["clusterId"] == engine.UNKNOWN
    # no invented kubeconfig: nothing talks to a cluster that does not exist yet (phase 1)
    assert not [r for r in rec.resources if r.type.startswith(("kubernetes:", "pulumi:providers:kubernetes"))]


@pytest.mark.parametrize("stack", STACKS)
def test_new_stack_formats_no_unknown_into_a_string(new, stack):
    for r in new[stack].resources:
        for v in _walk(r.raw_inputs):
            if isinstance(v, str) and v != engine.UNKNOWN:
                assert engine.UNKNOWN not in v and "Output[" not in v and "Calling __str__" not in v, r.name


@pytest.mark.parametrize("stack", STACKS)
def test_no_role_without_an_oidc_provider(new, existing, stack):
    # New stack: VKE has no OIDC provider before IRSA is on, so no reader role yet (never
    # one whose trust names an empty principal); once the provider exists, the role does.
    assert not of(new[stack], "iam/role:Role")
    assert not of(new[stack], "iam/rolePolicyAttachment:RolePolicyAttachment")
    (role,) = of(existing[stack], "iam/role:Role")
    principals = json.loads(role.inputs["trustPolicyDocument"])["Statement"][0]["Principal"]["Federated"]
    assert principals and all(p.startswith("trn:iam::") and ":oidc-provider/vke-" in p for p in principals)


@pytest.mark.parametrize("stack", STACKS)
def test_pulumi_leaves_to_the_controllers_what_they_own(runs, stack):
    """Registered with ignore_changes: the replica count of whatever KEDA scales, and, where
    Argo Rollouts runs the canary, the weights of the HTTPRoute it moves, so `pulumi up`
    during a rollout or a scale-out does not reset them."""
    s = load(stack)
    p = build_plan(s)
    rec = runs[stack]
    route = next(r for r in rec.resources if r.inputs.get("kind") == "HTTPRoute")
    if p.rollout.argo:
        assert route.ignore_changes == ["spec.rules[*].backendRefs[*].weight"]
    else:
        assert route.ignore_changes == []
    scaled = next(r for r in rec.resources if r.inputs.get("kind") == "ScaledObject")
    target = scaled.inputs["spec"]["scaleTargetRef"]
    owner = next(r for r in rec.resources if r.inputs.get("kind", r.type.rsplit(":", 1)[-1]) == target["kind"]
                 and r.inputs["metadata"]["name"] == target["name"] and "metadata" in r.inputs)
    assert owner.ignore_changes == ["spec.replicas"]
    # argo-rollouts is installed only where a stack runs its canaries
    releases = {r.inputs["name"] for r in rec.resources if r.type == "kubernetes:helm.sh/v3:Release"}
    assert ("argo-rollouts" in releases) == p.rollout.argo
