"""`dsvolc preview STACK`: the offline preview of a stack.

Runs the real program under the mock engine (dsvolc.engine), then the real policy pack
through pulumi_policy's analyzer servicer (dsvolc.policy_runner), and reports both.
"""

from __future__ import annotations

import contextlib
import gc
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from capacity.docs import short_layout
from dsvolc import engine
from stacks import loader
from stacks.plan import StackPlan


@dataclass
class PreviewResult:
    stack: str
    environment_class: str
    policy_config: str  # the policy pack config the verdict used, relative to the repository root
    recording: engine.Recording
    plans: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    # with the stack as deployed: its first `pulumi up` (deploy phase 1), judged on its own
    first_apply: "PreviewResult | None" = None

    @property
    def all_mandatory(self) -> list[dict[str, Any]]:
        """Mandatory violations of this preview and of the first apply beside it."""
        return self.mandatory + (self.first_apply.mandatory if self.first_apply else [])

    @property
    def deploy_phase(self) -> dict[str, Any]:
        """The deploy phase the program chose (infra/identity.py), from its stack output."""
        return self.recording.outputs.get("deploy_phase") or {}

    @property
    def mandatory(self) -> list[dict[str, Any]]:
        return [v for v in self.violations if v["enforcement_level"] == "mandatory"]

    def as_json(self) -> dict[str, Any]:
        from dsvolc import report

        doc = {
            "stack": self.stack,
            "environment_class": self.environment_class,
            "policy_config": self.policy_config,
            "mode": self.recording.mode,
            "deploy_phase": self.deploy_phase,
            "plans": self.plans,
            "resources": [r.as_json() for r in self.recording.resources],
            "violations": self.violations,
            # the same facts as the printed preview: verdict, and violations grouped by policy and fix
            "verdict": report.verdict(self),
            "findings": report.findings(self),
        }
        if self.first_apply is not None:
            f = self.first_apply
            doc["first_apply"] = {"mode": f.recording.mode, "deploy_phase": f.deploy_phase,
                                  "resources": [r.as_json() for r in f.recording.resources],
                                  "violations": f.violations, "verdict": report.verdict(f),
                                  "findings": report.findings(f)}
        return doc


def engine_plans(plan: StackPlan) -> list[dict[str, Any]]:
    """The engine plan of each serving workload, as a user reads it: where it runs, how it is
    split, how much context and KV cache it gets. A disaggregated stack has one per side, with
    the group count the performance model asks at the design load."""
    sv = plan.settings.serving
    d = plan.disaggregation
    if d is None:
        return [_engine_entry(plan, f"{sv.namespace}/{sv.name}", sv.gpu_pool, plan.serving.engine,
                              plan.serving.min_replicas, plan.serving.max_replicas)]
    return [{**_engine_entry(plan, f"{sv.namespace}/{sv.name}-{ph.role}", ph.pool, ph.engine, ph.min_replicas,
                             ph.max_replicas),
             "kv_role": ph.kv_role, "modelled_replicas": ph.modelled_replicas,
             "design_requests_per_second": d.requests_per_second}
            for ph in d.phases()]


