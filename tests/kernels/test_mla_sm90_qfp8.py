"""The fp8 cache's MLA decode with fp8 scores (kernels/mla_sm90_qfp8.py, ``config={"KERNEL": "sm90",
"QFP8": True}``): Q quantised to e4m3 per head row, the scores one fp8 product from the landed
block, P V in fp16 on columns each consumer converts for itself; with ``PV8`` P V an fp8 product
too, P in e4m3 against each consumer's columns transposed in fp8.

On any machine the kernel is compiled for sm_90a and its build checked: the scores as fp8
products only (QGMMA), P V as fp16 ones, each consumer converting its own 256 columns once a block;
on a Hopper GPU its output is checked against the float64 reference on the same quantised Q
(``kernels.reference.quantize_q_rows``), with the cache slots past every sequence poisoned
with NaN, and against the exact Q within the error Q's rounding is expected to add."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
from mla_check import GPU_CASE_IDS, GPU_CASES, KV_SCALE, paged_case  # noqa: E402
from sm90_build import build, needs_hopper  # noqa: E402

from kernels import mla_sm90 as sm90  # noqa: E402
from kernels.bench.mla import PV8_TOL, qfp8_tol  # noqa: E402
from kernels.mla_decode import mla_decode  # noqa: E402
from kernels.mla_sm90_qfp8 import P8_SCALE  # noqa: E402
from kernels.reference import mla_decode_reference, quantize_q_rows  # noqa: E402

needs_gluon = pytest.mark.skipif(not sm90.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")
SCALE = 192**-0.5


@needs_gluon
@pytest.mark.parametrize("single,cfg", [(False, None), (True, None), (False, dict(STAGES=3, HSTAGES=1))],
                         ids=["splits", "one_split", "three_stages"])
def test_the_qfp8_build(single, cfg):
    """Per 64-token key block: the scores 512 / 32 + 64 / 32 fp8 k-steps and no fp16 score
    product; each half's P V 64 / 16 fp16 k-steps, consumer 0's with P in registers; the
    conversion only of the output columns, consumer 0 its 256 once (in the loop), consumer 1 its
    256 twice (before the loop and in it): 64 x 256 / 128 threads / 2 values per unpack each, where
    the exact-Q kernel converts 320 + 256 columns; no spills under Triton 3.9 (with the query's
    second pass merged into its first, 700 bytes), a few scalars under 3.6 (56-92 bytes)."""
    import triton

    info = build("mla_sm90_build", dict(QFP8=True, **(cfg or {})), single=single, kv="fp8")
    c = sm90.launch_config(dict(QFP8=True, **(cfg or {})), fp8=True)
    assert not info["serialized"], info["ptxas_info"]
    assert info["qgmma"] == 512 // 32 + 64 // 32, info
    assert info["hgmma"] == 2 * 64 // 16 and info["hgmma_reg_a"] == 64 // 16, info
    assert info["f8_unpack"] == 3 * (64 * 256 // 128 // 2), info
    assert info["spill_bytes"] <= (128 if triton.__version__.startswith("3.6") else 32), info["ptxas_info"]
    assert sm90.smem_bytes_qfp8(c["STAGES"], c["HSTAGES"]) - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info


@needs_gluon
@pytest.mark.parametrize("single,cfg", [(False, None), (True, None), (False, dict(STAGES=4, HSTAGES=1))],
                         ids=["splits", "one_split", "four_stages"])
def test_the_pv8_build(single, cfg):
    """With ``PV8`` every product is an fp8 one: per key block the scores' 512 / 32 + 64 / 32
    k-steps and each consumer's P V 64 / 32, no 16-bit product and no fp8 unpack (the blocks are
    transposed byte for byte, P rounded from fp32); half the operand buffers' shared memory, so 4
    fp8 stages fit; spills as QFP8's (a few scalars under Triton 3.6, none under 3.9)."""
    import triton

    conf = dict(QFP8=True, PV8=True, **(cfg or {}))
    info = build("mla_sm90_build", conf, single=single, kv="fp8")
    c = sm90.launch_config(conf, fp8=True)
    assert not info["serialized"], info["ptxas_info"]
    assert info["qgmma"] == 512 // 32 + 64 // 32 + 2 * (64 // 32), info
    assert info["hgmma"] == 0 and info["f8_unpack"] == 0, info
    assert info["spill_bytes"] <= (128 if triton.__version__.startswith("3.6") else 32), info["ptxas_info"]
    assert sm90.smem_bytes_qfp8(c["STAGES"], c["HSTAGES"], True) - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info


