"""Variable-length prefill attention for Hopper (sm_90) in Gluon: warp-specialised, each key
block's softmax overlapped with the tensor-core products around it.

Same contract as ``kernels.prefill_attention.prefill_attention`` (packed q [Tq, Hq, Dqk], k
[Tk, Hkv, Dqk], v [Tk, Hkv, Dv], ``cu_seqlens``, bottom-right causal mask, GQA, natural-log LSE
[Hq, Tq]), fp16/bf16, for the head dims checked on the H200: Dqk 128 and DeepSeek MLA's
192 = 128 + 64 (two chained products), Dv 128 (``supported``; other splits ``split_head_dim``
accepts compile, but have not run on a GPU, so ``prefill_attention`` keeps the Triton kernel
for them).

Why a second kernel: the Triton kernel issues each key block's two products and its softmax in
one instruction stream, so the tensor cores idle while the exponentials run (kernels/README.md,
prefill, "What limits it"). Gluon (``triton.experimental.gluon``) states the schedule the way
FlashAttention-3 runs it on Hopper, in partitions (``gl.warp_specialize``):

- a producer warp TMA-loads the tile's Q [128, Dqk] once, then each key block's K and V into a
  ring of ``STAGES`` (K and V complete on their own ``ready`` mbarriers and are freed on their
  own ``empty`` ones: K as soon as the scores are read, V once its product retired);
- two consumer warpgroups each own 64 query rows of the tile and walk the same key blocks. In
  iteration j a consumer issues S_j = Q K_j^T, rescales O to block j - 1's running max while
  those products run, issues O += P_{j-1} V_{j-1} (P in registers, the product's A operand),
  waits for S_j alone and runs block j's online softmax while P_{j-1} V_{j-1} still runs
  (intra-warpgroup overlap, FlashAttention-3's order; with O rescaled after P_{j-1} V_{j-1}
  retired instead, the kernel took 0.99-1.06x the time, H200 race 8b). With ``PINGPONG`` the
  two consumers take turns issuing their products (an mbarrier each, arrived by the other after
  it issued), so one's softmax runs while the other's products occupy the tensor cores;
- tiles are ordered heaviest first (the last query blocks of a sequence see the most keys), or
  with ``HEAD_MAJOR`` one (sequence, head) after another, last block first. With ``PERSISTENT``
  one program per SM walks them in rounds that alternate direction (``_tile_index``), and the
  producer loads the next tile's Q and first key blocks while the consumers finish this one;
  without it, a program per tile, in that order.

Causal work: key blocks that every row of the tile sees run unmasked; the diagonal and the
ragged tail (keys past the sequence, which TMA reads from the next sequence or zero-fills)
take the mask. Rows past the sequence are computed from whatever TMA read and never stored.
Rows that see no key get out = 0 and LSE = -inf.

Gluon kernels compile only for a GPU (no interpreter): tests/kernels/test_prefill_sm90.py
compiles this one for sm_90a on any machine (``kernels.bench.sm90.prefill_sm90_build``: no
spills, warpgroup MMAs) and checks it against the float64 reference on a Hopper GPU."""

from __future__ import annotations

import torch
import triton

from kernels.attention_dims import LOG2E, split_head_dim
from kernels.sm90_common import HAVE_GLUON, SMEM_BYTES, split_registers

if HAVE_GLUON:
    from kernels.sm90_common import GL_DTYPE as _GL
    from kernels.sm90_common import TensorDescriptor, gl, gluon, mbarrier, release, warpgroup_mma, warpgroup_mma_wait
    from kernels.sm90_common import tma_load as _tma_load
    from kernels.sm90_common import wgmma_layout

BLOCK_M = 128  # query rows per tile: two consumer warpgroups of 64
PRODUCER_REGS = 40
CONFIG_KEYS = ("BLOCK_N", "STAGES", "PINGPONG", "PERSISTENT", "HEAD_MAJOR")


