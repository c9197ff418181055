"""Workload pods built to run and stay up: pinned images from the stack's registry, sized
containers, probes that survive a model load, shared memory for tensor parallelism, a drain
that covers the edge timeout, replicas and a disruption budget. Hardening, isolation and
labels are in policies/workload.py."""

from __future__ import annotations

import re

from stacks.regions import cr_registry_host

from .common import (
    APIG_ROUTE,
    CR_NAMESPACE,
    CR_REGISTRY,
    CR_REPOSITORY,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    cfg,
    container_argv,
    containers,
    dig,
    engine_argv,
    engine_flag,
    gpu_requests,
    is_triton,
    is_vllm,
    items,
    iter_workload_containers,
    k8s_kind,
    mapping,
    name_of,
    number,
    of_kind,
    of_type,
    pod_templates,
    resource_policy,
    selector_matches,
    serving_workloads,
    stack_policy,
    workload_containers,
)

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def _serving_container(c) -> bool:
    """A vLLM container that answers HTTP (group workers run `--headless`)."""
    return is_vllm(c) and "--headless" not in container_argv(c)


def _image_tag(image: str) -> str | None:
    if "@" in image:
        return None
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


# --------------------------------------------------------------------------- images


def _image_pinned(args, report):
    require_digest = bool(cfg(args, "requireDigest", False))
    for kind, where, _, c in workload_containers(args):
        image = str(dig(c, "image", default=""))
        tag = _image_tag(image)
        if tag in ("", "latest"):
            report(f"{where} runs {image!r}, which floats ({'no tag' if tag == '' else 'latest'}): nodes may run "
                   "different code. Fix: pin serving.image.tag to a version (or serving.image.digest).")
        elif require_digest and is_vllm(c) and not DIGEST.search(image):
            report(f"{where} runs {image!r} by tag; this stack requires digests for the serving image. Fix: set "
                   "serving.image.digest (sha256:...) in the stack settings.")


def _stack_repository(resources) -> str | None:
    regs, nss, repos = (of_type(resources, t) for t in (CR_REGISTRY, CR_NAMESPACE, CR_REPOSITORY))
    if not (regs and nss and repos):
        return None
    reg = regs[0]
    region = dig(reg.provider.props, "region") if reg.provider is not None else None
    if not region:
        return None
    host = cr_registry_host(str(dig(reg.props, "name")), str(region))
    repo = repos[0]
    # the repository's own namespace (the registry also holds the mirror namespace)
    ns = dig(repo.props, "namespace") or dig(nss[0].props, "name")
    return f"{host}/{ns}/{dig(repo.props, 'name')}"


def _image_registry(args, report):
    repo = _stack_repository(args.resources)
    for w in serving_workloads(args.resources):
        kind = k8s_kind(w.resource_type)
        for _, _, c in iter_workload_containers(kind, w.props):
            image = str(dig(c, "image", default=""))
            # the repository alone (no tag) is image-pinned's finding, not this one's
            if repo is None or not (image == repo or image.startswith((repo + ":", repo + "@"))):
                report(f"{kind} {name_of(w.props)} container {dig(c, 'name')!r} runs {image!r}, not an image of "
                       f"the stack's registry ({repo or 'no CR repository in the stack'}). Fix: push the serving "
                       "image (runtime/Dockerfile) to the stack's CR repository and leave serving.image.repository "
                       "unset.", w.urn)


# --------------------------------------------------------------------------- resources


