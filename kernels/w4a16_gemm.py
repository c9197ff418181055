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

Dequantisation per tile element costs a shift, one logic op (AND+OR fuse into LOP3), an
fp32 subtract of the zero point and a conversion: nibbles become floats by OR-ing
them into the mantissa of 2**23 (0x4B000000) instead of an int->float convert, and the
group scale multiplies the [BLOCK_M, BLOCK_N] partial product after the dot, not every
weight (BLOCK_K divides the group size, so a tile has one scale row).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

GROUP_SIZE = 128
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


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
    UPCAST_DOT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)  # packed columns
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask_p = offs_p < N // 8

    # Column c of an 8-block sits in nibble REVERSE[c] = [0, 4, 1, 5, 2, 6, 3, 7][c],
    # i.e. shift = 4 * REVERSE[c] = (c >> 1) * 4 + (c & 1) * 16.
    c8 = tl.arange(0, 8)
    shifts = (c8 >> 1) * 4 + (c8 & 1) * 16

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
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
        qw = tl.load(
            qw_ptr + k[:, None].to(tl.int64) * (N // 8) + offs_p[None, :],
            mask=mask_k[:, None] & mask_p[None, :],
            other=0,
        )
        grp = (kb * BLOCK_K) // GROUP
        qz = tl.load(qz_ptr + grp * (N // 8) + offs_p, mask=mask_p, other=0)
        sc = tl.load(sc_ptr + grp * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)

        # nibble -> fp32 exactly: bits 0x4B00000q are the float 2**23 + q.
        q = ((qw[:, :, None] >> shifts[None, None, :]) & 0xF) | 0x4B000000
        q = tl.reshape(q, (BLOCK_K, BLOCK_N)).to(tl.float32, bitcast=True)
        z = (qz[:, None] >> shifts[None, :]) & 0xF
        z = tl.reshape(z, (BLOCK_N,)).to(tl.float32) + 8388608.0
        w = (q - z[None, :]).to(x_ptr.dtype.element_ty)  # integers in [-15, 15]: exact
        if UPCAST_DOT:
            part = tl.dot(x.to(tl.float32), w.to(tl.float32))
        else:
            part = tl.dot(x, w)
        acc += part * sc[None, :]

    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


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
    """Block sizes and split by shape. Decode (M <= 64) is a weight stream: the M tile
    is the smallest the tensor cores take (16) and K is split until ~4 programs per SM
    are in flight. Prefill tiles M by 64/128 and splits only to fill the SMs."""
    if m <= 64:
        bm = max(16, triton.next_power_of_2(m))
        bn, bk, warps, stages = 128, 128, 4, 4
    else:
        bm = 64 if m <= 128 else 128
        bn, bk, warps, stages = 128, 64, 8, 3
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    kb = triton.cdiv(k, bk)
    target = 4 * num_sms if m <= 64 else num_sms
    split = max(1, min(kb // 2 if kb >= 2 else 1, triton.cdiv(target, tiles)))
    if m > 64 and tiles >= num_sms:
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
        # Triton's CPU interpreter (3.9) multiplies bf16 dot operands as raw bits; an
        # fp32 dot of the same bf16 values is the same exact-product, fp32-sum math.
        UPCAST_DOT=_INTERPRET and x.dtype == torch.bfloat16,
        **cfg,
    )
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](dst, out, m * n, SPLIT=split, BLOCK=block)
    return out.view(*lead, n)
