"""W4A16 race 5: candidate configurations of the v4 tile kernel (`PATH="mma4"`), the GEMV
and the shipped defaults, per catalog AWQ shape and M in 1..16, against bf16 cuBLAS and
torch's int4 tinygemm (and gemlite where it is importable and time is left), in one process.

    PYTHONUNBUFFERED=1 python -m kernels.bench.bench_kernels --only w4a16_race5 --budget-s 400 --out DIR
    TRITON_INTERPRET=1 python -m kernels.bench.bench_kernels --smoke --only w4a16_race5

Every candidate is checked against the fp32 product of the dequantised weights before it
is timed (relative error < 1e-2 and every element within 2^-6 |ref| + 2e-3 max |ref|), and
again after its timing (the atomic split-K reduction reuses a workspace that each call must
leave zero). Timings are CUDA-graph replays of 20 calls rotating over enough weight copies
to miss the L2 (`harness.graph_us`). Shapes are started until `--budget-s` has passed;
results.json is rewritten after every shape.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

from kernels.bench import harness as H
from kernels.bench.harness import dedupe
from kernels.bench.w4a16 import RACE_SHAPES, awq_bytes, gemlite_layer, make_weights, race_weights
from kernels.w4a16_gemm import gemv_config, mma4_config, pick_config, w4a16_gemm

MS = [1, 2, 4, 8, 16]
# the race's shapes (kernels/bench/w4a16.py RACE_SHAPES): those the catalog's AWQ models use
# (kernels/bench/awq_shapes.py) and those raced beside them
SHAPES = [(5120, 27648), (27648, 5120), (8192, 28672), (28672, 8192), (5120, 7168), (5120, 5120),
          (8192, 10240), (4096, 6144), (4096, 14336), (14336, 4096), (7168, 18432), (4096, 4096), (2048, 7168),
          (5120, 55296), (8192, 8192), (8192, 57344), (13824, 5120)]
assert sorted(SHAPES) == sorted(RACE_SHAPES)

# (BLOCK_N, BLOCK_K, warps, stages, waves, reduce, unpack, maxnreg) of the v4 tile kernel.
# Run 1 (16:10 UTC, 12 plain-unpack configs) kept 256 x 64 with 4 warps (one n8 mma column
# per warp, 128 registers in the sm_90 build) first at 57 of 65 points, 64 x 128 at the two
# smallest shapes' M = 16, and the rest 1.1-2.6x slower (BLOCK_K 128, BLOCK_N 512 / 128:
# 166-255 registers); run 2 keeps those and adds the PRMT unpack (`deq="asm"`: 461 instead of
# 611 instructions per K step in the sm_90 build of 256 x 64), more K splits and a register cap.
MMA4 = [(256, 64, 4, 3, 8, "atomic", "plain", None), (256, 64, 4, 3, 4, "ws", "plain", None),
        (256, 64, 4, 3, 2, "atomic", "plain", None), (256, 64, 4, 4, 4, "atomic", "plain", None),
        (64, 128, 4, 4, 4, "atomic", "plain", None),
        (256, 64, 4, 3, 8, "atomic", "asm", None), (256, 64, 4, 3, 4, "ws", "asm", None),
        (256, 64, 4, 3, 2, "atomic", "asm", None), (256, 64, 4, 3, 4, "atomic", "asm", None),
        (256, 32, 4, 6, 8, "atomic", "asm", None), (256, 64, 4, 3, 12, "atomic", "asm", None),
        (256, 64, 4, 4, 16, "atomic", "asm", None), (256, 64, 4, 3, 8, "ws", "asm", None),
        (256, 64, 4, 3, 2, "ws", "asm", None), (64, 128, 4, 4, 4, "atomic", "asm", None),
        (64, 128, 4, 4, 2, "ws", "asm", None), (256, 32, 4, 4, 4, "atomic", "asm", None),
        (256, 64, 4, 3, 4, "atomic", "asm", 96)]


def mma4_name(bn, bk, w, st, wv, red, deq, mr):
    return f"mma4_bn{bn}_bk{bk}_w{w}_st{st}_x{wv}_{red}_{deq}" + (f"_r{mr}" if mr else "")


# (NREP, KW, STAGES, programs per SM) of the Gluon sm_90 kernel (kernels/w4a16_sm90.py), raced
# with --w4-set sm90 beside its shipped rule ("sm90_default": w4a16_sm90.tile_for and
# default_config): the packed tiles 64 x 64 and 32 x 128 (K x N, 16 bytes a thread a step), ring
# depth and the K split. Race 9 run 1 also had 128 x 32 (KW 4, NREP 1: 1.1-1.5x the best time
# everywhere) and 64 x 64 with 12 programs per SM (never the best by more than 4%).
SM90 = [(2, 2, 6, 8), (2, 2, 4, 8), (2, 2, 6, 4), (4, 1, 8, 8), (4, 1, 6, 4), (4, 1, 8, 4), (4, 1, 4, 8),
        (4, 1, 8, 12)]


def sm90_name(nrep, kw, st, per_sm):
    return f"sm90_{32 * kw}x{32 * nrep}_st{st}_x{per_sm}"


def sm90_candidates(m, n, k, sms):
    """The Gluon kernel's shipped rule and the configs that fit the shape (N a multiple of the
    packed tile's width)."""
    from kernels.w4a16_sm90 import tile_for

    out = {}
    tile = tile_for(n, k)
    if tile:
        out["sm90_default"] = dict(PATH="sm90", NREP=tile[0], KW=tile[1])
    for nrep, kw, st, per_sm in SM90:
        if n % (32 * nrep) == 0 and k % (32 * kw) == 0:
            tiles = n // (32 * nrep)
            out[sm90_name(nrep, kw, st, per_sm)] = dict(PATH="sm90", NREP=nrep, KW=kw, STAGES=st,
                                                        SPLIT=max(1, round(per_sm * sms / tiles)))
    return out


