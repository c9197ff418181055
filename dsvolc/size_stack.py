"""``dsvolc size --stack STACK``: the stack's engine plan, through the code `dsvolc preview`
plans it with (`stacks.plan.build_plan`, whose `plan_engine` calls the planner), so the two
cannot disagree. Flags given beside ``--stack`` override the stack's settings before it is
planned, and are checked by the settings' own schema.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from capacity.planner import Plan
from capacity.sizing import Workload
from capacity.specs import ModelSpec
from stacks import loader
from stacks.errors import SettingsError
from stacks.plan import StackPlan, build_plan
from stacks.plan.serving import stack_workload

# `dsvolc size` option -> serving.engine field
ENGINE_FLAGS = {
    "context": "max_model_len", "quantization": "quantization", "kv_cache_dtype": "kv_cache_dtype",
    "tensor_parallel_size": "tensor_parallel_size", "pipeline_parallel_size": "pipeline_parallel_size",
    "max_num_seqs": "max_num_seqs", "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_batched_tokens": "max_num_batched_tokens", "parallelism": "parallelism",
    "data_parallel_size": "data_parallel_size", "speculative_tokens": "speculative_tokens",
}
# `dsvolc size` option -> serving.workload field
WORKLOAD_FLAGS = {"input_tokens": "input_tokens", "output_tokens": "output_tokens", "concurrency": "concurrency"}
# options the stack's pool and model decide: refused beside --stack
STACK_OWNED = {"model": "--model", "gpu": "--gpu", "gpus_per_node": "--gpus-per-node", "rdma": "--rdma/--no-rdma"}


class StackInputError(ValueError):
    """Bad input (exit 2): the stack cannot be read, or a flag is not valid for it."""


class StackRefused(ValueError):
    """The stack, with the flags applied, is refused by its plan (exit 1): one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


@dataclass
class StackSizing:
    name: str
    plan: StackPlan
    engine: Plan
    model: ModelSpec
    workload: Workload
    instance_type: str | None
    gpu_pool: str


def size_stack(stack: str, *, flags: dict[str, Any], target_rps: float | None = None) -> StackSizing:
    """Plan ``stack`` (a shipped name or a stack file) with ``flags`` (size's options by their
    Python names; None: not given) written over its settings."""
    owned = [STACK_OWNED[k] for k, v in flags.items() if k in STACK_OWNED and v is not None]
    if owned:
        raise StackInputError(f"{', '.join(owned)}: with --stack the model and the GPU pool come from the stack "
                              "(serving.model, serving.gpu_pool); drop the option, or drop --stack")
    try:
        raw, written = loader.read_stack(stack)
    except SettingsError as exc:
        raise StackInputError(str(exc)) from None
    raw = copy.deepcopy(raw)
    serving = raw.setdefault("serving", {})
    if not isinstance(serving, dict):
        raise StackInputError(f"{loader.stack_file(stack)}: serving: expected a mapping")
    for section, table in (("engine", ENGINE_FLAGS), ("workload", WORKLOAD_FLAGS)):
        given = {field: flags[k] for k, field in table.items() if flags.get(k) is not None}
        if given:
            part = serving.setdefault(section, {}) or {}
            serving[section] = {**part, **given} if isinstance(part, dict) else given
    mon = {}
    if flags.get("ttft_slo") is not None:
        mon["ttft_p99_seconds"] = flags["ttft_slo"]
    if flags.get("itl_slo") is not None:
        mon["min_tokens_per_second"] = 1.0 / flags["itl_slo"]
    if mon:
        raw["monitoring"] = {**(raw.get("monitoring") or {}), **mon}
    source, name = str(loader.stack_file(stack)), loader.stack_name(stack)
    try:
        settings = loader.parse(raw, source, stack=name, written=written)
    except SettingsError as exc:
        raise StackInputError(str(exc)) from None
    try:
        plan = build_plan(settings, source)
    except SettingsError as exc:
        raise StackRefused(exc.problems) from None
    w = stack_workload(settings, plan.slo)
    if target_rps is not None:
        w = Workload(input_tokens=w.input_tokens, output_tokens=w.output_tokens, target_rps=target_rps,
                     ttft_slo_s=w.ttft_slo_s, itl_slo_s=w.itl_slo_s, concurrency=w.concurrency)
    pool = settings.cluster.gpu_pools[settings.serving.gpu_pool]
    return StackSizing(name=name, plan=plan, engine=plan.serving.engine, model=plan.serving.model, workload=w,
                       instance_type=pool.instance_type, gpu_pool=settings.serving.gpu_pool)


def stack_document(s: StackSizing) -> dict[str, Any]:
    """The `stack` object of `size --stack --json`: where the plan came from."""
    return {"name": s.name, "gpu_pool": s.gpu_pool, "instance_type": s.instance_type,
            "replicas": {"min": s.plan.serving.min_replicas, "max": s.plan.serving.max_replicas},
            "slo_class": s.plan.slo.model_class}


__all__ = ["size_stack", "stack_document", "StackSizing", "StackInputError", "StackRefused"]