def test_the_qfp8_config_is_checked_before_launch():
    assert sm90.launch_config(dict(QFP8=True), fp8=True) == dict(BLOCK_N=64, STAGES=2, HSTAGES=2, LEFT=256,
                                                                 CONVERT="consumers", QFP8=True, PV8=False)
    assert sm90.launch_config(dict(QFP8=True, STAGES=3, HSTAGES=1, QREG=0), fp8=True)["STAGES"] == 3
    assert "QFP8" not in sm90.launch_config(dict(QFP8=False), fp8=True)  # off: the exact-Q kernel
    with pytest.raises(ValueError, match="QFP8 .* must be true or false, got 1"):
        sm90.launch_config(dict(QFP8=1), fp8=True)
    with pytest.raises(ValueError, match=r"QFP8 fixes \['BLOCK_N', 'CONVERT'\]"):
        sm90.launch_config(dict(QFP8=True, BLOCK_N=32, CONVERT="warpgroup"), fp8=True)
    with pytest.raises(ValueError, match=r"QFP8\): \['QREG'\] do not apply"):
        sm90.launch_config(dict(QFP8=True, QREG=256), fp8=True)
    with pytest.raises(ValueError, match="QFP8\\): HSTAGES must be an int >= 1, got 0"):
        sm90.launch_config(dict(QFP8=True, HSTAGES=0), fp8=True)
    with pytest.raises(ValueError, match="STAGES 3 and HSTAGES 2 need 2[0-9]{5} bytes of shared memory"):
        sm90.launch_config(dict(QFP8=True, STAGES=3), fp8=True)
    with pytest.raises(ValueError, match=r"\['QFP8'\] \(the fp8 path's blocks, conversion and scores\) apply to an fp8"):
        sm90.launch_config(dict(QFP8=True))
    # the shared memory the kernel allocates: Q and the key blocks in fp8, three fp16 halves of a block
    assert sm90.smem_bytes_qfp8(2, 2) == 64 * 576 * 3 + 3 * 64 * 256 * 2 + 2 * 64 * 64 * 2 + 4 * 3 * 64 + 8 * 9
    # PV8: those halves and P in fp8, so 4 stages fit beside one of consumer 1's blocks, not two
    assert sm90.smem_bytes_qfp8(2, 2, True) == 64 * 576 * 3 + 3 * 64 * 256 + 2 * 64 * 64 + 4 * 3 * 64 + 8 * 9
    assert sm90.launch_config(dict(QFP8=True, PV8=True, STAGES=4, HSTAGES=1), fp8=True)["STAGES"] == 4
    with pytest.raises(ValueError, match="STAGES 4 and HSTAGES 2 with PV8 need 2[0-9]{5} bytes of shared memory"):
        sm90.launch_config(dict(QFP8=True, PV8=True, STAGES=4), fp8=True)
    with pytest.raises(ValueError, match="STAGES 4 and HSTAGES 1 need 2[0-9]{5} bytes"):
        sm90.launch_config(dict(QFP8=True, STAGES=4, HSTAGES=1), fp8=True)
    with pytest.raises(ValueError, match=r"PV8 \(P V as an fp8 product\) must be true or false, got 'yes'"):
        sm90.launch_config(dict(QFP8=True, PV8="yes"), fp8=True)
    with pytest.raises(ValueError, match="PV8 .* needs QFP8 true .* got PV8 True without it"):
        sm90.launch_config(dict(PV8=True), fp8=True)
    assert "PV8" not in sm90.launch_config(dict(PV8=False), fp8=True)  # off without QFP8: the exact-Q kernel
    with pytest.raises(ValueError, match=r"\['PV8'\] \(the fp8 path's blocks, conversion and scores\) apply to an fp8"):
        sm90.launch_config(dict(PV8=True))


