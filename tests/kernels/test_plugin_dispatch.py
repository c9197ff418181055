"""The plugin's dispatch rules and switches, and that its defaults follow the committed
H200 races (no vLLM needed: these are the module's plain functions)."""

import json
import os

import pytest
from engine_extra import require

require("torch", "triton")

import torch  # noqa: E402

from kernels import vllm_plugin as vp  # noqa: E402

RESULTS = os.path.join(os.path.dirname(vp.__file__), "bench", "results")


def test_router_rule_by_layout_and_tokens(monkeypatch):
    monkeypatch.setenv(vp.ENV_ROUTER_MIN_TOKENS, "512")
    # V3-like (correction bias) with vLLM's fused CUDA kernel on: by token count
    assert not vp.use_triton_router(511, has_bias=True, vllm_fused=True)
    assert vp.use_triton_router(512, has_bias=True, vllm_fused=True)
    # vLLM's path is its PyTorch graph: always ours
    assert vp.use_triton_router(1, has_bias=False, vllm_fused=True)
    assert vp.use_triton_router(1, has_bias=True, vllm_fused=False)


def test_router_threshold_switch(monkeypatch):
    monkeypatch.delenv(vp.ENV_ROUTER_MIN_TOKENS, raising=False)
    assert vp.router_min_tokens() == vp.ROUTER_MIN_TOKENS
    monkeypatch.setenv(vp.ENV_ROUTER_MIN_TOKENS, "0")
    assert vp.use_triton_router(1, has_bias=True, vllm_fused=True)
    for bad in ("-1", "2k"):
        monkeypatch.setenv(vp.ENV_ROUTER_MIN_TOKENS, bad)
        with pytest.raises(ValueError, match="DSVOLC_ROUTER_MIN_TOKENS.*expected a token count"):
            vp.router_min_tokens()


def test_fp8_switch(monkeypatch):
    monkeypatch.delenv(vp.ENV_FP8, raising=False)
    assert vp.fp8_gemm_enabled() is False
    monkeypatch.setenv(vp.ENV_FP8, "on")
    assert vp.fp8_gemm_enabled() is True
    monkeypatch.setenv(vp.ENV_FP8, "maybe")
    with pytest.raises(ValueError, match="DSVOLC_FP8_GEMM='maybe': expected one of"):
        vp.fp8_gemm_enabled()


def test_router_threshold_follows_the_race():
    """ROUTER_MIN_TOKENS is where the Triton router starts winning for good: it won every
    token count of the race from the threshold up, and lost every one below it."""
    rows = json.load(open(os.path.join(RESULTS, "2026-11-30_h200_race3.json")))["router_race"]
    assert rows and all("vllm_us" in r for r in rows), "the race ran without vLLM's kernel"
    ours_wins = {r["tokens"]: r["ours_us"] < r["vllm_us"] for r in rows}
    start = min((t for t in ours_wins if all(w for u, w in ours_wins.items() if u >= t)), default=None)
    assert start is not None
    below = sorted(t for t in ours_wins if t < start)
    # the threshold sits above the last size vLLM won and at or below the first of the run
    assert (below[-1] if below else -1) < vp.ROUTER_MIN_TOKENS <= start
    assert all(not ours_wins[t] for t in below)


def test_fp8_default_follows_the_race(monkeypatch):
    """The FP8 GEMM is on by default only if it beat cuBLASLt's block-scaled GEMM at every
    race shape with M >= 1024."""
    rows = json.load(open(os.path.join(RESULTS, "2026-11-30_h200_race2.json")))["fp8"]
    big = [r for r in rows if r["M"] >= 1024 and "scaled_mm_blockwise_us" in r]
    assert len(big) == 12
    wins_all = all(r["ours_us"] < r["scaled_mm_blockwise_us"] for r in big)
    monkeypatch.delenv(vp.ENV_FP8, raising=False)
    assert vp.fp8_gemm_enabled() is wins_all


def test_w4a16_repack_only_where_the_gluon_kernel_runs(monkeypatch):
    """AutoAWQ layers keep their layout off Hopper (here: CPU tensors) and when
    DSVOLC_W4A16_SM90=0; the repack itself is tested in tests/kernels/test_w4a16_sm90.py."""
    from kernels.reference import awq_quantize
    from kernels.vllm_plugin import repack_for_sm90

    qw, qz, sc = awq_quantize(torch.randn(256, 128))
    assert repack_for_sm90(qw, qz, sc) is None
    monkeypatch.setenv("DSVOLC_W4A16_SM90", "0")
    assert repack_for_sm90(qw, qz, sc) is None
    if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0):
        assert repack_for_sm90(qw.cuda(), qz.cuda(), sc.cuda()) is None  # switched off
        monkeypatch.setenv("DSVOLC_W4A16_SM90", "1")
        p = repack_for_sm90(qw.cuda(), qz.cuda(), sc.cuda())
        assert (p.nrep, p.kw) == (4, 1) and p.words.numel() == qw.numel()  # 128 columns: the 32 x 128 tile
