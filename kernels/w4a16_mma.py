"""Tensor-core W4A16 tile kernels (AutoAWQ layout; see kernels/w4a16_gemm.py, the entry point).

Dequantisation works per nibble position: nibble i of each packed int32 across the tile is
a [BLOCK_K, BLOCK_N / 8] sub-tile of whole columns (column AWQ_ORDER[i] = (i % 4) * 2 + i // 4
of each 8-column block), so a kernel runs 8 dots per K step and never reshapes or
interleaves the unpacked tile. Each weight costs a shift and one logic op: the nibble is
OR-ed into the mantissa of 128.0 in the activation dtype (1024.0 for fp16), giving 128 + q
exactly, and the zero point, the offset and the group scale are applied to the
[BLOCK_M, BLOCK_N / 8] dot result (BLOCK_K divides the group size, so a K step sees one
scale/zero row). Compiled for sm_90 the unpack runs on the dot-operand registers (the
packed tile is staged through shared memory by the pipeliner and read back in the mma
operand layout), so no unpacked tile makes a shared-memory round trip.

- `_w4a16_kernel`: the v2/v3 tile kernel (`PATH="mma"`).
- `_mma4_kernel` (`PATH="mma4"`): the same arithmetic with the changes that bound the first
  one's memory parallelism: the packed row length N / 8 is an argument (the JIT knows it is
  a multiple of 16, so the packed tile moves as 16-byte `cp.async` instead of 8-byte ones:
  as `N // 8` computed in the kernel only divisibility by 2 was known), no K masks (K is a
  multiple of the group and BLOCK_K divides it), no N masks when BLOCK_N divides N, the
  next K step's zero points and scales loaded one step ahead into registers (the pipeliner
  stages only the loads that feed a dot, so these were a full memory latency inside every
  step), and three split-K reductions: none (SPLIT_K 1), an fp32 workspace summed by a
  second kernel (REDUCE 1) or fp32 atomics into a zeroed workspace whose last program per
  tile writes the output and zeroes its part again (REDUCE 2, one kernel; `_atomic_tile`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


# Zeroed fp32 workspaces and tile counters of the atomic split-K reduction, per device and
# stream. The kernel that used a region leaves it zero, so the calls of one stream share it
# (two streams never do); it grows only outside CUDA-graph capture (a capture that needs
# more falls back to the two-kernel form).
_ATOMIC_WS: dict = {}


def _atomic_workspace(device, mn: int, tiles: int):
    key = (device, torch.cuda.current_stream(device).cuda_stream) if device.type == "cuda" else (device, 0)
    ws, cnt = _ATOMIC_WS.get(key, (None, None))
    if ws is None or ws.numel() < mn or cnt.numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        ws = torch.zeros(max(mn, 0 if ws is None else ws.numel()), dtype=torch.float32, device=device)
        cnt = torch.zeros(max(tiles, 0 if cnt is None else cnt.numel()), dtype=torch.int32, device=device)
        _ATOMIC_WS[key] = (ws, cnt)
    return ws, cnt


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
    x_ptr, qw_ptr, qz_ptr, sc_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_os, k_iters,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MAGIC: tl.constexpr, BASE: tl.constexpr, UPCAST_DOT: tl.constexpr,
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
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        xsum = tl.sum(x.to(tl.float32), axis=1)
        qw = tl.load(qw_ptr + k[:, None].to(tl.int64) * NP + offs_p[None, :], mask=mask_k[:, None] & mask_p[None, :],
                     other=0)
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


# ----------------------------------------------------------------------------- v4 tile kernel
@triton.jit
def _ld_masked(ptrs, mask, EVEN: tl.constexpr, other):
    if EVEN:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=other)


@triton.jit
def _scales8(srow, mask_p, EVEN_N: tl.constexpr):
    # the scales of nibble I's columns (column (I % 4) * 2 + I // 4 of each 8-block)
    return (_ld_masked(srow + 0, mask_p, EVEN_N, 0.0).to(tl.float32), _ld_masked(srow + 2, mask_p, EVEN_N, 0.0).to(tl.float32),
            _ld_masked(srow + 4, mask_p, EVEN_N, 0.0).to(tl.float32), _ld_masked(srow + 6, mask_p, EVEN_N, 0.0).to(tl.float32),
            _ld_masked(srow + 1, mask_p, EVEN_N, 0.0).to(tl.float32), _ld_masked(srow + 3, mask_p, EVEN_N, 0.0).to(tl.float32),
            _ld_masked(srow + 5, mask_p, EVEN_N, 0.0).to(tl.float32), _ld_masked(srow + 7, mask_p, EVEN_N, 0.0).to(tl.float32))


def _asm_text(i: int, magic: int) -> str:
    j = i // 2
    sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)
    shift = "shr.u32 t, t, 4; " if i % 2 else ""
    return (f"{{ .reg .b32 t; prmt.b32 t, $1, $2, {sel:#x}; {shift}"
            f"lop3.b32 $0, t, 0x000F000F, {magic | magic << 16:#x}, 0xEA; }}")  # (t & mask) | magic


_ASM_BF16_0 = tl.constexpr(_asm_text(0, 0x4300))
_ASM_F16_0 = tl.constexpr(_asm_text(0, 0x6400))
_ASM_BF16_1 = tl.constexpr(_asm_text(1, 0x4300))
_ASM_F16_1 = tl.constexpr(_asm_text(1, 0x6400))
_ASM_BF16_2 = tl.constexpr(_asm_text(2, 0x4300))
_ASM_F16_2 = tl.constexpr(_asm_text(2, 0x6400))
_ASM_BF16_3 = tl.constexpr(_asm_text(3, 0x4300))
_ASM_F16_3 = tl.constexpr(_asm_text(3, 0x6400))
_ASM_BF16_4 = tl.constexpr(_asm_text(4, 0x4300))
_ASM_F16_4 = tl.constexpr(_asm_text(4, 0x6400))
_ASM_BF16_5 = tl.constexpr(_asm_text(5, 0x4300))
_ASM_F16_5 = tl.constexpr(_asm_text(5, 0x6400))
_ASM_BF16_6 = tl.constexpr(_asm_text(6, 0x4300))
_ASM_F16_6 = tl.constexpr(_asm_text(6, 0x6400))
_ASM_BF16_7 = tl.constexpr(_asm_text(7, 0x4300))
_ASM_F16_7 = tl.constexpr(_asm_text(7, 0x6400))


@triton.jit
def _asm_pair(qw, ASM: tl.constexpr, BF16: tl.constexpr):
    if BF16:
        return tl.inline_asm_elementwise(ASM, "=r,r,r", [qw], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return tl.inline_asm_elementwise(ASM, "=r,r,r", [qw], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _nib_pair_asm(qw, I: tl.constexpr, MAGIC: tl.constexpr):
    """BASE + nibble I of each word, two words per instance (pack=2): one PRMT gathers byte
    I // 2 of both words into the low bytes of the two halves, one LOP3 masks the nibble
    and ORs in BASE's bits (odd I: one shift before). Each output depends on its own word
    only, so the result is elementwise whatever words are paired; in the mma operand layout
    a thread's consecutive words are the k, k + 1 pair that shares a register, and the pair
    costs 2-3 instructions instead of 4-5 (shift, LOP3 per word, PRMT to pack)."""
    if MAGIC == 0x4300:
        if I == 0:
            return _asm_pair(qw, _ASM_BF16_0, True)
        elif I == 1:
            return _asm_pair(qw, _ASM_BF16_1, True)
        elif I == 2:
            return _asm_pair(qw, _ASM_BF16_2, True)
        elif I == 3:
            return _asm_pair(qw, _ASM_BF16_3, True)
        elif I == 4:
            return _asm_pair(qw, _ASM_BF16_4, True)
        elif I == 5:
            return _asm_pair(qw, _ASM_BF16_5, True)
        elif I == 6:
            return _asm_pair(qw, _ASM_BF16_6, True)
        elif I == 7:
            return _asm_pair(qw, _ASM_BF16_7, True)
    else:
        if I == 0:
            return _asm_pair(qw, _ASM_F16_0, False)
        elif I == 1:
            return _asm_pair(qw, _ASM_F16_1, False)
        elif I == 2:
            return _asm_pair(qw, _ASM_F16_2, False)
        elif I == 3:
            return _asm_pair(qw, _ASM_F16_3, False)
        elif I == 4:
            return _asm_pair(qw, _ASM_F16_4, False)
        elif I == 5:
            return _asm_pair(qw, _ASM_F16_5, False)
        elif I == 6:
            return _asm_pair(qw, _ASM_F16_6, False)
        elif I == 7:
            return _asm_pair(qw, _ASM_F16_7, False)


@triton.jit
def _ndot(acc, x, xsum, qw, qz, s, I: tl.constexpr, MAGIC: tl.constexpr, BASE: tl.constexpr, UPCAST_DOT: tl.constexpr,
          DEQ_ASM: tl.constexpr = False):
    if DEQ_ASM:
        w = _nib_pair_asm(qw, I, MAGIC)
    else:
        w = (((qw >> (4 * I)) & 0xF) | MAGIC).to(tl.int16).to(x.dtype, bitcast=True)
    if UPCAST_DOT:
        part = tl.dot(x.to(tl.float32), w.to(tl.float32))
    else:
        part = tl.dot(x, w)
    z = ((qz >> (4 * I)) & 0xF).to(tl.float32) + BASE
    return acc + (part - xsum[:, None] * z[None, :]) * s[None, :]


@triton.jit
def _atomic_tile(ws_ptr, cnt_ptr, out_ptr, tile, nsplit, offs_m, offs_p, mask, N, stride_om,
                 a0, a1, a2, a3, a4, a5, a6, a7):
    """Split-K in one kernel: add the partial [BLOCK_M, BLOCK_P] sums of the 8 nibbles into the
    fp32 workspace [M, N] (zero on entry), count the tile's arrivals, and let the last
    program read the sums back, write them in the output dtype, zero its part of the
    workspace for the next call and reset the counter. The barrier orders every thread's
    adds before the counter's release (acquired by the last program); its reads bypass L1
    (.cg: served by L2, where the atomics were performed), so no stale line is read."""
    base = ws_ptr + offs_m[:, None] * N + offs_p[None, :] * 8
    tl.atomic_add(base + 0, a0, mask=mask, sem="relaxed")
    tl.atomic_add(base + 2, a1, mask=mask, sem="relaxed")
    tl.atomic_add(base + 4, a2, mask=mask, sem="relaxed")
    tl.atomic_add(base + 6, a3, mask=mask, sem="relaxed")
    tl.atomic_add(base + 1, a4, mask=mask, sem="relaxed")
    tl.atomic_add(base + 3, a5, mask=mask, sem="relaxed")
    tl.atomic_add(base + 5, a6, mask=mask, sem="relaxed")
    tl.atomic_add(base + 7, a7, mask=mask, sem="relaxed")
    tl.debug_barrier()
    old = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
    if old == nsplit - 1:
        zero = tl.zeros_like(a0)
        obase = out_ptr + offs_m[:, None] * stride_om + offs_p[None, :] * 8
        ty = out_ptr.dtype.element_ty
        for c in tl.static_range(8):
            v = tl.load(base + c, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(base + c, zero, mask=mask)
            tl.store(obase + c, v.to(ty), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed")


# M and the split bounds vary per call: one build for all of them
@triton.jit(do_not_specialize=["M", "k_iters", "n_kb", "nsplit"])
def _mma4_kernel(
    x_ptr, qw_ptr, qz_ptr, sc_ptr, out_ptr, ws_ptr, cnt_ptr,
    M, N, NP, stride_xm, stride_om, k_iters, n_kb, nsplit,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    MAGIC: tl.constexpr, BASE: tl.constexpr, UPCAST_DOT: tl.constexpr, EVEN_N: tl.constexpr,
    REDUCE: tl.constexpr, DEQ_ASM: tl.constexpr = False,
):
    """REDUCE 0: one split, the output dtype stored directly; 1: fp32 partials to
    ws_ptr[pid_k] (summed by `_splitk_reduce_kernel`); 2: `_atomic_tile`."""
    BLOCK_P: tl.constexpr = BLOCK_N // 8
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_n * BLOCK_P + tl.arange(0, BLOCK_P)
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
    kb_end = tl.minimum(kb0 + k_iters, n_kb)
    xptr = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    wptr = qw_ptr + offs_k[:, None] * NP + offs_p[None, :]
    # zero points and scales of the first K step; each step loads the next step's
    g = (kb0 * BLOCK_K) // GROUP
    qz = _ld_masked(qz_ptr + g * NP + offs_p, mask_p, EVEN_N, 0)
    s0, s1, s2, s3, s4, s5, s6, s7 = _scales8(sc_ptr + g * N + offs_p * 8, mask_p, EVEN_N)
    for kb in range(kb0, kb_end):
        k0 = kb * BLOCK_K
        x = tl.load(xptr + k0, mask=mask_m[:, None], other=0.0)
        xsum = tl.sum(x.to(tl.float32), axis=1)
        qw = _ld_masked(wptr + k0.to(tl.int64) * NP, mask_p[None, :], EVEN_N, 0)
        # the next step's group (the last step re-reads its own: always in bounds)
        gn = (tl.minimum(kb + 1, kb_end - 1) * BLOCK_K) // GROUP
        qzn = _ld_masked(qz_ptr + gn * NP + offs_p, mask_p, EVEN_N, 0)
        n0, n1, n2, n3, n4, n5, n6, n7 = _scales8(sc_ptr + gn * N + offs_p * 8, mask_p, EVEN_N)
        a0 = _ndot(a0, x, xsum, qw, qz, s0, 0, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a1 = _ndot(a1, x, xsum, qw, qz, s1, 1, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a2 = _ndot(a2, x, xsum, qw, qz, s2, 2, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a3 = _ndot(a3, x, xsum, qw, qz, s3, 3, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a4 = _ndot(a4, x, xsum, qw, qz, s4, 4, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a5 = _ndot(a5, x, xsum, qw, qz, s5, 5, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a6 = _ndot(a6, x, xsum, qw, qz, s6, 6, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        a7 = _ndot(a7, x, xsum, qw, qz, s7, 7, MAGIC, BASE, UPCAST_DOT, DEQ_ASM)
        qz = qzn
        s0, s1, s2, s3, s4, s5, s6, s7 = n0, n1, n2, n3, n4, n5, n6, n7
    omask = mask_m[:, None] & mask_p[None, :]
    if REDUCE == 2:
        tile = pid_m * tl.num_programs(0) + pid_n
        _atomic_tile(ws_ptr, cnt_ptr, out_ptr, tile, nsplit, offs_m, offs_p, omask, N, stride_om,
                     a0, a1, a2, a3, a4, a5, a6, a7)
    else:
        if REDUCE == 1:
            out = ws_ptr + pid_k * M * N + offs_m[:, None] * N
        else:
            out = out_ptr + offs_m[:, None] * stride_om
        _store_nibble(out, a0, offs_p, omask, 0)
        _store_nibble(out, a1, offs_p, omask, 1)
        _store_nibble(out, a2, offs_p, omask, 2)
        _store_nibble(out, a3, offs_p, omask, 3)
        _store_nibble(out, a4, offs_p, omask, 4)
        _store_nibble(out, a5, offs_p, omask, 5)
        _store_nibble(out, a6, offs_p, omask, 6)
        _store_nibble(out, a7, offs_p, omask, 7)
