"""`dsvolc new NAME --from STACK`: a new environment is one command. The file it writes
keeps the source's comments, names its cloud resources, API host and certificate after
NAME, previews with the source's verdict, and the tests and workflows that list stacks
take it in without editing anything else."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dsvolc.cli import app
from dsvolc.preview import run_both
from stacks import read_raw
from stacks.loader import SETTINGS_KEY

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture
def stacks_dir(tmp_path) -> Path:
    """The shipped dev, staging and prod stack files and the files they name (the mirror
    lock), in a directory of their own: the names these tests make are free there whatever
    other stacks the repository holds."""
    d = tmp_path / "stacks"
    d.mkdir()
    for p in (ROOT / "stacks").glob("*.yaml"):
        if not p.name.startswith("Pulumi.") or p.name in ("Pulumi.dev.yaml", "Pulumi.staging.yaml", "Pulumi.prod.yaml"):
            shutil.copy(p, d)
    return d


def new(*args: str, stacks_dir: Path):
    return runner.invoke(app, ["new", *args, "--stacks-dir", str(stacks_dir)])


def _mandatory(result) -> set[str]:
    found = result.violations + (result.first_apply.violations if result.first_apply else [])
    return {v["policy"] for v in found if v["enforcement_level"] == "mandatory"}


def test_new_copies_a_stack_under_its_own_names_keeping_its_comments(stacks_dir):
    result = new("alice", "--from", "dev", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    path = stacks_dir / "Pulumi.alice.yaml"
    assert f"wrote {path}" in result.output and "class dev" in result.output
    text, source = path.read_text(), (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    # every comment of the source is kept (its first line now says it describes the source)
    comments = [line.strip() for line in source.splitlines() if line.strip().startswith("#")]
    assert all(c in text for c in comments[1:]) and comments[0].replace("# dev:", "# dev (the source):") in text
    assert text.startswith("# alice: made from stack dev")
    # the settings are the source's, the API host and certificate follow the new name
    raw, dev = yaml.safe_load(text)["config"][SETTINGS_KEY], read_raw("dev")
    assert raw["gateway"]["tls"] == {**dev["gateway"]["tls"], "domain": "api.alice.deepseek.example.com",
                                     "certificate_id": "cert-deepseek-alice"}
    assert {k: v for k, v in raw.items() if k != "gateway"} == {k: v for k, v in dev.items() if k != "gateway"}
    # it previews as the source does: the same verdict, nothing named after the source
    ours, theirs = run_both(str(path)), run_both("dev")
    assert ours.stack == "alice" and ours.environment_class == "dev"
    assert _mandatory(ours) == _mandatory(theirs) == set()
    assert {v["policy"] for v in ours.violations} == {v["policy"] for v in theirs.violations}
    dump = json.dumps(ours.as_json())
    assert "deepseek-alice-vke" in dump and "deepseek-dev" not in dump and "api.dev." not in dump


@pytest.mark.parametrize("source", ["staging", "prod"])
def test_a_copy_keeps_its_sources_verdict(stacks_dir, source):
    """Staging and prod ship with fill-ins their policies refuse (the identity provider, the
    digests): a copy is refused for exactly those, not for anything the copy changed."""
    result = new("alice", "--from", source, stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert _mandatory(run_both(str(stacks_dir / "Pulumi.alice.yaml"))) == _mandatory(run_both(source))


def test_class_sets_the_environment_class_and_with_it_the_policy_config(stacks_dir):
    result = new("bob", "--from", "dev", "--class", "staging", stacks_dir=stacks_dir)
    assert result.exit_code == 0, result.output
    assert "environment_class: dev -> staging" in result.output
    path = stacks_dir / "Pulumi.bob.yaml"
    assert yaml.safe_load(path.read_text())["config"][SETTINGS_KEY]["environment_class"] == "staging"
    shown = runner.invoke(app, ["preview", str(path), "--quiet"])
    assert "stack bob: class staging, policy config policies/config/staging.json" in " ".join(shown.output.split())


@pytest.mark.parametrize("args,words", [
    (["Alice", "--from", "dev"], "NAME: 'Alice' is not a stack name"),
    (["a_b", "--from", "dev"], "NAME: 'a_b' is not a stack name"),
    (["a" * 21, "--from", "dev"], "1-20 characters"),
    (["-", "--from", "dev"], "NAME: '-' is not a stack name"),
    (["prod", "--from", "dev"], "Pulumi.prod.yaml exists: stack 'prod' is already defined"),
    (["carol", "--from", "qa"], "--from: no stack file"),
    (["carol", "--from", "dev", "--class", "qa"], "--class: 'qa' is not an environment class; expected dev, staging"),
    (["carol", "--from", "dev", "--domain", "api.dev.deepseek.example.com"],
     "gateway.tls.domain: api.dev.deepseek.example.com is served by stack dev already"),
])
def test_bad_input_exits_2_naming_it_and_writes_nothing(stacks_dir, args, words):
    before = sorted(p.name for p in stacks_dir.iterdir())
    result = new(*args, stacks_dir=stacks_dir)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()) and "Traceback" not in result.output
    assert sorted(p.name for p in stacks_dir.iterdir()) == before


def test_a_value_that_cannot_follow_the_name_is_asked_for_and_explicit_names_follow_it(stacks_dir):
    raw = read_raw("dev")
    raw["gateway"]["tls"]["domain"] = "api.deepseek.example.com"  # no stack name in it
    raw["cluster"]["name"] = "deepseek-shared-main"
    raw["weights"]["bucket_name"] = "team-weights"
    (stacks_dir / "Pulumi.shared.yaml").write_text(yaml.safe_dump({"config": {SETTINGS_KEY: raw}}))
    refused = new("dave", "--from", "shared", stacks_dir=stacks_dir)
    assert refused.exit_code == 2 and "gateway.tls.domain" in refused.output and "--domain" in refused.output
    assert not (stacks_dir / "Pulumi.dave.yaml").exists()
    made = new("dave", "--from", "shared", "--domain", "api.dave.deepseek.example.com",
               "--certificate-id", "cert-dave", stacks_dir=stacks_dir)
    assert made.exit_code == 0, made.output
    got = yaml.safe_load((stacks_dir / "Pulumi.dave.yaml").read_text())["config"][SETTINGS_KEY]
    assert got["gateway"]["tls"]["domain"] == "api.dave.deepseek.example.com"
    assert got["gateway"]["tls"]["certificate_id"] == "cert-dave"
    # the cluster name had the source's name in it; the bucket's did not, so it is derived again
    assert got["cluster"]["name"] == "deepseek-dave-main" and "bucket_name" not in got["weights"]
    assert "weights.bucket_name: team-weights removed" in made.output


def _copy_repo(dest: Path) -> None:
    skip = shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.egg-info", ".pytest_cache")
    shutil.copytree(ROOT, dest, ignore=skip)
    # actionlint finds the workflows through the repository's root
    subprocess.run(["git", "init", "-q", str(dest)], check=True, timeout=60)


@pytest.mark.slow
def test_the_tests_that_list_stacks_pass_with_a_new_one(tmp_path):
    """In a copy of the repository: `dsvolc new alice --from dev`, then the tests that
    enumerate the stack files (the workflows' matrices, the CLI's list of known stacks, the
    program's objects against their schemas, pod hardening and checkov's scan of every
    stack) pass, alice included."""
    repo = tmp_path / "repo"
    _copy_repo(repo)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    # checkov: the copy finds the same executable (DSVOLC_CHECKOV, or .ci/run's virtualenv
    # outside the checkout)
    name = next(n for n in ("alice", "bob", "carol", "dave") if not (repo / "stacks" / f"Pulumi.{n}.yaml").exists())
    made = subprocess.run([sys.executable, "-m", "dsvolc.cli", "new", name, "--from", "dev"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (repo / "stacks" / f"Pulumi.{name}.yaml").is_file()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rA",
         "tests/test_workflows.py", "tests/test_cli.py::test_unknown_stack_exit_2_lists_known_stacks",
         "tests/test_program_schemas.py::test_every_registered_object_is_schema_valid",
         "tests/test_pod_hardening.py", "tests/test_checkov.py"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"test_every_registered_object_is_schema_valid[{name}]" in run.stdout
    from test_checkov import checkov

    if checkov():  # the scan ran (the copy finds the same executable), the new stack among those it saw
        assert "PASSED tests/test_checkov.py::test_every_finding_is_a_documented_skip" in run.stdout
