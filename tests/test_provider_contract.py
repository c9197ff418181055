"""The provider contract (stacks/provider_contract.yaml): every VolcEngine resource the
program registers, for every shipped stack and the settings branches they do not take,
passes it; every argument the program sets has an entry; the checker refuses values the
provider refuses; the settings draw their accepted values from it."""

from __future__ import annotations

import copy
import re
import typing

import pulumi
import pytest
from pulumi.runtime import rpc

from dsvolc import engine
from stacks import SettingsError, contract, parse, read_raw, shipped_stacks
from stacks.docs import DOC_PAGE, section
from stacks.settings import (
    GatewaySettings,
    GpuPoolSettings,
    NetworkSettings,
    ClusterSettings,
    SystemPoolSettings,
    WeightsSettings,
)

STACKS = shipped_stacks()  # dev, staging, prod and the examples
C = contract.load()


def _set(raw: dict, path: str, value) -> dict:
    node = raw
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return raw


def variant(stack: str, **changes) -> dict:
    raw = copy.deepcopy(read_raw(stack))
    for path, value in changes.items():
        _set(raw, path.replace("__", "."), value)
    return raw


# The longest stack name the settings accept and the longest value they accept for every
# name a stack may choose, found by asking the settings: every cloud name derived from them
# must still pass the API's rules.
NAMED = ("cluster.name", "registry.name", "registry.namespace", "registry.mirror_namespace",
         "registry.repository", "weights.bucket_name")
POOL = "<serving GPU pool>"
STACK = "<stack>"


def _sized(n: int, fill: str) -> str:
    return "a" + fill * (n - 2) + "z"


def _with_names(names: dict[str, str], stack: str = "prod", **changes) -> tuple[str, dict]:
    """(stack name, settings) of `stack` with `names` set: POOL renames its serving GPU pool."""
    raw = variant(stack, **changes)
    pool = names.get(POOL)
    if pool:
        pools = raw["cluster"]["gpu_pools"]
        pools[pool] = pools.pop(raw["serving"]["gpu_pool"])
        raw["serving"]["gpu_pool"] = pool
    for path, value in names.items():
        if path not in (POOL, STACK):
            _set(raw, path, value)
    return names.get(STACK, stack), raw


def _accepted(names: dict[str, str]) -> bool:
    stack, raw = _with_names(names)
    try:
        parse(raw, stack=stack)
    except SettingsError:
        return False
    return True


def _longest_accepted() -> dict[str, str]:
    """The longest value of each name the settings accept (the others at their longest too)."""
    out: dict[str, str] = {}
    for i, key in enumerate((STACK, POOL, *NAMED)):
        lo, hi = 3, 256  # lo is accepted, hi is not
        assert _accepted({**out, key: _sized(lo, "x")}) and not _accepted({**out, key: _sized(hi, "x")}), key
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _accepted({**out, key: _sized(mid, "x")}) else (lo, mid)
        out[key] = _sized(lo, "bcdefghijk"[i])
    return out


LONGEST = _longest_accepted()


# The shipped stacks, and the branches of the program they do not take (each sets arguments
# the shipped stacks never do), in both engine modes.
RUNS = {
    **{f"{s}:new": (s, read_raw(s), "new") for s in STACKS},
    **{f"{s}:existing": (s, read_raw(s), "existing") for s in STACKS},
    "dev:static-key": ("dev", variant("dev", cluster__irsa=False), "existing"),
    "dev:flannel": ("dev", variant("dev", cluster__pod_network_mode="Flannel"), "new"),
    "dev:public-api-ssh": ("dev", variant("dev", cluster__api_server_public=True,
                                          cluster__ssh_key_pair="ops-key"), "new"),
    "dev:kms": ("dev", variant("dev", weights__sse_algorithm="kms",
                               weights__kms_key_id="trn:kms:cn-beijing:2100000000:keyrings/ring/keys/key"), "new"),
    "staging:named-hpc": ("staging", variant("staging", cluster__gpu_pools__a100__hpc_cluster_id="hpcCluster-x1"),
                          "new"),
    "staging:no-in-cluster-gateway": ("staging", variant("staging", serving__in_cluster_gateway=False), "new"),
    # the edge splits itself: its routes carry a total timeout, and a per-try timer when one is set
    "staging:edge-only-routes": ("staging", variant("staging", serving__in_cluster_gateway=False,
                                                    gateway__retry__per_try_timeout_seconds=30), "existing"),
    "prod:remedy-policy": ("prod", variant("prod", cluster__gpu_pools__h20__auto_repair__remedy_policy_id="rp-x1"),
                           "new"),
    # a weights prefix has no length limit of its own: no derived string may grow with it
    "dev:long-prefix": ("dev", variant("dev", weights__prefix="models/" + "deepseek-ai/" * 12 + "v3"), "existing"),
    "longest-names:new": (*_with_names(LONGEST), "new"),
    "longest-names:existing": (*_with_names(LONGEST), "existing"),
    "longest-names:static-key": (*_with_names(LONGEST, cluster__irsa=False), "existing"),
}


