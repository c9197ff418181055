"""The Gluon sm_90 MLA decode split kernel (kernels/mla_sm90.py), behind
``mla_decode(config={"KERNEL": "sm90"})``.

Gluon has no CPU interpreter: on any machine the kernel is compiled for sm_90a through this
Triton's own ptxas and the build is checked for its products' structure (per key block 32 + 4
k-steps of Q K^T, 4 of each output half's P V, one of them with P in registers), no serialised
wgmma, registers that hardly spill, and shared memory that fits; on a Hopper GPU the numbers are
checked against the float64 reference, with the cache slots past every sequence poisoned with NaN
(a partial last block must not read them into the output)."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
from sm90_build import HOPPER, build, needs_hopper  # noqa: E402

from kernels import mla_sm90 as sm90  # noqa: E402
from kernels.mla_decode import mla_decode  # noqa: E402
from mla_check import GPU_CASE_IDS, GPU_CASES, KV_SCALE, assert_matches_reference  # noqa: E402
from mla_check import paged_case as _case  # noqa: E402

needs_gluon = pytest.mark.skipif(not sm90.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}  # as tests/kernels/test_mla_decode.py
SCALE = 192**-0.5


@needs_gluon
@pytest.mark.parametrize("single,left,prefetch,qreg,lazy", [
    (False, 128, False, 0, False), (True, 128, False, 0, False), (False, 256, False, 0, False),
    (False, 128, True, 0, False), (False, 128, False, 256, False), (True, 128, False, 256, False),
    (False, 128, False, 0, True), (False, 128, False, 256, True)],
    ids=["splits", "one_split", "left_256", "prefetch", "qreg", "qreg_one_split", "lazy", "lazy_qreg"])
def test_the_build(single, left, prefetch, qreg, lazy):
    info = build("mla_sm90_build", dict(LEFT=left, PREFETCH=prefetch, QREG=qreg, LAZY=lazy), single=single)
    assert not info["serialized"], info["ptxas_info"]
    # the default (consumer 0 keeps 128 output columns): none under Triton 3.6, a few scalars
    # (16-32 bytes) under 3.9, 44 with the lazy rescale's branches (none beside QREG); 256
    # columns spill more (80 / 272 bytes), never a tile
    assert info["spill_bytes"] <= (64 if left == 128 else 512), info["ptxas_info"]
    # consumer 0: Q K^T in the loop (512 / 16 + 64 / 16 k-steps) and, prefetching, once more
    # before it, P V on its columns with P in registers (64 / 16); consumer 1: P V on [256, 512)
    # and, with consumer 0 on 128 columns, on [128, 256), P from shared memory
    assert info["hgmma"] == (2 if prefetch else 1) * (32 + 4) + 4 + 4 * (2 if left == 128 else 1), info
    # with QREG the first 256 / 16 k-steps of Q K^T take Q from registers too
    assert info["hgmma_reg_a"] == 4 + qreg // 16, info
    assert info["hmma"] == 0 and info["qgmma"] == 0, info
    assert sm90.smem_bytes(2) - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info
    assert info["gdc_waits"] == 0, info


@needs_gluon
@pytest.mark.parametrize("qreg", [0, 256], ids=["split", "qreg"])
def test_the_pdl_build_waits_once_and_is_otherwise_the_same(qreg):
    """PDL adds one ``griddepcontrol.wait`` before the partitions start and one
    ``launch_dependents`` after it, so the merge behind it is placed as this grid's programs retire
    (the launch attribute is the host's); registers, spills, products and shared memory stay as
    without it."""
    plain = build("mla_sm90_build", dict(QREG=qreg))
    pdl = build("mla_sm90_build", dict(QREG=qreg, PDL=True))
    assert pdl["gdc_waits"] == 1 and plain["gdc_waits"] == 0, (pdl, plain)
    assert pdl["gdc_launches"] == 1 and plain["gdc_launches"] == 0, (pdl, plain)
    for key in ("regs", "spill_bytes", "serialized", "hgmma", "hgmma_reg_a", "shared"):
        assert pdl[key] == plain[key], (key, pdl[key], plain[key])


@needs_gluon
@pytest.mark.parametrize("single,qreg", [(False, 0), (True, 0), (False, 256)], ids=["splits", "one_split", "qreg"])
def test_the_tiled_build_lands_and_frees_a_key_block_in_four_pieces(single, qreg):
    """``TILED``: each key block lands on four mbarriers (one ``expect_tx`` a piece, where the
    default has one a block), the scores wait for each piece before its product (the producer,
    consumer 0 and consumer 1 wait 3 + 4 + 2 times a block where the default waits 1 + 1 + 1:
    the producer one free mbarrier for the first two pieces), and every slot has four ready and
    three free mbarriers; the products, registers and spills are the default's (with ``QREG``, the
    first two latent pieces' Q from registers: 16 products with A in registers, as without
    pieces), and nine TMA copies still move a block."""
    plain = build("mla_sm90_build", dict(QREG=qreg), single=single)
    tiled = build("mla_sm90_build", dict(TILED=True, QREG=qreg), single=single)
    assert (plain["mbar_expects"], tiled["mbar_expects"]) == (1, 4), (plain, tiled)
    assert tiled["mbar_waits"] - plain["mbar_waits"] == (3 + 4 + 2) - (1 + 1 + 1), (plain, tiled)
    stages = sm90.launch_config(None)["STAGES"]
    assert (sm90.TILE_GROUPS, sm90.TILE_FREES) == (4, 3)
    assert tiled["mbar_inits"] - plain["mbar_inits"] == stages * (sm90.TILE_GROUPS + sm90.TILE_FREES - 2), (plain, tiled)
    assert tiled["tma_loads"] == plain["tma_loads"] == 9, (plain, tiled)
    for key in ("regs", "spill_bytes", "serialized", "hgmma", "hgmma_reg_a"):
        assert tiled[key] == plain[key], (key, tiled[key], plain[key])
    assert sm90.smem_bytes(stages, tiled=True) - 1024 <= tiled["shared"] <= sm90.SMEM_BYTES, tiled


@needs_gluon
@pytest.mark.parametrize("qreg", [0, 256])
def test_the_tiled_build_syncs_consumer_0_no_more_than_the_plain_kernel(qreg):
    """Triton 3.6 puts a CTA barrier of the partition (``bar.sync id, 128``) before each single-thread
    mbarrier arrival and between two mbarrier operations on one allocation. The ``TILED`` build
    gives each piece's barriers an allocation of their own and lets consumer 0 arrive twice a key
    block (P, then the rope and [0, 128) after its P V; [128, 512) is consumer 1's to free, its
    product following P), so its consumer 0 passes no more such barriers than the plain kernel's
    (race 19's build passed eleven a block against four: Nsight Compute put 43-46% of its warps'
    cycles at a CTA barrier) and arrives no more often; consumer 1 arrives once more (it frees two pieces)."""
    plain = build("mla_sm90_build", dict(QREG=qreg))
    tiled = build("mla_sm90_build", dict(TILED=True, QREG=qreg))
    # consumer 0 is the default partition (barrier 0), consumer 1 the first worker (barrier 2)
    p0, p2, t0, t2 = plain["part_syncs"]["0"], plain["part_syncs"]["2"], tiled["part_syncs"]["0"], tiled["part_syncs"]["2"]
    assert 0 < t0 <= p0 and t2 <= p2 + 2, (plain["part_syncs"], tiled["part_syncs"])
    assert tiled["mbar_arrives"] == plain["mbar_arrives"] + 1, (tiled["mbar_arrives"], plain["mbar_arrives"])


def test_the_merge_behind_a_pdl_split_waits_before_it_reads_the_partials():
    """With the split kernel's PDL the merge is launched behind it the same way: it may start
    while the split kernel still writes, so its wait comes before its first global load; without
    PDL it has neither instruction."""
    plain = build("mla_merge_build", False)
    pdl = build("mla_merge_build", True)
    assert plain["gdc_waits"] == 0 and plain["gdc_launches"] == 0, plain
    assert pdl["gdc_waits"] == 1 and pdl["gdc_launches"] == 1, pdl
    assert 0 <= pdl["wait_at"] < pdl["first_load"], pdl


@needs_gluon
@pytest.mark.parametrize("single,cfg", [(False, None), (True, None), (False, dict(BLOCK_N=32, STAGES=4, HSTAGES=2)),
                                        (False, dict(BLOCK_N=32, STAGES=2, HSTAGES=3))],
                         ids=["splits", "one_split", "block_32", "block_32_three_fp16"])
def test_the_fp8_build(single, cfg):
    """The fp8 cache: per key block of N tokens Q K^T in 512 / 16 + 64 / 16 k-steps of width N,
    each half's P V in N / 16 (consumer 0's with P in registers); no fp8 product (the products
    are fp16); the conversion is the hardware's e4m3 -> f16x2 unpack, in both warpgroups (the
    prologue's block and the loop's next one); no spills under Triton 3.6 (the H200's), a few
    scalars (12 bytes with 64-token blocks) under 3.9."""
    import triton

    info = build("mla_sm90_build", cfg, single=single, kv="fp8")
    c = sm90.launch_config(cfg, fp8=True)
    n = c["BLOCK_N"]
    assert not info["serialized"], info["ptxas_info"]
    assert info["spill_bytes"] <= (0 if triton.__version__.startswith("3.6") else 32), info["ptxas_info"]
    assert info["hgmma"] == 36 + 2 * n // 16 and info["hgmma_reg_a"] == n // 16 and info["qgmma"] == 0, info
    assert sm90.smem_bytes_fp8(c["STAGES"], c["HSTAGES"], n) - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info
    # consumer 0 converts 256 latent + 64 rope columns of a block's N rows (N * 320 / 256 unpacks
    # of two values a thread), consumer 1 256 latent columns (N * 256 / 256); twice over
    assert info["f8_unpack"] == 2 * (n * 320 // 256 + n), info


@needs_gluon
@pytest.mark.parametrize("single", [False, True], ids=["splits", "one_split"])
def test_the_fp8_build_with_a_converter_warpgroup(single):
    """CONVERT 'warpgroup' (kernels/mla_sm90_convert.py): per 64-token key block the scores in
    pieces (rope 64 / 16 k-steps, then four latent pieces of 128 / 16), each consumer's P V in two
    128-column products of 64 / 16 (consumer 0's with P in registers); fp16 products only; the
    conversion once per block, in the converter alone (576 x 64 / 128 threads / 2 values per
    unpack); two consumers at 224 registers and the converter at 56: only a scalar of the
    converter's rare tail branch spills (8 bytes under Triton 3.6, 36-44 under 3.9)."""
    import triton

    from kernels import mla_sm90_convert as cv

    info = build("mla_sm90_build", dict(CONVERT="warpgroup"), single=single, kv="fp8")
    assert not info["serialized"], info["ptxas_info"]
    assert info["spill_bytes"] <= (16 if triton.__version__.startswith("3.6") else 64), info["ptxas_info"]
    assert info["hgmma"] == 4 + 4 * 8 + 2 * 2 * 4 and info["hgmma_reg_a"] == 2 * 4 and info["qgmma"] == 0, info
    assert info["f8_unpack"] == 576 * 64 // 128 // 2, info
    assert sm90.registers("convert") == (168, 224) and 2 * 128 * 224 + 128 * cv.CONVERTER_REGS <= 168 * 384
    assert cv.smem_bytes() - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info


@needs_gluon
@pytest.mark.parametrize("single,lazy", [(False, False), (True, False), (False, True)],
                         ids=["splits", "one_split", "lazy"])
def test_the_seesaw_build(single, lazy):
    """The seesaw schedule: per pair of key blocks each warpgroup scores one (256 / 16 + 256 / 16
    + 64 / 16 k-steps, one product per 64-column tile as it lands) and runs P V on its 256 output
    columns for both (64 / 16 each), one with P in registers (its own block's) and one from shared
    memory; nothing serialised. Each warpgroup's score product is compiled twice (the first pair's
    before the loop, the next pair's at the end of each pair). No producer warp, so 255 registers a
    thread: a few scalars spill (Triton 3.6, the H200's: 180 bytes, 160 with one split; 3.9: 280
    and 488), never a tile or the 72 operand descriptors that race 11's build reloaded before
    every product (the slots come from a loop-variant value so the descriptors are not hoisted).
    The lazy rescale's flags and branches spill more scalars (444 bytes under 3.6)."""
    import triton

    info = build("mla_sm90_build", dict(SCHEDULE="seesaw", LAZY=lazy), single=single)
    assert not info["serialized"], info["ptxas_info"]
    bound = 240 if triton.__version__.startswith("3.6") else 512
    assert info["spill_bytes"] <= (2 * bound if lazy else bound), info["ptxas_info"]
    assert info["regs"] > 232, info  # two warpgroups and no producer: more than the split kernel's 232
    assert info["hgmma"] == 2 * (2 * 36 + 2 * 4) and info["hgmma_reg_a"] == 2 * 4, info
    assert info["hmma"] == 0 and info["qgmma"] == 0, info
    assert sm90.smem_bytes_seesaw() - 1024 <= info["shared"] <= sm90.SMEM_BYTES, info


def test_a_config_is_checked_before_launch():
    assert sm90.launch_config(None) == dict(STAGES=2, LEFT=128, PREFETCH=False, QREG=0, LAZY=False, PDL=False,
                                            TILED=False, SCHEDULE="split")
    assert sm90.launch_config(dict(TILED=True, LAZY=True, PDL=True))["TILED"] is True
    with pytest.raises(ValueError, match="TILED .* must be true or false, got 'on'"):
        sm90.launch_config(dict(TILED="on"))
    assert sm90.launch_config(dict(TILED=True, QREG=256))["QREG"] == 256
    with pytest.raises(ValueError, match="TILED .* needs LEFT 128 and PREFETCH off .* got LEFT 256, PREFETCH False"):
        sm90.launch_config(dict(TILED=True, LEFT=256))
    with pytest.raises(ValueError, match="TILED .* needs .* PREFETCH True"):
        sm90.launch_config(dict(TILED=True, PREFETCH=True))
    with pytest.raises(ValueError, match="TILED .* applies to the split schedule only"):
        sm90.launch_config(dict(SCHEDULE="seesaw", TILED=True))
    with pytest.raises(ValueError, match=r"fp8 cache\): \['TILED'\] do not apply"):
        sm90.launch_config(dict(TILED=True), fp8=True)
    assert sm90.launch_config(dict(PDL=True, QREG=256))["PDL"] is True
    with pytest.raises(ValueError, match="PDL .* must be true or false, got 1"):
        sm90.launch_config(dict(PDL=1))
    for schedule in ("split", "seesaw"):  # 1 == True in Python: a flag must be a bool on either schedule
        with pytest.raises(ValueError, match="LAZY .* must be true or false, got 1"):
            sm90.launch_config(dict(SCHEDULE=schedule, LAZY=1))
    with pytest.raises(ValueError, match="PDL .* applies to the split schedule only"):
        sm90.launch_config(dict(SCHEDULE="seesaw", PDL=True))
    with pytest.raises(ValueError, match=r"fp8 cache\): \['PDL'\] do not apply"):
        sm90.launch_config(dict(PDL=True), fp8=True)
    assert "PDL" not in sm90.launch_config(dict(PDL=False), fp8=True)
    assert sm90.launch_config(dict(SCHEDULE="seesaw")) == dict(STAGES=2, LEFT=256, PREFETCH=False, QREG=0, LAZY=False,
                                                               SCHEDULE="seesaw")
    assert sm90.launch_config(dict(LAZY=True, QREG=256))["LAZY"] is True
    with pytest.raises(ValueError, match="LAZY .* must be true or false, got 'yes'"):
        sm90.launch_config(dict(LAZY="yes"))
    assert sm90.launch_config(dict(SCHEDULE="seesaw", LAZY=True))["LAZY"] is True
    assert sm90.launch_config(dict(QREG=256))["QREG"] == 256
    with pytest.raises(ValueError, match="QREG .* must be 0 or 256, got 128"):
        sm90.launch_config(dict(QREG=128))
    with pytest.raises(ValueError, match="QREG 256 needs LEFT 128 and PREFETCH off .* got LEFT 256, PREFETCH False"):
        sm90.launch_config(dict(QREG=256, LEFT=256))
    with pytest.raises(ValueError, match="SCHEDULE 'seesaw' fixes \\['QREG'\\]"):
        sm90.launch_config(dict(SCHEDULE="seesaw", QREG=256))
    with pytest.raises(ValueError, match=r"fp8 cache\): \['QREG'\] do not apply"):
        sm90.launch_config(dict(QREG=256), fp8=True)
    assert sm90.launch_config(dict(SCHEDULE="seesaw", LEFT=256))["SCHEDULE"] == "seesaw"
    with pytest.raises(ValueError, match="SCHEDULE must be one of \\['split', 'seesaw'\\], got 'pingpong'"):
        sm90.launch_config(dict(SCHEDULE="pingpong"))
    with pytest.raises(ValueError, match="SCHEDULE 'seesaw' fixes \\['LEFT', 'PREFETCH'\\]"):
        sm90.launch_config(dict(SCHEDULE="seesaw", LEFT=128, PREFETCH=True))
    with pytest.raises(ValueError, match="SCHEDULE 'seesaw' takes a bf16/fp16 cache only"):
        sm90.launch_config(dict(SCHEDULE="seesaw"), fp8=True)
    with pytest.raises(ValueError, match=r"unknown keys \['BLOCK_H'\]"):
        sm90.launch_config(dict(BLOCK_H=32))
    with pytest.raises(ValueError, match=r"unknown keys \['BLOCK_H'\]"):  # the seesaw's keys are checked too
        sm90.launch_config(dict(SCHEDULE="seesaw", BLOCK_H=32))
    with pytest.raises(ValueError, match="STAGES must be an int >= 2"):
        sm90.launch_config(dict(STAGES=1))
    with pytest.raises(ValueError, match="LEFT .* must be 128 or 256, got 192"):
        sm90.launch_config(dict(LEFT=192))
    with pytest.raises(ValueError, match="STAGES 3 need 3[0-9]+ bytes of shared memory"):
        sm90.launch_config(dict(STAGES=3))  # Q and three 72 KB key blocks
    with pytest.raises(ValueError, match=r"\['BLOCK_N', 'HSTAGES'\] \(the fp8 path's blocks, conversion and scores\) apply"):
        sm90.launch_config(dict(HSTAGES=2, BLOCK_N=64))


def test_the_fp8_config_is_checked_before_launch():
    assert sm90.launch_config(None, fp8=True) == dict(BLOCK_N=64, STAGES=2, HSTAGES=1, LEFT=256, CONVERT="consumers")
    assert sm90.launch_config(dict(PREFETCH=False, BLOCK_N=32, HSTAGES=3), fp8=True) == dict(
        BLOCK_N=32, STAGES=2, HSTAGES=3, LEFT=256, CONVERT="consumers")
    assert sm90.launch_config(dict(CONVERT="warpgroup", BLOCK_N=64), fp8=True)["CONVERT"] == "warpgroup"
    with pytest.raises(ValueError, match="CONVERT must be one of \\['consumers', 'warpgroup'\\], got 'producer'"):
        sm90.launch_config(dict(CONVERT="producer"), fp8=True)
    with pytest.raises(ValueError, match=r"CONVERT 'warpgroup' fixes \['BLOCK_N', 'STAGES'\]"):
        sm90.launch_config(dict(CONVERT="warpgroup", BLOCK_N=32, STAGES=4), fp8=True)
    with pytest.raises(ValueError, match=r"\['CONVERT'\] \(the fp8 path's blocks, conversion and scores\) apply to an fp8"):
        sm90.launch_config(dict(CONVERT="warpgroup"))
    with pytest.raises(ValueError, match=r"fp8 cache\): \['PREFETCH'\] do not apply"):
        sm90.launch_config(dict(PREFETCH=True), fp8=True)
    with pytest.raises(ValueError, match="HSTAGES must be an int >= 1, got 0"):
        sm90.launch_config(dict(HSTAGES=0), fp8=True)
    with pytest.raises(ValueError, match="BLOCK_N must be 32 or 64, got 128"):
        sm90.launch_config(dict(BLOCK_N=128), fp8=True)
    with pytest.raises(ValueError, match="LEFT must be 256"):
        sm90.launch_config(dict(LEFT=128), fp8=True)
    with pytest.raises(ValueError, match="BLOCK_N 32, STAGES 4 and HSTAGES 3 need 2[0-9]+ bytes of shared memory"):
        sm90.launch_config(dict(BLOCK_N=32, STAGES=4, HSTAGES=3), fp8=True)  # Q, 3 x 36 KB fp16, 4 x 18 KB fp8
    with pytest.raises(ValueError, match="BLOCK_N 64, STAGES 2 and HSTAGES 2 need"):
        sm90.launch_config(dict(HSTAGES=2), fp8=True)  # Q, two 72 KB fp16 blocks, two 36 KB fp8


def test_asking_for_it_where_it_cannot_run_is_a_clear_error():
    q = torch.zeros(1, 128, 576, dtype=torch.bfloat16)
    cache = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    bt = torch.zeros(1, 2, dtype=torch.int32)
    sl = torch.tensor([10], dtype=torch.int32)
    assert not sm90.supported(q, cache)
    if not HOPPER:
        with pytest.raises(ValueError, match="KERNEL 'sm90' needs a Hopper GPU"):
            mla_decode(q, cache, bt, sl, SCALE, max_seq_len=10, config=dict(KERNEL="sm90"))
    with pytest.raises(ValueError, match="KERNEL must be 'triton' or 'sm90', got 'cuda'"):
        mla_decode(q, cache, bt, sl, SCALE, max_seq_len=10, config=dict(KERNEL="cuda"))


def _check(lens, heads=128, dtype=torch.bfloat16, page=64, num_splits=None, config=None, seed=0, fp8=False,
           growth=0.0):
    q, cache, bt, sl = _case(lens, heads, dtype, page, seed, fp8, growth)
    assert sm90.supported(q, cache)
    out = torch.full((len(lens), heads, 512), float("nan"), dtype=dtype, device="cuda")  # poison
    o, lse = mla_decode(q, cache, bt, sl, SCALE, kv_scale=KV_SCALE if fp8 else None, max_seq_len=max(lens),
                        num_splits=num_splits, out=out, return_lse=True, config=dict(KERNEL="sm90", **(config or {})))
    # the reference reads only each sequence's own rows, not the NaN slots past it
    assert_matches_reference(o, lse, q, cache, bt, sl, lens, SCALE, KV_SCALE if fp8 else 1.0, TOL[dtype])


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["one_split", "three_splits", "auto"])
@pytest.mark.parametrize("config", [None, dict(LEFT=256), dict(PREFETCH=True), dict(QREG=256), dict(LAZY=True),
                                    dict(LAZY=True, QREG=256), dict(SCHEDULE="seesaw"),
                                    dict(SCHEDULE="seesaw", LAZY=True), dict(rule="fill", resident=2), dict(PDL=True),
                                    dict(PDL=True, QREG=256), dict(TILED=True), dict(TILED=True, QREG=256),
                                    dict(TILED=True, LAZY=True, PDL=True)],
                         ids=["default", "left_256", "prefetch", "qreg", "lazy", "lazy_qreg", "seesaw", "seesaw_lazy",
                              "split_policy", "pdl", "pdl_qreg", "tiled", "tiled_qreg", "tiled_lazy_pdl"])
def test_ragged_batch_matches_the_reference(num_splits, config):
    # empty, one token, one block exactly, partial blocks either side of one, several blocks
    # (for the seesaw's pairs: one block alone, a partial second block, odd and even counts)
    _check([0, 1, 64, 63, 65, 300, 1000], num_splits=num_splits, config=config, seed=num_splits or 7)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_splits", [1, 4], ids=["one_split", "four_splits"])
def test_pdl_reads_what_the_kernel_before_it_wrote(num_splits):
    """Launched with PDL, the kernel may start while the one before it runs: its wait must hold
    every read until that kernel's writes land. Q and the cache are zeroed and rewritten in place
    by the kernels right before each launch, in the same stream, so a read that slipped past the
    wait would see zeros."""
    lens = [4096] * 8 + [1, 700]
    q, cache, bt, sl = _case(lens, 128, torch.bfloat16, 64, 23)
    q_src, cache_src = q.clone(), cache.clone()
    for _ in range(3):
        q.zero_()
        cache.zero_()
        cache.copy_(cache_src)  # a long copy (the whole cache) right before the launch
        q.copy_(q_src)
        out = torch.full((len(lens), 128, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        o, lse = mla_decode(q, cache, bt, sl, SCALE, max_seq_len=max(lens), num_splits=num_splits, out=out,
                            return_lse=True, config=dict(KERNEL="sm90", PDL=True))
        assert_matches_reference(o, lse, q_src, cache_src, bt, sl, lens, SCALE, 1.0, TOL[torch.bfloat16])


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [None, dict(LAZY=True), dict(LAZY=True, QREG=256), dict(SCHEDULE="seesaw"),
                                    dict(SCHEDULE="seesaw", LAZY=True), dict(TILED=True, LAZY=True)],
                         ids=["default", "lazy", "lazy_qreg", "seesaw", "seesaw_lazy", "tiled_lazy"])
def test_a_rising_maximum_matches_the_reference(config):
    """Keys growing along each sequence (page k scaled by 1 + k / 2): the running maximum rises
    by more than the lazy rescale's 2^8 slack again and again, so both of its paths run, P
    near 256 included."""
    _check([100, 1000, 2100], num_splits=1, config=config, seed=17, growth=0.5)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [None, dict(CONVERT="warpgroup")], ids=["default", "converter"])
def test_fp8_with_a_rising_maximum_matches_the_reference(config):
    # up to 9 pages (a factor of 5): the scaled cache stays inside e4m3's range (448) after the
    # per-tensor scale
    _check([100, 500, 560], num_splits=1, config=config, seed=19, growth=0.5, fp8=True)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_CASE_IDS)
