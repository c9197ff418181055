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

from capacity import wide_ep
from capacity.catalog import GPUS, MODELS, GiB, get_gpu, get_model
from capacity.instances import INSTANCE_CATALOG, INSTANCE_TYPES, resolve_instance_type, suggest_instance_type
from capacity.perf import PerfDataError, load_hardware
from capacity.planner import KV_CACHE_DTYPES, PARALLELISMS, QUANTIZATIONS, Plan, PlanError, plan
from capacity.sizing import WORKLOAD_DEFAULTS, Workload, rank_layouts, within_context
from dsvolc import size_perf, size_stack
from stacks.loader import shipped_stacks
from stacks.plan import infer_model_class

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
            "speculative_tokens": p.speculative_tokens,
            "rdma": p.rdma,
            "gpus": p.total_gpus,
            "nodes": p.nodes,
        },
        "weights_format": p.quantization,
        "kv_cache_dtype": p.kv_cache_dtype,
        "reasons": p.reasons,
        "notes": p.notes,
        "why": p.why,
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
        "replica_tokens": p.replica_kv_cache_tokens,
        "block_size": p.block_size,
    }
    doc["engine"] = {
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "max_model_len": p.max_model_len,
        "max_num_seqs": p.max_num_seqs,
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "sequence_tokens": p.sequence_tokens,
        "vllm_args": p.vllm_args(),
    }
    doc["concurrency"] = {"context": p.context, "sequences": p.concurrency_at_context}
    return doc


def render_table(p: Plan, console: Console, instance_type: str | None = None) -> None:
    where = f"{p.gpu} x {p.gpus_per_node} per node" + (f" ({instance_type})" if instance_type else "")
    dp = f" x DP{p.data_parallel_size}" if p.data_parallel_size > 1 else ""
    ep = f" + EP{p.expert_parallel_size}" if p.expert_parallel else ""
    mtp = f" + MTP {p.speculative_tokens}" if p.speculative_tokens else ""
    layout = (f"TP{p.tensor_parallel_size} x PP{p.pipeline_parallel_size}{dp}{ep}{mtp} = {p.total_gpus} GPU(s) on "
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
        for what, text in p.why.items():
            console.print(f"[bold]why[/bold] {what.replace('_', ' ')}: {text}", highlight=False)
    for r in p.reasons:
        console.print(f"[red]✗[/red] {r}")
    for n in p.notes:
        console.print(f"[yellow]![/yellow] {n}")


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code=2)


