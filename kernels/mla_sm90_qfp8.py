"""The fp8 e4m3 cache's Hopper MLA decode with the scores in fp8 (``kernels.mla_sm90``'s fp8 path
with ``config={"QFP8": True}``; its launch and configuration live there: ``launch_config_fp8``,
``smem_bytes_qfp8``, ``mla_sm90_split``).

The default fp8 kernel (``kernels.mla_sm90_fp8``) converts every key block to fp16 in shared
memory before its scores: the scores wait for the conversion, and each block crosses shared
memory three times (fp8 read, fp16 written, fp16 read by the product) where the bf16 kernel's
crosses once (race 10: tensor pipe 39% busy). Hopper's 8-bit ``wgmma`` takes K-major operands
only; in S = Q K^T both are (Q's rows and the cache's rows are 576 contiguous values), so here Q
is quantised to e4m3 once per program, one scale per head row (the row's largest |q| over its 576
columns / 448, as ``kernels.reference.per_token_group_quant_fp8`` with a group of 576), and the
scores are one fp8 product straight from the TMA-loaded block (half the fp16 product's tensor
time and shared-memory reads), scaled by the row's scale before the softmax. P V stays 16-bit
(V = the latent rows is N-major there): each consumer converts only its own 256 output columns of
the block into its own fp16 buffer, consumer 0 while its scores' product runs, consumer 1 under
its P V of the block before (``HSTAGES`` 2) or after it (1). Rows past the sequence are written
as zeros; their scores are masked.

The price is Q's rounding: e4m3 keeps 3 mantissa bits, so the scores carry an error of the size
the fp8 cache's own rounding gives them (on N(0, 1) data both add 3.7% relative error to the
output, 5.2% together; kernels/README.md). Hence opt-in: ``mla_decode``'s fp8 default stays the
exact-Q kernel.

``PV8`` (``config={"QFP8": True, "PV8": True}``) makes P V an fp8 product as well: P is rounded to
e4m3 (times ``P8_SCALE``) and each consumer transposes its 256 columns of the block in fp8
(``_to_vt``: the K-major B operand an 8-bit ``wgmma`` needs) instead of widening them to fp16, so
every product runs at the fp8 rate and the operand buffers take half the shared memory (4 fp8
stages fit). Both consumers read P from its published buffer: with consumer 0's P in registers
(the fp16 path's way) consumer 1's half of the output came out wrong on an H100 while consumer 0's
was right, and a one-block unit of the same transpose and register-P product was right on its own
(kernels/README.md, race 26); not root-caused. P's rounding moves the output about 1.4% on
N(0, 1) data, under Q's 3.9% (tests/kernels/test_mla_sm90_qfp8.py)."""

from __future__ import annotations

from kernels.sm90_common import HAVE_GLUON

FP8_MAX = 448.0  # largest finite e4m3 value: a row's largest |q| maps to it
# ``PV8``: P is stored in e4m3 times this power of two (P x 256 rounds as P does, and P down to
# 2^-14 stays a normal e4m3 value); the launch divides the output scale by it
P8_SCALE = 256.0

