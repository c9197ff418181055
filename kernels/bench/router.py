"""MoE router benchmark: grouped_topk (kernels/moe_routing.py) against the fp32 PyTorch
reference and vLLM's CUDA grouped_topk.

`check_router` compares every block config on the V3, V2 and V2-Lite layouts with the
reference before anything is timed; configs that fail it are never timed in the race.
`run_router` is the first runs' table (ours against the reference, eager and graphed);
`run_router_race` the race (ours, the previous `method="full"` kernel, vLLM's kernel when
$DSVOLC_PEER_TOPK_SO names a build of it). Every size is a CUDA-graph replay.
"""

from __future__ import annotations

import json
import os
import time

import torch

from kernels.bench import harness as H
from kernels.bench.harness import TIMER, bench_us, copies_for, graph_us
from kernels.moe_routing import _pick_block, grouped_topk
from kernels.reference import grouped_topk_reference

ROUTER_LAYOUTS = {
    "v3": dict(e=256, g=8, tg=4, k=8, scoring="sigmoid", bias=True, renorm=True, scale=2.5),
    "v2": dict(e=160, g=8, tg=3, k=6, scoring="softmax", bias=False, renorm=False, scale=16.0),
    "v2_lite": dict(e=64, g=1, tg=1, k=6, scoring="softmax", bias=False, renorm=False, scale=1.0),
}
ROUTER_T = [1, 16, 256, 4096, 8192, 32768]
ROUTER_CFGS = [(1, 1), (8, 1), (4, 4), (8, 2), (16, 4)]  # BLOCK_T = 2, and 4 on one warp, are refused on CUDA


def tie_free(t, e, dtype):
    x = torch.rand(t, e, device=H.DEV).argsort(dim=1).float()
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
                bias = torch.rand(L["e"], device=H.DEV) * 0.2 if L["bias"] else None
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
        bias = torch.rand(L["e"], device=H.DEV) * 0.2
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
    t0 = time.time()
    while not os.path.exists(done) and time.time() - t0 < 240:  # built in the background
        time.sleep(2)
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
        bias = torch.rand(L["e"], device=H.DEV) * 0.2
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


def run_router_race(peer, log, ts=ROUTER_RACE_T, smoke=False, sweep_from=256):
    """Ours (shipped pick and the previous kernel) and vLLM's per token count; the BLOCK_T x
    warps sweep from ``sweep_from`` tokens (the smoke lowers it: the interpreter takes about
    5 s per call per 100 tokens)."""
    L = ROUTER_LAYOUTS["v3"]
    rows = []
    timer = TIMER["graph"]
    for t in ts:
        n = 1 if smoke else copies_for(t * L["e"] * 2)
        xs = [tie_free(t, L["e"], torch.bfloat16) for _ in range(n)]
        bias = torch.rand(L["e"], device=H.DEV) * 0.2
        r = dict(tokens=t, cfg=list(_pick_block(t)))
        r["ours_us"] = timer([lambda x=x: grouped_topk(*router_args(L, x, bias)) for x in xs])
        prev = dict(block_t=1, num_warps=1) if t <= 512 else dict(block_t=4, num_warps=1)  # its own defaults
        r["ours_full_us"] = timer([lambda x=x: grouped_topk(*router_args(L, x, bias), method="full", **prev) for x in xs])
        if peer is not None:
            r["vllm_us"] = timer([lambda x=x: peer(x, L["g"], L["tg"], L["k"], L["renorm"], L["scale"], bias, 1)
                                  for x in xs])
        r["sweep"] = {}
        if t >= sweep_from:
            for bt, nw in [c for c in ROUTER_RACE_CFGS if c not in ROUTER_BAD_CFGS]:
                fns = [lambda x=x, bt=bt, nw=nw: grouped_topk(*router_args(L, x, bias), block_t=bt, num_warps=nw)
                       for x in xs]
                r["sweep"][f"{bt}x{nw}"] = timer(fns)
        rows.append(r)
        log(f"router race t={t}: ours {r['ours_us']:.2f} us (previous kernel {r['ours_full_us']:.2f}) "
            f"vLLM {r.get('vllm_us', float('nan')):.2f}"
            + (f"; sweep {json.dumps({k: round(v, 2) for k, v in r['sweep'].items()})}" if r["sweep"] else ""))
    return rows



def table_lines(router):
    """`run_router`'s rows as the first runs' table."""
    lines = [
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
    return lines


def race_lines(router):
    """`run_router_race`'s rows: the router section of the race table."""
    L = ["Router race, DeepSeek-V3 layout, bf16 logits, CUDA-graph replay (us per call).",
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
    return L