@pytest.mark.parametrize("config", [None, dict(QREG=256), dict(SCHEDULE="seesaw"), dict(TILED=True),
                                    dict(TILED=True, QREG=256)], ids=["split", "qreg", "seesaw", "tiled", "tiled_qreg"])
def test_cases_match_the_reference(case, config):
    _check(seed=11, config=config, **case)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["one_split", "three_splits", "auto"])
@pytest.mark.parametrize("config", [None, dict(BLOCK_N=32, STAGES=4, HSTAGES=2), dict(BLOCK_N=32, STAGES=2, HSTAGES=3),
                                    dict(CONVERT="warpgroup")],
                         ids=["default", "block_32", "block_32_three_fp16", "converter"])
def test_fp8_cache_ragged_batch_matches_the_reference(num_splits, config):
    # partial blocks either side of 32 and 64 tokens, one block of either size exactly, several
    _check([0, 1, 31, 32, 33, 64, 95, 300, 1000], num_splits=num_splits, config=config, seed=num_splits or 5,
           fp8=True)


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_CASE_IDS)
@pytest.mark.parametrize("config", [None, dict(BLOCK_N=32, STAGES=4, HSTAGES=2), dict(CONVERT="warpgroup")],
                         ids=["default", "block_32", "converter"])
def test_fp8_cases_match_the_reference(case, config):
    _check(seed=13, fp8=True, config=config, **case)


