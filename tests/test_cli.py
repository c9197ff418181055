"""`dsvolc preview`: exit codes, the JSON plan, and errors without tracebacks."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from dsvolc.cli import app
from stacks import load, read_raw, stack_file
from stacks.plan import build_plan
from tests.stack_fixtures import filled_raw

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
    # shipped prod names a placeholder identity provider and edge domain and has no recorded
    # image digest yet: exit 1, the JSON still written
    assert result.exit_code == 1, result.output
    plan = json.loads(out.read_text())
    assert {v["policy"] for v in plan["violations"] if v["enforcement_level"] == "mandatory"} == {
        "identity-provider-not-placeholder", "images-by-digest", "edge-domain-not-placeholder"}
    assert plan["stack"] == "prod"
    assert set(plan) == {"stack", "environment_class", "policy_config", "mode", "deploy_phase", "first_apply",
                         "plans", "resources", "violations"}
    # the stack as deployed (phase 2) at the top, its first `pulumi up` (phase 1) beside it
    assert plan["mode"] == "existing" and plan["first_apply"]["mode"] == "new"
    assert plan["deploy_phase"]["phase"] == 2 and plan["deploy_phase"]["irsa"] is True
    assert plan["first_apply"]["deploy_phase"]["phase"] == 1
    assert plan["environment_class"] == "prod" and plan["policy_config"] == "policies/config/prod.json"
    (serving,) = plan["plans"]
    s = load("prod")
    p = build_plan(s)
    assert serving["model"] == s.serving.model and serving["gpu"] == "H20" and serving["gpus_per_node"] == 8
    assert serving["tensor_parallel_size"] * serving["pipeline_parallel_size"] * serving["data_parallel_size"] == 16
    assert serving["gpus_per_replica"] == 16 and serving["layout"] == "DP16+EP16" and serving["expert_parallel"]
    assert serving["nodes_per_replica"] == 2 and serving["multi_node"] is True
    assert serving["max_model_len"] == s.serving.engine.max_model_len
    assert serving["kv_cache_tokens"] == p.serving.engine.kv_cache_tokens > serving["max_model_len"]
    assert serving["replicas"] == {"min": s.serving.replicas, "max": s.autoscaling.max_replicas}
    types = {r["type"] for r in plan["resources"]}
    for t in [
        "volcengine:vpc/vpc:Vpc", "volcengine:vpc/subnet:Subnet", "volcengine:nat/gateway:Gateway",
        "volcengine:vpc/securityGroup:SecurityGroup", "volcengine:vke/cluster:Cluster",
        "volcengine:vke/nodePool:NodePool", "volcengine:tos/bucket:Bucket", "volcengine:tos/bucketPolicy:BucketPolicy",
        "volcengine:tos/bucketEncryption:BucketEncryption", "volcengine:iam/policy:Policy",
        "volcengine:cr/registry:Registry", "volcengine:cr/repository:Repository",
        "volcengine:apig/apigGateway:ApigGateway", "volcengine:apig/apigRoute:ApigRoute",
        "volcengine:ecs/hpcCluster:HpcCluster", "volcengine:vke/addon:Addon",
    ]:
        assert t in types, t
    # the deployed stack trusts the cluster's OIDC provider; its first apply has no provider yet,
    # hence no reader role and no Kubernetes object (deploy phase 1)
    assert "volcengine:iam/role:Role" in types and any(t.startswith("kubernetes:") for t in types)
    first = {r["type"] for r in plan["first_apply"]["resources"]}
    assert "volcengine:iam/role:Role" not in first and not any(t.startswith("kubernetes:") for t in first)
    assert {"volcengine:vke/cluster:Cluster", "volcengine:tos/bucket:Bucket"} <= first
    subnets = [r for r in plan["resources"] if r["type"] == "volcengine:vpc/subnet:Subnet" and "-nodes-" in r["name"]]
    assert len(subnets) == len(load("prod").zones)
    for r in plan["resources"]:
        assert set(r) >= {"type", "name", "urn", "parent", "inputs"}


def test_preview_prints_the_engine_plan_and_the_policy_config():
    result = runner.invoke(app, ["preview", "prod"])
    assert result.exit_code == 1, result.output  # the placeholder identity provider, no digests yet
    out = " ".join(result.output.replace("│", " ").split())  # rich wraps long lines inside the tree
    assert re.search(r"policy verdict: \d+ mandatory, 0 advisory violation\(s\)", out)
    assert "stack prod: class prod, policy config policies/config/prod.json" in out
    assert "deepseek-r1 on H20 x 8" in out and "DP16+EP16 + MTP 1" in out and "2 nodes per replica" in out
    assert "expert all-to-all over RDMA" in out
    assert f"context {load('prod').serving.engine.max_model_len:,}" in out


def test_a_copied_stack_previews_under_its_own_name_and_class(tmp_path):
    raw = filled_raw("prod")
    path = tmp_path / "Pulumi.mytest.yaml"
    path.write_text(yaml.safe_dump({"config": {"deepseek-volc:settings": raw}}))
    result = runner.invoke(app, ["preview", str(path), "--json", str(tmp_path / "p.json"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "stack mytest: class prod, policy config policies/config/prod.json" in " ".join(result.output.split())
    names = {r["name"] for r in json.loads((tmp_path / "p.json").read_text())["resources"]}
    assert "deepseek-mytest-vke" in names and not any(n.startswith("deepseek-prod") for n in names)
    inputs = {r["name"]: r["inputs"] for r in json.loads((tmp_path / "p.json").read_text())["resources"]}
    assert inputs["deepseek-mytest-bucket"]["bucketName"] == "deepseek-volc-mytest-weights"


def test_policy_config_command_names_the_class_file():
    result = runner.invoke(app, ["policy-config", "staging"])
    assert result.exit_code == 0 and result.output.strip() == "policies/config/staging.json"


def test_a_missing_policy_config_exits_2_naming_the_setting(tmp_path):
    raw = read_raw("dev")
    raw["policy_config"] = "policies/config/nope.json"
    path = tmp_path / "Pulumi.mytest.yaml"
    path.write_text(yaml.safe_dump({"config": {"deepseek-volc:settings": raw}}))
    result = runner.invoke(app, ["preview", str(path)])
    assert result.exit_code == 2
    assert "policy_config: policies/config/nope.json: no such policy config file" in result.output
    assert "Traceback" not in result.output


def test_preview_accepts_a_stack_file_path(tmp_path):
    doc = {"config": {"deepseek-volc:settings": read_raw("dev")}}
    path = tmp_path / "Pulumi.dev.yaml"  # the stack name comes from the file name
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


@pytest.mark.parametrize("old,new,problem", [
    ("      irsa: true\n", "      irsa: true\n      irsa: false\n",
     "cluster.irsa: given twice, on line {a} and again on line {b}; YAML would keep the last silently: keep one"),
    ('      kubernetes_version: "1.32"\n', "      kubernetes_version: 1.30\n",
     'cluster.kubernetes_version: 1.3 was read as a number from 1.30; quote it: "1.30"'),
    ("      vpc_cidr: 10.10.0.0/16\n", "      vpc_cidr: 10.10.0.1/16\n",
     "network.vpc_cidr: 10.10.0.1/16 has host bits set; did you mean 10.10.0.0/16?"),
])
def test_a_stack_file_mistake_is_one_clear_line_and_exit_2(tmp_path, old, new, problem):
    text = stack_file("dev").read_text()
    assert text.count(old) == 1
    text = text.replace(old, new)
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(text)
    lines = [i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith("irsa:")]
    problem = problem.format(a=lines[0], b=lines[-1])
    result = runner.invoke(app, ["preview", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [f"error: invalid settings in {path}:", f"  - {problem}"]


def test_unknown_stack_exit_2_lists_known_stacks():
    result = runner.invoke(app, ["preview", "qa"])
    assert result.exit_code == 2
    assert "known stacks: dev, mig-example, prod, staging, triton-example" in result.output


def test_preview_existing_sees_what_the_program_builds_from_computed_outputs(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["preview", "dev", "--existing", "--json", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "(existing stack)" in result.output
    plan = json.loads(out.read_text())
    assert plan["mode"] == "existing"
    (role,) = [r for r in plan["resources"] if r["type"] == "volcengine:iam/role:Role"]
    assert "oidc-provider" in role["inputs"]["trustPolicyDocument"]


def test_preview_new_stack_shows_phase_one_and_what_comes_next(tmp_path):
    out = tmp_path / "first.json"
    result = runner.invoke(app, ["preview", "dev", "--new-stack", "--quiet", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "deploy phase 1 of 2" in result.output and "next: run `pulumi up` again" in result.output
    plan = json.loads(out.read_text())
    assert plan["deploy_phase"]["phase"] == 1
    types = {r["type"] for r in plan["resources"]}
    assert "volcengine:iam/role:Role" not in types and not any(t.startswith("kubernetes:") for t in types)


def test_manifests_writes_each_object_the_stack_registers_as_yaml(tmp_path):
    out = tmp_path / "m"
    result = runner.invoke(app, ["manifests", "staging", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.yaml"))
    assert f"wrote {len(files)} objects under {out}" in result.output
    s = load("staging")
    # the serving workload in the serving namespace, namespaces at cluster scope, no Secrets
    # (their values are state), no Helm releases (charts rendered at `pulumi up`)
    dep = yaml.safe_load((out / s.serving.namespace / f"deployment-{s.serving.name}.yaml").read_text())
    assert dep["kind"] == "Deployment" and dep["metadata"]["namespace"] == s.serving.namespace
    vllm = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm")
    assert vllm["securityContext"]["readOnlyRootFilesystem"] is True
    assert f"_cluster/namespace-{s.serving.namespace}.yaml" in files
    kinds = {yaml.safe_load((out / f).read_text())["kind"] for f in files}
    assert "Secret" not in kinds and "Release" not in kinds
    assert {"Namespace", "Deployment", "Service", "NetworkPolicy"} <= kinds


def test_manifests_bad_settings_exit_2_without_a_traceback(tmp_path):
    bad = tmp_path / "Pulumi.bad.yaml"
    raw = read_raw("dev")
    raw["cluster"]["gpu_pools"]["a10"]["max_nodes"] = 0
    bad.write_text(yaml.safe_dump({"config": {"deepseek-volc:settings": raw}}))
    result = runner.invoke(app, ["manifests", str(bad), str(tmp_path / "m")])
    assert result.exit_code == 2, result.output
    assert "cluster.gpu_pools.a10.max_nodes" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "m").exists()