if HAVE_GLUON:
    from kernels.mla_sm90_fp8 import _to_half
    from kernels.mla_sm90_parts import _PRODUCER_REGS, _producer, _softmax_publish, _span, _write_out_l, _write_out_scorer
    from kernels.sm90_common import (fence_async_shared, gl, gluon, mbarrier, release, warpgroup_mma,
                                     warpgroup_mma_wait, wgmma_layout)
    from kernels.sm90_common import cta_barrier as _cta_barrier

    _FP8_MAX = gl.constexpr(FP8_MAX)
    _P8_SCALE = gl.constexpr(P8_SCALE)

    @gluon.jit
    def _to_vt(src, dst, valid):
        """``PV8``: an fp8 [64 tokens, W] slice of a key block transposed into ``dst`` [W, 64] (fp8,
        tokens contiguous: the K-major B operand an 8-bit P V product needs), 128 columns at a
        time, each thread an 8 x 8 tile (eight 8-byte loads, eight 8-byte stores); tokens >=
        ``valid`` (past the sequence: the slot may hold anything, NaN included) -> 0."""
        W: gl.constexpr = src.shape[1]
        blk: gl.constexpr = gl.BlockedLayout([8, 8], [2, 16], [4, 1], [1, 0])
        rows = gl.arange(0, src.shape[0], layout=gl.SliceLayout(1, blk))
        for i in gl.static_range(W // 128):
            x = src.slice(i * 128, 128, dim=1).load(blk)
            if valid < src.shape[0]:
                x = gl.where((rows < valid)[:, None], x, gl.zeros_like(x))
            dst.slice(i * 128, 128, dim=0).store(gl.permute(x, (1, 0)))

    @gluon.jit
    def _to_operand(src, dst, valid, PV8: gl.constexpr):
        """A consumer's columns of a key block into its P V operand buffer: fp16 [64, W], or with
        ``PV8`` the fp8 transpose [W, 64]."""
        if PV8:
            _to_vt(src, dst, valid)
        else:
            _to_half(src, dst, valid)

    @gluon.jit
    def _v_operand(buf, PV8: gl.constexpr):
        """The P V product's B operand [64 tokens, W] over a consumer's buffer."""
        if PV8:
            return buf.permute((1, 0))
        else:
            return buf

    @gluon.jit
    def _stage_q8(q8, q8_pe, qb, stride_qh):
        """The program's 64 query rows quantised to e4m3 into shared memory, each row with its own
        scale (its largest |q| over the 576 columns / 448): the values times 448 / that maximum,
        rounded to e4m3 (``kernels.reference.quantize_q_rows`` in the same operations); read from
        global memory twice (the row maxima, then the values); fenced for the products. Returns the
        scales, [64]."""
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
        blk64: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, blk))
        c = gl.arange(0, 128, layout=gl.SliceLayout(0, blk))
        r64 = gl.arange(0, 64, layout=gl.SliceLayout(1, blk64))
        c64 = gl.arange(0, 64, layout=gl.SliceLayout(0, blk64))
        pe_ptrs = qb + r64[:, None] * stride_qh + 512 + c64[None, :]
        amax = gl.convert_layout(gl.max(gl.abs(gl.load(pe_ptrs).to(gl.float32)), axis=1), gl.SliceLayout(1, blk))
        for i in gl.static_range(4):
            x = gl.load(qb + r[:, None] * stride_qh + i * 128 + c[None, :]).to(gl.float32)
            amax = gl.maximum(amax, gl.max(gl.abs(x), axis=1))
        # one IEEE division a row for the reciprocal (div_rn: Triton's "/" on fp32 is approximate),
        # then products, so each value rounds to the e4m3 value kernels.reference.quantize_q_rows
        # gives it (race 23's GPU tests: with "/", values on a midpoint between two e4m3 values
        # rounded the other way and moved a one-token sequence's LSE by 0.085; div_rn on every value
        # by its [64, 1] scale ran 3-10% slower and 2.4x further from the reference: div_rn does not
        # broadcast its operands)
        amax = gl.maximum(amax, 1e-30)  # a row of zeros stays zeros
        inv = gl.div_rn(gl.full_like(amax, _FP8_MAX), amax)
        scale = gl.div_rn(amax, gl.full_like(amax, _FP8_MAX))
        # the second pass's loads volatile: Triton 3.9 otherwise merges them with the first pass's and
        # keeps all 576 columns in registers across the maxima (700 bytes of spills)
        for i in gl.static_range(4):
            x = gl.load(qb + r[:, None] * stride_qh + i * 128 + c[None, :], volatile=True).to(gl.float32) * inv[:, None]
            q8.slice(i * 128, 128, dim=1).store(gl.minimum(gl.maximum(x, -_FP8_MAX), _FP8_MAX).to(q8.dtype))
        inv64 = gl.convert_layout(inv, gl.SliceLayout(1, blk64))
        x = gl.load(pe_ptrs, volatile=True).to(gl.float32) * inv64[:, None]
        q8_pe.store(gl.minimum(gl.maximum(x, -_FP8_MAX), _FP8_MAX).to(q8_pe.dtype))
        fence_async_shared()
        _cta_barrier()
        return scale

    @gluon.jit
    def _q8_scorer(q8, q8_pe, f_lat, f_pe, h_left, p_bufs, alpha_smem, l_smem, f_ready, f_empty, p_ready, p_free,
                   l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh, stride_pb, stride_ph,
                   stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, score_scale, out_scale,
                   SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr, PV8: gl.constexpr):
        """Consumer 0: per key block the scores as one fp8 product from the landed block, its output
        columns [0, 256) of the block converted to fp16 (``PV8``: transposed in fp8) while that
        product runs, the slot freed (its share), the softmax on the scores times the rows' scales,
        P for consumer 1, then O[:, :256] += P V with P from registers (``PV8``: from the buffer it was
        published in)."""
        BN: gl.constexpr = f_lat.shape[1]
        s_layout: gl.constexpr = wgmma_layout(BN, 32)
        o_layout: gl.constexpr = wgmma_layout(256, 32 if PV8 else 16)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4 if PV8 else 2)
        b, s, start, end, n_blocks = _span(SEQ, chunk, BN)
        qs = _stage_q8(q8, q8_pe, Q + b.to(gl.int64) * stride_qb + gl.program_id(0) * 64 * stride_qh, stride_qh)
        qs = gl.convert_layout(qs, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([64, 256], gl.float32, o_layout)
        m_i = gl.full([64], -1.0e30, gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
        sc = gl.zeros([64, BN], gl.float32, s_layout)
        for j in range(n_blocks):
            st = j % STAGES
            mbarrier.wait(f_ready.index(st), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q8, f_lat.index(st).permute((1, 0)), sc, use_acc=False, is_async=True)
            s_tok = warpgroup_mma(q8_pe, f_pe.index(st).permute((1, 0)), s_tok, is_async=True)
            # under the product: this block's columns [0, 256) to fp16 (the buffer's last reader,
            # block j - 1's P V, was waited for)
            _to_operand(f_lat.index(st).slice(0, 256, dim=1), h_left, end - (start + j * BN), PV8)
            fence_async_shared()
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            release(f_empty.index(st))  # (its barrier also orders the fp16 stores before the P V)
            acc, p_op, m_i, l_i = _softmax_publish(sc * qs[:, None], m_i, l_i, acc, j, start + j * BN, end,
                                                   score_scale, p_bufs, alpha_smem, p_ready, p_free, p_layout,
                                                   P_MUL=_P8_SCALE if PV8 else 1.0)
            if PV8:  # P from the buffer it was published in (P in registers: see mla_sm90_qfp8's docstring)
                o_tok = warpgroup_mma(p_bufs.index(j % 2), _v_operand(h_left, PV8), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            else:
                o_tok = warpgroup_mma(p_op, h_left, acc, is_async=True)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
        _write_out_scorer(acc, l_i, m_i, l_smem, l_ready, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale,
                          o_layout, SINGLE, STORE_LSE)

    @gluon.jit
    def _q8_convert_right(f_lat, h_right, f_ready, f_empty, c, start, end, STAGES: gl.constexpr,
                          HSTAGES: gl.constexpr, PV8: gl.constexpr):
        """Consumer 1's share of key block c: latent columns [256, 512) from the fp8 slot into its
        operand buffer c % HSTAGES (fp16, or with ``PV8`` the fp8 transpose; its last reader, this
        warpgroup's P V of block c - HSTAGES, was waited for), then its arrival on the slot's free
        mbarrier."""
        fs = c % STAGES
        BN: gl.constexpr = f_lat.shape[1]
        mbarrier.wait(f_ready.index(fs), (c // STAGES) & 1)
        _to_operand(f_lat.index(fs).slice(256, 256, dim=1), h_right.index(c % HSTAGES), end - (start + c * BN), PV8)
        fence_async_shared()
        release(f_empty.index(fs))

    @gluon.jit
    def _q8_right(f_lat, h_right, p_bufs, alpha_smem, l_smem, f_ready, f_empty, p_ready, p_free, l_ready, SEQ, O,
                  LSE, OP, LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                  stride_lsb, stride_lsh, chunk, out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr,
                  STAGES: gl.constexpr, HSTAGES: gl.constexpr, PV8: gl.constexpr):
        """Consumer 1: output columns [256, 512), P from shared memory; its columns of the next
        block converted under this block's P V (``HSTAGES`` 2) or after it (1)."""
        BN: gl.constexpr = f_lat.shape[1]
        NP: gl.constexpr = p_bufs.shape[0]
        la: gl.constexpr = wgmma_layout(256, 32 if PV8 else 16)
        b, s, start, end, n_blocks = _span(SEQ, chunk, BN)
        acc = gl.zeros([64, 256], gl.float32, la)
        if n_blocks > 0:
            _q8_convert_right(f_lat, h_right, f_ready, f_empty, 0, start, end, STAGES, HSTAGES, PV8)
        for j in range(n_blocks):
            pb = j % NP
            mbarrier.wait(p_ready.index(pb), (j // NP) & 1)
            alpha = alpha_smem.index(pb).load(gl.SliceLayout(1, la))
            o_tok = warpgroup_mma(p_bufs.index(pb), _v_operand(h_right.index(j % HSTAGES), PV8), acc * alpha[:, None],
                                  is_async=True)
            if HSTAGES > 1 and j + 1 < n_blocks:
                _q8_convert_right(f_lat, h_right, f_ready, f_empty, j + 1, start, end, STAGES, HSTAGES, PV8)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            _cta_barrier()
            mbarrier.arrive(p_free.index(pb))
            if HSTAGES == 1 and j + 1 < n_blocks:
                _q8_convert_right(f_lat, h_right, f_ready, f_empty, j + 1, start, end, STAGES, HSTAGES, PV8)
        mbarrier.wait(l_ready, 0)
        _write_out_l(acc, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 256, la, SINGLE, STORE_LSE)

    @gluon.jit
    def _mla_sm90_qfp8_kernel(kv_desc, pe_desc, Q, BT, SEQ, O, LSE, OP, LP,
                              stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                              stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, PAGE, score_scale, out_scale,
                              SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
                              HSTAGES: gl.constexpr, PV8: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                              num_warps: gl.constexpr):
        """Grid (heads / 64, B, splits). The producer warp TMA-loads each fp8 key block into a ring
        of ``STAGES``; consumer 0 scores it in fp8 against Q quantised per row (``_stage_q8``) and
        converts output columns [0, 256) of it into its fp16 buffer, consumer 1 the other 256 into
        a ring of ``HSTAGES``; a slot is free once both converted and the scores retired. ``PV8``:
        P V as an 8-bit product too, P in e4m3 (times ``P8_SCALE``) against each consumer's
        columns transposed in fp8 (``_to_vt``), half the buffers' shared memory."""
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        BN: gl.constexpr = kv_desc.block_type.shape[0]
        DL: gl.constexpr = kv_desc.block_type.shape[1]
        gl.static_assert(DL == 512, "the latent part is 512 wide")
        gl.static_assert(BN == 64, "64-token key blocks")
        f8: gl.constexpr = kv_desc.dtype
        f16: gl.constexpr = gl.float16
        q8 = gl.allocate_shared_memory(f8, [64, DL], kv_desc.layout)
        q8_pe = gl.allocate_shared_memory(f8, [64, 64], pe_desc.layout)
        f_lat = gl.allocate_shared_memory(f8, [STAGES, BN, DL], kv_desc.layout)
        f_pe = gl.allocate_shared_memory(f8, [STAGES, BN, 64], pe_desc.layout)
        if PV8:
            v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([256, BN], f8)
            h_left = gl.allocate_shared_memory(f8, [256, BN], v_layout)
            h_right = gl.allocate_shared_memory(f8, [HSTAGES, 256, BN], v_layout)
            p_bufs = gl.allocate_shared_memory(f8, [2, 64, BN], gl.NVMMASharedLayout.get_default_for([64, BN], f8))
        else:
            h_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, 256], f16)
            h_left = gl.allocate_shared_memory(f16, [BN, 256], h_layout)
            h_right = gl.allocate_shared_memory(f16, [HSTAGES, BN, 256], h_layout)
            p_bufs = gl.allocate_shared_memory(f16, [2, 64, BN], gl.NVMMASharedLayout.get_default_for([64, BN], f16))
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        alpha_smem = gl.allocate_shared_memory(gl.float32, [2, 64], plain)
        l_smem = gl.allocate_shared_memory(gl.float32, [64], plain)
        bars: gl.constexpr = mbarrier.MBarrierLayout()
        f_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars)
        f_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars)
        p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bars)
        p_free = gl.allocate_shared_memory(gl.int64, [2, 1], bars)
        l_ready = gl.allocate_shared_memory(gl.int64, [1], bars)
        for i in gl.static_range(STAGES):
            mbarrier.init(f_ready.index(i), count=1)
            mbarrier.init(f_empty.index(i), count=2)  # consumer 0 (scores retired, its columns converted), 1
        for i in gl.static_range(2):
            mbarrier.init(p_ready.index(i), count=1)
            mbarrier.init(p_free.index(i), count=1)
        mbarrier.init(l_ready, count=1)
        gl.warp_specialize([
            (_q8_scorer, (q8, q8_pe, f_lat, f_pe, h_left, p_bufs, alpha_smem, l_smem, f_ready, f_empty, p_ready,
                          p_free, l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk,
                          score_scale, out_scale, SINGLE, STORE_LSE, STAGES, PV8)),
            (_q8_right, (f_lat, h_right, p_bufs, alpha_smem, l_smem, f_ready, f_empty, p_ready, p_free, l_ready, SEQ,
                         O, LSE, OP, LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                         stride_lsb, stride_lsh, chunk, out_scale, SINGLE, STORE_LSE, STAGES, HSTAGES, PV8)),
            (_producer, (kv_desc, pe_desc, f_lat, f_pe, f_ready, f_empty, SEQ, BT, stride_bt, chunk, PAGE, STAGES)),
        ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])
