"""MLA paged decode for Hopper (sm_90) in Gluon: one warpgroup scores and runs the softmax, the
output's 512 columns split between two warpgroups, key blocks loaded by a TMA producer warp.

Same contract as ``kernels.mla_decode``'s split kernel: query row b, heads [64 hb, 64 hb + 64),
tokens [s * chunk, end) of sequence b (the last split takes the rest), partial output and
log2-sum-exp per split (``mla_decode``'s merge kernel combines them) or, with one split, the
output and LSE directly. 64 heads per program (a warpgroup MMA's rows), so the head count must be
a multiple of 64 (DeepSeek's 128 on one GPU; the 16-head TP8 case stays on the Triton kernel);
bf16/fp16 caches, or fp8 e4m3 ones (below), with pages of a multiple of 64 tokens.

Why a second kernel: the Triton kernel runs 64 heads x 512 output columns in one program whose
products, softmax and loads share one instruction stream (3.1x FlashMLA's instructions, the tensor
pipe 33% busy; kernels/README.md, MLA decode). Here, in partitions (``gl.warp_specialize``):

- a producer warp TMA-loads each 64-token key block, [64, 512] latent and [64, 64] rope, from its
  page (the block table read once per block) into a ring of ``STAGES``;
- consumer 0 (4 warps) stages the query block in shared memory ([64, 512] latent, [64, 64]
  rope) once. Per block it computes S_j = Q K_j^T, runs the online softmax, publishes P_j (bf16)
  and the rescale factor in shared memory for consumer 1, rescales its output columns
  [0, ``LEFT``) and issues O += P_j V_j on them (P from registers). With ``PREFETCH`` it issues
  S_{j+1} before it waits for that product, so the next block's scores run beside both
  consumers' products (at the price of block j + 2's load landing later, see ``launch_config``);
- consumer 1 (4 warps) owns the other output columns ([``LEFT``, 512): [256, 512) and, with LEFT
  128, [128, 256) in a second accumulator): per block it waits for P_j, rescales and issues
  O += P_j V_j on them (P from shared memory), then frees P.
A key block's slot is freed when both consumers' products retired. Keys past the sequence are
masked (p = 0), and on a partial last block the cache rows past it are zeroed in shared memory
before the products (an unwritten slot may hold anything, NaN included, and 0 x NaN is NaN).

The fp8 e4m3 cache (``_mla_sm90_fp8_kernel``, in ``kernels.mla_sm90_fp8``): Hopper's 8-bit
``wgmma`` takes K-major operands only, and V = the latent rows is N-major in P V, so the products
stay 16-bit: the producer TMA-loads fp8 key blocks into a ring of ``STAGES``, and each consumer
converts its 256 output columns of the next block (consumer 0 the rope columns too) into fp16
blocks the products read (exact: every e4m3 value is an fp16 value; ``cvt.rn.f16x2.e4m3x2``), rows
past the sequence written as zeros. With 64-token blocks (the default) Q, one fp16 block and two fp8 ones fill
shared memory, so each consumer converts after its P V of the current block retired (its own
columns are then free; the scores that read the others precede P); with 32-token blocks two fp16
blocks fit and the conversion runs under the P V, but the [64, 32] score products read Q from
shared memory twice as often (race 10b: 1.19-1.24x slower). Q is staged in fp16 (so |q| must stay
below 65,504, fp16's largest value), P is fp16, the per-tensor scale folds into the score and
output scales. ``mla_decode`` takes it for fp8 caches wherever it runs (race 10b: 2.2-2.4x the
Triton kernel's speed; 0.63-0.72x FlashMLA's on the bf16 cache, which has no fp8 dense decode).

``config={"QREG": 256}`` keeps Q's first 256 latent columns in consumer 0's registers for the
scores (a [64, 64] score product with both operands in shared memory needs all of its 128 bytes
a clock; race 16, H100: -1.7% to +4.3% against the same kernel without it, inside one run's
spread, so opt-in).

``config={"LAZY": True}`` rescales the output accumulators (consumer 1's 384 columns are 192
multiplies a thread a block) only when some row's running maximum rises by more than 2^8,
FlashAttention 4's conditional rescale (race 16, H100: 1-2% slower in four of five cases; opt-in).

``config={"CONVERT": "warpgroup"}`` runs the fp8 cache on ``kernels.mla_sm90_convert`` instead: a
converter warpgroup in place of the producer warp converts each block in five pieces as the
products free them, so the next block's scores start on the first pieces while the last are
still multiplied (race 16, H100: 0.94-0.98x the default's speed; opt-in).

``config={"QFP8": True}`` runs the fp8 cache on ``kernels.mla_sm90_qfp8`` instead: Q quantised to
e4m3 once per program, one scale per head row, and the scores one fp8 product straight from the
TMA-loaded block (both operands are K-major there), so they no longer wait for the block's fp16
conversion; each consumer converts only its own 256 output columns for its P V (races 22-23, H100:
1.11-1.22x the exact-Q kernel's speed). Q's rounding adds an error of the size the fp8 cache's own
adds (kernels/README.md), so opt-in.

``config={"PDL": True}`` launches the split kernel as a programmatic dependent launch, as FlashMLA
launches its decode: its programs are placed while the kernel before it drains and wait
(``griddepcontrol.wait``) before their first global access, then let the kernel behind them be
placed (``griddepcontrol.launch_dependents``); ``mla_decode`` launches the merge the same way,
its wait before it reads the partials (race 17: 0.97-1.03x the speed without it on an H100,
0.93-1.03x on an H200, so opt-in).

``config={"TILED": True}`` lands and frees each key block in pieces, each with its own
mbarriers (FlashMLA's kernel keeps one per [64, 64] tile): the rope, latent columns [0, 128),
[128, 256) and [256, 512). Consumer 0 issues the scores' products piece by piece as they land and
frees the rope with [0, 128) once its P V retired; consumer 1 issues both its products at once
([128, 256) first) and frees each of its pieces as its product retires (consumer 0's scores read
them too, but retired before P, which consumer 1's products follow); the producer loads the next
block into each piece as soon as that piece is free, instead of once the whole slot is (the load of
block j + 2 begins during block j's products instead of after them). Each piece's mbarriers are an
allocation of their own, and consumer 0 arrives twice a block: Triton 3.6 puts a barrier of the
partition's warps before every single-thread arrival and between two mbarrier operations on one
allocation, which gave consumer 0 eleven such barriers a block where the plain kernel has four
(race 21 took it to four). With ``QREG`` 256 it is ``mla_decode``'s default for bf16/fp16 caches
where the batch's programs fit two waves of the SMs (``default_for``; races 19 and 22).

``config={"SCHEDULE": "seesaw"}`` runs the bf16 cache on ``kernels.mla_sm90_seesaw`` instead,
FlashMLA's schedule (two warpgroups scoring alternate blocks); races 11 and 13 timed it at
0.86-0.90x and 0.92-0.96x this schedule's speed, so it stays opt-in.

``mla_decode`` takes it by default wherever ``supported`` holds (H200 race 9: 2.0-2.3x the Triton
kernel's speed; races 9-10c: 0.84-0.99x FlashMLA's; kernels/README.md, MLA decode).
Gluon kernels compile only for a GPU (no interpreter): tests/kernels/test_mla_sm90.py compiles
this one for sm_90a on any machine (``kernels.bench.sm90.mla_sm90_build``) and checks it against
the float64 reference on a Hopper GPU."""

