"""What docs/deploy.md relies on: the public endpoint as a stack output, the deploying
identity's IAM policy (docs/deploy-iam-policy.json) against what the program registers in
every shipped stack, both deploy phases, and the stack outputs the runbook reads."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from dsvolc import engine
from stacks import load, read_raw, shipped_stacks
from stacks.plan import build_plan

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "docs" / "deploy-iam-policy.json"
RUNBOOK = ROOT / "docs" / "deploy.md"
MODES = ("new", "existing")


@pytest.fixture(scope="module")
def recordings() -> dict[tuple[str, str], engine.Recording]:
    """Every shipped stack, as its first `pulumi up` (phase 1) and as deployed (phase 2)."""
    return {(s, m): engine.run(s, read_raw(s), mode=m) for s in shipped_stacks() for m in MODES}


def _edge_stacks() -> list[str]:
    return [s for s in shipped_stacks() if load(s).gateway.edge_enabled]


# --- the public endpoint ------------------------------------------------------------------


@pytest.mark.parametrize("stack", _edge_stacks())
def test_public_endpoint_is_the_settings_domain_and_the_public_address_of_the_apig_service(recordings, stack):
    rec = recordings[(stack, "existing")]
    domain = load(stack).gateway.tls.domain
    out = rec.outputs["public_endpoint"]
    assert out["domain"] == domain
    assert out["url"] == f"https://{domain}/v1/"
    # the CNAME points at the public default domain APIG gave the service, not its VPC one
    (svc,) = rec.of_type("volcengine:apig/apigGatewayService:ApigGatewayService")
    answer = engine._gateway_services_answer(svc.inputs["gatewayId"], svc.inputs["serviceName"])
    domains = {d["type"]: d["domain"] for d in answer["gatewayServices"][0]["domains"]}
    assert out["dns_record"] == {"type": "CNAME", "name": domain, "target": domains["public"]}
    # the in-cluster entry stays what it was: not the address clients call
    assert rec.outputs["serving_endpoint"] != out["url"]


@pytest.mark.parametrize("stack", _edge_stacks())
def test_public_endpoint_of_a_new_stack_knows_its_domain_and_waits_for_the_address(recordings, stack):
    out = recordings[(stack, "new")].outputs["public_endpoint"]
    assert out["domain"] == load(stack).gateway.tls.domain
    assert out["dns_record"]["target"] == engine.UNKNOWN  # APIG assigns it when the service exists


def test_public_address_is_the_public_domain_whatever_the_order():
    from infra.gateway import public_default_domain

    class D:
        def __init__(self, domain, type_):
            self.domain, self.type = domain, type_

    class S:
        def __init__(self, domains):
            self.domains = domains

    pub, priv = D("sd1.apigateway-cn-beijing.volceapi.com", "Public"), D("sd1.apigateway-cn-beijing.ivolces.com", "private")
    assert public_default_domain([S([priv, pub])]) == pub.domain
    assert public_default_domain([S([pub, priv])]) == pub.domain
    assert public_default_domain([S([priv])]) == ""
    assert public_default_domain([]) == ""


def test_no_public_endpoint_without_the_edge():
    raw = read_raw("dev")
    raw["gateway"] = {**raw.get("gateway", {}), "edge_enabled": False}
    rec = engine.run("dev", raw, mode="existing")
    assert "public_endpoint" not in rec.outputs
    assert not rec.of_type("volcengine:apig/apigGateway:ApigGateway")


# --- the deploying identity's policy ------------------------------------------------------

# pulumi-volcengine module -> the IAM service code its API's actions are named under.
# EIP actions are VPC actions (EIPFullAccess grants vpc:*EipAddress*, docs 6402/1222888);
# the NAT gateway API is its own service, natgateway; HPC clusters are an ECS API.
MODULE_SERVICE = {
    "vpc": "vpc", "eip": "vpc", "nat": "natgateway", "ecs": "ecs", "vke": "vke", "cr": "cr",
    "tos": "tos", "tls": "tls", "vmp": "vmp", "apig": "apig", "iam": "iam",
}

# What `pulumi up` and `pulumi destroy` call for each resource type the program registers
# (the API actions of terraform-provider-volcengine's create and delete of that resource).
LIFECYCLE = {
    "vpc/vpc:Vpc": ("vpc:CreateVpc", "vpc:DeleteVpc", "vpc:DescribeVpcs"),
    "vpc/subnet:Subnet": ("vpc:CreateSubnet", "vpc:DeleteSubnet", "vpc:DescribeSubnets"),
    "vpc/routeTable:RouteTable": ("vpc:CreateRouteTable", "vpc:DeleteRouteTable"),
    "vpc/routeEntry:RouteEntry": ("vpc:CreateRouteEntry", "vpc:DeleteRouteEntry"),
    "vpc/routeTableAssociate:RouteTableAssociate": ("vpc:AssociateRouteTable", "vpc:DisassociateRouteTable"),
    "vpc/securityGroup:SecurityGroup": ("vpc:CreateSecurityGroup", "vpc:DeleteSecurityGroup"),
    "vpc/securityGroupRule:SecurityGroupRule": ("vpc:AuthorizeSecurityGroupIngress",
                                                "vpc:RevokeSecurityGroupIngress",
                                                "vpc:AuthorizeSecurityGroupEgress",
                                                "vpc:RevokeSecurityGroupEgress"),
    "eip/address:Address": ("vpc:AllocateEipAddress", "vpc:ReleaseEipAddress", "vpc:DescribeEipAddresses"),
    "eip/associate:Associate": ("vpc:AssociateEipAddress", "vpc:DisassociateEipAddress"),
    "nat/gateway:Gateway": ("natgateway:CreateNatGateway", "natgateway:DeleteNatGateway",
                            "natgateway:DescribeNatGateways"),
    "nat/snatEntry:SnatEntry": ("natgateway:CreateSnatEntry", "natgateway:DeleteSnatEntry"),
    "ecs/hpcCluster:HpcCluster": ("ecs:CreateHpcCluster", "ecs:DeleteHpcCluster", "ecs:DescribeHpcClusters"),
    "vke/cluster:Cluster": ("vke:CreateCluster", "vke:DeleteCluster", "vke:UpdateClusterConfig", "vke:ListClusters"),
    "vke/nodePool:NodePool": ("vke:CreateNodePool", "vke:DeleteNodePool", "vke:UpdateNodePoolConfig"),
    "vke/addon:Addon": ("vke:CreateAddon", "vke:DeleteAddon", "vke:UpdateAddonConfig"),
    "vke/kubeconfig:Kubeconfig": ("vke:CreateKubeconfig", "vke:DeleteKubeconfigs", "vke:ListKubeconfigs"),
    "cr/registry:Registry": ("cr:CreateRegistry", "cr:DeleteRegistry", "cr:ListRegistries"),
    "cr/namespace:Namespace": ("cr:CreateNamespace", "cr:DeleteNamespace"),
    "cr/repository:Repository": ("cr:CreateRepository", "cr:DeleteRepository"),
    "cr/vpcEndpoint:VpcEndpoint": ("cr:UpdateVpcEndpoint", "cr:GetVpcEndpoint"),
    "tos/bucket:Bucket": ("tos:CreateBucket", "tos:DeleteBucket", "tos:HeadBucket", "tos:PutBucketVersioning"),
    "tos/bucketEncryption:BucketEncryption": ("tos:PutBucketEncryption", "tos:DeleteBucketEncryption"),
    "tos/bucketLifecycle:BucketLifecycle": ("tos:PutBucketLifecycle", "tos:DeleteBucketLifecycle"),
    "tos/bucketPolicy:BucketPolicy": ("tos:PutBucketPolicy", "tos:DeleteBucketPolicy", "tos:GetBucketPolicy"),
    "tls/project:Project": ("tls:CreateProject", "tls:DeleteProject"),
    "tls/topic:Topic": ("tls:CreateTopic", "tls:DeleteTopic"),
    "tls/index:Index": ("tls:CreateIndex", "tls:DeleteIndex"),
    "tls/rule:Rule": ("tls:CreateRule", "tls:DeleteRule"),
    "tls/hostGroup:HostGroup": ("tls:CreateHostGroup", "tls:DeleteHostGroup"),
    "tls/ruleApplier:RuleApplier": ("tls:ApplyRuleToHostGroups", "tls:DeleteRuleFromHostGroups"),
    "tls/traceInstance:TraceInstance": ("tls:CreateTraceInstance", "tls:DeleteTraceInstance",
                                        "tls:DescribeTraceInstances"),
    "vmp/workspace:Workspace": ("vmp:CreateWorkspace", "vmp:DeleteWorkspace"),
    "vmp/ruleFile:RuleFile": ("vmp:CreateRuleFile", "vmp:DeleteRuleFile"),
    "apig/apigGateway:ApigGateway": ("apig:CreateGateway", "apig:DeleteGateway"),
    "apig/apigGatewayService:ApigGatewayService": ("apig:CreateGatewayService", "apig:DeleteGatewayService",
                                                   "apig:ListGatewayServices"),
    "apig/apigCustomDomain:ApigCustomDomain": ("apig:CreateCustomDomain", "apig:DeleteCustomDomain"),
    "apig/apigUpstreamSource:ApigUpstreamSource": ("apig:CreateUpstreamSource", "apig:DeleteUpstreamSource"),
    "apig/apigUpstream:ApigUpstream": ("apig:CreateUpstream", "apig:DeleteUpstream"),
    "apig/apigRoute:ApigRoute": ("apig:CreateRoute", "apig:DeleteRoute"),
    "iam/policy:Policy": ("iam:CreatePolicy", "iam:DeletePolicy"),
    "iam/role:Role": ("iam:CreateRole", "iam:DeleteRole"),
    "iam/rolePolicyAttachment:RolePolicyAttachment": ("iam:AttachRolePolicy", "iam:DetachRolePolicy"),
}

ACTION = re.compile(r"^[a-z_]+:[A-Za-z*]+$")


@pytest.fixture(scope="module")
def policy() -> dict:
    return json.loads(POLICY.read_text())


def _registered(recordings) -> set[str]:
    """Resource types `volcengine:<module>/<name>:<Type>` the program registers, minus the prefix."""
    return {r.type.split(":", 1)[1] for rec in recordings.values() for r in rec.resources
            if r.type.startswith("volcengine:")}


def _allows(policy: dict, action: str, resource: str = "*") -> bool:
    for st in policy["Statement"]:
        if st["Effect"] != "Allow":
            continue
        if any(fnmatchcase(action, a) for a in st["Action"]) and (
                resource == "*" or any(fnmatchcase(resource, r) for r in st["Resource"])):
            return True
    return False


def _check_grammar(policy: dict) -> None:
    """VolcEngine's policy grammar: a Statement list of Effect, Action, Resource (Condition)."""
    assert set(policy) <= {"Statement", "Version"}
    assert policy["Statement"]
    for st in policy["Statement"]:
        assert set(st) <= {"Effect", "Action", "Resource", "Condition"}, st
        assert st["Effect"] in ("Allow", "Deny")
        assert isinstance(st["Action"], list) and st["Action"]
        assert all(isinstance(a, str) and ACTION.match(a) for a in st["Action"]), st["Action"]
        assert isinstance(st["Resource"], list) and st["Resource"]
        assert all(r == "*" or r.startswith("trn:") for r in st["Resource"]), st["Resource"]


