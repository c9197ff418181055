"""Prefill/decode disaggregation with real processes: two CPU vLLM servers with vLLM's
NixlConnector behind vLLM Router (PyPI ``vllm-router``) in its P/D mode.

The router sends each request to the prefill server first (``max_tokens`` 1, ``do_remote_decode``),
then to the decode server with the prefill's ``kv_transfer_params``; the decode server pulls
the prompt's KV from the prefill server over NIXL (UCX over loopback, KV in host memory) and
only decodes. What the tests read:

* ``vllm:prompt_tokens_by_source_total`` of the decode server: ``source="local_compute"`` (prompt
  tokens it prefilled itself) must not move, ``source="external_kv_transfer"`` must grow by the
  prompts' length. ``vllm:prompt_tokens_total`` counts every prompt token whatever its source,
  so it cannot tell the two apart.
* greedy output through the router against the decode server's own (aggregated) output for
  the same prompts: the server is its own reference, which saves a third server.
* a prefill server killed with SIGKILL: the client gets an HTTP 5xx at once naming the prefill
  failure; a prefill restarted on the same address serves through the same router again.

The same servers stand in for a deployed endpoint for ``dsvolc smoke``: a tiny DeepSeek-V2
named like an R1 model, with R1's thinking tokens and chat template and vLLM's ``deepseek_r1``
reasoning parser. They check no token (vllm-router 0.1.17 in P/D mode answered 401 for every
request once the servers had ``--api-key``), so smoke's auth check must fail here.

Memory: two tiny servers with 1 GiB of KV each and the router, about 3 GiB in all. While
they run, the machine-wide vLLM lock (tests/vllm_harness.py) is held.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

import pytest
from typer.testing import CliRunner

from dsvolc import smoke
from dsvolc.cli import app
from router_harness import (VllmRouter, machine_server_lock, metric_sum, metrics_text, nixl_available,
                            nixl_kv_transfer_config, router_binary, running)
from vllm_harness import VllmServer, make_tiny_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

SERVED = "deepseek-r1-tiny-pd"  # an R1 name: `dsvolc smoke` expects separated reasoning
API_KEY = "pd-test-key"
PROMPTS = [" ".join(["the quick brown fox jumps over the lazy dog"] * 10),
           " ".join(["hello world this is a tiny test model"] * 8)]
REQUEST_TIMEOUT_S = 300  # a loaded 2-core machine takes a minute for a first request


def _require_tools() -> None:
    import importlib.util

    missing = [n for n, ok in (("vllm", importlib.util.find_spec("vllm") is not None),
                               ("nixl", nixl_available()), ("vllm-router", router_binary() is not None)) if not ok]
    if missing:
        msg = f"{', '.join(missing)} not installed (pip install -e '.[engine]')"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def post(url: str, path: str, body: dict, *, token: str | None = API_KEY,
         timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def greedy(url: str) -> list[tuple[str, list[str], int]]:
    """(text, tokens, prompt tokens) of a greedy 8-token completion of each prompt."""
    out = []
    for p in PROMPTS:
        status, doc = post(url, "/v1/completions", {"model": SERVED, "prompt": p, "max_tokens": 8,
                                                    "temperature": 0, "logprobs": 0})
        assert status == 200, doc
        c = doc["choices"][0]
        out.append((c["text"], c["logprobs"]["tokens"], doc["usage"]["prompt_tokens"]))
    return out


@dataclass
class PD:
    model: str
    prefill: VllmServer
    decode: VllmServer
    router: VllmRouter
    log_dir: str
    aggregated: list = field(default_factory=list)
    extra: list = field(default_factory=list)  # restarted prefill servers, stopped at teardown

    def new_prefill(self) -> VllmServer:
        """A prefill server on the first one's address (the router's static --prefill URL)."""
        return _server(self.model, "prefill", self.log_dir, port=self.prefill.port, n=len(self.extra) + 2)


def _server(model, role: str, log_dir, *, port: int | None = None, n: int = 1) -> VllmServer:
    return VllmServer(
        model,
        ["--kv-transfer-config", nixl_kv_transfer_config(), "--served-model-name", SERVED,
         "--reasoning-parser", "deepseek_r1"],
        # the harness's engines run their worker in the engine core (vllm_harness.DEFAULT_SERVER_ENV),
        # one torch thread each: the two engines do not spin OpenMP threads against each other
        # on a 2-core machine (two threads each slowed a request to a minute)
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        # each engine's NIXL handshake listener: picked when the server starts (after the
        # machine-wide lock), again if it was taken
        port_env=("VLLM_NIXL_SIDE_CHANNEL_PORT",),
        port=port, log_path=os.path.join(log_dir, f"{role}-{n}.log"))


@pytest.fixture(scope="module")
def pd(tmp_path_factory, vllm_server):
    _require_tools()
    # the session's one-server pool (tests/conftest.py) may still run a server, holding the
    # machine-wide lock from this very process: stop it, or the lock below waits on itself
    vllm_server.__self__.stop_all()
    d = tmp_path_factory.mktemp("pd")
    # initializer_range 0.3: the random model's greedy tokens depend on the prompt, so equal
    # outputs mean the same KV (at 0.02 every prompt gives the same token)
    model = make_tiny_model(d, "deepseek_v2", reasoning=True, initializer_range=0.3)
    log_dir = str(d)
    prefill = _server(model, "prefill", log_dir)
    decode = _server(model, "decode", log_dir)
    router = VllmRouter(["--vllm-pd-disaggregation", "--prefill", prefill.url, "--decode", decode.url,
                         "--policy", "round_robin", "--request-timeout-secs", str(REQUEST_TIMEOUT_S),
                         "--health-check-interval-secs", "2", "--cb-timeout-duration-secs", "5"],
                        log_path=os.path.join(log_dir, "router.log"))
    with machine_server_lock(), running(prefill, decode):
        state = PD(str(model), prefill, decode, router, log_dir)
        state.aggregated = greedy(decode.url)  # the decode server alone: the reference
        try:
            with router:
                yield state
        finally:
            for s in state.extra:
                s.stop()


def test_decode_computes_no_prompt_token_and_matches_the_aggregated_output(pd):
    assert len({text for text, _, _ in pd.aggregated}) == len(PROMPTS)  # outputs depend on the prompt
    before_d, before_p = metrics_text(pd.decode.url), metrics_text(pd.prefill.url)
    through_router = greedy(pd.router.url)
    after_d, after_p = metrics_text(pd.decode.url), metrics_text(pd.prefill.url)

    def moved(before, after, name, **labels):
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    prompt_tokens = sum(n for _, _, n in through_router)
    src = "vllm:prompt_tokens_by_source"
    assert moved(before_d, after_d, src, source="local_compute") == 0
    assert moved(before_d, after_d, src, source="external_kv_transfer") == prompt_tokens
    assert moved(before_p, after_p, src, source="local_compute") == prompt_tokens  # prefill did the work
    assert moved(before_d, after_d, "vllm:nixl_num_failed_transfers") == 0
    assert [(t, toks) for t, toks, _ in through_router] == [(t, toks) for t, toks, _ in pd.aggregated]


def test_the_router_serves_every_router_metric_the_alerts_read(pd):
    # the vendored scrape (tests/data/vllm-router-0.1.17-metrics.txt) against the live router
    from test_autoscaling import ctx_for
    from test_metrics_contract import referenced

    greedy(pd.router.url)  # a routed request, so the request families exist
    live = metrics_text(f"http://127.0.0.1:{pd.router.prometheus_port}")
    served = {line.split()[2] for line in live.splitlines() if line.startswith("# TYPE ")}
    read = {n for n in referenced(ctx_for("prod")) if n.startswith("vllm_router_")}
    assert read and read <= served, sorted(read - served)
    vendored = {line.split()[0] for line in open(os.path.join(os.path.dirname(__file__), "data",
                                                              "vllm-router-0.1.17-metrics.txt"))}
    assert read <= vendored


def test_smoke_against_the_router(pd):
    """Every check but auth passes; auth fails: neither the router nor these servers check a
    token (in a stack the edge's JWT check does), and smoke says so instead of passing."""
    result = CliRunner().invoke(app, ["smoke", pd.router.url, "--token", API_KEY, "--metrics",
                                      pd.decode.url + "/metrics", "--timeout", str(REQUEST_TIMEOUT_S)])
    lines = result.output.splitlines()
    assert result.exit_code == 1, result.output
    for name in ("completion", "stream", "reasoning", "metrics"):
        assert any(ln.startswith(f"PASS {name}:") for ln in lines), (name, result.output)
    assert any(ln.startswith("FAIL auth: expected 401 or 403 without a token, got 200") for ln in lines), result.output
    assert lines[-1] == f"FAIL {pd.router.url}: 1 of 5 checks failed (auth)"
    # told the model does not reason, the reasoning check is skipped, not passed
    checks = smoke.run_checks(smoke.Target(pd.router.url, SERVED, False), API_KEY, timeout=REQUEST_TIMEOUT_S)
    assert {c.name: c.status for c in checks}["reasoning"] == "SKIP"


def test_a_killed_prefill_gives_a_clear_error_and_the_router_recovers(pd):
    os.killpg(pd.prefill.proc.pid, signal.SIGKILL)
    pd.prefill.proc.wait(timeout=30)
    t0 = time.monotonic()
    status, body = post(pd.router.url, "/v1/completions", {"model": SERVED, "prompt": PROMPTS[0], "max_tokens": 8},
                        timeout=60)
    took = time.monotonic() - t0
    assert 500 <= status < 600, (status, body)
    assert "Prefill request" in str(body) and pd.prefill.url in str(body), body
    assert took < 30, f"the error took {took:.0f}s"

    restarted = pd.new_prefill()
    pd.extra.append(restarted)
    restarted.start()
    deadline = time.monotonic() + 120
    while True:  # the router's circuit breaker closes again after --cb-timeout-duration-secs
        status, body = post(pd.router.url, "/v1/completions", {"model": SERVED, "prompt": PROMPTS[1],
                                                               "max_tokens": 8, "temperature": 0, "logprobs": 0})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(3)
    assert status == 200, body
    assert body["choices"][0]["text"] == pd.aggregated[1][0]
