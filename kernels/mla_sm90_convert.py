"""The fp8 latent cache on Hopper with a warpgroup of its own converting it (``kernels.mla_sm90``'s
fp8 kernel with ``config={"CONVERT": "warpgroup"}``; opt-in: race 16 on an H100 timed it at 0.94-0.98x
the default fp8 path's speed).

Why: in ``kernels.mla_sm90``'s fp8 kernel the two consumer warpgroups convert the next key block
(fp8 -> fp16, the products' operand dtype) themselves, after their P V of this block retired: Q,
one fp16 block and two fp8 ones fill shared memory, so the next block's conversion cannot start
before this block's products are done, and the next block's scores wait for all of it (race
10b: 1.29-1.48x the bf16 cache's time, 0.60-0.72x FlashMLA's bf16 time; kernels/README.md).
Here the conversion leaves the consumers and runs in pieces as the products free them:

- a converter warpgroup (4 warps, ``CONVERTER_REGS`` registers a thread) TMA-loads each fp8 key
  block into a ring of two and converts it into the one fp16 block in five pieces: the rope
  columns (into one of two [64, 64] rope slots, so a block's rope can land while the previous
  block is still read), then the latent columns 128 at a time, each piece once the products
  that read that piece of the previous block retired (one mbarrier per piece and direction);
- consumer 0 (the default partition) issues the scores of block j piece by piece as the pieces
  land (rope first), runs the softmax, writes P_j into block j's rope slot (its scores have read
  it) for consumer 1 and multiplies output columns [0, 256) in two 128-column products, P from
  registers, freeing each piece when its product retires;
- consumer 1 does the same for columns [256, 512), P from shared memory, and frees block j's
  rope slot with its last product.

So the next block's scores over the first pieces run while the last pieces are still being
multiplied or converted, instead of after all of both. Shared memory: Q [64, 576] fp16, two fp8
blocks [64, 576], one fp16 latent block [64, 512], two fp16 rope slots [64, 64] (225 of the 227 KB);
no separate P buffer. Same contract and numerics as ``kernels.mla_sm90``'s fp8 kernel (exact
e4m3 -> fp16 conversion, fp16 products, the per-tensor scale folded into the score and output
scales; rows past the sequence converted as zeros).

Gluon kernels compile only for a GPU: tests/kernels/test_mla_sm90.py compiles this one for
sm_90a on any machine and checks it against the float64 reference on a Hopper GPU."""

from __future__ import annotations

from kernels.sm90_common import HAVE_GLUON

CONVERTER_REGS = 56  # registers a converter thread keeps (the consumers then 224: 2 x 128 x 224 + 128 x 56 fit 168 x 384)
HALVES = 2  # row slices a piece is converted in: 32 values a thread at a time, no spills at 56 registers
PIECE = 128  # latent columns per converted piece (four pieces, then the products' halves)

