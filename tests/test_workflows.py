"""The GitHub workflows: valid against GitHub's workflow schema (the copy check-jsonschema
vendors from SchemaStore), clean under the real workflow linters (actionlint, zizmor), and
shaped as the project needs them: a commented `pulumi preview` with the policy pack on
pull requests that only read-only credentials behind an approval reach, `pulumi up` on
main from runners inside each stack's VPC with prod behind an environment approval, and an
offline verdict that reads no secret so forks get one too."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


def load(name: str, root: Path = ROOT) -> dict:
    # YAML 1.2 (ruamel): `on` stays a key; PyYAML's YAML 1.1 would read it as True.
    return YAML(typ="safe").load((root / ".github" / "workflows" / name).read_text())


def stack_lists(workflow: str, root: Path = ROOT, env: dict | None = None) -> dict:
    """Run the `stacks` job's listing step of a workflow as the runner would, in `root`,
    and return what it writes to $GITHUB_OUTPUT (the matrices the other jobs read)."""
    job = load(workflow, root)["jobs"]["stacks"]
    (step,) = [s for s in _steps(job) if s.get("id") == "list"]
    out = Path(tempfile.mkdtemp(prefix="github-output-")) / "output"
    out.write_text("")
    step_env = {k: v for k, v in (step.get("env") or {}).items()}  # ${{ inputs.* }} stand-ins below
    run_env = {**os.environ, "GITHUB_OUTPUT": str(out),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               **{k: "" for k in step_env}, **(env or {})}
    done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=root, env=run_env, capture_output=True, text=True,
                          timeout=120)
    written = out.read_text()
    shutil.rmtree(out.parent)
    if done.returncode != 0:
        return {"error": done.stderr}
    return {k: json.loads(v) if v.startswith("[") else v for k, v in (line.split("=", 1) for line in written.splitlines())}


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("github-workflows.json").read_text())


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _pulumi_steps(job: dict) -> list[dict]:
    return [s for s in _steps(job) if str(s.get("uses", "")).startswith("pulumi/actions@")]


def _tool(name: str) -> str:
    """A linter installed with the dev extra, next to this interpreter."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def actionlint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("actionlint"), "-no-color"], cwd=root, capture_output=True, text=True, timeout=120)


def zizmor(root: Path) -> subprocess.CompletedProcess:
    # offline: the audits that call GitHub's API cannot run here
    return subprocess.run([_tool("zizmor"), "--offline", "--no-progress", "--format", "json",
                           str(root / ".github" / "workflows")], cwd=root, capture_output=True, text=True, timeout=120)


def _findings(result: subprocess.CompletedProcess) -> list[str]:
    return [f"{f['ident']}: {f['desc']}" for f in json.loads(result.stdout or "[]")]


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.yml")))
def test_workflow_matches_github_schema(schema, name):
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(load(name)), key=lambda e: e.path)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_pull_requests_get_a_commented_pulumi_preview_with_the_pack():
    wf = load("preview.yml")
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["pulumi-preview"]
    # the stacks come from stacks/Pulumi.*.yaml at run time, not from a list in the workflow
    assert job["needs"] == "stacks" and job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.deployed) }}"
    assert stack_lists("preview.yml")["deployed"] == DEPLOYED
    assert wf["jobs"]["stacks"]["if"] == job["if"]
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
    assert "dsvolc policy-config" in cfg["run"] and job["env"]["STACK"] == "${{ matrix.stack }}"


def test_pull_request_previews_get_only_read_only_credentials_after_an_approval():
    wf = load("preview.yml")
    assert "pull_request_target" not in wf["on"]
    job = wf["jobs"]["pulumi-preview"]
    # an environment whose reviewers approve each run, holding read-only credentials
    assert job["environment"] == "preview"
    (step,) = _pulumi_steps(job)
    used = set(re.findall(r"secrets\.(\w+)", json.dumps(step["env"])))
    assert used == {"PULUMI_READ_TOKEN", "PULUMI_CONFIG_PASSPHRASE", "VOLCENGINE_READONLY_ACCESS_KEY",
                    "VOLCENGINE_READONLY_SECRET_KEY"}
    deploy_secrets = set(load("pulumi-up.yml")["on"]["workflow_call"]["secrets"])
    assert not used & (deploy_secrets - {"PULUMI_CONFIG_PASSPHRASE"})
    # the API server is private: the preview runner sits in the VPC, apart from the deploy runners
    assert "self-hosted" in job["runs-on"] and "deepseek-volc-preview" in job["runs-on"]