def _rows_by_ieee_reciprocal(x):
    """x [..., D] fp32 quantised per row independently of ``quantize_q_rows``: the row's 448 / max|x|
    as the fp64 quotient rounded to fp32, which is the IEEE fp32 quotient the kernel's ``div_rn``
    gives (53 >= 2 * 24 + 2 bits). Returns (e4m3 values, dequantised)."""
    from kernels.reference import FP8_MAX

    amax = x.abs().amax(-1, keepdim=True)
    q8 = (x * (FP8_MAX / amax.double()).float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q8, q8.float() * (amax.double() / FP8_MAX).float()


def test_the_reference_quantises_each_row_to_its_own_scale():
    """``quantize_q_rows`` (the GPU tests' and the benchmark's reference Q): each head row's
    largest |q| lands on 448 (e4m3's largest value) and maps back to itself, values keep their
    sign, a row of zeros stays zero, and the rounding is e4m3's (within 2^-4 of each value's
    magnitude, relative to the row's scale)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 576, generator=g) * torch.tensor([1.0, 10.0, 0.01, 0.0]).view(1, 4, 1)
    d = quantize_q_rows(q)
    amax = q.abs().amax(-1)
    assert torch.allclose(d.abs().amax(-1), amax)
    assert (d[:, 3] == 0).all() and ((d * q) >= 0).all()
    err = (d - q).abs() / (amax[..., None] / 448).clamp(min=1e-10)
    assert err[:, :3].max() <= 16 + 1e-3, err.max()  # half of e4m3's spacing (32) in [256, 448], in scale units
    rel = ((d - q).norm() / q.norm()).item()
    assert 1e-3 < rel < 0.06, rel
    # per_token_group_quant_fp8 with a group of 576 divides each value by the scale where this (and
    # the kernel) multiplies by its reciprocal: on bf16 queries 0.09% of the values (midpoints
    # between two e4m3 values, which bf16's few mantissa bits make common) round to the other
    # neighbour, never further; why the kernel and its reference must share the operations
    from kernels.reference import per_token_group_quant_fp8

    x = torch.randn(64, 576, generator=g).to(torch.bfloat16)
    theirs, _ = per_token_group_quant_fp8(x.float(), 576)
    ours, dequantised = _rows_by_ieee_reciprocal(x.float())
    assert torch.equal(dequantised, quantize_q_rows(x))
    codes = [t.view(torch.uint8).to(torch.int16) for t in (theirs, ours)]
    moved = codes[0] != codes[1]
    assert 5e-4 < moved.float().mean() < 2e-3 and (codes[0] - codes[1]).abs().max() == 1


def test_the_reference_reciprocal_is_the_ieee_quotient_the_kernel_takes():
    """The kernel takes each row's reciprocal with ``div_rn`` (IEEE fp32 division); the reference
    must take the same quotient, since a reciprocal a last bit off turns every e4m3 midpoint of its
    row the other way. torch's ``448 / tensor`` is ``reciprocal() * 448`` (two roundings): the
    reference once used it, and race 24's GPU tests found a one-token LSE 0.076 off. The fp64
    quotient rounded to fp32 is the IEEE fp32 quotient (53 >= 2 * 24 + 2 bits)."""
    from kernels.reference import FP8_MAX

    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 128, 576, generator=g).to(torch.bfloat16).float()
    amax = x.abs().amax(-1, keepdim=True)
    ieee = (FP8_MAX / amax.double()).float()
    assert ((FP8_MAX / amax) != ieee).float().mean() > 0.05  # torch's scalar-over-tensor is not it
    assert torch.equal(quantize_q_rows(x), _rows_by_ieee_reciprocal(x)[1])


def test_q_rounding_adds_about_the_error_the_fp8_cache_adds():
    """The trade QFP8 makes, on the reference (kernels/README.md quotes these figures): with N(0, 1)
    queries and keys (B 2, 128 heads, 2,048 tokens), the fp8 cache's rounding moves the output
    4.4% (relative, Frobenius) from the bf16 cache's; Q's rounding moves it 3.9% more, 5.9%
    together: about what a second fp8 operand costs, not a new order of error."""
    g = torch.Generator().manual_seed(7)
    bsz, heads, n = 2, 128, 2048
    q = torch.randn(bsz, heads, 576, generator=g).to(torch.bfloat16)
    cache = torch.randn(bsz * n // 64, 64, 576, generator=g)
    bt = torch.arange(bsz * n // 64, dtype=torch.int32).view(bsz, n // 64)
    sl = torch.full((bsz,), n, dtype=torch.int32)
    exact, _ = mla_decode_reference(q, cache.to(torch.bfloat16), bt, sl, SCALE)
    c8 = (cache / KV_SCALE).to(torch.float8_e4m3fn)
    fp8, _ = mla_decode_reference(q, c8, bt, sl, SCALE, KV_SCALE)
    both, _ = mla_decode_reference(quantize_q_rows(q), c8, bt, sl, SCALE, KV_SCALE)

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    cache_err, q_err, total = rel(fp8, exact), rel(both, fp8), rel(both, exact)
    assert round(cache_err, 3) == 0.044 and round(q_err, 3) == 0.039 and round(total, 3) == 0.059
    assert 0.7 * cache_err < q_err < 1.3 * cache_err and total < 1.5 * cache_err


def _blockwise_p8(q, rows, scale, bn=64):
    """Softmax(q rows^T) rows[:, :512] the way the ``PV8`` kernel forms it, in float64 but for P:
    per ``bn``-token block the running row maximum, P = exp(s - m) in fp32 rounded to e4m3 times
    ``P8_SCALE`` for the product, the row sums from P's fp32 values."""
    s = q.double() @ rows.double().T * scale
    m = torch.full((s.shape[0],), -float("inf"), dtype=torch.float64)
    acc, l_ = torch.zeros(s.shape[0], 512, dtype=torch.float64), torch.zeros(s.shape[0], dtype=torch.float64)
    for j in range(0, s.shape[1], bn):
        m_new = torch.maximum(m, s[:, j:j + bn].max(1).values)
        p, alpha = torch.exp(s[:, j:j + bn] - m_new[:, None]).float(), torch.exp(m - m_new)
        p8 = (p * P8_SCALE).to(torch.float8_e4m3fn).double() / P8_SCALE
        acc, l_, m = acc * alpha[:, None] + p8 @ rows[j:j + bn, :512].double(), l_ * alpha + p.double().sum(1), m_new
    return acc / l_[:, None]


def test_p_rounding_costs_less_than_q_rounding():
    """The trade ``PV8`` makes on top of QFP8's, emulated (kernels/README.md and ``PV8_TOL`` quote
    these figures): with N(0, 1) queries and keys and 128 heads, P's e4m3 rounding moves the output
    1.3-1.5% (relative, Frobenius) from the exact softmax at 64 to 4,096 tokens, under Q's 3.9%;
    with values of mean 1 (an output that is not itself near zero) 0.2-0.7%. Without the power-of-
    two scale P's small values fall below e4m3's normal range: 1.6% at 2,048 tokens against 1.4%."""
    g = torch.Generator().manual_seed(7)
    errs, shifted = [], []
    for n in (64, 300, 2048, 4096):
        q = torch.randn(128, 576, generator=g).to(torch.bfloat16)
        rows = torch.randn(n, 576, generator=g)
        for v, out in ((rows, errs), (rows + 1.0, shifted)):
            ex = torch.softmax(q.double() @ v.double().T * SCALE, -1) @ v[:, :512].double()
            out.append(((_blockwise_p8(q, v, SCALE) - ex).norm() / ex.norm()).item())
    assert all(0.012 < e < 0.016 for e in errs), errs
    assert all(0.0015 < e < 0.007 for e in shifted) and shifted[-1] < shifted[0], shifted
    assert PV8_TOL["rel"] >= 2.5 * max(errs)  # the GPU check's bound leaves the kernel's own error room
    assert qfp8_tol(dict(PV8=True)) is PV8_TOL and qfp8_tol(None)["rel"] < PV8_TOL["rel"]  # PV8's bound, only with PV8


def _check(lens, heads=128, dtype=torch.bfloat16, page=64, num_splits=None, config=None, seed=0):
    q, cache, bt, sl = paged_case(lens, heads, dtype, page, seed, fp8=True)
    out = torch.full((len(lens), heads, 512), float("nan"), dtype=dtype, device="cuda")  # poison
    o, lse = mla_decode(q, cache, bt, sl, SCALE, kv_scale=KV_SCALE, max_seq_len=max(lens), num_splits=num_splits,
                        out=out, return_lse=True, config=dict(KERNEL="sm90", QFP8=True, **(config or {})))
    assert not torch.isnan(o).any()
    o, lse = o.cpu().double(), lse.cpu().double()
    args = (cache.cpu(), bt.cpu(), sl.cpu(), SCALE, KV_SCALE)
    ro, rl = mla_decode_reference(quantize_q_rows(q.cpu()).double(), *args, compute_dtype=torch.float64)
    err = ((o - ro).norm() / ro.norm()).item()
    tol = qfp8_tol(config)
    assert err < tol["rel"], err
    seen = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), seen)
    assert (lse[seen] - rl[seen]).abs().max() < tol["lse"]
    for b, n in enumerate(lens):
        if n == 0:
            assert (o[b] == 0).all()
    # against the exact Q: Q's rounding adds about what the cache's own rounding gives (3.7% on N(0, 1)
    # data), P's (PV8) 1.3-1.5% more
    ex, _ = mla_decode_reference(q.cpu().double(), *args, compute_dtype=torch.float64)
    assert ((o - ex).norm() / ex.norm()).item() < (0.07 if (config or {}).get("PV8") else 0.06)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["one_split", "three_splits", "auto"])
