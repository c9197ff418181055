"""How a multi-node group (a LeaderWorkerSet replica) starts and stops: the pieces
workloads/engine/manifests.py adds to its pod templates.

* start: a worker's last init container waits, bounded, until its leader's engine listens
  (`wait_for_leader`); groups prefer nodes the pre-warm labelled with the weights revision
  it verified (`node_affinity`, `weights_revision`);
* stop: a worker's preStop waits only while its leader has work to drain
  (`worker_pre_stop`).

The commands they run are runtime/health.py's (tests/test_multinode.py runs them).
"""

from __future__ import annotations

import hashlib

from stacks.constants import HTTP_PORT, POOL_LABEL, WEIGHTS_LABEL
from workloads.engine import engine_args
from workloads.engine.context import ServingContext

# vLLM's --master-port default (vllm/config/parallel.py ParallelConfig.master_port): the
# TCPStore node rank 0 of a TP x PP group serves, which the other nodes join.
VLLM_MASTER_PORT = 29501
# What a worker allows its leader beyond a whole weights sync before giving up: scheduling,
# the image pull on a node the pre-warm has not reached, the engine's start.
LEADER_START_MARGIN_SECONDS = 600
# A worker's preStop gives up on a leader whose requests make no progress for this long.
DRAIN_STALL_SECONDS = 60


# --------------------------------------------------------------------------- start


def leader_port(ctx: ServingContext) -> int:
    """The port a group's leader listens on for its workers once its engine starts: the
    data-parallel handshake (`--data-parallel-rpc-port`) or the TCPStore of a TP x PP group."""
    return engine_args.DP_RPC_PORT if ctx.engine.data_parallel_size > 1 else VLLM_MASTER_PORT


def wait_for_leader(ctx: ServingContext, timeout_seconds: int, security: dict) -> dict:
    """A worker's last init container: vLLM starts only once the leader's engine listens.
    A headless worker's engine gives the front-end 5 minutes to answer its handshake
    (HANDSHAKE_TIMEOUT_MINS, vllm/v1/engine/core.py), then exits; a leader still copying
    its checkpoint answers much later, and the exit makes the LeaderWorkerSet recreate the
    group, the leader deleted mid-sync. The wait is bounded: a leader that never starts
    fails it, and the restarted init container recreates the group. LWS_LEADER_ADDRESS
    reaches init containers too (LWS v0.10.0 pkg/utils/pod/pod_utils.go AddLWSVariables);
    while the leader has no IP its name does not resolve, which counts as not listening."""
    return {
        "name": "wait-for-leader",
        "image": ctx.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "runtime.health", "wait-leader", "--port", str(leader_port(ctx)),
                    "--timeout", str(timeout_seconds)],
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],
        "securityContext": security,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "100m", "memory": "128Mi"}},
    }


def weights_revision(ctx: ServingContext) -> str:
    """The revision of the weights a serving pod syncs, as a label value: a digest of the
    source (manifests.weights_uri: bucket and prefix). Another model, prefix or bucket is
    another revision; bytes re-uploaded under the same prefix are not (upload a new
    checkpoint under a new weights.prefix)."""
    return hashlib.sha256(f"s3://{ctx.weights_bucket}/{ctx.model_key}".encode()).hexdigest()[:16]


def marks_nodes(ctx: ServingContext) -> bool:
    """Whether the pre-warm labels the nodes whose cache it verified (WEIGHTS_LABEL =
    weights_revision) and multi-node groups prefer them: sync mode with pre-warm on."""
    s = ctx.settings
    return ctx.multi_node and s.serving.weights_mode == "sync" and s.resilience.prewarm.enabled


def node_affinity(ctx: ServingContext) -> dict:
    """The GPU pool, required. A multi-node group prefers nodes the pre-warm marked as
    holding this revision's weights, so it starts without a sync; preferred, not required:
    the cluster autoscaler simulates a new node from the pool's template, which carries no
    such label, and would never add a node for a pod that required it (`wait_for_leader`
    keeps a group on unmarked nodes from restarting while it syncs)."""
    aff: dict = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": [ctx.gpu_pool]}]}]}}
    if marks_nodes(ctx):
        aff["preferredDuringSchedulingIgnoredDuringExecution"] = [{"weight": 100, "preference": {
            "matchExpressions": [{"key": WEIGHTS_LABEL, "operator": "In", "values": [weights_revision(ctx)]}]}}]
    return aff


# --------------------------------------------------------------------------- stop


def worker_pre_stop(ctx: ServingContext, max_seconds: int) -> dict:
    """A headless worker's preStop: it waits only while there is something to drain
    (runtime/health.py `drain`): while its leader's metrics answer, for the leader's own
    preStop (`drain_seconds`, the gateway may still send it requests) and then while
    requests are in flight and tokens keep coming, at most `max_seconds`. A group torn down
    after a failure (LWS deletes the leader with foreground propagation, so its recovery
    waits for every worker's preStop) has an unreachable or stuck leader and goes at once."""
    return {"exec": {"command": [
        "python3", "-m", "runtime.health", "drain", "--port", str(HTTP_PORT),
        "--min-seconds", str(ctx.settings.serving.drain_seconds), "--max-seconds", str(max_seconds),
        "--stall-seconds", str(DRAIN_STALL_SECONDS)]}}
