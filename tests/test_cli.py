"""`dsvolc preview`: exit codes, the JSON plan, and errors without tracebacks."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from dsvolc.cli import app
from stacks import load, read_raw

runner = CliRunner()


def test_preview_dev_prints_tree_and_counts():
    result = runner.invoke(app, ["preview", "dev"])
    assert result.exit_code == 0, result.output
    assert "stack dev" in result.output
    assert "resources by type" in result.output
    assert "volcengine:vke/cluster:Cluster" in result.output


def test_preview_prod_json_lists_the_foundation(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["preview", "prod", "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["stack"] == "prod"
    assert set(plan) == {"stack", "resources", "violations"}
    types = {r["type"] for r in plan["resources"]}
    for t in [
        "volcengine:vpc/vpc:Vpc", "volcengine:vpc/subnet:Subnet", "volcengine:nat/gateway:Gateway",
        "volcengine:vpc/securityGroup:SecurityGroup", "volcengine:vke/cluster:Cluster",
        "volcengine:vke/nodePool:NodePool", "volcengine:tos/bucket:Bucket", "volcengine:tos/bucketPolicy:BucketPolicy",
        "volcengine:tos/bucketEncryption:BucketEncryption", "volcengine:iam/policy:Policy", "volcengine:iam/role:Role",
        "volcengine:cr/registry:Registry", "volcengine:cr/repository:Repository",
        "volcengine:apig/apigGateway:ApigGateway", "volcengine:apig/apigRoute:ApigRoute",
    ]:
        assert t in types, t
    subnets = [r for r in plan["resources"] if r["type"] == "volcengine:vpc/subnet:Subnet" and "-nodes-" in r["name"]]
    assert len(subnets) == len(load("prod").zones)
    for r in plan["resources"]:
        assert set(r) >= {"type", "name", "urn", "parent", "inputs"}


def test_preview_accepts_a_stack_file_path(tmp_path):
    doc = {"config": {"deepseek-volc:settings": read_raw("dev")}}
    path = tmp_path / "Pulumi.dev.yaml"  # the stack name (and its policy config) come from the file name
    path.write_text(yaml.safe_dump(doc))
    result = runner.invoke(app, ["preview", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "stack dev" in result.output


def test_bad_settings_exit_2_with_the_path_and_no_traceback(tmp_path):
    raw = read_raw("dev")
    raw["cluster"]["gpu_pools"]["a10"]["max_nodes"] = 0
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text(yaml.safe_dump({"config": {"deepseek-volc:settings": raw}}))
    result = runner.invoke(app, ["preview", str(path)])
    assert result.exit_code == 2
    assert "cluster.gpu_pools.a10.max_nodes" in result.output
    assert "Traceback" not in result.output


def test_unknown_stack_exit_2_lists_known_stacks():
    result = runner.invoke(app, ["preview", "qa"])
    assert result.exit_code == 2
    assert "dev, prod, staging" in result.output
