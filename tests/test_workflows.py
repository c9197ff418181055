"""The GitHub workflows: valid against GitHub's workflow schema (the copy check-jsonschema
vendors from SchemaStore) and shaped as the project needs them: a commented `pulumi
preview` with the policy pack on pull requests, `pulumi up` on main with prod behind an
environment approval, and an offline verdict that reads no secret so forks get one too."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
STACKS = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
# Example stacks (`*-example`) show a serving shape; they are previewed offline like every
# stack but have no cloud deployment (no Pulumi state to preview against, nothing to update).
DEPLOYED = [s for s in STACKS if not s.endswith("-example")]


def load(name: str) -> dict:
    # YAML 1.2 (ruamel): `on` stays a key; PyYAML's YAML 1.1 would read it as True.
    return YAML(typ="safe").load((WORKFLOWS / name).read_text())


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("github-workflows.json").read_text())


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _pulumi_steps(job: dict) -> list[dict]:
    return [s for s in _steps(job) if str(s.get("uses", "")).startswith("pulumi/actions@")]


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.yml")))
def test_workflow_matches_github_schema(schema, name):
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(load(name)), key=lambda e: e.path)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_pull_requests_get_a_commented_pulumi_preview_with_the_pack():
    wf = load("preview.yml")
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["pulumi-preview"]
    assert sorted(job["strategy"]["matrix"]["stack"]) == DEPLOYED
    assert job["permissions"] == {"contents": "read", "pull-requests": "write"}
    # forks get no secrets: this job is skipped for them, offline-preview covers them
    assert "head.repo.full_name == github.repository" in job["if"]
    (step,) = _pulumi_steps(job)
    w = step["with"]
    assert w["command"] == "preview" and w["comment-on-pr"] is True
    assert w["policyPacks"] == "policies"
    # the config follows the stack's class: `dsvolc policy-config` names it
    assert w["policyPackConfigs"] == "${{ steps.policy.outputs.config }}"
    (cfg,) = [s for s in _steps(job) if s.get("id") == "policy"]
    assert "dsvolc policy-config" in cfg["run"] and cfg["env"]["STACK"] == "${{ matrix.stack }}"


def test_main_runs_pulumi_up_with_prod_behind_an_approval():
    wf = load("deploy.yml")
    assert wf["on"]["push"]["branches"] == ["main"]
    jobs = wf["jobs"]
    assert jobs["up-staging"]["needs"] == "up-dev" and jobs["up-prod"]["needs"] == "up-staging"
    assert {j["with"]["stack"] for j in jobs.values()} == set(DEPLOYED)
    assert jobs["up-prod"]["with"]["environment"] == "prod"
    called = load(Path(jobs["up-prod"]["uses"]).name)
    assert "workflow_call" in called["on"]
    (job,) = called["jobs"].values()
    # the environment (with required reviewers for prod) is the one the caller names
    assert job["environment"] == "${{ inputs.environment }}"
    (step,) = _pulumi_steps(job)
    assert step["with"]["command"] == "up" and step["with"]["policyPacks"] == "policies"
    assert step["with"]["policyPackConfigs"] == "${{ steps.policy.outputs.config }}"
    (cfg,) = [s for s in _steps(job) if s.get("id") == "policy"]
    assert "dsvolc policy-config" in cfg["run"] and cfg["env"]["STACK"] == "${{ inputs.stack }}"


def test_offline_verdict_reads_no_secret_and_covers_every_stack():
    text = (WORKFLOWS / "offline-preview.yml").read_text()
    assert "secrets." not in text and "secrets: inherit" not in text
    wf = load("offline-preview.yml")
    assert "pull_request" in wf["on"] and "pull_request_target" not in wf["on"]
    assert wf["permissions"] == {"contents": "read"}
    job = wf["jobs"]["dsvolc-preview"]
    assert sorted(job["strategy"]["matrix"]["stack"]) == STACKS
    runs = " ".join(s.get("run", "") for s in _steps(job))
    assert "dsvolc.cli preview ${{ matrix.stack }}" in runs
    assert "if" not in job  # forks included


def test_every_job_has_a_timeout():
    for path in WORKFLOWS.glob("*.yml"):
        for name, job in load(path.name)["jobs"].items():
            assert "uses" in job or job.get("timeout-minutes"), f"{path.name}:{name}"