def test_the_fp8_default_follows_race_10b(monkeypatch):
    """mla_decode takes the Gluon kernel's 64-token fp8 path for fp8 caches because race 10b timed
    it at more than twice the Triton kernel's speed in every case and faster than both 32-token
    rings; DSVOLC_MLA_KERNEL=triton keeps the Triton kernel."""
    import json
    import os

    assert sm90.FP8_DEFAULT and sm90.launch_config(None, fp8=True)["BLOCK_N"] == 64
    path = os.path.join(os.path.dirname(sm90.__file__), "bench", "results", "2026-12-03_h200_race10b_mla.json")
    rows = [r for r in json.load(open(path))["mla"] if r["kv"] == "fp8"]
    assert len(rows) == 5
    for r in rows:
        v = r["variants"]  # in race 10b sm90_b64 was the 64-token path, sm90 and sm90_h3 the 32-token rings
        assert v["sm90_b64"]["ok"] and v["sm90_b64"]["us"] < v["default"]["us"] / 2, r
        assert v["sm90_b64"]["us"] < min(v["sm90"]["us"], v["sm90_h3"]["us"]), r
    _default_switch(torch.float8_e4m3fn, monkeypatch)


def test_the_default_follows_race_9(monkeypatch):
    """mla_decode takes the Gluon kernel by default where it runs because race 9 timed it faster
    than the Triton kernel's default in every bf16 case (2.0-2.3x); DSVOLC_MLA_KERNEL=triton and
    a Triton tile config keep the Triton kernel."""
    import json
    import os

    path = os.path.join(os.path.dirname(sm90.__file__), "bench", "results", "2026-12-03_h200_race9_mla.json")
    rows = [r for r in json.load(open(path))["mla"] if r["kv"] == "bf16"]
    assert len(rows) == 5
    for r in rows:
        assert r["variants"]["sm90"]["ok"] and r["variants"]["sm90"]["us"] < r["variants"]["default"]["us"] / 2, r
    _default_switch(torch.bfloat16, monkeypatch)


