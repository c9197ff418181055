"""The serving workload as Kubernetes objects (plain dicts): namespace, service account,
the vLLM Deployment (one node per replica) or LeaderWorkerSet (several nodes per
replica), the stable and canary Services and a PodDisruptionBudget.

What each choice protects against is said next to it; the numbers come from the settings
and the capacity plan, never from constants here.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

from capacity import kv_offload
from capacity.planner import checkpoint_bytes
from stacks.regions import tos_internal_s3_host
from workloads.engine import engine_args
from workloads.engine import deepep
from workloads.engine import groups
from workloads.engine import rdma
from workloads.observability import telemetry
from workloads.engine import triton
from workloads.engine import rollout
from workloads.edge import gateway
from stacks.constants import (
    GPU_RESOURCE,
    HTTP_PORT,
    MODEL_CACHE_DIR,
    MODEL_CACHE_HOST_PATH,
    ROLE_LABEL,
    SERVING_UID,
    STS_AUDIENCE,
)
from workloads.engine.context import ServingContext

GIB = 1024**3
TOKEN_DIR = "/var/run/secrets/volcengine"
CREDENTIALS_DIR = "/run/dsvolc"
STATIC_KEY_SECRET_SUFFIX = "tos-reader"
LEADER_LABEL = ROLE_LABEL


# --------------------------------------------------------------------------- sizing


def shm_bytes(ctx: ServingContext) -> int:
    """/dev/shm: NCCL and the engine's worker IPC (capacity.kv_offload.shm_base_bytes), plus
    the KV offload buffers, which vLLM keeps there (one region per engine)."""
    offload = ctx.plan.serving.kv_offload
    return kv_offload.shm_base_bytes(ctx.gpus_per_pod, ctx.mig is not None) + (offload.pod_bytes if offload else 0)


def memory_request_bytes(ctx: ServingContext) -> int:
    """Host memory: the engine processes, workers, extra API servers and the shm that counts
    against the container's memory (capacity.kv_offload.host_bytes), plus the KV offload
    buffers in that shm."""
    offload = ctx.plan.serving.kv_offload
    base = kv_offload.host_bytes(ctx.gpus_per_pod, ctx.mig is not None, ctx.plan.serving.api_servers)
    return base + (offload.pod_bytes if offload else 0)


def cpu_request(ctx: ServingContext) -> int:
    """Cores: one per GPU worker plus scheduler, API server and tokenizer threads, and one
    per further API server; 2 on a MIG slice (seven of them share a GPU's host share of
    cores)."""
    if ctx.mig is not None:
        return 2
    # one more per extra API server process (capacity.wide_ep: one per engine)
    return 4 + 2 * ctx.gpus_per_pod + ctx.plan.serving.api_servers - 1


def _gi(n: int) -> str:
    return f"{n // GIB}Gi"


# --------------------------------------------------------------------------- pieces


def weights_uri(ctx: ServingContext) -> str:
    return f"s3://{ctx.weights_bucket}/{ctx.model_key}"


def model_dir(ctx: ServingContext) -> str:
    """The model's directory in the node cache, as the pod sees it."""
    return f"{MODEL_CACHE_DIR}/{ctx.model.name}"


def model_path(ctx: ServingContext) -> str:
    """What vLLM's --model gets: the S3 URI when streaming, the synced directory otherwise."""
    return weights_uri(ctx) if ctx.settings.serving.weights_mode == "stream" else model_dir(ctx)


