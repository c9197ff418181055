"""Capacity: the engine arguments the model server actually runs with fit its GPUs.

Settings are planned once (stacks/plan/), but what reaches the cluster is the
container's command line; an extra arg, a hand edit or a transform can change it after
planning. This stack policy reads the vLLM flags from the Deployment/LeaderWorkerSet, the
GPU model and count from the node pool the pods are pinned to, and asks the same planner
(`capacity.planner.plan`) whether that configuration fits.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from .common import (
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    MIG_PROFILE_LABEL,
    MIG_RESOURCE_PREFIX,
    gpu_requests,
    POOL_LABEL,
    VKE_NODE_POOL,
    dig,
    engine_argv,
    engine_flag,
    is_vllm,
    items,
    k8s_kind,
    label_list,
    name_of,
    number,
    of_type,
    pod_templates,
    stack_policy,
    containers,
)



def _pool_of(template) -> str | None:
    terms = items(dig(template, "spec", "affinity", "nodeAffinity",
                      "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"))
    for term in terms:
        for expr in items(dig(term, "matchExpressions")):
            if dig(expr, "key") == POOL_LABEL and dig(expr, "operator") == "In":
                values = items(dig(expr, "values"))
                if values:
                    return str(values[0])
    return dig(template, "spec", "nodeSelector", POOL_LABEL)


def _model_candidates(argv: list[str], template) -> list[str]:
    out = []
    served = engine_flag(argv, "--served-model-name")
    if served:
        out.append(served)
    model = engine_flag(argv, "--model")
    if model:
        out.append(PurePosixPath(model.rstrip("/")).name)
    for v in items(dig(template, "spec", "volumes")):
        path = dig(v, "hostPath", "path")
        if path:
            out.append(PurePosixPath(str(path).rstrip("/")).name)
    return out


def _int(argv, flag):
    v = number(engine_flag(argv, flag))
    return int(v) if v is not None else None


def _layout(argv) -> dict:
    """The planner's layout arguments from the engine flags (expert/data parallel, MTP)."""
    import json

    tp = _int(argv, "--tensor-parallel-size") or 1
    dp = _int(argv, "--data-parallel-size")
    if "--enable-expert-parallel" in argv:
        parallelism = "dp_ep" if tp == 1 else "tp_ep"
    else:
        parallelism = "tp_pp"
    spec = 0
    raw = engine_flag(argv, "--speculative-config")
    if raw:
        try:
            spec = int(json.loads(raw).get("num_speculative_tokens", 0))
        except (ValueError, AttributeError, TypeError):
            spec = 0
    out = {"parallelism": parallelism, "speculative_tokens": spec}
    if parallelism != "tp_pp":
        out["data_parallel_size"] = dp or 1
    return out


def _pool_rdma(args, pool: str | None) -> bool:
    from stacks.nodepools import instance_type_rdma

    for p in of_type(args.resources, VKE_NODE_POOL):
        if label_list(dig(p.props, "kubernetesConfig", "labels")).get(POOL_LABEL) == pool:
            return any(instance_type_rdma(str(t)) for t in items(dig(p.props, "nodeConfig", "instanceTypeIds")))
    return False