def _engine_entry(plan: StackPlan, workload: str, pool_name: str, p, low: int, high: int) -> dict[str, Any]:
    pool = plan.settings.cluster.gpu_pools[pool_name]
    return {
        "workload": workload,
        "model": p.model,
        "gpu_pool": pool_name,
        "instance_type": pool.instance_type,
        "gpu": p.gpu,
        "gpus_per_node": p.gpus_per_node,
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "data_parallel_size": p.data_parallel_size,
        "expert_parallel": p.expert_parallel,
        "speculative_tokens": p.speculative_tokens,
        "layout": short_layout(p),
        "gpus_per_replica": p.total_gpus,
        "nodes_per_replica": p.nodes,
        "multi_node": p.nodes > 1,
        "replicas": {"min": low, "max": high},
        "max_model_len": p.max_model_len,
        "kv_cache_tokens": p.kv_cache_tokens,  # per engine
        "replica_kv_cache_tokens": p.replica_kv_cache_tokens,  # over the replica's engines
        "max_num_seqs": p.max_num_seqs,
        "concurrency_at_max_model_len": (p.data_parallel_size * (p.kv_cache_tokens // p.max_model_len)
                                         if p.max_model_len else 0),
        "gpu_memory_utilization": p.gpu_memory_utilization,
        "quantization": p.quantization,
        "kv_cache_dtype": p.kv_cache_dtype,
    }


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off for the duration, as it was after.

    A preview allocates a few hundred thousand long-lived objects (the SDK's modules and
    types, the program's resources and their outputs); the collector, triggered by
    allocations, walked them again and again, for about a third of the command's CPU time.
    What a preview leaves as cyclic garbage is a few MiB, collected once it is back on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_preview(stack: str, *, policies: bool = True, transforms=None, raw: dict | None = None,
                mode: engine.Mode = "new") -> PreviewResult:
    """Validate the stack's settings, run the program, run the policies. `mode`: "new"
    previews a new stack (computed outputs unknown), "existing" one whose resources exist.

    Raises loader.SettingsError for bad settings and policy_runner.PolicyConfigError for a
    bad policy config, both before anything runs."""
    with collector_paused():
        return _run_preview(stack, policies=policies, transforms=transforms, raw=raw, mode=mode)


def _run_preview(stack: str, *, policies: bool, transforms, raw: dict | None, mode: engine.Mode) -> PreviewResult:
    from dsvolc import policy_runner

    name = loader.stack_name(stack)
    written = None
    if raw is None:
        raw, written = loader.read_stack(stack)
    # fail fast, with every problem listed
    plan = loader.parse_plan(raw, str(loader.stack_file(stack)), stack=name, written=written)
    settings = plan.settings
    config_file, config = policy_runner.stack_policy_config(plan) if policies else (None, None)
    recording = engine.run(name, raw, transforms=transforms, mode=mode)
    result = PreviewResult(stack=name, environment_class=settings.environment_class,
                           policy_config=plan.policy_config, recording=recording,
                           plans=engine_plans(plan))
    if policies:
        result.violations = policy_runner.analyze(recording, policy_config=config)
    return result


def run_both(stack: str) -> PreviewResult:
    """The stack as deployed (deploy phase 2: every resource, "existing" mode) with its first
    `pulumi up` (phase 1, "new" mode) beside it: an offline preview cannot know which of the
    two a real `pulumi preview` would meet, so it judges both."""
    with collector_paused():
        complete = run_preview(stack, mode="existing")
        complete.first_apply = run_preview(stack, mode="new")
    return complete


def _plan_line(p: dict[str, Any]) -> str:
    layout = p["layout"] + (f" + MTP {p['speculative_tokens']}" if p["speculative_tokens"] else "")
    nodes = p["nodes_per_replica"]
    over = "expert all-to-all over RDMA" if p["expert_parallel"] else "pipeline over the network"
    spread = (f"[bold yellow]{nodes} nodes per replica[/bold yellow] (multi-node: {over})"
              if nodes > 1 else "1 node per replica")
    r = p["replicas"]
    replicas = f"{r['min']} replica(s)" if r["min"] == r["max"] else f"{r['min']}-{r['max']} replicas"
    return (f"{p['model']} on {p['gpu']} x {p['gpus_per_node']} ({p['instance_type']}, pool {p['gpu_pool']}): "
            f"{layout}, {spread}, {replicas}; context {p['max_model_len']:,}, KV cache "
            f"{p['replica_kv_cache_tokens']:,} tokens, {p['concurrency_at_max_model_len']} full-context sequences, "
            f"max_num_seqs {p['max_num_seqs']}"
            + (f"; {p['kv_role']}, the performance model's {p['modelled_replicas']} group(s) at "
               f"{p['design_requests_per_second']:g} req/s" if "kv_role" in p else ""))


def phase_line(result: PreviewResult) -> str:
    p = result.deploy_phase
    if not p:
        return "deploy phase: unknown"
    return f"deploy {p['description']}; next: {p['next']}"


def _phase(result: PreviewResult, verbose: bool) -> str:
    p = result.deploy_phase
    text = f"deploy {p['description']}" if p else "deploy phase: unknown"
    if verbose and p:
        text += f"; next: {p['next']}"
    return f"{text}; {len(result.recording.resources)} resources"


def render(result: PreviewResult, console: Console, *, verbose: bool = False) -> None:
    """The summary first (stack, deploy phase, engine plan, verdict), then one entry per
    policy and fix (dsvolc.report). Verbose: the resource tree, the count by type, each
    resource's finding and URN, and what the next `pulumi up` does."""
    from dsvolc import report

    console.print(f"[bold]stack {result.stack}[/bold]: class {result.environment_class}, "
                  f"policy config {result.policy_config}", highlight=False)
    f = result.first_apply
    if f is not None:  # both phases: the stack as deployed, and its first `pulumi up`
        console.print(f"as deployed: {_phase(result, verbose)}", highlight=False, markup=False)
        console.print(f"first `pulumi up`: {_phase(f, verbose)}; {verdict_line(f)[len('policy verdict: '):]}",
                      highlight=False, markup=False)
    else:
        which = "existing stack (computed outputs known)" if result.recording.mode == "existing" else "new stack"
        console.print(f"{which}: {_phase(result, verbose)}", highlight=False, markup=False)
    for p in result.plans:
        console.print(f"engine plan {p['workload']}: {_plan_line(p)}", highlight=False)
    passes = "passes" if not result.all_mandatory else "[bold red]refused[/bold red] (exit 1)"
    console.print(f"{verdict_line(result)}: {passes}", highlight=False)

    if verbose:
        _render_tree(result, console)
    if not result.violations and not (f and f.violations):
        return
    console.print()
    counts = verdict_line(result)[len("policy verdict: "):]
    if f is None:
        console.print(f"[bold]policy violations[/bold] ({counts})", highlight=False)
        report.render_findings(report.findings(result), console, verbose=verbose)
        return
    # both phases as one list: a fix both need is printed once, marked where it applies
    console.print(f"[bold]policy violations[/bold] (as deployed: {counts}; first `pulumi up`: "
                  f"{verdict_line(f)[len('policy verdict: '):]})", highlight=False)
    report.render_findings(report.merged(report.findings(result), report.findings(f)), console, verbose=verbose)


def _render_tree(result: PreviewResult, console: Console) -> None:
    resources = result.recording.resources
    by_urn = {r.urn: r for r in resources}
    children: dict[str | None, list[engine.Recorded]] = {}
    for r in resources:
        parent = r.parent if r.parent in by_urn else None
        children.setdefault(parent, []).append(r)
    tree = Tree(f"[bold]stack {result.stack}[/bold] ({len(resources)} resources)")

    def add(node: Tree, parent: str | None) -> None:
        for r in sorted(children.get(parent, []), key=lambda x: (x.type, x.name)):
            style = "bold cyan" if not r.custom else ""
            label = f"[{style}]{r.name}[/{style}] [dim]{r.type}[/dim]" if style else f"{r.name} [dim]{r.type}[/dim]"
            add(node.add(label), r.urn)

    add(tree, None)
    console.print(tree)
    counts = Counter(r.type for r in resources)
    table = Table(title="resources by type")
    table.add_column("type", overflow="fold")
    table.add_column("count", justify="right")
    for t, n in sorted(counts.items()):
        table.add_row(t, str(n))
    console.print(table)


def verdict_line(result: PreviewResult) -> str:
    mandatory = len(result.mandatory)
    advisory = len(result.violations) - mandatory
    return f"policy verdict: {mandatory} mandatory, {advisory} advisory violation(s)"


def write_json(result: PreviewResult, path: Path, against: dict[str, Any] | None = None) -> None:
    doc = result.as_json()
    if against is not None:
        doc["against"] = against
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