from __future__ import annotations

import torch

from kernels.mla_sm90_convert import CONVERTER_REGS, HALVES
from kernels.mla_sm90_parts import PRODUCER_REGS
from kernels.mla_sm90_qfp8 import P8_SCALE
from kernels.sm90_common import HAVE_GLUON, SMEM_BYTES, split_registers

if HAVE_GLUON:
    from kernels.mla_sm90_parts import (_PRODUCER_REGS, _producer, _producer_tiled, _qk, _qk_tiled, _read_flag,
                                        _softmax_publish, _span, _stage_q, _write_out_l, _write_out_scorer, _zero_tail)
    from kernels.mla_sm90_convert import _mla_sm90_convert_kernel
    from kernels.mla_sm90_fp8 import _mla_sm90_fp8_kernel
    from kernels.mla_sm90_qfp8 import _mla_sm90_qfp8_kernel
    from kernels.mla_sm90_seesaw import _mla_sm90_seesaw_kernel
    from kernels.sm90_common import GL_DTYPE as _GL
    from kernels.sm90_common import (TensorDescriptor, gdc_launch, gdc_wait, gl, gluon, mbarrier, release, warpgroup_mma,
                                     warpgroup_mma_wait)
    from kernels.sm90_common import cta_barrier as _cta_barrier
    from kernels.sm90_common import wgmma_layout

KV_LORA = 512
ROPE = 64
BLOCK_H = 64  # heads per program: the rows of one warpgroup MMA
BLOCK_N = 64  # tokens per key block
CONFIG_KEYS = ("STAGES", "LEFT", "PREFETCH", "QREG", "LAZY", "PDL", "TILED", "HSTAGES", "BLOCK_N", "SCHEDULE",
               "CONVERT", "QFP8")
# TILED: a key block's four pieces, each landing on its own mbarrier (rope, latent [0, 128),
# [128, 256), [256, 512)), freed on three: the first two by consumer 0 once its P V retired (it alone
# reads them), each of the others by consumer 1 once its product on it retired (consumer 0's scores
# read them too, but those retired before P, which consumer 1's product follows)
TILE_GROUPS = 4
TILE_FREES = 3
if HAVE_GLUON:
    _TILE_GROUPS = gl.constexpr(TILE_GROUPS)
    _TILE_FREES = gl.constexpr(TILE_FREES)
SCHEDULES = ("split", "seesaw")  # kernels.mla_sm90_seesaw: the second
CONVERTS = ("consumers", "warpgroup")  # the fp8 cache's conversion; kernels.mla_sm90_convert: the second
# mla_decode's choice for a bf16/fp16 cache when the caller names no keys: TILED with QREG 256 where
# the batch's programs before splitting fit on the SMs in WAVE_DEFAULT_WAVES waves (batch x head
# blocks <= 2 x SMs), the plain split kernel elsewhere. Races 19, 19c and 19d (H100s, FlashMLA in
# each run, 128 heads; kernels/bench/results/2026-12-07_h100_race19_mla_*, _race19{c,d}_mla_order_*):
# TILED+QREG ran 1.02-1.05x the plain kernel at B 32 4k in all twenty-one runs, 1.02-1.05x at B 64
# 4k in the sixteen scrub-timer runs (0.995-1.09x under the layers timer), 0.98-1.13x at 32k; at
# B 128 4k (two programs per SM) 0.90-0.96x under race 19's layers timer and 0.99-1.04x in races
# 19c-19d, so it was left off there. Race 22 (H100, after race 21 took the TILED build's consumer 0
# from eleven partition barriers a block to four; _race22_summary.json) timed it at B 128 4k
# 1.045-1.061x the plain kernel in all four runs (FlashMLA's time over ours 0.931-0.938 against
# 0.884-0.897), so two waves take it now; past two waves it is unraced and stays off. The rule
# counts programs (one per 64 heads of a sequence, the same work at any head count).
WAVE_DEFAULT_WAVES = 2
WAVE_DEFAULT = {"TILED": True, "QREG": 256}
# whether mla_decode takes this kernel for an fp8 cache unasked: race 10b timed its 64-token path
# at 2.21-2.41x the Triton kernel's speed (kernels/bench/results/2026-12-03_h200_race10b_mla.json)
FP8_DEFAULT = True


def smem_bytes(stages: int, itemsize: int = 2, tiled: bool = False) -> int:
    """Q [64, 576], ``stages`` key blocks [64, 576], the P buffer [64, 64], the rescale factors,
    the row sums and the mbarriers (``tiled``: four ready and three free ones a slot)."""
    bars = TILE_GROUPS + TILE_FREES if tiled else 2
    return (itemsize * (BLOCK_H * (KV_LORA + ROPE) + stages * BLOCK_N * (KV_LORA + ROPE) + BLOCK_H * BLOCK_N)
            + 4 * 2 * BLOCK_H + 8 * (bars * stages + 3))