def sync_seconds(ctx: ServingContext) -> int:
    """How long copying the checkpoint into an empty node cache may take, at the throughput
    the settings assume (serving.weights_sync_mib_per_s)."""
    if ctx.settings.serving.weights_mode != "sync":
        return 0
    size = checkpoint_bytes(ctx.model, ctx.settings.serving.engine.quantization)
    return -(-size // (ctx.settings.serving.weights_sync_mib_per_s * 1024 * 1024))


def _irsa(ctx: ServingContext) -> bool:
    return ctx.settings.cluster.irsa


def credential_env(ctx: ServingContext, role_trn_env: dict) -> list[dict]:
    """How init containers authenticate to TOS. With IRSA: the pod's projected token,
    exchanged through STS AssumeRoleWithOIDC by the TOS SDK (docs 6460/1324604); without
    it: the reader user's static key from a Secret (never a plain env value)."""
    if _irsa(ctx):
        return [
            role_trn_env,
            {"name": "VOLCENGINE_OIDC_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"},
            {"name": "VOLCENGINE_OIDC_ROLE_SESSION_NAME", "value": f"{ctx.release}-weights"},
        ]
    secret = f"{ctx.release}-{STATIC_KEY_SECRET_SUFFIX}"
    return [
        {"name": "TOS_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "access_key_id"}}},
        {"name": "TOS_SECRET_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "secret_access_key"}}},
    ]


def container_security() -> dict:
    """Restricted: no privilege escalation, no capabilities, default seccomp, a fixed
    non-root uid and a read-only root filesystem. What the engine and the in-pod tools
    write goes to emptyDirs only (`writable_mounts`)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": SERVING_UID,
        "runAsGroup": SERVING_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# --------------------------------------------------------------------------- writable paths
#
# The root filesystem is read-only; these are the only places a serving container writes:
#   HOME_DIR   emptyDir "home": $HOME and every cache below (CACHE_ENV), kept across
#              container restarts of the pod, so a restarted engine finds its compiled graphs;
#   TMP_DIR    emptyDir "tmp": vLLM's ZMQ IPC sockets (VLLM_RPC_BASE_PATH defaults to the
#              temp dir) and Python's temp files;
#   /dev/shm   emptyDir "dshm" (memory): NCCL and the workers' shared-memory IPC.
# tests/test_readonly_root_vllm.py runs a real vLLM with exactly these writable and HOME
# itself unwritable: the variables below must cover everything it writes.
HOME_DIR = "/home/vllm"
CACHE_DIR = f"{HOME_DIR}/.cache"
TMP_DIR = "/tmp"
# Where each library caches by default, pointed explicitly into CACHE_DIR (read at the
# versions the serving image ships: vllm 0.32 vllm/envs.py, triton 3.x triton/knobs.py,
# torch 2.x torch/_inductor/runtime/cache_dir_utils.py, huggingface_hub constants.py,
# CUDA's "CUDA Environment Variables" for the JIT ComputeCache):
CACHE_ENV = {
    "XDG_CACHE_HOME": CACHE_DIR,  # the default base of vLLM's, Hugging Face's and torch hub's caches
    "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",  # torch.compile artifacts, model info, assets (~/.cache/vllm)
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/inductor",  # Inductor's kernels (/tmp/torchinductor_<user>)
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",  # compiled Triton kernels, this project's included (~/.triton/cache)
    "HF_HOME": f"{CACHE_DIR}/huggingface",  # tokenizer and hub files (offline: nothing is downloaded)
    "CUDA_CACHE_PATH": f"{CACHE_DIR}/nv",  # the driver's PTX JIT cache (~/.nv/ComputeCache)
}


def writable_mounts() -> list[dict]:
    """The emptyDir mounts of a serving container besides /dev/shm."""
    return [{"name": "home", "mountPath": HOME_DIR}, {"name": "tmp", "mountPath": TMP_DIR}]


def startup_budget_seconds(ctx: ServingContext) -> int:
    """What the serving container's startupProbe allows: the model load
    (`startup_timeout_seconds`), plus, for a multi-node leader in sync mode, a worker's
    whole sync: the leader's engine waits for every worker to join, and a worker on a fresh
    node is still copying the checkpoint when the leader's own copy is done."""
    budget = ctx.settings.serving.startup_timeout_seconds
    if ctx.multi_node:
        budget += sync_seconds(ctx)
    return budget


def probes(ctx: ServingContext) -> dict:
    """startupProbe gives the model load its budget (`startup_timeout_seconds` >= 20 min; a
    671B checkpoint takes ~10 min from local NVMe; plus a worker's sync when multi-node)
    before liveness may kill the pod (kserve#5062); every probe has an explicit timeout, not
    the kubelet's 1 s default."""
    period = 10
    startup_failures = -(-startup_budget_seconds(ctx) // period)
    http = {"path": "/health", "port": "http"}
    return {
        "startupProbe": {"httpGet": http, "periodSeconds": period, "timeoutSeconds": 5,
                         "failureThreshold": startup_failures},
        # A stopping pod leaves the Services' endpoints when deletion starts (not through
        # this probe); readiness covers an engine that stops answering while running.
        "readinessProbe": {"httpGet": http, "periodSeconds": 10, "timeoutSeconds": 5,
                           "failureThreshold": 3, "successThreshold": 1},
        # /health answers 503 once the engine is dead; 6 x 20 s tolerates a long GC or a
        # step stuck behind a huge prefill without restarting a healthy engine.
        "livenessProbe": {"httpGet": http, "periodSeconds": 20, "timeoutSeconds": 10,
                          "failureThreshold": 6},
    }


def worker_probes(ctx: ServingContext) -> dict:
    """A headless worker has no HTTP server: the probes count its live vLLM engine
    processes (runtime/health.py), one per GPU of the pod. A dead one fails liveness; the
    kubelet restarts the container and the LeaderWorkerSet recreates the group."""
    check = {"exec": {"command": ["python3", "-m", "runtime.health", "workers", "--expect", str(ctx.gpus_per_pod)]}}
    return {
        # The processes start within a minute of the container (the sync and the wait for
        # the leader ran before it, in init containers).
        "startupProbe": {**check, "periodSeconds": 10, "timeoutSeconds": 10, "failureThreshold": 30},
        "readinessProbe": {**check, "periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**check, "periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 3},
    }


def resources(ctx: ServingContext) -> dict:
    mem = _gi(memory_request_bytes(ctx))
    gpus = str(ctx.gpus_per_pod)
    cpu = cpu_request(ctx)
    # On a MIG pool the device plugin (mixed strategy) advertises slices, not GPUs.
    gpu = ctx.gpu_resource
    return {
        "requests": {"cpu": str(cpu), "memory": mem, gpu: gpus},
        "limits": {"cpu": str(2 * cpu), "memory": mem, gpu: gpus},
    }


def volumes(ctx: ServingContext) -> list[dict]:
    vols = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _gi(shm_bytes(ctx))}},
        {"name": "home", "emptyDir": {"sizeLimit": "20Gi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
    ]
    if ctx.settings.serving.weights_mode == "sync":
        # The node's data disk (infra: GPU pools mount it at /mnt/model-cache and hand it to
        # the serving uid): weights survive pod restarts and reschedules onto the same node
        # (vllm#15862, llm-d#2216). The whole cache is mounted and must already exist
        # (Directory): a per-model path with DirectoryOrCreate is made by the kubelet,
        # root-owned 0755, and the init container (uid 1000) could not write it.
        vols.append({"name": "model-cache", "hostPath": {"path": MODEL_CACHE_HOST_PATH, "type": "Directory"}})
    else:
        vols.append({"name": "model-meta", "emptyDir": {"sizeLimit": "1Gi"}})
    if triton.enabled(ctx):
        vols.append(triton.repository_volume(ctx))
    if _irsa(ctx):
        vols.append({"name": "volcengine-token", "projected": {"sources": [{"serviceAccountToken": {
            "audience": STS_AUDIENCE, "expirationSeconds": 3600, "path": "token"}}]}})
    return vols


def _token_mount(ctx: ServingContext) -> list[dict]:
    return [{"name": "volcengine-token", "mountPath": TOKEN_DIR, "readOnly": True}] if _irsa(ctx) else []


def init_containers(ctx: ServingContext, role_trn_env: dict) -> list[dict]:
    """Weights before the engine: sync (copy once per node, verify tokenizer) or stream
    (fetch credentials for the S3 client and verify the tokenizer from the small files)."""
    region = ctx.settings.region
    sv = ctx.settings.serving
    tool = ["python3", "-m", "runtime.weights"]
    common = {
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        "securityContext": container_security(),
        "env": credential_env(ctx, role_trn_env) + [{"name": "HOME", "value": HOME_DIR},
                                                     {"name": "HF_HUB_OFFLINE", "value": "1"}],
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
    }
    # TOS's S3-compatible endpoint inside the VPC (bucket in the host name).
    endpoint = f"https://{tos_internal_s3_host(region)}"
    source = ["--bucket", ctx.weights_bucket, "--prefix", ctx.model_key, "--endpoint", endpoint, "--region", region,
              "--connections", str(sv.weights_sync_connections)]
    if sv.weights_mode == "sync":
        return [{
            **common,
            "name": "weights-sync",
            "command": tool + ["sync", *source, "--dest", model_dir(ctx), "--verify"],
            "volumeMounts": [{"name": "model-cache", "mountPath": MODEL_CACHE_DIR},
                             {"name": "home", "mountPath": HOME_DIR}] + _token_mount(ctx),
        }]
    return [
        {
            **common,
            "name": "tos-credentials",
            "command": tool + ["credentials", "--out", f"{CREDENTIALS_DIR}/s3.env",
                               "--s3-endpoint", endpoint, "--region", region],
            # $HOME writable like every container of the image's (read-only root)
            "volumeMounts": [{"name": "run", "mountPath": CREDENTIALS_DIR},
                             {"name": "home", "mountPath": HOME_DIR}] + _token_mount(ctx),
        },
        {
            **common,
            "name": "tokenizer-check",
            "command": tool + ["sync", *source, "--dest", f"/model-meta/{ctx.model.name}",
                               "--metadata-only", "--verify"],
            "volumeMounts": [{"name": "model-meta", "mountPath": "/model-meta"},
                             {"name": "home", "mountPath": HOME_DIR}] + _token_mount(ctx),
        },
    ]


def leader_wait_seconds(ctx: ServingContext) -> int:
    """How long a worker waits for its leader (groups.wait_for_leader): the leader's whole
    weights sync (it may land on an empty cache while the worker's node was warm) plus
    groups.LEADER_START_MARGIN_SECONDS."""
    return sync_seconds(ctx) + groups.LEADER_START_MARGIN_SECONDS


def engine_env(ctx: ServingContext) -> list[dict]:
    env = [
        {"name": "HOME", "value": HOME_DIR},
        *({"name": k, "value": v} for k, v in CACHE_ENV.items()),
        {"name": "HF_HUB_OFFLINE", "value": "1"},  # weights come from TOS, never the hub
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DSVOLC_KERNELS", "value": "1" if ctx.settings.serving.engine.kernels else "0"},
    ]
    if ctx.multi_node:
        env.append({"name": "NCCL_SOCKET_IFNAME", "value": "eth0"})
    # keep-alive outlasting the proxies' idle timeout (workloads/edge/gateway.py)
    return env + telemetry.engine_env(ctx) + gateway.engine_env(ctx)


def engine_command(ctx: ServingContext, args: list[str], *, headless: bool = False,
                   program: list[str] | None = None, shell_args: list[str] | None = None) -> dict:
    """Program and arguments. In stream mode the S3 credentials written by the init
    container are sourced first; `shell_args` are appended by the shell, which evaluates
    them (a data-parallel worker's first rank from its index); `exec` keeps vLLM as the
    container's main process for signal delivery. `program` replaces vLLM's server
    (Triton's frontend)."""
    if program is None and headless:
        # Workers of a multi-node group run no API server (vLLM's `serve --headless`).
        program = list(engine_args.SERVE_PROGRAM)
        args = args + ["--headless"]
    elif program is None and "--api-server-count" in args:
        # Several API processes in front of the engines: only `vllm serve` starts them (the
        # OpenAI server module runs one, whatever --api-server-count says).
        program = list(engine_args.SERVE_PROGRAM)
    elif program is None:
        program = ["python3", "-m", engine_args.API_SERVER_MODULE]
    stream = ctx.settings.serving.weights_mode == "stream"
    if stream or shell_args:
        script = (f". {CREDENTIALS_DIR}/s3.env && " if stream else "") + f"exec {' '.join(program)} \"$@\""
        if shell_args:
            script += " " + " ".join(shell_args)
        return {"command": ["/bin/sh", "-c", script, "vllm"], "args": args}
    return {"command": program, "args": args}


def pre_stop_seconds(ctx: ServingContext, *, serving: bool) -> int:
    """How long a stopping container waits before vLLM gets SIGTERM. A serving container
    waits `drain_seconds`: its pod has left the Services' endpoints when deletion began, and
    this is the time for the gateway to stop sending to it; then vLLM drains in-flight
    requests (`--shutdown-timeout`). A headless worker of a multi-node group must outlive
    its leader's drain (the leader's requests run through it): it waits at most that long,
    and only while the leader has requests to drain (groups.worker_pre_stop)."""
    sv = ctx.settings.serving
    if serving:
        return sv.drain_seconds
    return sv.drain_seconds + sv.inflight_drain_seconds


def engine_container(ctx: ServingContext, args: list[str], *, serving: bool, headless: bool = False,
                     shell_args: list[str] | None = None) -> dict:
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}, *writable_mounts()]
    if ctx.settings.serving.weights_mode == "sync":
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_DIR, "readOnly": True})
    else:
        mounts.append({"name": "run", "mountPath": CREDENTIALS_DIR, "readOnly": True})
    c = {
        "name": "vllm",
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        **engine_command(ctx, args, headless=headless, shell_args=shell_args),
        "env": engine_env(ctx),
        "resources": resources(ctx),
        "volumeMounts": mounts,
        "securityContext": container_security(),
        # The gateway stops routing here before SIGTERM; in-flight generations then finish
        # (vLLM's drain) within terminationGracePeriodSeconds.
        "lifecycle": {"preStop": {"sleep": {"seconds": pre_stop_seconds(ctx, serving=True)}} if serving
                      else groups.worker_pre_stop(ctx, pre_stop_seconds(ctx, serving=False))},
    }
    if serving:
        c["ports"] = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}]
        c.update(probes(ctx))
    else:
        c.update(worker_probes(ctx))
    return c