def _default_switch(cache_dtype, monkeypatch):
    """The default is the Gluon kernel on a Hopper GPU only, and DSVOLC_MLA_KERNEL=triton turns it off."""
    from kernels.mla_decode import sm90_default

    q = torch.zeros(1, 128, 576, dtype=torch.bfloat16)
    cache = torch.zeros(2, 64, 576, dtype=cache_dtype)
    assert not sm90_default(q, cache)  # CPU tensors
    if HOPPER:
        assert sm90_default(q.cuda(), cache.cuda())
        monkeypatch.setenv("DSVOLC_MLA_KERNEL", "triton")
        assert not sm90_default(q.cuda(), cache.cuda())


def _race19(runs):
    """Race 19's bf16 rows (H100, 128 heads) per case: the plain kernel's time over TILED+QREG's
    (``sm90``; ``default`` in the runs that had no ``sm90`` column, when both were the plain kernel)."""
    import glob
    import json
    import os

    pattern = os.path.join(os.path.dirname(sm90.__file__), "bench", "results", f"2026-12-07_h100_race{runs}.json")
    ratios = {}
    for path in sorted(glob.glob(pattern)):
        for r in json.load(open(path))["mla"]:
            v = r["variants"]
            plain = v.get("sm90", v["default"])
            assert v["sm90_tiled_qreg"]["ok"] and plain["ok"], (path, r["case"])
            ratios.setdefault((r["batch"], r["max_len"]), []).append(plain["us"] / v["sm90_tiled_qreg"]["us"])
    return ratios


