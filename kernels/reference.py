"""Plain PyTorch references (fp32) for the kernels, written from the published semantics.

They are deliberately simple and slow; tests and benchmarks compare against them.
"""

from __future__ import annotations

import torch

# AutoAWQ packs 8 nibbles per int32 in this column order (awq/utils/packing_utils.py,
# AWQ_ORDER); unpacking uses the inverse permutation [0, 4, 1, 5, 2, 6, 3, 7].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def grouped_topk_reference(
    logits: torch.Tensor,
    topk: int,
    n_group: int,
    topk_group: int,
    scoring: str = "sigmoid",
    bias: torch.Tensor | None = None,
    renormalize: bool = False,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek group-limited routing. Returns (ids int32 [T, k], weights fp32 [T, k]).

    V3/R1 (noaux_tc): sigmoid scores, biased scores select, group score = sum of the
    top-2 biased scores, weights are the unbiased scores.
    V2: softmax scores, group score = max of the group, weights are the scores.
    """
    x = logits.float()
    t, e = x.shape
    if scoring == "sigmoid":
        s = torch.sigmoid(x)
    elif scoring == "softmax":
        s = torch.softmax(x, dim=-1)
    else:
        raise ValueError(scoring)
    b = s + bias.float()[None, :] if bias is not None else s
    per = e // n_group
    grouped = b.view(t, n_group, per)
    if bias is not None:
        gscore = grouped.topk(min(2, per), dim=-1).values.sum(-1)
    else:
        gscore = grouped.max(dim=-1).values
    keep = gscore.topk(topk_group, dim=-1).indices
    gmask = torch.zeros(t, n_group, dtype=torch.bool, device=x.device)
    gmask.scatter_(1, keep, True)
    emask = gmask[:, :, None].expand(t, n_group, per).reshape(t, e)
    masked = b.masked_fill(~emask, float("-inf"))
    ids = masked.topk(topk, dim=-1).indices
    w = s.gather(1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return ids.to(torch.int32), (w * scale).float()


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """Pack int values in [0, 15] of shape [R, N] into int32 [R, N // 8], AWQ order."""
    r, n = q.shape
    q = q.to(torch.int64).view(r, n // 8, 8)
    packed = torch.zeros(r, n // 8, dtype=torch.int64, device=q.device)
    for i, col in enumerate(AWQ_ORDER):
        packed |= q[:, :, col] << (4 * i)
    # int32 storage: values >= 2**31 wrap to negative, as in AutoAWQ's checkpoints.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of awq_pack: int32 [R, N // 8] -> int32 [R, N] in [0, 15]."""
    r, c = packed.shape
    p = packed.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(r, c, 8, dtype=torch.int64, device=packed.device)
    for col in range(8):
        out[:, :, col] = (p >> (4 * AWQ_REVERSE_ORDER[col])) & 0xF
    return out.view(r, c * 8).to(torch.int32)


def awq_quantize(w: torch.Tensor, group_size: int = 128):
    """Asymmetric 4-bit quantisation of w [K, N] (AutoAWQ's layout: in_features first).

    Returns (qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales fp16 [K/G, N]).
    """
    k, n = w.shape
    wg = w.float().view(k // group_size, group_size, n)
    wmax = wg.amax(dim=1)
    wmin = wg.amin(dim=1)
    scales = ((wmax - wmin).clamp(min=1e-5) / 15).to(torch.float16)
    s = scales.float()
    zeros = (-torch.round(wmin / s)).clamp(0, 15)
    q = (torch.round(wg / s[:, None, :]) + zeros[:, None, :]).clamp(0, 15)
    q = q.view(k, n).to(torch.int32)
    return awq_pack(q), awq_pack(zeros.to(torch.int32)), scales


def awq_dequantize(qweight, qzeros, scales, group_size: int = 128) -> torch.Tensor:
    """fp32 [K, N] = (q - z) * s."""
    q = awq_unpack(qweight).float()
    z = awq_unpack(qzeros).float()
    k = q.shape[0]
    zz = z.repeat_interleave(group_size, dim=0)[:k]
    ss = scales.float().repeat_interleave(group_size, dim=0)[:k]
    return (q - zz) * ss


def w4a16_reference(x, qweight, qzeros, scales, group_size: int = 128) -> torch.Tensor:
    """fp32 x @ dequant(W)."""
    return x.float() @ awq_dequantize(qweight, qzeros, scales, group_size)


def varlen_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention, one sequence at a time, in ``compute_dtype``.

    q [Tq, Hq, Dqk], k [Tk, Hkv, Dqk], v [Tk, Hkv, Dv]; GQA by repeating kv heads; the
    causal mask is aligned bottom-right (query i sees keys j <= i + Lk - Lq). Returns
    (out [Tq, Hq, Dv], lse [Hq, Tq]) in ``compute_dtype``; rows that see no key get
    out = 0 and lse = -inf.
    """
    cu_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k
    tq, hq, dqk = q.shape
    hkv, dv = k.shape[1], v.shape[2]
    scale = dqk**-0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(tq, hq, dv, dtype=compute_dtype, device=q.device)
    lse = torch.full((hq, tq), float("-inf"), dtype=compute_dtype, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0 or lk == 0:
            continue
        qb = q[q0:q1].to(compute_dtype).transpose(0, 1)  # [Hq, Lq, D]
        kb = k[k0:k1].to(compute_dtype).transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        vb = v[k0:k1].to(compute_dtype).transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
        s = qb @ kb.transpose(1, 2) * scale
        if causal:
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            s = s.masked_fill(j > i + (lk - lq), float("-inf"))
        m = s.amax(-1, keepdim=True)
        seen = torch.isfinite(m)
        m = torch.where(seen, m, torch.zeros_like(m))
        e = torch.exp(s - m)
        den = e.sum(-1, keepdim=True)
        ob = (e @ vb) / torch.where(seen, den, torch.ones_like(den))
        out[q0:q1] = ob.transpose(0, 1)
        lse[:, q0:q1] = torch.where(seen, m + torch.log(den), torch.full_like(m, float("-inf")))[..., 0]
    return out, lse


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    softmax_scale: float,
    kv_scale: float = 1.0,
    kv_lora_rank: int = 512,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode in the absorbed form, one sequence at a time.

    q [B, H, kv_lora_rank + rope]; kv_cache [num_blocks, page, kv_lora_rank + rope]
    (fp8 caches are dequantised as value * kv_scale); sequence b's token t lives in
    page block_table[b, t // page], row t % page. Returns (out [B, H, kv_lora_rank],
    lse [B, H]) in ``compute_dtype``: out = softmax(scale * q . row) @ row[:kv_lora_rank].
    """
    bsz, nh, _ = q.shape
    page = kv_cache.shape[1]
    out = torch.zeros(bsz, nh, kv_lora_rank, dtype=compute_dtype, device=q.device)
    lse = torch.full((bsz, nh), float("-inf"), dtype=compute_dtype, device=q.device)
    for b in range(bsz):
        n = int(seq_lens[b])
        if n == 0:
            continue
        t = torch.arange(n, device=q.device)
        rows = kv_cache[block_table[b, t // page].long(), t % page].to(compute_dtype) * kv_scale  # [n, 576]
        s = q[b].to(compute_dtype) @ rows.T * softmax_scale  # [H, n]
        lse[b] = torch.logsumexp(s, -1)
        out[b] = torch.softmax(s, -1) @ rows[:, :kv_lora_rank]
    return out, lse


# ----------------------------------------------------------------------------- FP8 block scaling
# DeepSeek-V3's FP8 format (the checkpoints' config: "quant_method": "fp8",
# "weight_block_size": [128, 128], "activation_scheme": "dynamic"): e4m3 weights with one
# fp32 scale per 128 x 128 block ("weight_scale_inv", the factor that dequantises), and
# activations quantised on the fly per token and per group of 128 along K.
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def per_token_group_quant_fp8(x: torch.Tensor, group: int = 128):
    """x [M, K] -> (q e4m3 [M, K], scale fp32 [M, K / group]); x ~= q * scale per group."""
    m, k = x.shape
    xg = x.float().view(m, k // group, group)
    scale = (xg.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-10)
    q = (xg / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, k), scale


def quantize_q_rows(q: torch.Tensor) -> torch.Tensor:
    """Q [..., D] as ``kernels.mla_sm90_qfp8`` quantises it, in the same fp32 operations, returned
    dequantised: per row the largest |q| (at least 1e-30), the values times 448 / it rounded to
    e4m3 (clamped to +-448), times it / 448 back. ``per_token_group_quant_fp8`` with a group of D,
    except that it divides each value by the scale where this multiplies by the reciprocal (the
    kernel divides once a row): the two disagree on a few values that sit on an e4m3 midpoint.
    Both divisions are tensor by tensor, IEEE-rounded like the kernel's ``div_rn``: torch computes
    ``448 / tensor`` as ``reciprocal() * 448`` (``Tensor.__rdiv__`` in ``torch/_tensor.py``; two
    roundings), a last bit off on about a fifth of the rows, which turns every midpoint of such a
    row the other way (race 24: a one-token LSE 0.076 off)."""
    x = q.float()
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
    top = torch.full_like(amax, FP8_MAX)
    q8 = (x * (top / amax)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q8.float() * (amax / top)


def per_block_quant_fp8(w: torch.Tensor, block: int = 128):
    """w [N, K] (or [E, N, K]) -> (q e4m3, scale fp32 [ceil(N / block), K / block]); N may
    end in a partial block (e.g. DeepSeek-V3's fused q_a/kv_a projection, N = 2112)."""
    *outer, n, k = w.shape
    nb = -(-n // block)
    wp = torch.zeros(*outer, nb * block, k, dtype=torch.float32, device=w.device)
    wp[..., :n, :] = w.float()
    wb = wp.view(*outer, nb, block, k // block, block)
    scale = (wb.abs().amax(dim=(-3, -1)) / FP8_MAX).clamp(min=1e-10)
    q = (wb / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(*outer, nb * block, k)[..., :n, :].contiguous(), scale


def fp8_block_dequant(q: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """fp32 q * scale, the scale broadcast over blocks of rows x cols (the last two axes)."""
    s = scale.repeat_interleave(rows, dim=-2)[..., : q.shape[-2], :]
    s = s.repeat_interleave(cols, dim=-1)[..., : q.shape[-1]]
    return q.float() * s


def fp8_gemm_reference(a, a_scale, b, b_scale, block: int = 128) -> torch.Tensor:
    """fp64 (A * sa) @ (B * sb)^T for the dense layout; returned as fp32."""
    da = fp8_block_dequant(a, a_scale, 1, block).double()
    db = fp8_block_dequant(b, b_scale, block, block).double()
    return (da @ db.T).float()


def fp8_grouped_gemm_reference(a, a_scale, b, b_scale, m_indices, block: int = 128) -> torch.Tensor:
    """Row m times expert m_indices[m]; rows with index -1 are NaN (no defined output)."""
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), dtype=torch.float32, device=a.device)
    for e in range(b.shape[0]):
        rows = (m_indices == e).nonzero()[:, 0]
        if len(rows):
            out[rows] = fp8_gemm_reference(a[rows], a_scale[rows], b[e], b_scale[e], block)
    return out