def test_main_runs_pulumi_up_with_prod_behind_an_approval():
    wf = load("deploy.yml")
    assert wf["on"]["push"]["branches"] == ["main"]
    jobs = wf["jobs"]
    assert "up-dev" in jobs["up-staging"]["needs"] and "up-staging" in jobs["up-prod"]["needs"]
    # one tier per environment class, its stacks listed from stacks/Pulumi.*.yaml at run time;
    # each runs in the GitHub environment of its class (prod: the one with reviewers)
    lists = stack_lists("deploy.yml")
    for cls in ("dev", "staging", "prod"):
        tier = jobs[f"up-{cls}"]
        assert tier["strategy"]["matrix"]["stack"] == f"${{{{ fromJSON(needs.stacks.outputs.{cls}) }}}}"
        assert tier["with"] == {"stack": "${{ matrix.stack }}", "environment": cls}
        assert lists[cls] == [s for s in DEPLOYED if load_stack(s).environment_class == cls]
    assert sorted(lists["dev"] + lists["staging"] + lists["prod"]) == DEPLOYED
    assert jobs["bootstrap"]["with"]["stack"] == "${{ inputs.bootstrap }}"
    assert jobs["bootstrap"]["with"]["environment"] == "${{ needs.stacks.outputs.bootstrap-environment }}"
    assert stack_lists("deploy.yml", env={"BOOTSTRAP": "prod"})["bootstrap-environment"] == "prod"
    assert "not a deployed stack" in stack_lists("deploy.yml", env={"BOOTSTRAP": "qa"})["error"]
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
    assert "dsvolc policy-config" in cfg["run"] and job["env"]["STACK"] == "${{ inputs.stack }}"


def test_updates_run_inside_the_stacks_vpc_and_bootstrap_only_a_new_stack():
    from infra import BOOTSTRAP_ENV

    called = load("pulumi-up.yml")
    (job,) = called["jobs"].values()
    # the stack's own runner (label deepseek-volc-<stack>) unless bootstrapping a new stack
    assert "deepseek-volc-{0}" in job["runs-on"] and "self-hosted" in job["runs-on"]
    assert "inputs.bootstrap" in job["runs-on"] and "ubuntu-latest" in job["runs-on"]
    # the program refuses a bootstrap run once the cluster exists (infra/__init__.py)
    (step,) = _pulumi_steps(job)
    assert step["env"][BOOTSTRAP_ENV] == "${{ inputs.bootstrap && '1' || '0' }}"
    # only on `pulumi up`: the offline preview before it runs the program as for a later update
    assert BOOTSTRAP_ENV not in job.get("env", {})
    deploy = load("deploy.yml")
    assert deploy["jobs"]["bootstrap"]["with"]["bootstrap"] is True
    assert all("bootstrap" not in j.get("with", {}) for n, j in deploy["jobs"].items() if n != "bootstrap")
    # no workflow names a stack's runner label: the label follows the stack's name, so a new
    # stack needs none added (actionlint's config lists the literal labels only)
    text = " ".join(p.read_text() for p in WORKFLOWS.glob("*.yml"))
    labels = YAML(typ="safe").load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]
    assert not [s for s in STACKS if f"deepseek-volc-{s}" in text or f"deepseek-volc-{s}" in labels]


