"""What pre-pull, model-cache warm-up and warm capacity remove from a replica's cold start.

    python benchmarks/bench_cold_start.py

MODELLED, not measured: a cold start needs a VolcEngine GPU node, its registry and TOS,
none of which this machine reaches. Every phase is a formula of stated inputs; the weight
bytes are computed by this repository's planner from the catalog architecture, the other
inputs are assumptions named in INPUTS with where they come from. Writes
benchmarks/results/cold_start.json.

Phases of a replica's start, in order (a phase a feature removes is 0 s):

    node     a GPU node created and joined (pool scale-up)
    pull     the serving image pulled onto the node
    sync     the weights copied from TOS to the node's model-cache disk (weights_mode sync)
    load     the weights read from that disk into GPU memory
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

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from capacity.planner import stage_weight_bytes  # noqa: E402
from stacks import load, load_plan  # noqa: E402

MB = 1e6

INPUTS = {
    "node_seconds": (240, "assumed: ECS GPU instance creation, boot and VKE join; not measured here"),
    "image_bytes": (10e9, "assumed: vLLM CUDA serving image (~10 GB compressed); measure with `crane manifest`"),
    "image_pull_mb_s": (250, "assumed: pull over the CR VPC endpoint, decompression included"),
    "tos_mb_s": (1000, "assumed: one node's reads from TOS over the VPC (parallel ranged GETs)"),
    # Throughput ceilings of the ESSD classes; the disk's size lowers them further.
    "essd_mb_s": ({"ESSD_PL0": 180, "ESSD_PL1": 350, "ESSD_PL2": 750, "ESSD_PL3": 1000},
                  "assumed: per-disk throughput ceilings of the ESSD performance levels"),
    "init_seconds": (90, "assumed: vLLM profiling, KV cache allocation and CUDA graph capture"),
    "preempt_seconds": (5, "assumed: placeholder eviction (grace 0 s) and the serving pod's scheduling"),
}


def weight_bytes_per_node(stack: str) -> float:
    """Bytes one node of the replica holds: the planner's per-GPU weights of the worst
    pipeline stage, times the GPUs of one node's stage."""
    plan = load_plan(stack)
    p, m = plan.serving.engine, plan.serving.model
    per_gpu = max(stage_weight_bytes(m, p.quantization, p.tensor_parallel_size, p.pipeline_parallel_size))
    return per_gpu * p.tensor_parallel_size


def phases(stack: str) -> dict[str, float]:
    s = load(stack)
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    v = {k: val for k, (val, _) in INPUTS.items()}
    w = weight_bytes_per_node(stack)
    disk = v["essd_mb_s"][pool.data_disk_type] * MB
    sync = s.serving.weights_mode == "sync"
    return {
        "node": v["node_seconds"],
        "pull": v["image_bytes"] / (v["image_pull_mb_s"] * MB),
        "sync": w / min(v["tos_mb_s"] * MB, disk) if sync else 0.0,
        # stream mode reads TOS straight into the GPU: the load is the TOS read
        "load": w / disk if sync else w / (v["tos_mb_s"] * MB),
        "init": v["init_seconds"],
    }


def scenarios(stack: str) -> dict[str, dict]:
    p = phases(stack)
    preempt = INPUTS["preempt_seconds"][0]
    sync = load(stack).serving.weights_mode == "sync"
    out = {
        "cold": dict(p),
        "prewarm, new node": dict(p),
        "prewarm, known node": {**p, "node": 0.0, "pull": 0.0, "sync": 0.0},
        "warm capacity": {**p, "node": preempt, "pull": 0.0, "sync": 0.0},
    }
    if not sync:  # streaming: nothing to keep on disk, pre-warm only pulls the image
        out["prewarm, known node"]["load"] = p["load"]
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


def main() -> None:
    results = {"modelled": True, "inputs": {k: {"value": v, "source": src} for k, (v, src) in INPUTS.items()},
               "stacks": {}}
    for stack in ("dev", "staging", "prod"):
        s = load(stack)
        pool = s.cluster.gpu_pools[s.serving.gpu_pool]
        results["stacks"][stack] = {
            "model": s.serving.model, "weights_mode": s.serving.weights_mode, "disk": pool.data_disk_type,
            "weight_gb_per_node": round(weight_bytes_per_node(stack) / 1e9, 1),
            "scenarios": scenarios(stack),
        }
        print(f"{stack} ({s.serving.model}, {s.serving.weights_mode}, {pool.data_disk_type}, "
              f"{results['stacks'][stack]['weight_gb_per_node']} GB per node)")
        for name, r in results["stacks"][stack]["scenarios"].items():
            if name == "removed_by_feature_s":
                print(f"  removed by each: {r}")
                continue
            print(f"  {name:20s} {r['total_s']:7.0f} s  (removes {r['removed_s']:.0f} s)  {r['phases_s']}")
    out = ROOT / "benchmarks" / "results" / "cold_start.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)} (MODELLED: inputs in the file)")


if __name__ == "__main__":
    main()
