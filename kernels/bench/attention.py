"""Prefill attention benchmark: prefill_attention (kernels/prefill_attention.py), causal
varlen, against the fp32 reference (`attn_check`) and torch SDPA with each backend forced
(flash, cuDNN, efficient; one call per sequence for varlen cases) and
torch.nn.attention.varlen.varlen_attn where the installed torch has it.

Outputs are poisoned (NaN) before each call; a variant is timed only after it matches
the reference. Every call is timed as CUDA-graph replays with the L2 scrubbed before each
(`harness.TIMER["bench"]`). `--sweep` adds the Gluon kernel's ATTN_SM90 configs (on Hopper),
`--attn-sweep all` the Triton kernel's ATTN_SWEEP tiles too; `--budget-s` stops them (`harness.DEADLINE`), never the
defaults.
"""

from __future__ import annotations

import json
import math
import time

import torch
import torch.nn.functional as F

from kernels.bench import harness as H
from kernels.bench.harness import DEADLINE, TIMER

ATTN_VARLEN = [8191, 4097, 3001, 2048, 1025, 513, 77, 5]  # odd lengths, 18957 tokens
ATTN_CASES = [
    dict(name="d128_4k", lens=[4096], hq=32, hkv=32, dqk=128, dv=128),
    dict(name="d128_16k", lens=[16384], hq=32, hkv=32, dqk=128, dv=128),
    dict(name="d128_gqa4_16k", lens=[16384], hq=32, hkv=8, dqk=128, dv=128),
    dict(name="d128_varlen", lens=ATTN_VARLEN, hq=32, hkv=32, dqk=128, dv=128),
    dict(name="mla_4k", lens=[4096], hq=16, hkv=16, dqk=192, dv=128),
    dict(name="mla_8k", lens=[8192], hq=16, hkv=16, dqk=192, dv=128),
    dict(name="mla_16k", lens=[16384], hq=16, hkv=16, dqk=192, dv=128),
    dict(name="mla_varlen", lens=ATTN_VARLEN, hq=16, hkv=16, dqk=192, dv=128),
]
# the Gluon Hopper kernel's candidates (kernels/prefill_sm90.py launch configs), raced with --sweep
# (whole launch configs: a candidate does not move when the default does)
_SM90_BASE = dict(BLOCK_N=128, STAGES=2, PINGPONG=True, PERSISTENT=0, HEAD_MAJOR=False)
ATTN_SM90 = {fam: {n: dict(_SM90_BASE, **c) for n, c in cands.items()} for fam, cands in {
    "d128": {"sm90_tile": {}, "sm90_nopp": dict(PINGPONG=False), "sm90_hm": dict(HEAD_MAJOR=True),
             "sm90_hm_nopp": dict(HEAD_MAJOR=True, PINGPONG=False), "sm90_p1": dict(PERSISTENT=1),
             "sm90_p1_nopp": dict(PERSISTENT=1, PINGPONG=False), "sm90_s3_p1_nopp": dict(STAGES=3, PERSISTENT=1,
                                                                                         PINGPONG=False)},
    "mla": {"sm90_tile": {}, "sm90_nopp": dict(PINGPONG=False), "sm90_hm": dict(HEAD_MAJOR=True),
            "sm90_hm_nopp": dict(HEAD_MAJOR=True, PINGPONG=False), "sm90_p1": dict(PERSISTENT=1),
            "sm90_p1_nopp": dict(PERSISTENT=1, PINGPONG=False)},
}.items()}
ATTN_SWEEP = {  # (BLOCK_M, BLOCK_N, warps, stages, TMA[, warp-specialised key loop])
    "d128": [(128, 128, 8, 2, True), (128, 64, 8, 4, True), (128, 128, 8, 3, False), (128, 64, 8, 3, True)],
    "mla": [(128, 64, 8, 2, True), (128, 64, 8, 4, True), (128, 64, 8, 3, False), (128, 128, 8, 2, True)],
}


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


