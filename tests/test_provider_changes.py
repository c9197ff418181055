"""What a change of each argument does under the pinned provider (stacks/provider_changes.yaml),
and how the program lives with the two that would hurt: a Kubernetes version bump (the
provider replaces the cluster) and a changed trust policy (the provider never sends it)."""

from __future__ import annotations

import pytest

from dsvolc import engine
from stacks import contract, provider_changes, read_raw

C = contract.load()
CHANGES = provider_changes.load()


def test_every_contract_argument_has_a_verdict_and_nothing_else_does():
    assert provider_changes.commit() == C.commit
    assert set(CHANGES) == set(C.arguments)
    for rtype, args in C.arguments.items():
        assert set(CHANGES[rtype]) == set(args), rtype
        for path, ch in CHANGES[rtype].items():
            assert ch.verdict in provider_changes.VERDICTS
            if ch.verdict != "update":
                # a replace or an ignore names the line that decides it
                assert ch.line and ch.file.endswith(".go") and ch.why, (rtype, path, ch)


@pytest.mark.parametrize("rtype,path,verdict,file_part,line", [
    # read in the provider source at v0.0.194 (the lines cited in docs/deploy.md)
    ("volcengine:vke/cluster:Cluster", "kubernetesVersion", "replace", "resource_volcengine_vke_cluster.go", 64),
    ("volcengine:iam/role:Role", "trustPolicyDocument", "ignored", "service_volcengine_iam_role.go", 140),
    ("volcengine:cr/registry:Registry", "resourceTags[].key", "replace", "resource_volcengine_cr_registry.go", 63),
    ("volcengine:vke/cluster:Cluster", "deleteProtectionEnabled", "update", "resource_volcengine_vke_cluster.go", None),
    ("volcengine:tos/bucket:Bucket", "bucketName", "replace", "resource_volcengine_tos_bucket.go", None),
])
def test_known_verdicts(rtype, path, verdict, file_part, line):
    ch = provider_changes.verdict(rtype, path)
    assert ch is not None and ch.verdict == verdict and ch.file.endswith(file_part), ch
    if line is not None:
        assert ch.line == line


def test_apig_gateway_fields_that_replace_it():
    """Changing gateway.public_bandwidth_mbps, gateway.zones or observability.vmp_enabled
    replaces the APIG gateway and its public address."""
    gw = {p: c.verdict for p, c in CHANGES["volcengine:apig/apigGateway:ApigGateway"].items()}
    replaced = {p for p, v in gw.items() if v == "replace"}
    assert any(p.startswith("networkSpec.") for p in replaced)
    assert any(p.startswith("monitorSpec.") for p in replaced)
    assert any("publicNetworkBandwidth" in p for p in replaced), sorted(gw)


def test_schema_reader_sees_force_new_on_a_block_and_skips_strings():
    src = '''
    Schema: map[string]*schema.Schema{
        "name": {
            Type: schema.TypeString,
            Description: "a brace { in a string, and \\"ForceNew: true\\" quoted",
        },
        "spec": {
            Type: schema.TypeList,
            ForceNew: true,
            Elem: &schema.Resource{Schema: map[string]*schema.Schema{
                "size": {Type: schema.TypeInt, Optional: true},
            }},
        },
        "tags": {
            Elem: &schema.Resource{Schema: map[string]*schema.Schema{
                "key": {Type: schema.TypeString, ForceNew: true},
            }},
        },
    }'''
    f = provider_changes.schema_fields(src)
    assert f[("name",)]["force_new"] is None
    assert f[("spec",)]["force_new"] == 9
    assert f[("spec", "size")]["force_new"] is None  # the block's ForceNew is its own
    assert f[("tags",)]["force_new"] is None and f[("tags", "key")]["force_new"] == 16


@pytest.fixture(scope="module")
def prod_existing() -> engine.Recording:
    return engine.run("prod", read_raw("prod"), mode="existing")


def test_the_cluster_leaves_its_kubernetes_version_to_vke(prod_existing):
    (cluster,) = [r for r in prod_existing.resources if r.type == "volcengine:vke/cluster:Cluster"]
    assert provider_changes.verdict(cluster.type, "kubernetesVersion").verdict == "replace"
    assert "kubernetesVersion" in cluster.ignore_changes


def test_a_changed_trust_replaces_the_reader_role(prod_existing):
    (role,) = [r for r in prod_existing.resources if r.type == "volcengine:iam/role:Role"]
    assert role.replace_on_changes == ["trustPolicyDocument"] == provider_changes.ignored(role.type)
    # its name is fixed, so the old role must go before the new one is created
    assert role.delete_before_replace is True
