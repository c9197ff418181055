"""The Gluon parts the MLA decode kernels for Hopper share (``kernels.mla_sm90``'s split and fp8
kernels, ``kernels.mla_sm90_seesaw``): a program's span of the sequence, the TMA producer warp,
the query staging, the masked tail of a key block, the score product, the online softmax step of
a warpgroup that publishes P, and the write-outs of the output, the LSE and a split's partials."""

from __future__ import annotations

from kernels.sm90_common import HAVE_GLUON

PRODUCER_REGS = 40  # registers a thread of the TMA producer warp keeps (setmaxnreg)
LAZY_THRESHOLD = 8.0  # the lazy rescale's slack, log2 units: P at most 2^8 (bf16/fp16 hold it exactly enough)

if HAVE_GLUON:
    from kernels.sm90_common import fence_async_shared, gl, gluon, mbarrier, release, warpgroup_mma
    from kernels.sm90_common import cta_barrier as _cta_barrier
    from kernels.sm90_common import tma_load as _tma_load

    _PRODUCER_REGS = gl.constexpr(PRODUCER_REGS)
    _LAZY_THRESHOLD = gl.constexpr(LAZY_THRESHOLD)
    _FLAG_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))  # one value every thread holds

    @gluon.jit
    def _span(SEQ, chunk, BN: gl.constexpr):
        """This program's sequence, split and token range [start, end) (the last split takes the
        rest of the sequence) and its key blocks of ``BN`` tokens."""
        b = gl.program_id(1)
        s = gl.program_id(2)
        L = gl.load(SEQ + b)
        start = s * chunk
        end = gl.where(s == gl.num_programs(2) - 1, L, gl.minimum(L, start + chunk))
        return b, s, start, end, gl.cdiv(gl.maximum(end - start, 0), BN)

    @gluon.jit
    def _producer(kv_desc, pe_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk, PAGE,
                  STAGES: gl.constexpr):
        """One warp: each key block's latent and rope rows, from its page, into the ring."""
        BN: gl.constexpr = kv_desc.block_type.shape[0]
        b, s, start, end, n_blocks = _span(SEQ, chunk, BN)
        for j in range(n_blocks):
            st = j % STAGES
            mbarrier.wait(kv_empty.index(st), ((j // STAGES) & 1) ^ 1)  # the first pass is free
            _load_block(kv_desc, pe_desc, kv_bufs.index(st), pe_bufs.index(st), kv_ready.index(st), b,
                        start + j * BN, BT, stride_bt, PAGE)

    @gluon.jit
    def _block_row(BT, b, stride_bt, tok, PAGE):
        """The cache row of token ``tok`` of sequence b (a key block's first), through its page."""
        page = gl.load(BT + b.to(gl.int64) * stride_bt + tok // PAGE)
        return (page * PAGE + tok % PAGE).to(gl.int32)

    @gluon.jit
    def _load_block(kv_desc, pe_desc, kv_buf, pe_buf, ready, b, tok, BT, stride_bt, PAGE):
        """The key block starting at token ``tok`` of sequence b, latent and rope rows, from its page
        into one slot, landing on ``ready``."""
        row = _block_row(BT, b, stride_bt, tok, PAGE)
        mbarrier.expect(ready, kv_desc.block_type.nbytes + pe_desc.block_type.nbytes)
        _tma_load(kv_desc, [row, 0], ready, kv_buf)
        _tma_load(pe_desc, [row, kv_desc.block_type.shape[1]], ready, pe_buf)

    @gluon.jit
    def _load_piece(tile_desc, row, ready, dst, C0: gl.constexpr, NT: gl.constexpr):
        """``NT`` [64, 64] tiles of a key block's row (from column ``C0``) into ``dst``, landing on
        one mbarrier."""
        mbarrier.expect(ready, NT * tile_desc.block_type.nbytes)
        for t in gl.static_range(NT):
            _tma_load(tile_desc, [row, C0 + 64 * t], ready, dst.slice(64 * t, 64, dim=1))

    @gluon.jit
    def _producer_tiled(tile_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk, PAGE,
                        STAGES: gl.constexpr):
        """The producer warp of the split schedule's ``TILED`` build: each key block in four pieces,
        each landing on its own mbarrier (piece k of slot st: ``kv_ready[k].index(st)``): the rope,
        latent columns [0, 128), [128, 256) and [256, 512), in the order their readers free them,
        each loaded as soon as it is free rather than once the whole slot is. Three free mbarriers:
        the first two pieces are consumer 0's alone and freed together (``kv_empty[0]``), the other
        two each by consumer 1 (``kv_empty[1]``, ``kv_empty[2]``)."""
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        for j in range(n_blocks):
            st = j % STAGES
            ph = ((j // STAGES) & 1) ^ 1  # the first pass is free
            row = _block_row(BT, b, stride_bt, start + j * 64, PAGE)
            kv = kv_bufs.index(st)
            mbarrier.wait(kv_empty[0].index(st), ph)  # the rope and latent [0, 128): consumer 0's
            _load_piece(tile_desc, row, kv_ready[0].index(st), pe_bufs.index(st), 512, 1)
            _load_piece(tile_desc, row, kv_ready[1].index(st), kv.slice(0, 128, dim=1), 0, 2)
            mbarrier.wait(kv_empty[1].index(st), ph)
            _load_piece(tile_desc, row, kv_ready[2].index(st), kv.slice(128, 128, dim=1), 128, 2)
            mbarrier.wait(kv_empty[2].index(st), ph)
            _load_piece(tile_desc, row, kv_ready[3].index(st), kv.slice(256, 256, dim=1), 256, 4)

    @gluon.jit
    def _qk_tiled(q_smem, q_pe, kv_bufs, pe_bufs, kv_ready, st, ph, regs, q_reg0=0, q_reg1=0,
                  QREG: gl.constexpr = 0):
        """``_qk`` on the ``TILED`` build's pieces, each product issued as its piece lands (the
        rope, then latent columns [0, 128), [128, 256), [256, 512)); with ``QREG`` (256) the first
        two latent pieces' Q from registers (``q_reg0``, ``q_reg1``)."""
        kv = kv_bufs.index(st)
        mbarrier.wait(kv_ready[0].index(st), ph)
        tok = warpgroup_mma(q_pe, pe_bufs.index(st).permute((1, 0)), regs, use_acc=False, is_async=True)
        mbarrier.wait(kv_ready[1].index(st), ph)
        a0 = q_reg0 if QREG else q_smem.slice(0, 128, dim=1)
        tok = warpgroup_mma(a0, kv.slice(0, 128, dim=1).permute((1, 0)), tok, is_async=True)
        mbarrier.wait(kv_ready[2].index(st), ph)
        a1 = q_reg1 if QREG else q_smem.slice(128, 128, dim=1)
        tok = warpgroup_mma(a1, kv.slice(128, 128, dim=1).permute((1, 0)), tok, is_async=True)
        mbarrier.wait(kv_ready[3].index(st), ph)
        return warpgroup_mma(q_smem.slice(256, 256, dim=1), kv.slice(256, 256, dim=1).permute((1, 0)), tok,
                             is_async=True)

    @gluon.jit
    def _zero_tail(v_cols, valid):
        """Rows >= ``valid`` of a column slice of a key block's latent rows -> 0 (the cache slots
        past the sequence may hold anything); the products read it through the async proxy,
        hence the fence."""
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, blk))
        for i in gl.static_range(v_cols.shape[1] // 64):  # 64 columns at a time: 16 registers a thread
            part = v_cols.slice(i * 64, 64, dim=1)
            x = part.load(blk)
            part.store(gl.where((rows < valid)[:, None], x, gl.zeros_like(x)))
        fence_async_shared()
        _cta_barrier()

    @gluon.jit
    def _stage_q(q_smem, q_pe, qb, stride_qh):
        """The program's 64 query rows into shared memory, in its dtype (the fp8 path's fp16): the
        latent part 128 columns at a time, then the rope part; fenced for the async proxy (the
        products read them)."""
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, blk))
        c = gl.arange(0, 128, layout=gl.SliceLayout(0, blk))
        for i in gl.static_range(4):
            x = gl.load(qb + r[:, None] * stride_qh + i * 128 + c[None, :])
            q_smem.slice(i * 128, 128, dim=1).store(x.to(q_smem.dtype))
        blk64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r64 = gl.arange(0, 64, layout=gl.SliceLayout(1, blk64))
        c64 = gl.arange(0, 64, layout=gl.SliceLayout(0, blk64))
        q_pe.store(gl.load(qb + r64[:, None] * stride_qh + 512 + c64[None, :]).to(q_pe.dtype))
        fence_async_shared()
        _cta_barrier()

    @gluon.jit
    def _qk(q_smem, q_pe, kv_bufs, pe_bufs, st, regs, q_reg=0, QREG: gl.constexpr = 0):
        """Issue S = Q K^T of slot st asynchronously into ``regs``: the latent part, then the
        rope part, chained; with ``QREG`` the latent part's first QREG columns with Q from
        registers (``q_reg``), the rest from shared memory."""
        kv = kv_bufs.index(st)
        if QREG:
            DL: gl.constexpr = kv.shape[1]
            tok = warpgroup_mma(q_reg, kv.slice(0, QREG, dim=1).permute((1, 0)), regs, use_acc=False, is_async=True)
            tok = warpgroup_mma(q_smem.slice(QREG, DL - QREG, dim=1), kv.slice(QREG, DL - QREG, dim=1).permute((1, 0)),
                                tok, is_async=True)
        else:
            tok = warpgroup_mma(q_smem, kv.permute((1, 0)), regs, use_acc=False, is_async=True)
        return warpgroup_mma(q_pe, pe_bufs.index(st).permute((1, 0)), tok, is_async=True)

    @gluon.jit
    def _write_out(acc, l_i, m_i, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                   stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, COL0: gl.constexpr,
                   layout: gl.constexpr, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, WITH_LSE: gl.constexpr):
        """Output columns [COL0, COL0 + acc's width) of the program's 64 heads: the output and LSE
        (one split) or the partial output and log2-sum-exp (an empty split: -inf, output
        unwritten)."""
        heads = gl.program_id(0) * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
        cols = COL0 + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
        empty = n_blocks == 0
        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        out = acc * (out_scale / l_safe)[:, None]
        lse2 = gl.where(l_i == 0.0, float("-inf"), m_i + gl.log2(l_safe))
        if SINGLE:
            ptrs = O + b.to(gl.int64) * stride_ob + heads[:, None] * stride_oh + cols[None, :]
            gl.store(ptrs, out.to(O.dtype.element_ty))
            if STORE_LSE and WITH_LSE:
                gl.store(LSE + b * stride_lsb + heads * stride_lsh, lse2 * 0.6931471805599453)
        else:
            if not empty:
                ptrs = OP + b.to(gl.int64) * stride_pb + heads[:, None] * stride_ph + s * stride_ps + cols[None, :]
                gl.store(ptrs, out)
            if WITH_LSE:
                gl.store(LP + b * stride_lb + heads * stride_lh + s, lse2)

    @gluon.jit
    def _softmax_publish(sc, m_i, l_i, acc, j, tok0, end, score_scale, p_bufs, alpha_smem, p_ready, p_free,
                         p_layout: gl.constexpr, LAZY: gl.constexpr = False, flag_smem=None,
                         P_MUL: gl.constexpr = 1.0):
        """Consumer 0's turn on key block j once its scores ``sc`` are in: keys past ``end`` masked,
        the online softmax, P_j (in P's buffer dtype) and the rescale factor published for
        consumer 1 in buffer j % NP once consumer 1 freed it, its own output columns rescaled.
        Returns (acc, P_j as the A operand of its P V, m_i, l_i). ``LAZY``: ``_softmax_step``'s
        lazy rescale, whether it rescaled published in ``flag_smem`` and the accumulator rescaled
        only then. ``P_MUL``: P published times it (the row sums stay P's own)."""
        p, alpha, m_new, l_i, grow = _softmax_step(sc, m_i, l_i, tok0, end, score_scale, LAZY)
        if P_MUL != 1.0:
            p = p * P_MUL
        p16 = _publish(p, alpha, j, p_bufs, alpha_smem, p_ready, p_free, flag_smem if LAZY else None, grow)
        if grow != 0:  # (without LAZY the constant 1)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))[:, None]
        return acc, gl.convert_layout(p16, p_layout), m_new, l_i

    @gluon.jit
    def _softmax_step(sc, m_i, l_i, tok0, end, score_scale, LAZY: gl.constexpr = False):
        """The online softmax on key block scores ``sc`` starting at token ``tok0`` (keys past
        ``end`` masked): (P, the rescale factor of the previous blocks' sums, m, l, whether it
        rescaled). ``LAZY`` (FlashAttention 4's conditional rescale): the running maximum moves
        only when some row's block maximum passes it by more than ``LAZY_THRESHOLD`` (log2 units),
        so P stays below 2^LAZY_THRESHOLD and most blocks after the first few need no rescale of
        the accumulators at all (the rescale factor is then 1 and the flag 0, one flag for the
        warpgroup's 64 rows so the branch on it is uniform); the output and the log-sum-exp use the
        same maximum as the sums, so they are unchanged."""
        BN: gl.constexpr = sc.shape[1]
        if tok0 + BN > end:  # the partial last block
            cols = tok0 + gl.arange(0, BN, layout=gl.SliceLayout(0, sc.type.layout))
            sc = gl.where((cols < end)[None, :], sc, float("-inf"))
        if LAZY:
            m_new, grow = _lazy_max(m_i, gl.max(sc, axis=1) * score_scale)
        else:
            grow = 1
            m_new = gl.maximum(m_i, gl.max(sc, axis=1) * score_scale)
        p = gl.exp2(sc * score_scale - m_new[:, None])
        alpha = gl.exp2(m_i - m_new)
        return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1), grow

    @gluon.jit
    def _lazy_max(m_ref, m_blk):
        """The lazy rescale's running maximum against ``m_ref`` for block maxima ``m_blk``: moved
        (to their row-wise maximum) only when some row's passes it by more than the slack, and
        whether it moved, one scalar for the warpgroup's rows."""
        grow = gl.max((m_blk > m_ref + _LAZY_THRESHOLD).to(gl.int32), axis=0)
        if grow != 0:
            m_new = gl.maximum(m_ref, m_blk)
        else:
            m_new = m_ref
        return m_new, grow

    @gluon.jit
    def _publish(p, alpha, j, p_bufs, alpha_smem, p_ready, p_free, flag_smem=None, grow=1):
        """P_j (in P's buffer dtype, returned) and its rescale factor into buffer j % NP once its
        previous reader freed it (``p_free``'s phase), with ``flag_smem`` whether it rescaled,
        fenced for the products, then ``p_ready``."""
        NP: gl.constexpr = p_bufs.shape[0]
        pb = j % NP
        mbarrier.wait(p_free.index(pb), ((j // NP) & 1) ^ 1)
        p16 = p.to(p_bufs.dtype)
        p_bufs.index(pb).store(p16)
        alpha_smem.index(pb).store(alpha)
        if flag_smem is not None:
            flag_smem.index(pb).store(gl.full([1], grow, gl.int32, _FLAG_LAYOUT))
        fence_async_shared()
        release(p_ready.index(pb))
        return p16

    @gluon.jit
    def _read_flag(flag_smem, pb):
        """``_publish``'s flag of buffer pb, as a scalar the whole warpgroup holds."""
        return gl.max(flag_smem.index(pb).load(_FLAG_LAYOUT), axis=0)

    @gluon.jit
    def _write_out_scorer(acc, l_i, m_i, l_smem, l_ready, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale,
                          layout: gl.constexpr, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr):
        """Consumer 0's end: its row sums published for consumer 1, then its output columns
        [0, acc's width) and the LSE written."""
        l_smem.store(l_i)
        release(l_ready)
        row: gl.constexpr = gl.SliceLayout(1, layout)
        _write_out(acc, gl.convert_layout(l_i, row), gl.convert_layout(m_i, row), O, LSE, OP, LP, b, s, n_blocks,
                   stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh,
                   out_scale, 0, layout, SINGLE, STORE_LSE, True)

    @gluon.jit
    def _write_out_l(acc, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, COL0: gl.constexpr,
                     layout: gl.constexpr, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr):
        """``_write_out`` for consumer 1's columns, with consumer 0's row sums from shared memory
        (the caller waited for them); consumer 0 writes the LSE."""
        l_i = l_smem.load(gl.SliceLayout(1, layout))
        _write_out(acc, l_i, l_i, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                   stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, COL0, layout, SINGLE,
                   STORE_LSE, False)