def _race22_b128():
    """Race 22's four scrub-timer runs at B 128 4k (H100, FlashMLA in each process): per run,
    FlashMLA's time over TILED+QREG's and over the plain kernel's (``sm90``; the summary's fifth
    ``sm90`` entry is the fp8 run's bf16 row, which did not time TILED+QREG)."""
    import json
    import os

    path = os.path.join(os.path.dirname(sm90.__file__), "bench", "results", "2026-12-07_h100_race22_summary.json")
    case = json.load(open(path))["h128_b128_4k"]
    return case["sm90_tiled_qreg"]["runs"], case["sm90"]["runs"][:4]


def test_the_wave_default_follows_races_19_and_22():
    """mla_decode gives the bf16 kernel TILED with QREG 256 unasked where the batch fits two waves
    of the SMs before splitting: race 19 timed it faster than the plain kernel in one wave (median
    over the runs of both timers); at two (B 128 4k) race 19's build was slower under the layers
    timer, and race 22's (race 21's fewer barriers) faster in every run. Past two waves, unraced,
    it stays off."""
    import statistics

    assert sm90.launch_config(sm90.WAVE_DEFAULT)["TILED"] and sm90.launch_config(sm90.WAVE_DEFAULT)["QREG"] == 256
    scrub, layers = _race19("19_mla_scrub_r*"), _race19("19_mla_layers_r*")
    # the same timer beside the LAZY and PDL variants, and races 19c-19d's runs in both orders (19b's
    # own rows time the new default as "default", so they are left out here)
    for runs in ("19_mla_combo_r*", "19c_mla_order_*", "19d_mla_order_*"):
        for case, speedups in _race19(runs).items():
            scrub[case] += speedups
    assert set(scrub) == {(32, 4096), (64, 4096), (128, 4096), (32, 32768), (64, 32768)}
    for (batch, max_len), speedups in scrub.items():
        picked = sm90.default_for(batch, 128, 132, fp8=False)  # an H100's 132 SMs, as raced
        assert picked == sm90.WAVE_DEFAULT and len(speedups) >= 12
        both = speedups + layers[(batch, max_len)]
        if batch * 2 <= 132:  # one wave: not slower over both timers' runs (B 64 32k scrub alone: 0.999)
            assert statistics.median(both) >= 1.0, (batch, max_len, both)
        else:  # two waves: race 19's build lost under the layers timer; race 22's won every run
            assert statistics.median(layers[(batch, max_len)]) < 0.97, (batch, layers)
            tiled, plain = _race22_b128()
            assert len(tiled) == len(plain) == 4 and all(t / p > 1.03 for t, p in zip(tiled, plain)), (tiled, plain)
    assert min(scrub[(32, 4096)] + layers[(32, 4096)]) > 1.01  # its largest win, in every run of both timers
    assert not sm90.default_for(133, 128, 132, fp8=False)  # 266 programs: past two waves


