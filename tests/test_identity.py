"""Identity: no provider defaults in code, placeholders refused where it matters.

The shipped staging and prod stacks name a placeholder identity provider in an RFC 2606
example domain, on purpose: they are templates, and an unfilled one must not reach
`pulumi up`. So their previews exit 1 naming exactly that policy and those fields, and
nothing else; the same stacks with a provider filled in preview clean
(tests/stack_fixtures.py), and dev tolerates the placeholder with an advisory.
"""

from __future__ import annotations

import copy

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from dsvolc import preview
from dsvolc.cli import app
from policies.gateway import reserved_domain
from stacks import SettingsError, parse, parse_plan, read_raw
from tests.k8s_schema import validate_all
from tests.stack_fixtures import FILLED_IDENTITY, filled_raw, filled_stack_file
from workloads.edge import gateway
from stacks.plan import build_plan
from workloads.engine.context import build_context

POLICY = "identity-provider-not-placeholder"
EDGE_POLICY = "edge-domain-not-placeholder"
PLACEHOLDER_FIELDS = ("serving.auth.issuer", "serving.auth.jwks_uri")


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_shipped_staging_and_prod_stop_at_the_placeholder_and_nothing_else(stack):
    result = runner_preview(stack)
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    for field in PLACEHOLDER_FIELDS:
        assert f"mandatory {POLICY}: {field} is 'https://fill-in-your-issuer.example/" in out, field
    r = preview.run_preview(stack, mode="existing")
    mine = [v for v in r.mandatory if v["policy"] == POLICY]
    named = sorted(v["message"].split(" ", 1)[0] for v in mine)
    assert named == sorted(PLACEHOLDER_FIELDS)  # the audience deepseek-api is no domain
    # The only other stop: prod runs images by digest only, and none is recorded in the
    # repository until the mirror and the build record them (tests/test_mirror.py).
    other = {v["policy"] for v in r.mandatory} - {POLICY, EDGE_POLICY}
    assert other == ({"images-by-digest"} if stack == "prod" else set())
    assert {v["policy"] for v in r.violations if v["enforcement_level"] == "advisory"} <= {"images-by-digest"}


def runner_preview(stack):
    return CliRunner().invoke(app, ["preview", stack, "--quiet"], env={"COLUMNS": "400"})


def test_dev_may_keep_the_placeholder_with_an_advisory():
    r = preview.run_preview("dev", mode="existing")
    mine = [v for v in r.violations if v["policy"] == POLICY]
    assert {v["enforcement_level"] for v in mine} == {"advisory"} and len(mine) == 2
    assert r.mandatory == []


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_filled_in_stacks_preview_clean(stack, tmp_path):
    result = CliRunner().invoke(app, ["preview", str(filled_stack_file(stack, tmp_path)), "--quiet"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value, domain", [
    ("https://auth.example.com/", "example.com"),
    ("https://EXAMPLE.org", "example.org"),
    ("https://id.corp.example.net:8443/realms/x", "example.net"),
    ("https://fill-in-your-issuer.example/", ".example"),
    ("https://idp.test/.well-known/jwks.json", ".test"),
    ("https://keys.invalid", ".invalid"),
    ("http://localhost:8080/", ".localhost"),
    ("auth.example.com", "example.com"),
    ("https://login.deepseek-volc.internal/", None),
    ("https://example.com.cn/", None),  # a real registrable name under .cn
    ("https://notexample.com/", None),
    ("https://examples.test.cn/", None),
    ("deepseek-api", None),
    ("", None),
])
def test_reserved_domains(value, domain):
    assert reserved_domain(value) == domain


def _with_auth(stack: str, **auth) -> dict:
    raw = filled_raw(stack)
    raw["serving"]["auth"] = auth
    return raw


BAD = [
    ({"audiences": ["a"], "jwks_uri": "https://k.internal/j"}, "serving.auth.issuer", "required when auth is enabled"),
    ({"issuer": "https://i.internal/", "jwks_uri": "https://k.internal/j"}, "serving.auth.audiences", "at least one"),
    ({"issuer": "https://i.internal/", "audiences": [], "jwks_uri": "https://k.internal/j"},
     "serving.auth.audiences", "at least one"),
    ({"issuer": "https://i.internal/", "audiences": ["a"]}, "serving.auth.jwks_uri", "exactly one of jwks_uri"),
    ({"issuer": "https://i.internal/", "audiences": ["a"], "jwks_uri": "https://k.internal/j",
      "jwks_configmap": "jwks"}, "serving.auth.jwks_uri", "exactly one of jwks_uri"),
    ({"issuer": "https://i.internal/", "audiences": ["a"], "jwks_uri": "http://k.internal/j"},
     "serving.auth.jwks_uri", "pattern"),
    ({"issuer": "https://i.internal/", "audiences": ["a"], "jwks_configmap": "Bad_Name"},
     "serving.auth.jwks_configmap", "pattern"),
]


