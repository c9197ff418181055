"""DeepSeek-V2/V3 MLA decode over a paged latent cache, split-KV, in Triton.

In the weight-absorbed form every query head attends over the same per-token latent
vector: the cache row of a token is [c_kv (kv_lora_rank = 512) | k_pe (rope = 64)]
(576 values), and for query row b, head h

    s_j   = scale * (q[b, h, :512] . c_kv_j + q[b, h, 512:] . k_pe_j)
    out   = softmax_j(s) @ c_kv                           -> [B, H, 512]

Cache: kv_cache [num_blocks, page_size, 576] (vLLM's MLA layout, bf16/fp16, or fp8
e4m3 with one per-tensor scale), block_table [B, max_pages] int32 (page ids),
seq_lens [B]. Query row b sees its first seq_lens[b] tokens.

Split-KV: the grid is (B, head blocks, splits); program (b, hb, s) reads tokens
[s * chunk, (s + 1) * chunk) of sequence b once for BLOCK_H heads (the cache row is
shared by all heads, so a head block reads it once), keeps a running max / sum /
accumulator, and writes its partial output and log-sum-exp. A second kernel merges the
splits. With one split the first kernel writes the final output directly.
fp8 rows are converted to the query dtype in registers (exact: e4m3 fits in bf16);
the per-tensor scale multiplies the scores and the output, not every element.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernels.prefill_attention import LOG2E, _mma, interpreting

KV_LORA = 512
ROPE = 64


@triton.jit
def _mla_split_kernel(
    Q, KV, BT, SEQ, O, LSE, OP, LP,
    stride_qb, stride_qh, stride_kvb, stride_kvt, stride_bt,
    stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh,
    chunk, H, score_scale, out_scale,
    DL: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    SINGLE: tl.constexpr, STORE_LSE: tl.constexpr, FP8: tl.constexpr, F32: tl.constexpr,
):
    # head blocks of one (sequence, split) are neighbours in launch order, so the rows
    # one of them reads from HBM the others find in L2
    hb = tl.program_id(0)
    b = tl.program_id(1)
    s = tl.program_id(2)
    L = tl.load(SEQ + b)
    start = s * chunk
    # the last split takes whatever is left, so a launch sized for a shorter max_seq_len
    # (a CUDA graph replayed with longer sequences) is still exact, only slower
    end = tl.where(s == tl.num_programs(2) - 1, L, tl.minimum(L, start + chunk))
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    if start >= end:
        if not SINGLE:  # an empty split: weight exp(-inf) = 0 in the merge
            tl.store(LP + b * stride_lb + heads * stride_lh + s, float("-inf"), mask=h_ok)
        else:
            if STORE_LSE:
                tl.store(LSE + b * stride_lsb + heads * stride_lsh, float("-inf"), mask=h_ok)
            offs = tl.arange(0, DL)
            tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs[None, :],
                     tl.zeros([BLOCK_H, DL], dtype=O.dtype.element_ty), mask=h_ok[:, None])
        return

    offs_dl = tl.arange(0, DL)
    offs_dr = tl.arange(0, DR)
    offs_n = tl.arange(0, BLOCK_N)
    qp = Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(qp + offs_dl[None, :], mask=h_ok[:, None], other=0.0)
    q_pe = tl.load(qp + DL + offs_dr[None, :], mask=h_ok[:, None], other=0.0)
    bt = BT + b.to(tl.int64) * stride_bt

    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DL], dtype=tl.float32)
    for n in tl.range(start, end, BLOCK_N):
        toks = n + offs_n
        t_ok = toks < end
        page = tl.load(bt + toks // PAGE, mask=t_ok, other=0)
        row = KV + page.to(tl.int64) * stride_kvb + (toks % PAGE) * stride_kvt
        c = tl.load(row[:, None] + offs_dl[None, :], mask=t_ok[:, None], other=0.0)
        kpe = tl.load(row[:, None] + DL + offs_dr[None, :], mask=t_ok[:, None], other=0.0)
        if FP8:
            c = c.to(q_lat.dtype)
            kpe = kpe.to(q_lat.dtype)
        qk = _mma(q_lat, tl.trans(c), tl.zeros([BLOCK_H, BLOCK_N], dtype=tl.float32), F32)
        qk = _mma(q_pe, tl.trans(kpe), qk, F32)
        sc = tl.where(t_ok[None, :], qk * score_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        p = tl.math.exp2(sc - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _mma(p.to(c.dtype), c, acc * alpha[:, None], F32)
        m_i = m_new

    out = acc * (out_scale / l_i)[:, None]
    lse2 = m_i + tl.math.log2(l_i)  # log2 domain
    if SINGLE:
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_dl[None, :],
                 out.to(O.dtype.element_ty), mask=h_ok[:, None])
        if STORE_LSE:
            tl.store(LSE + b * stride_lsb + heads * stride_lsh, lse2 * 0.6931471805599453, mask=h_ok)
    else:
        tl.store(OP + b * stride_pb + heads[:, None] * stride_ph + s * stride_ps + offs_dl[None, :],
                 out, mask=h_ok[:, None])
        tl.store(LP + b * stride_lb + heads * stride_lh + s, lse2, mask=h_ok)


@triton.jit
def _mla_merge_kernel(
    OP, LP, O, LSE,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh, stride_lsb, stride_lsh,
    NSPLIT, DL: tl.constexpr, BLOCK_S: tl.constexpr, STORE_LSE: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # launched behind the split kernel (launch_pdl): placed early, reads its partials after this
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, DL)
    s_ok = offs_s < NSPLIT
    lse = tl.load(LP + b * stride_lb + h * stride_lh + offs_s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m_safe)
    den = tl.sum(w, 0)
    o = tl.load(OP + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                mask=s_ok[:, None] & (lse[:, None] > float("-inf")), other=0.0)
    den_safe = tl.where(den == 0.0, 1.0, den)
    out = tl.sum(o * w[:, None], 0) / den_safe
    tl.store(O + b * stride_ob + h * stride_oh + offs_d, out.to(O.dtype.element_ty))
    if STORE_LSE:
        res = tl.where(den == 0.0, float("-inf"), (m_safe + tl.math.log2(den_safe)) * 0.6931471805599453)
        tl.store(LSE + b * stride_lsb + h * stride_lsh, res)


def default_config(num_heads: int, device_type: str) -> dict:
    """Tile per head count, the fastest of the H200 sweeps
    (kernels/bench/results/2026-11-30_h200_attn_mla_run*, 2026-12-01_h200_race4b_mla_splits*:
    3 stages at 128 heads, +3-5% with bf16 caches); small tiles under the interpreter.
    ``resident``: programs of the tile that fit on one SM (Nsight Compute: 1 at 128 heads).
    Split rule: "tokens" when the caller passes the batch's total tokens (race 4b: +1-41%
    over "waves" on uniform and 128-head batches, -3% on the 16-head ragged one), else
    "waves" (2 programs per SM); "fill" is an option."""
    if device_type != "cuda":
        return dict(BLOCK_H=16, BLOCK_N=16, num_warps=4, num_stages=1)
    if num_heads <= 16:
        return dict(BLOCK_H=16, BLOCK_N=32, num_warps=4, num_stages=3, resident=2)
    return dict(BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=3, resident=1)


SPLIT_COST = 0.05  # relative cost of each extra split (partial outputs written and merged)
SPLIT_KEYS = ("rule", "waves", "min_chunk", "resident")  # pick_splits' policy, for either kernel


def _splits_from_tokens(batch, head_blocks, max_seq_len, sms, block_n, min_chunk, resident, total_tokens):
    """The split count with the least modelled time: programs run in rounds of
    ``resident * sms``; a round lasts one chunk; each split beyond the first costs
    SPLIT_COST. Programs with rows to read are exact for uniform batches (batch x splits)
    and estimated from the total for ragged ones (total / chunk + batch / 2)."""
    slots = max(1, resident * sms)
    most = max(1, -(-max_seq_len // min_chunk))
    best = None
    for s in range(1, min(most, 256) + 1):
        chunk = -(-(-(-max(1, max_seq_len) // s)) // block_n) * block_n
        if s > 1 and -(-max_seq_len // chunk) < s:
            continue  # rounding made a split empty: the same launch as a smaller s
        progs = head_blocks * min(batch * s, -(-max(1, total_tokens) // chunk) + batch // 2)
        t = -(-progs // slots) * chunk * (1 + SPLIT_COST * (s - 1))
        if best is None or t < best[0]:
            best = (t, s, chunk)
    return best[1], best[2]


def pick_splits(batch: int, head_blocks: int, max_seq_len: int, sms: int, block_n: int,
                waves: int = 2, min_chunk: int = 256, rule: str = "waves", resident: int = 2,
                total_tokens: int | None = None) -> tuple[int, int]:
    """(splits, tokens per split), chunks a multiple of ``block_n``, none shorter than
    ``min_chunk`` tokens.

    rule "waves": enough programs for ``waves`` per SM (batch * head_blocks * splits >=
    waves * sms). rule "fill": at most one wave of ``resident`` programs per SM
    (batch * head_blocks * splits <= resident * sms), so no SM runs a second, partial wave.
    rule "tokens": the chunk that makes the programs with rows to read (``total_tokens``, the
    host-side sum of the sequence lengths, split into chunks) one wave of ``resident`` per SM;
    short sequences' empty splits return at once, so ragged and uniform batches both fill.
    """
    progs = max(1, batch * head_blocks)
    if rule == "tokens":
        if total_tokens is None:
            raise ValueError("rule 'tokens' needs total_tokens (the sum of seq_lens)")
        return _splits_from_tokens(batch, head_blocks, max_seq_len, sms, block_n, min_chunk, resident, total_tokens)
    if rule == "fill":
        want = max(1, (resident * sms) // progs)
    elif rule == "waves":
        want = max(1, -(-waves * sms // progs))
    else:
        raise ValueError(f"rule must be 'waves', 'fill' or 'tokens', got {rule!r}")
    most = max(1, -(-max_seq_len // min_chunk))
    splits = min(want, most)
    chunk = -(-max(1, max_seq_len) // splits)
    chunk = -(-chunk // block_n) * block_n
    splits = max(1, -(-max(1, max_seq_len) // chunk))
    return splits, chunk


def sm90_default(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether ``mla_decode`` takes the Gluon Hopper kernel by default for these operands
    (``DSVOLC_MLA_KERNEL=triton`` keeps the Triton one)."""
    import os

    if os.environ.get("DSVOLC_MLA_KERNEL", "") == "triton" or not q.is_cuda:
        return False
    from kernels import mla_sm90

    if kv_cache.dtype == torch.float8_e4m3fn and not mla_sm90.FP8_DEFAULT:
        return False
    return mla_sm90.supported(q, kv_cache)


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    *,
    kv_scale: float | torch.Tensor | None = None,
    max_seq_len: int | None = None,
    total_tokens: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    config: dict | None = None,
):
    """MLA decode attention. q [B, H, 576] (latent 512 | rope 64), fp16/bf16;
    kv_cache [num_blocks, page_size, 576] in q's dtype or fp8 e4m3 (``torch.float8_e4m3fn``,
    or uint8 storage of it) with ``kv_scale`` (float, or a one-element tensor, read once
    on the host); block_table [B, >= ceil(max_len / page_size)] int32; seq_lens [B].

    Returns out [B, H, 512] in q's dtype (and lse fp32 [B, H], natural log, with
    ``return_lse``). ``max_seq_len`` (the longest seq_lens entry) sizes the split; pass
    it to avoid reading seq_lens back to the host, and pass ``num_splits`` too for a
    launch that never synchronises (CUDA graphs). ``total_tokens`` (the host-side sum of
    seq_lens) switches the split rule to "tokens" (see `pick_splits`).

    ``config={"KERNEL": "sm90", ...}`` runs the splits on the Gluon Hopper kernel
    (``kernels.mla_sm90``; its keys ``mla_sm90.CONFIG_KEYS``, and the split policy's
    ``SPLIT_KEYS``), ``"triton"`` on the Triton one; without KERNEL (and without Triton tile or
    split policy keys) the Gluon kernel runs wherever ``mla_sm90.supported`` (H200 races 9
    and 10b, kernels/bench/results/2026-12-03_h200_race9_mla* and _race10b_mla*: 2.0-2.3x the
    Triton kernel's speed at 128 heads on bf16 caches, 2.2-2.4x on fp8 ones), the Triton kernel
    elsewhere. With no config at all, a bf16/fp16 batch whose programs fit two waves of the SMs
    (batch x head blocks <= 2 x SMs) runs the Gluon kernel with ``mla_sm90.WAVE_DEFAULT`` (TILED
    and QREG 256: race 19, 1.02-1.05x the plain kernel at B 32-64 4k on the H100; race 22,
    1.05-1.06x at B 128 4k; ``default_for``).
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise ValueError(f"q must be [batch, heads, {KV_LORA + ROPE}], got {getattr(q, 'shape', type(q))}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"q dtype must be float16 or bfloat16, got {q.dtype}")
    bsz, nh, dq = q.shape
    if dq != KV_LORA + ROPE:
        raise ValueError(f"q head dim must be {KV_LORA} latent + {ROPE} rope = {KV_LORA + ROPE}, got {dq}")
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 3 or kv_cache.shape[2] != KV_LORA + ROPE:
        raise ValueError(
            f"kv_cache must be [num_blocks, page_size, {KV_LORA + ROPE}], got {tuple(getattr(kv_cache, 'shape', ()))}"
        )
    fp8 = kv_cache.dtype in (torch.float8_e4m3fn, torch.uint8)
    if kv_cache.dtype == torch.uint8:
        kv_cache = kv_cache.view(torch.float8_e4m3fn)
    if not fp8 and kv_cache.dtype != q.dtype:
        raise ValueError(f"kv_cache dtype must be q's ({q.dtype}) or float8_e4m3fn, got {kv_cache.dtype}")
    if fp8 and kv_scale is None:
        raise ValueError("kv_scale is required with an fp8 kv_cache (the per-tensor dequantisation scale)")
    page = kv_cache.shape[1]
    if page < 1 or page & (page - 1):
        raise ValueError(f"page_size (kv_cache.shape[1]) must be a power of two, got {page}")
    if kv_cache.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError("kv_cache and q must have a contiguous last dim")
    if block_table.dim() != 2 or block_table.shape[0] != bsz or block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_table must be int32/int64 [{bsz}, max_pages], got {block_table.dtype} {tuple(block_table.shape)}")
    if seq_lens.dim() != 1 or seq_lens.shape[0] != bsz:
        raise ValueError(f"seq_lens must be [{bsz}], got {tuple(seq_lens.shape)}")
    if out is None:
        out = torch.empty(bsz, nh, KV_LORA, dtype=q.dtype, device=q.device)
    elif out.shape != (bsz, nh, KV_LORA) or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be [{bsz}, {nh}, {KV_LORA}] {q.dtype} with a contiguous last dim")
    lse = torch.empty(bsz, nh, dtype=torch.float32, device=q.device) if return_lse else None
    if bsz == 0 or nh == 0:
        return (out, lse) if return_lse else out

    cfg = dict(default_config(nh, q.device.type))
    config = dict(config or {})
    kernel = config.pop("KERNEL", None)
    if kernel not in (None, "triton", "sm90"):
        raise ValueError(f"config KERNEL must be 'triton' or 'sm90', got {kernel!r}")
    chosen = kernel is None and not config  # the caller named nothing: the kernels' shape defaults apply
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    if kernel is None:  # the Gluon kernel where it runs (race 9: 2.0-2.3x the Triton kernel's speed)
        from kernels.mla_sm90 import CONFIG_KEYS as SM90_KEYS

        kernel = "sm90" if sm90_default(q, kv_cache) and not set(config) - set(SM90_KEYS) else "triton"
    if kernel == "sm90":
        from kernels import mla_sm90

        if not mla_sm90.supported(q, kv_cache):
            raise ValueError("config KERNEL 'sm90' needs a Hopper GPU, Gluon, a multiple of 64 heads, a cache in q's "
                             "dtype or fp8 e4m3 with pages of a multiple of 64 tokens stored one after another")
        split = {k: config.pop(k) for k in SPLIT_KEYS if k in config}  # the split policy applies to both kernels
        if chosen:  # races 19 and 22: TILED+QREG where the batch fits two waves (mla_sm90.WAVE_DEFAULT)
            config = mla_sm90.default_for(bsz, nh, sms, fp8)
        sm90_cfg = mla_sm90.launch_config(config, fp8)  # its keys; the split follows the Triton tile's rule
        config = split
    if config.get("SWAP"):
        raise ValueError("config SWAP: the transposed (swap-AB) kernel was removed after it lost the H200 "
                         "race it ran in (kernels/README.md, MLA decode); leave SWAP out")
    cfg.update(config)
    bh, bn = cfg["BLOCK_H"], cfg["BLOCK_N"]
    hblocks = triton.cdiv(nh, bh)
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max().item())
        rule = cfg.get("rule", "tokens" if total_tokens is not None else "waves")
        num_splits, chunk = pick_splits(bsz, hblocks, max_seq_len, sms, bn, cfg.get("waves", 2),
                                        cfg.get("min_chunk", 256), rule, cfg.get("resident", 2),
                                        total_tokens=total_tokens)
    else:
        if max_seq_len is None:
            raise ValueError("num_splits needs max_seq_len (the longest seq_lens entry)")
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        chunk = triton.cdiv(triton.cdiv(max(1, max_seq_len), num_splits), bn) * bn
    if isinstance(kv_scale, torch.Tensor):
        kv_scale = float(kv_scale.reshape(-1)[0].item())
    ks = float(kv_scale) if fp8 else 1.0
    single = num_splits == 1
    if single:
        op = lp = out  # unused
        sp = (0, 0, 0, 0, 0)
    else:
        op = torch.empty(bsz, nh, num_splits, KV_LORA, dtype=torch.float32, device=q.device)
        lp = torch.empty(bsz, nh, num_splits, dtype=torch.float32, device=q.device)
        sp = (op.stride(0), op.stride(1), op.stride(2), lp.stride(0), lp.stride(1))
    lse_t = lse if return_lse else out
    lse_st = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    f32 = interpreting() and (q.dtype == torch.bfloat16 or fp8)
    if kernel == "sm90":
        mla_sm90.mla_sm90_split(q, kv_cache, block_table, seq_lens, out, lse if single else None,
                                None if single else op, None if single else lp, chunk, num_splits,
                                softmax_scale * ks * LOG2E, ks, sm90_cfg)
    else:
        _mla_split_kernel[(hblocks, bsz, num_splits)](
            q, kv_cache, block_table, seq_lens, out, lse_t, op, lp,
            q.stride(0), q.stride(1), kv_cache.stride(0), kv_cache.stride(1), block_table.stride(0),
            out.stride(0), out.stride(1), *sp, *lse_st,
            chunk, nh, softmax_scale * ks * LOG2E, ks,
            DL=KV_LORA, DR=ROPE, PAGE=page, BLOCK_H=bh, BLOCK_N=bn,
            SINGLE=single, STORE_LSE=bool(return_lse) and single, FP8=fp8, F32=f32,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
    if not single:  # the sm90 kernel's PDL launches its merge the same way (its programs wait for the partials)
        pdl = dict(PDL=True, launch_pdl=True) if kernel == "sm90" and sm90_cfg.get("PDL") else {}
        _mla_merge_kernel[(bsz, nh)](
            op, lp, out, lse_t, *sp, out.stride(0), out.stride(1), *lse_st,
            num_splits, DL=KV_LORA, BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
            STORE_LSE=bool(return_lse), num_warps=4, **pdl,
        )
    return (out, lse) if return_lse else out


def mla_decode_bytes(seq_lens, num_heads: int, kv_elem_bytes: int, q_elem_bytes: int = 2) -> int:
    """Bytes the decode must move at least: every cached row of every sequence once
    (576 values), the queries (576) and the outputs (512) once."""
    rows = int(sum(int(x) for x in seq_lens))
    b = len(seq_lens)
    return rows * (KV_LORA + ROPE) * kv_elem_bytes + b * num_heads * (KV_LORA + ROPE + KV_LORA) * q_elem_bytes


def mla_decode_flops(seq_lens, num_heads: int) -> float:
    """2 * (576 + 512) FLOPs per (head, cached token)."""
    return 2.0 * (KV_LORA + ROPE + KV_LORA) * num_heads * float(sum(int(x) for x in seq_lens))
