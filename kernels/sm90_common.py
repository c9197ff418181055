"""What the Gluon Hopper kernels (``fp8_gemm_sm90``, ``prefill_sm90``, ``mla_sm90``) share: Gluon's
Hopper modules (absent from Triton builds without them: ``HAVE_GLUON`` is then False), the names
Triton 3.6 (the H200's) and later releases give the same operations, the register layout of a
warpgroup MMA's accumulator, and the release of a ring slot by one warp-specialised partition."""

from __future__ import annotations

import torch
import triton

__all__ = ["HAVE_GLUON", "SMEM_BYTES", "split_registers", "GL_DTYPE", "TensorDescriptor", "async_copy", "cp_async",
           "cta_barrier", "fence_async_shared", "gl", "gluon", "mbarrier", "mma_v2", "release", "tma", "tma_load",
           "tma_store", "warpgroup_mma", "warpgroup_mma_wait", "wgmma_layout", "half_store_layout"]

SMEM_BYTES = 227 * 1024  # the shared memory one sm_90 CTA may take


def split_registers(consumers: int, per_sm: int, producer_regs: int) -> tuple[int, int]:
    """(maxnreg, registers per consumer thread) of a warp-specialised launch: ``consumers``
    warpgroups plus the producer's (registers are allocated per warpgroup), ``max(per_sm, 1)``
    programs sharing an SM's 64K registers, the producer keeping ``producer_regs`` a thread and
    the consumers splitting the rest (``setmaxnreg`` takes multiples of 8, at most 256)."""
    groups = consumers + 1
    maxnreg = min(65536 // (max(per_sm, 1) * groups * 128), 256) // 8 * 8
    return maxnreg, min((maxnreg * groups - producer_regs) // consumers // 8 * 8, 256)


try:  # Gluon ships with Triton >= 3.4; the Hopper modules exist only in the CUDA build
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global;
    # later releases renamed them async_load / async_store
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed after 3.6
    # cp.async (Ampere's global -> shared copy): async_copy_global_to_shared in 3.6, async_load later
    cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
    HAVE_GLUON = True

    @gluon.jit
    def release(bar):
        """This partition's warps are past their reads of a slot (a barrier of the partition's
        own warps, ``bar.sync id, threads``: the other partitions are not held), then one
        arrival on the slot's mbarrier. (Triton 3.6 puts such a barrier before every arrival
        itself, and this one merges with it; the call keeps the order where a version does not.)"""
        cta_barrier()
        mbarrier.arrive(bar)

    @gluon.jit
    def gdc_wait():
        """``griddepcontrol.wait``: hold this thread until the kernels this one was launched behind
        (with ``launch_pdl``, CUDA's programmatic dependent launch) have finished and their writes
        are visible to this grid. A kernel launched with ``launch_pdl`` may start while the kernel
        before it in the stream still runs, so it waits here before its first global read or write."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def gdc_launch():
        """``griddepcontrol.launch_dependents``: the kernel launched behind this one (with
        ``launch_pdl``) may be placed once every program of this grid has passed here or exited.
        It orders nothing: the dependent still waits (``gdc_wait``) for this grid's writes."""
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @triton.constexpr_function
    def wgmma_layout(n, k=16):
        """The register layout of a one-warpgroup ``wgmma`` accumulator of [64, ``n``] (instruction
        K ``k``: 16 for 16-bit operands, 32 for fp8), callable from Gluon code."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, k])

    @triton.constexpr_function
    def row_chunk_layout(w):
        """The layout of a warpgroup's [rows, ``w``] load of a byte-wide (fp8) tile in shared
        memory: 16 contiguous values a thread, one 16-byte unit of the swizzle, ``w // 16`` threads
        a row (``w`` 16 to 512), callable from Gluon code."""
        return gl.BlockedLayout([1, 16], [32 // (w // 16), w // 16], [4, 1], [1, 0])

    @triton.constexpr_function
    def half_store_layout(w):
        """The layout of a warpgroup's [rows, ``w``] fp8 -> fp16 conversion: 8 contiguous values a
        thread, so each thread's fp16 store is one 16-byte unit of the 128-byte swizzle and a warp's
        store is conflict-free (``row_chunk_layout``'s 16 values a thread store 32 bytes, two units:
        Nsight Compute counted every conversion store twice over, 2^22 excess wavefronts at B 64 4k,
        race 22), ``w // 8`` threads a row (``w`` 64 to 256), callable from Gluon code."""
        return gl.BlockedLayout([1, 8], [32 // (w // 8), w // 8], [4, 1], [1, 0])

except ImportError:  # pragma: no cover - depends on the Triton build
    HAVE_GLUON = False