def size(
    model: Optional[str] = typer.Option(
        None, "--model", "-m",
        help="Catalog model (see the list below), its Hugging Face id, or a path to a config.json or model "
             "directory (required without --stack)."),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", "-g",
        help="GPU (see the list below) or a catalogued VolcEngine instance type, which also sets "
             "--gpus-per-node and --rdma (required without --stack)."),
    gpus_per_node: Optional[int] = typer.Option(
        None, "--gpus-per-node", "-n",
        help="GPUs per node (default: the instance type's count, else 8)."),
    context: Optional[int] = typer.Option(
        None, "--context", "-c",
        help="Context the engine must hold (max_model_len); default: --input-tokens + --output-tokens."),
    quantization: Optional[str] = typer.Option(
        None, "--quantization",
        help=f"Weights format: {', '.join(QUANTIZATIONS)} (default: the checkpoint's own)."),
    kv_cache_dtype: Optional[str] = typer.Option(
        None, "--kv-cache-dtype",
        help=f"KV cache dtype: {', '.join(KV_CACHE_DTYPES)} (default: auto)."),
    parallelism: Optional[str] = typer.Option(
        None, "--parallelism",
        help=f"Layout of a replica: auto, {', '.join(PARALLELISMS)} (docs/planner.md). Default: with no layout "
             "option, the layout the performance model ranks best for the workload."),
    tensor_parallel_size: Optional[int] = typer.Option(
        None, "--tensor-parallel-size", "--tp",
        help="GPUs one pipeline stage (or engine) is split over (default: chosen with the layout)."),
    pipeline_parallel_size: Optional[int] = typer.Option(
        None, "--pipeline-parallel-size", "--pp",
        help="Pipeline stages (default: chosen with the layout)."),
    data_parallel_size: Optional[int] = typer.Option(
        None, "--data-parallel-size", "--dp",
        help="Engines (attention replicas) per replica with --parallelism tp_ep/dp_ep (default: the nodes' GPUs / TP)."),
    speculative_tokens: Optional[int] = typer.Option(
        None, "--speculative-tokens",
        help="MTP speculative decoding: draft tokens per step from the model's own MTP module (default: 0, off)."),
    rdma: Optional[bool] = typer.Option(
        None, "--rdma/--no-rdma",
        help="The nodes of a replica reach each other over RDMA (default: the instance type's; a GPU name: no)."),
    stack: Optional[str] = typer.Option(
        None, "--stack",
        help=f"Read the model, the GPU pool and the engine settings from a stack ({', '.join(shipped_stacks())}, "
             "or a stack file) and plan it as `dsvolc preview` does; other options override its settings."),
    max_num_seqs: Optional[int] = typer.Option(
        None, "--max-num-seqs",
        help="Sequences one engine batches at once (default: those of the workload's length the KV cache holds, "
             "at most 256; more is refused)."),
    gpu_memory_utilization: Optional[float] = typer.Option(
        None, "--gpu-memory-utilization",
        help="Fraction of each GPU's memory vLLM may take (default: leave ~2 GiB, at most 0.95)."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens",
        help="Token budget of one engine step (default: 8192, vLLM's)."),
    concurrency: Optional[int] = typer.Option(
        None, "--concurrency",
        help="Sequences per replica for the speed figures (default: the most the SLOs and KV cache allow)."),
    input_tokens: Optional[int] = typer.Option(
        None, "--input-tokens", help="Prompt tokens of the request the engine is sized for (default: 2048)."),
    output_tokens: Optional[int] = typer.Option(
        None, "--output-tokens",
        help="Generated tokens of that request (default: the model class's max_tokens ceiling, chat "
             f"{WORKLOAD_DEFAULTS['chat']['output_tokens']}, reasoning {WORKLOAD_DEFAULTS['reasoning']['output_tokens']})."),
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
    """Size a vLLM deployment: weights, reserve and KV cache per GPU; layout, nodes; engine settings
    and why they were chosen; speed (TTFT, ITL, tokens/s per GPU), the replicas and nodes for a
    load, and their cost."""
    if parallelism is not None and parallelism not in ("auto", *PARALLELISMS):
        _fail(f"parallelism: expected auto or one of {', '.join(PARALLELISMS)}, got {parallelism!r}")
    for name, v in (("input-tokens", input_tokens), ("output-tokens", output_tokens)):
        if v is not None and v < 1:
            _fail(f"{name}: expected a positive integer, got {v}")
    engine_flags = dict(context=context, quantization=quantization, kv_cache_dtype=kv_cache_dtype,
                        max_num_seqs=max_num_seqs, gpu_memory_utilization=gpu_memory_utilization,
                        max_num_batched_tokens=max_num_batched_tokens)
    layout_flags = dict(parallelism=parallelism, tensor_parallel_size=tensor_parallel_size,
                        pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size)
    if stack is not None:
        if compare:
            _fail("compare: lists catalogued node shapes for a model; use it without --stack (give --model)")
        _size_stack(stack, dict(engine_flags, **layout_flags, speculative_tokens=speculative_tokens,
                                input_tokens=input_tokens, output_tokens=output_tokens, concurrency=concurrency,
                                ttft_slo=ttft_slo, itl_slo=itl_slo, model=model, gpu=gpu,
                                gpus_per_node=gpus_per_node, rdma=rdma),
                    target_rps=target_rps, price_per_hour=price_per_hour, currency=currency, pricing=pricing,
                    as_json=as_json)
        return
    if model is None or gpu is None:
        _fail(f"{'model' if model is None else 'gpu'}: required (--model and --gpu), or --stack STACK")
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
    rec = INSTANCE_CATALOG.get(instance_type or "")
    use_rdma = rdma if rdma is not None else bool(rec and rec.rdma)
    defaults = WORKLOAD_DEFAULTS[infer_model_class(spec.name)]
    try:
        workload = Workload(input_tokens=input_tokens or defaults["input_tokens"],
                            output_tokens=output_tokens or defaults["output_tokens"], target_rps=target_rps,
                            ttft_slo_s=ttft_slo, itl_slo_s=itl_slo, concurrency=concurrency)
    except PlanError as exc:
        _fail(str(exc).replace("_slo_s", "-slo").replace("_", "-"))
    engine_kwargs = dict(engine_flags, kv_cache_dtype=kv_cache_dtype or "auto",
                         speculative_tokens=speculative_tokens or 0)
    if compare:
        try:
            rows = size_perf.compare(spec, workload, gpu_key=gpu_spec.name, instance_type=instance_type,
                                     per_node=per_node, plan_kwargs=dict(
                                         engine_kwargs, sequence_tokens=workload.input_tokens + workload.output_tokens),
                                     price_per_hour=price_per_hour, currency=currency, pricing_path=pricing)
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
        if any(v not in (None, "auto") for v in layout_flags.values()):
            p = plan(spec, gpu_spec, gpus_per_node=per_node, rdma=use_rdma,
                     sequence_tokens=workload.input_tokens + workload.output_tokens,
                     tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                     data_parallel_size=data_parallel_size, parallelism=parallelism or "auto", **engine_kwargs)
        else:
            p = rank_layouts(spec, gpu_spec, workload, gpus_per_node=per_node, rdma=use_rdma,
                             instance_type=instance_type, **engine_kwargs)
    except PlanError as exc:
        _fail(str(exc))
    if p.fits:  # EPLB's redundant experts leave the KV cache, as the stack plans them (stacks/plan/serving.py)
        p = wide_ep.with_redundant_experts(spec, p)
    _print(p, spec, workload, instance_type, price_per_hour=price_per_hour, currency=currency, pricing=pricing,
           as_json=as_json)


