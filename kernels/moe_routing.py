"""DeepSeek grouped top-k MoE router in one Triton launch.

Logits [T, E] -> expert ids int32 [T, k] and weights fp32 [T, k], for
- V3/R1 ``noaux_tc``: sigmoid scores, ``e_score_correction_bias`` for selection,
  group score = sum of the top-2 biased scores, weights from the unbiased scores;
- V2 group-limited greedy: softmax, group score = max of the group (V2-Lite: one group).

Default kernel (``method="two_pass"``, `_grouped_topk_kernel`), one token per single-warp
program: pass 1 loads the E logits as a [G_PAD, EPG_PAD] tile (group, expert-in-group;
groups whose size is not a power of two, V2's 20, reduce along one padded axis), scores
them and ranks the groups; pass 2 reloads only the TOPK_GROUP kept groups (L1 hits) and
runs the k selection rounds over them. A round is two 32-bit warp-wide reductions (max
of the order-preserving int32 image of the biased score, then the smallest expert id
holding it; ties go to the lower id) plus a third that reads the winner's unbiased score.
H200, V3 layout, CUDA graphs: 2.2 us at 1 token, 8.9 us at 8192, 28.7 us at 32768
(kernels/bench/results/2026-11-30_h200_race3*).

``method="full"`` is the previous kernel (`_grouped_topk_full_kernel`): k rounds of one
int64 (score, slot) max over all E slots; kept for the race's before/after column.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sortable(x):
    # fp32 -> int32 whose signed order equals the float order (-inf lowest).
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _grouped_topk_full_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    T,
    stride_t,
    scale,
    N_GROUP: tl.constexpr,
    EPG: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOPK: tl.constexpr,
    G_PAD: tl.constexpr,
    EPG_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORM: tl.constexpr,
):
    NSLOT: tl.constexpr = G_PAD * EPG_PAD
    pid = tl.program_id(0)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    g = tl.arange(0, G_PAD)
    j = tl.arange(0, EPG_PAD)
    t3 = t[:, None, None]
    g3 = g[None, :, None]
    j3 = j[None, None, :]
    e3 = g3 * EPG + j3  # expert id of each slot
    valid_e = (g3 < N_GROUP) & (j3 < EPG)
    tok = t3 < T
    x = tl.load(logits_ptr + t3.to(tl.int64) * stride_t + e3, mask=tok & valid_e, other=0.0)
    x = tl.where(valid_e, x.to(tl.float32), float("-inf"))

    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))  # padded slots: exp(+inf) -> s = 0
        row_max = tl.zeros([BLOCK_T], dtype=tl.float32)
        row_den = tl.full([BLOCK_T], 1.0, dtype=tl.float32)
    else:
        row_max = tl.max(tl.max(x, axis=2), axis=1)
        p = tl.exp(x - row_max[:, None, None])
        row_den = tl.sum(tl.sum(p, axis=2), axis=1)
        s = p / row_den[:, None, None]

    if HAS_BIAS:
        bias = tl.load(bias_ptr + e3, mask=valid_e, other=0.0).to(tl.float32)
        b = s + bias
    else:
        b = s
    b = tl.where(valid_e, b, float("-inf"))

    if N_GROUP > 1:
        m1 = tl.max(b, axis=2)  # [BT, G]
        if HAS_BIAS:
            # sum of the two largest; an exact tie for first counts twice.
            is1 = b == m1[:, :, None]
            n1 = tl.sum(is1.to(tl.int32), axis=2)
            m2 = tl.max(tl.where(is1, float("-inf"), b), axis=2)
            gs = m1 + tl.where(n1 > 1, m1, m2)
        else:
            gs = m1
        gs = tl.where(g[None, :] < N_GROUP, gs, float("-inf"))
        # rank of each group among the groups of its token; lower index wins ties.
        ga = gs[:, :, None]
        gb = gs[:, None, :]
        beats = (gb > ga) | ((gb == ga) & (g[None, None, :] < g[None, :, None]))
        rank = tl.sum(beats.to(tl.int32), axis=2)
        keep = (rank < TOPK_GROUP) & (g[None, :] < N_GROUP)
        b = tl.where(keep[:, :, None], b, float("-inf"))

    slot = g3 * EPG_PAD + j3
    key = (_sortable(b).to(tl.int64) << 32) | (NSLOT - 1 - slot).to(tl.int64)
    key = tl.reshape(key, (BLOCK_T, NSLOT))

    kcol = tl.arange(0, K_PAD)[None, :]
    out_ids = tl.zeros([BLOCK_T, K_PAD], dtype=tl.int32)
    out_w = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    tmask = t < T
    for k in tl.static_range(TOPK):
        top = tl.max(key, axis=1)
        key = tl.where(key == top[:, None], -9223372036854775807 - 1, key)
        sl = (NSLOT - 1) - (top & 0xFFFFFFFF).to(tl.int32)
        eid = (sl // EPG_PAD) * EPG + sl % EPG_PAD
        # weight = unbiased score, recomputed from the logit (a cached 2-byte gather)
        # rather than a second reduction per round.
        xl = tl.load(logits_ptr + t.to(tl.int64) * stride_t + eid, mask=tmask, other=0.0)
        xl = xl.to(tl.float32)
        if SIGMOID:
            w = 1.0 / (1.0 + tl.exp(-xl))
        else:
            w = tl.exp(xl - row_max) / row_den
        out_ids = tl.where(kcol == k, eid[:, None], out_ids)
        out_w = tl.where(kcol == k, w[:, None], out_w)

    if RENORM:
        out_w = out_w / tl.sum(out_w, axis=1)[:, None]
    out_w = out_w * scale
    omask = tmask[:, None] & (kcol < TOPK)
    offs = t[:, None].to(tl.int64) * TOPK + kcol
    tl.store(ids_ptr + offs, out_ids, mask=omask)
    tl.store(weights_ptr + offs, out_w, mask=omask)


@triton.jit
def _top2_combine(a1, a2, b1, b2):
    # (largest, second largest) of two multisets; equal maxima count twice
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _ex2(x, FAST: tl.constexpr):
    if FAST:  # one MUFU.EX2; the default lowering adds a denormal range fix-up
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _rcp(x, FAST: tl.constexpr):
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def _score(x, row_max, row_den, SIGMOID: tl.constexpr, FAST: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    if SIGMOID:
        return _rcp(1.0 + _ex2(x * -LOG2E, FAST), FAST)  # x = -inf -> 0
    else:
        return _ex2((x - row_max) * LOG2E, FAST) * _rcp(row_den, FAST)


@triton.jit
def _grouped_topk_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    T,
    stride_t,
    scale,
    N_GROUP: tl.constexpr,
    EPG: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    TOPK: tl.constexpr,
    G_PAD: tl.constexpr,
    EPG_PAD: tl.constexpr,
    R_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORM: tl.constexpr,
    FAST: tl.constexpr,
):
    """Two passes per token. Pass 1 scores all E experts as a [G_PAD, EPG_PAD] tile and
    ranks the groups. Pass 2 reloads only the TOPK_GROUP kept groups (the logits are in L1)
    as an [R_PAD, EPG_PAD] tile and runs the TOPK selection rounds over it: half the
    candidates of the V3 layout per round. Each round is two 32-bit reductions (max of
    the order-preserving int32 image of the biased score, then the smallest expert id
    holding it), which the compiler lowers to single warp-wide REDUX instructions where a
    token spans the warp, instead of an int64 (score, slot) max built from shuffles."""
    pid = tl.program_id(0)
    t = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    row = logits_ptr + t.to(tl.int64) * stride_t
    row3 = row[:, None, None]
    tok3 = tmask[:, None, None]
    j3 = tl.arange(0, EPG_PAD)[None, None, :]
    # masks only where padding exists: a mask that varies along the expert axis stops the
    # compiler from vectorising the row loads (16-byte loads need 8 uniform bf16 lanes)
    if EPG_PAD == EPG:
        vj = j3 >= 0
    else:
        vj = j3 < EPG

    # ---- pass 1: all experts (needed for the group scores, and softmax's row max / sum)
    g = tl.arange(0, G_PAD)
    g3 = g[None, :, None]
    if G_PAD == N_GROUP:
        valid = vj & (g3 >= 0)
    else:
        valid = (g3 < N_GROUP) & vj
    x = tl.load(row3 + g3 * EPG + j3, mask=tok3 & valid, other=0.0).to(tl.float32)
    if G_PAD != N_GROUP or EPG_PAD != EPG:
        x = tl.where(valid, x, float("-inf"))
    if SIGMOID:
        row_max = tl.zeros([BLOCK_T], dtype=tl.float32)
        row_den = tl.full([BLOCK_T], 1.0, dtype=tl.float32)
    else:
        row_max = tl.max(tl.max(x, axis=2), axis=1)
        row_den = tl.sum(tl.sum(_ex2((x - row_max[:, None, None]) * 1.4426950408889634, FAST), axis=2), axis=1)
    rmax3 = row_max[:, None, None]
    rden3 = row_den[:, None, None]

    if N_GROUP > 1:
        s = _score(x, rmax3, rden3, SIGMOID, FAST)
        if HAS_BIAS:
            b = s + tl.load(bias_ptr + g3 * EPG + j3, mask=valid, other=0.0).to(tl.float32)
            b = tl.where(valid, b, float("-inf"))
            m1, m2 = tl.reduce((b, tl.full(b.shape, float("-inf"), tl.float32)), 2, _top2_combine)
            gs = m1 + m2  # sum of the two largest biased scores
        else:
            gs = tl.max(tl.where(valid, s, float("-inf")), axis=2)
        gs = tl.where(g[None, :] < N_GROUP, gs, float("-inf"))
        # rank of each group among its token's groups; the lower index wins a tie
        ga = gs[:, :, None]
        gb = gs[:, None, :]
        beats = (gb > ga) | ((gb == ga) & (g[None, None, :] < g[None, :, None]))
        rank = tl.sum(beats.to(tl.int32), axis=2)  # [BT, G_PAD]
        rank = tl.where(g[None, :] < N_GROUP, rank, G_PAD)
        # kept group of each rank r < TOPK_GROUP
        r = tl.arange(0, R_PAD)
        hit = rank[:, None, :] == r[None, :, None]  # [BT, R_PAD, G_PAD]
        kg = tl.sum(tl.where(hit, g[None, None, :], 0), axis=2)  # [BT, R_PAD]
        r3 = r[None, :, None]
        cvalid = (r3 < TOPK_GROUP) & vj
        e = kg[:, :, None] * EPG + j3  # expert id of each candidate
        # ---- pass 2: the kept groups only
        xc = tl.load(row3 + e, mask=tok3 & cvalid, other=0.0).to(tl.float32)
        su = _score(xc, rmax3, rden3, SIGMOID, FAST)
    else:
        cvalid = valid
        e = g3 * EPG + j3
        su = _score(x, rmax3, rden3, SIGMOID, FAST)
    if HAS_BIAS:
        sc = su + tl.load(bias_ptr + e, mask=cvalid, other=0.0).to(tl.float32)
    else:
        sc = su

    key = _sortable(sc)
    key = tl.where(cvalid, key, -2147483647 - 1)
    # one flat candidate axis per token: each reduction below then spans the whole warp
    # (one REDUX) instead of two partial shuffle trees
    NC: tl.constexpr = key.shape[1] * EPG_PAD
    e = tl.reshape(e + tl.zeros_like(key), (BLOCK_T, NC))
    key = tl.reshape(key, (BLOCK_T, NC))
    # unbiased scores are >= 0, so their int32 bits order like the floats
    sbits = tl.reshape(su.to(tl.int32, bitcast=True), (BLOCK_T, NC))
    kcol = tl.arange(0, K_PAD)[None, :]
    out_w = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    for k in tl.static_range(TOPK):
        top = tl.max(key, axis=1)
        eid = tl.min(tl.where(key == top[:, None], e, 1 << 30), axis=1)
        won = e == eid[:, None]
        key = tl.where(won, -2147483647 - 1, key)
        tl.store(ids_ptr + t.to(tl.int64) * TOPK + k, eid, mask=tmask)
        # weight = the winner's unbiased score (one more warp-wide 32-bit max)
        w = tl.max(tl.where(won, sbits, 0), axis=1).to(tl.float32, bitcast=True)
        out_w = tl.where(kcol == k, w[:, None], out_w)

    if RENORM:
        out_w = out_w / tl.sum(out_w, axis=1)[:, None]
    out_w = out_w * scale
    omask = tmask[:, None] & (kcol < TOPK)
    tl.store(weights_ptr + t[:, None].to(tl.int64) * TOPK + kcol, out_w, mask=omask)


def _pick_block(t: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): one token per single-warp program at every size. Each token
    then spans the whole warp, so every per-token reduction is one REDUX, and up to 32
    single-warp programs share an SM to hide the rounds' latency. (The previous kernel
    ran 4 tokens per program above 512 tokens; for this one BLOCK_T = 4 on one warp
    miscompiles on Triton 3.6, see grouped_topk.) The H200 race times the alternatives
    that pass its check: kernels/bench/results/2026-11-30_h200_race*."""
    return 1, 1


