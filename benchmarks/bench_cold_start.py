"""What pre-pull, model-cache warm-up and warm capacity remove from a replica's cold start,
for every shipped stack (stacks/Pulumi.*.yaml).

    python benchmarks/bench_cold_start.py [--out PATH] [--stack NAME ...]

MODELLED, not measured: a cold start needs a VolcEngine GPU node, its registry and TOS,
none of which this machine reaches. Every phase is a formula of stated inputs; the bytes
come from this repository's planner and the rendered serving pods, the other inputs are
assumptions named in INPUTS with where they come from. Writes
benchmarks/results/cold_start.json.

Bytes per node, as the program does it:

    synced   what a node's weights sync copies to its disk: the WHOLE checkpoint on every
             node, a multi-node replica's workers included. The sync init container
             (workloads/engine/manifests.py init_containers, runtime/weights.py sync) copies
             the model's whole prefix; nothing selects a pipeline stage's or an expert
             rank's shards. A two-node replica therefore moves twice the checkpoint.
    loaded   what the node's engines read from that disk into GPU memory: the planner's
             weights per GPU times the pod's GPUs (its stage, or its share of the experts
             plus a copy of everything replicated).

Phases of a replica's start, in order (a phase a feature removes is 0 s); the nodes of a
multi-node replica go through them side by side, each with its own disk and TOS stream:

    node     a GPU node created and joined (pool scale-up)
    pull     the serving image pulled onto the node
    sync     the synced bytes from TOS to the node's model-cache disk (weights_mode sync)
    load     the loaded bytes from that disk (or, streaming, from TOS) into GPU memory
    init     engine start: memory profiling, KV cache allocation, CUDA graph capture

Scenarios:

    cold            a pending replica makes the pool grow: every phase
    prewarm, new    the same, with pre-warm on: the DaemonSet starts on the new node at the
                    same moment as the serving pod, so it saves nothing for this first pod
    prewarm, known  a replica rescheduled onto a node that joined earlier (a repaired node,
                    one freed by a scale-down): pre-warm already pulled and synced there
    warm capacity   a placeholder is preempted on a node that pre-warm already filled:
                    only load and init remain, plus the preemption
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from capacity.planner import checkpoint_bytes  # noqa: E402
from stacks import load_plan  # noqa: E402
from workloads.engine import manifests  # noqa: E402
from workloads.engine.context import build_context  # noqa: E402

MB = 1e6
RESULTS = ROOT / "benchmarks" / "results" / "cold_start.json"

INPUTS = {
    "node_seconds": (240, "assumed: ECS GPU instance creation, boot and VKE join; not measured here"),
    "image_bytes": (10e9, "assumed: vLLM CUDA serving image (~10 GB compressed); measure with `crane manifest`"),
    "image_pull_mb_s": (250, "assumed: pull over the CR VPC endpoint, decompression included"),
    "tos_mb_s": (1000, "assumed: one node's reads from TOS over the VPC (parallel ranged GETs)"),
    # One entry per data-disk type a VKE node pool accepts (docs/infrastructure.md, the
    # provider contract: PTSSD, ESSD_PL0, ESSD_FlexPL).
    "disk_mb_s": ({"PTSSD": 150, "ESSD_PL0": 180, "ESSD_FlexPL": 350},
                  "assumed: per-disk throughput ceilings of the disk classes; the disk's size lowers them further"),
    "init_seconds": (90, "assumed: vLLM profiling, KV cache allocation and CUDA graph capture"),
    "preempt_seconds": (5, "assumed: placeholder eviction (grace 0 s) and the serving pod's scheduling"),
}


class BenchError(Exception):
    """A stack the model cannot cost, said with the field to change."""


def shipped_stacks() -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))


def node_bytes(stack: str) -> dict[str, float]:
    """Bytes one node of the stack's replica syncs and loads (module docstring)."""
    plan = load_plan(stack)
    s, engine = plan.settings, plan.serving.engine
    ctx = build_context(plan)
    sync = s.serving.weights_mode == "sync"
    if sync:
        # what the program syncs: the rendered init container copies the model's whole prefix
        (init,) = [c for c in manifests.init_containers(ctx, {"name": "x", "value": ""}) if c["name"] == "weights-sync"]
        cmd = init["command"]
        if cmd[cmd.index("--prefix") + 1] != ctx.model_key or "--metadata-only" in cmd:
            raise BenchError(f"{stack}: the weights sync no longer copies the model's whole prefix: "
                             f"{' '.join(cmd)}; count its bytes here again")
    return {
        "nodes_per_replica": engine.nodes,
        "synced": float(checkpoint_bytes(ctx.model, s.serving.engine.quantization)) if sync else 0.0,
        # the planner's per-GPU weights (the MTP modules included where they are loaded)
        "loaded": float(engine.weights_bytes_per_gpu) * ctx.gpus_per_pod,
        "budgeted_sync_s": float(manifests.sync_seconds(ctx)),
    }