def smem_bytes_seesaw() -> int:
    """The seesaw schedule (``kernels.mla_sm90_seesaw``): Q and two key blocks [64, 576], P_b
    [64, 64] (the rescaled P_a goes into block a's rope rows), m_a and m_b, the rescale factor,
    both row sums, 25 mbarriers (one per [64, 64] tile of each slot, 18, and 7 hand-overs)."""
    return 2 * (3 * BLOCK_N * (KV_LORA + ROPE) + BLOCK_H * BLOCK_N) + 4 * 5 * BLOCK_H + 8 * 25


def smem_bytes_fp8(stages: int, hstages: int, block_n: int) -> int:
    """The fp8 path: Q [64, 576] fp16, ``stages`` fp8 key blocks [block_n, 576], ``hstages`` fp16
    ones, the P buffers [64, block_n] fp16 (two, one with a single fp16 block), the rescale
    factors, the row sums and the mbarriers."""
    row, np_ = KV_LORA + ROPE, 1 if hstages == 1 else 2
    return (2 * BLOCK_H * row + stages * block_n * row + hstages * 2 * block_n * row + np_ * 2 * BLOCK_H * block_n
            + 4 * (np_ + 1) * BLOCK_H + 8 * (2 * stages + 2 * hstages + 2 * np_ + 1))


def smem_bytes_qfp8(stages: int, hstages: int, pv8: bool = False) -> int:
    """The fp8 path with fp8 scores (``kernels.mla_sm90_qfp8``): Q [64, 576] e4m3, ``stages`` fp8
    key blocks [64, 576], consumer 0's fp16 block [64, 256] and ``hstages`` of consumer 1's, two P
    buffers [64, 64] fp16 (``pv8``: those buffers in fp8), the rescale factors, the row sums and
    the mbarriers."""
    row, el = KV_LORA + ROPE, 1 if pv8 else 2
    return (BLOCK_H * row + stages * BLOCK_N * row + (1 + hstages) * el * BLOCK_N * 256 + 2 * el * BLOCK_H * BLOCK_N
            + 4 * 3 * BLOCK_H + 8 * (2 * stages + 5))


def launch_config_fp8(config: dict | None) -> dict:
    """The fp8 cache's launch, checked: key blocks of ``BLOCK_N`` tokens (32 or 64), ``STAGES``
    of them in fp8 in the TMA ring, ``HSTAGES`` in fp16 for the products (with one, each
    consumer converts its columns of the next block after its product of this one instead of
    under it); consumer 0 on output columns [0, 256) (``LEFT``, fixed: consumer 1 takes the other
    256 in one accumulator). Beside Q, 32-token blocks fit 4 fp8 + 2 fp16 (or 2 + 3), 64-token
    ones 2 fp8 + 1 fp16, the default: race 10b timed it 1.19-1.24x the 32-token rings' speed (their
    scores are [64, 32] products, whose Q operand is read from shared memory twice as often).
    ``CONVERT``: who converts, "consumers" (this kernel) or "warpgroup" (``kernels.mla_sm90_convert``:
    a converter warpgroup, piece by piece as the products free them; its layout is fixed: 64-token
    blocks, 2 fp8 + 1 fp16). A ``ValueError`` names the field."""
    if (config or {}).get("QFP8", False) is not False:
        return _launch_config_qfp8(config)
    cfg = dict(BLOCK_N=64, STAGES=2, HSTAGES=1, LEFT=256, CONVERT="consumers")
    if (config or {}).get("PV8", False) is not False:
        raise ValueError(f"mla_sm90 config (fp8 cache): PV8 (P V as an fp8 product) needs QFP8 true (the fp8 scores' "
                         f"kernel), got PV8 {config['PV8']!r} without it")
    config = {k: v for k, v in (config or {}).items() if k not in ("QFP8", "PV8")}
    _refuse_unknown(config, cfg, "fp8 cache")
    cfg.update({k: v for k, v in config.items() if k in cfg})
    if cfg["CONVERT"] not in CONVERTS:
        raise ValueError(f"mla_sm90 config (fp8 cache): CONVERT must be one of {list(CONVERTS)}, got {cfg['CONVERT']!r}")
    if cfg["CONVERT"] == "warpgroup":
        _refuse_unfixed(cfg, dict(BLOCK_N=64, STAGES=2, HSTAGES=1, LEFT=256), "fp8 cache", "CONVERT 'warpgroup'")
        return cfg
    if cfg["BLOCK_N"] not in (32, 64):
        raise ValueError(f"mla_sm90 config (fp8 cache): BLOCK_N must be 32 or 64, got {cfg['BLOCK_N']!r}")
    _check_rings(cfg, "fp8 cache")
    if cfg["LEFT"] != 256:
        raise ValueError(f"mla_sm90 config (fp8 cache): LEFT must be 256 (two warpgroups of 256 output columns), "
                         f"got {cfg['LEFT']!r}")
    need = smem_bytes_fp8(cfg["STAGES"], cfg["HSTAGES"], cfg["BLOCK_N"])
    if need > SMEM_BYTES:
        raise ValueError(f"mla_sm90 config (fp8 cache): BLOCK_N {cfg['BLOCK_N']}, STAGES {cfg['STAGES']} and HSTAGES "
                         f"{cfg['HSTAGES']} need {need} bytes of shared memory, more than the {SMEM_BYTES} an SM has")
    return cfg