def grouped_topk(
    logits: torch.Tensor,
    topk: int,
    n_group: int = 1,
    topk_group: int = 1,
    scoring: str = "sigmoid",
    bias: torch.Tensor | None = None,
    renormalize: bool = False,
    scale: float = 1.0,
    block_t: int | None = None,
    num_warps: int | None = None,
    method: str = "two_pass",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (ids int32 [T, topk], weights fp32 [T, topk]); see module docstring."""
    assert logits.dim() == 2 and logits.dtype in (torch.float16, torch.bfloat16, torch.float32)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    t, e = logits.shape
    assert e % n_group == 0, "experts must split evenly into groups"
    epg = e // n_group
    assert 1 <= topk_group <= n_group and 1 <= topk <= topk_group * epg
    if bias is not None:
        assert bias.shape == (e,)
        bias = bias.contiguous()
    ids = torch.empty(t, topk, dtype=torch.int32, device=logits.device)
    weights = torch.empty(t, topk, dtype=torch.float32, device=logits.device)
    if t == 0:
        return ids, weights
    bt, nw = _pick_block(t)
    bt = block_t or bt
    nw = num_warps or nw
    common = dict(
        N_GROUP=n_group,
        EPG=epg,
        TOPK_GROUP=topk_group,
        TOPK=topk,
        G_PAD=triton.next_power_of_2(n_group),
        EPG_PAD=triton.next_power_of_2(epg),
        K_PAD=triton.next_power_of_2(topk),
        BLOCK_T=bt,
        SIGMOID=scoring == "sigmoid",
        HAS_BIAS=bias is not None,
        RENORM=renormalize,
        num_warps=nw,
    )
    args = (logits, bias if bias is not None else logits, weights, ids, t, logits.stride(0), float(scale))
    grid = (triton.cdiv(t, bt),)
    # Compiled for the H200 with Triton 3.6, BLOCK_T = 2 returned wrong ids (both kernels)
    # and so did the two-pass kernel with BLOCK_T = 4 on one warp; both are right under
    # the interpreter: kernels/bench/results/2026-11-29_h200_router_check_log.txt,
    # 2026-11-30_h200_race1_log.txt, 2026-11-30_h200_race2_log.txt
    assert not (logits.is_cuda and bt == 2), "BLOCK_T=2 miscompiles on Triton 3.6 (see _pick_block)"
    assert not (logits.is_cuda and method == "two_pass" and bt == 4 and nw == 1), (
        "BLOCK_T=4 on one warp miscompiles the two-pass kernel on Triton 3.6 (see _pick_block)")
    if method == "two_pass":
        _grouped_topk_kernel[grid](*args, R_PAD=triton.next_power_of_2(topk_group), FAST=logits.is_cuda, **common)
    elif method == "full":
        _grouped_topk_full_kernel[grid](*args, **common)
    else:
        raise ValueError(f"method must be 'two_pass' or 'full', got {method!r}")
    return ids, weights