def test_policy_is_volcengine_policy_grammar(policy):
    _check_grammar(policy)


def test_policy_covers_exactly_the_services_the_program_registers_resources_of(recordings, policy):
    modules = {t.split("/", 1)[0] for t in _registered(recordings)}
    unknown = modules - set(MODULE_SERVICE)
    assert not unknown, f"modules without an IAM service in MODULE_SERVICE: {sorted(unknown)}"
    needed = {MODULE_SERVICE[m] for m in modules}
    granted = {a.split(":", 1)[0] for st in policy["Statement"] for a in st["Action"]}
    assert granted == needed, f"missing {sorted(needed - granted)}, not needed {sorted(granted - needed)}"


def test_policy_allows_creating_and_deleting_every_registered_type(recordings, policy):
    types = _registered(recordings)
    unmapped = types - set(LIFECYCLE)
    assert not unmapped, f"resource types without their API actions in LIFECYCLE: {sorted(unmapped)}"
    missing = [a for t in sorted(types) for a in LIFECYCLE[t] if not _allows(policy, a)]
    assert not missing, missing


def test_policy_grants_no_whole_service(policy):
    # least privilege: families of actions per resource kind, never "*" or "<service>:*"
    broad = [a for st in policy["Statement"] for a in st["Action"] if a == "*" or a.endswith(":*")]
    assert not broad, broad