def smem_bytes(dqk: int, dv: int, block_n: int, stages: int, itemsize: int = 2) -> int:
    """Shared memory of a launch: Q [128, Dqk], ``stages`` x (K [BLOCK_N, Dqk] + V [BLOCK_N, Dv])
    and the mbarriers."""
    return itemsize * (BLOCK_M * dqk + stages * block_n * (dqk + dv)) + 8 * (4 * stages + 4)


WAVES_HEAD_MAJOR = 12  # tiles per SM from which a program per tile in head-major order wins


def default_config(dqk: int, dv: int, waves: float = 0.0) -> dict:
    """The launch by head dims and ``waves`` (query tiles of the launch's grid, empty ones of a
    varlen batch included, per SM), from H200 race 8c (kernels/bench/results/
    2026-12-03_h200_race8c_prefill_sm90*: eight cases, seven configs each, in one process):
    2 stages of 128-key blocks (Q + K + V fit for Dqk <= 192; a third stage or 64-key blocks
    were no faster in 8a / 8b). From ``WAVES_HEAD_MAJOR`` tiles per SM (16k tokens, varlen
    batches) a program per tile, one (sequence, head) after another, so the programs side by
    side read the same K and V from L2 (d128 16k 565-571 TFLOP/s against 528-537 heaviest
    first; MLA 16k 615 against 577-581; varlen 498-543 against 383-513); below it (4k-8k, 4-8
    tiles per SM) one persistent program per SM, tiles heaviest first in rounds of alternating
    direction (4k: 549-592 against 515-561 a program per tile, where head-major order leaves
    heavy tiles to the end: 475-496). The consumers take turns (``PINGPONG``) at Dqk 192, where
    that was 2-6% faster at 8k-16k (1% slower at 4k), not at Dqk 128, where it was 0-2% slower."""
    head_major = waves >= WAVES_HEAD_MAJOR
    return dict(BLOCK_N=128, STAGES=2, PINGPONG=dqk > 128, PERSISTENT=0 if head_major else 1,
                HEAD_MAJOR=head_major)


def launch_config(config: dict | None, dqk: int, dv: int, waves: float = 0.0) -> dict:
    """``default_config`` updated with ``config``, checked: known keys, a key block the products
    can take, and shared memory that fits. A ``ValueError`` names the field."""
    cfg = default_config(dqk, dv, waves)
    if config:
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"prefill_sm90 config: unknown keys {unknown}, expected some of {list(CONFIG_KEYS)}")
        cfg.update(config)
    if cfg["BLOCK_N"] not in (64, 128):
        raise ValueError(f"prefill_sm90 config: BLOCK_N must be 64 or 128, got {cfg['BLOCK_N']}")
    if cfg["PERSISTENT"] not in (0, 1, False, True):
        raise ValueError(f"prefill_sm90 config: PERSISTENT must be 0 (a program per tile) or 1 (one per SM), got "
                         f"{cfg['PERSISTENT']!r}: a second program cannot fit an SM's shared memory")
    if not isinstance(cfg["STAGES"], int) or cfg["STAGES"] < 1:
        raise ValueError(f"prefill_sm90 config: STAGES must be a positive int, got {cfg['STAGES']!r}")
    need = smem_bytes(dqk, dv, cfg["BLOCK_N"], cfg["STAGES"])
    if need > SMEM_BYTES:
        raise ValueError(f"prefill_sm90 config: STAGES {cfg['STAGES']} of BLOCK_N {cfg['BLOCK_N']} need {need} bytes "
                         f"of shared memory with Dqk {dqk} / Dv {dv}, more than the {SMEM_BYTES} an SM has")
    return cfg


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None = None) -> bool:
    """Whether this kernel runs these operands: a Hopper GPU, Gluon, 16-bit inputs, the head dims
    checked on the H200 (Dqk 128 or 192, Dv 128) and bases and strides TMA accepts."""
    if not (HAVE_GLUON and q.is_cuda) or torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return False
    if q.shape[2] not in (128, 192) or v.shape[2] != 128:
        return False
    es = q.element_size()
    for t in (q, k, v):
        if t.stride(2) != 1 or t.data_ptr() % 16 or (t.stride(0) * es) % 16 or (t.stride(1) * es) % 16:
            return False
    return out is None or out.stride(2) == 1


