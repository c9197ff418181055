"""The pack itself: its shape, that it serves as the Pulumi CLI runs it, and the unsafe
stacks that must be refused (beyond the one-violation-per-row matrix)."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import analyzer_pb2_grpc
from pulumi_policy import EnforcementLevel, StackValidationPolicy
from typer.testing import CliRunner

from dsvolc import engine, policy_runner, preview
from dsvolc.cli import app
from policies.pack import MODULES, PACK_DIR, POLICIES
from tests.stack_fixtures import filled_raw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_policies_matrix import MATRIX, _pulumi_transform  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)+$")


def test_at_least_thirty_policies_each_named_described_and_levelled():
    assert len(POLICIES) >= 30
    names = [p.name for p in POLICIES]
    assert len(set(names)) == len(names)
    for p in POLICIES:
        assert KEBAB.match(p.name), p.name
        assert p.description.endswith(".") and len(p.description) > 20, p.name
        assert p.enforcement_level == EnforcementLevel.MANDATORY, p.name
        assert p.remediation_steps, p.name


def test_policies_are_grouped_by_concern():
    for module in MODULES:
        assert module.POLICIES, module.__name__
    concerns = {m.__name__.rsplit(".", 1)[-1] for m in MODULES}
    assert {"storage", "identity", "network", "cluster", "workload", "gateway", "operations", "capacity"} <= concerns
    capacity = next(m for m in MODULES if m.__name__.endswith("capacity"))
    assert all(isinstance(p, StackValidationPolicy) for p in capacity.POLICIES)


def test_main_only_builds_the_pack():
    tree = ast.parse((PACK_DIR / "__main__.py").read_text())
    calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
    # a path entry so the pack can import the project's planner, then the pack
    assert [ast.unparse(c.value.func) for c in calls] == ["sys.path.insert", "PolicyPack"]
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def test_requirements_pin_pulumi_policy_as_pyproject_does():
    pyproject = (ROOT / "pyproject.toml").read_text()
    pin = re.search(r'"(pulumi-policy==[0-9.]+)"', pyproject).group(1)
    assert pin in (PACK_DIR / "requirements.txt").read_text().splitlines()
    assert "runtime:" in (PACK_DIR / "PulumiPolicy.yaml").read_text()


def test_pack_serves_like_the_cli_runs_it():
    """`pulumi preview --policy-pack policies` runs `python -m pulumi.policy <engine> policies`:
    the pack prints its port and answers GetAnalyzerInfo with every policy."""
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.Popen([sys.executable, "-m", "pulumi.policy", "127.0.0.1:0", "policies"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        port = int(proc.stdout.readline().decode().strip())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = analyzer_pb2_grpc.AnalyzerStub(channel).GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
        assert info.name == "deepseek-volc"
        assert sorted(p.name for p in info.policies) == sorted(p.name for p in POLICIES)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- unsafe stacks


@pytest.fixture(scope="module")
def prod() -> engine.Recording:
    return engine.run("prod", filled_raw("prod"), mode="existing")


@pytest.mark.parametrize("action", ["*", "tos:*", "iam:*"])
def test_wildcard_actions_are_refused(prod, action):
    rec = copy.deepcopy(prod)
    policy = rec.of_type("volcengine:iam/policy:Policy")[0]
    doc = json.loads(policy.raw_inputs["policyDocument"])
    doc["Statement"][0]["Action"] = [action]
    policy.raw_inputs["policyDocument"] = policy.inputs["policyDocument"] = json.dumps(doc)
    fired = [v for v in policy_runner.analyze(rec, policy_runner.load_policy_config("prod"))
             if v["policy"] == "iam-no-wildcard-actions"]
    assert len(fired) == 1 and action in fired[0]["message"] and "Fix:" in fired[0]["message"]


def _case(policy: str, stack: str = "prod"):
    return next(c for c in MATRIX if c.policy == policy and c.stack == stack)


def test_an_unsafe_prod_is_refused_naming_each_fix():
    """Public bucket, wildcard IAM, `latest` image, no probes and infeasible engine
    settings at once: each is reported, mandatory, with its fix."""
    cases = [_case("tos-bucket-not-public"), _case("iam-no-wildcard-actions"), _case("image-pinned", "dev"),
             _case("serving-probes"), _case("engine-fits-gpu")]
    calls: list = []
    result = preview.run_preview("prod", raw=filled_raw("prod"),
                                 transforms=[_pulumi_transform(c.transform, calls) for c in cases], mode="existing")
    violations = result.violations
    by_policy = {v["policy"]: v for v in violations}
    for c in cases:
        v = by_policy.get(c.policy)
        assert v is not None, f"{c.policy} silent for {c.injected}"
        assert v["enforcement_level"] == "mandatory" and "Fix:" in v["message"]
    assert "public_acl='private'" in by_policy["tos-bucket-not-public"]["message"]
    assert "latest" in by_policy["image-pinned"]["message"]
    assert "dsvolc size" in by_policy["engine-fits-gpu"]["message"]


def test_edge_straight_to_vllm_is_unauthenticated_and_unlimited():
    raw = filled_raw("staging")
    raw["serving"]["in_cluster_gateway"] = False
    fired = {v["policy"] for v in preview.run_preview("staging", raw=raw, mode="existing").mandatory}
    assert fired == {"gateway-jwt-auth", "gateway-rate-limits"}


def test_auth_off_also_drops_the_per_consumer_rate_limit():
    """Rate limits key on the JWT's consumer claim, so turning auth off leaves both gaps."""
    raw = filled_raw("prod")
    raw["serving"]["auth"] = {"enabled": False}
    fired = {v["policy"] for v in preview.run_preview("prod", raw=raw, mode="existing").mandatory}
    assert fired == {"gateway-jwt-auth", "gateway-rate-limits"}