def _fits(args, report):
    from capacity.catalog import get_gpu, get_model
    from capacity.mig import mig_profile, slice_gpu
    from capacity.planner import PlanError, plan

    pools = {}
    for p in of_type(args.resources, VKE_NODE_POOL):
        labels = label_list(dig(p.props, "kubernetesConfig", "labels"))
        if POOL_LABEL in labels:
            pools[labels[POOL_LABEL]] = labels
    for w in args.resources:
        kind = k8s_kind(w.resource_type)
        for role, t in pod_templates(kind, w.props):
            for c in containers(t, init=False):
                if not is_vllm(c):
                    continue
                where = f"{kind} {name_of(w.props)} ({role})"
                argv = engine_argv(t, c)
                pool = _pool_of(t)
                labels = pools.get(pool or "")
                if labels is None or GPU_MODEL_LABEL not in labels:
                    report(f"{where} is not pinned to a GPU pool of this stack ({pool!r}), so its engine settings "
                           "cannot be checked against a GPU. Fix: require node label deepseek-volc/pool In "
                           "[serving.gpu_pool].", w.urn)
                    continue
                model = None
                for candidate in _model_candidates(argv, t):
                    try:
                        model = get_model(candidate)
                        break
                    except (KeyError, OSError, ValueError):
                        continue
                if model is None:
                    report(f"{where}: none of {_model_candidates(argv, t)} is a catalogued model, so capacity "
                           "cannot be checked. Fix: serve a model from workloads/catalog.py (dsvolc size lists them).",
                           w.urn)
                    continue
                gpu_name = labels[GPU_MODEL_LABEL]
                count = number(labels.get(GPU_COUNT_LABEL))
                if count is None or count < 1:
                    continue  # gpu-pool-labelled reports the missing count; guessing one would mislead
                per_node = int(count)
                layout = _layout(argv)
                try:
                    gpu = get_gpu(gpu_name)
                except KeyError as exc:
                    report(f"{where}: {exc}. Fix: label the pool with a catalogued GPU.", w.urn)
                    continue
                # A pool cut into MIG slices: size the engine on one slice, and the pod must
                # ask for a slice of the pool's profile.
                profile = labels.get(MIG_PROFILE_LABEL)
                asked = sorted(k for k in gpu_requests(c)[1] if k.startswith(MIG_RESOURCE_PREFIX))
                if profile or asked:
                    want = f"{MIG_RESOURCE_PREFIX}{profile}" if profile else None
                    if asked != ([want] if want else []):
                        report(f"{where} asks for {asked or 'whole GPUs'} on pool {pool!r}, whose GPUs are "
                               f"{'cut into ' + profile + ' slices' if profile else 'not cut into MIG slices'}. Fix: "
                               f"request {want or 'nvidia.com/gpu'} (serving.gpu_pool and the pool's mig.profile).",
                               w.urn)
                        continue
                    try:
                        gpu = slice_gpu(gpu, mig_profile(gpu_name, profile))
                    except KeyError as exc:
                        report(f"{where}: pool {pool!r}: {exc}. Fix: set a valid mig.profile on the pool.", w.urn)
                        continue
                    per_node = 1
                try:
                    p = plan(
                        model,
                        gpu,
                        gpus_per_node=per_node,
                        context=_int(argv, "--max-model-len"),
                        quantization=engine_flag(argv, "--quantization"),
                        kv_cache_dtype=engine_flag(argv, "--kv-cache-dtype") or "auto",
                        tensor_parallel_size=_int(argv, "--tensor-parallel-size") or 1,
                        pipeline_parallel_size=(_int(argv, "--pipeline-parallel-size") or 1
                                                if layout["parallelism"] == "tp_pp" else None),
                        max_num_seqs=_int(argv, "--max-num-seqs"),
                        gpu_memory_utilization=number(engine_flag(argv, "--gpu-memory-utilization")),
                        max_num_batched_tokens=_int(argv, "--max-num-batched-tokens"),
                        rdma=_pool_rdma(args, pool),
                        **layout,
                    )
                except (PlanError, KeyError) as exc:
                    report(f"{where}: engine arguments are malformed for the planner: {exc}. Fix: correct "
                           "serving.engine in the stack settings.", w.urn)
                    continue
                if not p.fits:
                    report(f"{where}: {model.name} with {' '.join(_engine_summary(argv))} does not fit on "
                           f"{gpu.name} x {per_node}: {'; '.join(p.reasons)}. Fix: run `dsvolc size --model "
                           f"{model.name} --gpu {gpu_name}` and adopt its max_model_len / tensor_parallel_size / "
                           "gpu_memory_utilization in serving.engine.", w.urn)


def _engine_summary(argv: list[str]) -> list[str]:
    out = []
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-model-len",
                 "--max-num-seqs", "--gpu-memory-utilization", "--kv-cache-dtype", "--quantization"):
        v = engine_flag(argv, flag)
        if v is not None:
            out.append(f"{flag} {v}")
    return out


POLICIES = [
    stack_policy(
        "engine-fits-gpu",
        "The serving engine's arguments fit the GPUs of its node pool (per the capacity planner).",
        _fits,
        fix="Adopt the sizes `dsvolc size` recommends in serving.engine.",
        tags=["capacity"],
    ),
]
