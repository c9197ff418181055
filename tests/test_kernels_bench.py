"""The kernels' benchmark (kernels/bench/): one module per family over a shared harness,
each module within the project's size rule, and its CPU smoke mode, which runs every
family's check-then-time path under Triton's interpreter on tiny shapes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
MAX_LINES = 700


def test_no_kernels_module_over_700_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in KERNELS.rglob("*.py")}
    assert "kernels/bench/harness.py" in sizes  # the walk sees the benchmark's modules
    too_long = {p: n for p, n in sizes.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


@pytest.mark.engine  # the bench imports torch
def test_every_only_choice_has_a_mode():
    from kernels.bench import bench_kernels

    choices = next(a.choices for a in bench_kernels.build_parser()._actions if a.dest == "only")
    assert set(bench_kernels.MODES) == set(choices) | {None}


def _smoke(*extra):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "kernels.bench.bench_kernels", "--smoke", *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1500)
    # the lines that say what failed, wherever they are in the output, then its end
    said = [ln for ln in p.stdout.splitlines() if re.search(r"MISMATCH|ERROR|FAILED|Traceback", ln)]
    assert p.returncode == 0, "\n".join(said[:40]) + "\n...\n" + p.stdout[-3000:] + p.stderr[-4000:]
    assert "smoke correctness: True" in p.stdout
    return p.stdout


def _rows(out, prefix):
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]


@pytest.mark.slow  # Triton interpreter: minutes
@pytest.mark.timeout(1800)
def test_smoke_runs_w4a16_fp8_and_router_races():
    out = _smoke()
    for section in ("W4A16 v3 (bf16 activations", "FP8 block-scaled GEMM, dense", "FP8 grouped (MoE contiguous layout)",
                    "Router race, DeepSeek-V3 layout", "W4A16 race (AWQ group 128"):
        assert section in out, section
    # v3 sweep M = 1, 3, 16, 64 and v3 final M = 1, 2, 64, then the race's M = 1, 2, 64
    assert len(_rows(out, "| 256 x 128 |")) == 4 + 3 + 3
    assert len(_rows(out, "| 3 | 200 | 256 |") + _rows(out, "| 300 | 200 | 256 |")) == 2
    assert len(_rows(out, "| 2 x 128 | 136 | 256 |")) == 1
    assert len(_rows(out, "router race t=1: ours") + _rows(out, "router race t=40: ours")) == 2
    assert "; sweep {" in _rows(out, "router race t=40: ours")[0]  # the BLOCK_T x warps sweep ran
    assert "MISMATCH" not in out


@pytest.mark.slow  # Triton interpreter: minutes
@pytest.mark.timeout(1800)
def test_smoke_runs_prefill_attention_and_mla_decode():
    out = _smoke("--only", "attn_mla")
    assert "Prefill attention, causal" in out and "MLA decode (kv_lora 512" in out
    assert len(_rows(out, "| smoke_d32 |") + _rows(out, "| smoke_mla |")) == 2
    # each MLA case with a bf16 and an fp8 cache
    assert len(_rows(out, "| smoke_h3 |")) == 2 and len(_rows(out, "| smoke_h20 |")) == 2
    assert "MISMATCH" not in out


@pytest.mark.slow  # Triton interpreter: a minute or two
@pytest.mark.timeout(1200)
def test_smoke_runs_mla_decode_over_layers():
    """--mla-timer layers: every timed call rotates over two layers' inputs in the smoke run
    (each layer's call runs), and the table says how it was timed."""
    out = _smoke("--only", "mla", "--mla-timer", "layers")
    assert "as consecutive layers (--mla-timer layers)" in out
    assert len(_rows(out, "| smoke_h3 |")) == 2 and len(_rows(out, "| smoke_h20 |")) == 2
    assert "MISMATCH" not in out and "MLA ERROR" not in out


@pytest.mark.slow  # Triton interpreter: about a minute
@pytest.mark.timeout(900)
def test_smoke_runs_w4a16_race5():
    out = _smoke("--only", "w4a16_race5")
    assert "W4A16 race 5 (AutoAWQ group 128" in out
    # M = 1, 2, 5 on the one smoke shape, every candidate checked before its time
    assert len(_rows(out, "| 256 x 128 |")) == 3
    assert "MISMATCH" not in out and "race5 ERROR" not in out


@pytest.mark.engine  # the bench imports torch
def test_mla_picks_are_checked_before_anything_runs():
    """--mla-variants and --mla-kv name what a race runs (one too long for a command splits over
    several); a name the benchmark does not know stops it at once, naming the known ones."""
    from kernels.bench import bench_kernels, mla

    try:
        mla.set_picks("sm90_qreg,sm90_convert,sm90_qreg", "fp8", "layers")  # timed in the order named, once each
        assert mla.PICK == {"variants": ("sm90_qreg", "sm90_convert"), "kv": ("fp8",), "timer": "layers"}
        with pytest.raises(SystemExit, match=r"--mla-timer: expected one of \['scrub', 'layers'\], got 'warm'"):
            bench_kernels.main(["--only", "mla", "--mla-timer", "warm"])
        with pytest.raises(SystemExit, match=r"--mla-variants: unknown \['sm90_pingpong'\]; expected some of .*sm90_r2"):
            bench_kernels.main(["--only", "mla", "--mla-variants", "sm90_qreg,sm90_pingpong"])
        with pytest.raises(SystemExit, match="--mla-kv: expected bf16, fp8 or bf16,fp8, got 'int8'"):
            bench_kernels.main(["--only", "mla", "--mla-kv", "int8"])
    finally:
        mla.set_picks(None, "bf16,fp8")
    assert mla.PICK == {"variants": None, "kv": ("bf16", "fp8"), "timer": "scrub"}


@pytest.mark.engine  # the bench imports torch
def test_mla_layers_are_copies_that_together_pass_the_l2():
    """--mla-timer layers rotates over the case's Q and cache and copies of them: at least two,
    each its own memory with the same values, enough of them that the L2 holds none."""
    import torch

    from kernels.bench import harness, mla

    q, cache = torch.randn(2, 4, 576), torch.randn(3, 64, 576)
    small = mla.mla_layers(q, cache)
    nbytes = (q.numel() + cache.numel()) * 4
    assert len(small) == max(2, harness.copies_for(nbytes)) > 2  # a small case needs many to fill 3x the L2
    assert small[0][0] is q and small[0][1] is cache
    ptrs = {lc.data_ptr() for _, lc in small} | {lq.data_ptr() for lq, _ in small}
    assert len(ptrs) == 2 * len(small)
    assert all(torch.equal(lq, q) and torch.equal(lc, cache) for lq, lc in small)
    big = torch.empty(int(4 * harness.L2_BYTES), dtype=torch.uint8)  # past the L2 alone: still two, never one
    assert len(mla.mla_layers(q, big)) == 2
    assert len(mla.mla_layers(q, cache, 3)) == 3
