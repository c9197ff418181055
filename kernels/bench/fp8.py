"""FP8 block-scaled GEMM benchmark: fp8_gemm and fp8_grouped_gemm (kernels/fp8_gemm.py)
on DeepSeek-V3/R1 shapes against the fp32 product of the dequantised operands, bf16
cuBLAS, torch._scaled_mm (per-tensor and DeepSeek's blockwise scaling) and
torch._grouped_mm, with DeepGEMM's published H800 figures alongside.

Every candidate is checked against the reference (TF32 off) before it is timed; all
timings are CUDA-graph replays with the L2 scrubbed before each call (`harness.graph_cold_us`). The run's FP8 ceiling is `harness.fp8_ceiling`.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
import triton

from kernels.bench import harness as H
from kernels.bench.harness import TIMER, dedupe

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
    return dedupe(c)


def sm90_candidates(m, n, k, sms):
    """The Gluon sm_90 kernel's shipped default first, then the tiles, pipeline depths,
    persistent grids (``_p``: programs per SM), paired stage releases (``_pair``) and tile
    orders (``_g16``) raced beside it (kernels/fp8_gemm_sm90.py; 128-row tiles take two
    consumer warpgroups). The names are race 7's (``ws``: warp-specialised)."""
    from kernels.fp8_gemm_sm90 import pick_config as sm90_pick

    c = {"default": sm90_pick(m, n, k, sms)}
    for bm, bn, st, per_sm, pair, gm in [
            (128, 128, 4, 1, 0, 8), (128, 128, 5, 1, 0, 8), (128, 128, 6, 1, 0, 8), (128, 128, 5, 1, 1, 8),
            (128, 128, 6, 1, 1, 8), (128, 128, 5, 1, 0, 16), (64, 128, 4, 2, 0, 8), (64, 128, 6, 0, 0, 8),
            (64, 128, 6, 1, 0, 8), (64, 128, 6, 1, 1, 8), (128, 64, 6, 1, 0, 8), (128, 64, 8, 1, 1, 8),
            (64, 64, 6, 2, 0, 8)]:
        c[f"ws{bm}x{bn}_s{st}" + (f"_p{per_sm}" if per_sm else "") + ("_pair" if pair else "")
          + (f"_g{gm}" if gm != 8 else "")] = dict(
            BLOCK_M=bm, BLOCK_N=bn, GROUP_M=gm, STAGES=st,
            **({"PERSISTENT": per_sm} if per_sm else {}), **({"PAIR_RELEASE": True} if pair else {}))
    return dedupe(c)