def _launch_config_qfp8(config: dict) -> dict:
    """``QFP8``: Q quantised to e4m3 per head row and the scores as one fp8 product
    (``kernels.mla_sm90_qfp8``); 64-token blocks, ``STAGES`` fp8 ones in the TMA ring (default 2),
    ``HSTAGES`` of consumer 1's fp16 blocks (default 2: its conversion of the next block under its
    P V; 1 leaves room for 3 stages); LEFT 256 and the consumers converting, fixed. ``PV8`` (default
    false): P V as an 8-bit product as well, P in e4m3 and the blocks transposed in fp8."""
    if config["QFP8"] is not True:
        raise ValueError(f"mla_sm90 config (fp8 cache): QFP8 (fp8 scores against Q quantised per row) must be true "
                         f"or false, got {config['QFP8']!r}")
    cfg = dict(BLOCK_N=64, STAGES=2, HSTAGES=2, LEFT=256, CONVERT="consumers", QFP8=True, PV8=False)
    _refuse_unknown(config, cfg, "fp8 cache, QFP8")
    _refuse_unfixed(config, dict(BLOCK_N=64, LEFT=256, CONVERT="consumers"), "fp8 cache", "QFP8")
    cfg.update({k: config[k] for k in ("STAGES", "HSTAGES", "PV8") if k in config})
    if not isinstance(cfg["PV8"], bool):
        raise ValueError(f"mla_sm90 config (fp8 cache, QFP8): PV8 (P V as an fp8 product) must be true or false, "
                         f"got {cfg['PV8']!r}")
    _check_rings(cfg, "fp8 cache, QFP8")
    need = smem_bytes_qfp8(cfg["STAGES"], cfg["HSTAGES"], cfg["PV8"])
    if need > SMEM_BYTES:
        raise ValueError(f"mla_sm90 config (fp8 cache, QFP8): STAGES {cfg['STAGES']} and HSTAGES {cfg['HSTAGES']} "
                         f"{'with PV8 ' if cfg['PV8'] else ''}need {need} bytes of shared memory, more than the "
                         f"{SMEM_BYTES} an SM has")
    return cfg


_SPLIT_ONLY = ("PREFETCH", "QREG", "LAZY", "PDL", "TILED")  # the bf16 kernel's keys: refused on fp8 unless off


def _refuse_unknown(config: dict, cfg: dict, label: str) -> None:
    """A ``ValueError`` naming the keys of ``config`` the fp8 launch ``cfg`` does not take (the bf16
    kernel's own pass when off)."""
    bad = sorted(k for k, v in config.items() if k not in cfg and not (k in _SPLIT_ONLY and not v))
    if bad:
        raise ValueError(f"mla_sm90 config ({label}): {bad} do not apply, expected some of {sorted(cfg)}")


def _refuse_unfixed(values: dict, fixed: dict, label: str, who: str) -> None:
    """A ``ValueError`` naming the keys of ``values`` that ``who`` fixes to other values."""
    bad = sorted(k for k in fixed if k in values and values[k] != fixed[k])
    if bad:
        said = ", ".join(f"{k} {v!r}" for k, v in fixed.items())
        raise ValueError(f"mla_sm90 config ({label}): {who} fixes {bad} ({said}), got {({k: values[k] for k in bad})}")


def _check_rings(cfg: dict, label: str) -> None:
    """``STAGES`` and ``HSTAGES`` must be ints >= 1; a ``ValueError`` names the field."""
    for key in ("STAGES", "HSTAGES"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 1:
            raise ValueError(f"mla_sm90 config ({label}): {key} must be an int >= 1, got {cfg[key]!r}")


_FLAGS = {"LAZY": "the lazy rescale", "PDL": "programmatic dependent launch", "TILED": "per-piece key-block barriers"}


def _flag(config: dict, key: str) -> bool:
    """``config[key]`` (False when absent), which must be a bool; a ``ValueError`` names it."""
    v = config.get(key, False)
    if not isinstance(v, bool):
        raise ValueError(f"mla_sm90 config: {key} ({_FLAGS[key]}) must be true or false, got {v!r}")
    return v


def launch_config(config: dict | None, fp8: bool = False) -> dict:
    """The launch, checked: 2 stages (Q and two key blocks, 72 KB each, and P fill the 227 KB of an
    SM's shared memory); consumer 0 keeps output columns [0, ``LEFT``) beside the scores (128:
    no spills under Triton 3.6, where 256 spilled 80 bytes). ``PREFETCH`` issues block j + 1's
    scores before block j's slot is freed (they then run beside the products, but with two slots
    block j + 2's load has only the softmax to land); without it, block j's scores start block
    j's turn (races 10c-11: 0.90-0.94x the default's speed). ``SCHEDULE``: "split" (this kernel) or
    "seesaw" (``kernels.mla_sm90_seesaw``, whose layout is fixed: 2 stages, 256 columns a
    warpgroup, no prefetch, no QREG; it takes ``LAZY``). ``QREG`` 256: consumer 0 keeps the first 256 latent columns of Q in
    registers for the scores (a fifth less shared-memory traffic in the score product, whose
    [64, 64] tiles with both operands in shared memory ask for all 128 bytes a clock an SM's
    shared memory gives); with LEFT 128 and no prefetch only (beside 256 output columns or a
    prefetched score tile the registers spill). ``LAZY``: the lazy rescale (``_softmax_step``:
    the accumulators rescaled only when some row's maximum rises by more than 2^8). ``PDL``:
    launched as a programmatic dependent launch (CUDA's PDL, as FlashMLA launches its decode), so
    its programs are placed while the kernel before it drains, and wait (``griddepcontrol.wait``)
    before their first global access; the merge behind it is launched so too (``mla_decode``).
    ``TILED``: a key block lands and is freed in four pieces with their own mbarriers (with LEFT
    128 and no prefetch: the pieces follow who reads which columns; ``QREG`` too).
    A ``ValueError`` names the field. ``fp8``: ``launch_config_fp8``."""
    if fp8:
        if (config or {}).get("SCHEDULE", "split") != "split":
            raise ValueError("mla_sm90 config: SCHEDULE 'seesaw' takes a bf16/fp16 cache only")
        return launch_config_fp8({k: v for k, v in (config or {}).items() if k != "SCHEDULE"})
    fp8_only = sorted({"HSTAGES", "BLOCK_N", "CONVERT", "QFP8", "PV8"} & set(config or {}))
    if fp8_only:
        raise ValueError(f"mla_sm90 config: {fp8_only} (the fp8 path's blocks, conversion and scores) apply to an fp8 cache "
                         f"only")
    config = dict(config or {})
    schedule = config.get("SCHEDULE", "split")
    if schedule not in SCHEDULES:
        raise ValueError(f"mla_sm90 config: SCHEDULE must be one of {list(SCHEDULES)}, got {schedule!r}")
    if schedule == "seesaw":  # its layout is fixed: two slots, 256 output columns a warpgroup, no prefetch
        fixed = dict(STAGES=2, LEFT=256, PREFETCH=False, QREG=0)
        bad = sorted(k for k in fixed if k in config and config[k] != fixed[k])
        if bad:
            raise ValueError(f"mla_sm90 config: SCHEDULE 'seesaw' fixes {bad} (STAGES 2, LEFT 256, PREFETCH and QREG "
                             f"off), "
                             f"got {({k: config[k] for k in bad})}")
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"mla_sm90 config: unknown keys {unknown}, expected some of {list(CONFIG_KEYS)}")
        for key in ("PDL", "TILED"):
            if config.get(key, False):
                raise ValueError(f"mla_sm90 config: {key} ({_FLAGS[key]}) applies to the split schedule only, "
                                 f"got {key} {config[key]!r} with SCHEDULE 'seesaw'")
        return dict(fixed, LAZY=_flag(config, "LAZY"), SCHEDULE="seesaw")
    cfg = dict(STAGES=2, LEFT=128, PREFETCH=False, QREG=0, LAZY=False, PDL=False, TILED=False, SCHEDULE="split")
    if config:
        unknown = sorted(set(config) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"mla_sm90 config: unknown keys {unknown}, expected some of {list(CONFIG_KEYS)}")
        cfg.update(config)
    if not isinstance(cfg["STAGES"], int) or cfg["STAGES"] < 2:
        raise ValueError(f"mla_sm90 config: STAGES must be an int >= 2 (the next block's scores are issued before "
                         f"this block's slot is freed), got {cfg['STAGES']!r}")
    if cfg["LEFT"] not in (128, 256):
        raise ValueError(f"mla_sm90 config: LEFT (consumer 0's output columns) must be 128 or 256, got {cfg['LEFT']!r}")
    _flag(cfg, "LAZY")
    _flag(cfg, "PDL")
    if _flag(cfg, "TILED") and (cfg["LEFT"] != 128 or cfg["PREFETCH"]):
        raise ValueError(f"mla_sm90 config: TILED (per-piece key-block barriers) needs LEFT 128 and PREFETCH off (its "
                         f"pieces follow consumer 0's 128 output columns), got LEFT {cfg['LEFT']!r}, PREFETCH "
                         f"{cfg['PREFETCH']!r}")
    if cfg["QREG"] not in (0, 256):
        raise ValueError(f"mla_sm90 config: QREG (Q's latent columns in registers) must be 0 or 256, got {cfg['QREG']!r}")
    if cfg["QREG"] and (cfg["LEFT"] != 128 or cfg["PREFETCH"]):
        raise ValueError(f"mla_sm90 config: QREG 256 needs LEFT 128 and PREFETCH off (else consumer 0's registers "
                         f"spill), got LEFT {cfg['LEFT']!r}, PREFETCH {cfg['PREFETCH']!r}")
    need = smem_bytes(cfg["STAGES"], tiled=cfg["TILED"])
    if need > SMEM_BYTES:
        raise ValueError(f"mla_sm90 config: STAGES {cfg['STAGES']} need {need} bytes of shared memory, more than the "
                         f"{SMEM_BYTES} an SM has")
    return cfg


