"""The Gluon sm_90 FP8 block-scaled GEMM (kernels/fp8_gemm_sm90.py).

Gluon has no CPU interpreter, so the numbers are checked only on a Hopper GPU (the H200
runs are committed as kernels/bench/results/*_fp8_sm90_pytest.txt). On any machine the
kernel is compiled for sm_90a through this Triton's own ptxas, and the build is checked
for what the kernel exists for: fp8 warpgroup MMAs (QGMMA), no register spills, and no
"wgmma serialized" report from ptxas (info C7514), which is what copying an in-flight
accumulator or reading it early would cause."""

import json

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
from sm90_build import ROOT, build, needs_hopper  # noqa: E402

from kernels import fp8_gemm_sm90 as sm90  # noqa: E402
from kernels.reference import fp8_gemm_reference, per_block_quant_fp8, per_token_group_quant_fp8  # noqa: E402

needs_gluon = pytest.mark.skipif(not sm90.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")

CONFIGS = [
    dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=5, PERSISTENT=1),  # two consumers, persistent
    dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=2),  # a program per tile, the shallowest ring
    dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, STAGES=4, PERSISTENT=2),  # one consumer, two programs per SM
    dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=3, PERSISTENT=1, PAIR_RELEASE=True),  # paired, fewest stages
    dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=8, PERSISTENT=1, PAIR_RELEASE=True),
    dict(BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=6, PERSISTENT=2),
]


def _id(c):
    return (f"{c['BLOCK_M']}x{c['BLOCK_N']}_s{c['STAGES']}" + (f"_p{c['PERSISTENT']}" if "PERSISTENT" in c else "")
            + ("_pair" if c.get("PAIR_RELEASE") else ""))


@needs_gluon
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[4], CONFIGS[5], dict(CONFIGS[0], SCALE_TMA=True)],
                         ids=lambda c: _id(c) + ("_scale_tma" if c.get("SCALE_TMA") else ""))
def test_the_build_keeps_its_wgmmas_in_flight(cfg):
    info = build("fp8_gemm_sm90_build", cfg)
    assert not info["serialized"], info["ptxas_info"]
    assert info["spill_bytes"] == 0, info["ptxas_info"]
    # 4 k=32 fp8 wgmma instructions per 128-wide K block; the pair loop, the first block and
    # the tail each issue their own
    assert info["qgmma"] >= 16 and info["hmma"] == 0, info


def test_a_config_is_checked_before_launch():
    assert sm90.launch_config(dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=6, WS=True, num_warps=4)) == dict(
        BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=6)
    with pytest.raises(ValueError, match="single-stream kernel"):
        sm90.launch_config(dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8))
    with pytest.raises(ValueError, match=r"unknown keys \['SPLIT_K'\]"):
        sm90.launch_config(dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=4, SPLIT_K=2))
    with pytest.raises(ValueError, match="BLOCK_M and BLOCK_N must be 64 or 128"):
        sm90.launch_config(dict(BLOCK_M=256, BLOCK_N=128, GROUP_M=8, STAGES=4))
    for m, n, k in [(64, 7168, 2048), (64, 32768, 512), (1024, 2112, 7168), (4096, 7168, 16384), (4096, 4096, 7168)]:
        cfg = sm90.pick_config(m, n, k, 132)
        assert sm90.launch_config(cfg) == cfg


def test_tma_scales_need_column_major_scales():
    assert sm90.launch_config(dict(CONFIGS[0], SCALE_TMA=True))["SCALE_TMA"] is True
    row_major = torch.ones(256, 4)
    with pytest.raises(ValueError, match="SCALE_TMA: the activation scales must be column-major with M a multiple of 4"):
        sm90._scale_desc(row_major, 128)
    with pytest.raises(ValueError, match="M a multiple of 4"):
        sm90._scale_desc(torch.ones(4, 130).t(), 128)  # column-major, M = 130: rows of 520 bytes


def test_tma_scales_fit_beside_the_ring_and_are_the_default_where_they_won():
    """SCALE_TMA adds a stage's scales to each stage: 6 stages of 128 x 128 tiles no longer fit
    (race 12's launch failed for 232,728 bytes), so ``with_scale_tma`` drops to 5 and an explicit
    6-stage config is refused by name; ``fp8_gemm_sm90`` takes it unasked for column-major scales
    with M a multiple of 4 and K >= SCALE_TMA_MIN_K (race 12: it lost at K 512)."""
    six = dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=6, PERSISTENT=1, PAIR_RELEASE=True)
    assert sm90.launch_config(six) == six
    with pytest.raises(ValueError, match="STAGES 6 of 128 x 128 tiles with SCALE_TMA need 232800 bytes"):
        sm90.launch_config(dict(six, SCALE_TMA=True))
    assert sm90.with_scale_tma(six) == dict(six, STAGES=5, SCALE_TMA=True)
    small = dict(BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=6, PERSISTENT=2)
    assert sm90.with_scale_tma(small) == dict(small, SCALE_TMA=True)
    col = torch.ones(16, 256).t()  # [256, 16], column-major
    assert sm90.scale_tma_default(col, 2048) and sm90.scale_tma_default(col, sm90.SCALE_TMA_MIN_K)
    assert not sm90.scale_tma_default(col, 512)
    assert not sm90.scale_tma_default(col.contiguous(), 2048)  # row-major
    assert not sm90.scale_tma_default(torch.ones(16, 130).t(), 2048)  # M = 130