def _resources(args, report):
    exempt = mapping(cfg(args, "cpuLimitExempt", {}))
    for kind, where, t, c in workload_containers(args):
        req = mapping(dig(c, "resources", "requests", default={}))
        lim = mapping(dig(c, "resources", "limits", default={}))
        missing = [f"requests.{k}" for k in ("cpu", "memory") if k not in req]
        missing += ["limits.memory"] if "memory" not in lim else []
        serving = is_vllm(c)
        if "cpu" not in lim and dig(args.props, "metadata", "name") not in exempt:
            missing.append("limits.cpu")
        if missing:
            report(f"{where} has no {', '.join(missing)}: the scheduler cannot place it safely, a leak takes "
                   "the node down and a busy loop starves its neighbours. Fix: set CPU and memory requests and "
                   "limits on every container (init containers included), or exempt the workload by name with a "
                   "reason (config cpuLimitExempt).")
        if serving:
            argv = engine_argv(t, c)
            tp = number(engine_flag(argv, "--tensor-parallel-size"), 1.0)
            # Data-parallel engines on this node (each a TP group): the local share when the
            # replica spans nodes, else all of them.
            dp = number(engine_flag(argv, "--data-parallel-size-local"),
                        number(engine_flag(argv, "--data-parallel-size"), 1.0))
            ranks = tp * dp
            g_req, g_lim = gpu_requests(c)
            slices = sorted(k for k in set(g_req) | set(g_lim) if k.startswith(MIG_RESOURCE_PREFIX))
            if slices:
                # A CUDA process sees one MIG device: one slice, one rank, no whole GPUs.
                k = slices[0]
                if len(set(g_req) | set(g_lim)) != 1 or g_req.get(k) != 1 or g_lim.get(k) != 1 or ranks != 1:
                    report(f"{where} asks for {g_req} / {g_lim} (requests/limits) with tensor parallel {tp:g}; "
                           f"a MIG slice holds one engine process. Fix: request and limit exactly 1 {k}, "
                           "nothing else of the GPU resources, with tensor parallel 1.")
            elif g_lim.get(GPU_RESOURCE) is None or g_lim.get(GPU_RESOURCE) != g_req.get(GPU_RESOURCE) \
                    or g_lim.get(GPU_RESOURCE) != ranks:
                what = f"tensor parallel {tp:g}" + (f" x {dp:g} data-parallel engines" if dp != 1 else "")
                report(f"{where} asks for {req.get(GPU_RESOURCE)} / {lim.get(GPU_RESOURCE)} {GPU_RESOURCE} "
                       f"(requests/limits) but runs {what}. Fix: request and limit exactly "
                       f"{ranks:g} GPU(s), one per rank (or one nvidia.com/mig-<profile> slice).")


# --------------------------------------------------------------------------- probes


def _probes(args, report):
    for kind, where, _, c in workload_containers(args, init=False, only=_serving_container):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = dig(c, probe)
            if p is None:
                report(f"{where} has no {probe}. Fix: probe GET /health on port http with startup, readiness "
                       "and liveness probes (workloads/engine/manifests.py probes).")
                continue
            missing = [k for k in ("timeoutSeconds", "periodSeconds", "failureThreshold") if dig(p, k) is None]
            if missing:
                report(f"{where} {probe} leaves {', '.join(missing)} to the kubelet default (1 s timeout): a busy "
                       "engine fails it and is restarted. Fix: set them explicitly.")


def _startup_budget(args, report):
    floor = number(cfg(args, "minStartupSeconds", 1200))
    for kind, where, _, c in workload_containers(args, init=False, only=_serving_container):
        p = dig(c, "startupProbe")
        if p is None:
            continue  # serving-probes reports the missing probe
        budget = number(dig(p, "initialDelaySeconds"), 0.0) + number(dig(p, "periodSeconds"), 10.0) * number(
            dig(p, "failureThreshold"), 3.0)
        if budget < floor:
            report(f"{where} gets {budget:g} s to load the model "
                   f"before the kubelet restarts it; loading takes up to {floor:g} s (kserve#5062). Fix: raise "
                   "serving.startup_timeout_seconds (startupProbe failureThreshold x periodSeconds).")


def _shm(args, report):
    for kind, where, t, c in workload_containers(args, init=False, only=is_vllm):
        tp = number(engine_flag(engine_argv(t, c), "--tensor-parallel-size"), 1.0)
        pp = number(engine_flag(engine_argv(t, c), "--pipeline-parallel-size"), 1.0)
        pp *= number(engine_flag(engine_argv(t, c), "--data-parallel-size"), 1.0)
        if tp * pp <= 1:
            continue
        mem_volumes = {dig(v, "name") for v in items(dig(t, "spec", "volumes"))
                       if dig(v, "emptyDir", "medium") == "Memory"}
        mounted = any(dig(m, "mountPath") == "/dev/shm" and dig(m, "name") in mem_volumes
                      for m in items(dig(c, "volumeMounts")))
        if not mounted:
            report(f"{kind} {name_of(args.props)} runs {tp:g} x {pp:g} ranks with the container's 64 MiB /dev/shm; "
                   "NCCL and vLLM's worker IPC fail (vllm#1710). Fix: mount an emptyDir with medium Memory at "
                   "/dev/shm.")


# --------------------------------------------------------------------------- RDMA privileges

# The device plugin's resource for RDMA NICs on VKE (workloads/engine/rdma.py)
RDMA_RESOURCE = "vke.volcengine.com/rdma"
# The one capability an engine may add, and only with RDMA NICs: registering memory with a
# NIC pins it (ibv_reg_mr), which RLIMIT_MEMLOCK stops without IPC_LOCK. llm-d's wide-EP
# pods also add SYS_RAWIO and run as root; llm-d#2442 ran RoCE pods without SYS_RAWIO, and
# this project's engines run as uid 1000 (workloads/engine/deepep.py).
RDMA_CAPABILITY = "IPC_LOCK"


