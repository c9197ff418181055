"""FP8 block-scaled GEMM for Hopper (sm_90) in Gluon: warp-specialised, the promotion overlapped
with the next block's tensor-core products.

Same contract as ``kernels.fp8_gemm.fp8_gemm`` (dense only): C = (A * sa) @ (B * sb)^T with A
e4m3 [M, K], sa fp32 [M, K / 128], B e4m3 [N, K], sb fp32 [ceil(N / 128), K / 128].

Why a second kernel: each 128-wide K block's product must land in a fresh fp32 tile that is
scaled and added to the accumulator (the "promotion"). Triton 3.6's pipeliner keeps a
``wgmma`` in flight only when its result feeds the next product's accumulator, so in the
Triton kernel every warp waits for its product and then runs the promotion's FFMAs while the
tensor cores idle (kernels/README.md, "What limits it"). Gluon (Triton's lower-level
language, ``triton.experimental.gluon``) states the schedule directly, in partitions
(``gl.warp_specialize``):

- a producer warp walks the program's tiles and K blocks: it waits on a stage's ``empty``
  mbarrier, then TMA-loads the block's A [BLOCK_M, 128] and B [BLOCK_N, 128] tiles into the
  stage, completing on its ``ready`` mbarrier (a ring of ``STAGES``);
- one consumer partition per 64 rows of the tile (the default partition, and a second 4-warp
  partition for 128-row tiles) issues block k's ``wgmma`` on its rows asynchronously into a
  fresh tile (``use_acc=False``) *before* waiting for block k - 1's
  (``warpgroup_mma_wait(num_outstanding=1)``), and promotes block k - 1's tile
  (``acc += tile * sa[m] * sb``) while block k's products run; it frees a stage once its
  product retired (a barrier of its own four warps, then one arrival: ``empty`` completes on
  one per consumer; ``PAIR_RELEASE`` frees two stages behind one barrier) and TMA-stores its
  rows of each tile;
- with ``PERSISTENT`` (programs per SM) a program takes tiles pid, pid + grid, ...; the
  producer runs on into the next tile while the consumers finish and store this one;
  ``ws_registers`` gives the producer's registers to the consumers (``setmaxnreg``).

Two register sets alternate between blocks so that the block in flight and the one being
promoted never share registers, and each block's products are issued into the registers its
set's previous block was promoted from: without that ptxas copies an in-flight accumulator
and serialises every wgmma (info C7514). The single-stream kernel this grew from (loads,
products and promotions in one instruction stream, H200 race 6) was removed after race 7,
where this one was faster at every point that decides a default.

128-wide (or 64-wide) N tiles lie in one weight scale block, so the weight scale is one scalar
per K block. Tails: TMA zero-fills rows past M and N on load and clips them on store; the
activation scales are loaded masked. Needs N * 2 bytes (the bf16 output's row) to be a
multiple of 16 and 16-byte-aligned bases (TMA's rules): ``supported`` says when.

Gluon kernels compile only for a GPU (no interpreter): the interpreter tests cover the Triton
kernel that shares this contract; tests/kernels/test_fp8_gemm_sm90.py compiles this one for
sm_90a on any machine (``kernels.bench.sm90.fp8_gemm_sm90_build``: no serialised wgmma, no
spills) and checks it against the fp64 reference on a Hopper GPU (the H200 runs are committed
under kernels/bench/results/)."""

from __future__ import annotations

import torch
import triton

from kernels.sm90_common import HAVE_GLUON, SMEM_BYTES, split_registers

if HAVE_GLUON:
    from kernels.sm90_common import GL_DTYPE as _GL_OUT
    from kernels.sm90_common import TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, tma
    from kernels.sm90_common import cta_barrier as _cta_barrier
    from kernels.sm90_common import tma_load as _tma_load
    from kernels.sm90_common import tma_store as _tma_store
    from kernels.sm90_common import warpgroup_mma, warpgroup_mma_wait, wgmma_layout

BLOCK_K = 128  # the format's scale block along K
PRODUCER_REGS = 40  # registers per thread of the TMA producer's warpgroup (the consumers get the rest)