@pytest.fixture(scope="module")
def recordings() -> dict[str, engine.Recording]:
    return {k: engine.run(stack, raw, mode=mode) for k, (stack, raw, mode) in RUNS.items()}


def volcengine(rec: engine.Recording) -> list[engine.Recorded]:
    return [r for r in rec.resources if r.type.startswith("volcengine:")]


# --------------------------------------------------------------------------- (a) (b)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_registered_volcengine_resource_passes_the_contract(recordings, run):
    rec = recordings[run]
    violations = [str(v) for r in volcengine(rec) for v in C.check(r.type, r.name, r.raw_inputs)]
    assert violations == []
    assert len(volcengine(rec)) >= 25


def test_the_longest_names_reach_what_the_api_takes():
    """The longest names run above are long: the settings stop each name where a name derived
    from it would break an API rule (stacks/names.py), not far short of it."""
    lengths = {k: len(v) for k, v in LONGEST.items()}
    assert lengths == {STACK: 20, POOL: 23, "cluster.name": 40, "registry.name": 30, "registry.namespace": 40,
                       "registry.mirror_namespace": 40, "registry.repository": 40, "weights.bucket_name": 57}
    rec = next(iter(r for r in volcengine(engine.run(*_with_names(LONGEST), mode="existing"))
                    if r.type == "volcengine:iam/role:Role"))
    assert len(rec.raw_inputs["roleName"]) == 64  # IAM's limit, reached


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_argument_the_program_sets_has_an_entry(recordings, run):
    rec = recordings[run]
    types = {r.type for r in volcengine(rec)}
    assert types <= set(C.arguments), types - set(C.arguments)
    gaps = {f"{r.type} {path}" for r in volcengine(rec) for path in C.uncovered(r.type, r.raw_inputs)}
    assert gaps == set()


def test_every_entry_is_an_argument_the_program_sets(recordings):
    """No entry for an argument the program never sets: the contract says what the
    program relies on, not the provider's whole schema."""
    used = {(r.type, C.entry(r.type, path).path if C.entry(r.type, path) else path)
            for rec in recordings.values() for r in volcengine(rec) for path, _ in contract.leaves(r.raw_inputs)}
    unused = [f"{t} {p}" for t, args in C.arguments.items() for p in args if (t, p) not in used]
    assert unused == []


def test_new_stack_values_left_to_the_provider_are_unknown_not_judged(recordings):
    pool = next(r for r in volcengine(recordings["prod:new"]) if r.name.endswith("-gpu-h20"))
    assert pool.raw_inputs["clusterId"] == contract.UNKNOWN == rpc.UNKNOWN
    assert C.problems("volcengine:vke/nodePool:NodePool", "clusterId", contract.UNKNOWN) == []


# --------------------------------------------------------------------------- (c)


def _with(inputs: dict, path: str, value) -> dict:
    """`inputs` with the argument at `path` (`a.b[].c`: every item of the list) set to `value`."""
    out = copy.deepcopy(inputs)

    def put(node, parts):
        head, *rest = parts
        if head.endswith("[]"):
            for item in node[head[:-2]]:
                put(item, rest)
        elif rest:
            put(node.setdefault(head, {}), rest)
        else:
            node[head] = value

    put(out, path.split("."))
    return out