def test_supported_says_no_off_hopper():
    a = torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    b = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    assert not sm90.supported(a, b, torch.bfloat16)  # CPU tensors


def _operands(m, n, k, gen):
    a = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * 0.05
    qa, sa = per_token_group_quant_fp8(a)
    qw, sw = per_block_quant_fp8(w)
    return [t.cuda() for t in (qa, sa, qw, sw)]


def _close(y, ref):
    err = (y.float() - ref).abs()
    bound = 2.0**-7 * ref.abs() + 2e-3 * ref.abs().max()
    assert torch.isfinite(y).all()
    assert (err <= bound).all(), f"max err {err.max().item():.3g}, worst excess {(err - bound).max().item():.3g}"


@needs_hopper
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg", CONFIGS, ids=_id)
@pytest.mark.parametrize("m,n,k", [
    (1, 256, 128),  # one K block, one row
    (200, 264, 384),  # M, N tails; an odd block count
    (256, 512, 512),  # an even count: the pair loop and the one-block tail
    (130, 2112, 1792),  # more blocks than stages, both tails
    (1100, 2112, 1792),  # more tiles than SMs: persistent programs take two or more
    (2048, 4096, 256),  # ~4 tiles per persistent program, two blocks each: loads run across tiles
    (1024, 4096, 384),  # the same with an odd block count
])
def test_matches_the_reference(cfg, m, n, k):
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    qa, sa, qw, sw = _operands(m, n, k, gen)
    assert sm90.supported(qa, qw, torch.bfloat16)
    y = sm90.fp8_gemm_sm90(qa, sa, qw, sw, config=cfg)
    _close(y, fp8_gemm_reference(qa, sa, qw, sw).cuda())


@needs_hopper
@pytest.mark.timeout(120)
def test_column_major_activation_scales():
    # vLLM hands the activation scales column-major
    gen = torch.Generator().manual_seed(3)
    qa, sa, qw, sw = _operands(192, 384, 1024, gen)
    sa_cm = sa.t().contiguous().t()
    y = sm90.fp8_gemm_sm90(qa, sa_cm, qw, sw)
    _close(y, fp8_gemm_reference(qa, sa, qw, sw).cuda())


@needs_hopper
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[3], CONFIGS[5]], ids=_id)
@pytest.mark.parametrize("m,n,k", [(200, 264, 384), (256, 512, 512), (1100, 2112, 1792), (2048, 4096, 256)])
def test_column_major_scales_loaded_by_tma(cfg, m, n, k):
    # each stage's scales come with its tiles (M tails zero-filled), read before the stage is freed
    gen = torch.Generator().manual_seed(m + k)
    qa, sa, qw, sw = _operands(m, n, k, gen)
    y = sm90.fp8_gemm_sm90(qa, sa.t().contiguous().t(), qw, sw, config=dict(cfg, SCALE_TMA=True))
    _close(y, fp8_gemm_reference(qa, sa, qw, sw).cuda())


RACE = ROOT / "kernels" / "bench" / "results" / "2026-12-02_h200_race7e_fp8_defaults_prefetch.json"


def test_fp8_gemm_takes_the_faster_kernel_of_the_committed_race():
    """The dispatch (kernels.fp8_gemm.fp8_gemm on Hopper) and both kernels' defaults are the
    ones race 7e timed, and at every point it picks the faster of the two shipped defaults
    (within 5%, the spread between runs)."""
    from kernels.fp8_gemm import pick_config as triton_pick
    from kernels.fp8_gemm import use_sm90

    rows = json.loads(RACE.read_text())["fp8"]
    sms = json.loads(RACE.read_text())["meta"]["sms"]
    assert len(rows) == 24
    for r in rows:
        m, n, k = r["M"], r["N"], r["K"]
        # race 7 recorded WS / num_warps beside each config (the single-stream kernel ran too)
        assert sm90.launch_config(r["sm90"]["default"]["cfg"]) == sm90.pick_config(m, n, k, sms), (m, n, k)
        assert r["sweep"]["default"]["cfg"] == triton_pick(m, n, k, sms), (m, n, k)
        t_sm90, t_triton = r["sm90"]["default"]["us"], r["sweep"]["default"]["us"]
        chosen = t_sm90 if use_sm90(m, n, k, sms) else t_triton
        assert chosen <= 1.05 * min(t_sm90, t_triton), (m, n, k, t_sm90, t_triton)