if HAVE_GLUON:
    _PRODUCER_REGS = gl.constexpr(PRODUCER_REGS)

    @gluon.jit
    def _tile_index(r, G):
        """The tile a program takes in round r of a grid of G programs: rounds alternate
        direction (program p takes r G + p, then r G + G - 1 - p), so that with tiles ordered
        heaviest first every program's total stays level (a plain round-robin gives program 0 the
        heaviest tile of every round)."""
        p = gl.program_id(0)
        return r * G + gl.where(r % 2 == 0, p, G - 1 - p)

    @gluon.jit
    def _tile_of(t, HB, NUM_MB, H, CU_Q, CU_K, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                 HEAD_MAJOR: gl.constexpr):
        """Tile t's sequence, head and rows, and its key range: (b, h, q_start, Lq, m0, k_start,
        Lk, diag, n_full, n_blocks); the tile is empty when m0 >= Lq. Heaviest first: the last
        query blocks of every (sequence, head) first, or with HEAD_MAJOR one (sequence, head)'s
        blocks after another, last block first (the programs running side by side then read the
        same K and V, from L2)."""
        if HEAD_MAJOR:
            m_blk = NUM_MB - 1 - t % NUM_MB
            hb = t // NUM_MB
        else:
            m_blk = NUM_MB - 1 - t // HB
            hb = t % HB
        b = hb // H
        h = hb % H
        q_start = gl.load(CU_Q + b)
        Lq = gl.load(CU_Q + b + 1) - q_start
        k_start = gl.load(CU_K + b)
        Lk = gl.load(CU_K + b + 1) - k_start
        m0 = m_blk * BM
        diag = Lk - Lq  # bottom-right causal alignment
        if CAUSAL:
            # the tile's first row sees keys <= m0 + diag, its last keys < m0 + BM + diag
            n_full = (gl.maximum(m0 + diag + 1, 0) // BN) * BN
            hi = gl.maximum(gl.minimum(Lk, m0 + BM + diag), 0)
        else:
            n_full = Lk
            hi = Lk
        n_full = gl.minimum(n_full, (Lk // BN) * BN)
        return b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, gl.cdiv(hi, BN)

    @gluon.jit
    def _round_tile(r, total, HB, NUM_MB, H, CU_Q, CU_K, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    HEAD_MAJOR: gl.constexpr):
        """This program's tile of round r (``_tile_index``) and whether it has rows to compute:
        (live, then ``_tile_of``'s fields). A round past the last tile decodes the last tile (no
        read past ``cu_seqlens``) and is not live."""
        t = _tile_index(r, gl.num_programs(0))
        b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, n_blocks = _tile_of(
            gl.minimum(t, total - 1), HB, NUM_MB, H, CU_Q, CU_K, CAUSAL, BM, BN, HEAD_MAJOR)
        return (t < total) & (m0 < Lq), b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, n_blocks

    @gluon.jit
    def _producer(q_desc, q2_desc, k_desc, k2_desc, v_desc, q_smem, q2_smem, k_bufs, k2_bufs, v_bufs, q_ready, q_empty,
                  k_ready, k_empty, v_ready, v_empty, CU_Q, CU_K, H, GROUP, HB, NUM_MB, total, stride_qh, stride_kh,
                  stride_vh, CAUSAL: gl.constexpr, STAGES: gl.constexpr, D2: gl.constexpr, HEAD_MAJOR: gl.constexpr):
        """One warp: per tile, Q once (when both consumers freed the last tile's), then every key
        block's K and V into the ring, each waiting for its own slot to be freed. A q.k head dim
        that is not a power of two comes as two column blocks (D1 + D2: 192 = 128 + 64)."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        D1: gl.constexpr = q_desc.block_type.shape[1]
        q_bytes: gl.constexpr = q_desc.block_type.nbytes + (q2_desc.block_type.nbytes if D2 > 0 else 0)
        k_bytes: gl.constexpr = k_desc.block_type.nbytes + (k2_desc.block_type.nbytes if D2 > 0 else 0)
        BN: gl.constexpr = k_desc.block_type.shape[0]
        g = 0
        tq = 0
        for r in range(gl.cdiv(total, gl.num_programs(0))):
            live, b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, n_blocks = _round_tile(
                r, total, HB, NUM_MB, H, CU_Q, CU_K, CAUSAL, BM, BN, HEAD_MAJOR)
            if live:
                kvh = h // GROUP
                mbarrier.wait(q_empty, (tq & 1) ^ 1)  # the first wait passes (the phase before 0)
                mbarrier.expect(q_ready, q_bytes)
                _tma_load(q_desc, [q_start + m0, h * stride_qh], q_ready, q_smem)
                if D2 > 0:
                    _tma_load(q2_desc, [q_start + m0, h * stride_qh + D1], q_ready, q2_smem)
                for j in range(n_blocks):
                    s = (g + j) % STAGES
                    ph = (((g + j) // STAGES) & 1) ^ 1
                    mbarrier.wait(k_empty.index(s), ph)
                    mbarrier.expect(k_ready.index(s), k_bytes)
                    _tma_load(k_desc, [k_start + j * BN, kvh * stride_kh], k_ready.index(s), k_bufs.index(s))
                    if D2 > 0:
                        _tma_load(k2_desc, [k_start + j * BN, kvh * stride_kh + D1], k_ready.index(s),
                                  k2_bufs.index(s))
                    mbarrier.wait(v_empty.index(s), ph)
                    mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
                    _tma_load(v_desc, [k_start + j * BN, kvh * stride_vh], v_ready.index(s), v_bufs.index(s))
                g += n_blocks
                tq += 1

    @gluon.jit
    def _qk(q_rows, q2_rows, k_bufs, k2_bufs, s, regs, D2: gl.constexpr):
        """Issue S = Q K^T of stage s asynchronously into ``regs`` (its old values unused): one
        product, or two chained over the D1 and D2 column blocks."""
        tok = warpgroup_mma(q_rows, k_bufs.index(s).permute((1, 0)), regs, use_acc=False, is_async=True)
        if D2 > 0:
            tok = warpgroup_mma(q2_rows, k2_bufs.index(s).permute((1, 0)), tok, is_async=True)
        return tok

    @gluon.jit
    def _softmax(s, m_i, rows, cols, diag, Lk, qk_scale, MASK: gl.constexpr, CAUSAL: gl.constexpr):
        """Block scores -> (p, new running max, alpha) in the log2 domain; masked keys -> p = 0.
        m_i starts finite, so rows that see no key keep p = 0 and alpha = 1."""
        if MASK:
            ok = cols[None, :] < Lk
            if CAUSAL:
                ok = ok & (cols[None, :] <= rows[:, None] + diag)
            s = gl.where(ok, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        p = gl.exp2(s * qk_scale - m_new[:, None])
        return p, m_new, gl.exp2(m_i - m_new)

    @gluon.jit
    def _consumer(q_smem, q2_smem, k_bufs, k2_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready, v_empty,
                  sched, O, LSE,
                  CU_Q, CU_K, H, HB, NUM_MB, total, stride_ot, stride_oh, stride_lse_h, qk_scale,
                  W: gl.constexpr, BN: gl.constexpr, DV: gl.constexpr, CAUSAL: gl.constexpr,
                  STORE_LSE: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, D2: gl.constexpr,
                  HEAD_MAJOR: gl.constexpr):
        """Consumer warpgroup W: query rows [64 W, 64 W + 64) of every tile of this program."""
        HALF: gl.constexpr = 64
        BM: gl.constexpr = 2 * HALF
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = wgmma_layout(BN)
        o_layout: gl.constexpr = wgmma_layout(DV)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        q_rows = q_smem.slice(W * HALF, HALF)
        q2_rows = q2_smem.slice(W * HALF, HALF)
        g = 0
        tq = 0
        turn = 0  # issue points taken in turns with the other consumer (PINGPONG)
        for r in range(gl.cdiv(total, gl.num_programs(0))):
            live, b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, n_blocks = _round_tile(
                r, total, HB, NUM_MB, H, CU_Q, CU_K, CAUSAL, BM, BN, HEAD_MAJOR)
            if live:
                rows = m0 + W * HALF + gl.arange(0, HALF, layout=row_s)
                cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                acc = gl.zeros([HALF, DV], gl.float32, o_layout)
                m_i = gl.full([HALF], -1.0e30, gl.float32, row_s)
                l_i = gl.zeros([HALF], gl.float32, row_s)
                mbarrier.wait(q_ready, tq & 1)
                if n_blocks > 0:
                    s0 = g % STAGES
                    mbarrier.wait(k_ready.index(s0), (g // STAGES) & 1)
                    s_tok = _qk(q_rows, q2_rows, k_bufs, k2_bufs, s0, gl.zeros([HALF, BN], gl.float32, s_layout), D2)
                    s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                    release(k_empty.index(s0))
                    if n_full <= 0:
                        p, m_i, alpha = _softmax(s, m_i, rows, cols0, diag, Lk, qk_scale, True, CAUSAL)
                    else:
                        p, m_i, alpha = _softmax(s, m_i, rows, cols0, diag, Lk, qk_scale, False, CAUSAL)
                    l_i = gl.sum(p, axis=1)
                    p_op = gl.convert_layout(p.to(dtype), p_layout)
                    for j in range(1, n_blocks):
                        sj = (g + j) % STAGES
                        sp = (g + j - 1) % STAGES
                        mbarrier.wait(k_ready.index(sj), ((g + j) // STAGES) & 1)
                        mbarrier.wait(v_ready.index(sp), ((g + j - 1) // STAGES) & 1)
                        if PINGPONG:
                            mbarrier.wait(sched.index(W), (turn & 1) ^ (1 - W))
                        # S_j into the registers of S_{j-1} (read out by the softmax already)
                        s_tok = _qk(q_rows, q2_rows, k_bufs, k2_bufs, sj, s, D2)
                        # O to block j - 1's max while S_j's products run (FlashAttention-3's order)
                        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                        o_tok = warpgroup_mma(p_op, v_bufs.index(sp), acc, is_async=True)
                        if PINGPONG:
                            mbarrier.arrive(sched.index(1 - W))
                        turn += 1
                        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))  # S_j done, PV_{j-1} may run
                        release(k_empty.index(sj))
                        if j * BN >= n_full:
                            p, m_new, alpha = _softmax(s, m_i, rows, cols0 + j * BN, diag, Lk, qk_scale, True, CAUSAL)
                        else:
                            p, m_new, alpha = _softmax(s, m_i, rows, cols0 + j * BN, diag, Lk, qk_scale, False,
                                                       CAUSAL)
                        l_i = l_i * alpha + gl.sum(p, axis=1)
                        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                        release(v_empty.index(sp))
                        p_op = gl.convert_layout(p.to(dtype), p_layout)
                        m_i = m_new
                    release(q_empty)  # the tile's last QK^T has retired
                    sl = (g + n_blocks - 1) % STAGES
                    mbarrier.wait(v_ready.index(sl), ((g + n_blocks - 1) // STAGES) & 1)
                    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
                    o_tok = warpgroup_mma(p_op, v_bufs.index(sl), acc, is_async=True)
                    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                    release(v_empty.index(sl))
                else:
                    release(q_empty)
                # epilogue: out = acc / l (0 where a row saw no key), masked to the sequence's rows
                empty = l_i == 0.0
                l_safe = gl.where(empty, 1.0, l_i)
                out = acc / gl.convert_layout(l_safe, row_o)[:, None]
                rows_o = m0 + W * HALF + gl.arange(0, HALF, layout=row_o)
                cols_o = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
                ptrs = (O + (q_start + rows_o).to(gl.int64)[:, None] * stride_ot + h * stride_oh + cols_o[None, :])
                gl.store(ptrs, out.to(O.dtype.element_ty), mask=(rows_o < Lq)[:, None])
                if STORE_LSE:
                    lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
                    gl.store(LSE + h * stride_lse_h + q_start + rows, lse, mask=rows < Lq)
                g += n_blocks
                tq += 1

    @gluon.jit
    def _prefill_sm90_kernel(q_desc, q2_desc, k_desc, k2_desc, v_desc, O, LSE, CU_Q, CU_K, H, GROUP, NUM_MB, B,
                             stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, stride_lse_h, qk_scale,
                             CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
                             PINGPONG: gl.constexpr, D2: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                             PERSISTENT: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             num_warps: gl.constexpr):
        """The default partition (4 warps) is consumer 0, a 4-warp worker consumer 1, a 1-warp
        worker the TMA producer. q_desc's block is the tile's [128, D1] rows, q2_desc's the next
        D2 columns (D2 = 0: q2_desc and k2_desc unused)."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        gl.static_assert(BM == 128, "two consumer warpgroups of 64 query rows")
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        HB = H * B
        total = NUM_MB * HB
        if PERSISTENT:
            _partitions(q_desc, q2_desc, k_desc, k2_desc, v_desc, O, LSE, CU_Q, CU_K, H, GROUP, NUM_MB, HB, total,
                        stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, stride_lse_h, qk_scale, CAUSAL,
                        STORE_LSE, STAGES, PINGPONG, D2, HEAD_MAJOR, CONSUMER_REGS)
        else:
            # a program per tile: one past its sequence's rows (most of a varlen batch's grid) returns
            # before the partitions start
            live, b, h, q_start, Lq, m0, k_start, Lk, diag, n_full, n_blocks = _round_tile(
                0, total, HB, NUM_MB, H, CU_Q, CU_K, CAUSAL, BM, BN, HEAD_MAJOR)
            if live:
                _partitions(q_desc, q2_desc, k_desc, k2_desc, v_desc, O, LSE, CU_Q, CU_K, H, GROUP, NUM_MB, HB,
                            total, stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, stride_lse_h, qk_scale,
                            CAUSAL, STORE_LSE, STAGES, PINGPONG, D2, HEAD_MAJOR, CONSUMER_REGS)

    @gluon.jit
    def _partitions(q_desc, q2_desc, k_desc, k2_desc, v_desc, O, LSE, CU_Q, CU_K, H, GROUP, NUM_MB, HB, total,
                    stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, stride_lse_h, qk_scale,
                    CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                    D2: gl.constexpr, HEAD_MAJOR: gl.constexpr,
                    CONSUMER_REGS: gl.constexpr):
        """Shared memory, mbarriers and the three partitions."""
        BM: gl.constexpr = q_desc.block_type.shape[0]
        D1: gl.constexpr = q_desc.block_type.shape[1]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DV: gl.constexpr = v_desc.block_type.shape[1]
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [BM, D1], q_desc.layout)
        k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BN, D1], k_desc.layout)
        if D2 > 0:
            q2_smem = gl.allocate_shared_memory(q2_desc.dtype, [BM, D2], q2_desc.layout)
            k2_bufs = gl.allocate_shared_memory(k2_desc.dtype, [STAGES, BN, D2], k2_desc.layout)
        else:  # unused: views of the D1 buffers
            q2_smem = q_smem
            k2_bufs = k_bufs
        v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BN, DV], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        sched = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(q_empty, count=2)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        for i in gl.static_range(2):
            mbarrier.init(sched.index(i), count=1)
        gl.warp_specialize([
            (_consumer, (q_smem, q2_smem, k_bufs, k2_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready,
                         v_empty, sched, O, LSE,
                         CU_Q, CU_K, H, HB, NUM_MB, total, stride_ot, stride_oh, stride_lse_h, qk_scale,
                         0, BN, DV, CAUSAL, STORE_LSE, STAGES, PINGPONG, D2, HEAD_MAJOR)),
            (_consumer, (q_smem, q2_smem, k_bufs, k2_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty, v_ready,
                         v_empty, sched, O, LSE,
                         CU_Q, CU_K, H, HB, NUM_MB, total, stride_ot, stride_oh, stride_lse_h, qk_scale,
                         1, BN, DV, CAUSAL, STORE_LSE, STAGES, PINGPONG, D2, HEAD_MAJOR)),
            (_producer, (q_desc, q2_desc, k_desc, k2_desc, v_desc, q_smem, q2_smem, k_bufs, k2_bufs, v_bufs, q_ready,
                         q_empty, k_ready, k_empty, v_ready, v_empty, CU_Q, CU_K, H, GROUP, HB, NUM_MB, total,
                         stride_qh, stride_kh, stride_vh, CAUSAL, STAGES, D2, HEAD_MAJOR)),
        ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])


