import pytest
import torch

from kernels.reference import (
    AWQ_ORDER,
    awq_dequantize,
    awq_pack,
    awq_quantize,
    awq_unpack,
    w4a16_reference,
)
from kernels.w4a16_gemm import pick_config, w4a16_gemm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_pack_layout_is_autoawq_order():
    # nibble i of each int32 holds column AWQ_ORDER[i] of the 8-column block
    for col in range(8):
        q = torch.zeros(1, 8, dtype=torch.int32)
        q[0, col] = 0xA
        nib = AWQ_ORDER.index(col)
        assert awq_pack(q).item() & 0xFFFFFFFF == 0xA << (4 * nib)
    q = torch.zeros(1, 8, dtype=torch.int32)
    q[0, 7] = 0xF  # column 7 lives in the top nibble: the int32 is negative
    assert awq_pack(q).item() == -(2**28)


def test_pack_round_trip():
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (37, 8 * 11), generator=gen, dtype=torch.int32)
    assert torch.equal(awq_unpack(awq_pack(q)), q)


def test_quantize_round_trip():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(384, 72, generator=gen)
    qw, qz, sc = awq_quantize(w)
    assert qw.shape == (384, 9) and qz.shape == (3, 9) and sc.shape == (3, 72)
    assert qw.dtype == qz.dtype == torch.int32 and sc.dtype == torch.float16
    deq = awq_dequantize(qw, qz, sc)
    # rounding to the grid costs at most half a step, plus the rounded zero point
    step = sc.float().repeat_interleave(128, 0)
    assert ((deq - w).abs() <= step * 1.01 + 1e-6).all()
    # 16 levels over a Gaussian group's range (~5 sigma) leave ~10% relative error
    assert (deq - w).norm() / w.norm() < 0.12
    codes = awq_unpack(qw)
    assert codes.min() == 0 and codes.max() == 15


# output rounding: one ulp of the output dtype at |y|, plus fp32 summation
TOL = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def check(m, k, n, dtype, config=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(k, n, generator=gen)
    qw, qz, sc = (t.to(DEVICE) for t in awq_quantize(w))
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    y = w4a16_gemm(x, qw, qz, sc, config=config)
    assert y.shape == (m, n) and y.dtype == dtype
    ref = w4a16_reference(x, qw, qz, sc)
    err = (y.float() - ref).abs()
    bound = TOL[dtype] * ref.abs() + 1e-3 * ref.abs().max()
    assert torch.isfinite(y).all()
    assert (err <= bound).all(), f"max err {err.max().item()} at {(err - bound).argmax().item()}"


SHAPES = [(1, 128, 8), (3, 384, 72), (17, 640, 200), (33, 256, 264), (80, 384, 136)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_w4a16_default_config(m, k, n, dtype):
    check(m, k, n, dtype, seed=m + k + n)


SPLIT = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=2)
TILED = dict(BLOCK_M=32, BLOCK_N=256, BLOCK_K=64, SPLIT_K=1, num_warps=4, num_stages=2)
SPLIT_BK64 = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, SPLIT_K=3, num_warps=4, num_stages=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "m,k,n,config",
    [
        (5, 640, 72, SPLIT),  # 5 K blocks over 2 splits: 3 + 2
        (2, 384, 96, SPLIT_BK64),  # two K tiles per scale group, 6 blocks over 3 splits
        (45, 384, 264, TILED),  # M and N tails (N = 256 + 8)
        (1, 1152, 40, dict(SPLIT, SPLIT_K=4)),  # 9 blocks / 4 -> 3 splits of 3
    ],
    ids=["split2", "split3_bk64", "tiled", "split_uneven"],
)
def test_w4a16_paths(m, k, n, config, dtype):
    check(m, k, n, dtype, config=config, seed=k)


def test_w4a16_batched_input_and_empty():
    gen = torch.Generator().manual_seed(3)
    qw, qz, sc = (t.to(DEVICE) for t in awq_quantize(torch.randn(256, 64, generator=gen)))
    x = torch.randn(2, 3, 256, generator=gen).half().to(DEVICE)
    y = w4a16_gemm(x, qw, qz, sc)
    assert y.shape == (2, 3, 64)
    torch.testing.assert_close(
        y.float(), w4a16_reference(x.reshape(6, 256), qw, qz, sc).view(2, 3, 64), rtol=2e-3, atol=2e-2
    )
    assert w4a16_gemm(x[:0], qw, qz, sc).shape == (0, 3, 64)


def test_pick_config_by_shape():
    # H200: 132 SMs. Decode splits K to fill the GPU; prefill with many tiles does not.
    dec = pick_config(1, 5120, 27648, 132)
    assert dec["BLOCK_M"] == 16 and dec["SPLIT_K"] > 1
    pre = pick_config(256, 27648, 5120, 132)  # n = 27648: 216 tiles, no split
    assert pre["BLOCK_M"] == 128 and pre["SPLIT_K"] == 1