def default_for(batch: int, heads: int, sms: int, fp8: bool) -> dict:
    """The keys ``mla_decode`` gives this kernel when its caller names none: ``WAVE_DEFAULT`` for
    a bf16/fp16 cache whose batch fits ``WAVE_DEFAULT_WAVES`` waves before splitting (``batch *
    heads / BLOCK_H <= 2 * sms``), nothing otherwise (the fp8 path and larger batches keep
    ``launch_config``'s defaults)."""
    if fp8 or batch < 1 or sms < 1:
        return {}
    return dict(WAVE_DEFAULT) if batch * -(-heads // BLOCK_H) <= WAVE_DEFAULT_WAVES * sms else {}


def supported(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether this kernel runs these operands: a Hopper GPU, Gluon, 16-bit q with a cache of its
    dtype or fp8 e4m3, a multiple of 64 heads, pages of a multiple of 64 tokens stored one after
    another, and rows TMA can address."""
    if not (HAVE_GLUON and q.is_cuda) or torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or kv_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        return False
    nh, page = q.shape[1], kv_cache.shape[1]
    if nh % BLOCK_H or page % BLOCK_N:
        return False
    es = kv_cache.element_size()
    return (kv_cache.stride(2) == 1 and kv_cache.stride(0) == page * kv_cache.stride(1)
            and (kv_cache.stride(1) * es) % 16 == 0 and kv_cache.data_ptr() % 16 == 0 and q.stride(2) == 1)


if HAVE_GLUON:

    @gluon.jit
    def _scorer(q_smem, q_pe, kv_bufs, pe_bufs, p_bufs, alpha_smem, l_smem, kv_ready, kv_empty, p_ready, p_free, l_ready,
                Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, score_scale, out_scale,
                SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr, LEFT: gl.constexpr,
                PREFETCH: gl.constexpr, QREG: gl.constexpr, LAZY: gl.constexpr, flag_smem, TILED: gl.constexpr):
        """Consumer 0: the scores, the softmax and output columns [0, LEFT); with ``QREG`` the
        scores' first QREG latent columns of Q from registers; with ``LAZY`` the lazy rescale
        (``_softmax_step``), its flag published for consumer 1; with ``TILED`` the scores issued
        piece by piece as the block lands, and the pieces only they read (the rope; consumer 1's
        columns, for its part) freed as soon as they retired."""
        s_layout: gl.constexpr = wgmma_layout(64)
        o_layout: gl.constexpr = wgmma_layout(LEFT)
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        heads = gl.program_id(0) * 64
        _stage_q(q_smem, q_pe, Q + b.to(gl.int64) * stride_qb + heads * stride_qh, stride_qh)
        q_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        if TILED:  # Q's first QREG latent columns in registers, one tensor per 128-column piece
            q_reg = q_smem.slice(0, 128, dim=1).load(q_op) if QREG else 0
            q_reg1 = q_smem.slice(128, 128, dim=1).load(q_op) if QREG else 0
        else:
            q_reg = q_smem.slice(0, QREG, dim=1).load(q_op) if QREG else 0
            q_reg1 = 0
        acc = gl.zeros([64, LEFT], gl.float32, o_layout)
        m_i = gl.full([64], -1.0e30, gl.float32, row_s)
        l_i = gl.zeros([64], gl.float32, row_s)
        sc = gl.zeros([64, 64], gl.float32, s_layout)
        if n_blocks > 0:
            if PREFETCH:
                mbarrier.wait(kv_ready.index(0), 0)
                s_tok = _qk(q_smem, q_pe, kv_bufs, pe_bufs, 0, sc, q_reg, QREG)
                sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
            for j in range(n_blocks):
                st = j % STAGES
                if TILED:  # this block's scores as its pieces land. (The rope is freed with latent [0, 128)
                    # after P V; [128, 512) by consumer 1, whose P V follows P, which follows these scores.)
                    s_tok = _qk_tiled(q_smem, q_pe, kv_bufs, pe_bufs, kv_ready, st, (j // STAGES) & 1, sc, q_reg,
                                      q_reg1, QREG)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                elif not PREFETCH:  # this block's scores now: its slot had a whole block to load
                    mbarrier.wait(kv_ready.index(st), (j // STAGES) & 1)
                    s_tok = _qk(q_smem, q_pe, kv_bufs, pe_bufs, st, sc, q_reg, QREG)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
                tok0 = start + j * 64
                acc, p_op, m_i, l_i = _softmax_publish(sc, m_i, l_i, acc, j, tok0, end, score_scale, p_bufs,
                                                       alpha_smem, p_ready, p_free, p_layout, LAZY, flag_smem)
                if tok0 + 64 > end:  # the partial last block: its cache rows past the end zeroed before P V
                    _zero_tail(kv_bufs.index(st).slice(0, LEFT, dim=1), end - tok0)
                o_tok = warpgroup_mma(p_op, kv_bufs.index(st).slice(0, LEFT, dim=1), acc, is_async=True)
                if PREFETCH and j + 1 < n_blocks:  # the next block's scores beside both halves' products
                    st1 = (j + 1) % STAGES
                    mbarrier.wait(kv_ready.index(st1), ((j + 1) // STAGES) & 1)
                    s_nxt = _qk(q_smem, q_pe, kv_bufs, pe_bufs, st1, sc, q_reg, QREG)
                    acc, p_op, sc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op, s_nxt))
                else:
                    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_op))
                if TILED:  # the rope and latent [0, 128): its scores and P V retired
                    release(kv_empty[0].index(st))
                else:
                    release(kv_empty.index(st))
        _write_out_scorer(acc, l_i, m_i, l_smem, l_ready, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh,
                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale,
                          o_layout, SINGLE, STORE_LSE)

    @gluon.jit
    def _split_producer(kv_desc, pe_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk, PAGE,
                        STAGES: gl.constexpr, TILED: gl.constexpr):
        """The split kernel's producer warp: whole key blocks (``_producer``) or, ``TILED``, their
        pieces through the [64, 64] descriptor (``_producer_tiled``)."""
        if TILED:
            _producer_tiled(pe_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk, PAGE, STAGES)
        else:
            _producer(kv_desc, pe_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk, PAGE, STAGES)

    @gluon.jit
    def _pv_issue(acc, p_smem, kv_st, alpha, tok0, end, COL0: gl.constexpr, grow=1):
        """Issue acc (output columns [COL0, COL0 + its width)) rescaled (with ``LAZY`` only when
        consumer 0's flag ``grow`` says so) + P V of those columns, P from shared memory, a
        partial last block's rows past the sequence zeroed first; returns the product's token."""
        W: gl.constexpr = acc.shape[1]
        if tok0 + 64 > end:
            _zero_tail(kv_st.slice(COL0, W, dim=1), end - tok0)
        if grow != 0:  # (without LAZY the constant 1)
            acc = acc * alpha[:, None]
        return warpgroup_mma(p_smem, kv_st.slice(COL0, W, dim=1), acc, is_async=True)

    @gluon.jit
    def _pv_part(acc, p_smem, kv_st, alpha, tok0, end, COL0: gl.constexpr, grow=1):
        """``_pv_issue``, waited."""
        tok = _pv_issue(acc, p_smem, kv_st, alpha, tok0, end, COL0, grow)
        return warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

    @gluon.jit
    def _right(kv_bufs, p_bufs, alpha_smem, l_smem, kv_ready, kv_empty, p_ready, p_free, l_ready, SEQ, O, LSE, OP,
               LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb,
               stride_lsh, chunk, out_scale, SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr,
               LEFT: gl.constexpr, LAZY: gl.constexpr, flag_smem, TILED: gl.constexpr):
        """Consumer 1: output columns [LEFT, 512), P from shared memory: [256, 512) in one
        accumulator, with LEFT = 128 columns [128, 256) in a second (a slice of the key block
        starts at a multiple of its width). ``TILED``: both products issued at once, [128, 256)
        first, each piece freed as its product retires."""
        la: gl.constexpr = wgmma_layout(256)
        lb: gl.constexpr = wgmma_layout(256 - LEFT if LEFT < 256 else 256)
        NP: gl.constexpr = p_bufs.shape[0]
        b, s, start, end, n_blocks = _span(SEQ, chunk, 64)
        acc_a = gl.zeros([64, 256], gl.float32, la)
        if LEFT < 256:
            acc_b = gl.zeros([64, 256 - LEFT], gl.float32, lb)
        for j in range(n_blocks):
            st = j % STAGES
            pb = j % NP
            if TILED:  # (P_j follows all of block j; these waits make its pieces' bytes ours to read)
                mbarrier.wait(kv_ready[2].index(st), (j // STAGES) & 1)
                mbarrier.wait(kv_ready[3].index(st), (j // STAGES) & 1)
            else:
                mbarrier.wait(kv_ready.index(st), (j // STAGES) & 1)
            mbarrier.wait(p_ready.index(pb), (j // NP) & 1)
            tok0 = start + j * 64
            grow = _read_flag(flag_smem, pb) if LAZY else 1
            if TILED:  # both products in flight, [128, 256) first; each piece freed as its product retires
                t_b = _pv_issue(acc_b, p_bufs.index(pb), kv_bufs.index(st),
                                alpha_smem.index(pb).load(gl.SliceLayout(1, lb)), tok0, end, LEFT, grow)
                t_a = _pv_issue(acc_a, p_bufs.index(pb), kv_bufs.index(st),
                                alpha_smem.index(pb).load(gl.SliceLayout(1, la)), tok0, end, 256, grow)
                acc_b = warpgroup_mma_wait(num_outstanding=1, deps=(t_b,))
                release(kv_empty[1].index(st))
                acc_a = warpgroup_mma_wait(num_outstanding=0, deps=(t_a,))
                _cta_barrier()
                mbarrier.arrive(p_free.index(pb))
                mbarrier.arrive(kv_empty[2].index(st))
            else:
                acc_a = _pv_part(acc_a, p_bufs.index(pb), kv_bufs.index(st),
                                 alpha_smem.index(pb).load(gl.SliceLayout(1, la)), tok0, end, 256, grow)
                if LEFT < 256:
                    acc_b = _pv_part(acc_b, p_bufs.index(pb), kv_bufs.index(st),
                                     alpha_smem.index(pb).load(gl.SliceLayout(1, lb)), tok0, end, LEFT, grow)
                _cta_barrier()
                mbarrier.arrive(p_free.index(pb))
                mbarrier.arrive(kv_empty.index(st))
        mbarrier.wait(l_ready, 0)
        _write_out_l(acc_a, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                     stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, 256, la, SINGLE, STORE_LSE)
        if LEFT < 256:
            _write_out_l(acc_b, l_smem, O, LSE, OP, LP, b, s, n_blocks, stride_ob, stride_oh, stride_pb, stride_ph,
                         stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, out_scale, LEFT, lb, SINGLE,
                         STORE_LSE)

    @gluon.jit
    def _mla_sm90_kernel(kv_desc, pe_desc, Q, BT, SEQ, O, LSE, OP, LP,
                         stride_qb, stride_qh, stride_bt, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                         stride_lb, stride_lh, stride_lsb, stride_lsh, chunk, PAGE, score_scale, out_scale,
                         SINGLE: gl.constexpr, STORE_LSE: gl.constexpr, STAGES: gl.constexpr, LEFT: gl.constexpr,
                         PREFETCH: gl.constexpr, QREG: gl.constexpr, LAZY: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
                         TILED: gl.constexpr = False):
        """Grid (heads / 64, B, splits). The default partition (4 warps) is consumer 0, a 4-warp
        worker consumer 1, a 1-warp worker the TMA producer. ``TILED``: a ready mbarrier per piece of
        a slot (``TILE_GROUPS``), three free ones (``TILE_FREES``; ``_producer_tiled``)."""
        gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
        dtype: gl.constexpr = kv_desc.dtype
        DL: gl.constexpr = kv_desc.block_type.shape[1]
        gl.static_assert(DL == 512, "the latent part is 512 wide")
        q_smem = gl.allocate_shared_memory(dtype, [64, DL], kv_desc.layout)
        kv_bufs = gl.allocate_shared_memory(dtype, [STAGES, 64, DL], kv_desc.layout)
        pe_bufs = gl.allocate_shared_memory(dtype, [STAGES, 64, 64], pe_desc.layout)
        q_pe = gl.allocate_shared_memory(dtype, [64, 64], pe_desc.layout)
        p_bufs = gl.allocate_shared_memory(dtype, [1, 64, 64], pe_desc.layout)  # one: consumer 1 frees it
        plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        alpha_smem = gl.allocate_shared_memory(gl.float32, [1, 64], plain)  # indexed to [64]: a rank-1 layout
        l_smem = gl.allocate_shared_memory(gl.float32, [64], plain)
        bars: gl.constexpr = mbarrier.MBarrierLayout()
        if TILED:  # an allocation per piece: Triton 3.6 puts a barrier of the partition's warps between two
            # mbarrier operations on one allocation, and consumer 0 waits for four pieces in a row
            kv_ready = (gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars),
                        gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars),
                        gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars),
                        gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars))
            kv_empty = (gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars),
                        gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars),
                        gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars))
        else:
            kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars)
            kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bars)
        p_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        p_free = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        # a slot is freed by every consumer warpgroup; P by those reading it from shared memory
        for i in gl.static_range(STAGES):
            if TILED:  # the rope and latent [0, 128) freed by consumer 0, the other two by consumer 1
                for g in gl.static_range(_TILE_GROUPS):
                    mbarrier.init(kv_ready[g].index(i), count=1)
                for g in gl.static_range(_TILE_FREES):
                    mbarrier.init(kv_empty[g].index(i), count=1)
            else:
                mbarrier.init(kv_ready.index(i), count=1)
                mbarrier.init(kv_empty.index(i), count=2)
        for i in gl.static_range(1):
            mbarrier.init(p_ready.index(i), count=1)
            mbarrier.init(p_free.index(i), count=1)
        mbarrier.init(l_ready, count=1)
        flag_smem = gl.allocate_shared_memory(gl.int32, [1, 1], plain)  # the lazy rescale's flag (read with LAZY)
        if PDL:  # launched behind the previous kernel (launch_pdl): its writes are visible past this
            gdc_wait()
            gdc_launch()  # the merge (or the next call) may be placed as this grid's programs retire
        gl.warp_specialize([
            (_scorer, (q_smem, q_pe, kv_bufs, pe_bufs, p_bufs, alpha_smem, l_smem, kv_ready, kv_empty, p_ready,
                       p_free, l_ready, Q, SEQ, O, LSE, OP, LP, stride_qb, stride_qh, stride_ob, stride_oh,
                       stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_lsb, stride_lsh, chunk,
                       score_scale, out_scale, SINGLE, STORE_LSE, STAGES, LEFT, PREFETCH, QREG, LAZY, flag_smem,
                       TILED)),
            (_right, (kv_bufs, p_bufs, alpha_smem, l_smem, kv_ready, kv_empty, p_ready, p_free, l_ready, SEQ, O,
                      LSE, OP, LP, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
                      stride_lsb, stride_lsh, chunk, out_scale, SINGLE, STORE_LSE, STAGES, LEFT, LAZY, flag_smem,
                      TILED)),
            (_split_producer, (kv_desc, pe_desc, kv_bufs, pe_bufs, kv_ready, kv_empty, SEQ, BT, stride_bt, chunk,
                               PAGE, STAGES, TILED)),
        ], [4, 1], [CONSUMER_REGS, _PRODUCER_REGS])


def registers(schedule: str = "split") -> tuple[int, int]:
    """(maxnreg, registers per consumer thread): two consumer warpgroups, one program per SM,
    the producer keeping ``PRODUCER_REGS`` (``schedule`` "convert": the fp8 converter warpgroup
    ``CONVERTER_REGS``). (Three consumer warpgroups do not launch: Triton
    rounds the 13 warps to 16, 512 threads, which leave 128 registers a thread; race 10.) The
    seesaw schedule has no producer warp (its warpgroups issue their own loads): 256 each."""
    if schedule == "seesaw":
        return 256, 256
    if schedule == "convert":  # kernels.mla_sm90_convert: a 4-warp converter instead of the producer warp
        return split_registers(2, 1, CONVERTER_REGS)
    return split_registers(2, 1, PRODUCER_REGS)


def descriptors(kv_cache: torch.Tensor, block_n: int = BLOCK_N):
    """TMA descriptors over the cache as a [blocks x page, 576] matrix: a key block's latent rows
    [block_n, 512] and rope rows [block_n, 64] (the seesaw schedule loads every [64, 64] tile of
    a block with the second)."""
    rows = kv_cache.shape[0] * kv_cache.shape[1]
    m = kv_cache.as_strided((rows, KV_LORA + ROPE), (kv_cache.stride(1), 1))
    dt = gl.float8e4nv if kv_cache.dtype == torch.float8_e4m3fn else _GL[kv_cache.dtype]

    def desc(block):
        return TensorDescriptor(m, list(m.shape), list(m.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, dt))

    return desc([block_n, KV_LORA]), desc([block_n, ROPE])


def mla_sm90_split(q, kv_cache, block_table, seq_lens, out, lse, op, lp, chunk, num_splits, score_scale, out_scale,
                   config: dict | None = None):
    """Launch on operands ``mla_decode`` checked (``supported`` holds): the split kernel's
    outputs, as ``kernels.mla_decode._mla_split_kernel`` writes them (an fp8 cache: the scales
    folded into ``score_scale`` and ``out_scale``)."""
    fp8 = kv_cache.dtype == torch.float8_e4m3fn
    cfg = launch_config(config, fp8)
    if chunk % BLOCK_N:
        raise ValueError(f"mla_sm90: the split length ({chunk} tokens) must be a multiple of {BLOCK_N}")
    bsz, nh, _ = q.shape
    single = num_splits == 1
    seesaw = cfg.get("SCHEDULE") == "seesaw"
    kv_desc, pe_desc = descriptors(kv_cache, cfg["BLOCK_N"] if fp8 else BLOCK_N)
    sp = (0, 0, 0, 0, 0) if single else (op.stride(0), op.stride(1), op.stride(2), lp.stride(0), lp.stride(1))
    lse_st = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    convert = fp8 and cfg["CONVERT"] == "warpgroup"
    maxnreg, regs = registers("seesaw" if seesaw else "convert" if convert else "split")
    args = (kv_desc, pe_desc, q, block_table, seq_lens, out, lse if lse is not None else out,
            op if op is not None else out, lp if lp is not None else out,
            q.stride(0), q.stride(1), block_table.stride(0), out.stride(0), out.stride(1), *sp, *lse_st,
            chunk, kv_cache.shape[1], score_scale, out_scale)
    if seesaw:  # one [64, 64] descriptor: the seesaw loads a key block as nine tiles
        _mla_sm90_seesaw_kernel[(nh // BLOCK_H, bsz, num_splits)](
            *args[1:], SINGLE=single, STORE_LSE=lse is not None and single, LAZY=bool(cfg["LAZY"]),
            CONSUMER_REGS=regs, num_warps=4, maxnreg=maxnreg)
        return
    common = dict(SINGLE=single, STORE_LSE=lse is not None and single, STAGES=cfg["STAGES"], LEFT=cfg["LEFT"],
                  CONSUMER_REGS=regs, num_warps=4, maxnreg=maxnreg)
    if convert:
        _mla_sm90_convert_kernel[(nh // BLOCK_H, bsz, num_splits)](
            *args, SINGLE=single, STORE_LSE=lse is not None and single, CONSUMER_REGS=regs,
            CONVERTER_REGS=CONVERTER_REGS, HALVES=HALVES, num_warps=4, maxnreg=maxnreg)
    elif fp8 and cfg.get("QFP8"):
        pv8 = cfg["PV8"]  # P is stored times P8_SCALE: the output scale takes it back out
        _mla_sm90_qfp8_kernel[(nh // BLOCK_H, bsz, num_splits)](*args[:-1], out_scale / P8_SCALE if pv8 else out_scale,
                                                                SINGLE=single, STORE_LSE=lse is not None and single,
                                                                STAGES=cfg["STAGES"], HSTAGES=cfg["HSTAGES"], PV8=pv8,
                                                                CONSUMER_REGS=regs, num_warps=4, maxnreg=maxnreg)
    elif fp8:
        _mla_sm90_fp8_kernel[(nh // BLOCK_H, bsz, num_splits)](*args, HSTAGES=cfg["HSTAGES"], **common)
    else:
        pdl = bool(cfg["PDL"])
        _mla_sm90_kernel[(nh // BLOCK_H, bsz, num_splits)](*args, PREFETCH=bool(cfg["PREFETCH"]), QREG=cfg["QREG"],
                                                           LAZY=bool(cfg["LAZY"]), PDL=pdl, TILED=bool(cfg["TILED"]),
                                                           launch_pdl=pdl, **common)