def scheduling(ctx: ServingContext, component: str) -> dict:
    selector = ctx.selector(component)
    return {
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": groups.node_affinity(ctx)},
        # Spread replicas over zones so one zone's outage leaves capacity; ScheduleAnyway
        # because GPUs are scarce and an unschedulable replica helps nobody.
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
             "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}},
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": selector}},
        ],
    }


def pull_secrets(ctx: ServingContext) -> dict:
    """The pull Secret for the private repository, when the stack pulls with one instead of
    VKE's cr-credential-controller add-on (registry.pull_credentials)."""
    r = ctx.settings.registry
    if r.pull_credentials == "image-pull-secret":
        return {"imagePullSecrets": [{"name": r.image_pull_secret}]}
    return {}


def pod_spec(ctx: ServingContext, containers: list[dict], init: list[dict], component: str) -> dict:
    return {
        "serviceAccountName": ctx.service_account,
        **pull_secrets(ctx),
        # vLLM never talks to the Kubernetes API; the IRSA token is projected explicitly.
        "automountServiceAccountToken": False,
        # preStop + vLLM's drain of the longest request the edge allows (+ a margin).
        "terminationGracePeriodSeconds": ctx.plan.serving.termination_grace_seconds,
        "securityContext": {"runAsNonRoot": True, "runAsUser": SERVING_UID, "fsGroup": SERVING_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": init,
        "containers": containers,
        "volumes": volumes(ctx),
        **scheduling(ctx, component),
    }


# --------------------------------------------------------------------------- objects


def namespace(ctx: ServingContext) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": ctx.namespace,
            # Pod Security labels: workloads/platform/namespaces.py, from every pod rendered in it
            "labels": ctx.labels("namespace"),
        },
    }


