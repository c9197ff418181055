"""The Gluon sm_90 W4A16 kernel for decode batches (kernels/w4a16_sm90.py).

On any machine: the repacked layout decodes (the kernel's own word/nibble order, replayed in
PyTorch) to the AutoAWQ weights for both activation dtypes and every tile shape; configs and
operands are checked with errors that name the field; the kernel builds for sm_90a with its
per-step structure (one 16-byte copy of a thread's packed words, ``mma.sync`` count, no spills,
and the tile assembled without data movement, which the build itself asserts). On a Hopper GPU:
the product against the fp32 reference for M 1-16, fp16 and bf16, one split and split-K, and a
second call reusing the zeroed workspace."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
from sm90_build import HOPPER, build, needs_hopper  # noqa: E402

from kernels import w4a16_sm90 as w4  # noqa: E402
from kernels.reference import awq_dequantize, awq_quantize  # noqa: E402

needs_gluon = pytest.mark.skipif(not w4.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")


def _awq(k, n, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(k, n, generator=g) * 0.05
    qw, qz, sc = awq_quantize(w)
    return qw.to(device), qz.to(device), sc.to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("nrep,kw", [(2, 2), (4, 1), (1, 4), (4, 4)])
def test_repacked_words_decode_to_the_awq_weights(dtype, nrep, kw):
    k, n = 256, 256
    qw, qz, sc = _awq(k, n, seed=nrep * 10 + kw)
    p = w4.repack(qw, qz, sc, dtype, nrep=nrep, kw=kw)
    assert p.words.numel() == k * n // 8 and p.sz.shape == (k // 128, n)
    got = w4.unpack_repacked(p).float()
    ref = awq_dequantize(qw, qz, sc)
    # (q - z) exact in the dtype, times the scale rounded to it, rounded once
    want = ((ref / sc.float().repeat_interleave(128, 0)) * sc.to(dtype).float().repeat_interleave(128, 0)).to(dtype)
    assert torch.equal(got, want.float())


def test_a_wrong_layout_does_not_decode():
    """The check above can fail: words packed with a different tile decode to other weights."""
    qw, qz, sc = _awq(256, 256, seed=3)
    p = w4.repack(qw, qz, sc, torch.bfloat16, nrep=2, kw=2)
    wrong = w4.PackedW4(p.words, p.sz, p.k, p.n, 4, 1, p.dtype)
    assert not torch.equal(w4.unpack_repacked(wrong), w4.unpack_repacked(p))


def test_bad_operands_and_configs_are_named():
    qw, qz, sc = _awq(256, 192)
    with pytest.raises(ValueError, match=r"N \(192\) of 128"):
        w4.repack(qw, qz, sc, torch.bfloat16, nrep=4, kw=1)
    with pytest.raises(ValueError, match="NREP x KW must be at least 4"):
        w4.repack(qw, qz, sc, torch.bfloat16, nrep=1, kw=2)
    with pytest.raises(ValueError, match="activation dtype must be bf16 or fp16"):
        w4.repack(qw, qz, sc, torch.float32)
    with pytest.raises(ValueError, match=r"unknown keys \['BLOCK_N'\]"):
        w4.launch_config(1, 4096, 4096, 132, dict(BLOCK_N=64))
    with pytest.raises(ValueError, match="STAGES must be an int in"):
        w4.launch_config(1, 4096, 4096, 132, dict(STAGES=1))
    with pytest.raises(ValueError, match=r"M must be in \[1, 16\], got 17"):
        w4.launch_config(17, 4096, 4096, 132)
    p = w4.repack(qw, qz, sc, torch.bfloat16)
    with pytest.raises(ValueError, match="differ from the packed weights"):
        w4.launch_config(1, 192, 256, 132, dict(NREP=4, KW=1), p)
    with pytest.raises(ValueError, match="x is torch.float16, the weights were packed for torch.bfloat16"):
        w4.w4a16_sm90(torch.zeros(1, 256, dtype=torch.float16), p)
    with pytest.raises(ValueError, match="x has K = 128, the packed weights 256"):
        w4.w4a16_sm90(torch.zeros(1, 128, dtype=torch.bfloat16), p)


def test_the_split_covers_k_without_empty_programs():
    for k, split in [(4096, None), (5120, 7), (2048, 64), (28672, 3)]:
        cfg = w4.launch_config(1, 4096, k, 132, dict(SPLIT=split) if split else None)
        steps = k // 64
        assert (cfg["SPLIT"] - 1) * cfg["STEPS_PER_SPLIT"] < steps <= cfg["SPLIT"] * cfg["STEPS_PER_SPLIT"], cfg


@needs_gluon
@pytest.mark.parametrize("cfg,dtype", [(dict(NREP=2, KW=2), "bf16"), (dict(NREP=2, KW=2), "fp16"),
                                       (dict(NREP=4, KW=1), "bf16"), (dict(NREP=4, KW=4, STAGES=4), "bf16")],
                         ids=["2x2_bf16", "2x2_fp16", "4x1", "4x4"])
def test_the_build(cfg, dtype):
    info = build("w4a16_sm90_build", cfg, dtype)
    assert info["spill_bytes"] == 0, info
    # per K step and warp: (32 KW / 16) k16 slices x NREP n8 tiles of mma.m16n8k16
    assert info["hmma"] == 2 * cfg["KW"] * cfg["NREP"], info
    assert info["hgmma"] == 0 and info["qgmma"] == 0, info
    j = cfg["NREP"] * cfg["KW"]
    stages = cfg.get("STAGES", 6)
    assert info["shared"] == stages * (2 * 128 * j * 4 + 16 * 32 * cfg["KW"] * 2), info


# ---------------------------------------------------------------------------- on a Hopper GPU
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("k,n,cfg", [(1024, 512, None), (4096, 1024, dict(SPLIT=1)), (2048, 768, dict(SPLIT=5)),
                                     (512, 256, dict(NREP=4, KW=1, SPLIT=3))],
                         ids=["auto", "one_split", "split5", "4x1"])
def test_matches_the_reference(dtype, m, k, n, cfg):
    dev = "cuda"
    qw, qz, sc = _awq(k, n, seed=m + k, device=dev)
    tile = {kk: cfg[kk] for kk in ("NREP", "KW") if cfg and kk in cfg}
    p = w4.repack(qw, qz, sc, dtype, nrep=tile.get("NREP", 2), kw=tile.get("KW", 2))
    x = torch.randn(m, k, device=dev, dtype=dtype)
    ref = x.float() @ w4.unpack_repacked(p).float()  # the kernel's rounding of W, fp32 sums
    for _ in range(2):  # the second call reuses the workspace the first left zeroed
        out = w4.w4a16_sm90(x, p, cfg)
        err = (out.float() - ref).norm() / ref.norm()
        assert out.dtype == dtype and out.shape == (m, n)
        assert err < 5e-3, err
    awq = x.float() @ awq_dequantize(qw, qz, sc)
    assert (out.float() - awq).norm() / awq.norm() < 1e-2


@needs_hopper
def test_three_dim_input_and_strided_rows():
    qw, qz, sc = _awq(1024, 512, device="cuda")
    p = w4.repack(qw, qz, sc, torch.bfloat16)
    big = torch.randn(2, 4, 2048, device="cuda", dtype=torch.bfloat16)
    x = big[..., :1024]  # rows 2048 apart
    out = w4.w4a16_sm90(x, p)
    ref = x.float() @ w4.unpack_repacked(p).float()
    assert out.shape == (2, 4, 512)
    assert ((out.float() - ref).norm() / ref.norm()) < 5e-3