# --------------------------------------------------------------------------- the CLI


def test_cli_exits_1_and_groups_violations(tmp_path):
    """`dsvolc preview` on a stack file made unsafe through its settings."""
    import yaml

    doc = {"config": {"deepseek-volc:settings": filled_raw("prod")}}
    s = doc["config"]["deepseek-volc:settings"]
    s["cluster"]["api_server_public"] = True
    s["serving"]["replicas"] = 1
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / "preview.json"
    result = CliRunner().invoke(app, ["preview", str(path), "--json", str(out)], env={"COLUMNS": "250"})
    assert result.exit_code == 1, result.output
    assert "vke-private-api-server" in result.output and "serving-min-replicas" in result.output
    violations = json.loads(out.read_text())["violations"]
    assert {v["policy"] for v in violations} == {"vke-private-api-server", "serving-min-replicas"}


def test_cli_exits_0_for_prod_once_its_identity_provider_is_filled_in(tmp_path):
    from tests.stack_fixtures import filled_stack_file

    result = CliRunner().invoke(app, ["preview", str(filled_stack_file("prod", tmp_path)), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "0 mandatory" in result.output


def test_zone_and_credential_limits_follow_the_config():
    """mig-example (class dev, two zones, one shared NAT gateway) passes its own config,
    where egress-per-zone is not required, and fails a config that requires it; a stricter
    maxValidHours refuses the default 48-hour deploy kubeconfig."""
    rec = engine.run("mig-example", filled_raw("mig-example"), mode="existing")
    assert len(rec.of_type("volcengine:nat/gateway:Gateway")) == 1
    assert len({r.raw_inputs["zoneId"] for r in rec.of_type("volcengine:vpc/subnet:Subnet")}) == 2
    dev = [v for v in policy_runner.analyze(rec, policy_runner.load_policy_config("dev"))
           if v["policy"] == "egress-per-zone"]
    assert dev == []
    strict = [v for v in policy_runner.analyze(rec, {"egress-per-zone": "mandatory"})
              if v["policy"] == "egress-per-zone"]
    assert strict and all(v["enforcement_level"] == "mandatory" for v in strict)
    assert any("cn-beijing-b" in v["message"] and "deepseek-mig-example-nat-cn-beijing-a" in v["message"]
               for v in strict)

    short = [v for v in policy_runner.analyze(rec, {"kubeconfig-short-lived": {"maxValidHours": 24}})
             if v["policy"] == "kubeconfig-short-lived"]
    assert len(short) == 1 and "48 h" in short[0]["message"] and "at most 24" in short[0]["message"]
    assert not [v for v in policy_runner.analyze(rec, {}) if v["policy"] == "kubeconfig-short-lived"]
