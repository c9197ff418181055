"""Capacity and cost: the replicas and nodes a load needs at its SLOs, and what they cost.

Pure functions over a memory plan (capacity.planner) and the performance model
(capacity.perf). ``size_for_load`` finds the largest concurrency per replica whose TTFT and
ITL meet the SLOs (and whose sequences fit the KV cache), then the replicas for the target
request rate, co-located (prefill and decode on the same engines) and disaggregated (a
prefill pool and a decode pool of the same layout, sized separately). ``cost`` prices the
nodes from a price table (capacity/pricing.yaml, or a user's file) or a given price per
node-hour, and says which it used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from capacity.perf import GPUPerf, Hardware, Layout, PerfDataError, Performance, estimate, gpu_perf, load_hardware
from capacity.planner import PARALLELISMS, Plan, PlanError, plan
from capacity.specs import GPUSpec, ModelSpec

PRICING_FILE = Path(__file__).with_name("pricing.yaml")

# The request a deployment is sized for when nobody states it (a stack's serving.workload,
# `dsvolc size --input-tokens/--output-tokens`), per model class: a 2k-token prompt and an
# answer as long as the class's max_tokens ceiling (workloads/engine/engine_args.py
# MAX_OUTPUT_TOKENS_BY_CLASS), so the context derived from it holds a full answer. For a
# reasoning model that is 32,768 tokens, DeepSeek-R1's own generation budget ("maximum
# generation length of 32,768 tokens", DeepSeek-R1 paper, arXiv:2501.12948, section 3.1).
WORKLOAD_DEFAULTS = {"chat": {"input_tokens": 2048, "output_tokens": 8192},
                     "reasoning": {"input_tokens": 2048, "output_tokens": 32768}}


@dataclass(frozen=True)
class Workload:
    input_tokens: int = 2048
    output_tokens: int = 1024
    target_rps: float | None = None  # requests per second to serve (None: one replica)
    ttft_slo_s: float | None = None
    itl_slo_s: float | None = None
    concurrency: int | None = None  # sequences per replica (None: the most the SLOs allow)

    def __post_init__(self):
        for name in ("input_tokens", "output_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"{name}: expected a positive integer, got {v!r}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                                             or self.concurrency < 1):
            raise PlanError(f"concurrency: expected a positive integer, got {self.concurrency!r}")
        for name in ("target_rps", "ttft_slo_s", "itl_slo_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                raise PlanError(f"{name}: expected a number > 0, got {v!r}")


@dataclass
class Capacity:
    feasible: bool
    concurrency_per_replica: int
    max_concurrency_per_replica: int  # the KV cache and max_num_seqs allow
    requests_per_s_per_replica: float
    replicas: int
    gpus: int
    nodes: int
    ttft_s: float
    itl_s: float
    output_tokens_per_s_per_gpu: float
    prefill_share: float = 0.0  # fraction of the GPUs' time spent prefilling
    reasons: list[str] = field(default_factory=list)
    disaggregated: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Cost:
    priced: bool
    pricing_source: str  # "capacity/pricing.yaml", the user's file, "--price-per-hour", or "none"
    currency: str | None
    price_per_node_hour: float | None
    per_hour: float | None
    per_million_input_tokens: float | None
    per_million_output_tokens: float | None
    per_million_tokens: float | None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def max_concurrency(p: Plan, w: Workload) -> int:
    """Sequences of ``input + output`` tokens the replica's engines hold at once."""
    per_seq = w.input_tokens + w.output_tokens
    by_kv = p.data_parallel_size * (p.kv_cache_tokens // per_seq)
    return max(0, min(by_kv, p.max_num_seqs * p.data_parallel_size))


def _meets(perf: Performance, w: Workload) -> bool:
    return (w.ttft_slo_s is None or perf.ttft_s <= w.ttft_slo_s) and (w.itl_slo_s is None or perf.itl_s <= w.itl_slo_s)


def _perf(m: ModelSpec, gpu: GPUPerf, p: Plan, lay: Layout, w: Workload, c: int, hw: Hardware) -> Performance:
    return estimate(m, gpu, lay, concurrency=c, input_tokens=w.input_tokens, output_tokens=w.output_tokens,
                    quantization=p.quantization, kv_cache_dtype=p.kv_cache_dtype,
                    max_num_batched_tokens=p.max_num_batched_tokens, hw=hw)


def best_concurrency(m: ModelSpec, gpu: GPUPerf, p: Plan, lay: Layout, w: Workload,
                     hw: Hardware | None = None) -> tuple[int, Performance | None]:
    """The largest concurrency (<= what the KV cache holds) meeting the SLOs. ITL and TTFT
    grow with concurrency, so a bisection finds it. (0, None) when not even one fits."""
    hw = hw or load_hardware()
    hi = max_concurrency(p, w)
    if hi < 1:
        return 0, None
    if w.concurrency is not None:
        c = min(w.concurrency, hi)
        return c, _perf(m, gpu, p, lay, w, c, hw)
    first = _perf(m, gpu, p, lay, w, 1, hw)
    if not _meets(first, w):
        return 0, first
    lo, best = 1, first
    while lo < hi:
        mid = (lo + hi + 1) // 2
        pm = _perf(m, gpu, p, lay, w, mid, hw)
        if _meets(pm, w):
            lo, best = mid, pm
        else:
            hi = mid - 1
    return lo, best


def size_for_load(m: ModelSpec, gpu: GPUPerf, p: Plan, lay: Layout, w: Workload,
                  hw: Hardware | None = None) -> Capacity:
    """Replicas and nodes for ``w`` with the plan's layout (co-located), plus the P/D split."""
    hw = hw or load_hardware()
    c, perf = best_concurrency(m, gpu, p, lay, w, hw)
    reasons, notes = [], []
    if not p.fits:
        reasons.append("the memory plan does not fit")
    if w.concurrency is not None and c and c < w.concurrency:
        notes.append(f"concurrency {w.concurrency} lowered to {c}: the KV cache holds {c} sequences of "
                     f"{w.input_tokens + w.output_tokens} tokens per replica")
    if w.concurrency is not None and perf is not None and c and not _meets(perf, w):
        reasons.append(f"at concurrency {c} the SLOs are not met: TTFT {perf.ttft_s:.3f} s, ITL "
                       f"{perf.itl_s * 1e3:.1f} ms")
    if c == 0:
        if perf is None:
            reasons.append(f"one sequence of {w.input_tokens + w.output_tokens} tokens does not fit the KV cache")
        else:
            reasons.append(f"not even one sequence meets the SLOs: TTFT {perf.ttft_s:.3f} s, ITL "
                           f"{perf.itl_s * 1e3:.1f} ms at concurrency 1")
        return Capacity(False, 0, max_concurrency(p, w), 0.0, 0, 0, 0, perf.ttft_s if perf else 0.0,
                        perf.itl_s if perf else 0.0, 0.0, 0.0, reasons)
    assert perf is not None
    replicas = max(1, math.ceil(w.target_rps / perf.requests_per_s)) if w.target_rps else 1
    cap = Capacity(not reasons, c, max_concurrency(p, w), perf.requests_per_s, replicas, replicas * lay.gpus,
                   replicas * p.nodes, perf.ttft_s, perf.itl_s, perf.output_tokens_per_s_per_gpu,
                   perf.prefill_share, reasons, notes=notes)
    if w.target_rps:
        cap.disaggregated = disaggregated(m, gpu, p, lay, w, hw)
    return cap


def disaggregated(m: ModelSpec, gpu: GPUPerf, p: Plan, lay: Layout, w: Workload,
                  hw: Hardware | None = None) -> dict[str, Any]:
    """P/D: a prefill pool sized so that queueing keeps TTFT within its SLO (M/D/1 wait
    ``rho / (2 (1 - rho))`` prompts), a decode pool holding ``rps x output x ITL`` sequences
    (Little's law) at the largest batch whose decode-only ITL meets its SLO."""
    hw = hw or load_hardware()
    one = _perf(m, gpu, p, lay, w, 1, hw)
    service = w.input_tokens / (one.prefill_tokens_per_s_per_gpu * lay.gpus)  # one prompt, full-chunk rate
    t_alone = one.ttft_s - one.decode_itl_s * one.tokens_per_step
    rho = 0.8
    if w.ttft_slo_s:
        # TTFT = t_alone + wait; wait = rho / (2 (1 - rho)) x service  ->  largest rho
        slack = w.ttft_slo_s - t_alone
        rho = 0.0 if slack <= 0 else min(0.9, (2 * slack / service) / (1 + 2 * slack / service))
    prefill_replicas = math.ceil(w.target_rps * service / rho) if rho > 0 else 0
    # decode pool: the largest batch whose decode-only ITL meets the SLO
    hi = max_concurrency(p, w)
    c = 0
    lo_c, hi_c = 1, hi
    while lo_c <= hi_c:
        mid = (lo_c + hi_c) // 2
        if w.itl_slo_s is None or _perf(m, gpu, p, lay, w, mid, hw).decode_itl_s <= w.itl_slo_s:
            c, lo_c = mid, mid + 1
        else:
            hi_c = mid - 1
    if not c or not prefill_replicas:
        return {"feasible": False, "reason": "the TTFT SLO is below one prompt's prefill time" if not prefill_replicas
                else "not even one sequence meets the ITL SLO in decode"}
    d = _perf(m, gpu, p, lay, w, c, hw)
    in_flight = w.target_rps * w.output_tokens * d.decode_itl_s
    decode_replicas = max(1, math.ceil(in_flight / c))
    return {
        "feasible": True, "prefill_replicas": prefill_replicas, "decode_replicas": decode_replicas,
        "decode_concurrency_per_replica": c, "prefill_utilization": rho, "decode_itl_s": d.decode_itl_s,
        "gpus": (prefill_replicas + decode_replicas) * lay.gpus,
        "nodes": (prefill_replicas + decode_replicas) * p.nodes,
        "prefill_to_decode": f"{prefill_replicas}:{decode_replicas}",
    }


def load_pricing(path: str | Path | None = None) -> tuple[str, dict[str, dict[str, Any]]]:
    """(currency, {instance type: {per_hour, source, read}}) from a pricing file, validated."""
    p = Path(path) if path else PRICING_FILE
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PerfDataError(f"pricing: cannot read {p}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("currency"), str) or not isinstance(doc.get("prices"), dict):
        raise PerfDataError(f"pricing: {p.name}: expected `currency` (a string) and `prices` (a mapping)")
    for itype, e in doc["prices"].items():
        if not isinstance(e, dict) or set(e) != {"per_hour", "source", "read"}:
            raise PerfDataError(f"pricing: {p.name}: prices.{itype}: expected per_hour, source and read")
        v = e["per_hour"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise PerfDataError(f"pricing: {p.name}: prices.{itype}.per_hour: expected a number > 0, got {v!r}")
        if not str(e["source"]).strip():
            raise PerfDataError(f"pricing: {p.name}: prices.{itype}.source: expected where the price was read")
    return doc["currency"], doc["prices"]


def cost(cap: Capacity, w: Workload, *, instance_type: str | None, price_per_hour: float | None = None,
         currency: str | None = None, pricing_path: str | Path | None = None) -> Cost:
    """Cost per hour and per million tokens of ``cap``'s nodes at the target rate (or one
    replica at its capacity). ``price_per_hour`` (per node) wins over the pricing table."""
    source, price, cur = "none", None, currency
    if price_per_hour is not None:
        if isinstance(price_per_hour, bool) or not isinstance(price_per_hour, (int, float)) or price_per_hour <= 0:
            raise PlanError(f"price_per_hour: expected a number > 0, got {price_per_hour!r}")
        source, price = "--price-per-hour", float(price_per_hour)
    else:
        cur_file, prices = load_pricing(pricing_path)
        entry = prices.get(instance_type or "")
        if entry:
            source = str(pricing_path) if pricing_path else "capacity/pricing.yaml"
            price, cur = float(entry["per_hour"]), cur_file
    if price is None or not cap.replicas:
        why = ("no price: the pricing table has no entry for "
               + (instance_type or "this GPU (no instance type given)")
               + "; give --price-per-hour (per node) or --pricing FILE") if price is None else "no feasible capacity"
        return Cost(False, source, cur, price, None, None, None, None, why)
    per_hour = price * cap.nodes
    rps = w.target_rps or cap.requests_per_s_per_replica * cap.replicas
    tokens_in, tokens_out = rps * w.input_tokens * 3600, rps * w.output_tokens * 3600
    # split the hour's cost between input and output by the share of GPU time prefill takes
    prefill_share = cap.prefill_share
    return Cost(True, source, cur, price, per_hour,
                per_hour * prefill_share / tokens_in * 1e6,
                per_hour * (1 - prefill_share) / tokens_out * 1e6,
                per_hour / (tokens_in + tokens_out) * 1e6,
                "per million input / output tokens split the hour by the share of GPU time prefill takes")


def within_context(w: Workload, max_model_len: int) -> tuple[Workload, str | None]:
    """``w`` shortened to what a context of ``max_model_len`` holds (the output first), and a
    note saying so; ``w`` itself when it fits."""
    if w.input_tokens + w.output_tokens <= max_model_len or max_model_len < 2:
        return w, None
    inp = min(w.input_tokens, max_model_len // 2) if w.input_tokens >= max_model_len else w.input_tokens
    short = replace(w, input_tokens=inp, output_tokens=max_model_len - inp)
    return short, (f"workload {w.input_tokens:,} in + {w.output_tokens:,} out is longer than max_model_len "
                   f"{max_model_len:,}: sized for {short.input_tokens:,} in + {short.output_tokens:,} out")


def _tp_candidates(gpus_per_node: int) -> list[int]:
    return sorted({t for t in (1, 2, 4, 8, 16) if t <= gpus_per_node} | {gpus_per_node})


def rank_layouts(model: ModelSpec, gpu: GPUSpec, w: Workload, *, gpus_per_node: int, rdma: bool = False,
                 instance_type: str | None = None, max_nodes: int | None = None, hw: Hardware | None = None,
                 admissible: Callable[[Plan], bool] | None = None, **plan_kwargs: Any) -> Plan:
    """The default layout of a replica: of the layouts that fit (``plan`` with each
    parallelism, and every TP within one node), on at most ``max_nodes`` nodes, the one the
    performance model ranks best at workload ``w``: with ``w.target_rps`` the fewest GPUs
    for the load, else the most output tokens/s per GPU at the largest concurrency meeting
    the SLOs; only layouts meeting the SLOs count. ``plan_kwargs`` are ``plan``'s engine
    settings (no layout: that is what is chosen); the workload's length is the plan's
    ``sequence_tokens``; ``admissible`` drops layouts a caller cannot place (a stack's pool). When no layout fits and meets the SLOs, the planner's own choice
    (the fewest GPUs) with the reason in ``why["layout"]``."""
    for k in ("parallelism", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        if plan_kwargs.get(k) not in (None, "auto"):
            raise PlanError(f"{k}: rank_layouts chooses the layout; plan() takes a given one")
        plan_kwargs.pop(k, None)
    kw = dict(plan_kwargs, gpus_per_node=gpus_per_node, rdma=rdma,
              sequence_tokens=w.input_tokens + w.output_tokens)
    base = plan(model, gpu, **kw)
    options: list[tuple[str, dict[str, Any]]] = [(par, {"parallelism": par}) for par in PARALLELISMS]
    options += [(f"tp{t}", {"tensor_parallel_size": t, "pipeline_parallel_size": 1})
                for t in _tp_candidates(gpus_per_node)]
    plans, seen = [base], {_key(base)}
    for _, extra in options:
        try:
            p = plan(model, gpu, **kw, **extra)
        except PlanError:
            continue
        if _key(p) not in seen:
            seen.add(_key(p))
            plans.append(p)
    fitting = [p for p in plans if p.fits and (max_nodes is None or p.nodes <= max_nodes)]
    placeable = [p for p in fitting if admissible is None or admissible(p)]
    unplaced, fitting = [p for p in fitting if p not in placeable], placeable
    if not fitting:
        return base
    try:
        hw = hw or load_hardware()
        perf = gpu_perf(gpu.name, hw)
    except (PerfDataError, PlanError) as exc:
        base.why["layout"] += f"; not ranked: {exc}"
        return base
    rated = []
    for p in fitting:
        wc, _ = within_context(w, p.max_model_len)
        try:
            lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(instance_type, gpus_per_node))
            c, pf = best_concurrency(model, perf, p, lay, wc, hw)
        except PlanError:  # e.g. EP across nodes with no RDMA figure for the node: cannot be rated
            continue
        if c and pf is not None and _meets(pf, wc):
            replicas = max(1, math.ceil(w.target_rps / pf.requests_per_s)) if w.target_rps else 1
            rated.append((p, c, pf, replicas * p.total_gpus, wc))
    unrated = []
    for p in unplaced:
        wc, _ = within_context(w, p.max_model_len)
        try:
            c, pf = best_concurrency(model, perf, p, Layout.from_plan(
                p, rdma_gb_s=hw.rdma_gb_s_per_gpu(instance_type, gpus_per_node)), wc, hw)
        except PlanError:
            continue
        if c and pf is not None and _meets(pf, wc):
            unrated.append((p, pf.output_tokens_per_s_per_gpu))
    if not rated:
        slo = _slo_text(w)
        base.why["layout"] += (f"; no layout that fits meets {slo} at {w.input_tokens:,} in / "
                               f"{w.output_tokens:,} out, so none is ranked")
        return base
    if w.target_rps:
        rated.sort(key=lambda r: (r[3], -r[2].output_tokens_per_s_per_gpu, r[0].total_gpus))
    else:
        rated.sort(key=lambda r: (-r[2].output_tokens_per_s_per_gpu, r[0].total_gpus))
    best, c, pf, gpus, wc = rated[0]
    by = (f"the fewest GPUs for {w.target_rps:g} req/s ({gpus:,})" if w.target_rps
          else "the most output tokens/s per GPU")
    why = (f"{best.describe_layout()}: ranked best of {len(rated)} layout(s) that fit and meet {_slo_text(w)} by "
           f"the performance model (capacity/perf.py) at {wc.input_tokens:,} in / {wc.output_tokens:,} out, "
           f"{by}: {pf.output_tokens_per_s_per_gpu:,.0f} output tok/s per GPU at {c} sequences per replica")
    if len(rated) > 1:
        nxt = rated[1]
        why += f"; next {nxt[0].describe_layout()}, {nxt[2].output_tokens_per_s_per_gpu:,.0f} tok/s per GPU"
    if base.fits and _key(base) != _key(best):
        why += f"; the fewest GPUs would be {base.describe_layout()}"
    for p, tps in unrated:
        if tps > pf.output_tokens_per_s_per_gpu:
            why += (f"; {p.describe_layout()} rates higher but the pool does not hold the replicas "
                    f"({tps:,.0f} tok/s per GPU)")
    best.why["layout"] = why
    return best


def _key(p: Plan) -> tuple:
    return (p.parallelism, p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size, p.expert_parallel)


def _slo_text(w: Workload) -> str:
    parts = [f"TTFT <= {w.ttft_slo_s:g} s" if w.ttft_slo_s else "",
             f"ITL <= {w.itl_slo_s * 1e3:g} ms" if w.itl_slo_s else ""]
    return " and ".join(x for x in parts if x) or "no SLO"


__all__ = ["Workload", "Capacity", "Cost", "size_for_load", "best_concurrency", "max_concurrency",
           "disaggregated", "cost", "load_pricing", "PRICING_FILE", "WORKLOAD_DEFAULTS", "rank_layouts",
           "within_context"]