@pytest.mark.parametrize("batch,heads,sms,fp8,want", [
    (32, 128, 132, False, True), (66, 128, 132, False, True), (132, 128, 132, False, True),
    (133, 128, 132, False, False), (264, 64, 132, False, True), (265, 64, 132, False, False),
    (32, 128, 132, True, False), (67, 128, 66, False, False), (66, 128, 66, False, True),
    (0, 128, 132, False, False)])
def test_the_wave_default_is_taken_where_the_batch_fits_two_waves(batch, heads, sms, fp8, want):
    got = sm90.default_for(batch, heads, sms, fp8)
    assert got == (sm90.WAVE_DEFAULT if want else {})
    if got:
        got["TILED"] = False  # a copy: the module's default is not the caller's to change
        assert sm90.WAVE_DEFAULT["TILED"]


@needs_gluon
@needs_hopper
@pytest.mark.timeout(300)
def test_unasked_the_kernel_runs_its_wave_default_and_matches_the_reference():
    """With no config, a batch that fits two waves runs TILED+QREG (the same bits as asking for it)
    and a larger one the plain kernel; both match the float64 reference."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch in (8, sms + 1):
        lens = [(37 * i) % 700 + 1 for i in range(batch)]
        q, cache, bt, sl = _case(lens, 128, torch.bfloat16, 64, 5, False, 0.0)
        kw = dict(max_seq_len=max(lens), return_lse=True)
        o, lse = mla_decode(q, cache, bt, sl, SCALE, **kw)
        want = sm90.default_for(batch, 128, sms, fp8=False)
        assert bool(want) == (batch == 8)
        o2, lse2 = mla_decode(q, cache, bt, sl, SCALE, config=dict(KERNEL="sm90", **want), **kw)
        assert torch.equal(o, o2) and torch.equal(lse, lse2), batch
        assert_matches_reference(o, lse, q, cache, bt, sl, lens, SCALE, 1.0, TOL[torch.bfloat16])
