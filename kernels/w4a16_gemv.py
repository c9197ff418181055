"""CUDA-core W4A16 GEMV kernels for decode rows (AutoAWQ layout; kernels/w4a16_gemm.py is the
entry point and says when they run).

No tensor cores and no shared-memory round trip: each program owns BLOCK_N columns
(BLOCK_N / 8 packed words per row, loaded as [BLOCK_K, BLOCK_N / 8] int32 tiles with the
words of a row contiguous) and a range of scale groups (split-K), unpacks nibbles in
registers and multiply-accumulates in fp32 on the CUDA cores. The packed row length is
computed here as N // 8, so the JIT knows it only as even and the tiles move as 8-byte
loads; passed as an argument (known as a multiple of 16: 16-byte loads) the same kernel ran
1.13-2.04x slower on the H200 at M <= 2 (race 5, kernels/bench/results/2026-12-01_h200_race5_w4a16*),
so it stays so.
"""

from __future__ import annotations

import triton
import triton.language as tl

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