def _rdma_nics(c) -> float:
    req = mapping(dig(c, "resources", "requests", default={}))
    lim = mapping(dig(c, "resources", "limits", default={}))
    return max(number(req.get(RDMA_RESOURCE), 0.0) or 0.0, number(lim.get(RDMA_RESOURCE), 0.0) or 0.0)


def _rdma_privileges(args, report):
    for kind, where, t, c in workload_containers(args, init=False, only=is_vllm):
        added = {str(x) for x in items(dig(c, "securityContext", "capabilities", "add"))}
        nics = _rdma_nics(c)
        extra = sorted(added - {RDMA_CAPABILITY})
        if extra:
            report(f"{where} adds {extra}: a model server adds no capability but {RDMA_CAPABILITY}, and that only "
                   "with RDMA NICs (DeepEP's NVSHMEM and NCCL over RoCE need nothing else). Fix: remove them from "
                   "securityContext.capabilities.add.")
        if RDMA_CAPABILITY in added and not nics:
            report(f"{where} adds {RDMA_CAPABILITY} without RDMA NICs ({RDMA_RESOURCE}): nothing in it pins memory "
                   "for a NIC. Fix: add IPC_LOCK only to engines of multi-node replicas on RDMA pools "
                   "(workloads/engine/rdma.py).")
        backend = engine_flag(container_argv(c), "--all2all-backend") or ""
        if backend.startswith("deepep") and not (nics and RDMA_CAPABILITY in added):
            report(f"{where} runs --all2all-backend {backend} without RDMA NICs and {RDMA_CAPABILITY}: DeepEP's "
                   "NVSHMEM transport registers GPU memory with the NICs and fails at start. Fix: run DeepEP only "
                   "on multi-node replicas of an RDMA pool (capacity/wide_ep.py decides it from the plan).")
        # (a privileged container is no-privileged-pods' finding)
        if number(dig(c, "securityContext", "runAsUser"), None) == 0 or \
                dig(c, "securityContext", "runAsNonRoot") is False:
            report(f"{where} runs as root (llm-d's wide-EP pods do); DeepEP and RDMA need no root. Fix: keep the "
                   "engine's non-root securityContext (workloads/engine/manifests.py container_security).")


# --------------------------------------------------------------------------- availability


def _seconds(value) -> float | None:
    """A Gateway API / Envoy duration ("600s", "10m") or a plain number of seconds."""
    if value is None:
        return None
    text = str(value).strip()
    scale = {"s": 1, "m": 60, "h": 3600}
    if text and text[-1] in scale:
        n = number(text[:-1])
        return n * scale[text[-1]] if n is not None else None
    return number(text)


def _edge_timeout(resources) -> float | None:
    """The longest request the edge lets run: the APIG routes' timeout and the in-cluster
    gateway's request timeout."""
    found = [_seconds(dig(r.props, "advancedSetting", "timeoutSetting", "timeout"))
             for r in of_type(resources, APIG_ROUTE)]
    found += [_seconds(dig(r.props, "spec", "timeout", "http", "requestTimeout"))
              for r in of_kind(resources, "BackendTrafficPolicy")]
    found = [f for f in found if f]
    return max(found) if found else None


def _pre_stop_seconds(c) -> float:
    """The longest a container's preStop may take: a `sleep` hook's seconds, or the
    `--max-seconds` bound of the worker's `runtime.health drain` exec hook."""
    slept = number(dig(c, "lifecycle", "preStop", "sleep", "seconds"), None)
    if slept is not None:
        return slept
    cmd = [str(x) for x in (dig(c, "lifecycle", "preStop", "exec", "command", default=[]) or [])]
    if "runtime.health" in cmd and "drain" in cmd:
        bound = engine_flag(cmd, "--max-seconds")
        return number(bound, 0.0) if bound is not None else float("inf")  # unbounded: never fits a grace
    return 0.0