def candidates(m, n, k, sms, kind="mma4"):
    """Named configs: main's pick_config first ("default": the GEMV at M <= 2, the v2 tile
    kernel from M = 3, as on main), then a GEMV alternative (M <= 2) and the v4 tile kernel;
    or (``kind`` "sm90") the default and the Gluon sm_90 kernel's configs."""
    c = {"default": pick_config(m, n, k, sms)}
    if kind == "sm90":
        c.update(sm90_candidates(m, n, k, sms))
        return c
    if m <= 2:
        c["gemv_bn256_bk32_w4_x4"] = gemv_config(m, n, k, sms, rows=m, block_n=256, block_k=32, num_warps=4, waves=4,
                                                 scale_each=m == 2)
    for bn, bk, w, st, wv, red, deq, mr in MMA4:
        c[mma4_name(bn, bk, w, st, wv, red, deq, mr)] = mma4_config(
            m, n, k, sms, block_n=bn, block_k=bk, num_warps=w, num_stages=st, waves=wv, reduce=red, deq=deq, maxnreg=mr)
    return dedupe(c)


def _err(y, ref):
    e = ((y.float() - ref).norm() / ref.norm()).item()
    elem_ok = bool(((y.float() - ref).abs() <= 2.0**-6 * ref.abs() + 2e-3 * ref.abs().max()).all())
    return e if elem_ok else float("inf")


def _import_gemlite(log):
    """gemlite from $DSVOLC_BENCH_PEERS or the checkout's .peers/vendor (git-ignored), if there."""
    for d in (os.environ.get("DSVOLC_BENCH_PEERS"),
              os.path.join(os.path.dirname(__file__), "..", "..", ".peers", "vendor")):
        if d and os.path.isdir(os.path.join(d, "gemlite")) and d not in sys.path:
            sys.path.insert(0, d)
    try:
        import gemlite

        return gemlite.__version__
    except Exception as ex:  # noqa: BLE001
        log(f"gemlite not importable ({type(ex).__name__}: {ex}): raced without it")
        return None


def _caller(c, ws, x, packs):
    """(one call on the first weight copy, calls over every copy) of candidate config ``c``: the
    Gluon kernel's on weights repacked once per tile shape (``packs`` caches them), outside the
    timing as tinygemm's packing is; the rest through ``w4a16_gemm``."""
    if c.get("PATH") == "sm90":
        from kernels.w4a16_sm90 import repack, w4a16_sm90

        tile = (c["NREP"], c["KW"])
        if tile not in packs:
            packs[tile] = [repack(*w, nrep=tile[0], kw=tile[1]) for w in ws]
        cfg = {kk: v for kk, v in c.items() if kk != "PATH"}
        return (lambda: w4a16_sm90(x, packs[tile][0], cfg)), [lambda p=p: w4a16_sm90(x, p, cfg) for p in packs[tile]]
    return (lambda: w4a16_gemm(x, *ws[0], config=c)), [lambda w=w: w4a16_gemm(x, *w, config=c) for w in ws]