def service_account(ctx: ServingContext) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": ctx.metadata(ctx.service_account, "server"),
        "automountServiceAccountToken": False,
    }


def server_container(ctx: ServingContext, args: list[str]) -> dict:
    """The container that answers the API: vLLM's server, or Triton with the same engine."""
    vllm = engine_container(ctx, args, serving=True)
    if not triton.enabled(ctx):
        return vllm
    command = engine_command(ctx, triton.frontend_args(ctx, triton.tokenizer_dir(ctx)),
                             program=["python3", triton.OPENAI_FRONTEND])
    return triton.container(ctx, vllm, command)


def template_metadata(ctx: ServingContext, args: list[str]) -> dict:
    md: dict = {"labels": ctx.labels("server")}
    if triton.enabled(ctx):
        md["annotations"] = {triton.ENGINE_ARGS_ANNOTATION: json.dumps(args)}
    return md


def rolling_update(ctx: ServingContext) -> dict:
    """Surge `rollout.max_surge` replicas (whole groups when multi-node) and take none down
    before its successor is Ready; with no surge, replace one replica at a time. The
    settings refuse a surge the GPU pool cannot hold at max_replicas (a stalled update)."""
    surge = ctx.settings.rollout.max_surge
    return {"maxSurge": surge, "maxUnavailable": 0 if surge else 1}


