"""``dsvolc size``: will a model fit a GPU type under vLLM, and with which engine settings?

Registered on the CLI app as ``app.command("size")(size)``. Exit status: 0 when the
plan fits, 1 when it does not (the reasons are printed), 2 for bad input (unknown
model or GPU, malformed option), without a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.catalog import GPUS, MODELS, GiB, get_gpu, get_model
from capacity.instances import INSTANCE_TYPES, resolve_instance_type, suggest_instance_type
from capacity.perf import PerfDataError
from capacity.planner import KV_CACHE_DTYPES, QUANTIZATIONS, Plan, PlanError, plan
from capacity.sizing import Workload
from dsvolc import size_perf

EPILOG = (
    f"Models: {', '.join(MODELS)}. "
    f"GPUs: {', '.join(GPUS)}. "
    f"Instance types: {', '.join(sorted(INSTANCE_TYPES))} (others: give the GPU and --gpus-per-node). "
    "Exit 0: fits; 1: does not fit (reasons printed); 2: bad input."
)


def _gib(x: int) -> str:
    return f"{x / GiB:,.2f} GiB"


def plan_document(p: Plan, instance_type: str | None = None) -> dict[str, Any]:
    """The plan as `--json` prints it. Figures appear only where they mean something: a
    layout that is invalid in itself (TP not dividing the heads, ...) has none; a valid layout
    that runs out of memory shows the memory that does not add up; only a plan that fits has
    engine settings and capacity."""
    doc: dict[str, Any] = {
        "fits": p.fits,
        "model": p.model,
        "gpu": p.gpu,
        "node": {"gpus": p.gpus_per_node, "instance_type": instance_type, "gpu_memory_bytes": p.gpu_memory_bytes},
        "replica": {
            "parallelism": p.parallelism,
            "tensor_parallel_size": p.tensor_parallel_size,
            "pipeline_parallel_size": p.pipeline_parallel_size,
            "data_parallel_size": p.data_parallel_size,
            "expert_parallel_size": p.expert_parallel_size if p.expert_parallel else 1,
            "gpus": p.total_gpus,
            "nodes": p.nodes,
        },
        "weights_format": p.quantization,
        "kv_cache_dtype": p.kv_cache_dtype,
        "reasons": p.reasons,
        "notes": p.notes,
    }
    if p.layout_problems:
        return doc
    doc["memory_per_gpu"] = {
        "weights_bytes": p.weights_bytes_per_gpu,
        "reserve_bytes": p.reserve_bytes_per_gpu,
        "reserve_breakdown": p.reserve_breakdown,
        "kv_cache_bytes": p.kv_cache_bytes_per_gpu,
        "headroom_bytes": p.headroom_bytes_per_gpu,
        "gpu_memory_utilization": p.gpu_memory_utilization,
    }
    if not p.fits:
        return doc
    doc["kv_cache"] = {
        "bytes_per_token_per_gpu": p.kv_bytes_per_token_per_gpu,
        "tokens": p.kv_cache_tokens,
        "block_size": p.block_size,
    }
    doc["engine"] = {
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs,
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "vllm_args": p.vllm_args(),
    }
    doc["concurrency"] = {"context": p.context, "sequences": p.concurrency_at_context}
    return doc


def render_table(p: Plan, console: Console, instance_type: str | None = None) -> None:
    where = f"{p.gpu} x {p.gpus_per_node} per node" + (f" ({instance_type})" if instance_type else "")
    dp = f" x DP{p.data_parallel_size}" if p.data_parallel_size > 1 else ""
    ep = f" + EP{p.expert_parallel_size}" if p.expert_parallel else ""
    layout = (f"TP{p.tensor_parallel_size} x PP{p.pipeline_parallel_size}{dp}{ep} = {p.total_gpus} GPU(s) on "
              f"{p.nodes} node(s)")
    if p.layout_problems:
        console.print(f"[red]{p.model} cannot run as {layout} on {where}:[/red]")
        for r in p.reasons:
            console.print(f"[red]✗[/red] {r}")
        return

    title = f"{p.model} on {where}: {layout}" + ("" if p.fits else " (largest layout tried)")
    mem = Table(title=f"{title}, per GPU", show_lines=False)
    mem.add_column("memory", style="bold")
    mem.add_column("bytes", justify="right")
    mem.add_column("share", justify="right")
    for label, value in [
        ("weights", p.weights_bytes_per_gpu),
        ("reserve (non-KV)", p.reserve_bytes_per_gpu),
        ("KV cache", p.kv_cache_bytes_per_gpu),
        ("headroom (outside vLLM budget)", p.headroom_bytes_per_gpu),
    ]:
        mem.add_row(label, _gib(value), f"{100 * value / p.gpu_memory_bytes:.1f}%")
    for part, value in p.reserve_breakdown.items():
        mem.add_row(f"  · {part.replace('_', ' ')}", _gib(value), "", style="dim")
    mem.add_row("device total", _gib(p.gpu_memory_bytes), "100.0%", style="bold")
    console.print(mem)

    if p.fits:
        eng = Table(title="engine", show_header=False)
        eng.add_column("setting", style="bold")
        eng.add_column("value", justify="right")
        rows = [
            ("tensor parallel size", str(p.tensor_parallel_size)),
            ("pipeline parallel size", str(p.pipeline_parallel_size)),
            ("GPUs per replica", str(p.total_gpus)),
            ("nodes per replica", str(p.nodes)),
            ("weights format", p.quantization),
            ("kv cache dtype", p.kv_cache_dtype),
            ("KV bytes / token / GPU", f"{p.kv_bytes_per_token_per_gpu:,}"),
            ("KV cache capacity", f"{p.kv_cache_tokens:,} tokens"),
            ("max model len", f"{p.max_model_len:,}"),
            ("max num seqs", str(p.max_num_seqs)),
            ("max num batched tokens", f"{p.max_num_batched_tokens:,}"),
            ("gpu memory utilization", f"{p.gpu_memory_utilization:.2f}"),
            (f"concurrency at {p.context:,} tokens", str(p.concurrency_at_context)),
        ]
        for k, v in rows:
            eng.add_row(k, v)
        console.print(eng)
        console.print("[green]fits[/green]: " + " ".join(p.vllm_args()), highlight=False)
    for r in p.reasons:
        console.print(f"[red]✗[/red] {r}")
    for n in p.notes:
        console.print(f"[yellow]![/yellow] {n}")


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code=2)


def size(
    model: str = typer.Option(
        ..., "--model", "-m",
        help="Catalog model (see the list below), its Hugging Face id, or a path to a config.json or model "
             "directory."),
    gpu: str = typer.Option(
        ..., "--gpu", "-g",
        help="GPU (see the list below) or a catalogued VolcEngine instance type, which also sets "
             "--gpus-per-node."),
    gpus_per_node: Optional[int] = typer.Option(
        None, "--gpus-per-node", "-n",
        help="GPUs per node (default: the instance type's count, else 8)."),
    context: Optional[int] = typer.Option(
        None, "--context", "-c",
        help="Context the engine must hold (max_model_len); default: the largest that fits, up to the "
             "model's."),
    quantization: Optional[str] = typer.Option(
        None, "--quantization",
        help=f"Weights format: {', '.join(QUANTIZATIONS)} (default: the checkpoint's own)."),
    kv_cache_dtype: str = typer.Option(
        "auto", "--kv-cache-dtype",
        help=f"KV cache dtype: {', '.join(KV_CACHE_DTYPES)}."),
    tensor_parallel_size: Optional[int] = typer.Option(
        None, "--tensor-parallel-size", "--tp",
        help="GPUs one pipeline stage is split over (default: the smallest valid size that fits)."),
    pipeline_parallel_size: Optional[int] = typer.Option(
        None, "--pipeline-parallel-size", "--pp",
        help="Pipeline stages (default: 1, or the fewest whole nodes that fit)."),
    max_num_seqs: Optional[int] = typer.Option(
        None, "--max-num-seqs",
        help="Sequences the engine batches at once (default: up to 256, by the KV cache)."),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, "--gpu-memory-utilization",
        help="Fraction of each GPU's memory vLLM may take (default: leave ~2 GiB, at most 0.95)."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens",
        help="Token budget of one engine step (default: 8192, vLLM's)."),
    concurrency: Optional[int] = typer.Option(
        None, "--concurrency",
        help="Sequences per replica for the speed figures (default: the most the SLOs and KV cache allow)."),
    input_tokens: int = typer.Option(2048, "--input-tokens", help="Prompt tokens per request (mean)."),
    output_tokens: int = typer.Option(1024, "--output-tokens", help="Generated tokens per request (mean)."),
    target_rps: Optional[float] = typer.Option(
        None, "--target-rps", help="Requests per second to serve: sizes replicas, nodes and cost."),
    ttft_slo: Optional[float] = typer.Option(None, "--ttft-slo", help="Time-to-first-token SLO, seconds."),
    itl_slo: Optional[float] = typer.Option(None, "--itl-slo", help="Inter-token latency SLO, seconds."),
    compare: bool = typer.Option(
        False, "--compare",
        help="List the feasible layouts and instance types side by side, ranked by cost at the SLOs."),
    price_per_hour: Optional[float] = typer.Option(
        None, "--price-per-hour", help="Price of one node for one hour (the catalog has no VolcEngine prices)."),
    currency: Optional[str] = typer.Option(None, "--currency", help="Currency of --price-per-hour, e.g. CNY."),
    pricing: Optional[str] = typer.Option(
        None, "--pricing", help="A pricing file (the format of capacity/pricing.yaml) with prices per instance type."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as a JSON object instead of tables."),
) -> None:
    """Size a vLLM deployment: weights, reserve and KV cache per GPU; TP, PP, nodes; engine settings;
    speed (TTFT, ITL, tokens/s per GPU), the replicas and nodes for a load, and their cost."""
    try:
        spec = get_model(model)
    except KeyError as exc:
        _fail(exc.args[0] if exc.args else str(exc))
    resolved = resolve_instance_type(gpu)
    instance_type = gpu.strip().lower() if resolved else None
    if resolved is None and gpu.strip().lower().startswith("ecs."):
        _fail(f"gpu: instance type {gpu!r} is not in the instance catalog"
              f"{suggest_instance_type(gpu, confirmed_only=True, aside=True)}; known (capacity/instances.py): "
              f"{', '.join(sorted(INSTANCE_TYPES))}; give its GPU and count instead, e.g. --gpu H20 "
              f"--gpus-per-node 8")
    try:
        gpu_spec = get_gpu(resolved[0] if resolved else gpu)
    except KeyError as exc:
        _fail(f"{exc.args[0]}; or a catalogued VolcEngine instance type ({', '.join(sorted(INSTANCE_TYPES))})")
    if resolved and gpus_per_node is not None and gpus_per_node != resolved[1]:
        _fail(f"gpus-per-node: {instance_type} has {resolved[1]} GPU(s) per node, got {gpus_per_node}")
    per_node = gpus_per_node if gpus_per_node is not None else (resolved[1] if resolved else 8)
    try:
        workload = Workload(input_tokens=input_tokens, output_tokens=output_tokens, target_rps=target_rps,
                            ttft_slo_s=ttft_slo, itl_slo_s=itl_slo, concurrency=concurrency)
    except PlanError as exc:
        _fail(str(exc).replace("_slo_s", "-slo").replace("_", "-"))
    if compare:
        kwargs = dict(context=context, quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                      max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
                      max_num_batched_tokens=max_num_batched_tokens)
        try:
            rows = size_perf.compare(spec, workload, gpu_key=gpu_spec.name, instance_type=instance_type,
                                     per_node=per_node, plan_kwargs=kwargs, price_per_hour=price_per_hour,
                                     currency=currency, pricing_path=pricing)
        except (PlanError, PerfDataError) as exc:
            _fail(str(exc))
        if as_json:
            sys.stdout.write(json.dumps(size_perf.compare_document(rows, workload), indent=2) + "\n")
        else:
            size_perf.render_compare(rows, workload, Console())
        if not rows:
            raise typer.Exit(code=1)
        return
    try:
        p = plan(spec, gpu_spec, gpus_per_node=per_node, context=context,
                 quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                 tensor_parallel_size=tensor_parallel_size,
                 pipeline_parallel_size=pipeline_parallel_size, max_num_seqs=max_num_seqs,
                 gpu_memory_utilization=gpu_memory_utilization,
                 max_num_batched_tokens=max_num_batched_tokens)
    except PlanError as exc:
        _fail(str(exc))
    sized = None
    if p.fits:
        try:
            sized = size_perf.size_plan(spec, p, workload, instance_type=instance_type,
                                        price_per_hour=price_per_hour, currency=currency, pricing_path=pricing)
        except (PlanError, PerfDataError) as exc:
            _fail(str(exc))
    if as_json:
        doc = plan_document(p, instance_type)
        if sized:
            doc.update(size_perf.documents(sized, workload))
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        console = Console()
        render_table(p, console, instance_type)
        if sized:
            size_perf.render(sized, workload, console)
    if not p.fits:
        raise typer.Exit(code=1)


__all__ = ["size", "render_table", "plan_document", "EPILOG"]