def run_race5(copy_gbs, log, rows, on_shape, shapes=SHAPES, ms=MS, smoke=False, deadline=float("inf"),
              gemlite_shapes=(), gemlite_deadline=float("inf"), kind="mma4"):
    sms = 132 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    gl_version = _import_gemlite(log) if gemlite_shapes else None
    all_ok = True
    timer = H.TIMER["graph"]
    if not smoke:  # the clocks up from idle before anything is timed
        a = torch.randn(8192, 8192, device=H.DEV, dtype=torch.bfloat16)
        t_end = time.time() + 2.0
        while time.time() < t_end:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
        del a
    for k, n in shapes:
        if time.time() > deadline:
            log(f"race5: {k}x{n} not started (past --budget-s)")
            continue
        t_shape = time.time()
        wbytes = awq_bytes(k, n)
        ws, deq0, dense, tg, tg_err = race_weights(k, n, smoke, log)
        gl = None
        if gl_version and (k, n) in gemlite_shapes and time.time() < gemlite_deadline:
            try:
                gl = [gemlite_layer(*w) for w in ws]
            except Exception as ex:  # noqa: BLE001
                log(f"gemlite pack failed on {k}x{n}: {type(ex).__name__}: {str(ex)[:160]}")
        packs = {}
        for m in ms:
            x = torch.randn(m, k, device=H.DEV, dtype=torch.bfloat16)
            ref = x.float() @ deq0
            r = dict(K=k, N=n, M=m, timing="graph", roofline_us=wbytes / copy_gbs / 1e3, cand={}, peers={})
            r["peers"]["cublas_bf16"] = dict(us=timer([lambda d=d: F.linear(x, d) for d in dense]))

            def peer(name, fn, calls):
                # as in race 4: relative error of the whole output < 1e-2 (tinygemm's bf16
                # scale/zero pairs miss the per-element bound on near-zero outputs)
                try:
                    y = fn()
                    e = ((y.float() - ref).norm() / ref.norm()).item()
                    if not e < 1e-2:
                        r["peers"][name] = dict(error=f"check failed: rel err {e:.2e}")
                        log(f"race5 {k}x{n} m={m} peer {name}: check failed ({e:.2e}), not timed")
                        return
                    r["peers"][name] = dict(us=timer(calls), rel_err=e, elem_ok=_err(y, ref) < float("inf"))
                except Exception as ex:  # noqa: BLE001
                    r["peers"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
                    log(f"race5 {k}x{n} m={m} peer {name}: {r['peers'][name]['error']}")

            if tg is not None:
                peer("tinygemm", lambda: torch._weight_int4pack_mm(x, tg[0][0], 128, tg[0][1]),
                     [lambda p=p: torch._weight_int4pack_mm(x, p[0], 128, p[1]) for p in tg])
            elif tg_err:
                r["peers"]["tinygemm"] = dict(error=tg_err)
            if gl is not None:
                peer("gemlite", lambda: gl[0](x), [lambda g=g: g(x) for g in gl])
            for name, c in candidates(m, n, k, sms, kind).items():
                try:
                    one, calls = _caller(c, ws, x, packs)
                    e = max(_err(one(), ref), _err(one(), ref))
                    if not e < 1e-2:
                        all_ok = False
                        r["cand"][name] = dict(error=f"mismatch {e:.2e}", cfg=c)
                        log(f"race5 MISMATCH {k}x{n} m={m} {name}: {e:.2e}")
                        continue
                    if (c.get("DEQ") == "asm" or c.get("PATH") == "sm90") and (k, n) == shapes[0] and m in (ms[0], ms[-1]):
                        # the fp16 build of the PRMT / sm_90 unpack (its own magic constant), once
                        xh = x.half()
                        oneh, _ = _caller(c, ws[:1], xh, {})
                        eh = _err(oneh(), xh.float() @ deq0)
                        r.setdefault("fp16_checks", {})[name] = eh
                        if not eh < 1e-2:
                            all_ok = False
                            r["cand"][name] = dict(error=f"fp16 mismatch {eh:.2e}", cfg=c)
                            log(f"race5 MISMATCH fp16 {k}x{n} m={m} {name}: {eh:.2e}")
                            continue
                    t = timer(calls)
                    e2 = _err(one(), ref)
                    ok2 = e2 < 1e-2
                    all_ok &= ok2
                    r["cand"][name] = dict(us=t, rel_err=e, rel_err_after=e2, cfg=c)
                    if not ok2:
                        r["cand"][name]["error"] = f"mismatch after timing {e2:.2e}"
                        log(f"race5 MISMATCH after timing {k}x{n} m={m} {name}: {e2:.2e}")
                except Exception as ex:  # noqa: BLE001 - a config that fails to build is a result
                    r["cand"][name] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}", cfg=c)
                    log(f"race5 ERROR {k}x{n} m={m} {name}: {r['cand'][name]['error']}")
            ok_c = [(v["us"], kk) for kk, v in r["cand"].items() if "us" in v and "error" not in v]
            r["best"] = min(ok_c) if ok_c else None
            ok_p = [(v["us"], kk) for kk, v in r["peers"].items() if "us" in v]
            r["best_peer"] = min(ok_p) if ok_p else None
            rows.append(r)
            b, bp = r["best"] or (float("nan"), "-"), r["best_peer"] or (float("nan"), "-")
            log(f"race5 {k}x{n} m={m}: best {b[1]} {b[0]:.1f} us ({r['roofline_us'] / b[0]:.0%} of roofline), "
                f"default {r['cand'].get('default', {}).get('us', float('nan')):.1f}, best peer {bp[1]} {bp[0]:.1f}; "
                + " ".join(f"{kk}={v['us']:.1f}" for kk, v in {**r["peers"], **r["cand"]}.items() if "us" in v))
        del ws, dense, deq0, tg, gl, packs
        if not smoke:
            torch.cuda.empty_cache()
        log(f"race5 shape {k}x{n} took {time.time() - t_shape:.0f} s")
        on_shape()
    return all_ok, gl_version