def deployment(ctx: ServingContext, role_trn_env: dict) -> dict:
    args = engine_args.render(engine_args.from_context(ctx, model_path(ctx)))
    rollout = ctx.plan.rollout.argo
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": ctx.metadata(ctx.release, "server"),
        "spec": {
            # With Argo Rollouts the Rollout owns the pods (workloadRef) and this template
            # only describes them, so the Deployment itself runs none.
            "replicas": 0 if rollout else ctx.settings.serving.replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": ctx.selector("server")},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update(ctx)},
            "progressDeadlineSeconds": ctx.settings.serving.startup_timeout_seconds + 600,
            "template": {
                "metadata": template_metadata(ctx, args),
                "spec": pod_spec(ctx, [server_container(ctx, args)], init_containers(ctx, role_trn_env), "server"),
            },
        },
    }


def leader_worker_set(ctx: ServingContext, role_trn_env: dict) -> dict:
    """Several nodes per replica: pipeline parallel across nodes, tensor parallel within.
    Leader = node rank 0 with the API server and HTTP probes; workers join it headless and
    are probed on their engine processes. Any pod failing recreates the whole group (a
    partial group cannot serve). Updates roll group by group within the pool's room
    (`rollout.max_surge`); `rollout.partition` holds groups back for a staged release."""
    base = engine_args.from_context(ctx, model_path(ctx))
    leader_addr = "$(LWS_LEADER_ADDRESS)"
    leader_args = engine_args.render(engine_args.for_rank(base, node_rank="0", master_addr=leader_addr))
    worker = engine_args.for_rank(base, node_rank="$(LWS_WORKER_INDEX)", master_addr=leader_addr,
                                  worker_index="LWS_WORKER_INDEX")
    # A data-parallel worker's first rank is its index times the engines per node: the
    # shell computes it (the kubelet's $(VAR) expansion cannot).
    shell_args = []
    if worker.data_parallel_start_rank is not None:
        shell_args = ["--data-parallel-start-rank", worker.data_parallel_start_rank]
        worker = replace(worker, data_parallel_start_rank=None)
    worker_args = engine_args.render(worker)
    init = init_containers(ctx, role_trn_env)
    leader_labels = {**ctx.labels("server"), LEADER_LABEL: "leader", **rollout.track_labels(ctx)}
    worker_labels = {**ctx.labels("server"), LEADER_LABEL: "worker", **rollout.track_labels(ctx)}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": ctx.metadata(ctx.release, "server"),
        "spec": {
            "replicas": ctx.settings.serving.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration": {
                **rolling_update(ctx), "partition": ctx.settings.rollout.partition}},
            "leaderWorkerTemplate": {
                "size": ctx.engine.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": with_rdma(ctx, {
                    "metadata": {"labels": leader_labels},
                    "spec": pod_spec(ctx, [engine_container(ctx, leader_args, serving=True)], init, "server"),
                }),
                "workerTemplate": with_rdma(ctx, {
                    "metadata": {"labels": worker_labels},
                    "spec": pod_spec(ctx, [engine_container(ctx, worker_args, serving=False, headless=True,
                                                            shell_args=shell_args)],
                                     init + [groups.wait_for_leader(ctx, leader_wait_seconds(ctx),
                                                                    container_security())], "server"),
                }),
            },
        },
    }