def phases(stack: str) -> dict[str, float]:
    plan = load_plan(stack)
    s = plan.settings
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    v = {k: val for k, (val, _) in INPUTS.items()}
    if pool.data_disk_type not in v["disk_mb_s"]:
        raise BenchError(f"{stack}: cluster.gpu_pools.{s.serving.gpu_pool}.data_disk_type is {pool.data_disk_type!r}; "
                         f"the model knows {', '.join(sorted(v['disk_mb_s']))}: add its throughput to INPUTS")
    b = node_bytes(stack)
    disk = v["disk_mb_s"][pool.data_disk_type] * MB
    sync = s.serving.weights_mode == "sync"
    return {
        "node": v["node_seconds"],
        "pull": v["image_bytes"] / (v["image_pull_mb_s"] * MB),
        "sync": b["synced"] / min(v["tos_mb_s"] * MB, disk) if sync else 0.0,
        # stream mode reads TOS straight into the GPU: the load is the TOS read
        "load": b["loaded"] / disk if sync else b["loaded"] / (v["tos_mb_s"] * MB),
        "init": v["init_seconds"],
    }


def scenarios(stack: str) -> dict[str, dict]:
    p = phases(stack)
    preempt = INPUTS["preempt_seconds"][0]
    out = {
        "cold": dict(p),
        "prewarm, new node": dict(p),
        "prewarm, known node": {**p, "node": 0.0, "pull": 0.0, "sync": 0.0},
        "warm capacity": {**p, "node": preempt, "pull": 0.0, "sync": 0.0},
    }
    result = {"removed_by_feature_s": {
        # on a node that joined before the pod (0 s on a node created for the pod)
        "image pre-pull": round(p["pull"], 1),
        "model-cache warm": round(p["sync"], 1),
        # a placeholder's node instead of a new one
        "warm capacity": round(p["node"] - preempt, 1),
    }}
    for name, ph in out.items():
        total = sum(ph.values())
        result[name] = {"phases_s": {k: round(x, 1) for k, x in ph.items()}, "total_s": round(total, 1),
                        "removed_s": round(sum(p.values()) - total, 1)}
    return result


def stack_result(stack: str) -> dict:
    plan = load_plan(stack)
    s = plan.settings
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    b = node_bytes(stack)
    sc = scenarios(stack)
    return {
        "model": s.serving.model, "weights_mode": s.serving.weights_mode, "disk": pool.data_disk_type,
        "nodes_per_replica": b["nodes_per_replica"],
        "gb_synced_per_node": round(b["synced"] / 1e9, 1),
        "gb_synced_per_replica": round(b["synced"] * b["nodes_per_replica"] / 1e9, 1),
        "gb_loaded_per_node": round(b["loaded"] / 1e9, 1),
        # what the start-up probes allow for a sync (serving.weights_sync_mib_per_s) next to the model's
        "sync_budget_s": round(b["budgeted_sync_s"], 1),
        "scenarios": sc,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--stack", action="append", help="only these stacks (default: every stacks/Pulumi.*.yaml)")
    a = p.parse_args(argv)
    results = {"modelled": True, "inputs": {k: {"value": v, "source": src} for k, (v, src) in INPUTS.items()},
               "stacks": {}}
    try:
        for stack in a.stack or shipped_stacks():
            r = results["stacks"][stack] = stack_result(stack)
            print(f"{stack} ({r['model']}, {r['weights_mode']}, {r['disk']}, {r['nodes_per_replica']} node(s): "
                  f"{r['gb_synced_per_node']} GB synced and {r['gb_loaded_per_node']} GB loaded per node)")
            for name, sc in r["scenarios"].items():
                if name == "removed_by_feature_s":
                    print(f"  removed by each: {sc}")
                    continue
                print(f"  {name:20s} {sc['total_s']:7.0f} s  (removes {sc['removed_s']:.0f} s)  {sc['phases_s']}")
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    a.out.write_text(json.dumps(results, indent=2) + "\n")
    shown = a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out
    print(f"wrote {shown} (MODELLED: inputs in the file)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