def _drain(args, report):
    edge = _edge_timeout(args.resources)
    for w in serving_workloads(args.resources):
        kind = k8s_kind(w.resource_type)
        for role, t in pod_templates(kind, w.props):
            grace = number(dig(t, "spec", "terminationGracePeriodSeconds"), 30.0)
            for c in containers(t, init=False):
                if not is_vllm(c):
                    continue
                where = f"{kind} {name_of(w.props)} ({role})"
                pre = _pre_stop_seconds(c)
                if not _serving_container(c):
                    if grace <= pre:
                        report(f"{where}: the worker's preStop ({pre:g} s) uses the whole termination grace "
                               f"({grace:g} s). Fix: raise serving.termination_grace_seconds.", w.urn)
                    continue
                if is_triton(c):
                    # Triton's OpenAI frontend stops its server on SIGTERM with tritonserver's own
                    # exit timeout; it takes no flag for it (docs/limits.md)
                    continue
                shutdown = number(engine_flag(container_argv(c), "--shutdown-timeout"), 0.0)
                if not shutdown:
                    report(f"{where}: vLLM has no --shutdown-timeout (0 aborts every request in flight): every "
                           "scale-down and rollout cuts the generations running. Fix: render --shutdown-timeout = "
                           "serving.inflight_drain_seconds (workloads/engine/engine_args.py).", w.urn)
                elif edge and shutdown < edge:
                    report(f"{where}: vLLM stops {shutdown:g} s after SIGTERM (--shutdown-timeout; 0 aborts every "
                           f"request in flight) while the edge lets a request run {edge:g} s: every scale-down and "
                           "rollout cuts long generations. Fix: raise serving.inflight_drain_seconds to the edge's "
                           "timeout.", w.urn)
                if grace < pre + shutdown:
                    report(f"{where}: terminationGracePeriodSeconds {grace:g} is shorter than preStop {pre:g} s + "
                           f"vLLM's drain {shutdown:g} s: the kubelet kills the drain. Fix: leave "
                           "serving.termination_grace_seconds unset (derived) or raise it.", w.urn)


def _template_labels(kind, props) -> list[dict]:
    return [mapping(dig(t, "metadata", "labels", default={})) for _, t in pod_templates(kind, props)]


def _pdb(args, report):
    pdbs = of_kind(args.resources, "PodDisruptionBudget")
    for w in serving_workloads(args.resources):
        kind = k8s_kind(w.resource_type)
        ns = dig(w.props, "metadata", "namespace")
        labels = _template_labels(kind, w.props)
        covered = [p for p in pdbs if dig(p.props, "metadata", "namespace") == ns
                   and any(selector_matches(dig(p.props, "spec", "selector"), lb) for lb in labels)]
        if not covered:
            report(f"{kind} {name_of(w.props)} has no PodDisruptionBudget: a node drain can evict every replica "
                   "at once. Fix: add a PodDisruptionBudget (maxUnavailable: 1) selecting its pods.", w.urn)
        elif kind == "LeaderWorkerSet":
            # Evicting any pod of a group takes the whole group down: a budget over the
            # leaders only lets drains take the workers of every group at once.
            bare = [lb for lb in labels if not any(selector_matches(dig(p.props, "spec", "selector"), lb)
                                                   for p in covered)]
            if bare:
                report(f"LeaderWorkerSet {name_of(w.props)}: its PodDisruptionBudget covers some of each group's "
                       "pods but not the others (workers): a drain may evict a worker of every group at once, "
                       "and each eviction takes its whole group down. Fix: select every pod of the "
                       "LeaderWorkerSet (leaders and workers) with maxUnavailable: 1.", w.urn)
        for p in covered:
            if number(dig(p.props, "spec", "maxUnavailable"), None) == 0 or (
                    dig(p.props, "spec", "minAvailable") is not None
                    and str(dig(p.props, "spec", "minAvailable")) == "100%"):
                report(f"PodDisruptionBudget {name_of(p.props)} allows no disruption, which blocks node drains "
                       "and upgrades forever. Fix: use maxUnavailable: 1.", p.urn)


def _replica_floor(resources, w) -> tuple[float, str]:
    """The fewest replicas the serving workload runs with: a ScaledObject's
    minReplicaCount when one scales it (or the Rollout owning its pods), else spec.replicas."""
    kind = k8s_kind(w.resource_type)
    name = dig(w.props, "metadata", "name")
    ns = dig(w.props, "metadata", "namespace")
    owners = [(kind, name, w.props)]
    for r in of_kind(resources, "Rollout"):
        ref = dig(r.props, "spec", "workloadRef", default={})
        if dig(ref, "name") == name and dig(ref, "kind", default="Deployment") == kind \
                and dig(r.props, "metadata", "namespace") == ns:
            owners.append(("Rollout", dig(r.props, "metadata", "name"), r.props))
    for so in of_kind(resources, "ScaledObject"):
        ref = dig(so.props, "spec", "scaleTargetRef", default={})
        if dig(so.props, "metadata", "namespace") != ns:
            continue
        for okind, oname, _ in owners:
            if dig(ref, "name") == oname and dig(ref, "kind", default="Deployment") == okind:
                return number(dig(so.props, "spec", "minReplicaCount"), 0.0), f"ScaledObject {name_of(so.props)}"
    okind, oname, oprops = owners[-1]
    return number(dig(oprops, "spec", "replicas"), 1.0), f"{okind} {ns}/{oname}"


