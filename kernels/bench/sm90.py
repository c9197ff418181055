"""sm_90 build report of the attention kernels and the Gluon FP8 GEMM, compile-only (no
GPU): registers, spill stack, shared memory, warpgroup MMAs vs mma.sync and asynchronous
copies of the MLA decode and prefill builds, as the H200's JIT specialises them; for the
FP8 GEMM `fp8_gemm_sm90_build` (registers, spills, whether ptxas serialised its wgmmas).

    python -m kernels.bench.bench_kernels --sm90-report
"""

from __future__ import annotations

import collections
import os
import tempfile

import triton


def triton_sm90_compile(fn, types: dict, consts: dict, div16=(), num_warps: int = 4, num_stages: int | None = None):
    """Compile a plain Triton kernel for sm_90 on this machine (no GPU needed): ``types`` maps
    its non-constexpr arguments to their types (the rest i32), ``div16`` names those a launch
    would see divisible by 16 (the JIT's specialisation). Returns the compiled kernel (its
    ``asm`` holds the TTGIR, PTX and cubin)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
    options = dict(num_warps=num_warps) if num_stages is None else dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def sm90_report():
    """Compile the MLA decode and prefill kernels for sm_90 on this machine (no GPU needed)
    with the integer arguments specialised as the JIT does on the H200 (divisible by 16),
    and print each build's registers, spill stack, shared memory and whether its products
    are warpgroup MMAs (wgmma) or mma.sync, and its loads asynchronous copies."""
    import re
    import subprocess

    import kernels.mla_decode as md
    import kernels.prefill_attention as pa

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def build(fn, types, consts, div16, warps, stages):
        k = triton_sm90_compile(fn, types, consts, div16, warps, stages)
        ir = k.asm["ttgir"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        reg = re.search(r"REG:(\d+)", res)
        stack = re.search(r"STACK:(\d+)", res)
        return dict(regs=int(reg.group(1)) if reg else None, stack=int(stack.group(1)) if stack else None,
                    shared=k.metadata.shared, wgmma=ir.count("warp_group_dot "),
                    mma_sync=len(re.findall("versionMajor = 2", ir)), async_copies=ir.count("async_copy_global_to_local"))

    mt = {"Q": "*bf16", "KV": "*bf16", "BT": "*i32", "SEQ": "*i32", "O": "*bf16", "LSE": "*fp32", "OP": "*fp32",
          "LP": "*fp32", "score_scale": "fp32", "out_scale": "fp32"}
    mdiv = ["Q", "KV", "BT", "SEQ", "O", "LSE", "OP", "LP", "stride_qb", "stride_qh", "stride_kvb", "stride_kvt",
            "stride_ob", "stride_oh", "stride_pb", "stride_ph", "stride_ps", "stride_lb", "stride_lh", "chunk", "H"]
    print(f"triton {triton.__version__}, target sm_90")
    for bh, bn, w, st, fp8 in [(16, 32, 4, 3, False), (16, 32, 4, 3, True), (64, 64, 8, 2, False), (64, 64, 8, 2, True)]:
        t = dict(mt, KV="*fp8e4nv" if fp8 else "*bf16")
        c = dict(DL=512, DR=64, PAGE=64, BLOCK_H=bh, BLOCK_N=bn, SINGLE=False, STORE_LSE=False, FP8=fp8, F32=False)
        r = build(md._mla_split_kernel, t, c, mdiv, w, st)
        print(f"mla_decode BLOCK_H {bh} BLOCK_N {bn} warps {w} stages {st} "
              f"{'fp8' if fp8 else 'bf16'} cache: {r}")
    at = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32",
          "qk_scale": "fp32"}
    adiv = ["Q", "K", "V", "O", "LSE", "CU_Q", "CU_K", "stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt",
            "stride_vh", "stride_ot", "stride_oh"]
    for d1, d2, bm, bn, w, st in [(128, 0, 128, 128, 8, 3), (128, 64, 128, 64, 8, 3)]:
        c = dict(desc_k1=None, desc_k2=None, desc_v=None, D1=d1, D2=d2, DV=128, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=True,
                 STORE_LSE=False, USE_TMA=False, F32=False, WS=False)
        r = build(pa._prefill_fwd_kernel, at, c, adiv, w, st)
        print(f"prefill (pointer loads) Dqk {d1 + d2} Dv 128 BLOCK_M {bm} BLOCK_N {bn} warps {w} stages {st}: {r}")
    from kernels import fp8_gemm_sm90

    if fp8_gemm_sm90.HAVE_GLUON:
        for m, n, k in [(4096, 7168, 16384), (1024, 2112, 7168), (64, 7168, 2048)]:
            cfg = fp8_gemm_sm90.pick_config(m, n, k, 132)
            info = fp8_gemm_sm90_build(cfg)
            info.pop("ptxas_info"), info.pop("ptx")
            print(f"fp8_gemm_sm90 default for M {m} N {n} K {k} {cfg}: {info}")
        from kernels.prefill_sm90 import default_config as prefill_default

        for dqk, waves in [(128, 31.0), (128, 7.8), (192, 15.5)]:
            info = prefill_sm90_build(dqk, 128, prefill_default(dqk, 128, waves))
            info.pop("ptxas_info"), info.pop("ptx")
            print(f"prefill_sm90 Dqk {dqk} Dv 128 default at {waves} tiles per SM: {info}")
    return 0


def gluon_sm90_build(fn, sig: dict, consts: dict, num_warps: int, maxnreg: int | None = None,
                     aligned: tuple = ()) -> dict:
    """Compile a Gluon kernel for sm_90a on this machine (no GPU needed) and report what ptxas and
    the SASS say: registers, spills, whether ptxas serialised its wgmmas (info C7514), the
    warpgroup MMA (QGMMA fp8, HGMMA 16-bit; ``hgmma_reg_a`` those with the A operand in registers)
    and mma.sync (HMMA) instruction counts, the e4m3 -> f16x2 unpacks (``f8_unpack``), the PTX's
    TMA copies, mbarrier inits, waits, ``expect_tx`` and plain arrivals, PDL's two instructions, shared memory,
    and ``part_syncs``: the PTX's barriers of one partition's warps (``bar.sync id, threads``) by id.
    ``sig`` maps the non-constexpr arguments to their types; ``aligned`` names the pointer and
    integer arguments a launch would see divisible by 16 (Triton's launcher specialises them so,
    which is what lets it vectorise their loads). Run it in a process without TRITON_INTERPRET
    (the interpreter patches Triton's language for the process it runs in)."""
    import re
    import subprocess

    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = dict(sig, **{n: "constexpr" for n in consts})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    options = dict(num_warps=num_warps) if maxnreg is None else dict(num_warps=num_warps, maxnreg=maxnreg)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = get_ptxas(90).path  # the ptxas this Triton builds sm_90 with
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(k.asm["ptx"])
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", cubin], capture_output=True, text=True)
        if info.returncode:
            raise RuntimeError(f"ptxas failed: {info.stderr[-2000:]}")
        sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", info.stderr)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info.stderr)
    return dict(regs=int(regs.group(1)) if regs else None,
                spill_bytes=int(spill.group(1)) + int(spill.group(2)) if spill else None,
                serialized="C7514" in info.stderr or "serialized" in info.stderr,
                qgmma=sass.count("QGMMA.64x"), hgmma=sass.count("HGMMA.64x"), hmma=sass.count("HMMA"),
                f8_unpack=sass.count("F2FP.F16.E4M3.UNPACK_B"),
                hgmma_reg_a=len(re.findall(r"HGMMA\.64x\S+ R\d+, R\d+", sass)),
                gdc_waits=k.asm["ptx"].count("griddepcontrol.wait"),
                gdc_launches=k.asm["ptx"].count("griddepcontrol.launch_dependents"),
                tma_loads=k.asm["ptx"].count("cp.async.bulk.tensor"),
                mbar_inits=k.asm["ptx"].count("mbarrier.init"), mbar_waits=k.asm["ptx"].count("mbarrier.try_wait"),
                mbar_expects=k.asm["ptx"].count("mbarrier.arrive.expect_tx"),
                mbar_arrives=len(re.findall(r"mbarrier\.arrive\.shared::cta\.b64 _, \[", k.asm["ptx"])),
                part_syncs=dict(collections.Counter(re.findall(r"bar\.sync\s+(\d+), \d+;", k.asm["ptx"]))),
                shared=k.metadata.shared, ptxas_info=info.stderr.strip(), ptx=k.asm["ptx"])


def _desc(dtype_name, gdt, shape):
    """A tensor-descriptor argument's signature type (block ``shape``, Gluon's default layout)."""
    from triton.experimental.gluon import language as gl

    return f"tensordesc<{dtype_name}[{shape[0]}, {shape[1]}],{gl.NVMMASharedLayout.get_default_for(shape, gdt)!r}>"


def fp8_gemm_sm90_build(config: dict) -> dict:
    """``gluon_sm90_build`` of the FP8 GEMM with ``config``'s tiles."""
    from triton.experimental.gluon import language as gl

    from kernels.fp8_gemm_sm90 import BLOCK_K, _fp8_gemm_sm90_ws_kernel, launch_config, ws_registers

    cfg = launch_config(config)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    scale_tma = bool(cfg.get("SCALE_TMA", False))
    s_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    sig = {"a_desc": _desc("fp8e4nv", gl.float8e4nv, [bm, BLOCK_K]), "b_desc": _desc("fp8e4nv", gl.float8e4nv, [bn, BLOCK_K]),
           "c_desc": _desc("bf16", gl.bfloat16, [64, bn]),
           "s_desc": f"tensordesc<fp32[1, {bm}],{s_layout!r}>" if scale_tma else _desc("fp8e4nv", gl.float8e4nv, [bm, BLOCK_K]),
           "as_ptr": "*fp32", "bs_ptr": "*fp32"}
    sig.update({n: "i32" for n in ("M", "N", "K", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk")})
    maxnreg, regs = ws_registers(bm, cfg.get("PERSISTENT", 0))
    consts = {"GROUP_M": cfg["GROUP_M"], "STAGES": cfg["STAGES"], "CONSUMER_REGS": regs,
              "PAIR_RELEASE": cfg.get("PAIR_RELEASE", False), "SCALE_TMA": scale_tma, "num_warps": 4}
    return gluon_sm90_build(_fp8_gemm_sm90_ws_kernel, sig, consts, 4, maxnreg)


def prefill_sm90_build(dqk: int = 128, dv: int = 128, config: dict | None = None, causal: bool = True,
                       dtype: str = "bf16") -> dict:
    """``gluon_sm90_build`` of the Gluon prefill attention kernel for these head dims and config."""
    from triton.experimental.gluon import language as gl

    from kernels.attention_dims import split_head_dim
    from kernels.prefill_sm90 import BLOCK_M, _prefill_sm90_kernel, launch_config, registers

    cfg = launch_config(config, dqk, dv)
    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    bn = cfg["BLOCK_N"]
    d1, d2 = split_head_dim(dqk)
    sig = {"q_desc": _desc(dtype, gdt, [BLOCK_M, d1]), "q2_desc": _desc(dtype, gdt, [BLOCK_M, d2 or d1]),
           "k_desc": _desc(dtype, gdt, [bn, d1]), "k2_desc": _desc(dtype, gdt, [bn, d2 or d1]),
           "v_desc": _desc(dtype, gdt, [bn, dv]), "O": f"*{dtype}", "LSE": "*fp32", "CU_Q": "*i32", "CU_K": "*i32",
           "qk_scale": "fp32"}
    sig.update({n: "i32" for n in ("H", "GROUP", "NUM_MB", "B", "stride_qh", "stride_kh", "stride_vh", "stride_ot",
                                   "stride_oh", "stride_lse_h")})
    maxnreg, regs = registers(int(cfg["PERSISTENT"]))
    consts = {"CAUSAL": causal, "STORE_LSE": True, "STAGES": cfg["STAGES"], "PINGPONG": bool(cfg["PINGPONG"]),
              "D2": d2, "HEAD_MAJOR": bool(cfg["HEAD_MAJOR"]), "PERSISTENT": bool(cfg["PERSISTENT"]),
              "CONSUMER_REGS": regs, "num_warps": 4}
    return gluon_sm90_build(_prefill_sm90_kernel, sig, consts, 4, maxnreg)


def mla_sm90_build(config: dict | None = None, single: bool = False, dtype: str = "bf16", kv: str | None = None) -> dict:
    """``gluon_sm90_build`` of the Gluon MLA decode split kernel; ``kv="fp8"``: the fp8 cache's
    kernel (q and output in ``dtype``)."""
    from triton.experimental.gluon import language as gl

    from kernels.mla_sm90 import BLOCK_N, KV_LORA, ROPE, _mla_sm90_kernel, launch_config, registers
    from kernels.mla_sm90_fp8 import _mla_sm90_fp8_kernel

    fp8 = kv == "fp8"
    cfg = launch_config(config, fp8)
    gdt = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]
    kv_name, kv_gdt, bn = ("fp8e4nv", gl.float8e4nv, cfg["BLOCK_N"]) if fp8 else (dtype, gdt, BLOCK_N)
    sig = {"kv_desc": _desc(kv_name, kv_gdt, [bn, KV_LORA]), "pe_desc": _desc(kv_name, kv_gdt, [bn, ROPE]),
           "Q": f"*{dtype}", "BT": "*i32", "SEQ": "*i32", "O": f"*{dtype}", "LSE": "*fp32", "OP": "*fp32",
           "LP": "*fp32", "score_scale": "fp32", "out_scale": "fp32"}
    sig.update({n: "i32" for n in ("stride_qb", "stride_qh", "stride_bt", "stride_ob", "stride_oh", "stride_pb",
                                   "stride_ph", "stride_ps", "stride_lb", "stride_lh", "stride_lsb", "stride_lsh",
                                   "chunk", "PAGE")})
    if fp8 and cfg["CONVERT"] == "warpgroup":
        from kernels.mla_sm90_convert import CONVERTER_REGS, HALVES, _mla_sm90_convert_kernel

        maxnreg, regs = registers("convert")
        consts = {"SINGLE": single, "STORE_LSE": single, "CONSUMER_REGS": regs, "CONVERTER_REGS": CONVERTER_REGS,
                  "HALVES": HALVES, "num_warps": 4}
        return gluon_sm90_build(_mla_sm90_convert_kernel, sig, consts, 4, maxnreg)
    if fp8 and cfg.get("QFP8"):
        from kernels.mla_sm90_qfp8 import _mla_sm90_qfp8_kernel

        maxnreg, regs = registers()
        consts = {"SINGLE": single, "STORE_LSE": single, "STAGES": cfg["STAGES"], "HSTAGES": cfg["HSTAGES"],
                  "PV8": cfg["PV8"], "CONSUMER_REGS": regs, "num_warps": 4}
        return gluon_sm90_build(_mla_sm90_qfp8_kernel, sig, consts, 4, maxnreg)
    if fp8:
        maxnreg, regs = registers()
        consts = {"SINGLE": single, "STORE_LSE": single, "STAGES": cfg["STAGES"], "HSTAGES": cfg["HSTAGES"],
                  "LEFT": cfg["LEFT"], "CONSUMER_REGS": regs, "num_warps": 4}
        return gluon_sm90_build(_mla_sm90_fp8_kernel, sig, consts, 4, maxnreg)
    maxnreg, regs = registers(cfg["SCHEDULE"])
    if cfg["SCHEDULE"] == "seesaw":
        from kernels.mla_sm90_seesaw import _mla_sm90_seesaw_kernel

        sig = {("tile_desc" if k == "pe_desc" else k): v for k, v in sig.items() if k != "kv_desc"}
        consts = {"SINGLE": single, "STORE_LSE": single, "LAZY": bool(cfg["LAZY"]), "CONSUMER_REGS": regs,
                  "num_warps": 4}
        return gluon_sm90_build(_mla_sm90_seesaw_kernel, sig, consts, 4, maxnreg)
    consts = {"SINGLE": single, "STORE_LSE": single, "STAGES": cfg["STAGES"], "LEFT": cfg["LEFT"],
              "PREFETCH": bool(cfg["PREFETCH"]), "QREG": cfg["QREG"], "LAZY": bool(cfg["LAZY"]),
              "CONSUMER_REGS": regs, "num_warps": 4, "PDL": bool(cfg["PDL"]), "TILED": bool(cfg["TILED"])}
    return gluon_sm90_build(_mla_sm90_kernel, sig, consts, 4, maxnreg)


def mla_merge_build(pdl: bool = False, num_splits: int = 4) -> dict:
    """Compile ``mla_decode``'s split merge (a plain Triton kernel) for sm_90a on this machine and
    count its grid-dependency instructions: with ``pdl`` (the sm90 split kernel's ``PDL``) it is
    launched behind the split kernel and must wait (``griddepcontrol.wait``) before it reads the
    partials, and lets the kernel after it be placed (``launch_dependents``)."""
    from kernels.mla_decode import KV_LORA, _mla_merge_kernel

    consts = {"DL": KV_LORA, "BLOCK_S": max(2, triton.next_power_of_2(num_splits)), "STORE_LSE": True, "PDL": pdl}
    types = {"OP": "*fp32", "LP": "*fp32", "O": "*bf16", "LSE": "*fp32"}
    ptx = triton_sm90_compile(_mla_merge_kernel, types, consts).asm["ptx"]
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    return dict(gdc_waits=ptx.count("griddepcontrol.wait"), gdc_launches=ptx.count("griddepcontrol.launch_dependents"),
                first_load=ptx.find("ld.global"), wait_at=wait, launch_at=launch, ptx=ptx)


def w4a16_sm90_build(config: dict | None = None, dtype: str = "bf16", reduce: int = 2, block_m: int = 16) -> dict:
    """``gluon_sm90_build`` of the Gluon W4A16 kernel (``kernels/w4a16_sm90.py``) for a packed tile
    and ring depth, pointers and the K-dimension integers 16-byte aligned as at a launch."""
    from kernels.w4a16_sm90 import _w4a16_sm90_kernel, launch_config

    cfg = launch_config(16, 4096, 4096, 132, config)
    sig = {"X": f"*{dtype}", "W": "*i32", "QZ": "*i32", "SC": "*fp16", "O": f"*{dtype}", "WS": "*fp32", "CNT": "*i32"}
    sig.update({n: "i32" for n in ("M", "N", "K", "stride_xm", "stride_om", "groups_per_split", "nsplit")})
    consts = {"NREP": cfg["NREP"], "KW": cfg["KW"], "STAGES": cfg["STAGES"], "F16": dtype == "fp16", "REDUCE": reduce,
              "BM": block_m, "num_warps": 4}
    return gluon_sm90_build(_w4a16_sm90_kernel, sig, consts, 4,
                            aligned=("X", "W", "QZ", "SC", "O", "WS", "CNT", "N", "K", "stride_xm", "stride_om"))