@pytest.mark.parametrize("config", [None, dict(STAGES=3, HSTAGES=1), dict(PV8=True), dict(PV8=True, STAGES=4, HSTAGES=1)],
                         ids=["qfp8", "qfp8_three_stages", "pv8", "pv8_four_stages"])
def test_qfp8_ragged_batch_matches_the_reference(num_splits, config):
    # partial blocks either side of 64 tokens, one block exactly, several, an empty sequence
    _check([0, 1, 63, 64, 65, 300, 1000], num_splits=num_splits, config=config, seed=num_splits or 5)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_CASE_IDS)
def test_qfp8_cases_match_the_reference(case):
    _check(seed=17, **case)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_CASE_IDS)
def test_pv8_cases_match_the_reference(case):
    _check(seed=19, config=dict(PV8=True), **case)


@needs_hopper
@pytest.mark.parametrize("valid", [64, 40], ids=["full_block", "partial_block"])
@pytest.mark.parametrize("reg", [False, True], ids=["p_shared", "p_registers"])
def test_the_fp8_transpose_and_its_product(valid, reg):
    """``PV8``'s two parts on one block, alone (tests/pv8_unit.py): the transpose is exact, tokens
    past ``valid`` zero (the slot past a sequence may hold NaN: here the tile's rows are finite,
    so a zero shows the mask ran), and the 8-bit P V product matches fp32 on the same e4m3 values
    with P from shared memory or registers (the kernel takes the first; race 26)."""
    from pv8_unit import pv8_unit

    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 256, generator=g).to(torch.float8_e4m3fn).cuda()
    p = (torch.rand(64, 64, generator=g) * P8_SCALE).to(torch.float8_e4m3fn).cuda()
    t = torch.full((256, 64), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    o = torch.full((64, 256), float("nan"), device="cuda")
    pv8_unit[(1,)](x, p, t, o, valid, REG=reg, num_warps=4)
    xm = x.float().cpu()
    xm[valid:] = 0
    assert torch.equal(t.float().cpu(), xm.T)
    ref = p.float().cpu() @ xm
    assert ((o.cpu() - ref).norm() / ref.norm()).item() < 1e-3



@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("lens", [[64, 64], [128, 40], [1000, 300]], ids=["one_block", "two_blocks", "many_blocks"])
@pytest.mark.parametrize("config", [dict(), dict(QFP8=True), dict(QFP8=True, PV8=True),
                                    dict(QFP8=True, PV8=True, STAGES=4, HSTAGES=1)],
                         ids=["exact_q", "qfp8", "pv8", "pv8_four_stages"])
def test_uniform_p_gives_every_column_the_mean_of_its_values(config, lens):
    """With q = 0 every score is equal, so P is uniform (exactly 1, or 256 in e4m3 under PV8) and
    each output column is the mean of that column's values over the sequence, whatever P V's path:
    checked per 128-column quarter, so a failure names the columns (and so the consumer: under
    QFP8 consumer 0 owns [0, 256), consumer 1 [256, 512)) that went wrong. Race 26's first PV8
    build passed consumer 0's half and failed consumer 1's this way."""
    q, cache, bt, sl = paged_case(lens, 128, torch.bfloat16, 64, seed=23, fp8=True)
    q.zero_()
    o = mla_decode(q, cache, bt, sl, SCALE, kv_scale=KV_SCALE, max_seq_len=max(lens), num_splits=1,
                   config=dict(KERNEL="sm90", **config)).float().cpu()
    # softmax of equal scores is uniform: the reference on q = 0 is each column's mean over the sequence
    mean, _ = mla_decode_reference(q.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), SCALE, KV_SCALE,
                                   compute_dtype=torch.float64)
    for b in range(len(lens)):
        want = mean[b, 0]
        for h in (0, 63, 64, 127):  # both head blocks, each block's first and last row
            for quarter in range(4):
                cols = slice(128 * quarter, 128 * (quarter + 1))
                got = o[b, h, cols].double()
                assert not got.isnan().any(), f"{config}: NaN in columns {cols.start}-{cols.stop} (batch {b}, head {h})"
                err = ((got - want[cols]).norm() / want[cols].norm()).item()
                assert err < 1e-2, f"{config}: columns {cols.start}-{cols.stop} {err:.3e} off the mean (batch {b}, head {h})"