@pytest.mark.parametrize("stack", shipped_stacks())
def test_policy_scopes_buckets_and_iam_to_the_stacks_names(recordings, policy, stack):
    s = load(stack)
    p = build_plan(s)
    assert _allows(policy, "tos:CreateBucket", f"trn:tos:::{p.names.bucket}")
    assert not _allows(policy, "tos:CreateBucket", "trn:tos:::someone-elses-bucket")
    # the deploy identity configures the weights bucket, it does not read the weights
    assert not _allows(policy, "tos:GetObject", f"trn:tos:::{p.names.bucket}/{s.weights.prefix}/x")
    for r in recordings[(stack, "existing")].resources:
        if r.type == "volcengine:iam/policy:Policy":
            assert _allows(policy, "iam:CreatePolicy", f"trn:iam::{engine.FAKE_ACCOUNT}:policy/{r.inputs['policyName']}")
        if r.type == "volcengine:iam/role:Role":
            assert _allows(policy, "iam:CreateRole", f"trn:iam::{engine.FAKE_ACCOUNT}:role/{r.inputs['roleName']}")
    assert not _allows(policy, "iam:CreateRole", f"trn:iam::{engine.FAKE_ACCOUNT}:role/AdminRole")


# --- the runbook --------------------------------------------------------------------------


