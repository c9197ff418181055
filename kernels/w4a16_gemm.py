"""W4A16 GEMM on AutoAWQ checkpoints: y = x @ dequant(W).

Layout (AutoAWQ GEMM format, as read by vLLM's AWQ loader):
- ``qweight`` int32 [K, N/8]: 8 nibbles per int32 along N, nibble i holds column
  AWQ_ORDER[i] = (0, 2, 4, 6, 1, 3, 5, 7)[i] of its 8-column block;
- ``qzeros``  int32 [K/G, N/8], packed the same way;
- ``scales``  fp16  [K/G, N]; G = 128.
W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].

Paths, chosen by `pick_config` from M and K x N (H200 race 5,
kernels/bench/results/2026-12-01_h200_race5_w4a16_*; kernels/README.md has the tables):
- "gemv" (`w4a16_gemv.py`): CUDA-core split-K GEMV, no tensor cores and no shared-memory
  round trip; nibbles unpacked in registers with one LOP3 and one FADD per weight and
  multiply-accumulated in fp32. M <= 2 on shapes of at least 50M weights.
- "mma4" (`w4a16_mma.py` `_mma4_kernel`): the v4 tensor-core split-K tile kernel, per-nibble
  dots on the unpacked tile (no reshape), 16-byte packed-tile copies, scales one step ahead,
  the PRMT pair unpack, split-K through an fp32 workspace or fp32 atomics. M 3-16, and
  M <= 2 on the smaller shapes.
- "mma" (`_w4a16_kernel`): the v2 tile kernel, M 17-32 (2026-11-29 v3 runs).
- "dequant": `awq_dequantize_triton` writes W in the activation dtype once (one read of the
  packed weights, one write, ~3.3 TB/s), then cuBLAS multiplies; M > 32. W is rounded to
  the activation dtype once, as any dequantise-then-GEMM path does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.w4a16_gemv import _gemv_kernel, _gemv_pf_kernel
from kernels.w4a16_mma import _ATOMIC_WS, _atomic_workspace, _num_sms  # noqa: F401  (shared with w4a16_sm90)
from kernels.w4a16_mma import _mma4_kernel, _splitk_reduce_kernel, _w4a16_kernel

GROUP_SIZE = 128
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


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


# K x N below which M <= 2 runs the v4 tile kernel and M 3-8 splits K for 2 waves (race 5)
SMALL_KN = 50_000_000


def pick_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """Kernel path and block sizes by shape class, from the H200 race 5 (run 2:
    bench/results/2026-12-01_h200_race5_w4a16_run2.json, 20 candidates per point on the 13
    race shapes at M = 1, 2, 4, 8, 16; `python -m kernels.bench.w4a16_race5 --defaults`
    prints this rule's measured time per point beside the best candidate's and the peers').
    PATH: "gemv" (CUDA-core GEMV), "mma4" (v4 tensor-core tile kernel), "mma" (v2 tile
    kernel, M 17-32, from the 2026-11-29 v3 runs), "dequant" (dequantise once, then cuBLAS).
    - M <= 2: main's GEMV where K x N >= SMALL_KN (1.00-1.08x the best candidate's time at
      M = 1, 1.00-1.17x at M = 2); below, the v4 kernel, which is faster on the five smaller
      shapes (1.00-1.13x / 1.00-1.19x the best; 0.78-1.04x / 0.84-1.09x the GEMV's time).
    - M 3-16: the v4 kernel (256 x 64 tiles, 4 warps, 3 stages, the PRMT unpack), K split
      for 4 waves of programs at M 3-8 from SMALL_KN (atomic split-K to M = 4, the fp32
      workspace above), else for 2 with the workspace: 1.00-1.20x the best candidate's
      time, 0.38-1.03x main's tile kernel's.
    The per-class choice maximised the points that beat the best peer, then the geometric
    mean of the time over the best candidate's."""
    small = k * n < SMALL_KN
    if m == 1:
        if small:
            return mma4_config(m, n, k, num_sms, block_n=256, block_k=32, num_stages=4, waves=4, reduce="atomic",
                               deq="asm")
        # 3 CTAs of 167 registers fit an SM; ~6 x 132 programs, K split over scale groups
        return gemv_config(m, n, k, num_sms, block_n=256, block_k=16, num_warps=4, waves=6)
    if m == 2:
        if small:
            return mma4_config(m, n, k, num_sms, block_n=256, block_k=64, num_stages=3, waves=2, reduce="atomic",
                               deq="asm")
        return gemv_config(m, n, k, num_sms, rows=2, block_n=128, block_k=16, num_warps=4, waves=6,
                           scale_each=True)
    if m <= 16:
        if small or m > 8:
            return mma4_config(m, n, k, num_sms, waves=2, reduce="ws", deq="asm")
        return mma4_config(m, n, k, num_sms, waves=4, reduce="atomic" if m <= 4 else "ws", deq="asm")
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


def mma4_config(m: int, n: int, k: int, num_sms: int, block_n: int = 256, block_k: int = 64, num_warps: int = 4,
                num_stages: int = 3, waves: float = 4, reduce: str = "atomic", deq: str = "plain",
                maxnreg: int | None = None) -> dict:
    """The v4 tile kernel (`_mma4_kernel`): BLOCK_M 16 (M <= 16), K split until the
    programs number ~waves x SMs (at most one per K block). reduce: "atomic" (one kernel,
    fp32 atomics into a zeroed workspace) or "ws" (fp32 partials, a second kernel sums).
    deq: "plain" (shift, LOP3 and a PRMT pack per weight) or "asm" (one PRMT + LOP3 per
    pair of weights, `_nib_pair_asm`). maxnreg: a register cap (Triton option), or None."""
    assert reduce in ("atomic", "ws") and deq in ("plain", "asm")
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    tiles = triton.cdiv(n, block_n) * triton.cdiv(m, bm)
    split = max(1, min(k // block_k, triton.cdiv(int(waves * num_sms), tiles)))
    cfg = dict(PATH="mma4", BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split, REDUCE=reduce, DEQ=deq,
               num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        cfg["maxnreg"] = maxnreg
    return cfg


# OR-ing a nibble into the mantissa of 2^23 (0x4B000000) gives 2^23 + nibble exactly.
_MAGIC_F32 = 0x4B000000



def _dtype_consts(dtype) -> dict:
    return dict(
        # A base whose ulp is 1 (bf16: 128 = 0x4300, 7 mantissa bits; fp16: 1024 =
        # 0x6400, 10 bits): OR-ing a nibble q into its mantissa gives exactly base + q.
        MAGIC=0x4300 if dtype == torch.bfloat16 else 0x6400,
        BASE=128.0 if dtype == torch.bfloat16 else 1024.0,
        # Triton's CPU interpreter (3.9) multiplies bf16 dot operands as raw bits; an
        # fp32 dot of the same bf16 values is the same exact-product, fp32-sum math.
        UPCAST_DOT=_INTERPRET and dtype == torch.bfloat16,
    )


def _run_mma4(x2, qweight, qzeros, scales, out, cfg):
    m, k = x2.shape
    n = out.shape[1]
    bk, bn = cfg["BLOCK_K"], cfg["BLOCK_N"]
    assert GROUP_SIZE % bk == 0 and bn % 8 == 0
    n_kb = k // bk
    k_iters = triton.cdiv(n_kb, cfg.pop("SPLIT_K"))
    split = triton.cdiv(n_kb, k_iters)  # no empty splits
    grid = (triton.cdiv(n, bn), triton.cdiv(m, cfg["BLOCK_M"]), split)
    reduce = cfg.pop("REDUCE", "atomic")
    # the PRMT unpack is inline PTX, which the interpreter cannot run: there it is the plain one
    deq_asm = cfg.pop("DEQ", "plain") == "asm" and not _INTERPRET
    ws = cnt = out
    mode = 0
    if split > 1:
        got = _atomic_workspace(x2.device, m * n, grid[0] * grid[1]) if reduce == "atomic" else None
        if got is not None:
            ws, cnt = got
            mode = 2
        else:
            ws = torch.empty(split, m, n, dtype=torch.float32, device=x2.device)
            mode = 1
    _mma4_kernel[grid](x2, qweight, qzeros, scales, out, ws, cnt, m, n, n // 8, x2.stride(0), out.stride(0),
                       k_iters, n_kb, split, GROUP=GROUP_SIZE, EVEN_N=n % bn == 0, REDUCE=mode, DEQ_ASM=deq_asm,
                       **_dtype_consts(x2.dtype), **cfg)
    if mode == 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](ws, out, m * n, SPLIT=split, BLOCK=block)


def _gemm_packed(x: torch.Tensor, p, config: dict | None) -> torch.Tensor:
    """Weights repacked by ``w4a16_sm90.repack``: the Gluon kernel for M <= 64 on Hopper (race 9),
    else dequantise the packed words once and multiply with cuBLAS."""
    from kernels import w4a16_sm90

    if not isinstance(p, w4a16_sm90.PackedW4):
        raise TypeError(f"w4a16_gemm: qweight must be AutoAWQ's int32 tensor or a w4a16_sm90.PackedW4, got "
                        f"{type(p).__name__}")
    if x.shape[-1] != p.k:
        raise ValueError(f"w4a16_gemm: x has K = {x.shape[-1]}, the packed weights {p.k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, p.k)
    m = x2.shape[0]
    if m == 0:
        return torch.empty(*lead, p.n, dtype=x.dtype, device=x.device)
    if w4a16_sm90.supported(x2, p):  # Hopper, at most MAX_M rows
        return w4a16_sm90.w4a16_sm90(x, p, config)
    w = w4a16_sm90.dequant_packed(p, x.dtype)
    return torch.matmul(x2 if x2.stride(-1) == 1 else x2.contiguous(), w).view(*lead, p.n)


def w4a16_gemm(
    x: torch.Tensor,
    qweight,
    qzeros: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """x [..., K] fp16/bf16 -> [..., N] in x's dtype. `config` (default pick_config) selects
    the path with its "PATH" key; a config without one runs the tensor-core tile kernel.
    ``qweight`` may instead be a ``w4a16_sm90.PackedW4`` (AutoAWQ weights repacked once, as the
    vLLM plugin does on Hopper): then `config` is the Gluon kernel's (``w4a16_sm90.launch_config``)."""
    assert x.dtype in (torch.float16, torch.bfloat16)
    if not isinstance(qweight, torch.Tensor):
        return _gemm_packed(x, qweight, config)
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
    if path == "mma4":
        _run_mma4(x2, qweight, qzeros, scales, out, cfg)
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
        _w4a16_kernel[grid](x2, qweight, qzeros, scales, dst, m, n, k, x2.stride(0), n, m * n, k_iters,
                            GROUP=GROUP_SIZE, **_dtype_consts(x.dtype), **cfg)
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](dst, out, m * n, SPLIT=split, BLOCK=block)
    return out.view(*lead, n)
