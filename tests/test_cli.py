"""`dsvolc preview`: exit codes, the JSON plan, and errors without tracebacks."""

from __future__ import annotations

import io
import json
import re
from importlib.metadata import version

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from dsvolc.cli import app
from dsvolc.preview import render, run_both
from stacks import load, read_raw, shipped_stacks, stack_file
from stacks.plan import build_plan
from tests.stack_fixtures import filled_raw

runner = CliRunner()


def test_preview_verbose_prints_tree_counts_findings_and_urns():
    result = runner.invoke(app, ["preview", "dev", "--verbose"])
    assert result.exit_code == 0, result.output
    assert "stack dev" in result.output
    assert "resources by type" in result.output
    assert "volcengine:vke/cluster:Cluster" in result.output
    out = " ".join(result.output.replace("│", " ").split())
    # every resource's own finding and its URN, and what the next `pulumi up` does
    for v in run_both("dev").violations:
        assert v["message"].split(" Fix: ")[0] in out and v["resource"] in out
    assert "next: run `pulumi up` again" in out


@pytest.fixture(scope="module")
def dev_preview():
    return run_both("dev")


def _at_80_columns(result, **kw) -> str:
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    render(result, console, **kw)
    return console.export_text()


def _label(r: dict) -> str:
    """`Kind namespace/name` of a recorded resource, from its inputs (VolcEngine resources:
    `module.Type name`)."""
    if r["type"].startswith("kubernetes:helm.sh"):
        return f"HelmRelease {r['inputs']['namespace']}/{r['inputs']['name']}"
    if r["type"].startswith("volcengine:"):  # volcengine:apig/apigCustomDomain:ApigCustomDomain
        _, module, kind = r["type"].split(":")
        return f"{module.split('/')[0]}.{kind} {r['name']}"
    md = r["inputs"]["metadata"]
    return f"{r['inputs']['kind']} {md['namespace']}/{md['name']}" if md.get("namespace") else \
        f"{r['inputs']['kind']} {md['name']}"


def test_preview_reads_at_80_columns_summary_first_then_one_entry_per_policy_and_fix(dev_preview):
    text = _at_80_columns(dev_preview)
    lines = text.splitlines()
    # was 540 lines, 284 of them a violations table whose resource column was one truncated URN:
    # now it fits a screen of 80 x 80
    assert len(lines) <= 80 and max(len(line) for line in lines) <= 80, len(lines)
    assert "urn:pulumi" not in text and "…" not in text
    # the summary first: stack, both deploy phases, the engine plan, the verdict
    verdict = next(i for i, line in enumerate(lines) if line.startswith("policy verdict:"))
    assert lines[0].startswith("stack dev: class dev") and "policy violations" not in " ".join(lines[:verdict])
    head = " ".join(" ".join(lines[:verdict + 1]).split())
    assert "as deployed: deploy phase 2 of 2" in head and "first `pulumi up`: deploy phase 1 of 2" in head
    assert "engine plan deepseek-serving/deepseek: deepseek-r1-distill-qwen-7b on A10 x 1" in head
    assert f"policy verdict: 0 mandatory, {len(dev_preview.violations)} advisory violation(s): passes" in head
    flat = " ".join(text.split())
    both = dev_preview.violations + dev_preview.first_apply.violations  # both phases' verdicts
    fixes = {v["message"].split(" Fix: ")[1] for v in both}
    assert len(fixes) < len(dev_preview.violations)  # several violations share a fix ...
    for fix in fixes:  # ... which is printed once, in whichever phases need it
        assert flat.count(fix) == 1, fix
    # each entry names its resources as Kind namespace/name
    by_urn = {r.urn: r.as_json() for r in dev_preview.recording.resources + dev_preview.first_apply.recording.resources}
    for v in both:
        assert _label(by_urn[v["resource"]]) in flat, v["resource"]
    heads = [i for i, line in enumerate(lines) if re.match(r"(advisory|mandatory) +\S+ +\d+ resources?$", line)]
    assert len(heads) == len({(v["policy"], v["message"].split(" Fix: ")[1]) for v in both})
    # no entry runs longer than a short paragraph
    assert max(b - a for a, b in zip(heads, heads[1:] + [len(lines)])) <= 16
    images = next(lines[i] for i in heads if " images-by-digest " in lines[i])
    assert images.endswith(f"{sum(v['policy'] == 'images-by-digest' for v in dev_preview.violations)} resources")


def test_preview_json_carries_the_verdict_and_the_grouped_findings(tmp_path, dev_preview):
    out = tmp_path / "dev.json"
    result = runner.invoke(app, ["preview", "dev", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    n = len(dev_preview.violations)
    assert doc["verdict"] == {"mandatory": 0, "advisory": n, "passes": True}
    assert doc["first_apply"]["verdict"]["passes"] is True
    groups = doc["findings"]
    assert sum(len(g["resources"]) for g in groups) == n
    flat = " ".join(_at_80_columns(dev_preview).split())
    for g in groups:
        assert set(g) == {"policy", "enforcement_level", "description", "fix", "resources"}
        assert flat.count(g["fix"]) == 1
        for r in g["resources"]:
            assert r["label"] == (f"{r['kind']} {r['namespace']}/{r['name']}" if r["namespace"]
                                  else f"{r['kind']} {r['name']}")
            assert r["label"] in flat and r["urn"].startswith("urn:pulumi:dev::") and r["finding"]
    (digests,) = [g for g in groups if g["policy"] == "images-by-digest"]
    assert len(digests["resources"]) == sum(v["policy"] == "images-by-digest" for v in dev_preview.violations) > 1


def test_quiet_and_verbose_exclude_each_other():
    result = runner.invoke(app, ["preview", "dev", "--quiet", "--verbose"])
    assert result.exit_code == 2 and "--quiet and --verbose exclude each other" in result.output


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"dsvolc {version('deepseek-volc')}"


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
                         "plans", "resources", "violations", "verdict", "findings"}
    mandatory = [v for v in plan["violations"] if v["enforcement_level"] == "mandatory"]
    assert plan["verdict"] == {"mandatory": len(mandatory), "advisory": len(plan["violations"]) - len(mandatory),
                               "passes": False}
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
    # whatever stack files there are (a new one included), in order
    assert f"known stacks: {', '.join(shipped_stacks())}" in result.output and "dev, mig-example, pd-example, prod" in result.output


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


def test_every_resource_has_a_name_a_person_reads(dev_preview):
    """Any resource a policy may concern gets a label: Kubernetes objects and Helm releases
    as Kind namespace/name, VolcEngine and Pulumi resources as module.Type and their name."""
    from dsvolc.report import resource_ref

    labels = {r.urn: resource_ref(r, r.urn, r.type)["label"] for r in dev_preview.recording.resources}
    assert not [x for x in labels.values() if "urn:" in x or "::" in x]
    by_name = {r.name: labels[r.urn] for r in dev_preview.recording.resources}
    s = load("dev")
    prefix = build_plan(s).names.prefix
    assert by_name[f"{prefix}-vke"] == f"vke.Cluster {prefix}-vke"
    assert by_name[f"{prefix}-bucket"] == f"tos.Bucket {prefix}-bucket"
    assert by_name[f"{prefix}-namespace-{s.serving.namespace}"] == f"Namespace {s.serving.namespace}"
    assert by_name[f"{prefix}-helm-keda"] == "HelmRelease keda/keda"
    assert resource_ref(None, None, None)["label"] == "(the stack)"