def _min_replicas(args, report):
    floor = number(cfg(args, "minReplicas", 2))
    for w in serving_workloads(args.resources):
        n, source = _replica_floor(args.resources, w)
        if n < floor:
            report(f"{k8s_kind(w.resource_type)} {name_of(w.props)} may run {n:g} replica(s) ({source}); this stack "
                   f"requires at least {floor:g} so one node failure or rollout does not take the API down. Fix: "
                   f"set serving.replicas (and autoscaling.min_replicas) to {floor:g} or more.", w.urn)


POLICIES = [
    resource_policy(
        "image-pinned",
        "Container images are pinned: never 'latest' or untagged (a digest where the stack requires it).",
        _image_pinned,
        fix="Pin serving.image.tag to a version or set serving.image.digest.",
        config={"requireDigest": {"type": "boolean", "default": False,
                                  "description": "require the serving image by digest"}},
        tags=["workloads"],
    ),
    stack_policy(
        "image-from-stack-registry",
        "Serving images come from the stack's own CR repository.",
        _image_registry,
        fix="Push the image to the stack's CR repository; leave serving.image.repository unset.",
        tags=["workloads"],
    ),
    resource_policy(
        "container-resources",
        "Every container (init containers included) declares CPU/memory requests and limits; vLLM containers "
        "request exactly their GPUs.",
        _resources,
        fix="Set requests and limits for cpu, memory and nvidia.com/gpu (or one nvidia.com/mig-<profile>).",
        config={"cpuLimitExempt": {"type": "object", "additionalProperties": {"type": "string"}, "default": {},
                                   "description": "workload name -> why its containers run without a CPU limit"}},
        tags=["workloads"],
    ),
    resource_policy(
        "serving-probes",
        "The model server has startup, readiness and liveness probes with explicit timeouts.",
        _probes,
        fix="Add the three probes on /health with timeoutSeconds, periodSeconds and failureThreshold.",
        tags=["workloads"],
    ),
    resource_policy(
        "serving-startup-budget",
        "The startup probe gives the model long enough to load.",
        _startup_budget,
        fix="Raise serving.startup_timeout_seconds.",
        config={"minStartupSeconds": {"type": "number", "default": 1200, "minimum": 0,
                                      "description": "least time a pod gets to load the model"}},
        tags=["workloads"],
    ),
    resource_policy(
        "serving-shm",
        "Tensor/pipeline-parallel model servers mount a memory-backed /dev/shm.",
        _shm,
        fix="Mount an emptyDir (medium: Memory) at /dev/shm.",
        tags=["workloads"],
    ),
    resource_policy(
        "serving-rdma-privileges",
        "A model server adds no capability but IPC_LOCK, and that only with RDMA NICs; DeepEP's all-to-all runs only "
        "with both; never as root.",
        _rdma_privileges,
        fix="Add IPC_LOCK only to engines that request vke.volcengine.com/rdma; run DeepEP only there.",
        tags=["workloads", "security"],
    ),
    stack_policy(
        "serving-pdb",
        "The model server has a PodDisruptionBudget that allows one disruption at a time.",
        _pdb,
        fix="Add a PodDisruptionBudget with maxUnavailable: 1.",
        tags=["workloads"],
    ),
    stack_policy(
        "serving-drain",
        "A stopping model server drains its requests in flight: vLLM has a --shutdown-timeout, at least the edge's "
        "total timeout where the edge has one, and the termination grace covers preStop plus that drain.",
        _drain,
        fix="Render --shutdown-timeout from serving.inflight_drain_seconds; leave the termination grace derived.",
        tags=["workloads"],
    ),
    stack_policy(
        "serving-min-replicas",
        "The model server keeps enough replicas (at least two in prod).",
        _min_replicas,
        fix="Raise serving.replicas / autoscaling.min_replicas.",
        config={"minReplicas": {"type": "integer", "default": 2, "minimum": 1,
                                "description": "fewest serving replicas this stack accepts"}},
        tags=["workloads"],
    ),
]