def _peer_check(log, case, name, q, k, v, cu, y, smoke):
    """A peer's output against the fp32 reference (``attn_check``, no LSE), logged before its time."""
    rel, mabs, _, written = attn_check(q, k, v, cu, y, None, max_rows=256 if smoke else 2048)
    log(f"attn {case} peer {name}: check rel err {rel:.1e}, all written {written}")
    return dict(rel_err=rel, max_abs_err=mabs)


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
        cu = torch.tensor([0] + lens, device=H.DEV).cumsum(0).to(torch.int32)
        mx = max(lens)
        flops = attention_flops(lens, lens, hq, dqk, dv, causal=True)
        r = dict(case=case["name"], lens=lens if len(lens) <= 16 else len(lens), hq=hq, hkv=hkv, dqk=dqk, dv=dv,
                 flops=flops, default=default_config(dqk, dv, H.DEV if H.DEV == "cpu" else "cuda"), variants={}, peers={})
        if H.DEV == "cuda" and torch.cuda.get_device_capability() == (9, 0):  # what "default" launches there
            from kernels.prefill_sm90 import BLOCK_M
            from kernels.prefill_sm90 import default_config as sm90_default

            sms = torch.cuda.get_device_properties(0).multi_processor_count
            r["default_sm90"] = sm90_default(dqk, dv, -(-mx // BLOCK_M) * hq * len(lens) / sms)
        for dtype in (torch.bfloat16, torch.float16):
            q = torch.randn(tot, hq, dqk, device=H.DEV, dtype=dtype)
            k = torch.randn(tot, hkv, dqk, device=H.DEV, dtype=dtype)
            v = torch.randn(tot, hkv, dv, device=H.DEV, dtype=dtype)
            tag = "bf16" if dtype == torch.bfloat16 else "fp16"
            # "default" is what prefill_attention picks (the Gluon kernel on Hopper), "triton" the
            # Triton kernel's defaults
            cfgs = {"default": None, "triton": dict(KERNEL="triton")}
            if sweep and dtype == torch.bfloat16:
                fam = "mla" if dqk != dv else "d128"
                if H.DEV == "cuda" and torch.cuda.get_device_capability() == (9, 0):
                    cfgs.update({n: dict(KERNEL="sm90", **c) for n, c in ATTN_SM90[fam].items()})
                if sweep == "all":  # the Triton kernel's tiles too
                    for c in ATTN_SWEEP[fam]:
                        cfgs[_attn_cfg_name(c)] = _attn_cfg(c)
            for name, cfg in cfgs.items():
                if time.time() > DEADLINE["t"] and name != "default":
                    r["variants"][f"{name}_{tag}"] = dict(error="skipped: time budget")
                    continue
                try:
                    out = torch.full((tot, hq, dv), float("nan"), device=H.DEV, dtype=dtype)  # poison
                    o, lse = prefill_attention(q, k, v, cu, mx, out=out, return_lse=True, config=cfg)
                    rel, mabs, lerr, written = attn_check(q, k, v, cu, o, lse, max_rows=256 if smoke else 2048)
                    ok = written and rel < ATTN_TOL[dtype] and lerr < 1e-3
                    res = dict(rel_err=rel, max_abs_err=mabs, lse_err=lerr, written=written, ok=ok)
                    log(f"attn {case['name']} {tag} {name}: check rel err {rel:.1e}, lse err {lerr:.1e}, "
                        f"all written {written}: {'ok, timing' if ok else 'MISMATCH, not timed'}")
                    if not ok:
                        all_ok = False
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
                            y = fn().transpose(1, 2).reshape(tot, hq, dv)
                            diff = ((y.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
                            chk = _peer_check(log, case["name"], f"sdpa_{bname}", q, k, v, cu, y, smoke)
                            us = TIMER["bench"]([fn])
                        r["peers"][f"sdpa_{bname}"] = dict(us=us, tflops=flops / us / 1e6, frac_mm=flops / us / 1e6 / mm_tflops,
                                                           rel_diff_vs_ours=diff, **chk)
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
                            y = torch.cat([o_[0].transpose(0, 1) for o_ in loop()])
                            chk = _peer_check(log, case["name"], f"sdpa_{bname}_per_seq", q, k, v, cu, y, smoke)
                            us = TIMER["bench"]([loop])
                        r["peers"][f"sdpa_{bname}_per_seq"] = dict(us=us, tflops=flops / us / 1e6,
                                                                   frac_mm=flops / us / 1e6 / mm_tflops, **chk)
                        del views
                    except Exception as ex:  # noqa: BLE001
                        r["peers"][f"sdpa_{bname}_per_seq"] = dict(error=f"{type(ex).__name__}: {str(ex)[:160]}")
            if varlen_attn is not None:
                try:
                    y = varlen_attn(q, k, v, cu, mx)
                    diff = ((y.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
                    chk = _peer_check(log, case["name"], "torch_varlen_attn", q, k, v, cu, y, smoke)
                    us = TIMER["bench"]([lambda: varlen_attn(q, k, v, cu, mx)])
                    r["peers"]["torch_varlen_attn"] = dict(us=us, tflops=flops / us / 1e6,
                                                           frac_mm=flops / us / 1e6 / mm_tflops, rel_diff_vs_ours=diff,
                                                           **chk)
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



def attn_table(meta, attn):
    lines = [
        H.header(meta) + f", fp8 matmul {meta.get('fp8_mm_tflops') or float('nan'):.0f} TFLOP/s.",
        "",
        "Prefill attention, causal, bf16 (CUDA-graph replays, L2 scrubbed before each call, medians). TFLOP/s =",
        "2 * H * (Dqk + Dv) * visible pairs / time, visible pairs = sum L (L + 1) / 2 over sequences. (of mm) = fraction",
        "of the bf16 matmul ceiling. default = what prefill_attention picks; triton = the Triton kernel's defaults.",
        "",
        "| case | ours default TFLOP/s | of mm | triton | best variant | TFLOP/s | sdpa flash | sdpa cudnn | default / cudnn | sdpa efficient | torch varlen | err (bf16 / fp16) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
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

        tri = r["variants"].get("triton_bf16", {}).get("tflops", float("nan"))
        cud = next((p[n]["tflops"] for n in ("sdpa_cudnn", "sdpa_cudnn_per_seq") if "tflops" in p.get(n, {})), float("nan"))
        lines.append(
            f"| {r['case']} | {d.get('tflops', float('nan')):.0f} | {d.get('frac_mm', float('nan')):.0%} | {tri:.0f} | {best[1]} "
            f"| {best[0]:.0f} | {pt('sdpa_flash', 'sdpa_flash_per_seq')} | {pt('sdpa_cudnn', 'sdpa_cudnn_per_seq')} "
            f"| {d.get('tflops', float('nan')) / cud:.2f} | {pt('sdpa_efficient')} "
            f"| {pt('torch_varlen_attn')} | {d.get('rel_err', float('nan')):.1e} / {dh.get('rel_err', float('nan')):.1e} |"
        )
    return "\n".join(lines)