def with_rdma(ctx: ServingContext, template: dict) -> dict:
    """A multi-node pod template with the RDMA NICs, NCCL settings and IPC_LOCK the engine
    container needs on an RDMA pool (workloads/engine/rdma.py), and NVSHMEM's settings when
    it runs DeepEP; unchanged without RDMA."""
    extra = rdma.extras(ctx)
    if extra is None:
        return template
    template["metadata"]["annotations"] = {**template["metadata"].get("annotations", {}), **extra.annotations}
    engine = template["spec"]["containers"][0]
    for bound in ("requests", "limits"):
        engine["resources"][bound].update(extra.resources)
    args = engine.get("args", [])
    backend = args[args.index("--all2all-backend") + 1] if "--all2all-backend" in args else None
    # DeepEP's NVSHMEM transport over the same NICs (workloads/engine/deepep.py)
    engine["env"] = engine["env"] + extra.env + deepep.env(ctx, extra.nics, backend)
    engine["securityContext"]["capabilities"]["add"] = extra.capabilities
    engine["startupProbe"] = rdma.startup_probe(ctx, engine["startupProbe"])
    return template


def serving_selector(ctx: ServingContext) -> dict:
    """Pods that answer HTTP: every server pod, or only group leaders when multi-node."""
    sel = dict(ctx.selector("server"))
    if ctx.multi_node:
        sel[LEADER_LABEL] = "leader"
    return sel