def profile_sm90(shape, names):
    """One launch each of the Gluon kernel's candidates ``names`` (``sm90_candidates`` keys)
    and of cuBLASLt blockwise on ``shape`` (M, N, K), between cudaProfilerStart/Stop after
    a warm-up call of each (for ``ncu --profile-from-start off``)."""
    from kernels import fp8_gemm_sm90 as sm90
    from kernels.reference import per_block_quant_fp8, per_token_group_quant_fp8

    m, n, k = shape
    qw, sw = per_block_quant_fp8(torch.randn(n, k, device=H.DEV) * 0.02)
    qa, sa = per_token_group_quant_fp8(torch.randn(m, k, device=H.DEV))
    cands = sm90_candidates(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    calls = [lambda c=cands[x]: sm90.fp8_gemm_sm90(qa, sa, qw, sw, config=c) for x in names]
    fn, layout = fp8_scaled_mm_blockwise(qa, sa, qw, sw)
    calls += [fn] if fn is not None else []
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for f in calls:
        f()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled M {m} N {n} K {k}: {', '.join(names)}; cuBLASLt blockwise ({layout})")
    return 0


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




def _fp8_ok(y, ref):
    err = (y.float() - ref).abs()
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    elem = bool((err <= 2.0**-7 * ref.abs() + 2e-3 * ref.abs().max()).all()) and bool(torch.isfinite(y).all())
    return rel, elem and rel < 1e-2


def _sweep(cands, call, ref, flop, timer, log, where):
    """Each candidate checked against the reference (the check logged), then timed if it
    passed. Returns ({name: result}, whether every built candidate matched); a candidate
    that fails to build is a result, not a failure."""
    out, all_ok = {}, True
    for name, c in cands.items():
        try:
            rel, ok = _fp8_ok(call(c), ref)
            log(f"fp8 check {where} {name}: rel {rel:.2e} {'OK' if ok else 'MISMATCH'}")
            if not ok:
                all_ok = False
                out[name] = dict(error=f"mismatch rel {rel:.2e}", cfg=c)
                continue
            t = timer([lambda c=c: call(c)])
            out[name] = dict(us=t, rel_err=rel, tflops=flop / t / 1e6, cfg=c)
        except Exception as ex:  # noqa: BLE001 - a config that fails to build is a result
            out[name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}", cfg=c)
            log(f"FP8 ERROR {where} {name}: {out[name]['error']}")
    return out, all_ok


def run_fp8(copy_gbs, mm_tflops, fp8_tflops, log, rows, grows, on_shape, dense=FP8_DENSE, ms=FP8_MS,
            grouped=FP8_GROUPED, smoke=False):
    """Dense then grouped; every candidate is checked against the fp32 reference of the
    dequantised operands (TF32 off) before it is timed."""
    from kernels import fp8_gemm_sm90 as sm90
    from kernels.fp8_gemm import GROUPED_M_ALIGN, fp8_gemm, fp8_grouped_gemm
    from kernels.reference import fp8_block_dequant, per_block_quant_fp8, per_token_group_quant_fp8

    torch.backends.cuda.matmul.allow_tf32 = False
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    timer = TIMER["bench"]
    all_ok = True
    for n, k in dense:
        w = torch.randn(n, k, device=H.DEV) * 0.02
        qw, sw = per_block_quant_fp8(w)
        dw = fp8_block_dequant(qw, sw, 128, 128)
        wb = dw.to(torch.bfloat16)
        del w
        for m in ms:
            a = torch.randn(m, k, device=H.DEV)
            qa, sa = per_token_group_quant_fp8(a)
            ab = fp8_block_dequant(qa, sa, 1, 128)
            ref = ab @ dw.t()
            ab = ab.to(torch.bfloat16)
            flop = 2 * m * n * k
            r = dict(M=m, N=n, K=k, deepgemm_h800=DEEPGEMM_H800.get((m, n, k)))
            r["cublas_bf16_us"] = timer([lambda: F.linear(ab, wb)])
            if not smoke:
                one = torch.ones((), device=H.DEV)
                r["scaled_mm_tensorwise_us"] = timer([lambda: torch._scaled_mm(qa, qw.t(), scale_a=one, scale_b=one,
                                                                               out_dtype=torch.bfloat16)])
                fn, layout = fp8_scaled_mm_blockwise(qa, sa, qw, sw)
                r["scaled_mm_blockwise_layout"] = layout
                if fn is not None:
                    rel, ok = _fp8_ok(fn(), ref)
                    r["scaled_mm_blockwise_rel_err"] = rel
                    if ok:
                        r["scaled_mm_blockwise_us"] = timer([fn])
            where = f"M={m} N={n} K={k}"
            r["sweep"], ok = _sweep(fp8_candidates(m, n, k, sms), lambda c: fp8_gemm(qa, sa, qw, sw, config=c),
                                    ref, flop, timer, log, where)
            all_ok &= ok
            if sm90.supported(qa, qw, torch.bfloat16):
                # the Gluon kernel (Hopper only): promotion overlapped with the next block's wgmma
                r["sm90"], ok = _sweep(sm90_candidates(m, n, k, sms),
                                       lambda c: sm90.fp8_gemm_sm90(qa, sa, qw, sw, config=c),
                                       ref, flop, timer, log, f"sm90 {where}")
                all_ok &= ok
                ok_sm90 = [(v["us"], kk) for kk, v in r["sm90"].items() if "us" in v]
                r["sm90_us"] = r["sm90"].get("default", {}).get("us", float("nan"))
                r["sm90_best"] = min(ok_sm90) if ok_sm90 else None
                if "scaled_mm_blockwise_us" in r:
                    r["sm90_x_blockwise_time"] = r["sm90_us"] / r["scaled_mm_blockwise_us"]
                if not smoke:
                    # the default again with column-major activation scales: vLLM's layout, and
                    # the one cuBLASLt is handed above (a block's row scales are contiguous)
                    sa_cm = sa.t().contiguous().t()
                    # default: what fp8_gemm_sm90 picks for them (SCALE_TMA where scale_tma_default
                    # holds); pointer: the scales loaded by the consumers; scale_tma: the producer
                    # TMA-loading each stage's scales (DeepGEMM's way)
                    cands = {"default": None, "pointer": sm90.pick_config(m, n, k, sms)}
                    if m % 4 == 0:
                        cands["scale_tma"] = sm90.with_scale_tma(sm90.pick_config(m, n, k, sms))
                    if m <= 128:  # every raced tile both ways, where the default misses (race 12b)
                        for name, c in sm90_candidates(m, n, k, sms).items():
                            for tag, cc in (("ptr", c), ("tma", sm90.with_scale_tma(c) if m % 4 == 0 else None)):
                                if cc is not None and cc not in cands.values():
                                    cands[f"{tag}_{name}"] = cc
                    cm, ok = _sweep(cands, lambda c: sm90.fp8_gemm_sm90(qa, sa_cm, qw, sw, config=c),
                                    ref, flop, timer, log, f"sm90 sa column-major {where}")
                    all_ok &= ok
                    r["sm90_sa_colmajor"] = cm
                    ok_cm = [(v["us"], kk) for kk, v in cm.items() if "us" in v]
                    r["sm90_sa_colmajor_best"] = min(ok_cm) if ok_cm else None
                    r["sm90_sa_colmajor_default_us"] = cm["default"].get("us", float("nan"))
                    r["sm90_sa_colmajor_us"] = cm["pointer"].get("us", float("nan"))
                    r["sm90_sa_colmajor_tma_us"] = cm.get("scale_tma", {}).get("us", float("nan"))
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
                f"tensorwise {r.get('scaled_mm_tensorwise_us', float('nan')):.1f} sm90 {r.get('sm90_us', float('nan')):.1f} "
                f"(best {r.get('sm90_best')}) no-promote {r.get('no_promote_us', float('nan')):.1f} best {r['best']}; "
                + json.dumps({kk: (round(v["us"], 1) if "us" in v else "ERR") for kk, v in r["sweep"].items()}))
        del qw, sw, dw, wb
        if not smoke:
            torch.cuda.empty_cache()
        on_shape()
    for e, mper, n, k in grouped:
        w = torch.randn(e, n, k, device=H.DEV) * 0.02
        qw, sw = per_block_quant_fp8(w)
        del w
        mt = e * mper
        assert mper % GROUPED_M_ALIGN == 0
        mi = torch.arange(e, device=H.DEV, dtype=torch.int32).repeat_interleave(mper)
        a = torch.randn(mt, k, device=H.DEV)
        qa, sa = per_token_group_quant_fp8(a)
        flop = 2 * mt * n * k
        r = dict(groups=e, m_per_group=mper, N=n, K=k, deepgemm_h800=DEEPGEMM_H800.get((e, mper, n, k)))
        ref = torch.empty(mt, n, device=H.DEV)
        for x in range(e):
            rs = slice(x * mper, (x + 1) * mper)
            ref[rs] = fp8_block_dequant(qa[rs], sa[rs], 1, 128) @ fp8_block_dequant(qw[x], sw[x], 128, 128).t()
        ab = fp8_block_dequant(qa, sa, 1, 128).to(torch.bfloat16)
        wb = fp8_block_dequant(qw[0], sw[0], 128, 128).to(torch.bfloat16)
        r["cublas_bf16_dense_equiv_us"] = timer([lambda: F.linear(ab, wb)])  # same FLOPs, one weight
        if not smoke and hasattr(torch, "_grouped_mm"):
            try:
                wball = torch.stack([fp8_block_dequant(qw[x], sw[x], 128, 128) for x in range(e)]).to(torch.bfloat16)
                offs = torch.arange(1, e + 1, device=H.DEV, dtype=torch.int32) * mper
                gm = lambda: torch._grouped_mm(ab, wball.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)  # noqa: E731
                rel, ok = _fp8_ok(gm(), ref)
                r["torch_grouped_mm_bf16_rel_err"] = rel
                r["torch_grouped_mm_bf16_us"] = timer([gm])
                del wball
            except Exception as ex:  # noqa: BLE001
                r["torch_grouped_mm_bf16"] = f"{type(ex).__name__}: {str(ex)[:120]}"
        cands = {"default": None,
                 "race1_bm128_bn128_w8_st4": dict(BLOCK_M=128, BLOCK_N=128, SPLIT_K=1, GROUP_M=8, num_warps=8, num_stages=4)}
        r["sweep"], ok = _sweep(cands, lambda c: fp8_grouped_gemm(qa, sa, qw, sw, mi, config=c), ref, flop, timer, log,
                                f"grouped {e}x{mper} N={n} K={k}")
        all_ok &= ok
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



