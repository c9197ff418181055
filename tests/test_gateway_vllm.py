"""The gateway's two contracts with a real vLLM, run with the rendered engine arguments and
environment:

* keep-alive ordering: vLLM keeps an idle connection open longer than the proxies'
  rendered upstream idle timeout (BackendTrafficPolicy connectionIdleTimeout), so a proxy
  never sends on a connection vLLM has closed;
* token budget: with the budget on, a stream whose client asked for no usage still ends
  with it (--enable-force-include-usage), and the proxies' usage script, run in LuaJIT
  over the exact bytes vLLM sent, charges its total_tokens.

Same differences from the GPU deployment as tests/test_serving_vllm.py (GPU-only flags
dropped, the tiny model's own context, the test server's host and port). The keep-alive
is set shorter than the shipped 60 s so the test waits seconds, not a minute.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.request

import pytest

from test_autoscaling import ctx_for
from test_token_budget import _charged
from vllm_harness import VllmServer
from workloads.edge import gateway
from workloads.engine import engine_args

pytestmark = pytest.mark.integration
KEEPALIVE_S = 9  # well apart from vLLM's default of 5 s


@pytest.fixture(scope="module")
def rendered(tiny_deepseek_v2):
    ctx = ctx_for("dev", gateway__proxies__engine_keepalive_seconds=KEEPALIVE_S,
                  serving__rate_limits__tokens=100_000)
    a = engine_args.from_context(ctx, str(tiny_deepseek_v2))
    cfg = json.loads((tiny_deepseek_v2 / "config.json").read_text())
    a = dataclasses.replace(a, max_model_len=cfg["max_position_embeddings"])
    args = engine_args.without_flags(engine_args.render(a), engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})
    env = {e["name"]: e["value"] for e in gateway.engine_env(ctx)}
    with VllmServer(tiny_deepseek_v2, args=args, env=env) as srv:
        yield ctx, srv


def _request(sock: socket.socket, host: str) -> bytes:
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        part = sock.recv(4096)
        assert part, f"connection closed before a response: {head!r}"
        head += part
    return head


def test_vllm_outlasts_the_proxies_idle_timeout(rendered):
    ctx, srv = rendered
    http = next(o for o in gateway.render(ctx) if o["kind"] == "BackendTrafficPolicy")["spec"]["timeout"]["http"]
    proxy_idle = int(http["connectionIdleTimeout"].rstrip("s"))
    with socket.create_connection((srv.host, srv.port), timeout=60) as sock:
        assert _request(sock, srv.host).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        # the proxy would reuse the connection up to its idle timeout: it is still open then
        time.sleep(proxy_idle - 0.5)
        assert _request(sock, srv.host).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert sock.recv(1) == b""  # vLLM closes it, idle
        closed_after = time.monotonic() - idle_from
    assert proxy_idle < closed_after, (proxy_idle, closed_after)
    # vLLM took the rendered keep-alive (uvicorn closes on its next timer tick after it)
    assert KEEPALIVE_S - 1 < closed_after < KEEPALIVE_S + 3, closed_after


def _post(srv: VllmServer, body: dict) -> bytes:
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


@pytest.mark.parametrize("stream", [True, False])
def test_the_usage_script_charges_what_vllm_reports(rendered, stream):
    ctx, srv = rendered
    body = {"model": ctx.served_model_name, "prompt": "the quick brown fox", "max_tokens": 37,
            "temperature": 0, "ignore_eos": True, "stream": stream}  # no stream_options: usage is forced
    raw = _post(srv, body).decode()
    if stream:
        events = [json.loads(line[5:]) for line in raw.splitlines()
                  if line.startswith("data: {")]
        usage = events[-1]["usage"]
    else:
        usage = json.loads(raw)["usage"]
    assert usage["completion_tokens"] == 37
    assert _charged(raw) == str(usage["total_tokens"])
    assert _charged(raw, 13) == str(usage["total_tokens"])