if HAVE_GLUON:
    from kernels.mla_sm90_parts import (_load_block, _publish, _softmax_step, _span, _stage_q, _write_out,
                                        _write_out_l, _write_out_scorer)
    from kernels.sm90_common import fence_async_shared, gl, gluon, mbarrier, release, warpgroup_mma, warpgroup_mma_wait
    from kernels.sm90_common import half_store_layout, row_chunk_layout, wgmma_layout

    _PIECE = gl.constexpr(PIECE)

    @gluon.jit
    def _to_half_piece(src, dst, HALVES: gl.constexpr):
        """An fp8 [64, W] piece -> fp16 (exact), 8 values a thread and row (``half_store_layout``:
        conflict-free stores), in ``HALVES`` row slices (Triton puts a barrier between a partition's
        shared-memory loads and its stores, so each slice is one load, then one store)."""
        R: gl.constexpr = src.shape[0] // HALVES
        blk: gl.constexpr = half_store_layout(src.shape[1])
        for i in gl.static_range(HALVES):
            dst.slice(i * R, R, dim=0).store(src.slice(i * R, R, dim=0).load(blk).to(gl.float16))

    @gluon.jit
    def _zero_rows(buf, valid):
        """Rows >= ``valid`` of an fp8 [64, W] slot (its rows past the sequence: anything, NaN
        too) -> 0, 128 columns (one swizzle tile) at a time, each thread on the bytes its
        conversion reads next."""
        W: gl.constexpr = buf.shape[1]
        CW: gl.constexpr = 128 if W >= 128 else W
        blk: gl.constexpr = row_chunk_layout(CW)
        rows = gl.arange(0, buf.shape[0], layout=gl.SliceLayout(1, blk))
        for i in gl.static_range(W // CW):
            part = buf.slice(i * CW, CW, dim=1)
            x = part.load(blk)
            part.store(gl.where((rows < valid)[:, None], x, gl.zeros_like(x)))

    @gluon.jit
    def _cv_converter(kv_desc, pe_desc, f_lat, f_pe, h_lat, h_pe, f_ready, pe_ready, pe_free, h_ready, h_free, SEQ,
                      BT, stride_bt, chunk, PAGE, HALVES: gl.constexpr):
        """The converter warpgroup: loads, then per block the rope piece and the four latent pieces
        into the fp16 buffers as their previous readers free them; a block's fp8 slot is reloaded
        (block j + 2) once all of it is converted."""
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        for c in gl.static_range(2):
            if c < n_blocks:
                _load_block(kv_desc, pe_desc, f_lat.index(c), f_pe.index(c), f_ready.index(c), b, start + c * 64, BT,
                            stride_bt, PAGE)
        for j in range(n_blocks):
            fs = j % 2
            valid = end - (start + j * 64)
            mbarrier.wait(f_ready.index(fs), (j // 2) & 1)
            if valid < 64:  # the partial last block: its fp8 rows past the sequence -> 0 before converting
                _zero_rows(f_lat.index(fs), valid)
                _zero_rows(f_pe.index(fs), valid)
            mbarrier.wait(pe_free.index(fs), ((j // 2) & 1) ^ 1)  # block j - 2's P read (the first passes free)
            _to_half_piece(f_pe.index(fs), h_pe.index(fs), 1)
            fence_async_shared()
            release(pe_ready.index(fs))
            for c in gl.static_range(512 // _PIECE):
                mbarrier.wait(h_free.index(c), (j & 1) ^ 1)  # block j - 1's products of the piece retired
                _to_half_piece(f_lat.index(fs).slice(c * _PIECE, _PIECE, dim=1),
                               h_lat.slice(c * _PIECE, _PIECE, dim=1), HALVES)
                fence_async_shared()
                release(h_ready.index(c))  # (its barrier also has every warp past its fp8 reads)
            if j + 2 < n_blocks:
                _load_block(kv_desc, pe_desc, f_lat.index(fs), f_pe.index(fs), f_ready.index(fs), b,
                            start + (j + 2) * 64, BT, stride_bt, PAGE)

    @gluon.jit
    def _cv_scores(q_smem, q_pe, h_lat, h_pe, pe_ready, h_ready, j, sc):
        """S_j = Q K_j^T issued piece by piece as the converter publishes them (rope first)."""
        ps = j % 2
        mbarrier.wait(pe_ready.index(ps), (j // 2) & 1)
        tok = warpgroup_mma(q_pe, h_pe.index(ps).permute((1, 0)), sc, use_acc=False, is_async=True)
        for c in gl.static_range(512 // _PIECE):
            mbarrier.wait(h_ready.index(c), j & 1)
            tok = warpgroup_mma(q_smem.slice(c * _PIECE, _PIECE, dim=1),
                                h_lat.slice(c * _PIECE, _PIECE, dim=1).permute((1, 0)), tok, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

    @gluon.jit
    def _cv_pv(a, h_lat, h_free, acc0, acc1, C0: gl.constexpr):
        """O[:, C0 : C0 + 256] += P V in two 128-column products (P ``a``: registers or shared
        memory), each piece freed for the converter when its product retires."""
        t0 = warpgroup_mma(a, h_lat.slice(C0, _PIECE, dim=1), acc0, is_async=True)
        t1 = warpgroup_mma(a, h_lat.slice(C0 + _PIECE, _PIECE, dim=1), acc1, is_async=True)
        acc0 = warpgroup_mma_wait(num_outstanding=1, deps=(t0,))
        release(h_free.index(C0 // _PIECE))
        acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(t1,))
        release(h_free.index(C0 // _PIECE + 1))
        return acc0, acc1

    @gluon.jit
    def _cv_scorer(q_smem, q_pe, h_lat, h_pe, alpha_smem, l_smem, pe_ready, pe_free, h_ready, h_free, p_ready,
                   l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh, stride_pb, stride_ph,
                   stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, score_scale, out_scale,
                   SINGLE: gl.constexpr, STORE_LSE: gl.constexpr):
        """Consumer 0: the scores, the softmax, P_j into block j's rope slot, output columns
        [0, 256)."""
        s_layout: gl.constexpr = wgmma_layout(64)
        o_layout: gl.constexpr = wgmma_layout(_PIECE)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        _stage_q(q_smem, q_pe, Q + b.to(gl.int64) * stride_qb + gl.program_id(0) * 64 * stride_qh, stride_qh)
        acc0 = gl.zeros([64, _PIECE], gl.float32, o_layout)
        acc1 = gl.zeros([64, _PIECE], gl.float32, o_layout)
        m_i = gl.full([64], -1.0e30, gl.float32, row_s)
        l_i = gl.zeros([64], gl.float32, row_s)
        sc = gl.zeros([64, 64], gl.float32, s_layout)
        for j in range(n_blocks):
            sc = _cv_scores(q_smem, q_pe, h_lat, h_pe, pe_ready, h_ready, j, sc)
            p, alpha, m_i, l_i, _ = _softmax_step(sc, m_i, l_i, start + j * 64, end, score_scale)
            # P_j overwrites block j's rope (its scores are in); block j - 2's P there was freed
            # by consumer 1 before the converter wrote this rope
            p16 = _publish(p, alpha, j, h_pe, alpha_smem, p_ready, pe_free)
            a = gl.convert_layout(alpha, row_o)[:, None]
            acc0, acc1 = _cv_pv(gl.convert_layout(p16, p_layout), h_lat, h_free, acc0 * a, acc1 * a, 0)
        _write_out_scorer(acc0, l_i, m_i, l_smem, l_ready, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale,
                          o_layout, SINGLE, STORE_LSE)
        _write_out(acc1, gl.convert_layout(l_i, row_o), gl.convert_layout(m_i, row_o), O, LSE, OP, LP, b, s, n_blocks,
                   stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh,
                   out_scale, _PIECE, o_layout, SINGLE, STORE_LSE, False)

    @gluon.jit
    def _cv_right(h_lat, h_pe, alpha_smem, l_smem, pe_free, h_free, p_ready, l_ready, SEQ, O, LSE, OP, LP, stride_ob,
                  stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk,
                  out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr):
        """Consumer 1: output columns [256, 512), P_j from block j's rope slot, which its second
        product frees for the converter."""
        o_layout: gl.constexpr = wgmma_layout(_PIECE)
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        acc0 = gl.zeros([64, _PIECE], gl.float32, o_layout)
        acc1 = gl.zeros([64, _PIECE], gl.float32, o_layout)
        for j in range(n_blocks):
            ps = j % 2
            mbarrier.wait(p_ready.index(ps), (j // 2) & 1)
            a = alpha_smem.index(ps).load(gl.SliceLayout(1, o_layout))[:, None]
            acc0, acc1 = _cv_pv(h_pe.index(ps), h_lat, h_free, acc0 * a, acc1 * a, 256)
            mbarrier.arrive(pe_free.index(ps))  # (the piece's release above had every warp past P)
        mbarrier.wait(l_ready, 0)
        _write_out_l(acc0, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 256, o_layout, SINGLE, STORE_LSE)
        _write_out_l(acc1, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 256 + _PIECE, o_layout,
                     SINGLE, STORE_LSE)

    @gluon.jit
    def _mla_sm90_convert_kernel(kv_desc, pe_desc, Q, BT, SEQ, O, LSE, OP, LP,
                                 stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_pb, stride_ph,
                                 stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, PAGE, score_scale,
                                 out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr,
                                 CONSUMER_REGS: gl.constexpr, CONVERTER_REGS: gl.constexpr, HALVES: gl.constexpr,
                                 num_warps: gl.constexpr):
        """Grid (heads / 64, B, splits), an fp8 e4m3 cache of 64-token blocks. The default
        partition is consumer 0, a 4-warp worker consumer 1, a 4-warp worker the converter."""
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        gl.static_assert(kv_desc.block_type.shape[0] == 64, "64-token key blocks")
        gl.static_assert(kv_desc.block_type.shape[1] == 512, "the latent part is 512 wide")
        f16: gl.constexpr = gl.float16
        q_smem = gl.allocate_shared_memory(f16, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], f16))
        q_pe = gl.allocate_shared_memory(f16, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], f16))
        f_lat = gl.allocate_shared_memory(kv_desc.dtype, [2, 64, 512], kv_desc.layout)
        f_pe = gl.allocate_shared_memory(pe_desc.dtype, [2, 64, 64], pe_desc.layout)
        h_lat = gl.allocate_shared_memory(f16, [64, 512], gl.NVMMASharedLayout.get_default_for([64, 512], f16))
        h_pe = gl.allocate_shared_memory(f16, [2, 64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], f16))
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        alpha_smem = gl.allocate_shared_memory(gl.float32, [2, 64], plain)
        l_smem = gl.allocate_shared_memory(gl.float32, [64], plain)
        NPC: gl.constexpr = 512 // _PIECE
        f_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        pe_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        pe_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        h_ready = gl.allocate_shared_memory(gl.int64, [NPC, 1], mbarrier.MBarrierLayout())
        h_free = gl.allocate_shared_memory(gl.int64, [NPC, 1], mbarrier.MBarrierLayout())
        l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(f_ready.index(i), count=1)
            mbarrier.init(pe_ready.index(i), count=1)
            mbarrier.init(pe_free.index(i), count=1)
            mbarrier.init(p_ready.index(i), count=1)
        for i in gl.static_range(NPC):
            mbarrier.init(h_ready.index(i), count=1)
            mbarrier.init(h_free.index(i), count=1)  # one warpgroup multiplies each piece
        mbarrier.init(l_ready, count=1)
        gl.warp_specialize([
            (_cv_scorer, (q_smem, q_pe, h_lat, h_pe, alpha_smem, l_smem, pe_ready, pe_free, h_ready, h_free, p_ready,
                          l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh, stride_pb,
                          stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, score_scale,
                          out_scale, SINGLE, STORE_LSE)),
            (_cv_right, (h_lat, h_pe, alpha_smem, l_smem, pe_free, h_free, p_ready, l_ready, SEQ, O, LSE, OP, LP,
                         stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb,
                         stride_lsh, chunk, out_scale, SINGLE, STORE_LSE)),
            (_cv_converter, (kv_desc, pe_desc, f_lat, f_pe, h_lat, h_pe, f_ready, pe_ready, pe_free, h_ready, h_free,
                             SEQ, BT, stride_bt, chunk, PAGE, HALVES)),
        ], [4, 4], [CONSUMER_REGS, CONVERTER_REGS])


def smem_bytes() -> int:
    """Q [64, 576] fp16, two fp8 blocks [64, 576], the fp16 latent block [64, 512], two fp16 rope
    slots [64, 64], the rescale factors (two), the row sums and 17 mbarriers."""
    return 2 * 64 * 576 + 2 * 64 * 576 + 2 * 64 * 512 + 2 * 2 * 64 * 64 + 4 * 3 * 64 + 8 * 17
