"""`dsvolc bench` and `dsvolc smoke` against a live endpoint: a real CPU vLLM behind vLLM
Router (PyPI ``vllm-router``, round robin over one worker), measured and checked through the
router.

The endpoint checks a token the way a deployed one does, with one honest difference: in a
stack Envoy Gateway checks the JWT before the router and the engines check nothing; here
vLLM's own ``--api-key`` refuses requests without the key. What the router has to get right
is the same: it forwards the client's ``Authorization`` header as it came (vllm-router
0.1.17 neither adds one nor drops it in this mode), so a missing or wrong token is refused
behind it, and smoke's auth check passes. The check failing where nothing checks a token
behind the same router is tests/test_pd_nixl.py::test_smoke_against_the_router.

The model is a tiny DeepSeek-V2 with R1's thinking tokens and chat template, served under
an R1 name with vLLM's ``deepseek_r1`` reasoning parser, so smoke's reasoning check runs.
Memory: one server with 1 GiB of KV and the router; the machine-wide vLLM lock
(tests/vllm_harness.py) is held meanwhile.
"""

from __future__ import annotations

import io
import json
import os

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dsvolc import bench
from dsvolc.cli import app
from router_harness import VllmRouter, machine_server_lock, metric_sum, metrics_text, router_binary, running
from vllm_harness import VllmServer, make_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

SERVED = "deepseek-r1-tiny"
API_KEY = "bench-test-key"
IN, OUT, PROMPTS = 32, 8, 4
SWEEP = (1, 2)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, vllm_server):
    if router_binary() is None:
        msg = "vllm-router is not installed (pip install -e '.[engine]')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    # the session's one-server pool may hold the machine-wide lock from this very process
    vllm_server.__self__.stop_all()
    d = tmp_path_factory.mktemp("bench")
    model = make_tiny_model(d, "deepseek_v2", reasoning=True, initializer_range=0.3)
    server = VllmServer(model, ["--api-key", API_KEY, "--served-model-name", SERVED,
                                "--reasoning-parser", "deepseek_r1"],
                        env={"VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=d / "vllm.log")
    router = VllmRouter(["--worker-urls", server.url, "--policy", "round_robin",
                         "--request-timeout-secs", "300"], log_path=d / "router.log")
    with machine_server_lock(), running(server), router:
        yield model, server, router


def test_smoke_passes_behind_the_router_when_the_token_is_checked(endpoint):
    _, server, router = endpoint
    r = CliRunner().invoke(app, ["smoke", router.url, "--token", API_KEY, "--metrics", server.url + "/metrics"])
    lines = r.output.splitlines()
    assert r.exit_code == 0, r.output
    assert "PASS auth: refused without a token (401) and with a wrong token (401)" in lines
    for name in ("completion", "stream", "reasoning", "metrics"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), (name, r.output)
    assert lines[-1] == f"PASS {router.url}: 5 passed, 0 skipped"


def test_smoke_with_a_wrong_token_fails_the_completion(endpoint):
    _, _, router = endpoint
    r = CliRunner().invoke(app, ["smoke", router.url, "--token", "not-the-key"])
    assert r.exit_code == 1 and "FAIL models: GET /v1/models: expected 200 with a model, got 401" in r.output
    r = CliRunner().invoke(app, ["smoke", router.url, "--token", "not-the-key", "--model", SERVED])
    assert r.exit_code == 1, r.output
    assert "PASS auth:" in r.output  # the endpoint still refuses, which is what auth checks
    assert "FAIL completion: expected 200 with JSON, got 401" in r.output
    assert r.output.splitlines()[-1].startswith(f"FAIL {router.url}: 3 of 5 checks failed (completion, stream, ")


def test_bench_sweeps_through_the_router_and_sets_the_model_beside(endpoint, tmp_path):
    model, server, router = endpoint
    before = metrics_text(server.url)
    r = CliRunner().invoke(app, [
        "bench", "dev", "--base-url", router.url, "--token", API_KEY, "--model", SERVED, "--tokenizer", str(model),
        "--profile", "chat", "--input-len", str(IN), "--output-len", str(OUT), "--range-ratio", "0",
        "--concurrency", ",".join(map(str, SWEEP)), "--num-prompts", str(PROMPTS), "--results", str(tmp_path),
        "--json"])
    after = metrics_text(server.url)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [run["concurrency"] for run in doc["runs"]] == list(SWEEP)
    basis = bench.basis_for("dev", 1)
    for run in doc["runs"]:
        m = run["measured"]
        assert (m["completed"], m["failed"]) == (PROMPTS, 0), run
        assert m["total_output_tokens"] == PROMPTS * OUT  # EOS ignored, no spread: exactly OUT each
        assert m["output_throughput"] == pytest.approx(m["total_output_tokens"] / m["duration_s"], rel=1e-6)
        for metric in bench.METRICS:
            v = m[f"{metric}_ms"]
            assert 0 < v["p50"] <= v["p90"] <= v["p99"], (metric, v)
        assert m["ttft_ms"]["p50"] < m["e2el_ms"]["p50"]
        # the prediction is the performance model's for dev's plan at the same lengths
        assert run["predicted"] == bench.predict(basis, bench.profile_for("chat", IN, OUT, 0.0),
                                                 run["concurrency"])
    # every request went through the router to the engine, and only those
    gen = metric_sum(after, "vllm:generation_tokens") - metric_sum(before, "vllm:generation_tokens")
    ok = (metric_sum(after, "vllm:request_success") - metric_sum(before, "vllm:request_success"))
    assert (gen, ok) == (len(SWEEP) * PROMPTS * OUT, len(SWEEP) * PROMPTS)
    assert doc["prediction"]["basis"].startswith("stack dev: deepseek-r1-distill-qwen-7b")
    assert doc["load_generator"]["version"] and os.path.exists(doc["load_generator"]["log"])
    out = io.StringIO()
    bench.render(doc, Console(file=out, width=200))
    print(out.getvalue())  # the table, for whoever reads the test's output


def test_bench_with_a_wrong_token_reports_the_refusal(endpoint, tmp_path):
    model, _, router = endpoint
    r = CliRunner().invoke(app, [
        "bench", "--base-url", router.url, "--token", "not-the-key", "--model", SERVED, "--tokenizer", str(model),
        "--input-len", str(IN), "--output-len", str(OUT), "--concurrency", "1", "--num-prompts", "1",
        "--results", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert "concurrency 1: 1 of 1 requests failed; first error: Unauthorized" in r.output
