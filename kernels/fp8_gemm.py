"""FP8 block-scaled GEMM for DeepSeek-V3/R1 FP8 checkpoints: C = (A * sa) @ (B * sb)^T.

Layout (the checkpoints' and vLLM's block-FP8 linear layers'):
- ``a``  float8_e4m3fn [M, K]: activations quantised per token and group of 128 along K;
- ``a_scale`` fp32 [M, K / 128] (any strides: vLLM may hand a column-major one);
- ``b``  float8_e4m3fn [N, K] (dense) or [E, N, K] (grouped): weights, row-major [out, in];
- ``b_scale`` fp32 [ceil(N / 128), K / 128] (or [E, ...]): one scale per 128 x 128 block
  (the checkpoints' ``weight_scale_inv``);
- K a multiple of 128; M and N any.
C[m, n] = sum_kb a_scale[m, kb] * b_scale[n // 128, kb] * sum_{k in kb} a[m, k] b[n, k].

Each 128-wide K block is one fp8 tensor-core dot into a fresh fp32 tile, which is then
scaled and added to the fp32 accumulator (a "promotion" every 128 products, as the
format's scales require anyway, which also bounds the error of the tensor cores'
reduced-precision fp8 accumulation).

Grouped variant (MoE, contiguous layout, as DeepGEMM's ``m_grouped`` GEMM): the rows of
all experts are concatenated in ``a``; ``m_indices`` int32 [M] names each row's expert,
-1 for padding rows. Every expert's segment must start at a multiple of
``GROUPED_M_ALIGN`` rows (pad with -1 rows), so that each BLOCK_M tile belongs to one
expert; tiles whose first row is -1 are skipped and their output rows left unwritten.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import fp8_gemm_sm90 as _sm90
from kernels.w4a16_gemm import _splitk_reduce_kernel

BLOCK = 128  # the format's scale block along K (and N for the weights)
GROUPED_M_ALIGN = 128


@triton.jit
def _fp8_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    as_ptr,
    bs_ptr,
    mi_ptr,
    M,
    N,
    K,
    stride_am,
    stride_be,
    stride_bn,
    stride_cs,
    stride_cm,
    stride_asm,
    stride_ask,
    stride_bse,
    stride_bsn,
    stride_bsk,
    k_iters,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    GROUPED: tl.constexpr,
    PROMOTE: tl.constexpr = True,
):
    BLOCK_K: tl.constexpr = 128
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row tiles walk the N tiles together, so a weight tile is
    # reused from L2 by the programs that run side by side
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    gm = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % gm
    pid_n = (pid % per_group) // gm

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N

    if GROUPED:
        expert = tl.load(mi_ptr + pid_m * BLOCK_M)
        if expert < 0:
            return
        b_ptr += expert.to(tl.int64) * stride_be
        bs_ptr += expert.to(tl.int64) * stride_bse

    kb0 = pid_k * k_iters
    kb1 = tl.minimum(kb0 + k_iters, K // BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + (kb0 * BLOCK_K + offs_k)[None, :]
    b_ptrs = b_ptr + offs_n[None, :].to(tl.int64) * stride_bn + (kb0 * BLOCK_K + offs_k)[:, None]
    as_ptrs = as_ptr + offs_m * stride_asm + kb0 * stride_ask
    if BLOCK_N <= BLOCK_K:
        # the tile lies in one weight scale block: one scalar per K block, so the
        # promotion is one FFMA per accumulator element
        bs_ptrs = bs_ptr + ((pid_n * BLOCK_N) // BLOCK_K) * stride_bsn + kb0 * stride_bsk
    else:
        bs_ptrs = bs_ptr + (offs_n // BLOCK_K) * stride_bsn + kb0 * stride_bsk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(kb0, kb1):
        a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        if not PROMOTE:
            # diagnostic only (wrong numerics): one fp8 accumulation over all of K, no
            # scales, no per-block promotion; isolates the promotion's cost in the benchmark
            acc = tl.dot(a, b, acc)
        elif BLOCK_N <= BLOCK_K:
            sa = tl.load(as_ptrs, mask=mask_m, other=0.0)
            acc += tl.dot(a, b) * (sa * tl.load(bs_ptrs))[:, None]
        else:
            sa = tl.load(as_ptrs, mask=mask_m, other=0.0)
            sb = tl.load(bs_ptrs, mask=mask_n, other=0.0)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        as_ptrs += stride_ask
        bs_ptrs += stride_bsk

    c_ptrs = c_ptr + pid_k * stride_cs + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def pick_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """Block sizes by shape, from the two H200 races (kernels/bench/results/
    2026-11-30_h200_race1.json: six V3 shapes x M = 64..4096, six candidates each;
    race2: these defaults against race1's).
    M >= 256: 128 x 128 tiles over 8 warps (192 registers, one CTA per SM), GROUP_M 8;
    128 x 64 tiles over 4 warps (two CTAs per SM, so one CTA's promotion FFMAs can overlap
    the other's MMAs) for narrow N (2112: 5-36% faster at M = 1024 and 4096), K = 512
    (5%) and K <= 2048 up to M = 2048 (5-8%). They lost 12-20% on K >= 7168 with N >= 4096
    and 16% on the grouped K = 2048 shapes (M = 32768), which keep 128 x 128.
    M < 256: 64-row tiles over 4 warps; K split over programs (fp32 partials reduced by a
    second kernel, at least 4 K blocks each) when the tiles fill under half the SMs and
    K >= 4096. Races 1-2 (eager timings, which moved 2x between races at these sizes) kept
    the split to K >= 16384; the CUDA-graph races 6/6b measured it at K = 7168 too: M = 64 /
    128 on 2112 x 7168 14.0 / 17.9 us split against 33.6 / 33.9 unsplit (2026-12-01_h200_
    race6b_fp8_sm90_persistent.json, "race1_bm64_split")."""
    if m >= 256:
        if n <= 2560 or k <= 512 or (k <= 2048 and m <= 2048):
            return dict(BLOCK_M=128, BLOCK_N=64, SPLIT_K=1, GROUP_M=8, num_warps=4, num_stages=4)
        return dict(BLOCK_M=128, BLOCK_N=128, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4)
    tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    split = 1
    if 2 * tiles < num_sms and k >= 4096:
        split = max(1, min(k // BLOCK // 4, triton.cdiv(num_sms, tiles)))
    return dict(BLOCK_M=64, BLOCK_N=128, SPLIT_K=split, GROUP_M=8, num_warps=4, num_stages=4)


def _check(a, a_scale, b, b_scale, grouped):
    assert a.dtype == torch.float8_e4m3fn and b.dtype == torch.float8_e4m3fn, "fp8 e4m3 operands"
    assert a.dim() == 2 and b.dim() == (3 if grouped else 2)
    m, k = a.shape
    n = b.shape[-2]
    assert b.shape[-1] == k, f"K mismatch: a {tuple(a.shape)} b {tuple(b.shape)}"
    assert k % BLOCK == 0, f"K={k} must be a multiple of {BLOCK}"
    assert a_scale.dtype == torch.float32 and a_scale.shape == (m, k // BLOCK), a_scale.shape
    want = (*b.shape[:-2], triton.cdiv(n, BLOCK), k // BLOCK)
    assert b_scale.dtype == torch.float32 and tuple(b_scale.shape) == want, (tuple(b_scale.shape), want)
    assert a.stride(1) == 1 and b.stride(-1) == 1, "K must be the contiguous axis"
    return m, n, k


def _launch(a, a_scale, b, b_scale, m_indices, out_dtype, config, grouped):
    m, n, k = _check(a, a_scale, b, b_scale, grouped)
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    cfg = dict(config or pick_config(m, n, k, _num_sms(a.device)))
    if grouped:
        assert GROUPED_M_ALIGN % cfg["BLOCK_M"] == 0
        assert m_indices is not None and m_indices.shape == (m,) and m_indices.dtype == torch.int32
    kb = k // BLOCK
    k_iters = triton.cdiv(kb, cfg.pop("SPLIT_K"))
    split = triton.cdiv(kb, k_iters)  # no empty splits
    dst = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=a.device)
    if grouped and split > 1:
        dst.zero_()  # skipped tiles leave their partial sums unwritten
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]), split)
    _fp8_gemm_kernel[grid](
        a,
        b,
        dst,
        a_scale,
        b_scale,
        m_indices if grouped else a_scale,
        m,
        n,
        k,
        a.stride(0),
        b.stride(0) if grouped else 0,
        b.stride(-2),
        m * n,
        n,
        a_scale.stride(0),
        a_scale.stride(1),
        b_scale.stride(0) if grouped else 0,
        b_scale.stride(-2),
        b_scale.stride(-1),
        k_iters,
        GROUPED=grouped,
        **cfg,
    )
    if split > 1:
        _splitk_reduce_kernel[(triton.cdiv(m * n, 1024),)](dst, out, m * n, SPLIT=split, BLOCK=1024)
    return out


def use_sm90(m: int, n: int, k: int, num_sms: int) -> bool:
    """Whether ``fp8_gemm`` takes the Gluon sm_90 kernel over this one on Hopper (H200 race 7e,
    kernels/bench/results/2026-12-02_h200_race7e_fp8_defaults_prefetch.json): everywhere but
    where this kernel splits K four or more ways (small M on few tiles with a long K): M 64 /
    128 on 2112 x 7168 0.63x / 0.74x cuBLASLt's time against the Gluon kernel's 0.74x / 0.76x,
    M 64 on 4096 x 7168 0.82x against 0.81x (a tie). A split of 2-3 ways loses to it (M 128 on
    4096 x 7168: 1.01x against 0.90x; M 64 on 7168 x 16384: 0.98x against 0.90x)."""
    return pick_config(m, n, k, num_sms)["SPLIT_K"] < 4


def fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """Dense block-scaled FP8 GEMM: [M, K] x [N, K]^T -> [M, N] in out_dtype (see module doc).

    With no ``config``, on a Hopper GPU the Gluon kernel (``kernels.fp8_gemm_sm90``) runs
    where its race says it is faster (``use_sm90``), this Triton kernel elsewhere; a
    ``config`` always means this kernel with those tiles."""
    if config is None and len(b.shape) == 2 and _sm90.supported(a, b, out_dtype):
        m, k = a.shape
        if use_sm90(m, b.shape[0], k, _num_sms(a.device)):
            _check(a, a_scale, b, b_scale, grouped=False)
            return _sm90.fp8_gemm_sm90(a, a_scale, b, b_scale, out_dtype)
    return _launch(a, a_scale, b, b_scale, None, out_dtype, config, grouped=False)


def fp8_grouped_gemm(a, a_scale, b, b_scale, m_indices, out_dtype=torch.bfloat16,
                     config: dict | None = None) -> torch.Tensor:
    """Grouped (MoE, contiguous layout) block-scaled FP8 GEMM: row m of ``a`` times expert
    ``m_indices[m]`` of ``b`` [E, N, K]; rows of -1 tiles are left unwritten."""
    return _launch(a, a_scale, b, b_scale, m_indices, out_dtype, config, grouped=True)
