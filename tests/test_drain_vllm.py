"""A real vLLM told to stop, as the kubelet tells it after the preStop delay (SIGTERM to
the container's main process), finishes the generation in flight when it runs with the
rendered arguments (`--shutdown-timeout` = serving.inflight_drain_seconds), and cuts it with
vLLM's default (0). This is what the termination grace has to cover.

Same differences from the GPU deployment as tests/test_serving_vllm.py (GPU-only flags
dropped, the tiny model's own context, the test server's host and port).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
import urllib.request

import pytest

from stacks import load
from vllm_harness import VllmServer
from workloads.engine import engine_args
from stacks.plan import build_plan
from workloads.engine.context import build_context

pytestmark = pytest.mark.integration
MAX_TOKENS = 400


def rendered_args(model_dir, shutdown_timeout=None) -> tuple[object, list[str]]:
    s = load("dev")
    ctx = build_context(build_plan(s), image_repository="r.example/ns/repo")
    a = engine_args.from_context(ctx, str(model_dir))
    cfg = json.loads((model_dir / "config.json").read_text())
    a = dataclasses.replace(a, max_model_len=cfg["max_position_embeddings"])
    if shutdown_timeout is not None:
        a = dataclasses.replace(a, shutdown_timeout=shutdown_timeout)
    return ctx, engine_args.without_flags(engine_args.render(a), engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})


def stream_while_stopping(srv: VllmServer, model: str, delay: float = 0.5, max_tokens: int = MAX_TOKENS) -> dict:
    """Start a long streamed generation, SIGTERM the server `delay` seconds after the first
    token, and report how the stream ended."""
    body = {"model": model, "prompt": "the quick brown fox", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    # a chunk is not a token: when the reader lags, vLLM merges the tokens produced meanwhile
    # into one chunk, so the count of generated tokens comes from the final usage chunk
    out = {"chunks": 0, "tokens": None, "finish_reason": None, "error": None}
    first = threading.Event()

    def read():
        try:
            # tokens flow every few ms on the tiny model: 30 s without one is a stalled stream
            # (after a cut, vLLM's default can leave the connection open with nothing to send)
            with urllib.request.urlopen(req, timeout=30) as r:
                for line in r:
                    if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        out["tokens"] = chunk["usage"]["completion_tokens"]
                    for choice in chunk["choices"]:
                        out["chunks"] += 1
                        out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
                    first.set()
        except Exception as exc:  # noqa: BLE001 - a cut stream is the outcome under test
            out["error"] = repr(exc)
        finally:
            first.set()

    t = threading.Thread(target=read)
    t.start()
    assert first.wait(120), "no token streamed"
    time.sleep(delay)
    srv.proc.send_signal(signal.SIGTERM)  # the kubelet signals the container's main process
    t.join(300)
    out["exit_code"] = srv.proc.wait(120)
    return out


def test_a_stopping_vllm_finishes_the_request_in_flight(tiny_deepseek_v2):
    ctx, args = rendered_args(tiny_deepseek_v2)
    assert args[args.index("--shutdown-timeout") + 1] == str(ctx.settings.serving.inflight_drain_seconds)
    with VllmServer(tiny_deepseek_v2, args=args) as srv:
        out = stream_while_stopping(srv, ctx.served_model_name)
    assert out["error"] is None and out["finish_reason"] == "length", out
    assert out["tokens"] == MAX_TOKENS, out


def test_with_vllms_default_the_request_is_cut(tiny_deepseek_v2):
    """The control: without the rendered drain, the same request does not finish."""
    ctx, args = rendered_args(tiny_deepseek_v2, shutdown_timeout=0)
    # As long a generation as the tiny model's context holds, signalled at the first token:
    # on an idle machine it wrote 400 tokens within vLLM's own shutdown path (a fresh-clone
    # run saw all 400 with the signal at the first token), and a finished request proves nothing.
    longest = int(args[args.index("--max-model-len") + 1]) - 16
    with VllmServer(tiny_deepseek_v2, args=args) as srv:
        out = stream_while_stopping(srv, ctx.served_model_name, delay=0.0, max_tokens=longest)
    assert longest > 4 * MAX_TOKENS
    assert out["finish_reason"] != "length" or (out["tokens"] or 0) < longest, out