def services(ctx: ServingContext) -> list[dict]:
    """Stable and canary Services; the HTTPRoute weights traffic between them. Argo Rollouts
    narrows each to its ReplicaSet during a rollout; a staged multi-node release narrows
    each to its track (workloads/engine/rollout.py `service_selectors`)."""
    out = []
    for name, selector in rollout.service_selectors(ctx, serving_selector(ctx)).items():
        out.append({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": ctx.metadata(name, "server"),
            "spec": {
                "type": "ClusterIP",
                "selector": selector,
                "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        })
    return out


def pod_disruption_budget(ctx: ServingContext) -> dict:
    """Node drains and autoscaler scale-downs take one replica at a time. Multi-node: over
    every pod of every group, leaders and workers: evicting any one pod takes its whole
    group down (it is recreated), and while that group is not back no other pod may go, so
    at most one group is ever down by a voluntary disruption. Pods that are not Ready
    (loading, crash-looping) may be evicted anyway: they serve nothing, and a stuck group
    must not block node drains forever."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": ctx.metadata(ctx.release, "server"),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": ctx.selector("server")},
                 "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    }


def render(ctx: ServingContext, role_trn: str | None = None) -> list[dict]:
    """All serving objects. `role_trn` is the weights reader role (IRSA); the component
    passes the real Output-resolved value, tests a literal."""
    role_env = {"name": "VOLCENGINE_OIDC_ROLE_TRN", "value": role_trn if role_trn is not None else ""}
    workload = leader_worker_set(ctx, role_env) if ctx.multi_node else deployment(ctx, role_env)
    repository = [triton.repository(ctx, model_path(ctx))] if triton.enabled(ctx) else []
    return [namespace(ctx), service_account(ctx), *repository, workload, *services(ctx), pod_disruption_budget(ctx)]


def describe_command(obj: dict) -> str:
    """The engine command line of a rendered workload, for people reading a preview."""
    spec = obj["spec"]
    tmpl = spec["leaderWorkerTemplate"]["leaderTemplate"] if obj["kind"] == "LeaderWorkerSet" else spec["template"]
    c = tmpl["spec"]["containers"][0]
    return shlex.join(c["command"] + c["args"])

