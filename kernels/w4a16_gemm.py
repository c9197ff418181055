"""W4A16 GEMM on AutoAWQ checkpoints: y = x @ dequant(W).

Layout (AutoAWQ GEMM format, as read by vLLM's AWQ loader):
- ``qweight`` int32 [K, N/8]: 8 nibbles per int32 along N, nibble i holds column
  AWQ_ORDER[i] = (0, 2, 4, 6, 1, 3, 5, 7)[i] of its 8-column block;
- ``qzeros``  int32 [K/G, N/8], packed the same way;
- ``scales``  fp16  [K/G, N]; G = 128.
W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

One kernel serves both shapes of work:
- small M (decode): split-K. A [BLOCK_K, BLOCK_N] weight tile is read once per M tile,
  and K is split across programs so that N / BLOCK_N * SPLIT_K programs fill every SM
  (N = 5120 gives only 40 column tiles for 132 SMs); partial sums go to an fp32
  workspace reduced by a second small kernel.
- large M (prefill): plain output tiling with bigger BLOCK_M, no split unless the
  tile count is below the SM count.

Dequantisation works per nibble position: nibble i of each packed int32 across the tile
is a [BLOCK_K, BLOCK_N / 8] sub-tile of whole columns, so the kernel runs 8 dots per K
step and never reshapes or interleaves the unpacked tile (a first version that did ran at
~20% of the copy bandwidth on an H200; kernels/bench/results/*_v1_*). Each weight costs
a shift and one logic op: the nibble is OR-ed into the mantissa of 128.0 in the
activation dtype (1024.0 for fp16), giving 128 + q exactly, and the zero point, the offset and the
group scale are applied to the [BLOCK_M, BLOCK_N / 8] dot result (BLOCK_K divides the
group size, so a K step sees one scale/zero row).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

GROUP_SIZE = 128
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _nibble_dot(acc, x, xsum, qw, qz, sc_ptr, sc_row, offs_p, mask_p,
                I: tl.constexpr, MAGIC: tl.constexpr, BASE: tl.constexpr, UPCAST_DOT: tl.constexpr):
    # Nibble I of every packed int32 is one [BLOCK_K, BLOCK_P] sub-tile: the column
    # AWQ_ORDER[I] = (I % 4) * 2 + I // 4 of each 8-column block. Working per nibble needs
    # no reshape/interleave (which cost a shared-memory layout conversion per tile).
    # OR-ing the nibble into the mantissa of BASE (bits MAGIC, ulp 1) gives BASE + q exactly
    # in the activation dtype: one shift and one LOP3 per weight, no int->float convert.
    w = (((qw >> (4 * I)) & 0xF) | MAGIC).to(tl.int16).to(x.dtype, bitcast=True)
    if UPCAST_DOT:
        part = tl.dot(x.to(tl.float32), w.to(tl.float32))
    else:
        part = tl.dot(x, w)
    # sum_k x (BASE + q - BASE - z) = x.(BASE + q) - sum(x) (BASE + z): the zero point and
    # the BASE offset cost BLOCK_M x BLOCK_P work per tile instead of a subtract per weight.
    z = ((qz >> (4 * I)) & 0xF).to(tl.float32) + BASE
    s = tl.load(sc_ptr + sc_row + offs_p * 8 + ((I % 4) * 2 + I // 4), mask=mask_p, other=0.0)
    return acc + (part - xsum[:, None] * z[None, :]) * s.to(tl.float32)[None, :]


@triton.jit
def _store_nibble(out, acc, offs_p, omask, I: tl.constexpr):
    tl.store(out + offs_p[None, :] * 8 + ((I % 4) * 2 + I // 4), acc.to(out.dtype.element_ty), mask=omask)


@triton.jit
def _w4a16_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    sc_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_os,
    k_iters,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MAGIC: tl.constexpr,
    BASE: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    BLOCK_P: tl.constexpr = BLOCK_N // 8
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    NP = N // 8

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_n * BLOCK_P + tl.arange(0, BLOCK_P)  # packed columns
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_p = offs_p < NP

    a0 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a4 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a5 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a6 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    a7 = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    kb0 = pid_k * k_iters
    kb_end = tl.minimum(kb0 + k_iters, tl.cdiv(K, BLOCK_K))
    for kb in range(kb0, kb_end):
        k = kb * BLOCK_K + offs_k
        mask_k = k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + k[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        xsum = tl.sum(x.to(tl.float32), axis=1)
        qw = tl.load(
            qw_ptr + k[:, None].to(tl.int64) * NP + offs_p[None, :],
            mask=mask_k[:, None] & mask_p[None, :],
            other=0,
        )
        grp = (kb * BLOCK_K) // GROUP
        qz = tl.load(qz_ptr + grp * NP + offs_p, mask=mask_p, other=0)
        row = grp * N
        a0 = _nibble_dot(a0, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 0, MAGIC, BASE, UPCAST_DOT)
        a1 = _nibble_dot(a1, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 1, MAGIC, BASE, UPCAST_DOT)
        a2 = _nibble_dot(a2, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 2, MAGIC, BASE, UPCAST_DOT)
        a3 = _nibble_dot(a3, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 3, MAGIC, BASE, UPCAST_DOT)
        a4 = _nibble_dot(a4, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 4, MAGIC, BASE, UPCAST_DOT)
        a5 = _nibble_dot(a5, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 5, MAGIC, BASE, UPCAST_DOT)
        a6 = _nibble_dot(a6, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 6, MAGIC, BASE, UPCAST_DOT)
        a7 = _nibble_dot(a7, x, xsum, qw, qz, sc_ptr, row, offs_p, mask_p, 7, MAGIC, BASE, UPCAST_DOT)

    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om
    omask = mask_m[:, None] & mask_p[None, :]
    _store_nibble(out, a0, offs_p, omask, 0)
    _store_nibble(out, a1, offs_p, omask, 1)
    _store_nibble(out, a2, offs_p, omask, 2)
    _store_nibble(out, a3, offs_p, omask, 3)
    _store_nibble(out, a4, offs_p, omask, 4)
    _store_nibble(out, a5, offs_p, omask, 5)
    _store_nibble(out, a6, offs_p, omask, 6)
    _store_nibble(out, a7, offs_p, omask, 7)


@triton.jit
def _splitk_reduce_kernel(ws_ptr, out_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def pick_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """Block sizes and split by shape, from an H200 sweep (bench/results/*_v2_sweep.json).
    Decode (M <= 16) is a weight stream: the smallest M tile the tensor cores take (16),
    256-column tiles and K split until ~8 programs per SM are in flight (1080 programs
    for 5120 x 27648: 70 us against 153 us with 128 columns and 4 per SM). M = 64 and
    prefill tile M by 64/128 and split only to fill the SMs."""
    if m <= 16:
        bm, bn, bk, warps, stages, waves = 16, 256, 64, 4, 3, 8
    elif m <= 64:
        bm, bn, bk, warps, stages, waves = 64, 128, 128, 4, 3, 2
    else:
        bm, bn, bk, warps, stages, waves = 128, 256, 128, 8, 3, 1
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    kb = triton.cdiv(k, bk)
    split = max(1, min(kb, triton.cdiv(waves * num_sms, tiles)))
    if waves == 1 and tiles >= num_sms:
        split = 1
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps, num_stages=stages)


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    config: dict | None = None,
) -> torch.Tensor:
    """x [..., K] fp16/bf16 -> [..., N] in x's dtype."""
    assert x.dtype in (torch.float16, torch.bfloat16)
    k = x.shape[-1]
    n = qweight.shape[1] * 8
    assert qweight.shape[0] == k and qweight.dtype == torch.int32
    assert k % GROUP_SIZE == 0 and scales.shape == (k // GROUP_SIZE, n)
    assert qzeros.shape == (k // GROUP_SIZE, n // 8)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*lead, n)
    cfg = dict(config or pick_config(m, n, k, _num_sms(x.device)))
    split = cfg.pop("SPLIT_K")
    assert GROUP_SIZE % cfg["BLOCK_K"] == 0
    kb = triton.cdiv(k, cfg["BLOCK_K"])
    k_iters = triton.cdiv(kb, split)
    split = triton.cdiv(kb, k_iters)  # no empty splits
    dst = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, cfg["BLOCK_M"]), split)
    _w4a16_kernel[grid](
        x2,
        qweight,
        qzeros,
        scales.contiguous(),
        dst,
        m,
        n,
        k,
        x2.stride(0),
        n,
        m * n,
        k_iters,
        GROUP=GROUP_SIZE,
        # A base whose ulp is 1 (bf16: 128 = 0x4300, 7 mantissa bits; fp16: 1024 =
        # 0x6400, 10 bits): OR-ing a nibble q into its mantissa gives exactly base + q.
        MAGIC=0x4300 if x.dtype == torch.bfloat16 else 0x6400,
        BASE=128.0 if x.dtype == torch.bfloat16 else 1024.0,
        # Triton's CPU interpreter (3.9) multiplies bf16 dot operands as raw bits; an
        # fp32 dot of the same bf16 values is the same exact-product, fp32-sum math.
        UPCAST_DOT=_INTERPRET and x.dtype == torch.bfloat16,
        **cfg,
    )
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](dst, out, m * n, SPLIT=split, BLOCK=block)
    return out.view(*lead, n)
