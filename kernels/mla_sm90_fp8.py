"""The fp8 e4m3 cache's Hopper MLA decode split kernel in Gluon (``kernels.mla_sm90``'s fp8 path,
``mla_decode``'s default for fp8 caches wherever it runs; its contract, launch and configuration
live there: ``launch_config_fp8``, ``smem_bytes_fp8``, ``mla_sm90_split``).

Hopper's 8-bit ``wgmma`` takes K-major operands only, and V = the latent rows is N-major in P V, so
the products stay 16-bit: the producer warp TMA-loads fp8 key blocks into a ring of ``STAGES``, and
each consumer warpgroup converts its output columns of the next block (consumer 0 the rope columns
too) into a ring of ``HSTAGES`` fp16 blocks the products read (exact: every e4m3 value is an fp16
value), rows past the sequence written as zeros; Q is staged in fp16 and P is fp16."""

from __future__ import annotations

from kernels.sm90_common import HAVE_GLUON

if HAVE_GLUON:
    from kernels.mla_sm90_parts import (_PRODUCER_REGS, _producer, _qk, _softmax_publish, _span, _stage_q,
                                        _write_out_l, _write_out_scorer)
    from kernels.sm90_common import (fence_async_shared, gl, gluon, half_store_layout, mbarrier, release,
                                     warpgroup_mma, warpgroup_mma_wait, wgmma_layout)
    from kernels.sm90_common import cta_barrier as _cta_barrier

    @gluon.jit
    def _to_half(src, dst, valid):
        """An fp8 [rows, W] slice of a key block -> fp16 (exact: every e4m3 value is an fp16 one),
        128 columns at a time, 8 values a thread (``half_store_layout``: conflict-free stores); rows
        >= ``valid`` (past the sequence: the slot may hold anything, NaN included) -> 0."""
        W: gl.constexpr = src.shape[1]
        CW: gl.constexpr = 128 if W >= 128 else W
        blk: gl.constexpr = half_store_layout(CW)
        rows = gl.arange(0, src.shape[0], layout=gl.SliceLayout(1, blk))
        for i in gl.static_range(W // CW):
            x = src.slice(i * CW, CW, dim=1).load(blk).to(gl.float16)
            if valid < src.shape[0]:
                x = gl.where((rows < valid)[:, None], x, gl.zeros_like(x))
            dst.slice(i * CW, CW, dim=1).store(x)

    @gluon.jit
    def _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, c, start, end,
                    STAGES: gl.constexpr, HSTAGES: gl.constexpr, C0: gl.constexpr, C1: gl.constexpr,
                    PE: gl.constexpr):
        """This warpgroup's share of key block c, latent columns [C0, C1) and, with ``PE``, the rope
        columns: from its fp8 slot into fp16 buffer c % HSTAGES once the products of block
        c - HSTAGES are past it (with one fp16 block, the caller converts after its own product
        of block c - 1 retired: each warpgroup overwrites only the columns it reads, and the scores
        that read them all precede P); then the slot is freed and the buffer's readiness signalled."""
        fs = c % STAGES
        hs = c % HSTAGES
        mbarrier.wait(f_ready.index(fs), (c // STAGES) & 1)
        if HSTAGES > 1:
            mbarrier.wait(h_free.index(hs), ((c // HSTAGES) & 1) ^ 1)  # the first pass is free
        BN: gl.constexpr = f_lat.shape[1]
        valid = end - (start + c * BN)
        _to_half(f_lat.index(fs).slice(C0, C1 - C0, dim=1), h_lat.index(hs).slice(C0, C1 - C0, dim=1), valid)
        if PE:
            _to_half(f_pe.index(fs), h_pe.index(hs), valid)
        fence_async_shared()
        release(f_empty.index(fs))
        mbarrier.arrive(h_ready.index(hs))

    @gluon.jit
    def _f8_scorer(q_smem, q_pe, f_lat, f_pe, h_lat, h_pe, p_bufs, alpha_smem, l_smem, f_ready, f_empty, h_ready,
                   h_free, p_ready, p_free, l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob,
                   stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk,
                   score_scale, out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
                   HSTAGES: gl.constexpr, LEFT: gl.constexpr):
        """The fp8 path's consumer 0: per key block the scores (fp16 products), the softmax, P for
        consumer 1, output columns [0, LEFT) with P from registers; while that product runs, its
        share of the next block's conversion (with one fp16 block: after it)."""
        BN: gl.constexpr = f_lat.shape[1]
        s_layout: gl.constexpr = wgmma_layout(BN)
        o_layout: gl.constexpr = wgmma_layout(LEFT)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        b, s, start, end, n_blocks = _span(SEQ, chunk, BN)
        _stage_q(q_smem, q_pe, Q + b.to(gl.int64) * stride_qb + gl.program_id(0) * 64 * stride_qh, stride_qh)
        acc = gl.zeros([64, LEFT], gl.float32, o_layout)
        m_i = gl.full([64], -1.0e30, gl.float32, row_s)
        l_i = gl.zeros([64], gl.float32, row_s)
        sc = gl.zeros([64, BN], gl.float32, s_layout)
        if n_blocks > 0:
            _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, 0, start, end, STAGES, HSTAGES,
                        0, LEFT, True)
        for j in range(n_blocks):
            hs = j % HSTAGES
            mbarrier.wait(h_ready.index(hs), (j // HSTAGES) & 1)
            s_tok = _qk(q_smem, q_pe, h_lat, h_pe, hs, sc)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            # (the converted rows past the sequence are zeros)
            acc, p_op, m_i, l_i = _softmax_publish(sc, m_i, l_i, acc, j, start + j * BN, end, score_scale, p_bufs,
                                                   alpha_smem, p_ready, p_free, p_layout)
            o_tok = warpgroup_mma(p_op, h_lat.index(hs).slice(0, LEFT, dim=1), acc, is_async=True)
            if HSTAGES > 1 and j + 1 < n_blocks:  # under the product: this warpgroup's share of the next block
                _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, j + 1, start, end, STAGES,
                            HSTAGES, 0, LEFT, True)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
            if HSTAGES > 1:
                release(h_free.index(hs))
            elif j + 1 < n_blocks:  # one fp16 block: its columns [0, LEFT) and rope are free now
                _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, j + 1, start, end, STAGES,
                            HSTAGES, 0, LEFT, True)
        _write_out_scorer(acc, l_i, m_i, l_smem, l_ready, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale,
                          o_layout, SINGLE, STORE_LSE)

    @gluon.jit
    def _f8_right(f_lat, f_pe, h_lat, h_pe, p_bufs, alpha_smem, l_smem, f_ready, f_empty, h_ready, h_free, p_ready,
                  p_free, l_ready, SEQ, O, LSE, OP, LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                  stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, out_scale, SINGLE: gl.constexpr,
                  STORE_LSE: gl.constexpr, STAGES: gl.constexpr, HSTAGES: gl.constexpr, LEFT: gl.constexpr):
        """The fp8 path's consumer 1: output columns [LEFT, 512) with P from shared memory; while
        that product runs (with one fp16 block: after it), its share (the same columns) of the next
        block's conversion."""
        BN: gl.constexpr = f_lat.shape[1]
        NP: gl.constexpr = p_bufs.shape[0]
        W: gl.constexpr = 512 - LEFT
        la: gl.constexpr = wgmma_layout(W)
        b, s, start, end, n_blocks = _span(SEQ, chunk, BN)
        acc = gl.zeros([64, W], gl.float32, la)
        if n_blocks > 0:
            _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, 0, start, end, STAGES, HSTAGES,
                        LEFT, 512, False)
        for j in range(n_blocks):
            hs = j % HSTAGES
            pb = j % NP
            mbarrier.wait(h_ready.index(hs), (j // HSTAGES) & 1)  # consumer 0's share of the block too
            mbarrier.wait(p_ready.index(pb), (j // NP) & 1)
            alpha = alpha_smem.index(pb).load(gl.SliceLayout(1, la))
            o_tok = warpgroup_mma(p_bufs.index(pb), h_lat.index(hs).slice(LEFT, W, dim=1), acc * alpha[:, None],
                                  is_async=True)
            if HSTAGES > 1 and j + 1 < n_blocks:
                _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, j + 1, start, end, STAGES,
                            HSTAGES, LEFT, 512, False)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            _cta_barrier()
            mbarrier.arrive(p_free.index(pb))
            if HSTAGES > 1:
                mbarrier.arrive(h_free.index(hs))
            elif j + 1 < n_blocks:
                _f8_convert(f_lat, f_pe, h_lat, h_pe, f_ready, f_empty, h_ready, h_free, j + 1, start, end, STAGES,
                            HSTAGES, LEFT, 512, False)
        mbarrier.wait(l_ready, 0)
        _write_out_l(acc, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, LEFT, la, SINGLE, STORE_LSE)

    @gluon.jit
    def _mla_sm90_fp8_kernel(kv_desc, pe_desc, Q, BT, SEQ, O, LSE, OP, LP,
                             stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                             stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, PAGE, score_scale, out_scale,
                             SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
                             HSTAGES: gl.constexpr, LEFT: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                             num_warps: gl.constexpr):
        """The fp8 cache: grid (heads / 64, B, splits). The producer warp TMA-loads each key
        block (``kv_desc``'s rows, fp8) into a ring of ``STAGES``; both consumer warpgroups
        convert their output columns of it (consumer 0 the rope columns too) into a ring of
        ``HSTAGES`` fp16 blocks, which the fp16 products read; Q is staged in fp16."""
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        BN: gl.constexpr = kv_desc.block_type.shape[0]
        DL: gl.constexpr = kv_desc.block_type.shape[1]
        gl.static_assert(DL == 512, "the latent part is 512 wide")
        f16: gl.constexpr = gl.float16
        q_smem = gl.allocate_shared_memory(f16, [64, DL], gl.NVMMASharedLayout.get_default_for([64, DL], f16))
        q_pe = gl.allocate_shared_memory(f16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], f16))
        f_lat = gl.allocate_shared_memory(kv_desc.dtype, [STAGES, BN, DL], kv_desc.layout)
        f_pe = gl.allocate_shared_memory(pe_desc.dtype, [STAGES, BN, 64], pe_desc.layout)
        h_lat = gl.allocate_shared_memory(f16, [HSTAGES, BN, DL], gl.NVMMASharedLayout.get_default_for([BN, DL], f16))
        h_pe = gl.allocate_shared_memory(f16, [HSTAGES, BN, 64], gl.NVMMASharedLayout.get_default_for([BN, 64], f16))
        NP: gl.constexpr = 1 if HSTAGES == 1 else 2  # with one fp16 block consumer 0 cannot run a block ahead
        p_bufs = gl.allocate_shared_memory(f16, [NP, 64, BN], gl.NVMMASharedLayout.get_default_for([64, BN], f16))
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        alpha_smem = gl.allocate_shared_memory(gl.float32, [NP, 64], plain)
        l_smem = gl.allocate_shared_memory(gl.float32, [64], plain)
        f_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        f_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        h_ready = gl.allocate_shared_memory(gl.int64, [HSTAGES, 1], mbarrier.MBarrierLayout())
        h_free = gl.allocate_shared_memory(gl.int64, [HSTAGES, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [NP, 1], mbarrier.MBarrierLayout())
        l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(f_ready.index(i), count=1)
            mbarrier.init(f_empty.index(i), count=2)  # both warpgroups converted their share
        for i in gl.static_range(HSTAGES):
            mbarrier.init(h_ready.index(i), count=2)
            mbarrier.init(h_free.index(i), count=2)
        for i in gl.static_range(NP):
            mbarrier.init(p_ready.index(i), count=1)
            mbarrier.init(p_free.index(i), count=1)
        mbarrier.init(l_ready, count=1)
        gl.warp_specialize([
            (_f8_scorer, (q_smem, q_pe, f_lat, f_pe, h_lat, h_pe, p_bufs, alpha_smem, l_smem, f_ready, f_empty,
                          h_ready, h_free, p_ready, p_free, l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh,
                          stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb,
                          stride_lsh, chunk, score_scale, out_scale, SINGLE, STORE_LSE, STAGES, HSTAGES, LEFT)),
            (_f8_right, (f_lat, f_pe, h_lat, h_pe, p_bufs, alpha_smem, l_smem, f_ready, f_empty, h_ready, h_free,
                         p_ready, p_free, l_ready, SEQ, O, LSE, OP, LP, stride_ob, stride_oh, stride_pb, stride_ph,
                         stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, out_scale, SINGLE,
                         STORE_LSE, STAGES, HSTAGES, LEFT)),
            (_producer, (kv_desc, pe_desc, f_lat, f_pe, f_ready, f_empty, SEQ, BT, stride_bt, chunk, PAGE, STAGES)),
        ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])
