"""W4A16 GEMM on AutoAWQ checkpoints: y = x @ dequant(W).

Layout (AutoAWQ GEMM format, as read by vLLM's AWQ loader):
- ``qweight`` int32 [K, N/8]: 8 nibbles per int32 along N, nibble i holds column
  AWQ_ORDER[i] = (0, 2, 4, 6, 1, 3, 5, 7)[i] of its 8-column block;
- ``qzeros``  int32 [K/G, N/8], packed the same way;
- ``scales``  fp16  [K/G, N]; G = 128.
W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

Three paths, chosen by `pick_config` from the activation rows M (H200 sweeps in
kernels/bench/results/2026-11-29_h200_v3_*):
- M <= 2, "gemv": CUDA-core GEMV, no tensor cores and no shared-memory round trip
  (`_gemv_kernel`). Each program owns BLOCK_N columns and a range of scale groups (split-K
  into an fp32 workspace reduced by a second small kernel); nibbles are unpacked in
  registers with one LOP3 and one FADD per weight (see `_nib_q`) and multiply-accumulated
  in fp32. 1.3-1.6x faster than bf16 cuBLAS at M = 1, 32-38% of the 4-bit roofline.
- 3 <= M <= 32, "mma": the tensor-core split-K tile kernel (`_w4a16_kernel`). Dequantisation
  works per nibble position: nibble i of each packed int32 across the tile is a
  [BLOCK_K, BLOCK_N / 8] sub-tile of whole columns, so the kernel runs 8 dots per K step and
  never reshapes or interleaves the unpacked tile (a first version that did ran at ~20% of
  the copy bandwidth; kernels/bench/results/*_v1_*). Each weight costs a shift and one logic
  op: the nibble is OR-ed into the mantissa of 128.0 in the activation dtype (1024.0 for
  fp16), giving 128 + q exactly, and the zero point, the offset and the group scale are
  applied to the [BLOCK_M, BLOCK_N / 8] dot result (BLOCK_K divides the group size, so a K
  step sees one scale/zero row).
- M >= 64, "dequant": `awq_dequantize_triton` writes W in the activation dtype once (one
  read of the packed weights, one write, ~3.3 TB/s), then cuBLAS multiplies. W is rounded
  to the activation dtype once, as any dequantise-then-GEMM path does.
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
def _splitk_reduce_kernel(ws_ptr, out_ptr, MN, SPLIT, BLOCK: tl.constexpr):
    # SPLIT is a runtime value: one compiled kernel for every split count
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- GEMV (decode)
# No tensor cores and no shared-memory round trip: each program owns BLOCK_N columns
# (BLOCK_N / 8 packed words per row, loaded as [BLOCK_K, BLOCK_N / 8] int32 tiles with the
# words of a row contiguous) and a range of scale groups (split-K), unpacks nibbles in
# registers and multiply-accumulates in fp32 on the CUDA cores.
#
# Exact integer-to-float unpack in two instructions per weight pair of nibble positions:
# nibble I lives at bits 4 * (I % 4) of the word (I < 4) or of word >> 16 (I >= 4).
# Masking it in place and OR-ing the bits of 2^23 gives the fp32 value 2^23 + q * 16^(I % 4)
# exactly (one LOP3), and subtracting the same construction of the zero point gives
# (q - z) * 16^(I % 4) exactly (one FADD). The power of 16 is folded into the group scale.
# The 2^23 pattern is a runtime argument (`magic`) so that the mask can be the LOP3's
# immediate and the pattern its constant-bank operand (as a constexpr, ptxas spent a MOV
# per LOP3 materialising one of the two constants).


@triton.jit
def _nib_q(qw, qz, I: tl.constexpr, magic):
    """[BK, BP] fp32 (q - z) * 16^(I % 4) for nibble I of the packed words qw [BK, BP], zeros qz [BP]."""
    J: tl.constexpr = I % 4
    if I < 4:
        w = qw
        z = qz
    else:
        w = qw >> 16
        z = qz >> 16
    f = ((w & (0xF << (4 * J))) | magic).to(tl.float32, bitcast=True)
    zf = ((z & (0xF << (4 * J))) | magic).to(tl.float32, bitcast=True)
    return f - zf[None, :]


@triton.jit
def _nib_scale(srow, mask_p, I: tl.constexpr):
    """Group scale of nibble I's columns (column AWQ_ORDER[I] of each 8-block), / 16^(I % 4)."""
    J: tl.constexpr = I % 4
    s = tl.load(srow + (J * 2 + I // 4), mask=mask_p, other=0.0).to(tl.float32)
    return s * (1.0 / (16**J))


@triton.jit
def _fma8(a0, a1, a2, a3, a4, a5, a6, a7, x, q0, q1, q2, q3, q4, q5, q6, q7):
    return (a0 + x * q0, a1 + x * q1, a2 + x * q2, a3 + x * q3,
            a4 + x * q4, a5 + x * q5, a6 + x * q6, a7 + x * q7)


@triton.jit
def _end8(o0, o1, o2, o3, o4, o5, o6, o7, a0, a1, a2, a3, a4, a5, a6, a7, s0, s1, s2, s3, s4, s5, s6, s7):
    return (o0 + tl.sum(a0, axis=0) * s0, o1 + tl.sum(a1, axis=0) * s1,
            o2 + tl.sum(a2, axis=0) * s2, o3 + tl.sum(a3, axis=0) * s3,
            o4 + tl.sum(a4, axis=0) * s4, o5 + tl.sum(a5, axis=0) * s5,
            o6 + tl.sum(a6, axis=0) * s6, o7 + tl.sum(a7, axis=0) * s7)


@triton.jit
def _store8(out, o0, o1, o2, o3, o4, o5, o6, o7, mask):
    # nibble I holds column AWQ_ORDER[I] = (I % 4) * 2 + I // 4 of each 8-column block
    ty = out.dtype.element_ty
    tl.store(out + 0, o0.to(ty), mask=mask)
    tl.store(out + 2, o1.to(ty), mask=mask)
    tl.store(out + 4, o2.to(ty), mask=mask)
    tl.store(out + 6, o3.to(ty), mask=mask)
    tl.store(out + 1, o4.to(ty), mask=mask)
    tl.store(out + 3, o5.to(ty), mask=mask)
    tl.store(out + 5, o6.to(ty), mask=mask)
    tl.store(out + 7, o7.to(ty), mask=mask)


@triton.jit
def _gemv_kernel(
    x_ptr, qw_ptr, qz_ptr, sc_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_os, g_iters, magic,
    GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SCALE_EACH: tl.constexpr,
):
    """ROWS (1, 2 or 4) activation rows per program; grid axis 0 walks row blocks, so the
    programs sharing a weight tile run side by side and the tile comes from DRAM once.
    Per weight: 1 LOP3 (+1/2 shift) and 1 FADD to unpack, shared by the rows, then 1 FFMA
    per row into an elementwise [BLOCK_K, BLOCK_N / 8] accumulator per (row, nibble).
    SCALE_EACH=False: the accumulators hold one group's unscaled sums and are reduced over
    K and scaled at each group's end (BLOCK_K divides GROUP). SCALE_EACH=True: each
    unpacked weight is multiplied by its scale (1 FMUL, shared by the rows) and the
    accumulators are reduced once, after the K loop: one more op per weight, no
    per-group cross-thread reduction. Rows are unrolled by hand: a [ROWS, BLOCK_K,
    BLOCK_N / 8] 3-D tile compiled to ~90 shared-memory layout conversions per group."""
    BP: tl.constexpr = BLOCK_N // 8
    SUB: tl.constexpr = GROUP // BLOCK_K
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    NP = N // 8
    NP64 = NP.to(tl.int64)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BLOCK_K)
    mask_p = offs_p < NP
    row0 = pid_m * ROWS
    o00 = tl.zeros((BP,), tl.float32)
    o01 = tl.zeros((BP,), tl.float32)
    o02 = tl.zeros((BP,), tl.float32)
    o03 = tl.zeros((BP,), tl.float32)
    o04 = tl.zeros((BP,), tl.float32)
    o05 = tl.zeros((BP,), tl.float32)
    o06 = tl.zeros((BP,), tl.float32)
    o07 = tl.zeros((BP,), tl.float32)
    if ROWS >= 2:
        o10 = tl.zeros((BP,), tl.float32)
        o11 = tl.zeros((BP,), tl.float32)
        o12 = tl.zeros((BP,), tl.float32)
        o13 = tl.zeros((BP,), tl.float32)
        o14 = tl.zeros((BP,), tl.float32)
        o15 = tl.zeros((BP,), tl.float32)
        o16 = tl.zeros((BP,), tl.float32)
        o17 = tl.zeros((BP,), tl.float32)
    if ROWS >= 4:
        o20 = tl.zeros((BP,), tl.float32)
        o21 = tl.zeros((BP,), tl.float32)
        o22 = tl.zeros((BP,), tl.float32)
        o23 = tl.zeros((BP,), tl.float32)
        o24 = tl.zeros((BP,), tl.float32)
        o25 = tl.zeros((BP,), tl.float32)
        o26 = tl.zeros((BP,), tl.float32)
        o27 = tl.zeros((BP,), tl.float32)
        o30 = tl.zeros((BP,), tl.float32)
        o31 = tl.zeros((BP,), tl.float32)
        o32 = tl.zeros((BP,), tl.float32)
        o33 = tl.zeros((BP,), tl.float32)
        o34 = tl.zeros((BP,), tl.float32)
        o35 = tl.zeros((BP,), tl.float32)
        o36 = tl.zeros((BP,), tl.float32)
        o37 = tl.zeros((BP,), tl.float32)
    if SCALE_EACH:
        a00 = tl.zeros((BLOCK_K, BP), tl.float32)
        a01 = tl.zeros((BLOCK_K, BP), tl.float32)
        a02 = tl.zeros((BLOCK_K, BP), tl.float32)
        a03 = tl.zeros((BLOCK_K, BP), tl.float32)
        a04 = tl.zeros((BLOCK_K, BP), tl.float32)
        a05 = tl.zeros((BLOCK_K, BP), tl.float32)
        a06 = tl.zeros((BLOCK_K, BP), tl.float32)
        a07 = tl.zeros((BLOCK_K, BP), tl.float32)
        if ROWS >= 2:
            a10 = tl.zeros((BLOCK_K, BP), tl.float32)
            a11 = tl.zeros((BLOCK_K, BP), tl.float32)
            a12 = tl.zeros((BLOCK_K, BP), tl.float32)
            a13 = tl.zeros((BLOCK_K, BP), tl.float32)
            a14 = tl.zeros((BLOCK_K, BP), tl.float32)
            a15 = tl.zeros((BLOCK_K, BP), tl.float32)
            a16 = tl.zeros((BLOCK_K, BP), tl.float32)
            a17 = tl.zeros((BLOCK_K, BP), tl.float32)
        if ROWS >= 4:
            a20 = tl.zeros((BLOCK_K, BP), tl.float32)
            a21 = tl.zeros((BLOCK_K, BP), tl.float32)
            a22 = tl.zeros((BLOCK_K, BP), tl.float32)
            a23 = tl.zeros((BLOCK_K, BP), tl.float32)
            a24 = tl.zeros((BLOCK_K, BP), tl.float32)
            a25 = tl.zeros((BLOCK_K, BP), tl.float32)
            a26 = tl.zeros((BLOCK_K, BP), tl.float32)
            a27 = tl.zeros((BLOCK_K, BP), tl.float32)
            a30 = tl.zeros((BLOCK_K, BP), tl.float32)
            a31 = tl.zeros((BLOCK_K, BP), tl.float32)
            a32 = tl.zeros((BLOCK_K, BP), tl.float32)
            a33 = tl.zeros((BLOCK_K, BP), tl.float32)
            a34 = tl.zeros((BLOCK_K, BP), tl.float32)
            a35 = tl.zeros((BLOCK_K, BP), tl.float32)
            a36 = tl.zeros((BLOCK_K, BP), tl.float32)
            a37 = tl.zeros((BLOCK_K, BP), tl.float32)
    g0 = pid_k * g_iters
    g1 = tl.minimum(g0 + g_iters, K // GROUP)
    wptr = qw_ptr + offs_k[:, None] * NP + offs_p[None, :]
    xptr = x_ptr + row0 * stride_xm + offs_k
    for g in range(g0, g1):
        qz = tl.load(qz_ptr + g * NP + offs_p, mask=mask_p, other=0)
        srow = sc_ptr + g * N + offs_p * 8
        s0 = _nib_scale(srow, mask_p, 0)
        s1 = _nib_scale(srow, mask_p, 1)
        s2 = _nib_scale(srow, mask_p, 2)
        s3 = _nib_scale(srow, mask_p, 3)
        s4 = _nib_scale(srow, mask_p, 4)
        s5 = _nib_scale(srow, mask_p, 5)
        s6 = _nib_scale(srow, mask_p, 6)
        s7 = _nib_scale(srow, mask_p, 7)
        if not SCALE_EACH:
            a00 = tl.zeros((BLOCK_K, BP), tl.float32)
            a01 = tl.zeros((BLOCK_K, BP), tl.float32)
            a02 = tl.zeros((BLOCK_K, BP), tl.float32)
            a03 = tl.zeros((BLOCK_K, BP), tl.float32)
            a04 = tl.zeros((BLOCK_K, BP), tl.float32)
            a05 = tl.zeros((BLOCK_K, BP), tl.float32)
            a06 = tl.zeros((BLOCK_K, BP), tl.float32)
            a07 = tl.zeros((BLOCK_K, BP), tl.float32)
            if ROWS >= 2:
                a10 = tl.zeros((BLOCK_K, BP), tl.float32)
                a11 = tl.zeros((BLOCK_K, BP), tl.float32)
                a12 = tl.zeros((BLOCK_K, BP), tl.float32)
                a13 = tl.zeros((BLOCK_K, BP), tl.float32)
                a14 = tl.zeros((BLOCK_K, BP), tl.float32)
                a15 = tl.zeros((BLOCK_K, BP), tl.float32)
                a16 = tl.zeros((BLOCK_K, BP), tl.float32)
                a17 = tl.zeros((BLOCK_K, BP), tl.float32)
            if ROWS >= 4:
                a20 = tl.zeros((BLOCK_K, BP), tl.float32)
                a21 = tl.zeros((BLOCK_K, BP), tl.float32)
                a22 = tl.zeros((BLOCK_K, BP), tl.float32)
                a23 = tl.zeros((BLOCK_K, BP), tl.float32)
                a24 = tl.zeros((BLOCK_K, BP), tl.float32)
                a25 = tl.zeros((BLOCK_K, BP), tl.float32)
                a26 = tl.zeros((BLOCK_K, BP), tl.float32)
                a27 = tl.zeros((BLOCK_K, BP), tl.float32)
                a30 = tl.zeros((BLOCK_K, BP), tl.float32)
                a31 = tl.zeros((BLOCK_K, BP), tl.float32)
                a32 = tl.zeros((BLOCK_K, BP), tl.float32)
                a33 = tl.zeros((BLOCK_K, BP), tl.float32)
                a34 = tl.zeros((BLOCK_K, BP), tl.float32)
                a35 = tl.zeros((BLOCK_K, BP), tl.float32)
                a36 = tl.zeros((BLOCK_K, BP), tl.float32)
                a37 = tl.zeros((BLOCK_K, BP), tl.float32)
        for j in tl.static_range(SUB):
            k0 = g * GROUP + j * BLOCK_K
            qw = tl.load(wptr + k0 * NP64, mask=mask_p[None, :], other=0)
            q0 = _nib_q(qw, qz, 0, magic)
            q1 = _nib_q(qw, qz, 1, magic)
            q2 = _nib_q(qw, qz, 2, magic)
            q3 = _nib_q(qw, qz, 3, magic)
            q4 = _nib_q(qw, qz, 4, magic)
            q5 = _nib_q(qw, qz, 5, magic)
            q6 = _nib_q(qw, qz, 6, magic)
            q7 = _nib_q(qw, qz, 7, magic)
            if SCALE_EACH:
                q0 = q0 * s0[None, :]
                q1 = q1 * s1[None, :]
                q2 = q2 * s2[None, :]
                q3 = q3 * s3[None, :]
                q4 = q4 * s4[None, :]
                q5 = q5 * s5[None, :]
                q6 = q6 * s6[None, :]
                q7 = q7 * s7[None, :]
            x0 = tl.load(xptr + k0).to(tl.float32)[:, None]
            a00, a01, a02, a03, a04, a05, a06, a07 = _fma8(a00, a01, a02, a03, a04, a05, a06, a07, x0, q0, q1, q2, q3, q4, q5, q6, q7)
            if ROWS >= 2:
                x1 = tl.load(xptr + 1 * stride_xm + k0, mask=(offs_k * 0 + row0 + 1) < M, other=0.0).to(tl.float32)[:, None]
                a10, a11, a12, a13, a14, a15, a16, a17 = _fma8(a10, a11, a12, a13, a14, a15, a16, a17, x1, q0, q1, q2, q3, q4, q5, q6, q7)
            if ROWS >= 4:
                x2 = tl.load(xptr + 2 * stride_xm + k0, mask=(offs_k * 0 + row0 + 2) < M, other=0.0).to(tl.float32)[:, None]
                a20, a21, a22, a23, a24, a25, a26, a27 = _fma8(a20, a21, a22, a23, a24, a25, a26, a27, x2, q0, q1, q2, q3, q4, q5, q6, q7)
                x3 = tl.load(xptr + 3 * stride_xm + k0, mask=(offs_k * 0 + row0 + 3) < M, other=0.0).to(tl.float32)[:, None]
                a30, a31, a32, a33, a34, a35, a36, a37 = _fma8(a30, a31, a32, a33, a34, a35, a36, a37, x3, q0, q1, q2, q3, q4, q5, q6, q7)
        if not SCALE_EACH:
            o00, o01, o02, o03, o04, o05, o06, o07 = _end8(o00, o01, o02, o03, o04, o05, o06, o07, a00, a01, a02, a03, a04, a05, a06, a07, s0, s1, s2, s3, s4, s5, s6, s7)
            if ROWS >= 2:
                o10, o11, o12, o13, o14, o15, o16, o17 = _end8(o10, o11, o12, o13, o14, o15, o16, o17, a10, a11, a12, a13, a14, a15, a16, a17, s0, s1, s2, s3, s4, s5, s6, s7)
            if ROWS >= 4:
                o20, o21, o22, o23, o24, o25, o26, o27 = _end8(o20, o21, o22, o23, o24, o25, o26, o27, a20, a21, a22, a23, a24, a25, a26, a27, s0, s1, s2, s3, s4, s5, s6, s7)
                o30, o31, o32, o33, o34, o35, o36, o37 = _end8(o30, o31, o32, o33, o34, o35, o36, o37, a30, a31, a32, a33, a34, a35, a36, a37, s0, s1, s2, s3, s4, s5, s6, s7)
    if SCALE_EACH:
        o00, o01, o02, o03, o04, o05, o06, o07 = _end8(o00, o01, o02, o03, o04, o05, o06, o07, a00, a01, a02, a03, a04, a05, a06, a07, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
        if ROWS >= 2:
            o10, o11, o12, o13, o14, o15, o16, o17 = _end8(o10, o11, o12, o13, o14, o15, o16, o17, a10, a11, a12, a13, a14, a15, a16, a17, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
        if ROWS >= 4:
            o20, o21, o22, o23, o24, o25, o26, o27 = _end8(o20, o21, o22, o23, o24, o25, o26, o27, a20, a21, a22, a23, a24, a25, a26, a27, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
            o30, o31, o32, o33, o34, o35, o36, o37 = _end8(o30, o31, o32, o33, o34, o35, o36, o37, a30, a31, a32, a33, a34, a35, a36, a37, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
    out = out_ptr + pid_k * stride_os + row0 * stride_om + offs_p * 8
    _store8(out + 0 * stride_om, o00, o01, o02, o03, o04, o05, o06, o07, mask_p)
    if ROWS >= 2:
        _store8(out + 1 * stride_om, o10, o11, o12, o13, o14, o15, o16, o17, mask_p & ((offs_p * 0 + row0 + 1) < M))
    if ROWS >= 4:
        _store8(out + 2 * stride_om, o20, o21, o22, o23, o24, o25, o26, o27, mask_p & ((offs_p * 0 + row0 + 2) < M))
        _store8(out + 3 * stride_om, o30, o31, o32, o33, o34, o35, o36, o37, mask_p & ((offs_p * 0 + row0 + 3) < M))


@triton.jit
def _gemv_sub(a0, a1, a2, a3, a4, a5, a6, a7, t, qz, xptr, magic):
    x = tl.load(xptr).to(tl.float32)[:, None]
    return _fma8(a0, a1, a2, a3, a4, a5, a6, a7, x,
                 _nib_q(t, qz, 0, magic), _nib_q(t, qz, 1, magic), _nib_q(t, qz, 2, magic), _nib_q(t, qz, 3, magic),
                 _nib_q(t, qz, 4, magic), _nib_q(t, qz, 5, magic), _nib_q(t, qz, 6, magic), _nib_q(t, qz, 7, magic))


@triton.jit
def _gemv_pf_kernel(
    x_ptr, qw_ptr, qz_ptr, sc_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_os, g_iters, magic,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """_gemv_kernel for one row with a software prefetch: the next group's four
    [32, BLOCK_N / 8] weight tiles and its zero points are loaded at the top of the
    current group's loop body, so a whole group (128 rows x BLOCK_N / 2 bytes) is always in
    flight while the current one is unpacked (the plain kernel issues a group's loads only
    when the previous group's arithmetic is done)."""
    BP: tl.constexpr = BLOCK_N // 8
    BK: tl.constexpr = GROUP // 4
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    NP = N // 8
    NP64 = NP.to(tl.int64)
    offs_p = pid_n * BP + tl.arange(0, BP)
    offs_k = tl.arange(0, BK)
    mask_p = offs_p < NP
    o0 = tl.zeros((BP,), tl.float32)
    o1 = tl.zeros((BP,), tl.float32)
    o2 = tl.zeros((BP,), tl.float32)
    o3 = tl.zeros((BP,), tl.float32)
    o4 = tl.zeros((BP,), tl.float32)
    o5 = tl.zeros((BP,), tl.float32)
    o6 = tl.zeros((BP,), tl.float32)
    o7 = tl.zeros((BP,), tl.float32)
    g0 = pid_k * g_iters
    g1 = tl.minimum(g0 + g_iters, K // GROUP)
    wptr = qw_ptr + offs_k[:, None] * NP + offs_p[None, :]
    xptr = x_ptr + pid_m * stride_xm + offs_k
    k0 = g0 * GROUP
    t0 = tl.load(wptr + k0 * NP64, mask=mask_p[None, :], other=0)
    t1 = tl.load(wptr + (k0 + BK) * NP64, mask=mask_p[None, :], other=0)
    t2 = tl.load(wptr + (k0 + 2 * BK) * NP64, mask=mask_p[None, :], other=0)
    t3 = tl.load(wptr + (k0 + 3 * BK) * NP64, mask=mask_p[None, :], other=0)
    qz = tl.load(qz_ptr + g0 * NP + offs_p, mask=mask_p, other=0)
    for g in range(g0, g1):
        k0 = g * GROUP
        kn = k0 + GROUP
        more = (offs_p * 0 + g + 1) < g1
        pm = (mask_p & more)[None, :]
        n0 = tl.load(wptr + kn * NP64, mask=pm, other=0)
        n1 = tl.load(wptr + (kn + BK) * NP64, mask=pm, other=0)
        n2 = tl.load(wptr + (kn + 2 * BK) * NP64, mask=pm, other=0)
        n3 = tl.load(wptr + (kn + 3 * BK) * NP64, mask=pm, other=0)
        qzn = tl.load(qz_ptr + (g + 1) * NP + offs_p, mask=mask_p & more, other=0)
        a0 = tl.zeros((BK, BP), tl.float32)
        a1 = tl.zeros((BK, BP), tl.float32)
        a2 = tl.zeros((BK, BP), tl.float32)
        a3 = tl.zeros((BK, BP), tl.float32)
        a4 = tl.zeros((BK, BP), tl.float32)
        a5 = tl.zeros((BK, BP), tl.float32)
        a6 = tl.zeros((BK, BP), tl.float32)
        a7 = tl.zeros((BK, BP), tl.float32)
        a0, a1, a2, a3, a4, a5, a6, a7 = _gemv_sub(a0, a1, a2, a3, a4, a5, a6, a7, t0, qz, xptr + k0, magic)
        a0, a1, a2, a3, a4, a5, a6, a7 = _gemv_sub(a0, a1, a2, a3, a4, a5, a6, a7, t1, qz, xptr + k0 + BK, magic)
        a0, a1, a2, a3, a4, a5, a6, a7 = _gemv_sub(a0, a1, a2, a3, a4, a5, a6, a7, t2, qz, xptr + k0 + 2 * BK, magic)
        a0, a1, a2, a3, a4, a5, a6, a7 = _gemv_sub(a0, a1, a2, a3, a4, a5, a6, a7, t3, qz, xptr + k0 + 3 * BK, magic)
        srow = sc_ptr + g * N + offs_p * 8
        o0, o1, o2, o3, o4, o5, o6, o7 = _end8(
            o0, o1, o2, o3, o4, o5, o6, o7, a0, a1, a2, a3, a4, a5, a6, a7,
            _nib_scale(srow, mask_p, 0), _nib_scale(srow, mask_p, 1), _nib_scale(srow, mask_p, 2),
            _nib_scale(srow, mask_p, 3), _nib_scale(srow, mask_p, 4), _nib_scale(srow, mask_p, 5),
            _nib_scale(srow, mask_p, 6), _nib_scale(srow, mask_p, 7))
        t0 = n0
        t1 = n1
        t2 = n2
        t3 = n3
        qz = qzn
    out = out_ptr + pid_k * stride_os + pid_m * stride_om + offs_p * 8
    _store8(out, o0, o1, o2, o3, o4, o5, o6, o7, mask_p)


# ----------------------------------------------------------------------------- dequantise + cuBLAS (prefill)
@triton.jit
def _dequant_kernel(qw_ptr, qz_ptr, sc_ptr, w_ptr, N, K,
                    GROUP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr):
    """W [K, N] in w_ptr's dtype = (q - z) * s, one read of the packed tile, one write.
    Column c of an 8-block is nibble AWQ_REVERSE_ORDER[c] = (c % 2) * 4 + c // 2."""
    pid_p = tl.program_id(0)
    pid_k = tl.program_id(1)
    NP = N // 8
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.arange(0, 8)
    shifts = (c % 2) * 16 + (c // 2) * 4
    mask_p = offs_p < NP
    qw = tl.load(qw_ptr + offs_k[:, None].to(tl.int64) * NP + offs_p[None, :], mask=mask_p[None, :], other=0)
    g = (pid_k * BLOCK_K) // GROUP
    qz = tl.load(qz_ptr + g * NP + offs_p, mask=mask_p, other=0)
    col = offs_p[:, None] * 8 + c[None, :]
    s = tl.load(sc_ptr + g * N + col, mask=mask_p[:, None], other=0.0).to(tl.float32)
    z = ((qz[:, None] >> shifts[None, :]) & 0xF).to(tl.float32)
    q = ((qw[:, :, None] >> shifts[None, None, :]) & 0xF).to(tl.float32)
    w = (q - z[None, :, :]) * s[None, :, :]
    ptrs = w_ptr + offs_k[:, None, None].to(tl.int64) * N + col[None, :, :]
    tl.store(ptrs, w.to(w_ptr.dtype.element_ty), mask=mask_p[None, :, None])


def awq_dequantize_triton(qweight, qzeros, scales, dtype=torch.bfloat16, block_k=32, block_p=32,
                          num_warps=4, out=None):
    """[K, N] dtype = (q - z) * s, computed in fp32 and rounded once."""
    k, np_ = qweight.shape
    n = np_ * 8
    assert GROUP_SIZE % block_k == 0 and k % GROUP_SIZE == 0
    w = out if out is not None else torch.empty(k, n, dtype=dtype, device=qweight.device)
    grid = (triton.cdiv(np_, block_p), k // block_k)
    _dequant_kernel[grid](qweight, qzeros, scales, w, n, k, GROUP=GROUP_SIZE, BLOCK_K=block_k,
                          BLOCK_P=block_p, num_warps=num_warps)
    return w


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def _split(tiles: int, units: int, waves: int, num_sms: int) -> int:
    """K split so that tiles * split ~ waves * num_sms programs, at most one per K unit."""
    return max(1, min(units, triton.cdiv(waves * num_sms, tiles)))


def gemv_config(m: int, n: int, k: int, num_sms: int, block_n: int = 256, block_k: int = 16,
                num_warps: int = 4, waves: int = 4, rows: int | None = None, scale_each: bool = False,
                prefetch: bool = False) -> dict:
    """CUDA-core GEMV: K split over scale groups until the programs holding one row block
    number ~waves x SMs."""
    rows = rows or (1 if m == 1 else 2 if m == 2 else 4)
    split = _split(triton.cdiv(n, block_n), k // GROUP_SIZE, waves, num_sms)
    if prefetch:
        return dict(PATH="gemv", ROWS=1, PREFETCH=True, BLOCK_N=block_n, BLOCK_K=GROUP_SIZE // 4,
                    SPLIT_K=split, num_warps=num_warps, num_stages=1)
    return dict(PATH="gemv", ROWS=rows, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split,
                SCALE_EACH=scale_each, num_warps=num_warps, num_stages=1)


def pick_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """Kernel path and block sizes by shape, from the H200 runs in bench/results/
    (2026-11-29_h200_v3_sweep.json, 2026-11-29_h200_v3_final.json).
    PATH: "gemv" (CUDA-core GEMV, no tensor cores), "mma" (tensor-core split-K tile
    kernel), "dequant" (dequantise to the activation dtype once, then cuBLAS).
    Crossovers on the four model shapes: the GEMV beats the tile kernel at M = 1 (43-75 vs
    65-107 us) and M = 2 (52-85 vs 66-109 us) and loses from M = 4 (4-row GEMV 83-134 vs
    67-111 us); the tile kernel beats dequantise + cuBLAS up to M = 32 (within 4% on two
    shapes) and loses from M = 64 on three of the four shapes (M = 256: 203-378 vs 527-774 us)."""
    if m == 1:
        # 3 CTAs of 167 registers fit an SM; ~6 x 132 programs, K split over scale groups
        return gemv_config(m, n, k, num_sms, block_n=256, block_k=16, num_warps=4, waves=6)
    if m == 2:
        return gemv_config(m, n, k, num_sms, rows=2, block_n=128, block_k=16, num_warps=4, waves=6,
                           scale_each=True)
    if m <= 32:
        return mma_config(m, n, k, num_sms)
    return dict(PATH="dequant", BLOCK_N=512, BLOCK_K=16, num_warps=4)


def mma_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """The tensor-core tile kernel's block sizes (the v2 default for every M)."""
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
    return dict(PATH="mma", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, num_warps=warps,
                num_stages=stages)


# OR-ing a nibble into the mantissa of 2^23 (0x4B000000) gives 2^23 + nibble exactly.
_MAGIC_F32 = 0x4B000000


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    config: dict | None = None,
) -> torch.Tensor:
    """x [..., K] fp16/bf16 -> [..., N] in x's dtype. `config` (default pick_config) selects
    the path with its "PATH" key; a config without one runs the tensor-core tile kernel."""
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
    path = cfg.pop("PATH", "mma")
    scales = scales.contiguous()
    if path == "dequant":
        w = awq_dequantize_triton(qweight, qzeros, scales, dtype=x.dtype, block_k=cfg["BLOCK_K"],
                                  block_p=cfg["BLOCK_N"] // 8, num_warps=cfg["num_warps"])
        torch.matmul(x2, w, out=out)
        return out.view(*lead, n)
    if path == "gemv":
        assert GROUP_SIZE % cfg["BLOCK_K"] == 0
        groups = k // GROUP_SIZE
        g_iters = triton.cdiv(groups, cfg.pop("SPLIT_K"))
        split = triton.cdiv(groups, g_iters)  # no empty splits
        dst = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
        rows = cfg.pop("ROWS", 1 if m == 1 else 2 if m == 2 else 4)
        grid = (triton.cdiv(m, rows), triton.cdiv(n, cfg["BLOCK_N"]), split)
        if cfg.pop("PREFETCH", False):
            scale_each, block_k = cfg.pop("SCALE_EACH", False), cfg.pop("BLOCK_K")
            assert rows == 1 and not scale_each and block_k == GROUP_SIZE // 4
            _gemv_pf_kernel[grid](x2, qweight, qzeros, scales, dst, m, n, k, x2.stride(0), n, m * n, g_iters,
                                  _MAGIC_F32, GROUP=GROUP_SIZE, **cfg)
        else:
            _gemv_kernel[grid](x2, qweight, qzeros, scales, dst, m, n, k, x2.stride(0), n, m * n, g_iters,
                               _MAGIC_F32, GROUP=GROUP_SIZE, ROWS=rows, **cfg)
    else:
        assert path == "mma", path
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
            scales,
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
