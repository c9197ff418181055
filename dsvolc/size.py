"""``dsvolc size``: will a model fit a GPU type under vLLM, and with which engine settings?

Registered on the CLI app as ``app.command("size")(size)``. Exit status: 0 when the
plan fits, 1 when it does not (the reasons are printed), 2 for bad input (unknown
model or GPU, malformed option), without a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from capacity.catalog import GiB, GPUS, MODELS, get_gpu, get_model
from capacity.instances import resolve_instance_type
from capacity.planner import Plan, PlanError, plan


def _gib(x: int) -> str:
    return f"{x / GiB:,.2f} GiB"


def render_table(p: Plan, console: Console) -> None:
    mem = Table(title=f"{p.model} on {p.gpu} — per GPU", show_lines=False)
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

    eng = Table(title="engine", show_header=False)
    eng.add_column("setting", style="bold")
    eng.add_column("value", justify="right")
    rows = [
        ("fits", "[green]yes[/green]" if p.fits else "[red]no[/red]"),
        ("tensor parallel size", str(p.tensor_parallel_size)),
        ("pipeline parallel size", str(p.pipeline_parallel_size)),
        ("nodes x GPUs per node", f"{p.nodes} x {p.gpus_per_node}"),
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
    for r in p.reasons:
        console.print(f"[red]✗[/red] {r}")
    for n in p.notes:
        console.print(f"[yellow]![/yellow] {n}")


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code=2)


def size(
    model: str = typer.Option(..., "--model", "-m",
                              help="Catalog model name, or a path to a config.json / model dir."),
    gpu: str = typer.Option(..., "--gpu", "-g",
                            help=f"GPU ({', '.join(GPUS)}) or a known VolcEngine instance type."),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", "-n",
                                                help="GPUs per node (default 8, or the "
                                                     "instance type's count)."),
    context: Optional[int] = typer.Option(None, "--context", "-c",
                                          help="Required context length (max_model_len)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", "-q",
                                               help="Weights: bf16, fp16, fp8 or awq "
                                                    "(default: the checkpoint's own)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype",
                                       help="auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2."),
    tensor_parallel_size: Optional[int] = typer.Option(None, "--tensor-parallel-size", "--tp"),
    pipeline_parallel_size: Optional[int] = typer.Option(None, "--pipeline-parallel-size", "--pp"),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens"),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as a JSON object."),
) -> None:
    """Size a vLLM deployment: weights, reserve and KV cache per GPU; TP, PP, nodes."""
    try:
        spec = get_model(model)
    except KeyError as exc:
        _fail(exc.args[0] if exc.args else str(exc))
    resolved = resolve_instance_type(gpu)
    try:
        gpu_spec = get_gpu(resolved[0] if resolved else gpu)
    except KeyError as exc:
        _fail(f"{exc.args[0]}; or a confirmed VolcEngine instance type")
    per_node = gpus_per_node if gpus_per_node is not None else (resolved[1] if resolved else 8)
    try:
        p = plan(spec, gpu_spec, gpus_per_node=per_node, context=context,
                 quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                 tensor_parallel_size=tensor_parallel_size,
                 pipeline_parallel_size=pipeline_parallel_size, max_num_seqs=max_num_seqs,
                 gpu_memory_utilization=gpu_memory_utilization,
                 max_num_batched_tokens=max_num_batched_tokens)
    except PlanError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(p.as_dict(), indent=2) + "\n")
    else:
        render_table(p, Console())
    if not p.fits:
        raise typer.Exit(code=1)


__all__ = ["size", "render_table", "MODELS", "GPUS"]