INJECTED = [
    # (resource name suffix in prod, path, bad value, words of the refusal)
    ("-gpu-h20", "kubernetesConfig.kubeletConfig.topologyManagerScope", "pod", "expected one of container"),
    ("-gpu-h20", "kubernetesConfig.kubeletConfig.topologyManagerPolicy", "numa-aware", "single-numa-node"),
    ("-gpu-h20", "nodeConfig.dataVolumes[].type", "ESSD_PL2", "expected one of PTSSD, ESSD_PL0, ESSD_FlexPL"),
    ("-gpu-h20", "nodeConfig.dataVolumes[].size", 40000, "expected 20..32768"),
    ("-gpu-h20", "nodeConfig.dataVolumes[].mountPoint", "mnt/model-cache", "does not match"),
    ("-gpu-h20", "nodeConfig.hpcClusterIds", ["hpc-a", "hpc-b"], "2 items; expected exactly 1 item"),
    ("-gpu-h20", "autoScaling.maxReplicas", 5000, "expected 1..2000"),
    ("-gpu-h20", "autoScaling.subnetPolicy", "Spread", "ZoneBalance, Priority"),
    ("-gpu-h20", "nodeConfig.systemVolume.size", 10, "expected 20..2048"),
    ("-gpu-h20", "kubernetesConfig.cordon", "false", "expected a boolean"),
    ("-system", "nodeConfig.instanceChargeType", "Spot", "PostPaid, PrePaid"),
    ("-addon-cluster-autoscaler", "deployMode", "Hosted", "Managed, Unmanaged"),
    ("-kubeconfig", "validDuration", 50000, "expected 1..43800"),
    ("-kubeconfig", "type", "Internal", "Public, Private"),
    ("-vke", "loggingConfig.logSetups[].logTtl", 0, "expected 1..3650"),
    ("-vke", "podsConfig.podNetworkMode", "Calico", "Flannel, VpcCniShared"),
    ("-vpc", "cidrBlock", "8.8.0.0/16", "outside 10.0.0.0/8"),
    ("-vpc", "cidrBlock", "10.0.0.0/40", "not a CIDR block"),
    ("-nat-cn-beijing-a", "spec", "Extra_Large_1", "Small, Medium, Large"),
    ("-routes-cn-beijing-b-default", "nextHopType", "Nat", "NatGW"),
    ("-vke", "servicesConfig.serviceCidrsv4s", ["8.8.0.0/16"], "outside 10.0.0.0/12"),
    ("-pods-cn-beijing-c", "cidrBlock", "10.30.160.0/30", "accepted masks are /8 to /29"),
    ("-nodes-ingress-vpc", "priority", 101, "expected 1..100"),
    ("-nodes-ingress-vpc", "protocol", "sctp", "tcp, udp, icmp, all, icmpv6"),
    ("-nat-eip-cn-beijing-c", "billingType", "Free", "PostPaidByTraffic"),
    # traffic billing takes 1-200 Mbit/s; prod shipped 500 (the provider stopped checking)
    ("-nat-eip-cn-beijing-c", "bandwidth", 500, "with billingType PostPaidByTraffic; expected 1..200"),
    # CreateSecurityGroup / CreateHpcCluster character sets: no colon, no space in an HPC description
    ("-nodes-sg", "description", "VKE nodes: in-VPC ingress only", "does not match"),
    # names and descriptions: character sets and lengths the API documents
    ("-vpc", "vpcName", "-vpc", "does not match"),
    ("-vke", "name", "deepseek_prod", "does not match"),
    ("-gpu-h20", "name", "p" * 65, "does not match"),
    ("-registry", "name", "deepseek-prod-registry-instance", "does not match"),  # 31 > 30
    ("-read-policy", "policyName", "r" * 65, "does not match"),
    ("-logs", "projectName", "DeepSeek-Logs", "does not match"),
    ("-logs", "description", "logs <and> traces", "does not match"),
    ("-nodes-ingress-vpc", "description", "", "does not match"),  # a rule's description: 1-255
    ("-service", "serviceName", "-api", "does not match"),
    ("-bucket", "publicAcl", "public", "private, public-read"),
    ("-encryption", "rule.applyServerSideEncryptionByDefault.sseAlgorithm", "AES128", "kms, AES256, SM4"),
    ("-bucket-policy", "policy", "{not json", "not a JSON document"),
    ("-read-policy", "policyDocument", "", "not a JSON document"),
    ("-repository", "accessLevel", "Internal", "Private, Public"),
    ("-apig", "resourceSpec.instanceSpecCode", "16c32g", "1c2g, 2c4g, 4c8g, 8c16g"),
    ("-route-default", "upstreamLists[].weight", 20000, "expected 0..10000"),
    ("-route-default", "advancedSetting.retryPolicySetting.httpCodes", [503], "expected a string, got 503"),
    ("-route-default", "advancedSetting.retryPolicySetting.retryOns", ["gateway-error"], "expected one of 5xx, reset"),
    ("-route-ab", "matchRule.headers[].value.matchType", "Contains", "Prefix, Exact, Regex"),
]


@pytest.fixture(scope="module")
def prod(recordings) -> engine.Recording:
    return recordings["prod:existing"]


