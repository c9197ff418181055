"""W4A16 GEMM for decode batches (M <= 64) on Hopper in Gluon: packed weights loaded once into
the registers of the ``mma.sync`` operand they feed, no shared-memory round trip of the
dequantised tile.

Why a second W4A16 kernel: the Triton tile kernels (``w4a16_mma.py``) stage AutoAWQ's
[K, N / 8] tiles through shared memory and unpack them after the shared-memory reads (611
instructions per K step per warp in the v4 kernel's sm_90 build; race 5 found it
latency-bound at 13-38% of the weight-read roofline, kernels/README.md, W4A16). Here the
weights are repacked once, at load time (``repack``), into the order in which each thread
holds its ``mma.m16n8k16`` B fragments (the order Marlin, IST-DASLab/marlin, introduced for
the same reason):

- a K step covers ``BK = 32 KW`` rows and ``BN = 32 NREP`` columns (4 warps); thread
  ``t = 32 warp + 4 nlo + q`` holds columns ``n = 32 nrep + 8 warp + nlo`` and rows
  ``k = 32 kw + 16 k4 + 8 k3 + 2 q + k0`` (the B fragment of ``mma.m16n8k16``), its
  ``KW x NREP`` words contiguous (one 16-byte copy at ``KW x NREP = 4``);
- word ``j = KW nrep + kw`` holds 8 nibbles, nibble ``p`` the row with ``k0 = p // 4``,
  ``k3 = p % 2``, ``k4 = (p // 2) % 2``, so ``(w >> 4 i) & 0x000F000F`` is the pair of rows
  ``(k, k + 1)`` one 32-bit B register holds (i = 0: the first k16 slice's first register, 1:
  its second, 2 and 3: the next slice's);
- OR-ing that pair into 0x4300 (bf16 128; fp16 1024 = 0x6400) gives base + q exactly in both
  halves, and one ``sub.{bf16,f16}x2`` of base + z gives q - z exactly (small integers): 11
  instructions per 8 weights (3 shifts, 4 LOP3, 4 HSUB2);
- x (q - z) is summed in fp32 by the MMA over a scale group (128 rows) and the group's fp32
  scale multiplies those sums once, so the only rounding is the output's. Zero points come
  from AutoAWQ's own ``qzeros`` (the nibble of each thread's column), scales from ``scales``:
  only ``qweight`` is repacked, into the same number of bytes.

The tile is assembled by ``gl.join`` / ``reshape`` / ``permute`` in exactly the register order
of ``DotOperandLayout(1, mma v2, k_width=2)``: ``convert_layout(..., assert_trivial=True)``
makes a build fail if it ever needed data movement. A ring of ``STAGES`` shared-memory slots is
filled by ``cp.async`` (the packed words and the activations' [BM, BK] tile, BM 16, 32 or 64
rows, zero-filled past M); each slot is read once into registers (16-byte loads, ``ldmatrix``
for the activations); the next group's zero points and scales are loaded a group ahead. K is
split over ``SPLIT`` programs per column tile in whole groups; partial sums go to an fp32
workspace by atomic adds and the tile's last program writes the output
(``w4a16_mma._atomic_tile``'s scheme), or, in a CUDA-graph capture with no workspace yet, to a
[SPLIT, M, N] workspace summed by a second kernel. Defaults (``tile_for``, ``default_config``)
come from race 9 (kernels/README.md, W4A16).

Gluon kernels compile only for a GPU (no interpreter): ``unpack_repacked`` decodes the packed
words as the kernel does, in PyTorch, and ``dequant_packed`` (Triton, for large batches) runs
under the CPU interpreter, so the layout is tested on any machine; tests/kernels/
test_w4a16_sm90.py also builds the kernel for sm_90a here and checks it against the fp32
reference on a Hopper GPU."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import triton
import triton.language as tl

from kernels.sm90_common import HAVE_GLUON

GROUP = 128
WARPS = 4
T = 32 * WARPS  # threads per program
CONFIG_KEYS = ("NREP", "KW", "STAGES", "SPLIT")  # SPLIT None: default_config's programs per SM
MAX_M = 64  # at most 4 mma row blocks of 16 (sharing each dequantised B tile)
REPACK_BAND = 2**23  # weights unpacked at a time by repack (int64: 64 MB of temporaries)

if HAVE_GLUON:
    from kernels.sm90_common import async_copy, gl, gluon, mma_v2
    from kernels.sm90_common import cp_async as _cp_async
    from kernels.sm90_common import cta_barrier as _cta_barrier

    # (w >> 4i) & 0x000F000F | MAGIC: the pair of rows (k, k + 1) as base + q; minus base + z
    # (exact: small integers). $8 the packed word, $9 the base + zero pair; out $0-$7 the 8 rows.
    def _asm(kind: str) -> str:
        magic = "0x43004300" if kind == "bf16" else "0x64006400"
        lines = ["{", ".reg .b32 t0, t1, t2, t3, u;", f"lop3.b32 t0, $8, 0x000F000F, {magic}, 0xea;"]
        for i in (1, 2, 3):
            lines += [f"shr.u32 u, $8, {4 * i};", f"lop3.b32 t{i}, u, 0x000F000F, {magic}, 0xea;"]
        lines += [f"sub.{kind}x2 t{i}, t{i}, $9;" for i in range(4)]
        lines += [f"mov.b32 {{${2 * i}, ${2 * i + 1}}}, t{i};" for i in range(4)]
        return "\n".join(lines + ["}"])

    _T = gl.constexpr(T)
    _ASM_BF16 = gl.constexpr(_asm("bf16"))
    _ASM_F16 = gl.constexpr(_asm("f16"))


@dataclass(frozen=True)
class PackedW4:
    """AutoAWQ weights repacked for this kernel (``repack``): ``words`` int32, the B fragments
    of every [BK, BN] tile (column tiles outer, K steps inner); the checkpoint's ``qzeros``
    (int32 [K / 128, N / 8]) and ``scales`` ([K / 128, N]) as they are."""

    words: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    k: int
    n: int
    nrep: int
    kw: int


def _check_tile(nrep: int, kw: int):
    if nrep not in (1, 2, 4) or kw not in (1, 2, 4):
        raise ValueError(f"w4a16_sm90: NREP and KW must be 1, 2 or 4, got NREP={nrep!r}, KW={kw!r}")
    if nrep * kw < 4:
        raise ValueError(f"w4a16_sm90: NREP x KW must be at least 4 (a thread's words one 16-byte copy), "
                         f"got {nrep} x {kw}")


def repack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, nrep: int = 2, kw: int = 2) -> PackedW4:
    """AutoAWQ (qweight int32 [K, N / 8], qzeros int32 [K / 128, N / 8], scales [K / 128, N]) ->
    ``PackedW4`` with tiles of 32 ``kw`` rows by 32 ``nrep`` columns. Runs once per weight (at
    load), on the weights' device; any activation dtype (bf16, fp16) runs on the result."""
    from kernels.reference import awq_unpack

    _check_tile(nrep, kw)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    bk, bn = 32 * kw, 32 * nrep
    if k % GROUP or k % bk or n % bn:
        raise ValueError(f"w4a16_sm90: K ({k}) must be a multiple of {max(GROUP, bk)} and N ({n}) of {bn}")
    if qzeros.shape != (k // GROUP, n // 8) or scales.shape != (k // GROUP, n):
        raise ValueError(f"w4a16_sm90: qzeros must be [{k // GROUP}, {n // 8}] and scales [{k // GROUP}, {n}], got "
                         f"{list(qzeros.shape)} and {list(scales.shape)}")
    # column tiles are outermost in the packed order: unpack a band of them at a time, so the
    # int64 temporaries stay near 64 MB however large the weight (at load, beside the model)
    band = max(bn, (REPACK_BAND // k) // bn * bn)
    words = torch.empty(k * n // 8, dtype=torch.int32, device=qweight.device)
    for c0 in range(0, n, band):
        c1 = min(n, c0 + band)
        q = awq_unpack(qweight[:, c0 // 8:c1 // 8]).to(torch.int64)  # [K, c1 - c0]
        # rows k = 32 kw + 16 k4 + 8 k3 + 4 k2 + 2 k1 + k0 of K step kt; columns n = 32 nrep + 8 warp + nlo of tile nt
        q = q.view(k // bk, kw, 2, 2, 2, 2, 2, (c1 - c0) // bn, nrep, WARPS, 8)
        #            0     1  2(k4) 3(k3) 4(k2) 5(k1) 6(k0) 7           8     9      10
        # -> [nt, kt, warp, nlo, k2, k1 | nrep, kw | k0, k4, k3]: thread, word, nibble p = 4 k0 + 2 k4 + k3
        q = q.permute(7, 0, 9, 10, 4, 5, 8, 1, 6, 2, 3).reshape(-1, 8)
        w = torch.zeros(q.shape[0], dtype=torch.int64, device=q.device)
        for p in range(8):
            w |= q[:, p] << (4 * p)
        words[c0 * k // 8:c1 * k // 8] = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
    return PackedW4(words, qzeros.contiguous(), scales.contiguous(), k, n, nrep, kw)


def unpack_repacked(p: PackedW4) -> torch.Tensor:
    """fp32 [K, N] weights decoded from the packed words the way the kernel decodes them (thread
    t, word j, nibble pair i; the zero point from AutoAWQ's nibble of column n, the scale applied
    per group), in PyTorch."""
    from kernels.reference import awq_unpack

    bk, bn, J = 32 * p.kw, 32 * p.nrep, p.kw * p.nrep
    kt_n, nt_n = p.k // bk, p.n // bn
    w = p.words.to(torch.int64).view(nt_n, kt_n, T, J) & 0xFFFFFFFF
    dev = w.device
    t = torch.arange(T, device=dev)
    warp, nlo, qq = t // 32, (t % 32) // 4, t % 4
    j = torch.arange(J, device=dev)
    nrep, kw = j // p.kw, j % p.kw
    out = torch.empty(p.k, p.n, dtype=torch.float32, device=dev)
    z = awq_unpack(p.qzeros).float()
    s = p.scales.float()
    for nib in range(8):  # the kernel: pair i = nib % 4 from (w >> 4i) & 0x000F000F, row k0 = nib // 4
        i, k0 = nib % 4, nib // 4
        k3, k4 = i % 2, i // 2
        q = ((w >> (4 * nib)) & 0xF).float()  # [nt, kt, T, J]
        rows = (32 * kw[None, :] + 16 * k4 + 8 * k3 + 2 * qq[:, None] + k0)  # [T, J]
        cols = (32 * nrep[None, :] + 8 * warp[:, None] + nlo[:, None])  # [T, J]
        kk = (torch.arange(kt_n, device=dev)[:, None, None] * bk + rows[None]).expand(nt_n, -1, -1, -1)
        nn = (torch.arange(nt_n, device=dev)[:, None, None, None] * bn + cols[None, None]).expand(-1, kt_n, -1, -1)
        g = kk // GROUP
        out[kk.reshape(-1), nn.reshape(-1)] = ((q - z[g, nn]) * s[g, nn]).reshape(-1)
    return out


@triton.jit
def _dequant_packed_kernel(W, QZ, SC, OUT, N, KT, BN: tl.constexpr, KW: tl.constexpr, J: tl.constexpr):
    """One packed [32 KW, BN] tile -> OUT [K, N] in OUT's dtype: (q - z) * s in fp32, rounded
    once. Grid (N / BN, K / (32 KW)); thread t = 32 warp + 4 nlo + q, word j = KW nrep + kw,
    nibble p: k0 = p // 4, k3 = p % 2, k4 = (p // 2) % 2 (the kernel's order)."""
    nt = tl.program_id(0)
    kt = tl.program_id(1)
    t = tl.arange(0, 128)[:, None]
    j = tl.arange(0, J)[None, :]
    w = tl.load(W + (nt * KT + kt).to(tl.int64) * (128 * J) + t * J + j)
    n = nt * BN + 32 * (j // KW) + 8 * (t // 32) + (t % 32) // 4
    c8 = n % 8
    g = (kt * (32 * KW) + 32 * (j % KW)) // 128
    z = (tl.load(QZ + g * (N // 8) + n // 8) >> (((c8 % 2) * 4 + c8 // 2) * 4)) & 0xF
    s = tl.load(SC + g * N + n).to(tl.float32)
    for p in tl.static_range(8):
        k = kt * (32 * KW) + 32 * (j % KW) + 16 * ((p // 2) % 2) + 8 * (p % 2) + 2 * (t % 4) + p // 4
        q = (w >> (4 * p)) & 0xF
        tl.store(OUT + k.to(tl.int64) * N + n, ((q - z).to(tl.float32) * s).to(OUT.dtype.element_ty))


def dequant_packed(p: PackedW4, dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None) -> torch.Tensor:
    """[K, N] ``dtype`` weights from the packed layout (any GPU, or the CPU interpreter): the
    large-batch path runs cuBLAS on them, so a layer keeps only the packed words."""
    w = out if out is not None else torch.empty(p.k, p.n, dtype=dtype, device=p.words.device)
    bk, bn = 32 * p.kw, 32 * p.nrep
    _dequant_packed_kernel[(p.n // bn, p.k // bk)](p.words, p.qzeros, p.scales, w, p.n, p.k // bk, BN=bn, KW=p.kw,
                                                   J=p.kw * p.nrep, num_warps=4)
    return w


def tile_for(n: int, k: int) -> tuple[int, int] | None:
    """(NREP, KW) a weight of N columns is packed with: 32 x 128 (K x N) where 128 divides N
    (race 9 run 2: its 6-slot, 4-programs-per-SM launch beat every peer at every M 2-16 point of
    the 13 catalog shapes), else 64 x 64; None when 64 does not divide N or 128 K."""
    if k % GROUP:
        return None
    return (4, 1) if n % 128 == 0 else (2, 2) if n % 64 == 0 else None


def default_config(m: int, nrep: int, kw: int, n: int = 0, k: int = 0) -> dict:
    """Ring depth and programs per SM by packed tile, M and weight size, from race 9
    (kernels/bench/results/2026-12-03_h200_race9_w4a16_sm90_run*.json, 13 catalog shapes x M 1-16;
    run 3 times this rule). The 32 x 128 tile: 6 slots, 4 programs per SM; at M = 1 on weights
    under 20M values 8 and 8 (run 2: 0.99x and 1.02x the best peer's time on 2048 x 7168 and
    4096 x 4096, where 6 and 4 took 1.04x). The 64 x 64 tile (run 1): 4 slots and 8 programs per
    SM at M = 1, 6 and 4 above. M 17-64 take the M = 16 rule."""
    if (nrep, kw) == (4, 1):
        if m == 1 and n * k < 20 * 2**20:
            return dict(STAGES=8, PER_SM=8)
        return dict(STAGES=6, PER_SM=4)
    if m == 1:
        return dict(STAGES=4, PER_SM=8)
    return dict(STAGES=6, PER_SM=4)


def launch_config(m: int, n: int, k: int, num_sms: int, config: dict | None = None, packed: PackedW4 | None = None
                  ) -> dict:
    """The launch, checked: the packed tile (``NREP``, ``KW``: the ``repack`` arguments), ring
    slots ``STAGES`` and the K split ``SPLIT`` over scale groups (default ``default_config``:
    ``PER_SM`` programs per SM; groups split evenly, no empty split). A ``ValueError`` names the
    field."""
    nrep = packed.nrep if packed else (config or {}).get("NREP", 2)
    kw = packed.kw if packed else (config or {}).get("KW", 2)
    d = default_config(m, nrep, kw, n, k)
    cfg = dict(NREP=nrep, KW=kw, STAGES=d["STAGES"], SPLIT=None)
    per_sm = d["PER_SM"]
    if config:
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"w4a16_sm90 config: unknown keys {unknown}, expected some of {list(CONFIG_KEYS)}")
        cfg.update(config)
    _check_tile(cfg["NREP"], cfg["KW"])
    if packed is not None and (cfg["NREP"], cfg["KW"]) != (packed.nrep, packed.kw):
        raise ValueError(f"w4a16_sm90 config: NREP/KW {cfg['NREP']}/{cfg['KW']} differ from the packed weights' "
                         f"{packed.nrep}/{packed.kw} (repack with them)")
    if not isinstance(cfg["STAGES"], int) or not 2 <= cfg["STAGES"] <= 16:
        raise ValueError(f"w4a16_sm90 config: STAGES must be an int in [2, 16], got {cfg['STAGES']!r}")
    if not 1 <= m <= MAX_M:
        raise ValueError(f"w4a16_sm90: M must be in [1, {MAX_M}], got {m}")
    groups, tiles = k // GROUP, n // (32 * cfg["NREP"])
    split = cfg["SPLIT"]
    if split is None:
        split = max(1, min(groups, round(per_sm * num_sms / tiles)))
    if not isinstance(split, int) or split < 1:
        raise ValueError(f"w4a16_sm90 config: SPLIT must be an int >= 1, got {split!r}")
    per = -(-groups // min(split, groups))
    cfg.update(SPLIT=-(-groups // per), GROUPS_PER_SPLIT=per)  # no empty splits
    return cfg


if HAVE_GLUON:

    @gluon.jit
    def _issue(wbuf, xbuf, w_ptrs, x_ptrs, x_mask, step, s_end, KW: gl.constexpr, NREP: gl.constexpr,
               STAGES: gl.constexpr):
        """cp.async of K step ``step``'s packed words and activations into its slot (nothing past
        the program's last step: the group is committed empty). ``w_ptrs`` / ``x_ptrs`` point at
        step 0 of the program's column tile."""
        if step < s_end:
            slot = step % STAGES
            _cp_async(wbuf.index(slot), w_ptrs + step * (_T * KW * NREP))
            _cp_async(xbuf.index(slot), x_ptrs + step * (32 * KW), mask=x_mask)
        async_copy.commit_group()

    @gluon.jit
    def _zeros2(QZ, g, n_b, shift, ok, N, F16: gl.constexpr):
        """Group g's zero points of this thread's B columns as (base + z, base + z) pairs in the
        activation dtype: nibble ``shift`` of AutoAWQ's packed word."""
        zw = gl.load(QZ + (g.to(gl.int64) * (N // 8) + n_b // 8), mask=ok, other=0)
        z = (zw >> shift) & 0xF
        magic = 0x64006400 if F16 else 0x43004300
        return z | (z << 16) | magic

    @gluon.jit
    def _w4a16_sm90_kernel(X, W, QZ, SC, O, WS, CNT, M, N, K, stride_xm, stride_om, groups_per_split, nsplit,
                           NREP: gl.constexpr, KW: gl.constexpr, STAGES: gl.constexpr, F16: gl.constexpr,
                           REDUCE: gl.constexpr, BM: gl.constexpr, num_warps: gl.constexpr):
        """Grid (N / BN, SPLIT): column tile ``nt``, scale groups [split x groups_per_split, ...).
        REDUCE 0: one split, the output stored; 1: fp32 partials to WS[split]; 2: atomic split-K."""
        gl.static_assert(num_warps == 4, "4 warps: the packed tile's thread order")
        J: gl.constexpr = KW * NREP
        BK: gl.constexpr = 32 * KW
        BN: gl.constexpr = 32 * NREP
        SPG: gl.constexpr = 128 // BK  # K steps per scale group
        dt: gl.constexpr = gl.float16 if F16 else gl.bfloat16
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 4], instr_shape=[16, 8])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        wl: gl.constexpr = gl.BlockedLayout([1, J], [32, 1], [4, 1], [1, 0])
        XV: gl.constexpr = BK // 8  # 16-byte chunks per activation row
        xl: gl.constexpr = gl.BlockedLayout([1, 8], [32 // XV, XV], [4, 1], [1, 0])
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        xsh: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], dt)
        wbuf = gl.allocate_shared_memory(gl.int32, [STAGES, _T, J], plain)
        xbuf = gl.allocate_shared_memory(dt, [STAGES, BM, BK], xsh)

        nt = gl.program_id(0)
        sk = gl.program_id(1)
        KT = K // BK
        g0 = sk * groups_per_split
        g_end = gl.minimum(g0 + groups_per_split, K // 128)
        s0 = g0 * SPG
        s_end = g_end * SPG
        t = gl.arange(0, _T, layout=gl.SliceLayout(1, wl))
        j = gl.arange(0, J, layout=gl.SliceLayout(0, wl))
        xm = gl.arange(0, BM, layout=gl.SliceLayout(1, xl))
        xk = gl.arange(0, BK, layout=gl.SliceLayout(0, xl))
        # this thread's B columns (word j: 32 (j // KW) + 8 warp + nlo) and their AutoAWQ nibble
        n_b = nt * BN + 32 * (j // KW)[None, :] + ((t // 32) * 8 + (t % 32) // 4)[:, None]
        c8 = n_b % 8
        shift = ((c8 % 2) * 4 + c8 // 2) * 4
        # the accumulator's columns (the scales multiply the group's sum there)
        cols = nt * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
        w_ptrs = W + (nt.to(gl.int64) * KT * (_T * J) + (t[:, None] * J + j[None, :]))
        x_ptrs = X + (xm[:, None] * stride_xm + xk[None, :])
        x_mask = (xm < M)[:, None]
        for i in gl.static_range(STAGES - 1):
            _issue(wbuf, xbuf, w_ptrs, x_ptrs, x_mask, s0 + i, s_end, KW, NREP, STAGES)
        z_nxt = _zeros2(QZ, g0, n_b, shift, g0 < g_end, N, F16)
        s_nxt = gl.load(SC + (g0.to(gl.int64) * N + cols), mask=(cols < N) & (g0 < g_end), other=0.0)
        acc = gl.zeros([BM, BN], gl.float32, mma)
        for g in range(g0, g_end):
            z2 = z_nxt
            sc = s_nxt.to(gl.float32)
            z_nxt = _zeros2(QZ, g + 1, n_b, shift, g + 1 < g_end, N, F16)  # a group ahead
            s_nxt = gl.load(SC + ((g + 1).to(gl.int64) * N + cols), mask=(cols < N) & (g + 1 < g_end), other=0.0)
            part = gl.zeros([BM, BN], gl.float32, mma)
            for sub in gl.static_range(SPG):
                step = g * SPG + sub
                async_copy.wait_group(STAGES - 2)
                _cta_barrier()  # every thread's copies of this slot landed; the slot refilled below was read
                slot = step % STAGES
                w = wbuf.index(slot).load(wl)
                a = xbuf.index(slot).load(a_l)
                _issue(wbuf, xbuf, w_ptrs, x_ptrs, x_mask, step + STAGES - 1, s_end, KW, NREP, STAGES)
                if F16:
                    v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
                        _ASM_F16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, z2], dtype=[gl.float16] * 8, is_pure=True,
                        pack=1)
                else:
                    v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
                        _ASM_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, z2], dtype=[gl.bfloat16] * 8, is_pure=True,
                        pack=1)
                # output v = k0 + 2 k3 + 4 k4: joined innermost first, so the new dims are [k0, k3, k4]
                b = gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)), gl.join(gl.join(v4, v5), gl.join(v6, v7)))
                b = gl.reshape(b, [4, 8, 2, 2, NREP, KW, 2, 2, 2])  # warp, nlo, k2, k1, nrep, kw, k0, k3, k4
                b = gl.permute(b, [5, 8, 7, 2, 3, 6, 4, 0, 1])  # kw, k4, k3, k2, k1, k0 | nrep, warp, nlo
                b = gl.convert_layout(gl.reshape(b, [BK, BN]), b_l, assert_trivial=True)
                part = mma_v2(a, b, part)  # x (q - z), exact products, fp32 sums
            acc = acc + part * sc[None, :]
        async_copy.wait_group(0)

        rows = gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        if REDUCE == 0:
            gl.store(O + rows[:, None] * stride_om + cols[None, :], acc.to(dt), mask=mask)
        elif REDUCE == 1:
            gl.store(WS + (sk * M + rows[:, None]) * N + cols[None, :], acc, mask=mask)
        else:
            # split-K in one kernel: w4a16_mma._atomic_tile's scheme (fp32 adds into the zeroed
            # workspace, the tile's last program writes the output and zeroes the workspace)
            wsp = WS + rows[:, None] * N + cols[None, :]
            gl.atomic_add(wsp, acc, mask=mask, sem="relaxed")
            _cta_barrier()
            old = gl.atomic_add(CNT + nt, 1, sem="acq_rel")
            if old == nsplit - 1:
                v = gl.load(wsp, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(wsp, gl.zeros_like(v), mask=mask)
                gl.store(O + rows[:, None] * stride_om + cols[None, :], v.to(dt), mask=mask)
                gl.atomic_xchg(CNT + nt, 0, sem="relaxed")


def block_m(m: int) -> int:
    """The rows of the activation tile: 16, 32 or 64 (one to four mma row blocks)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


def supported(x: torch.Tensor, packed: PackedW4) -> bool:
    """Hopper, Gluon, bf16/fp16 rows, at most 64 of them."""
    if not (HAVE_GLUON and x.is_cuda) or torch.cuda.get_device_capability(x.device) != (9, 0):
        return False
    return x.dtype in (torch.bfloat16, torch.float16) and 1 <= x.reshape(-1, x.shape[-1]).shape[0] <= MAX_M


def w4a16_sm90(x: torch.Tensor, packed: PackedW4, config: dict | None = None) -> torch.Tensor:
    """x [..., K] (bf16 or fp16, at most 16 rows) @ the packed weights -> [..., N] in x's dtype.
    With a K split, the tile's partial sums meet in the per-stream atomic workspace; during a
    CUDA-graph capture that has none yet, in a [SPLIT, M, N] workspace and a second kernel."""
    from kernels.w4a16_mma import _atomic_workspace, _num_sms, _splitk_reduce_kernel

    if x.shape[-1] != packed.k:
        raise ValueError(f"w4a16_sm90: x has K = {x.shape[-1]}, the packed weights {packed.k}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"w4a16_sm90: x must be bf16 or fp16, got {x.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, packed.k)
    if x2.stride(-1) != 1 or x2.data_ptr() % 16 or (x2.stride(0) * x2.element_size()) % 16:
        x2 = x2.contiguous()
    m = x2.shape[0]
    cfg = launch_config(m, packed.n, packed.k, _num_sms(x.device), config, packed)
    out = torch.empty(m, packed.n, dtype=x.dtype, device=x.device)
    tiles = packed.n // (32 * cfg["NREP"])
    ws = cnt = out
    mode = 0
    if cfg["SPLIT"] > 1:
        got = _atomic_workspace(x.device, m * packed.n, tiles)
        if got is not None:
            ws, cnt = got
            mode = 2
        else:
            ws = torch.empty(cfg["SPLIT"], m, packed.n, dtype=torch.float32, device=x.device)
            mode = 1
    _w4a16_sm90_kernel[(tiles, cfg["SPLIT"])](
        x2, packed.words, packed.qzeros, packed.scales, out, ws, cnt, m, packed.n, packed.k, x2.stride(0),
        out.stride(0), cfg["GROUPS_PER_SPLIT"], cfg["SPLIT"], NREP=cfg["NREP"], KW=cfg["KW"], STAGES=cfg["STAGES"],
        F16=x.dtype == torch.float16, REDUCE=mode, BM=block_m(m), num_warps=4)
    if mode == 1:
        block = 1024
        _splitk_reduce_kernel[(-(-m * packed.n // block),)](ws, out, m * packed.n, SPLIT=cfg["SPLIT"], BLOCK=block)
    return out.view(*lead, packed.n)
