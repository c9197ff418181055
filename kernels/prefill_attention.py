"""Variable-length prefill attention (FlashAttention-2 style forward) in Triton.

    out = softmax(q k^T * scale + causal mask) v      per sequence, per head

Layout is the packed ("THD") one vLLM and flash-attn use: q [total_q, Hq, Dqk],
k [total_k, Hkv, Dqk], v [total_k, Hkv, Dv], sequence b owning rows
cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k/v.
Hq must be a multiple of Hkv (GQA: q head h reads kv head h // (Hq // Hkv)). With
different query and key lengths the causal mask is aligned bottom-right (query i of a
sequence sees keys j <= i + Lk - Lq), as in flash-attn 2.1+, so a chunk of new tokens
after a cached prefix works.

The q.k head dim is split into a power of two and an optional smaller power of two
(128 = 128 + 0, DeepSeek MLA's 192 = 128 nope + 64 rope): two tensor-core dots
accumulate one score tile, no padding. The value head dim (128 for MLA) is independent.

One program owns BLOCK_M query rows of one (sequence, head). Its key loop is split in
two: key blocks every row may see (no mask arithmetic) and the diagonal / ragged tail
(masked). Programs are launched heaviest-first (last query block of a sequence first)
so causal work is balanced. Optionally K and V come through Hopper's tensor memory
accelerator (host-built TMA descriptors over the [tokens, heads * dim] matrix).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4 (host-side TMA descriptors); absent on older Triton
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

from kernels.attention_dims import LOG2E, split_head_dim  # also imported from here by callers


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _mma(a, b, acc, F32: tl.constexpr):
    """acc + a @ b. F32 casts the operands to fp32 first: only for Triton's CPU
    interpreter, whose dot multiplies bf16 operands as their raw uint16 storage
    (Triton 3.9, runtime/interpreter.py create_dot); compiled kernels never set it."""
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _attn_inner(
    acc, l_i, m_i, q1, q2,
    k_base, v_base, stride_kt, stride_vt,
    desc_k1, desc_k2, desc_v, k_row0, col_k, col_v,
    lo, hi, offs_m, offs_n, offs_d1, offs_d2, offs_dv, Lk, diag, qk_scale,
    D1: tl.constexpr, D2: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, F32: tl.constexpr, WS: tl.constexpr,
):
    for n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        n = tl.multiple_of(n, BLOCK_N)
        rows = n + offs_n
        row_ok = rows < Lk
        # ---- scores [BLOCK_M, BLOCK_N] = q . k (split head dim) ----
        if USE_TMA:
            k1 = desc_k1.load([k_row0 + n, col_k])
        else:
            kp = k_base + rows.to(tl.int64)[:, None] * stride_kt
            if MASKED:
                k1 = tl.load(kp + offs_d1[None, :], mask=row_ok[:, None], other=0.0)
            else:
                k1 = tl.load(kp + offs_d1[None, :])
        qk = _mma(q1, tl.trans(k1), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), F32)
        if D2 > 0:
            if USE_TMA:
                k2 = desc_k2.load([k_row0 + n, col_k + D1])
            else:
                if MASKED:
                    k2 = tl.load(kp + D1 + offs_d2[None, :], mask=row_ok[:, None], other=0.0)
                else:
                    k2 = tl.load(kp + D1 + offs_d2[None, :])
            qk = _mma(q2, tl.trans(k2), qk, F32)
        # ---- online softmax in the log2 domain ----
        if MASKED:
            ok = row_ok[None, :]
            if CAUSAL:
                ok = ok & (rows[None, :] <= offs_m[:, None] + diag)
            s = tl.where(ok, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # ---- acc += p v ----
        if USE_TMA:
            v = desc_v.load([k_row0 + n, col_v])
        else:
            vp = v_base + rows.to(tl.int64)[:, None] * stride_vt + offs_dv[None, :]
            if MASKED:
                v = tl.load(vp, mask=row_ok[:, None], other=0.0)
            else:
                v = tl.load(vp)
        acc = _mma(p.to(v.dtype), v, acc, F32)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,
    desc_k1, desc_k2, desc_v,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_lse_h,
    qk_scale, GROUP,
    D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, USE_TMA: tl.constexpr, F32: tl.constexpr, WS: tl.constexpr,
):
    # heaviest query block first: with a causal mask the last block of a sequence
    # has the most keys
    m_blk = tl.num_programs(0) - 1 - tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(CU_Q + b)
    Lq = tl.load(CU_Q + b + 1) - q_start
    m0 = m_blk * BLOCK_M
    if m0 >= Lq:
        return
    k_start = tl.load(CU_K + b)
    Lk = tl.load(CU_K + b + 1) - k_start
    diag = Lk - Lq  # bottom-right causal alignment
    kvh = h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d1 = tl.arange(0, D1)
    offs_d2 = tl.arange(0, D2 if D2 > 0 else 16)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < Lq

    q_base = Q + q_start.to(tl.int64) * stride_qt + h * stride_qh
    qp = q_base + offs_m.to(tl.int64)[:, None] * stride_qt
    q1 = tl.load(qp + offs_d1[None, :], mask=m_ok[:, None], other=0.0)
    if D2 > 0:
        q2 = tl.load(qp + D1 + offs_d2[None, :], mask=m_ok[:, None], other=0.0)
    else:
        q2 = q1
    k_base = K + k_start.to(tl.int64) * stride_kt + kvh * stride_kh
    v_base = V + k_start.to(tl.int64) * stride_vt + kvh * stride_vh
    col_k = kvh * stride_kh
    col_v = kvh * stride_vh

    # m starts finite so fully masked rows give p = 0, alpha = 1 (no inf - inf)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)

    if CAUSAL:
        # every row of this block sees keys <= m0 + diag; the block's last row sees
        # keys < m0 + BLOCK_M + diag
        n_full = (tl.maximum(m0 + diag + 1, 0) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(Lk, m0 + BLOCK_M + diag)
    else:
        n_full = Lk
        hi = Lk
    n_full = tl.minimum(n_full, (Lk // BLOCK_N) * BLOCK_N)

    acc, l_i, m_i = _attn_inner(
        acc, l_i, m_i, q1, q2, k_base, v_base, stride_kt, stride_vt,
        desc_k1, desc_k2, desc_v, k_start, col_k, col_v,
        0, n_full, offs_m, offs_n, offs_d1, offs_d2, offs_dv, Lk, diag, qk_scale,
        D1, D2, BLOCK_M, BLOCK_N, False, CAUSAL, USE_TMA, F32, WS,
    )
    acc, l_i, m_i = _attn_inner(
        acc, l_i, m_i, q1, q2, k_base, v_base, stride_kt, stride_vt,
        desc_k1, desc_k2, desc_v, k_start, col_k, col_v,
        n_full, hi, offs_m, offs_n, offs_d1, offs_d2, offs_dv, Lk, diag, qk_scale,
        D1, D2, BLOCK_M, BLOCK_N, True, CAUSAL, USE_TMA, F32, False,
    )

    empty = l_i == 0.0  # a row that sees no key (Lk = 0, or Lk < Lq under the causal mask)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    op = O + q_start.to(tl.int64) * stride_ot + h * stride_oh + offs_m.to(tl.int64)[:, None] * stride_ot
    tl.store(op + offs_dv[None, :], out.to(O.dtype.element_ty), mask=m_ok[:, None])
    if STORE_LSE:
        lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
        tl.store(LSE + h * stride_lse_h + q_start + offs_m, lse, mask=m_ok)


def default_config(dqk: int, dv: int, device_type: str) -> dict:
    """Block shape per head dims: the fastest of the H200 sweep
    (kernels/bench/results/2026-11-30_h200_attn_mla_run1_sweep*); small tiles under the
    interpreter."""
    if device_type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, USE_TMA=False)
    if dqk + dv > 256:  # MLA prefill 192 / 128
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, USE_TMA=True)
    return dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, USE_TMA=True)


def _check(name, t, ndim, dtypes=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise ValueError(f"{name} dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    cu_seqlens_k: torch.Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    config: dict | None = None,
):
    """Varlen attention forward. Returns out [total_q, Hq, Dv] (q's dtype), and with
    ``return_lse`` also the natural-log softmax denominator lse fp32 [Hq, total_q]
    (flash-attn's layout, which vLLM merges partial results with).

    ``cu_seqlens_k`` defaults to ``cu_seqlens_q`` (self-attention over the new tokens).
    ``softmax_scale`` defaults to Dqk ** -0.5. ``max_seqlen_q`` bounds the launch grid;
    it must be >= the longest query sequence (it is not read back from the device).

    ``config``: ``{"KERNEL": "sm90", ...}`` runs the Gluon Hopper kernel with that launch config
    (``kernels.prefill_sm90.CONFIG_KEYS``), ``{"KERNEL": "triton", ...}`` or Triton block keys
    (``default_config``'s) the Triton kernel; without one, a Hopper GPU takes the Gluon kernel
    wherever it runs the operands, anything else the Triton kernel.
    """
    _check("q", q, 3, (torch.float16, torch.bfloat16))
    _check("k", k, 3, (q.dtype,))
    _check("v", v, 3, (q.dtype,))
    _check("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32, torch.int64))
    if cu_seqlens_k is None:
        cu_seqlens_k = cu_seqlens_q
    _check("cu_seqlens_k", cu_seqlens_k, 1, (torch.int32, torch.int64))
    if cu_seqlens_k.numel() != cu_seqlens_q.numel():
        raise ValueError(
            f"cu_seqlens_k has {cu_seqlens_k.numel()} entries, cu_seqlens_q {cu_seqlens_q.numel()}: one batch each"
        )
    total_q, hq, dqk = q.shape
    total_k, hkv, dk = k.shape
    if dk != dqk:
        raise ValueError(f"k head dim {dk} != q head dim {dqk}")
    if v.shape[0] != total_k or v.shape[1] != hkv:
        raise ValueError(f"v shape {tuple(v.shape)} must be [{total_k}, {hkv}, Dv] like k")
    dv = v.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    if dv < 16 or dv & (dv - 1):
        raise ValueError(f"v head dim {dv} must be a power of two >= 16")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(2) != 1:
            raise ValueError(f"{name}'s last dim must be contiguous (stride 1), got strides {t.stride()}")
    d1, d2 = split_head_dim(dqk)
    batch = cu_seqlens_q.numel() - 1
    if out is None:
        out = torch.empty(total_q, hq, dv, dtype=q.dtype, device=q.device)
    elif out.shape != (total_q, hq, dv) or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be [{total_q}, {hq}, {dv}] {q.dtype} with a contiguous last dim")
    lse = torch.empty(hq, total_q, dtype=torch.float32, device=q.device) if return_lse else out
    if batch <= 0 or total_q == 0 or max_seqlen_q <= 0:
        if return_lse:
            lse.fill_(float("-inf"))
            return out, lse
        return out
    scale = softmax_scale if softmax_scale is not None else dqk ** -0.5
    cfg = dict(config or {})
    kernel = cfg.pop("KERNEL", None)
    if kernel not in (None, "triton", "sm90"):
        raise ValueError(f"config KERNEL must be 'triton' or 'sm90', got {kernel!r}")
    if kernel is None and not cfg:
        kernel = "sm90" if _sm90_default(q, k, v, out) else "triton"
    if kernel == "sm90":
        from kernels import prefill_sm90

        if not prefill_sm90.supported(q, k, v, out):
            raise ValueError("config KERNEL 'sm90' needs a Hopper GPU, Gluon, Dqk 128 or 192, Dv 128 and "
                             "TMA-aligned q, k, v")
        prefill_sm90.prefill_sm90(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out,
                                  lse if return_lse else None, scale, causal, cfg)
        return (out, lse) if return_lse else out
    cfg = dict(default_config(dqk, dv, q.device.type), **cfg)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    use_tma = bool(cfg.get("USE_TMA")) and TensorDescriptor is not None
    if use_tma:
        use_tma = _tma_ok(k, v)
    if use_tma:
        k2 = k.as_strided((total_k, (hkv - 1) * k.stride(1) + dqk), (k.stride(0), 1))
        v2 = v.as_strided((total_k, (hkv - 1) * v.stride(1) + dv), (v.stride(0), 1))
        desc_k1 = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, d1])
        desc_k2 = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, d2]) if d2 else None
        desc_v = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [bn, dv])
    else:
        desc_k1 = desc_k2 = desc_v = None
    grid = (triton.cdiv(max_seqlen_q, bm), hq, batch)
    _prefill_fwd_kernel[grid](
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
        desc_k1, desc_k2, desc_v,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), lse.stride(0) if return_lse else 0,
        scale * LOG2E, hq // hkv,
        D1=d1, D2=d2, DV=dv, BLOCK_M=bm, BLOCK_N=bn,
        CAUSAL=bool(causal), STORE_LSE=bool(return_lse), USE_TMA=use_tma,
        F32=interpreting() and q.dtype == torch.bfloat16, WS=bool(cfg.get("WARP_SPECIALIZE", False)),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return (out, lse) if return_lse else out


def _sm90_default(q, k, v, out) -> bool:
    """Whether a call without a config runs the Gluon Hopper kernel (kernels/prefill_sm90.py):
    wherever it runs these operands (the H200 race in kernels/README.md, prefill)."""
    if q.device.type != "cuda":
        return False
    from kernels import prefill_sm90

    return prefill_sm90.supported(q, k, v, out)


def _tma_ok(k: torch.Tensor, v: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides (and a Hopper GPU)."""
    if k.device.type == "cuda" and torch.cuda.get_device_capability(k.device)[0] < 9:
        return False
    es = k.element_size()
    return all(
        t.data_ptr() % 16 == 0 and (t.stride(0) * es) % 16 == 0 and (t.stride(1) * es) % 16 == 0 for t in (k, v)
    )


def attention_flops(seqlens_q, seqlens_k, hq: int, dqk: int, dv: int, causal: bool) -> float:
    """FLOPs the attention must do: 2 * (Dqk + Dv) per visible (query, key) pair per head.

    Visible pairs per sequence: Lq * Lk without a mask; with the bottom-right causal
    mask, query i sees min(Lk, i + 1 + Lk - Lq) keys (Lq (Lq + 1) / 2 when Lq = Lk,
    the exact count, not N^2 / 2)."""
    total = 0
    for lq, lk in zip(seqlens_q, seqlens_k):
        if not causal:
            total += lq * lk
        elif lk >= lq:  # query i sees i + 1 + (lk - lq) keys
            total += lq * (lk - lq) + lq * (lq + 1) // 2
        else:  # the first lq - lk queries see nothing
            total += lk * (lk + 1) // 2
    return 2.0 * hq * (dqk + dv) * total


__all__ = ["prefill_attention", "attention_flops", "default_config", "split_head_dim"]
