"""MLA paged decode for Hopper (sm_90) in Gluon, the "seesaw" schedule of FlashMLA's sm90 dense
decode: two warpgroups score alternate key blocks, each owns half the output columns, and each
block's P crosses to the other warpgroup through shared memory.

Same contract, grid and outputs as ``kernels.mla_sm90``'s split kernel (``mla_sm90_split`` runs
this one with ``config={"SCHEDULE": "seesaw"}``). Why a second schedule: there, one warpgroup
scores every block and the tensor pipe idles while it runs the softmax between its dependent
products (Nsight Compute, race 10: tensor pipe busy 58.8% of cycles against FlashMLA's 65.4%, the
same busy cycles; kernels/README.md, MLA decode). Here key blocks come in pairs, block a = 2i in
slot 0 and b = 2i + 1 in slot 1, with m the running row maximum before the pair; S_a and S_b
were issued at the end of the previous pair (before the loop for the first):

- warpgroup 0 (output columns [0, 256)): m_a = max(m, rowmax S_a), published; P_a =
  exp2(S_a - m_a); O_L = O_L exp2(m - m_a) + P_a V_a[:, :256] (P in registers); once warpgroup 1
  published exp2(m_a - m_b): P_a exp2(m_a - m_b) published (into block a's rope rows, read only
  by a's scores); once P_b is in: O_L = O_L exp2(m_a - m_b) + P_b V_b[:, :256] (P from shared
  memory), and beside that product the next pair's S_a;
- warpgroup 1 (output columns [256, 512)), beside it: with m_a, m_b = max(m_a, rowmax S_b), the
  rescale factor, then P_b = exp2(S_b - m_b) published; O_R = O_R exp2(m - m_b) + P_b V_b[:, 256:]
  (P in registers), then + the rescaled P_a V_a[:, 256:] (P from shared memory); then the next
  pair's S_b, its right half first.

While one warpgroup runs its softmax the other's products keep the tensor pipe busy; each
warpgroup runs 576 + 2 x 256 columns of products per pair, the same. Both keep their own row
sums (the P they computed), added at the end. There is no producer warp: each [64, 64] tile of a
slot (8 latent, 1 rope) completes on its own mbarrier, and each half of a slot (latent columns
[0, 256); the rest with the rope) is TMA-loaded for the next pair by the warpgroup that reads it
last, right after that read retires: the left half of a after warpgroup 0's P_a V, the right half
of b after warpgroup 1's P_b V (both mid-pair), the other two at the pair's end; each score
product starts with the half loaded first and waits tile by tile (FlashMLA's order). Two
warpgroups alone leave 255 registers a thread (the split kernel's consumers have 232 beside the
producer warp). The slot indices come from a loop-variant value (``_ss_slots``) so that Triton
does not hoist the 72 score operand descriptors out of the loop and spill them, as race 11's build
did. A pair without block b (an odd block count) runs b's products on zeroed rows with P = 0; a
partial last block's rows past the sequence are zeroed before the products read them (the slots
may hold NaN).

Races (kernels/README.md, "Race 11: FlashMLA's seesaw schedule"): race 11's first build (a
producer warp, fixed slots) 0.86-0.90x the split schedule's speed; race 13's (no producer warp,
the slots swapping roles, scores at the start of a pair behind half-block barriers) 0.92-0.96x;
race 14 (this order, half-block or per-tile barriers) 0.87-0.95x; race 14b (this build: P_b's
hand-over split from the rescale factor's, warpgroup 1 scoring its right half first, per-tile
barriers) 0.94-1.01x, 0.81-0.89x FlashMLA's. So ``mla_decode`` keeps the split schedule unless
asked.

Gluon kernels compile only for a GPU: tests/kernels/test_mla_sm90.py compiles this one for sm_90a
on any machine (``kernels.bench.sm90.mla_sm90_build``) and checks it against the float64 reference
on a Hopper GPU."""

from __future__ import annotations

from kernels.mla_sm90_parts import HAVE_GLUON