@pytest.mark.parametrize("suffix,path,value,words", INJECTED, ids=[f"{i[0]}:{i[1]}={i[2]}" for i in INJECTED])
def test_checker_refuses_an_injected_bad_value(prod, suffix, path, value, words):
    r = next(x for x in volcengine(prod) if x.name.endswith(suffix))
    assert C.check(r.type, r.name, r.raw_inputs) == []  # as shipped
    (v,) = C.check(r.type, r.name, _with(r.raw_inputs, path, value))[:1]
    assert v.path == path and words in v.problem, str(v)
    # the refusal names where the provider says so
    assert v.source is not None and v.source.commit == C.commit and re.search(r"\.go$", v.source.file)


def test_checker_reports_an_argument_without_an_entry(prod):
    r = next(x for x in volcengine(prod) if x.name.endswith("-gpu-h20"))
    bad = _with(r.raw_inputs, "nodeConfig.imageId", "image-123")
    (v,) = C.check(r.type, r.name, bad)
    assert v.path == "nodeConfig.imageId" and "not covered" in v.problem
    assert C.uncovered(r.type, bad) == ["nodeConfig.imageId"]
    (v,) = C.check("volcengine:ecs/instance:Instance", "x", {"instanceType": "ecs.g3i.large"})
    assert "not in the provider contract" in v.problem


def test_checker_sees_what_the_engine_receives():
    """A value changed by a resource transform (a hand edit elsewhere in the program) is
    refused on the recording the engine receives."""
    def scope_pod(args: pulumi.ResourceTransformArgs):
        if args.type_ != "volcengine:vke/nodePool:NodePool" or "-gpu-" not in args.name:
            return None
        props = copy.deepcopy(dict(args.props))
        props["kubernetesConfig"]["kubeletConfig"]["topologyManagerScope"] = "pod"
        return pulumi.ResourceTransformResult(props, args.opts)

    rec = engine.run("dev", read_raw("dev"), transforms=[scope_pod])
    found = [v for r in volcengine(rec) for v in C.check(r.type, r.name, r.raw_inputs)]
    assert [(v.resource_name, v.path) for v in found] == [
        ("deepseek-dev-gpu-a10", "kubernetesConfig.kubeletConfig.topologyManagerScope")]


# --------------------------------------------------------------------------- (d)


def _literal_values(model, field: str) -> tuple:
    ann = model.model_fields[field].annotation
    args = typing.get_args(ann)
    lit = next((a for a in (ann, *args) if typing.get_origin(a) is typing.Literal), None)
    assert lit is not None, f"{model.__name__}.{field} is not a Literal"
    return typing.get_args(lit)


@pytest.mark.parametrize("model,field,rtype,path", [
    (GpuPoolSettings, "data_disk_type", "volcengine:vke/nodePool:NodePool", "nodeConfig.dataVolumes[].type"),
    (GpuPoolSettings, "topology_manager_policy", "volcengine:vke/nodePool:NodePool",
     "kubernetesConfig.kubeletConfig.topologyManagerPolicy"),
    (NetworkSettings, "nat_spec", "volcengine:nat/gateway:Gateway", "spec"),
    (ClusterSettings, "pod_network_mode", "volcengine:vke/cluster:Cluster", "podsConfig.podNetworkMode"),
    (WeightsSettings, "sse_algorithm", "volcengine:tos/bucketEncryption:BucketEncryption",
     "rule.applyServerSideEncryptionByDefault.sseAlgorithm"),
    (GatewaySettings, "instance_spec", "volcengine:apig/apigGateway:ApigGateway", "resourceSpec.instanceSpecCode"),
])
def test_settings_accept_exactly_what_the_contract_accepts(model, field, rtype, path):
    assert _literal_values(model, field) == C.choices(rtype, path)


def _bounds(model, field: str) -> tuple:
    lo = hi = None
    for m in model.model_fields[field].metadata:
        lo = getattr(m, "ge", lo) if getattr(m, "ge", None) is not None else lo
        hi = getattr(m, "le", hi) if getattr(m, "le", None) is not None else hi
    return lo, hi


@pytest.mark.parametrize("model,field,rtype,path", [
    (GpuPoolSettings, "data_disk_gib", "volcengine:vke/nodePool:NodePool", "nodeConfig.dataVolumes[].size"),
    (GpuPoolSettings, "system_disk_gib", "volcengine:vke/nodePool:NodePool", "nodeConfig.systemVolume.size"),
    (SystemPoolSettings, "system_disk_gib", "volcengine:vke/nodePool:NodePool", "nodeConfig.systemVolume.size"),
    (GpuPoolSettings, "max_nodes", "volcengine:vke/nodePool:NodePool", "autoScaling.maxReplicas"),
    (SystemPoolSettings, "max_nodes", "volcengine:vke/nodePool:NodePool", "autoScaling.maxReplicas"),
])
def test_settings_ranges_lie_inside_the_contract(model, field, rtype, path):
    lo, hi = _bounds(model, field)
    clo, chi = C.argument(rtype, path).range
    assert lo is not None and hi is not None
    assert (clo is None or lo >= clo) and (chi is None or hi <= chi), (lo, hi, clo, chi)