def race_lines(fp8, fp8g):
    """`run_fp8`'s dense and grouped rows: the FP8 sections of the race table."""
    L = []
    if fp8:
        L += ["FP8 block-scaled GEMM, dense (bf16 out; CUDA-graph replays, L2 scrubbed before each call). DeepGEMM = its README's H800 figure.",
              "",
              "\"ours\" is the Triton kernel (kernels/fp8_gemm.py); \"sm90\" the Gluon kernel (kernels/fp8_gemm_sm90.py), "
              "its default and its best candidate; \"/ blockwise\" is its time over _scaled_mm blockwise's (cuBLASLt).",
              "",
              "| M | N | K | ours us | ours TFLOP/s | of fp8 ceiling | x bf16 cuBLAS | _scaled_mm blockwise us | _scaled_mm per-tensor us | bf16 cuBLAS us | ours without promotion us | best candidate | best us | sm90 us | sm90 TFLOP/s | sm90 / blockwise | sm90, scales column-major (its default), / blockwise | the same, scales loaded by pointer | the same, scales by TMA | column-major best / blockwise | sm90 best | DeepGEMM H800 TFLOP/s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"]
        for r in fp8:
            best = r.get("best") or (float("nan"), "-")
            dg = r.get("deepgemm_h800")
            cm_best = r.get("sm90_sa_colmajor_best") or (float("nan"), "-")
            L.append(f"| {r['M']} | {r['N']} | {r['K']} | {r['ours_us']:.1f} | {r['tflops']:.0f} | {r['frac_fp8_ceiling']:.0%} "
                     f"| {r['x_cublas_bf16']:.2f}x | {r.get('scaled_mm_blockwise_us', float('nan')):.1f} "
                     f"| {r.get('scaled_mm_tensorwise_us', float('nan')):.1f} | {r['cublas_bf16_us']:.1f} "
                     f"| {r.get('no_promote_us', float('nan')):.1f} | {best[1]} "
                     f"| {best[0]:.1f} | {r.get('sm90_us', float('nan')):.1f} "
                     f"| {2 * r['M'] * r['N'] * r['K'] / r.get('sm90_us', float('nan')) / 1e6:.0f} "
                     f"| {r.get('sm90_x_blockwise_time', float('nan')):.2f} "
                     f"| {r.get('sm90_sa_colmajor_default_us', float('nan')) / r.get('scaled_mm_blockwise_us', float('nan')):.2f} "
                     f"| {r.get('sm90_sa_colmajor_us', float('nan')) / r.get('scaled_mm_blockwise_us', float('nan')):.2f} "
                     f"| {r.get('sm90_sa_colmajor_tma_us', float('nan')) / r.get('scaled_mm_blockwise_us', float('nan')):.2f} "
                     f"| {cm_best[1]} {cm_best[0] / r.get('scaled_mm_blockwise_us', float('nan')):.2f} "
                     f"| {(r.get('sm90_best') or (0, '-'))[1]} {(r.get('sm90_best') or (float('nan'), ''))[0]:.1f} "
                     f"| {dg[0] if dg else '-'} |")
        L.append("")
    if fp8g:
        L += ["FP8 grouped (MoE contiguous layout). bf16 baseline: one cuBLAS GEMM of the same total M (same FLOPs).",
              "",
              "| groups x M | N | K | ours us | ours TFLOP/s | of fp8 ceiling | x bf16 | torch._grouped_mm bf16 us | DeepGEMM H800 TFLOP/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in fp8g:
            dg = r.get("deepgemm_h800")
            cm_best = r.get("sm90_sa_colmajor_best") or (float("nan"), "-")
            L.append(f"| {r['groups']} x {r['m_per_group']} | {r['N']} | {r['K']} | {r['ours_us']:.0f} | {r['tflops']:.0f} "
                     f"| {r['frac_fp8_ceiling']:.0%} | {r['x_cublas_bf16']:.2f}x | {r.get('torch_grouped_mm_bf16_us', float('nan')):.0f} "
                     f"| {dg[0] if dg else '-'} |")
        L.append("")
    return L
