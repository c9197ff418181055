"""FP8 block-scaled GEMM (kernels/fp8_gemm.py) against the fp64 reference.

Under Triton's CPU interpreter (3.9) float8_e4m3fn loads, converts and dots run on the
real fp8 values (the interpreter computes the dot exactly in fp32), so these tests cover
the kernel's indexing, masking, scale application, split-K and the grouped layout. What
they cannot cover is the H200's fp8 tensor-core arithmetic (its reduced-precision
accumulation inside each 128-wide K block) and the compiled code's performance; the
benchmark checks the compiled kernel against the same reference before timing it
(kernels/bench/fp8.py, run by kernels/bench/bench_kernels.py --only fp8)."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402

from kernels.fp8_gemm import GROUPED_M_ALIGN, fp8_gemm, fp8_grouped_gemm, pick_config
from kernels.reference import (
    FP8_MAX,
    fp8_block_dequant,
    fp8_gemm_reference,
    fp8_grouped_gemm_reference,
    per_block_quant_fp8,
    per_token_group_quant_fp8,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _operands(m, n, k, gen, experts=None):
    a = torch.randn(m, k, generator=gen)
    shape = (experts, n, k) if experts else (n, k)
    w = torch.randn(*shape, generator=gen) * 0.05
    qa, sa = per_token_group_quant_fp8(a)
    qw, sw = per_block_quant_fp8(w)
    return [t.to(DEVICE) for t in (qa, sa, qw, sw)]


def _close(y, ref):
    # bf16 output: one ulp of |y| (2^-7 relative; the interpreter truncates fp32 -> bf16
    # where the GPU rounds to nearest) plus fp32 summation order; the floor covers outputs
    # that cancel to near zero
    err = (y.float() - ref).abs()
    bound = 2.0**-7 * ref.abs() + 1e-3 * ref.abs().max()
    assert torch.isfinite(y).all()
    assert (err <= bound).all(), f"max err {err.max().item():.3g}, worst excess {(err - bound).max().item():.3g}"


def test_quantisers_round_trip():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=gen) * 3
    q, s = per_token_group_quant_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (5, 2)
    # each group's largest magnitude maps to the format's largest finite value
    assert torch.equal(q.float().abs().view(5, 2, 128).amax(-1), torch.full((5, 2), FP8_MAX))
    # e4m3 keeps 3 mantissa bits: relative rounding error <= 2^-4 of each group's scale range
    deq = fp8_block_dequant(q, s, 1, 128)
    assert ((deq - x).abs() <= s.repeat_interleave(128, 1) * 16 + 1e-6).all()
    assert (deq - x).norm() / x.norm() < 0.05
    w = torch.randn(200, 256, generator=gen)  # N = 200: a partial second block of rows
    qw, sw = per_block_quant_fp8(w)
    assert qw.shape == (200, 256) and sw.shape == (2, 2)
    assert (fp8_block_dequant(qw, sw, 128, 128) - w).norm() / w.norm() < 0.05


# M tails, N tails (N = 200 and 2112 % 128 = 64 as in V3's fused q_a/kv_a projection),
# K = 1..5 blocks; the default config picks 64-row tiles with split-K below 256 rows and
# 128 x 128 tiles above
SHAPES = [(1, 128, 128), (5, 200, 384), (33, 320, 640), (70, 192, 256), (257, 136, 256)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp8_gemm_default_config(m, n, k):
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    qa, sa, qw, sw = _operands(m, n, k, gen)
    y = fp8_gemm(qa, sa, qw, sw)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    _close(y, fp8_gemm_reference(qa, sa, qw, sw))


CONFIGS = {
    # one weight-scale block spans two N tiles (BLOCK_N 64)
    "bn64": dict(BLOCK_M=64, BLOCK_N=64, SPLIT_K=1, GROUP_M=2, num_warps=4, num_stages=2),
    # a tile spans two weight-scale blocks (BLOCK_N 256): per-column scales
    "bn256": dict(BLOCK_M=64, BLOCK_N=256, SPLIT_K=1, GROUP_M=1, num_warps=4, num_stages=2),
    # 5 K blocks over 3 splits -> 2 + 2 + 1, fp32 partials reduced by the second kernel
    "split3": dict(BLOCK_M=64, BLOCK_N=128, SPLIT_K=3, GROUP_M=8, num_warps=4, num_stages=2),
    "bm128": dict(BLOCK_M=128, BLOCK_N=128, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fp8_gemm_configs(name):
    gen = torch.Generator().manual_seed(len(name))
    qa, sa, qw, sw = _operands(97, 328, 640, gen)
    _close(fp8_gemm(qa, sa, qw, sw, config=CONFIGS[name]), fp8_gemm_reference(qa, sa, qw, sw))


def test_fp8_gemm_column_major_activation_scales_and_fp16_out():
    # vLLM may hand the per-token-group scales transposed in memory
    gen = torch.Generator().manual_seed(3)
    qa, sa, qw, sw = _operands(19, 256, 384, gen)
    sa_t = sa.t().contiguous().t()
    assert sa_t.stride() == (1, 19)
    y = fp8_gemm(qa, sa_t, qw, sw, out_dtype=torch.float16)
    assert y.dtype == torch.float16
    ref = fp8_gemm_reference(qa, sa, qw, sw)
    err = (y.float() - ref).abs()
    assert (err <= 2.0**-10 * ref.abs() + 1e-3 * ref.abs().max()).all()  # fp16: 10-bit mantissa


def test_fp8_gemm_scales_are_applied_per_block():
    # operands whose fp8 values are all 1: each output is the sum over K blocks of
    # 128 * sa[m, kb] * sb[n // 128, kb], so a scale read from the wrong block shows up
    m, n, k = 3, 256, 384
    ones_a = torch.ones(m, k).to(torch.float8_e4m3fn).to(DEVICE)
    ones_b = torch.ones(n, k).to(torch.float8_e4m3fn).to(DEVICE)
    sa = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0], [3.0, 1.0, 1.0]], device=DEVICE)
    sb = torch.tensor([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0]], device=DEVICE)
    y = fp8_gemm(ones_a, sa, ones_b, sb, out_dtype=torch.float32 if DEVICE == "cpu" else torch.bfloat16)
    want = 128 * (sa[:, None, :] * sb.repeat_interleave(128, 0)[None, :, :]).sum(-1)
    torch.testing.assert_close(y.float(), want, rtol=2**-7, atol=0)


def test_fp8_gemm_rejects_bad_input():
    gen = torch.Generator().manual_seed(4)
    qa, sa, qw, sw = _operands(4, 128, 256, gen)
    with pytest.raises(AssertionError, match="multiple of 128"):
        fp8_gemm(qa[:, :200], sa, qw[:, :200], sw)
    with pytest.raises(AssertionError, match="fp8 e4m3"):
        fp8_gemm(qa.float(), sa, qw, sw)
    assert fp8_gemm(qa[:0], sa[:0], qw, sw).shape == (0, 128)


def _grouped(counts, n, k, gen):
    rows = []
    for e, c in enumerate(counts):
        pad = -(-c // GROUPED_M_ALIGN) * GROUPED_M_ALIGN
        rows += [e] * c + [-1] * (pad - c)
    mi = torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    qa, sa, qw, sw = _operands(len(rows), n, k, gen, experts=len(counts))
    return qa, sa, qw, sw, mi


@pytest.mark.parametrize(
    "config",
    [None, dict(BLOCK_M=64, BLOCK_N=128, SPLIT_K=2, GROUP_M=4, num_warps=4, num_stages=2)],
    ids=["default", "bm64_split2"],
)
def test_fp8_grouped_gemm(config):
    # expert 1 gets no rows, expert 2 a segment over one alignment block (129 rows)
    gen = torch.Generator().manual_seed(11)
    qa, sa, qw, sw, mi = _grouped([70, 0, 129, 3], 200, 256, gen)
    y = fp8_grouped_gemm(qa, sa, qw, sw, mi, config=config)
    ref = fp8_grouped_gemm_reference(qa, sa, qw, sw, mi)
    real = mi >= 0
    _close(y[real], ref[real])
    # every expert's rows use that expert's weights: swapping two experts must change them
    y_swapped = fp8_grouped_gemm(qa, sa, qw[[2, 1, 0, 3]], sw[[2, 1, 0, 3]], mi, config=config)
    rows0 = (mi == 0).nonzero()[:, 0]
    assert not torch.allclose(y_swapped[rows0].float(), y[rows0].float(), rtol=0.1, atol=0.1)


def test_pick_config_by_shape():
    sms = 132
    # large M: 128 x 128 tiles on 8 warps for long K and wide N, 128 x 64 on 4 warps otherwise
    assert (pick_config(4096, 7168, 16384, sms)["BLOCK_N"], pick_config(4096, 7168, 16384, sms)["num_warps"]) == (128, 8)
    assert (pick_config(1024, 7168, 2048, sms)["BLOCK_N"], pick_config(1024, 7168, 2048, sms)["num_warps"]) == (64, 4)
    assert pick_config(4096, 2112, 7168, sms)["BLOCK_N"] == 64
    assert pick_config(4096, 32768, 512, sms)["BLOCK_N"] == 64
    # the grouped shapes' total M (8 x 4096) keeps the 128 x 128 tiles at K = 2048
    assert pick_config(32768, 7168, 2048, sms)["BLOCK_N"] == 128
    assert all(pick_config(m, 7168, 16384, sms)["SPLIT_K"] == 1 for m in (256, 4096))
    # small M: K split only for few tiles and a long K loop (M = 64 on N = 7168, K = 16384:
    # 56 tiles for 132 SMs; M = 128 on N = 2112, K = 7168: 34 tiles, 56 K blocks -> 4 splits
    # of 14), never below 4 K blocks a split, and not for a short K
    assert pick_config(64, 7168, 16384, sms)["SPLIT_K"] == 3
    assert pick_config(64, 7168, 2048, sms)["SPLIT_K"] == 1
    assert pick_config(128, 2112, 7168, sms)["SPLIT_K"] == 4
    assert pick_config(64, 2112, 4096, sms)["SPLIT_K"] == 8
    assert pick_config(128, 7168, 7168, sms)["SPLIT_K"] == 1  # 112 tiles: no split
    assert pick_config(64, 2112, 7168, sms)["BLOCK_M"] == 64