def registers(per_sm: int = 1) -> tuple[int, int]:
    """(maxnreg, registers per consumer thread): two consumer warpgroups, the producer keeping
    ``PRODUCER_REGS``."""
    return split_registers(2, per_sm, PRODUCER_REGS)


def _matrix(t: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, d] as the [tokens, heads * stride] matrix TMA walks (head h at column
    h * stride(1))."""
    return t.as_strided((t.shape[0], (t.shape[1] - 1) * t.stride(1) + t.shape[2]), (t.stride(0), 1))


def descriptors(q, k, v, block_n: int):
    """TMA descriptors: Q's tile [128, D1] and [128, D2], K's key block [BLOCK_N, D1] and
    [BLOCK_N, D2] (D2 = 0: the D1 ones again), V's [BLOCK_N, Dv]."""
    dt = _GL[q.dtype]
    d1, d2 = split_head_dim(q.shape[2])

    def desc(t, block):
        m = _matrix(t)
        return TensorDescriptor(m, list(m.shape), list(m.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, dt))

    q1, k1 = desc(q, [BLOCK_M, d1]), desc(k, [block_n, d1])
    q2, k2 = (desc(q, [BLOCK_M, d2]), desc(k, [block_n, d2])) if d2 else (q1, k1)
    return q1, q2, k1, k2, desc(v, [block_n, v.shape[2]])