def test_nat_bandwidth_setting_lies_inside_the_traffic_billed_range():
    """The NAT EIPs are billed by traffic (infra/network.py); the setting's bounds are that
    billing type's range, not the provider's unchecked maximum."""
    arg = C.argument("volcengine:eip/address:Address", "bandwidth")
    lo, hi = _bounds(NetworkSettings, "egress_bandwidth_mbps")
    assert (lo, hi) == dict(arg.range_when[1])["PostPaidByTraffic"] == (1, 200)


# --------------------------------------------------------------------------- the data itself


def test_every_entry_carries_its_source():
    assert re.fullmatch(r"[0-9a-f]{40}", C.commit)
    assert C.provider["version"] == "v0.0.194" and "pulumi-volcengine 0.0.47" in C.provider["wrapped_by"]
    n = 0
    for rtype, args in C.arguments.items():
        for path, a in args.items():
            n += 1
            assert a.source.file.endswith(".go") and a.source.line > 0, (rtype, path)
            assert a.source.url.startswith(f"https://github.com/{C.provider['repository']}/blob/{C.commit}/")
            if a.one_of or a.range or a.pattern:
                assert a.enforced in ("plan", "api") or a.range is not None, (rtype, path)
    assert n >= 150


def test_unknown_sentinel_is_pulumis():
    assert contract.UNKNOWN == rpc.UNKNOWN


def test_a_malformed_contract_is_refused():
    doc = {"provider": {"repository": "r", "commit": "c", "version": "v"},
           "resources": {"t": {"file": "f.go", "arguments": {"a": {"type": "str", "line": 1}}}}}
    with pytest.raises(contract.ContractError, match="expected one of string"):
        contract.parse(doc)
    doc["resources"]["t"]["arguments"]["a"] = {"type": "string"}
    with pytest.raises(contract.ContractError, match="source file and line"):
        contract.parse(doc)


def test_cidr_blocks_carry_their_masks():
    """`within` blocks hold a range of masks each (VolcEngine's `10.0.0.0/8~24` notation);
    an entry whose constraint is the API's names the page that states it."""
    vpc = C.argument("volcengine:vpc/vpc:Vpc", "cidrBlock")
    assert vpc.problems("10.0.0.0/8") == vpc.problems("192.168.3.0/24") == []
    assert "accepted masks are /8 to /24" in vpc.problems("10.1.2.0/25")[0]
    assert "outside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16" in vpc.problems("100.64.0.0/16")[0]
    vke = C.argument("volcengine:vke/cluster:Cluster", "podsConfig.flannelConfig.podCidrs")
    assert vke.problems(["172.31.0.0/16"]) == []
    assert "accepted masks are /16 to /24" in vke.problems(["172.16.0.0/12"])[0]  # 172.16-31.0.0/16~24
    assert "outside 10.0.0.0/12" in vke.problems(["10.96.0.0/12"])[0]  # 10.0.0.0/12~24
    for a in (vpc, vke, C.argument("volcengine:vpc/subnet:Subnet", "cidrBlock")):
        assert a.enforced == "api" and a.doc and a.doc.startswith("https://")


@pytest.mark.parametrize("entry,words", [
    ({"type": "string", "line": 1, "cidr": True, "within": ["10.0.0.0/8~4"]}, "masks must lie between /8 and /32"),
    ({"type": "string", "line": 1, "cidr": True, "within": [{"block": "10.0.0.0/8"}]}, "expected keys block and masks"),
    ({"type": "string", "line": 1, "cidr": True, "within": ["10.0.0.1/8"]}, "has host bits set"),
    ({"type": "string", "line": 1, "doc": "docs.example/page"}, "expected an https URL"),
])
def test_a_malformed_cidr_range_or_doc_is_refused(entry, words):
    doc = {"provider": {"repository": "r", "commit": "c", "version": "v"},
           "resources": {"t": {"file": "f.go", "arguments": {"a": entry}}}}
    with pytest.raises(contract.ContractError, match=words):
        contract.parse(doc)


def test_docs_table_is_generated_from_the_contract():
    table = section(DOC_PAGE.read_text(), "contract")
    assert table == contract.markdown_table(), "docs/infrastructure.md is stale: python -m stacks.docs --update"
    assert "topologyManagerScope" in table and "ESSD_FlexPL" in table and C.commit in table