def test_offline_verdict_reads_no_secret_and_covers_every_stack():
    text = (WORKFLOWS / "offline-preview.yml").read_text()
    assert "secrets." not in text and "secrets: inherit" not in text
    wf = load("offline-preview.yml")
    assert "pull_request" in wf["on"] and "pull_request_target" not in wf["on"]
    assert wf["permissions"] == {} and job_permissions(wf) == {"contents": "read"}
    job = wf["jobs"]["dsvolc-preview"]
    assert job["needs"] == "stacks" and job["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.all) }}"
    assert stack_lists("offline-preview.yml")["all"] == STACKS
    runs = " ".join(s.get("run", "") for s in _steps(job))
    assert 'dsvolc.cli preview "$STACK"' in runs and job["env"]["STACK"] == "${{ matrix.stack }}"
    # the verdict's preview judges the first apply of every stack too (first_apply in the JSON);
    # the --against step compares the stack as deployed only
    verdict = next(s["run"] for s in _steps(job) if s.get("name") == "Preview and policy verdict")
    assert "--existing" not in verdict and "--new-stack" not in verdict and 'get("first_apply"' in verdict
    assert "if" not in job  # forks included


def load_stack(name: str):
    from stacks import load as load_settings

    return load_settings(name)


def test_a_new_stack_file_joins_every_matrix_without_editing_a_workflow(tmp_path):
    """`dsvolc new` writes one file; the workflows' stack lists, computed from the files at
    run time, take it in: offline and real previews, and the deploy tier of its class."""
    for part in ("stacks", ".github", "dsvolc"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path)
    name = next(n for n in ("alice", "bob", "carol", "dave") if n not in STACKS)  # a stack that is not there yet
    made = subprocess.run([sys.executable, "-m", "dsvolc.cli", "new", name, "--from", "dev", "--class", "staging",
                           "--stacks-dir", str(tmp_path / "stacks")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    assert name in stack_lists("offline-preview.yml", tmp_path)["all"]
    assert name in stack_lists("preview.yml", tmp_path)["deployed"]
    tiers = stack_lists("deploy.yml", tmp_path, env={"BOOTSTRAP": name})
    assert name in tiers["staging"] and name not in tiers["dev"] + tiers["prod"]
    assert tiers["bootstrap-environment"] == "staging"


def test_every_job_has_a_timeout():
    for path in WORKFLOWS.glob("*.yml"):
        for name, job in load(path.name)["jobs"].items():
            assert "uses" in job or job.get("timeout-minutes"), f"{path.name}:{name}"


def job_permissions(wf: dict) -> dict:
    """Every permission any job of the workflow asks for, merged."""
    out: dict = {}
    for job in wf["jobs"].values():
        out.update(job.get("permissions", {}))
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in WORKFLOWS.glob("*.yml")))
def test_least_privilege_pinned_actions_no_inherited_secrets(name):
    text = (WORKFLOWS / name).read_text()
    wf = load(name)
    assert "secrets: inherit" not in text
    # nothing at the workflow level; each job asks for what it needs
    assert wf.get("permissions") == {}
    for job_name, job in wf["jobs"].items():
        perms = job.get("permissions")
        assert perms is not None, f"{name}:{job_name} has no permissions block"
        writes = {k for k, v in perms.items() if v == "write"}
        assert writes <= ({"pull-requests"} if name == "preview.yml" else set()), f"{name}:{job_name}: {writes}"
        for step in _steps(job):
            uses = step.get("uses")
            if uses is None:
                continue
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), f"{name}:{job_name} {uses} is not pinned"
            if uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
        if "uses" in job:
            assert job["uses"].startswith("$/"), job["uses"]
    # the tag each SHA stands for is written beside it
    for line in text.splitlines():
        if re.search(r"uses: [\w.-]+/[\w./-]+@[0-9a-f]{40}", line):
            assert re.search(r"# v\d+\.\d+\.\d+$", line), line


def test_actionlint_finds_nothing():
    result = actionlint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_finds_nothing():
    result = zizmor(ROOT)
    assert result.returncode == 0 and _findings(result) == [], _findings(result) or result.stderr


def test_the_linters_catch_what_the_workflows_avoid(tmp_path):
    """The same linters on a workflow with the mistakes the project's workflows avoid: an
    unpinned action, inherited secrets, a template expanded into a shell script, a
    checkout that keeps its token."""
    bad = tmp_path / ".github" / "workflows"
    bad.mkdir(parents=True)
    (bad / "bad.yml").write_text(
        "on: pull_request\n"
        "jobs:\n"
        "  call:\n"
        "    uses: octo/repo/.github/workflows/x.yml@main\n"
        "    secrets: inherit\n"
        "  build:\n"
        "    runs-on: ubuntu-latest\n"
        "    steps:\n"
        "      - uses: actions/checkout@v4\n"
        "      - run: echo ${{ github.event.pull_request.title }}\n"
        "      - run: echo ${{ secrets.NOPE.value }}\n"
    )
    assert actionlint(tmp_path).returncode != 0
    found = " ".join(_findings(zizmor(tmp_path)))
    for audit in ("unpinned-uses", "secrets-inherit", "template-injection", "artipacked"):
        assert audit in found, (audit, found)
