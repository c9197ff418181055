"""Speed, capacity and cost for ``dsvolc size``: the performance model's figures beside
the memory plan, and ``--compare`` (feasible layouts and instance types side by side).

Every figure printed names its source: the model (capacity/perf.py and the number of
published figures it is calibrated against) and the price table or flag used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from capacity.calibration import load_figures
from capacity.catalog import GPUS
from capacity.instances import INSTANCE_CATALOG, INSTANCE_TYPES
from capacity.perf import MODEL_SOURCE, Layout, gpu_perf, load_hardware
from capacity.planner import PARALLELISMS, Plan, PlanError, plan
from capacity.sizing import Capacity, Cost, Workload, best_concurrency, cost, size_for_load
from capacity.specs import ModelSpec


def model_note() -> str:
    tol, figures, _ = load_figures()
    return f"model: {MODEL_SOURCE}, calibrated ±{tol:.0%} against {len(figures)} published figures (docs/planner.md)"


@dataclass
class Sized:
    plan: Plan
    instance_type: str | None
    layout: Layout
    capacity: Capacity
    cost: Cost
    performance: dict[str, Any]


def size_plan(model: ModelSpec, p: Plan, w: Workload, *, instance_type: str | None,
              price_per_hour: float | None = None, currency: str | None = None,
              pricing_path: str | None = None) -> Sized:
    hw = load_hardware()
    lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(instance_type, p.gpus_per_node))
    cap = size_for_load(model, gpu_perf(p.gpu, hw), p, lay, w, hw)
    _, perf = best_concurrency(model, gpu_perf(p.gpu, hw), p, lay, w, hw)
    c = cost(cap, w, instance_type=instance_type, price_per_hour=price_per_hour, currency=currency,
             pricing_path=pricing_path)
    doc = perf.as_dict() if perf else {}
    doc.pop("decode_step", None)
    doc["model"] = model_note()
    return Sized(p, instance_type, lay, cap, c, doc)


def documents(s: Sized, w: Workload) -> dict[str, Any]:
    """`performance`, `capacity` and `cost` objects of `--json` (docs/planner.md)."""
    cap = s.capacity.as_dict()
    cap["workload"] = {"input_tokens": w.input_tokens, "output_tokens": w.output_tokens,
                       "target_rps": w.target_rps, "ttft_slo_s": w.ttft_slo_s, "itl_slo_s": w.itl_slo_s,
                       "concurrency": w.concurrency}
    return {"performance": s.performance, "capacity": cap, "cost": s.cost.as_dict()}


def _ms(x: float) -> str:
    return f"{x * 1e3:,.1f} ms"


def render(s: Sized, w: Workload, console: Console) -> None:
    perf, cap, c = s.performance, s.capacity, s.cost
    t = Table(title=f"performance at {w.input_tokens:,} in / {w.output_tokens:,} out ({model_note()})",
              show_header=False)
    t.add_column("figure", style="bold")
    t.add_column("value", justify="right")
    if perf:
        for k, v in [
            ("concurrency per replica", f"{perf['concurrency']:,}"),
            ("decode tok/s per GPU", f"{perf['decode_tokens_per_s_per_gpu']:,.0f}"),
            ("prefill tok/s per GPU", f"{perf['prefill_tokens_per_s_per_gpu']:,.0f}"),
            ("output tok/s per GPU (request mix)", f"{perf['output_tokens_per_s_per_gpu']:,.0f}"),
            ("physical bound, decode tok/s per GPU", f"{perf['physical_bound_tokens_per_s_per_gpu']:,.0f}"),
            ("TTFT", _ms(perf["ttft_s"])),
            ("ITL", _ms(perf["itl_s"])),
            ("requests/s per replica", f"{perf['requests_per_s']:,.2f}"),
        ]:
            t.add_row(k, v)
    t.add_row("replicas", f"{cap.replicas:,}")
    t.add_row("GPUs / nodes", f"{cap.gpus:,} / {cap.nodes:,}")
    if cap.disaggregated and cap.disaggregated.get("feasible"):
        d = cap.disaggregated
        t.add_row("P/D alternative (prefill:decode replicas)",
                  f"{d['prefill_to_decode']}, {d['gpus']:,} GPUs / {d['nodes']:,} nodes")
    if c.priced:
        t.add_row(f"cost per hour ({c.currency or 'price unit'})", f"{c.per_hour:,.2f}")
        t.add_row("per million input / output tokens",
                  f"{c.per_million_input_tokens:,.3f} / {c.per_million_output_tokens:,.3f}")
        t.add_row("price source", c.pricing_source)
    console.print(t)
    if not c.priced:
        console.print(f"[yellow]![/yellow] cost: {c.note}", highlight=False)
    for r in cap.reasons:
        console.print(f"[red]✗[/red] {r}", highlight=False)
    for n in cap.notes:
        console.print(f"[yellow]![/yellow] {n}", highlight=False)


def _shapes(gpu_key: str | None, instance_type: str | None, per_node: int) -> list[tuple[str, int, str | None]]:
    """(GPU, GPUs per node, instance type) candidates: the catalog's confirmed instance
    types, plus the GPU asked for at the node size asked for."""
    out = [(g, n, it) for it, (g, n) in sorted(INSTANCE_TYPES.items())]
    if gpu_key and not instance_type and (gpu_key, per_node, None) not in out:
        out.append((gpu_key, per_node, None))
    return out


def compare(model: ModelSpec, w: Workload, *, gpu_key: str | None, instance_type: str | None, per_node: int,
            plan_kwargs: dict[str, Any], price_per_hour: float | None, currency: str | None,
            pricing_path: str | None) -> list[Sized]:
    """Feasible (layout, node shape) pairs, ranked by cost at the SLO when priced, else by
    GPUs needed. ``price_per_hour`` prices only the instance type it was given for."""
    rows: list[Sized] = []
    seen = set()
    for g, n, it in _shapes(gpu_key, instance_type, per_node):
        rec = INSTANCE_CATALOG.get(it or "")
        rdma = bool(rec and rec.rdma)
        for par in ("auto", *PARALLELISMS):
            try:
                p = plan(model, GPUS[g], gpus_per_node=n, parallelism=par, rdma=rdma, **plan_kwargs)
            except PlanError:
                continue
            key = (g, n, it, p.parallelism, p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size)
            if not p.fits or key in seen:
                continue
            seen.add(key)
            mine = price_per_hour if (it == instance_type or (it is None and instance_type is None)) else None
            s = size_plan(model, p, w, instance_type=it, price_per_hour=mine, currency=currency,
                          pricing_path=pricing_path)
            if s.capacity.feasible:
                rows.append(s)
    rows.sort(key=lambda s: (not s.cost.priced, s.cost.per_million_tokens or 0.0, s.capacity.gpus,
                             -s.capacity.output_tokens_per_s_per_gpu))
    return rows


def compare_document(rows: list[Sized], w: Workload) -> dict[str, Any]:
    return {
        "model": model_note(),
        "ranked_by": "cost per million tokens at the SLOs (priced rows first), then GPUs",
        "rows": [{"gpu": s.plan.gpu, "gpus_per_node": s.plan.gpus_per_node, "instance_type": s.instance_type,
                  "layout": s.plan.describe_layout(), "parallelism": s.plan.parallelism,
                  **documents(s, w)} for s in rows],
    }


def render_compare(rows: list[Sized], w: Workload, console: Console) -> None:
    slo = ", ".join(x for x in (f"TTFT ≤ {w.ttft_slo_s} s" if w.ttft_slo_s else "",
                                f"ITL ≤ {w.itl_slo_s * 1e3:g} ms" if w.itl_slo_s else "") if x) or "no SLO"
    load = f"{w.target_rps:g} req/s" if w.target_rps else "one replica"
    t = Table(title=f"feasible layouts for {load} of {w.input_tokens:,} in / {w.output_tokens:,} out, {slo} "
                    f"({model_note()})")
    for col in ("node", "layout", "GPUs", "nodes", "tok/s/GPU", "TTFT", "ITL", "cost / M tok"):
        t.add_column(col, justify="left" if col in ("node", "layout") else "right")
    for s in rows:
        node = s.instance_type or f"{s.plan.gpu} x {s.plan.gpus_per_node}"
        price = (f"{s.cost.per_million_tokens:,.3f} {s.cost.currency or ''}".strip() if s.cost.priced else "no price")
        t.add_row(node, s.plan.describe_layout(), f"{s.capacity.gpus:,}", f"{s.capacity.nodes:,}",
                  f"{s.capacity.output_tokens_per_s_per_gpu:,.0f}", _ms(s.capacity.ttft_s), _ms(s.capacity.itl_s),
                  price)
    console.print(t)
    if not rows:
        console.print("[red]✗[/red] no catalogued layout and instance type fits and meets the SLOs", highlight=False)
        return
    if not any(s.cost.priced for s in rows):
        console.print("[yellow]![/yellow] cost: the pricing table (capacity/pricing.yaml) has no VolcEngine price "
                      "with a source; give --price-per-hour for one instance type or --pricing FILE. Ranked by "
                      "GPUs needed.", highlight=False)


__all__ = ["size_plan", "documents", "render", "compare", "compare_document", "render_compare", "model_note", "Sized"]