@pytest.mark.parametrize("auth, path, expected", BAD, ids=[b[1] + ":" + b[2][:16] for b in BAD])
def test_bad_identity_settings_name_the_field(auth, path, expected):
    with pytest.raises(SettingsError) as info:
        parse_plan(_with_auth("prod", **auth), "prod", stack="prod")
    line = next((p for p in info.value.problems if p.startswith(path)), None)
    assert line is not None and expected in line, info.value.problems


def test_no_identity_provider_defaults_in_code():
    """A stack that names no provider is refused: nothing falls back to a default."""
    raw = copy.deepcopy(read_raw("prod"))
    del raw["serving"]["auth"]
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, "prod", stack="prod")
    assert "serving.auth: required value is missing" in info.value.problems
    # auth off needs nothing else (the gateway policies refuse it instead)
    raw["serving"]["auth"] = {"enabled": False}
    assert parse(raw, "prod", stack="prod").serving.auth.issuer is None


def _jwt_provider(raw: dict) -> dict:
    s = parse(raw, "prod", stack="prod")
    ctx = build_context(build_plan(s), image_repository="r.internal/x/y")
    (policy,) = [o for o in gateway.render(ctx) if o["kind"] == "SecurityPolicy"]
    validate_all([policy], s.cluster.kubernetes_version)
    (provider,) = policy["spec"]["jwt"]["providers"]
    return provider


def test_the_gateway_trusts_exactly_the_named_provider():
    p = _jwt_provider(filled_raw("prod"))
    assert p["issuer"] == FILLED_IDENTITY["issuer"] and p["audiences"] == FILLED_IDENTITY["audiences"]
    assert p["remoteJWKS"] == {"uri": FILLED_IDENTITY["jwks_uri"]} and "localJWKS" not in p


def test_a_key_set_from_a_configmap():
    raw = _with_auth("prod", issuer="https://login.deepseek-volc.internal/", audiences=["deepseek-api"],
                     jwks_configmap="idp-jwks")
    p = _jwt_provider(raw)
    assert "remoteJWKS" not in p
    assert p["localJWKS"] == {"type": "ValueRef", "valueRef": {"group": "", "kind": "ConfigMap", "name": "idp-jwks"}}
    r = preview.run_preview("prod", raw=raw, mode="existing")
    assert r.mandatory == [], r.mandatory


@pytest.mark.slow  # runs the workflow step: whole previews in fresh processes
def test_offline_preview_workflow_accepts_only_the_fill_in_verdicts(tmp_path):
    """The pull-request check previews the shipped templates: it passes on exit 0, or on
    exit 1 whose mandatory violations all are fill-ins (the placeholder identity provider,
    prod's unrecorded digests); any other mandatory violation fails it."""
    from pathlib import Path

    wf = YAML(typ="safe").load((Path(__file__).resolve().parent.parent / ".github/workflows/offline-preview.yml")
                               .read_text())
    steps = wf["jobs"]["dsvolc-preview"]["steps"]
    (run,) = [s for s in steps if s.get("name") == "Preview and policy verdict"]
    assert "dsvolc.cli preview" in run["run"] and POLICY in run["run"]
    # run the step's shell as the runner would, on the shipped prod and on an unsafe copy
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    root = Path(__file__).resolve().parent.parent

    def step(stack: str) -> int:
        script = run["run"].replace("${{ matrix.stack }}", stack)  # the step reads $STACK (the job's env)
        return subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path,
                              env={**env, "PYTHONPATH": str(root), "STACK": stack},
                              capture_output=True, text=True, timeout=300).returncode

    assert step("prod") == 0  # stack names resolve to stacks/ from any directory
    raw = read_raw("prod")
    raw["cluster"]["api_server_public"] = True
    unsafe = tmp_path / "Pulumi.unsafe.yaml"
    unsafe.write_text(__import__("yaml").safe_dump({"config": {"deepseek-volc:settings": raw}}))
    assert step(unsafe.name) == 1


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_the_placeholder_edge_domain_is_refused_in_the_first_apply(stack):
    """The custom domain is created in phase 1: an example domain and a made-up certificate
    id stop that `pulumi up` too, each naming its setting."""
    r = preview.run_preview(stack, mode="new")
    assert r.deploy_phase["phase"] == 1
    mine = sorted(v["message"].split(" ", 1)[0] for v in r.mandatory if v["policy"] == EDGE_POLICY)
    assert mine == ["gateway.tls.certificate_id", "gateway.tls.domain"]
    assert {v["policy"] for v in r.mandatory} == {EDGE_POLICY}
    ok = preview.run_preview(stack, mode="new", raw=filled_raw(stack))
    assert ok.mandatory == []


def test_dev_may_keep_the_placeholder_domain_with_an_advisory():
    r = preview.run_preview("dev", mode="new")
    mine = [v for v in r.violations if v["policy"] == EDGE_POLICY]
    assert {v["enforcement_level"] for v in mine} == {"advisory"} and len(mine) == 2
