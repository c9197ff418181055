"""`dsvolc smoke`'s argument handling (no endpoint needed); the checks themselves run against
real vLLM servers behind vllm-router in tests/test_pd_nixl.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dsvolc import smoke
from dsvolc.cli import app
from vllm_harness import free_port


def test_no_token_is_a_usage_error(monkeypatch):
    monkeypatch.delenv(smoke.TOKEN_ENV, raising=False)
    r = CliRunner().invoke(app, ["smoke", "http://127.0.0.1:1"])
    assert r.exit_code == 2
    assert "--token" in r.output and "Traceback" not in r.output


def test_a_stack_without_a_public_domain_names_the_setting():
    r = CliRunner().invoke(app, ["smoke", "no-such-stack", "--token", "t"])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output


def test_a_stack_resolves_to_its_domain_model_and_reasoning():
    from stacks import load

    s = load("prod")
    t = smoke.resolve("prod", None, None)
    assert t.url == f"https://{s.gateway.tls.domain}"
    assert t.model == (s.serving.served_model_name or "deepseek-r1") and t.reasoning is True


def test_nothing_listening_fails_each_check_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}"
    r = CliRunner().invoke(app, ["smoke", url, "--token", "t", "--model", "m", "--timeout", "5"])
    assert r.exit_code == 1
    assert "FAIL auth: no answer" in r.output and r.output.splitlines()[-1].startswith(f"FAIL {url}:")
