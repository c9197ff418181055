"""`dsvolc preview STACK --against REF`: both sides rendered by their own code, each resource
classed create / update / replace / delete, and a replace of a stateful resource refused
unless the stack accepts it by name."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from dsvolc import against, engine
from dsvolc.cli import app
from stacks import read_raw
from stacks.loader import SETTINGS_KEY

pytestmark = pytest.mark.integration  # renders the stack twice, once in a subprocess at REF


def _stack_file(tmp_path, raw):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump({"config": {SETTINGS_KEY: raw}}))
    return path


def _preview(args):
    return CliRunner().invoke(app, ["preview", *args, "--existing", "--quiet"], env={"COLUMNS": "200"})


def test_against_head_changes_nothing(tmp_path):
    out = tmp_path / "p.json"
    r = _preview(["prod", "--against", "HEAD", "--json", str(out)])
    doc = json.loads(out.read_text())["against"]
    assert doc["ref"] == "HEAD" and set(doc["summary"]) == {"same"}, doc["summary"]
    assert doc["changes"] == [] and not [v for v in doc["violations"] if v["policy"] == "no-stateful-replacement"]
    assert "against HEAD:" in r.output


def test_a_bandwidth_change_replaces_the_edge_and_is_refused_until_accepted(tmp_path):
    raw = copy.deepcopy(read_raw("prod"))
    raw["gateway"]["public_bandwidth_mbps"] = raw["gateway"].get("public_bandwidth_mbps", 50) + 10
    out = tmp_path / "p.json"
    r = _preview([str(_stack_file(tmp_path, raw)), "--against", "HEAD", "--json", str(out)])
    assert r.exit_code == 1
    doc = json.loads(out.read_text())["against"]
    (gw,) = [c for c in doc["changes"] if c["type"] == "volcengine:apig/apigGateway:ApigGateway"]
    assert gw["action"] == "replace" and any("publicNetworkBandwidth" in w and "ForceNew" in w for w in gw["why"])
    (v,) = [v for v in doc["violations"] if v["policy"] == "no-stateful-replacement"]
    assert v["enforcement_level"] == "mandatory" and gw["name"] in v["message"]
    assert "accept_replacements" in v["message"]
    # stated in the stack: accepted, reported as advisory
    raw["accept_replacements"] = [gw["name"]]
    r = _preview([str(_stack_file(tmp_path, raw)), "--against", "HEAD", "--json", str(out)])
    doc = json.loads(out.read_text())["against"]
    (v,) = [v for v in doc["violations"] if v["policy"] == "no-stateful-replacement"]
    assert v["enforcement_level"] == "advisory"


def test_a_kubernetes_version_bump_replaces_nothing(tmp_path):
    """The cluster ignores kubernetesVersion (VKE upgrades it in place): listed, not sent."""
    raw = copy.deepcopy(read_raw("prod"))
    raw["cluster"]["kubernetes_version"] = "1.34"
    out = tmp_path / "p.json"
    _preview([str(_stack_file(tmp_path, raw)), "--against", "HEAD", "--json", str(out)])
    doc = json.loads(out.read_text())["against"]
    (c,) = [c for c in doc["changes"] if c["type"] == "volcengine:vke/cluster:Cluster"] or [None]
    assert c is None or (c["action"] != "replace" and "kubernetesVersion" in c["ignored"])
    assert not [v for v in doc["violations"] if v["policy"] == "no-stateful-replacement"]


def test_classify_reads_the_provider_changes():
    ch = against.classify("volcengine:tos/bucket:Bucket", "b", {"bucketName": "a"}, {"bucketName": "b"})
    assert ch.action == "replace" and ch.stateful
    ch = against.classify("volcengine:iam/role:Role", "r", {"trustPolicyDocument": "{}", "description": "x"},
                          {"trustPolicyDocument": '{"a": 1}', "description": "x"})
    assert ch.action == "update" and ch.not_sent and "trustPolicyDocument" in ch.not_sent[0]
    ch = against.classify("volcengine:iam/role:Role", "r", {"trustPolicyDocument": "{}"},
                          {"trustPolicyDocument": '{"a": 1}'}, replace_on_changes=["trustPolicyDocument"])
    assert ch.action == "replace"
    ch = against.classify("kubernetes:apps/v1:Deployment", "d", {"spec": {"selector": {"a": "1"}}},
                          {"spec": {"selector": {"a": "2"}}})
    assert ch.action == "replace"
    ch = against.classify("kubernetes:apps/v1:Deployment", "d", {"spec": {"replicas": 1}}, {"spec": {"replicas": 2}})
    assert ch.action == "update"


def test_a_ref_that_is_no_commit_is_a_clear_error():
    r = _preview(["dev", "--against", "no-such-ref-xyz"])
    assert r.exit_code == 2 and "not a commit of this repository" in r.output


def test_against_the_previous_commit_renders(tmp_path):
    """What the PR workflow runs (against its base): here the commit before HEAD."""
    out = tmp_path / "p.json"
    r = _preview(["prod", "--against", "HEAD~1", "--json", str(out)])
    assert r.exit_code in (0, 1), r.output
    doc = json.loads(out.read_text())["against"]
    assert doc["ref"] == "HEAD~1" and sum(doc["summary"].values()) >= 1


def test_the_pull_request_workflow_runs_it_against_its_base():
    from pathlib import Path

    wf = yaml.safe_load((Path(__file__).resolve().parent.parent / ".github/workflows/offline-preview.yml").read_text())
    steps = wf["jobs"]["dsvolc-preview"]["steps"]
    (step,) = [s for s in steps if "--against" in s.get("run", "")]
    assert step["if"] == "github.event_name == 'pull_request'"
    assert step["env"]["BASE_SHA"] == "${{ github.event.pull_request.base.sha }}"
    assert '--against "$BASE_SHA"' in step["run"]
    assert next(s for s in steps if "actions/checkout" in s.get("uses", ""))["with"]["fetch-depth"] == 0