if HAVE_GLUON:
    from kernels.mla_sm90_parts import _FLAG_LAYOUT, _lazy_max, _read_flag, _span, _stage_q, _write_out, _zero_tail
    from kernels.sm90_common import fence_async_shared, gl, gluon, mbarrier, release, warpgroup_mma, warpgroup_mma_wait
    from kernels.sm90_common import tma_load as _tma_load
    from kernels.sm90_common import wgmma_layout

    # both warpgroups' register layouts: a [64, 64] score block, a [64, 256] output half, P as the
    # A operand of the P V product
    _S_LAYOUT = gl.constexpr(wgmma_layout(64))
    _O_LAYOUT = gl.constexpr(wgmma_layout(256))
    _P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_O_LAYOUT.value, k_width=2))
    _ROW_S = gl.constexpr(gl.SliceLayout(1, _S_LAYOUT.value))  # a score block's rows
    _ROW_O = gl.constexpr(gl.SliceLayout(1, _O_LAYOUT.value))

    @gluon.jit
    def _ss_row(bt, tok, end, PAGE):
        """The cache row of token ``tok`` (a block's first) through the block table; 0 past
        ``end`` (the table may end there)."""
        return (gl.load(bt + tok // PAGE, mask=tok < end, other=0) * PAGE + tok % PAGE).to(gl.int32)

    @gluon.jit
    def _ss_slots(tok_a):
        """Block a's and block b's slots: 0 and 1 in every pair, computed from the pair's first
        token (zero below 2^30 tokens, which no sequence reaches) so that the score products'
        operand descriptors are not loop-invariant: Triton 3.6 hoists loop-invariant ones out of
        the loop, 72 of them, and spills them (race 11b)."""
        sa = (tok_a >> 30) & 1
        return sa, 1 - sa

    @gluon.jit
    def _ss_pair(i, start, end, bt, PAGE):
        """Pair i's barrier phase, block a's and block b's slots, their first tokens, and the next
        pair's cache rows (read now, used after this pair's products)."""
        tok_a = start + 2 * i * 64
        sa, sb = _ss_slots(tok_a)
        return (i & 1, sa, sb, tok_a, tok_a + 64, _ss_row(bt, tok_a + 128, end, PAGE),
                _ss_row(bt, tok_a + 192, end, PAGE))

    @gluon.jit
    def _ss_load(tile_desc, row, k_half, k_pe, ready, st, HALF: gl.constexpr):
        """Half ``HALF`` of a key block (0: latent columns [0, 256); 1: [256, 512) and the rope)
        into slot st, one [64, 64] tile at a time, each completing on its own mbarrier
        (ready[9 st + tile]; the rope is tile 8)."""
        nb: gl.constexpr = tile_desc.block_type.nbytes
        for t in gl.static_range(4):
            mbarrier.expect(ready.index(9 * st + 4 * HALF + t), nb)
            _tma_load(tile_desc, [row, 256 * HALF + 64 * t], ready.index(9 * st + 4 * HALF + t),
                      k_half.index(st).slice(64 * t, 64, dim=1))
        if HALF == 1:
            mbarrier.expect(ready.index(9 * st + 8), nb)
            _tma_load(tile_desc, [row, 512], ready.index(9 * st + 8), k_pe.index(st))

    @gluon.jit
    def _ss_qk(q_smem, q_pe, k_half, k_pe, ready, st, ph, acc, HALF: gl.constexpr, FIRST: gl.constexpr):
        """Issue half ``HALF`` of S = Q K^T of slot st (0: latent columns [0, 256); 1: [256, 512)
        and the rope), one 64-column tile a product as each lands, into ``acc`` (``FIRST``: the
        half that starts the sum). Returns the token."""
        for t in gl.static_range(4):
            mbarrier.wait(ready.index(9 * st + 4 * HALF + t), ph)
            acc = warpgroup_mma(q_smem.slice(256 * HALF + 64 * t, 64, dim=1),
                                k_half.index(st).slice(64 * t, 64, dim=1).permute((1, 0)), acc,
                                use_acc=not (FIRST and t == 0), is_async=True)
        if HALF == 1:
            mbarrier.wait(ready.index(9 * st + 8), ph)
            acc = warpgroup_mma(q_pe, k_pe.index(st).permute((1, 0)), acc, is_async=True)
        return acc

    @gluon.jit
    def _ss_scores(q_smem, q_pe, k_lo, k_hi, k_pe, ready, st, ph, RIGHT_FIRST: gl.constexpr):
        """S = Q K^T of slot st, both halves as their tiles land (``RIGHT_FIRST``: the right half
        and the rope first), waited."""
        sc = gl.zeros([64, 64], gl.float32, _S_LAYOUT)
        if RIGHT_FIRST:
            tok = _ss_qk(q_smem, q_pe, k_hi, k_pe, ready, st, ph, sc, 1, True)
            tok = _ss_qk(q_smem, q_pe, k_lo, k_pe, ready, st, ph, tok, 0, False)
        else:
            tok = _ss_qk(q_smem, q_pe, k_lo, k_pe, ready, st, ph, sc, 0, True)
            tok = _ss_qk(q_smem, q_pe, k_hi, k_pe, ready, st, ph, tok, 1, False)
        return warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

    @gluon.jit
    def _ss_state():
        """A warpgroup's start: its 256 output columns, row maximum and row sum, and an empty
        score block."""
        return (gl.zeros([64, 256], gl.float32, _O_LAYOUT), gl.full([64], -1.0e30, gl.float32, _ROW_S),
                gl.zeros([64], gl.float32, _ROW_S), gl.zeros([64, 64], gl.float32, _S_LAYOUT))

    @gluon.jit
    def _ss_mask(sc, tok0, end):
        """Scores of keys past ``end`` -> -inf (a partial last block, or an absent block b)."""
        if tok0 + sc.shape[1] > end:
            cols = tok0 + gl.arange(0, sc.shape[1], layout=gl.SliceLayout(0, sc.type.layout))
            sc = gl.where((cols < end)[None, :], sc, float("-inf"))
        return sc

    @gluon.jit
    def _ss_finish(acc, l_i, m_i, l_smem, l_ready, ME: gl.constexpr, O, LSE, OP, LP, b, s, n_blocks, stride_ob,
                   stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh,
                   out_scale, COL0: gl.constexpr, layout: gl.constexpr, SINGLE: gl.constexpr,
                   STORE_LSE: gl.constexpr):
        """This warpgroup's row sums published (slot ``ME``), the other's added once published,
        then its output columns written (warpgroup 0 the LSE too)."""
        l_smem.index(ME).store(l_i)
        release(l_ready.index(ME))
        mbarrier.wait(l_ready.index(1 - ME), 0)
        row: gl.constexpr = gl.SliceLayout(1, layout)
        l_all = gl.convert_layout(l_i, row) + l_smem.index(1 - ME).load(row)
        _write_out(acc, l_all, gl.convert_layout(m_i, row), O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                   stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, COL0,
                   layout, SINGLE, STORE_LSE, ME == 0)

    @gluon.jit
    def _ss_left(tile_desc, q_smem, q_pe, k_lo, k_hi, k_pe, p_smem, m_smem, f_smem, l_smem, ready, q_ready,
                 ma_ready, f_ready, pb_ready, pa_ready, l_ready, BT, stride_bt, PAGE, Q, SEQ, O, LSE, OP, LP, stride_qb,
                 stride_qh, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb,
                 stride_lsh, chunk, score_scale, out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr,
                 LAZY: gl.constexpr, flag_smem):
        """Warpgroup 0: stages Q; per pair block a's softmax and output columns [0, 256), then the
        next pair's block a's scores. ``LAZY``: m_a moves only past the lazy rescale's slack
        (``_softmax_step``), its flag published with m_a, and each rescale runs only when its
        maximum moved."""
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        bt = BT + b.to(gl.int64) * stride_bt
        if n_blocks > 0:  # the first pair's blocks; later ones are loaded by their halves' last readers
            row = _ss_row(bt, start, end, PAGE)
            _ss_load(tile_desc, row, k_lo, k_pe, ready, 0, 0)
            _ss_load(tile_desc, row, k_hi, k_pe, ready, 0, 1)
            if n_blocks > 1:
                row = _ss_row(bt, start + 64, end, PAGE)
                _ss_load(tile_desc, row, k_lo, k_pe, ready, 1, 0)
                _ss_load(tile_desc, row, k_hi, k_pe, ready, 1, 1)
        _stage_q(q_smem, q_pe, Q + b.to(gl.int64) * stride_qb + gl.program_id(0) * 64 * stride_qh, stride_qh)
        mbarrier.arrive(q_ready)
        acc, m_i, l_i, sc = _ss_state()
        if n_blocks > 0:
            sc = _ss_scores(q_smem, q_pe, k_lo, k_hi, k_pe, ready, 0, 0, False)
        for i in range(gl.cdiv(n_blocks, 2)):
            ph, sa, sb, tok_a, tok_b, row_a2, row_b2 = _ss_pair(i, start, end, bt, PAGE)
            sc = _ss_mask(sc, tok_a, end)
            if LAZY:
                m_a, grow_a = _lazy_max(m_i, gl.max(sc, axis=1) * score_scale)
            else:
                m_a = gl.maximum(m_i, gl.max(sc, axis=1) * score_scale)
            p = gl.exp2(sc * score_scale - m_a[:, None])
            alpha_a = gl.exp2(m_i - m_a)
            rs_a = gl.sum(p, axis=1)
            m_smem.index(0).store(m_a)
            if LAZY:
                flag_smem.index(0).store(gl.full([1], grow_a, gl.int32, _FLAG_LAYOUT))
            release(ma_ready)
            if LAZY:
                if grow_a != 0:
                    acc = acc * gl.convert_layout(alpha_a, _ROW_O)[:, None]
            else:
                acc = acc * gl.convert_layout(alpha_a, _ROW_O)[:, None]
            if tok_b > end:
                _zero_tail(k_lo.index(sa), end - tok_a)
            p16 = p.to(k_lo.dtype)  # kept in 16 bits (the fp32 P would hold 32 more registers through P V)
            o_tok = warpgroup_mma(gl.convert_layout(p16, _P_LAYOUT), k_lo.index(sa), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            if tok_a + 128 < end:  # block a's left half read (its scores, this P V): the next a's
                _ss_load(tile_desc, row_a2, k_lo, k_pe, ready, sa, 0)
            mbarrier.wait(f_ready, ph)  # warpgroup 1's rescale factor and m_b
            alpha_bs = f_smem.load(_ROW_S)
            grow_b = _read_flag(flag_smem, 1) if LAZY else 1
            if grow_b != 0:
                k_pe.index(sa).store((p16.to(gl.float32) * alpha_bs[:, None]).to(k_pe.dtype))  # P_a in m_b's units
            else:
                k_pe.index(sa).store(p16)
            m_i = m_smem.index(1).load(_ROW_S)
            fence_async_shared()
            release(pa_ready)
            l_i = (l_i * alpha_a + rs_a) * alpha_bs
            if tok_b + 64 > end:  # block b partial or absent: its rows past the end zeroed
                _zero_tail(k_lo.index(sb), end - tok_b)
            mbarrier.wait(pb_ready, ph)  # warpgroup 1's P_b
            if grow_b != 0:
                acc = acc * f_smem.load(_ROW_O)[:, None]
            o_tok = warpgroup_mma(p_smem, k_lo.index(sb), acc, is_async=True)
            sc = gl.zeros([64, 64], gl.float32, _S_LAYOUT)
            if tok_a + 128 < end:  # the next a's scores, as its tiles land, beside this P V
                s_tok = _ss_qk(q_smem, q_pe, k_lo, k_pe, ready, sa, ph ^ 1, sc, 0, True)
                acc = warpgroup_mma_wait(num_outstanding=4, deps=(o_tok,))  # the 4 score products still run
                if tok_b + 128 < end:  # block b's left half read (warpgroup 1's scores, this P V): the next b's
                    _ss_load(tile_desc, row_b2, k_lo, k_pe, ready, sb, 0)
                s_tok = _ss_qk(q_smem, q_pe, k_hi, k_pe, ready, sa, ph ^ 1, s_tok, 1, False)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        _ss_finish(acc, l_i, m_i, l_smem, l_ready, 0, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb,
                   stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 0, _O_LAYOUT,
                   SINGLE, STORE_LSE)

    @gluon.jit
    def _ss_right(tile_desc, q_smem, q_pe, k_lo, k_hi, k_pe, p_smem, m_smem, f_smem, l_smem, ready, q_ready,
                  ma_ready, f_ready, pb_ready, pa_ready, l_ready, BT, stride_bt, PAGE, SEQ, O, LSE, OP, LP, stride_ob,
                  stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk,
                  score_scale, out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, LAZY: gl.constexpr,
                  flag_smem):
        """Warpgroup 1: per pair block b's softmax and output columns [256, 512), then the next
        pair's block b's scores (``LAZY``: m_b moves only past the slack, its flag published with
        the rescale factor; its accumulators rescaled only when m_a or m_b moved)."""
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        acc, m_i, l_i, sc = _ss_state()
        bt = BT + b.to(gl.int64) * stride_bt
        mbarrier.wait(q_ready, 0)
        if n_blocks > 1:
            sc = _ss_scores(q_smem, q_pe, k_lo, k_hi, k_pe, ready, 1, 0, True)
        for i in range(gl.cdiv(n_blocks, 2)):
            ph, sa, sb, tok_a, tok_b, row_a2, row_b2 = _ss_pair(i, start, end, bt, PAGE)
            sc = _ss_mask(sc, tok_b, end)  # an absent block b: all masked, P_b = 0
            mbarrier.wait(ma_ready, ph)
            m_a = m_smem.index(0).load(_ROW_S)
            if LAZY:
                m_b, grow_b = _lazy_max(m_a, gl.max(sc, axis=1) * score_scale)
                grow = grow_b + _read_flag(flag_smem, 0)
            else:
                m_b = gl.maximum(m_a, gl.max(sc, axis=1) * score_scale)
                grow = 1
            p = gl.exp2(sc * score_scale - m_b[:, None])
            alpha_b = gl.exp2(m_a - m_b)
            alpha = gl.exp2(m_i - m_a) * alpha_b
            f_smem.store(alpha_b)
            m_smem.index(1).store(m_b)
            if LAZY:
                flag_smem.index(1).store(gl.full([1], grow_b, gl.int32, _FLAG_LAYOUT))
            release(f_ready)  # warpgroup 0 rescales P_a with it while P_b is stored
            p16 = p.to(k_pe.dtype)
            p_smem.store(p16)
            fence_async_shared()
            release(pb_ready)
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_b
            if tok_b + 64 > end:
                _zero_tail(k_hi.index(sb), end - tok_b)
            p_op = gl.convert_layout(p16, _P_LAYOUT)
            if grow != 0:
                acc = acc * gl.convert_layout(alpha, _ROW_O)[:, None]
            o_tok = warpgroup_mma(p_op, k_hi.index(sb), acc, is_async=True)
            mbarrier.wait(pa_ready, ph)  # warpgroup 0's rescaled P_a
            if tok_b > end:
                _zero_tail(k_hi.index(sa), end - tok_a)
            o_tok = warpgroup_mma(k_pe.index(sa), k_hi.index(sa), o_tok, is_async=True)
            warpgroup_mma_wait(num_outstanding=1, deps=(p_op,))  # P_b V_b retired: b's right half read
            if tok_b + 128 < end:  # the next b's
                _ss_load(tile_desc, row_b2, k_hi, k_pe, ready, sb, 1)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            if tok_a + 128 < end:  # block a's right half (its scores, the rescaled P_a, this P V) read: the next a's
                _ss_load(tile_desc, row_a2, k_hi, k_pe, ready, sa, 1)
            sc = gl.zeros([64, 64], gl.float32, _S_LAYOUT)
            if tok_b + 128 < end:  # the next b's scores as its tiles land: the right half (loaded first) first
                sc = _ss_scores(q_smem, q_pe, k_lo, k_hi, k_pe, ready, sb, ph ^ 1, True)
        _ss_finish(acc, l_i, m_i, l_smem, l_ready, 1, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb,
                   stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 256, _O_LAYOUT,
                   SINGLE, STORE_LSE)

    @gluon.jit
    def _mla_sm90_seesaw_kernel(tile_desc, Q, BT, SEQ, O, LSE, OP, LP,
                                stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_pb, stride_ph,
                                stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, PAGE, score_scale,
                                out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, LAZY: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Grid (heads / 64, B, splits). ``tile_desc``: the cache as a [rows, 576] matrix in [64, 64]
        boxes (a key block is 9 of them); the default partition is warpgroup 0, a 4-warp worker
        warpgroup 1; each issues the TMA loads of the halves it reads last (two warpgroups, no
        producer warp: 256 registers a thread)."""
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        gl.static_assert(tile_desc.block_type.shape[1] == 64, "the cache rows load in [64, 64] tiles")
        dtype: gl.constexpr = tile_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [64, 512], tile_desc.layout)
        q_pe = gl.allocate_shared_memory(dtype, [64, 64], tile_desc.layout)
        k_lo = gl.allocate_shared_memory(dtype, [2, 64, 256], tile_desc.layout)
        k_hi = gl.allocate_shared_memory(dtype, [2, 64, 256], tile_desc.layout)
        k_pe = gl.allocate_shared_memory(dtype, [2, 64, 64], tile_desc.layout)
        p_smem = gl.allocate_shared_memory(dtype, [64, 64], tile_desc.layout)  # P_b, for warpgroup 0
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        m_smem = gl.allocate_shared_memory(gl.float32, [2, 64], plain)  # m_a, m_b
        f_smem = gl.allocate_shared_memory(gl.float32, [64], plain)  # exp2(m_a - m_b)
        l_smem = gl.allocate_shared_memory(gl.float32, [2, 64], plain)
        bar: gl.constexpr = mbarrier.MBarrierLayout()
        ready = gl.allocate_shared_memory(gl.int64, [18, 1], bar)  # slot x 9 tiles
        l_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
        ma_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
        f_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
        pb_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
        pa_ready = gl.allocate_shared_memory(gl.int64, [1], bar)
        for i in gl.static_range(18):
            mbarrier.init(ready.index(i), count=1)
        for i in gl.static_range(2):
            mbarrier.init(l_ready.index(i), count=1)
        mbarrier.init(q_ready, count=1)
        mbarrier.init(ma_ready, count=1)
        mbarrier.init(f_ready, count=1)
        mbarrier.init(pb_ready, count=1)
        mbarrier.init(pa_ready, count=1)
        flag_smem = gl.allocate_shared_memory(gl.int32, [2, 1], plain)  # the lazy rescale's flags (read with LAZY)
        gl.warp_specialize([
            (_ss_left, (tile_desc, q_smem, q_pe, k_lo, k_hi, k_pe, p_smem, m_smem, f_smem, l_smem, ready,
                        q_ready, ma_ready, f_ready, pb_ready, pa_ready, l_ready, BT, stride_bt, PAGE, Q, SEQ, O, LSE,
                        OP, LP, stride_qb, stride_qh, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                        stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, score_scale, out_scale, SINGLE,
                        STORE_LSE, LAZY, flag_smem)),
            (_ss_right, (tile_desc, q_smem, q_pe, k_lo, k_hi, k_pe, p_smem, m_smem, f_smem, l_smem, ready,
                         q_ready, ma_ready, f_ready, pb_ready, pa_ready, l_ready, BT, stride_bt, PAGE, SEQ, O, LSE,
                         OP, LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                         stride_lsb, stride_lsh, chunk, score_scale, out_scale, SINGLE, STORE_LSE, LAZY,
                         flag_smem)),
        ], [4], [CONSUMER_REGS])