def supported(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether this kernel can run these operands: a Hopper GPU, Gluon, a dense weight, row
    strides and bases TMA accepts, and a 16-bit output."""
    if not (HAVE_GLUON and a.is_cuda and b.is_cuda and b.dim() == 2):
        return False
    if torch.cuda.get_device_capability(a.device) != (9, 0):
        return False
    if out_dtype not in (torch.bfloat16, torch.float16):
        return False
    m, k = a.shape
    n = b.shape[0]
    return (
        m > 0
        and n % 8 == 0
        and k % BLOCK_K == 0
        and a.stride(1) == 1
        and b.stride(1) == 1
        and a.stride(0) % 16 == 0
        and b.stride(0) % 16 == 0
        and a.data_ptr() % 16 == 0
        and b.data_ptr() % 16 == 0
    )


if HAVE_GLUON:
    _PRODUCER_REGS = gl.constexpr(PRODUCER_REGS)

    @gluon.jit
    def _tile(t, num_m, num_n, GROUP_M: gl.constexpr):
        """Output tile t's (row, column) tile indices in grouped order: GROUP_M row tiles walk
        the column tiles together, so the programs running side by side share weight tiles
        in L2."""
        per_group = GROUP_M * num_n
        first_m = (t // per_group) * GROUP_M
        gm = gl.minimum(num_m - first_m, GROUP_M)
        return first_m + (t % per_group) % gm, (t % per_group) // gm

    @gluon.jit
    def _scale(as_ptrs, bs_ptrs, mask_m, kb, stride_ask, stride_bsk):
        """Block kb's combined scale per row: activation group scale x weight block scale."""
        return gl.load(as_ptrs + kb * stride_ask, mask=mask_m, other=0.0) * gl.load(bs_ptrs + kb * stride_bsk)

    # Warpgroup W's rows of block g's activation scales, from the stage the producer loaded them
    # into (SCALE_TMA; read before the stage is freed): the [1, BLOCK_M] box viewed as a vector
    # (Triton 3.6 names the view _reinterpret, later releases reinterpret)
    if hasattr(gl.shared_memory_descriptor, "reinterpret"):
        @gluon.jit
        def _stage_scale(s_bufs, g, W: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr):
            v = s_bufs.index(g % STAGES).reinterpret(gl.float32, [s_bufs.shape[2]], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            return v.slice(W * HALF, HALF).load(gl.SliceLayout(1, layout))
    else:
        @gluon.jit
        def _stage_scale(s_bufs, g, W: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr):
            v = s_bufs.index(g % STAGES)._reinterpret(gl.float32, [s_bufs.shape[2]], gl.SwizzledSharedLayout(1, 1, 1, [0]))
            return v.slice(W * HALF, HALF).load(gl.SliceLayout(1, layout))

    @gluon.jit
    def _promote(acc, tile, scale):
        """acc + tile * scale[:, None] as FFMAs that keep their place in the program: inline
        assembly with side effects is not moved across the wgmma issue that follows (plain
        arithmetic was sunk past it, which kept the tile's registers alive and made the next
        product into the same set copy them)."""
        return gl.inline_asm_elementwise(
            "fma.rn.f32 $0, $1, $2, $3;", "=f,f,f,f", [tile, scale[:, None], acc],
            dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def _ws_producer(a_desc, b_desc, s_desc, ready, empty, a_bufs, b_bufs, s_bufs, M, N, K, GROUP_M: gl.constexpr,
                     STAGES: gl.constexpr, SCALE_TMA: gl.constexpr):
        """One warp: for each of this program's tiles and K blocks, wait until every consumer
        warpgroup has freed the stage (``empty``: one arrival per warpgroup), then load the
        block's A and B tiles into it (``ready`` completes on their bytes); with ``SCALE_TMA``
        also the block's activation scales of the tile's rows (a row of the column-major scales'
        [K / 128, M] transpose)."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BLOCK_M)
        num_n = gl.cdiv(N, BLOCK_N)
        n_k = K // 128
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + (
            s_desc.block_type.nbytes if SCALE_TMA else 0)
        for j in range(gl.cdiv(num_m * num_n - pid, nprog)):
            pid_m, pid_n = _tile(pid + j * nprog, num_m, num_n, GROUP_M)
            for kb in range(n_k):
                g = j * n_k + kb
                s = g % STAGES
                # mbarriers start with the phase before 0 complete: the first pass is free
                mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                _tma_load(a_desc, [pid_m * BLOCK_M, kb * 128], ready.index(s), a_bufs.index(s))
                _tma_load(b_desc, [pid_n * BLOCK_N, kb * 128], ready.index(s), b_bufs.index(s))
                if SCALE_TMA:
                    _tma_load(s_desc, [kb, pid_m * BLOCK_M], ready.index(s), s_bufs.index(s))

    @gluon.jit
    def _ws_mma(a_bufs, b_bufs, ready, g, regs, W: gl.constexpr, HALF: gl.constexpr, STAGES: gl.constexpr):
        """Wait for block g's tiles and issue warpgroup W's products (its HALF rows of the A
        tile) into a fresh fp32 tile (async), in the registers of ``regs``."""
        s = g % STAGES
        mbarrier.wait(ready.index(s), (g // STAGES) & 1)
        return warpgroup_mma(a_bufs.index(s).slice(W * HALF, HALF), b_bufs.index(s).permute((1, 0)), regs,
                             use_acc=False, is_async=True)

    @gluon.jit
    def _ws_release(empty, g, STAGES: gl.constexpr, WITH_PREVIOUS: gl.constexpr = False):
        """Free block g's stage (and block g - 1's, ``WITH_PREVIOUS``): the warpgroup's four
        warps have all waited for the products (a barrier of this partition's warps), then one
        thread arrives."""
        _cta_barrier()
        if WITH_PREVIOUS:
            mbarrier.arrive(empty.index((g - 1) % STAGES))
        mbarrier.arrive(empty.index(g % STAGES))

    @gluon.jit
    def _ws_consumer(a_bufs, b_bufs, s_bufs, ready, empty, c_desc, c_bufs, as_ptr, bs_ptr, M, N, K, stride_asm,
                     stride_ask, stride_bsn, stride_bsk, W: gl.constexpr, CONSUMERS: gl.constexpr,
                     GROUP_M: gl.constexpr, STAGES: gl.constexpr, PAIR_RELEASE: gl.constexpr,
                     SCALE_TMA: gl.constexpr):
        """Consumer warpgroup W: rows [W * 64, W * 64 + 64) of every tile, the overlapped
        promotion (two register sets, block k's products issued before block k - 1's are
        waited for), and its own TMA store of those rows."""
        HALF: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
        BLOCK_M: gl.constexpr = HALF * CONSUMERS
        layout: gl.constexpr = wgmma_layout(BLOCK_N, 32)
        c_smem = c_bufs.index(W)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        num_m = gl.cdiv(M, BLOCK_M)
        num_n = gl.cdiv(N, BLOCK_N)
        n_k = K // 128
        for j in range(gl.cdiv(num_m * num_n - pid, nprog)):
            pid_m, pid_n = _tile(pid + j * nprog, num_m, num_n, GROUP_M)
            off_m = pid_m * BLOCK_M + W * HALF
            g0 = j * n_k
            offs_m = off_m + gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
            mask_m = offs_m < M
            as_ptrs = as_ptr + offs_m * stride_asm
            bs_ptrs = bs_ptr + ((pid_n * BLOCK_N) // 128) * stride_bsn
            acc = gl.zeros([HALF, BLOCK_N], gl.float32, layout)
            spare_a = gl.zeros([HALF, BLOCK_N], gl.float32, layout)
            tok_b = _ws_mma(a_bufs, b_bufs, ready, g0, gl.zeros([HALF, BLOCK_N], gl.float32, layout), W, HALF, STAGES)
            if SCALE_TMA:  # each block's scales from its stage, read once its loads landed
                cur_b = _stage_scale(s_bufs, g0, W, HALF, STAGES, layout) * gl.load(bs_ptrs)
                cur_a = cur_b
            else:
                # each block's scales are loaded a pair of blocks before its promotion: with
                # column-major activation scales (vLLM's) every block's are new cache lines, and
                # loaded one block ahead their latency showed (1.1-1.25x the row-major time)
                cur_b = _scale(as_ptrs, bs_ptrs, mask_m, 0, stride_ask, stride_bsk)
                cur_a = _scale(as_ptrs, bs_ptrs, mask_m & (n_k > 1), 1, stride_ask, stride_bsk)
            for kb in range(1, n_k - 1, 2):
                if not SCALE_TMA:
                    nxt_b = _scale(as_ptrs, bs_ptrs, mask_m, kb + 1, stride_ask, stride_bsk)
                    nxt_a = _scale(as_ptrs, bs_ptrs, mask_m & (kb + 2 < n_k), kb + 2, stride_ask, stride_bsk)
                tok_a = _ws_mma(a_bufs, b_bufs, ready, g0 + kb, spare_a, W, HALF, STAGES)
                if SCALE_TMA:
                    cur_a = _stage_scale(s_bufs, g0 + kb, W, HALF, STAGES, layout) * gl.load(bs_ptrs + kb * stride_bsk)
                done_b = warpgroup_mma_wait(num_outstanding=1, deps=(tok_b,))  # block kb - 1 retired
                if not PAIR_RELEASE:
                    _ws_release(empty, g0 + kb - 1, STAGES)
                acc = _promote(acc, done_b, cur_b)  # while block kb's products run
                tok_b = _ws_mma(a_bufs, b_bufs, ready, g0 + kb + 1, done_b, W, HALF, STAGES)
                if SCALE_TMA:
                    cur_b = (_stage_scale(s_bufs, g0 + kb + 1, W, HALF, STAGES, layout)
                             * gl.load(bs_ptrs + (kb + 1) * stride_bsk))
                spare_a = warpgroup_mma_wait(num_outstanding=1, deps=(tok_a,))  # block kb retired
                _ws_release(empty, g0 + kb, STAGES, PAIR_RELEASE)  # paired: blocks kb - 1 and kb
                acc = _promote(acc, spare_a, cur_a)
                if not SCALE_TMA:
                    cur_b = nxt_b
                    cur_a = nxt_a
            if n_k % 2 == 0:  # block n_k - 1 left (set A), its scales in cur_a
                tok_a = _ws_mma(a_bufs, b_bufs, ready, g0 + n_k - 1, spare_a, W, HALF, STAGES)
                if SCALE_TMA:
                    cur_a = (_stage_scale(s_bufs, g0 + n_k - 1, W, HALF, STAGES, layout)
                             * gl.load(bs_ptrs + (n_k - 1) * stride_bsk))
                done_b = warpgroup_mma_wait(num_outstanding=1, deps=(tok_b,))
                _ws_release(empty, g0 + n_k - 2, STAGES)
                acc = _promote(acc, done_b, cur_b)
                done_a = warpgroup_mma_wait(num_outstanding=0, deps=(tok_a,))
                _ws_release(empty, g0 + n_k - 1, STAGES)
                acc = _promote(acc, done_a, cur_a)
            else:
                done_b = warpgroup_mma_wait(num_outstanding=0, deps=(tok_b,))
                _ws_release(empty, g0 + n_k - 1, STAGES)
                acc = _promote(acc, done_b, cur_b)
            # this warpgroup's previous store must have read c_smem before it is overwritten
            tma.store_wait(pendings=0)
            _cta_barrier()
            c_smem.store(acc.to(c_desc.dtype))
            fence_async_shared()
            _cta_barrier()
            _tma_store(c_desc, [off_m, pid_n * BLOCK_N], c_smem)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _fp8_gemm_sm90_ws_kernel(
        a_desc,
        b_desc,
        c_desc,
        s_desc,
        as_ptr,
        bs_ptr,
        M,
        N,
        K,
        stride_asm,
        stride_ask,
        stride_bsn,
        stride_bsk,
        GROUP_M: gl.constexpr,
        STAGES: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        PAIR_RELEASE: gl.constexpr,
        SCALE_TMA: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        """Warp-specialised: the default partition (4 warps) is consumer warpgroup 0, a second
        4-warp partition consumer 1 when the tile has 128 rows, and a 1-warp partition the
        TMA producer (its registers given to the consumers). c_desc's block is one
        warpgroup's rows; s_desc's (``SCALE_TMA``) a tile's activation scales of one K block, a
        [1, BLOCK_M] box of their [K / 128, M] transpose (unused otherwise)."""
        HALF: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        CONSUMERS: gl.constexpr = BLOCK_M // HALF
        gl.static_assert(HALF == 64, "a consumer warpgroup owns 64 rows")
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        gl.static_assert(128 % BLOCK_N == 0, "an N tile lies in one weight scale block")
        gl.static_assert(STAGES >= 3 or not PAIR_RELEASE, "a pair release holds three stages")
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, 128], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, 128], b_desc.layout)
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS, HALF, BLOCK_N], c_desc.layout)
        if SCALE_TMA:
            s_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], s_desc.layout)
        else:  # unused
            s_bufs = c_bufs
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_ws_consumer, (a_bufs, b_bufs, s_bufs, ready, empty, c_desc, c_bufs, as_ptr, bs_ptr, M, N, K,
                                stride_asm, stride_ask, stride_bsn, stride_bsk, 0, CONSUMERS, GROUP_M, STAGES,
                                PAIR_RELEASE, SCALE_TMA)),
                (_ws_consumer, (a_bufs, b_bufs, s_bufs, ready, empty, c_desc, c_bufs, as_ptr, bs_ptr, M, N, K,
                                stride_asm, stride_ask, stride_bsn, stride_bsk, 1, CONSUMERS, GROUP_M, STAGES,
                                PAIR_RELEASE, SCALE_TMA)),
                (_ws_producer, (a_desc, b_desc, s_desc, ready, empty, a_bufs, b_bufs, s_bufs, M, N, K, GROUP_M,
                                STAGES, SCALE_TMA)),
            ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_ws_consumer, (a_bufs, b_bufs, s_bufs, ready, empty, c_desc, c_bufs, as_ptr, bs_ptr, M, N, K,
                                stride_asm, stride_ask, stride_bsn, stride_bsk, 0, CONSUMERS, GROUP_M, STAGES,
                                PAIR_RELEASE, SCALE_TMA)),
                (_ws_producer, (a_desc, b_desc, s_desc, ready, empty, a_bufs, b_bufs, s_bufs, M, N, K, GROUP_M,
                                STAGES, SCALE_TMA)),
            ], [1], [_PRODUCER_REGS])


def pick_config(m: int, n: int, k: int, num_sms: int) -> dict:
    """Tiles, pipeline and partitions by shape, from H200 race 7 (kernels/bench/results/
    2026-12-02_h200_race7*: six V3 shapes x M = 64..4096, up to 21 candidates; the times below
    are over cuBLASLt blockwise's in the same run, two runs; race 7 also raced the single-stream
    kernel, since removed, whose configs had ``num_warps`` and no ``WS``: its race-6c defaults
    took 0.94-1.12x at M >= 1024 where these take 0.81-1.08x in race 7e).
    M >= 256: 128 x 128 tiles over two consumer warpgroups, one persistent program per SM;
    K <= 2048: 6 stages, each barrier freeing two stages (0.82-0.92x); K >= 16384: 5 stages,
    paired (0.96-1.04x; unpaired 1.06-1.07x); between, 5 stages unpaired with 16 row tiles
    walking the columns together (1.01-1.04x; paired 1.01-1.07x). Narrow N whose 128 x 128
    tiles fill under two waves (1024 x 2112: 136 tiles on 132 SMs): 128 x 64 tiles, 6 stages
    (264 tiles, two full waves: 0.86x against 0.98x).
    M < 256: 64-row tiles on one consumer warpgroup, two persistent programs per SM: 64 x 64
    tiles and 6 stages (0.74-1.01x), but 64 x 128 and 4 stages at K <= 1024 (0.95-0.97x, where
    64 x 64 took 0.92-1.12x)."""
    if m < 256:
        if k <= 1024:
            return dict(BLOCK_M=64, BLOCK_N=128, GROUP_M=8, STAGES=4, PERSISTENT=2)
        return dict(BLOCK_M=64, BLOCK_N=64, GROUP_M=8, STAGES=6, PERSISTENT=2)
    if n <= 2560 and triton.cdiv(m, 128) * triton.cdiv(n, 128) < 2 * num_sms:
        return dict(BLOCK_M=128, BLOCK_N=64, GROUP_M=8, STAGES=6, PERSISTENT=1)
    if k <= 2048:
        return dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=6, PERSISTENT=1, PAIR_RELEASE=True)
    if k >= 16384:
        return dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, STAGES=5, PERSISTENT=1, PAIR_RELEASE=True)
    return dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=16, STAGES=5, PERSISTENT=1)


def ws_registers(block_m: int, per_sm: int) -> tuple[int, int]:
    """(maxnreg, registers per consumer thread) of a launch: one consumer warpgroup per 64 rows
    of the tile, the producer keeping ``PRODUCER_REGS`` (``sm90_common.split_registers``)."""
    return split_registers(block_m // 64, per_sm, PRODUCER_REGS)


CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "GROUP_M", "STAGES", "PERSISTENT", "PAIR_RELEASE", "SCALE_TMA")
# the shortest K at which column-major activation scales are TMA-loaded unasked: H200 races
# 12-12b (kernels/bench/results/2026-12-03_h200_race12*_fp8.json) timed SCALE_TMA at 0.67-1.01x
# cuBLASLt's time at K >= 1536 where the pointer-loaded scales took 0.90-1.20x, but at K 512 and
# M <= 128 at 1.13-1.35x against 0.94-1.02x (a tie at M >= 1024)
SCALE_TMA_MIN_K = 1024


def smem_bytes(cfg: dict) -> int:
    """Shared memory of a launch: ``STAGES`` A and B tiles (128 fp8 columns each), each stage's
    activation scales with ``SCALE_TMA``, one 64-row output tile per consumer warpgroup (16-bit),
    two mbarriers a stage, and 256 bytes for the allocator's alignment."""
    bm, bn, st = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["STAGES"]
    return (st * (bm + bn) * BLOCK_K + (st * bm * 4 if cfg.get("SCALE_TMA") else 0) + (bm // 64) * 64 * bn * 2
            + 16 * st + 256)


def with_scale_tma(cfg: dict) -> dict:
    """``cfg`` with the producer TMA-loading the activation scales, one stage fewer where the
    scales' buffers would not fit beside the ring (6 stages of 128 x 128 tiles)."""
    out = dict(cfg, SCALE_TMA=True)
    while smem_bytes(out) > SMEM_BYTES and out["STAGES"] > 3:
        out["STAGES"] -= 1
    return out


def tma_scales(a_scale: torch.Tensor) -> bool:
    """Whether TMA can read the activation scales as their [K / 128, M] transpose: column-major
    (vLLM's layout), each K block's column 16-byte aligned (M a multiple of 4 when packed)."""
    return a_scale.stride(0) == 1 and (a_scale.stride(1) * 4) % 16 == 0 and a_scale.data_ptr() % 16 == 0


def scale_tma_default(a_scale: torch.Tensor, k: int) -> bool:
    """Whether ``fp8_gemm_sm90`` TMA-loads the activation scales unasked: ``tma_scales`` holds
    and K is at least ``SCALE_TMA_MIN_K``."""
    return k >= SCALE_TMA_MIN_K and tma_scales(a_scale)


def launch_config(config: dict) -> dict:
    """A config's keys for the kernel, checked: ``CONFIG_KEYS`` (``PERSISTENT``: programs per
    SM, 0 or absent for one program per tile; ``SCALE_TMA``: the producer TMA-loads each stage's
    activation scales, for column-major scales: ``fp8_gemm_sm90`` turns it on where
    ``scale_tma_default`` holds). Race 7's JSON records configs with ``WS=True``
    and ``num_warps=4`` from when the single-stream kernel ran beside this one; those two are
    accepted with those values."""
    cfg = dict(config)
    if cfg.pop("WS", True) is not True or cfg.pop("num_warps", 4) != 4:
        raise ValueError("fp8_gemm_sm90 config: the single-stream kernel (WS=False, num_warps != 4) was removed; "
                         "configs are warp-specialised")
    unknown = sorted(set(cfg) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"fp8_gemm_sm90 config: unknown keys {unknown}, expected some of {list(CONFIG_KEYS)}")
    if cfg.get("BLOCK_M") not in (64, 128) or cfg.get("BLOCK_N") not in (64, 128):
        raise ValueError(f"fp8_gemm_sm90 config: BLOCK_M and BLOCK_N must be 64 or 128, got "
                         f"{cfg.get('BLOCK_M')} x {cfg.get('BLOCK_N')}")
    if "STAGES" in cfg and smem_bytes(cfg) > SMEM_BYTES:
        raise ValueError(f"fp8_gemm_sm90 config: STAGES {cfg['STAGES']} of {cfg['BLOCK_M']} x {cfg['BLOCK_N']} tiles"
                         f"{' with SCALE_TMA' if cfg.get('SCALE_TMA') else ''} need {smem_bytes(cfg)} bytes of shared "
                         f"memory, more than the {SMEM_BYTES} an SM has")
    return cfg


def fp8_gemm_sm90(a, a_scale, b, b_scale, out_dtype=torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """Dense block-scaled FP8 GEMM on Hopper: [M, K] x [N, K]^T -> [M, N] (``supported`` must
    hold; shapes and scales as ``kernels.fp8_gemm.fp8_gemm`` checks them). With no ``config``:
    ``pick_config``'s tiles, and the activation scales TMA-loaded where ``scale_tma_default``
    holds (``with_scale_tma``)."""
    m, k = a.shape
    n = b.shape[0]
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    if config is None:
        config = pick_config(m, n, k, sms)
        if scale_tma_default(a_scale, k):
            config = with_scale_tma(config)
    cfg = launch_config(config)
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    per_sm = cfg.pop("PERSISTENT", 0)
    fp8 = gl.float8e4nv
    a_desc = TensorDescriptor.from_tensor(a, [bm, BLOCK_K], gl.NVMMASharedLayout.get_default_for([bm, BLOCK_K], fp8))
    b_desc = TensorDescriptor.from_tensor(b, [bn, BLOCK_K], gl.NVMMASharedLayout.get_default_for([bn, BLOCK_K], fp8))
    # each consumer warpgroup stores its own 64 rows
    c_desc = TensorDescriptor.from_tensor(
        out, [64, bn], gl.NVMMASharedLayout.get_default_for([64, bn], _GL_OUT[out_dtype]))
    scale_tma = bool(cfg.get("SCALE_TMA", False))
    s_desc = _scale_desc(a_scale, bm) if scale_tma else a_desc
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(tiles, per_sm * sms) if per_sm else tiles,)
    maxnreg, regs = ws_registers(bm, per_sm)
    _fp8_gemm_sm90_ws_kernel[grid](
        a_desc, b_desc, c_desc, s_desc, a_scale, b_scale, m, n, k,
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        GROUP_M=cfg["GROUP_M"], STAGES=cfg["STAGES"], CONSUMER_REGS=regs,
        PAIR_RELEASE=cfg.get("PAIR_RELEASE", False), SCALE_TMA=scale_tma, num_warps=4, maxnreg=maxnreg)
    return out


def _scale_desc(a_scale: torch.Tensor, block_m: int):
    """A TMA descriptor over column-major activation scales as their [K / 128, M] transpose,
    one K block's scales of a tile's rows per box; a ``ValueError`` when the scales are not laid
    out so (TMA needs the transpose's rows contiguous and 16-byte aligned: M a multiple of 4)."""
    m = a_scale.shape[0]
    t = a_scale.t()
    if not tma_scales(a_scale):
        raise ValueError(f"fp8_gemm_sm90 config SCALE_TMA: the activation scales must be column-major with M a "
                         f"multiple of 4 (got shape {tuple(a_scale.shape)}, strides {a_scale.stride()})")
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return TensorDescriptor(t, [t.shape[0], m], [t.stride(0), 1], [1, block_m], layout)