def test_runbook_reads_only_outputs_the_program_exports(recordings):
    exported = {k for rec in recordings.values() for k in rec.outputs}
    read = set(re.findall(r"pulumi stack output (?:-s \S+ )?(?:--\S+ )*([a-z_]+)", RUNBOOK.read_text()))
    assert read, "the runbook reads no stack output"
    assert read <= exported, f"not exported: {sorted(read - exported)}"
    assert "public_endpoint" in read


def test_runbook_names_the_policy_file_that_exists():
    assert "docs/deploy-iam-policy.json" in RUNBOOK.read_text()
    assert POLICY.is_file()


UPLOADER = ROOT / "docs" / "weights-uploader-policy.json"


@pytest.mark.parametrize("stack", shipped_stacks())
def test_weights_uploader_writes_the_model_prefix_and_nothing_else(stack):
    up = json.loads(UPLOADER.read_text())
    _check_grammar(up)
    s = load(stack)
    p = build_plan(s)
    key = f"trn:tos:::{p.names.bucket}/{s.weights.prefix}/{s.serving.model}/model-00001-of-00002.safetensors"
    assert _allows(up, "tos:PutObject", key)
    for action in ("tos:GetObject", "tos:DeleteObject", "tos:PutBucketPolicy", "tos:DeleteBucket"):
        assert not _allows(up, action, key) and not _allows(up, action, f"trn:tos:::{p.names.bucket}")
    assert not _allows(up, "tos:PutObject", f"trn:tos:::{p.names.bucket}/elsewhere/x")
    (listing,) = [st for st in up["Statement"] if "tos:ListBucket" in st["Action"]]
    assert listing["Condition"]["StringLike"]["tos:prefix"] == [f"{s.weights.prefix}/*"]