def _print(p: Plan, spec, workload: Workload, instance_type: str | None, *, price_per_hour, currency, pricing,
           as_json: bool, extra: dict[str, Any] | None = None) -> None:
    """The plan, its speed and cost (table or --json); exit 1 when it does not fit."""
    sized, note, w = None, None, workload
    if p.fits:
        w, note = within_context(workload, p.max_model_len)
        if p.gpu not in load_hardware().gpus:
            note = f"no performance figures for {p.gpu} in capacity/hardware.yaml: speed and cost not estimated"
        else:
            try:
                sized = size_perf.size_plan(spec, p, w, instance_type=instance_type, price_per_hour=price_per_hour,
                                            currency=currency, pricing_path=pricing)
            except (PlanError, PerfDataError) as exc:
                _fail(str(exc))
    if as_json:
        doc = plan_document(p, instance_type)
        if note:
            doc["notes"] = [*doc["notes"], note]
        if sized:
            doc.update(size_perf.documents(sized, w))
        doc.update(extra or {})
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        console = Console()
        if extra and "stack" in extra:
            st = extra["stack"]
            console.print(f"stack {st['name']}: pool {st['gpu_pool']} ({st['instance_type']}), planned as "
                          "`dsvolc preview` plans it", highlight=False)
        render_table(p, console, instance_type)
        if note:
            console.print(f"[yellow]![/yellow] {note}", highlight=False)
        if sized:
            size_perf.render(sized, w, console)
    if not p.fits:
        raise typer.Exit(code=1)


def _size_stack(stack: str, flags: dict[str, Any], *, target_rps, price_per_hour, currency, pricing,
                as_json: bool) -> None:
    try:
        s = size_stack.size_stack(stack, flags=flags, target_rps=target_rps)
    except size_stack.StackInputError as exc:
        _fail(str(exc))
    except size_stack.StackRefused as exc:
        err = Console(stderr=True, soft_wrap=True)
        for line in exc.problems:
            err.print(f"[red]✗[/red] {line}", highlight=False)
        raise typer.Exit(code=1) from None
    except PlanError as exc:
        _fail(str(exc))
    _print(s.engine, s.model, s.workload, s.instance_type, price_per_hour=price_per_hour, currency=currency,
           pricing=pricing, as_json=as_json, extra={"stack": size_stack.stack_document(s)})


__all__ = ["size", "render_table", "plan_document", "EPILOG"]
