"""A one-block unit of the ``PV8`` path's two new parts, for tests/kernels/test_mla_sm90_qfp8.py:
an fp8 [64, 256] tile in a key block's shared-memory layout transposed by
``kernels.mla_sm90_qfp8._to_vt`` (tokens past ``valid`` zeroed), read back, and one 8-bit
``wgmma`` of P [64, 64] (from shared memory, or from registers with ``REG``) against it."""

from kernels.sm90_common import HAVE_GLUON

if HAVE_GLUON:
    from kernels.mla_sm90_qfp8 import _to_vt
    from kernels.sm90_common import cta_barrier, fence_async_shared, gl, gluon, warpgroup_mma, warpgroup_mma_wait
    from kernels.sm90_common import wgmma_layout

    @gluon.jit
    def pv8_unit(X, P, T, O, valid, REG: gl.constexpr):
        """X [64, 256] e4m3 -> T [256, 64] (the transpose, through shared memory) and O [64, 256]
        fp32 = P [64, 64] e4m3 @ the transposed tile's transpose."""
        f8: gl.constexpr = gl.float8e4nv
        ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
        c = gl.arange(0, 256, layout=gl.SliceLayout(0, ld))
        src = gl.allocate_shared_memory(f8, [64, 256], gl.NVMMASharedLayout.get_default_for([64, 512], f8))
        src.store(gl.load(X + r[:, None] * 256 + c[None, :]))
        cta_barrier()
        vt = gl.allocate_shared_memory(f8, [256, 64], gl.NVMMASharedLayout.get_default_for([256, 64], f8))
        _to_vt(src, vt, valid)
        cta_barrier()
        lt: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rt = gl.arange(0, 256, layout=gl.SliceLayout(1, lt))
        ct = gl.arange(0, 64, layout=gl.SliceLayout(0, lt))
        gl.store(T + rt[:, None] * 64 + ct[None, :], vt.load(lt))
        fence_async_shared()
        o_layout: gl.constexpr = wgmma_layout(256, 32)
        rp = gl.arange(0, 64, layout=gl.SliceLayout(1, lt))
        p = gl.load(P + rp[:, None] * 64 + ct[None, :])
        acc = gl.zeros([64, 256], gl.float32, o_layout)
        if REG:
            pr = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4))
            tok = warpgroup_mma(pr, vt.permute((1, 0)), acc, is_async=True)
        else:
            ps = gl.allocate_shared_memory(f8, [64, 64], gl.NVMMASharedLayout.get_default_for([64, 64], f8))
            ps.store(p)
            fence_async_shared()
            cta_barrier()
            tok = warpgroup_mma(ps, vt.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        lo: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        ro = gl.arange(0, 64, layout=gl.SliceLayout(1, lo))
        co = gl.arange(0, 256, layout=gl.SliceLayout(0, lo))
        gl.store(O + ro[:, None] * 256 + co[None, :], gl.convert_layout(acc, lo))