def table(meta, rows):
    sm90 = any("sm90_default" in r["cand"] for r in rows)
    L = [H.header(meta) + ".", "",
         "W4A16 race 5 (AutoAWQ group 128, bf16 x, CUDA-graph replays, us). roofline = packed weights, scales "
         "and zeros read once at the measured copy rate. default = pick_config on AutoAWQ's layout as shipped at the "
         "run" + ("; sm90 default = the Gluon kernel's shipped rule on the repacked weights (w4a16_sm90.tile_for, "
                  "default_config)" if sm90 else "") + ".", "",
         "| K x N | M | best ours | us | of roofline | default us | " + ("sm90 default us | sm90 default / best peer speed | " if sm90 else "")
         + "cuBLAS bf16 us | tinygemm us | best peer | ours / best peer speed |",
         "|---|---:|---|---:|---:|---:|" + ("---:|---:|" if sm90 else "") + "---:|---:|---|---:|"]
    for r in rows:
        b, bp = r["best"] or (float("nan"), "-"), r["best_peer"] or (float("nan"), "-")
        tgu = r["peers"].get("tinygemm", {}).get("us", float("nan"))
        sd = r["cand"].get("sm90_default", {}).get("us", float("nan"))
        L.append(f"| {r['K']} x {r['N']} | {r['M']} | {b[1]} | {b[0]:.1f} | {r['roofline_us'] / b[0]:.0%} "
                 f"| {r['cand'].get('default', {}).get('us', float('nan')):.1f} | "
                 + (f"{sd:.1f} | {bp[0] / sd:.2f}x | " if sm90 else "")
                 + f"{r['peers']['cublas_bf16']['us']:.1f} | {tgu:.1f} | {bp[1]} | {bp[0] / b[0]:.2f}x |")
    return "\n".join(L)


def run(run_, args):
    run_.res["w4a16_race5"] = []
    t0 = run_.t_start
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.w4_shapes.split(",") if s] or SHAPES
    ok, glv = run_race5(run_.copy_gbs, run_.log, run_.res["w4a16_race5"], run_.dump, deadline=t0 + args.budget_s,
                        shapes=shapes, ms=[int(v) for v in args.w4_ms.split(",")],
                        gemlite_shapes=[(7168, 18432)] if not args.no_gemlite else (),
                        gemlite_deadline=t0 + args.gemlite_deadline_s, kind=args.w4_set)
    run_.meta["gemlite"] = glv
    run_.meta["w4_set"] = args.w4_set
    run_.log(f"w4a16 race5 correctness: {'OK' if ok else 'FAILED'}")
    return run_.finish(ok, table(run_.meta, run_.res["w4a16_race5"]))


