"""The planner's KV-cache arithmetic against the real engine.

For tiny random-weight models of three real architectures (deepseek_v2: MLA + MoE;
qwen2: GQA with biases; llama: GQA with one KV head) the real vLLM CPU engine is
started with a fixed KV budget (``VLLM_CPU_KVCACHE_SPACE`` GiB) and the capacity it
logs ("CPU KV cache size: N tokens") must match ``kv_cache_tokens_for_bytes`` for
the same bytes within 1%. The llama model is also run with an FP8 KV cache.

FP8 KV on the CPU: vLLM's CPU attention has FP8 KV kernels only for x86 with AVX-512 or
AMX (``_get_attn_isa`` in vllm/v1/attention/backends/cpu_attn.py, which asks torch:
``torch.cpu._is_avx512_supported()``, ``torch.cpu._is_amx_tile_supported()``). On a CPU
with neither the engine still sizes its FP8 KV cache, logs the figure and only then
refuses to build the attention; the capacity is checked against that figure, the
refusal must be that one, and serving with an FP8 KV cache is skipped, naming the feature.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from capacity.catalog import GiB, get_model
from capacity.planner import kv_bytes_per_token_per_gpu, kv_cache_tokens_for_bytes
from vllm_harness import VllmStartupError, parse_kv_cache_tokens

pytestmark = pytest.mark.integration

KV_SPACE_GIB = 1
# vLLM's CPU platform forces block_size 16 for MLA and defaults to 128 otherwise
# (vllm/platforms/cpu.py); on GPUs the default is 16.
CASES = [
    ("tiny_deepseek_v2", "auto", 16),
    ("tiny_qwen2", "auto", 128),
    ("tiny_llama", "auto", 128),
    ("tiny_llama", "fp8", 128),
]
RESULTS: list[dict] = []
# vLLM's refusal on a CPU without the FP8 KV kernels (vllm/v1/attention/backends/cpu_attn.py)
FP8_REFUSAL = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"


def cpu_fp8_kv_features() -> dict[str, bool]:
    """What vLLM's CPU attention asks torch before it builds FP8 KV kernels."""
    import torch

    return {"avx512f": torch.cpu._is_avx512_supported(), "amx": torch.cpu._is_amx_tile_supported()}


def fp8_kv_skip_reason() -> str | None:
    features = cpu_fp8_kv_features()
    if any(features.values()):
        return None
    return ("serving with an FP8 KV cache needs a CPU with avx512f or amx: vLLM's CPU attention "
            "(vllm/v1/attention/backends/cpu_attn.py) has no FP8 KV kernel without them, and "
            f"torch reports {features} here; the FP8 capacity is still checked against the "
            "engine's own sizing (test_engine_kv_capacity_matches_planner[tiny_llama-fp8])")


def _env() -> dict[str, str]:
    return {"VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB)}


@pytest.mark.parametrize("fixture, kv_dtype, block_size", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_engine_kv_capacity_matches_planner(request, vllm_server, fixture, kv_dtype, block_size):
    model_dir: Path = request.getfixturevalue(fixture)
    args = [] if kv_dtype == "auto" else ["--kv-cache-dtype", kv_dtype]
    server = None
    if kv_dtype == "fp8" and fp8_kv_skip_reason():
        # This CPU has no FP8 KV kernels: the engine sizes the cache, logs it, then refuses.
        with pytest.raises(VllmStartupError) as refused:
            vllm_server(model_dir, args, _env())
        log = Path(refused.value.log_path).read_text(errors="replace")
        assert FP8_REFUSAL in log, f"vLLM failed otherwise than by refusing FP8 KV attention: {refused.value}"
        try:
            engine_tokens = parse_kv_cache_tokens(log)
        except ValueError:
            pytest.fail(f"vLLM refused FP8 KV attention before sizing the KV cache; log {refused.value.log_path}")
        log_path, startup = refused.value.log_path, None
    else:
        server = vllm_server(model_dir, args, _env())
        engine_tokens = server.kv_cache_tokens()
        log_path, startup = server.log_path, server.startup_seconds
    spec = get_model(str(model_dir))
    predicted = kv_cache_tokens_for_bytes(spec, KV_SPACE_GIB * GiB, kv_cache_dtype=kv_dtype,
                                          block_size=block_size)
    RESULTS.append({
        "model": fixture, "architecture": spec.architecture, "kv_cache_dtype": kv_dtype,
        "block_size": block_size, "kv_bytes_per_token": kv_bytes_per_token_per_gpu(
            spec, kv_cache_dtype=kv_dtype),
        "engine_tokens": engine_tokens, "planner_tokens": predicted,
        "relative_error": (predicted - engine_tokens) / engine_tokens,
        "startup_seconds": startup, "engine_served": server is not None,
    })
    if os.environ.get("VLLM_KV_RESULTS"):  # record the figures for the README
        Path(os.environ["VLLM_KV_RESULTS"]).write_text(json.dumps(RESULTS, indent=2) + "\n")
    assert engine_tokens > 0
    assert predicted == pytest.approx(engine_tokens, rel=0.01), (
        f"planner {predicted:,} vs engine {engine_tokens:,} tokens "
        f"({spec.architecture}, {kv_dtype}); log: {log_path}")
    if server is not None:
        _serves(server, model_dir)


def _serves(server, model_dir: Path) -> None:
    """The engine serves: a short completion comes back."""
    status, body = server.post_json("/v1/completions", {
        "model": str(model_dir), "prompt": "hello world", "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 4


def test_engine_serves_with_an_fp8_kv_cache(vllm_server, tiny_llama):
    reason = fp8_kv_skip_reason()
    if reason:
        pytest.skip(reason)
    # the same server as the FP8 capacity case just before (the pool reuses it)
    _serves(vllm_server(tiny_llama, ["--kv-cache-dtype", "fp8"], _env()), tiny_llama)