def prefill_sm90(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, out, lse, softmax_scale, causal,
                 config: dict | None = None):
    """Launch on checked operands (``prefill_attention`` checks shapes and dtypes and calls
    this where ``supported`` holds); ``lse`` None for no LSE."""
    dqk, dv = q.shape[2], v.shape[2]
    batch = cu_seqlens_q.numel() - 1
    hq, hkv = q.shape[1], k.shape[1]
    num_mb = triton.cdiv(max_seqlen_q, BLOCK_M)
    tiles = num_mb * hq * batch
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    cfg = launch_config(config, dqk, dv, tiles / sms)
    q1, q2, k1, k2, vd = descriptors(q, k, v, cfg["BLOCK_N"])
    per_sm = int(cfg["PERSISTENT"])
    grid = (min(tiles, per_sm * sms) if per_sm else tiles,)
    maxnreg, regs = registers(per_sm)
    _prefill_sm90_kernel[grid](
        q1, q2, k1, k2, vd, out, lse if lse is not None else out, cu_seqlens_q, cu_seqlens_k,
        hq, hq // hkv, num_mb, batch, q.stride(1), k.stride(1), v.stride(1), out.stride(0), out.stride(1),
        lse.stride(0) if lse is not None else 0, softmax_scale * LOG2E,
        CAUSAL=bool(causal), STORE_LSE=lse is not None, STAGES=cfg["STAGES"], PINGPONG=bool(cfg["PINGPONG"]),
        D2=split_head_dim(dqk)[1], HEAD_MAJOR=bool(cfg["HEAD_MAJOR"]),
        PERSISTENT=bool(per_sm), CONSUMER_REGS=regs, num_warps=4, maxnreg=maxnreg)
    return out