def smoke():
    rows = []
    ok, _ = run_race5(4000.0, print, rows, lambda: None, shapes=[(256, 128)], ms=[1, 2, 5], smoke=True)
    print(table(H.smoke_meta(), rows))
    return ok


def defaults_rows(rows, sms):
    """Per point: the candidate that `pick_config` now chooses (matched by its config), its
    measured time, the best candidate's and the peers' from the same run."""
    out = []
    for r in rows:
        want = pick_config(r["M"], r["N"], r["K"], sms)
        hit = [(name, v) for name, v in r["cand"].items() if v.get("cfg") == want and "us" in v and "error" not in v]
        if not hit:
            raise ValueError(f"{r['K']}x{r['N']} M={r['M']}: pick_config {want} was not a measured candidate")
        name, v = hit[0]
        peers = {p: d["us"] for p, d in r["peers"].items() if "us" in d}
        bp = min(peers.items(), key=lambda t: t[1])
        out.append(dict(K=r["K"], N=r["N"], M=r["M"], chosen=name, us=v["us"], roofline_us=r["roofline_us"],
                        best=r["best"], main_us=r["cand"]["default"]["us"], peers=peers, best_peer=bp,
                        peer_errors={p: d["error"] for p, d in r["peers"].items() if "error" in d}))
    return out


def defaults_table(meta, rows):
    """The shipped defaults against the peers, each point's goal (no slower than the best of
    tinygemm, gemlite and bf16 cuBLAS) marked met or missed."""
    d = defaults_rows(rows, meta["sms"])
    met = sum(r["us"] <= r["best_peer"][1] for r in d)
    L = [H.header(meta) + ".", "",
         f"W4A16 defaults (pick_config) in race 5 run 2, CUDA-graph replays, us. Goal: no slower than the best peer; "
         f"met at {met} of {len(d)} points. main = main's pick_config in the same run.", "",
         "| K x N | M | ours: path | us | of roofline | x best candidate | main us | cuBLAS bf16 | tinygemm | gemlite "
         "| best peer | ours / best peer speed | goal |",
         "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    f = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    for r in d:
        gl = r["peers"].get("gemlite")
        gl_s = f(gl) if gl is not None else ("fails check" if "gemlite" in r["peer_errors"] else "-")
        L.append(f"| {r['K']} x {r['N']} | {r['M']} | {r['chosen']} | {r['us']:.1f} | {r['roofline_us'] / r['us']:.0%} "
                 f"| {r['us'] / r['best'][0]:.2f} | {r['main_us']:.1f} | {f(r['peers'].get('cublas_bf16'))} "
                 f"| {f(r['peers'].get('tinygemm'))} | {gl_s} | {r['best_peer'][0]} | {r['best_peer'][1] / r['us']:.2f}x "
                 f"| {'met' if r['us'] <= r['best_peer'][1] else 'missed'} |")
    return "\n".join(L)


def profile_w4_sm90(spec: str):
    """``--profile-w4-sm90``: the candidates, each run once to compile, then once more inside
    the profiler range (so ncu sees one launch per candidate)."""
    from kernels.w4a16_sm90 import repack, w4a16_sm90

    shape, m, *names = spec.split(":")
    k, n = (int(v) for v in shape.split("x"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cands = sm90_candidates(int(m), n, k, sms)
    if names:
        cands = {kk: v for kk, v in cands.items() if kk in names[0].split(",")}
    w = make_weights(k, n, 17)
    x = torch.randn(int(m), k, device=H.DEV, dtype=torch.bfloat16)
    runs = []
    for name, c in cands.items():
        cfg = {kk: v for kk, v in c.items() if kk != "PATH"}
        p = repack(*w, nrep=cfg["NREP"], kw=cfg["KW"])
        w4a16_sm90(x, p, cfg)
        runs.append((name, p, cfg))
        print(f"profile: {name} {cfg}")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, p, cfg in runs:
        w4a16_sm90(x, p, cfg)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m kernels.bench.w4a16_race5")
    ap.add_argument("--defaults", required=True, help="a race-5 results.json: print the shipped defaults' table")
    res = json.load(open(ap.parse_args().defaults))
    print(defaults_table(res["meta"], res["w4a16_race5"]))
