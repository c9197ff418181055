"""GPU node health: DCGM and device-plugin signals in, node taints and evictions out.

Runs as a small Deployment (workloads/gpu_health.py renders it). Every interval it asks
Prometheus, per GPU node, for

* the last XID each GPU reported (dcgm-exporter DCGM_FI_DEV_XID_ERRORS),
* new rows remapped for uncorrectable ECC errors, and row-remap failures
  (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_ROW_REMAP_FAILURE),
* GPUs the device plugin took out of service (kube-state-metrics: allocatable GPUs below
  capacity; the plugin marks a GPU unhealthy on its own XID checks),

decides with `decide()` (a pure function, tested) and acts on the Kubernetes API:

* "cordon": taint the node TAINT_KEY=<reason>:NoSchedule, so no new pod lands there while
  the running ones finish (a pending row remap activates at the next GPU reset);
* "drain": the same taint, then evict the serving pods on the node through the Eviction
  API, which honours their PodDisruptionBudget (one replica at a time);
* a node whose signals are clear again (repaired, rebooted) loses the taint.

VKE's own node check and self-healing (the pool's remedy config) repairs what is drained.
Never more than `max_fraction` of the GPU nodes are quarantined at once: a broken exporter
must not take the fleet down.

XID classes follow NVIDIA's Xid catalog for Ampere and newer GPUs, column "Resolution
Bucket (Immediate Action)" (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
and the page-retirement notes (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html):
RESTART_APP / IGNORE codes are the application's fault or already recovered, and move
nothing; codes whose immediate action is a GPU reset or a node reboot drain the node; a
row remapped (63) or a high single-bit ECC rate (92) waits for the next reset, so cordon.
Codes not listed move nothing automatically (the GpuXidErrors alert still fires).

Imports nothing of the project (it runs in the serving image beside runtime.weights).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

TAINT_KEY = "deepseek-volc/gpu-unhealthy"
OK, CORDON, DRAIN = "ok", "cordon", "drain"
_RANK = {OK: 0, CORDON: 1, DRAIN: 2}

# XID -> (action, what it is). Immediate action per NVIDIA's catalog in the comment.
XID_ACTIONS: dict[int, tuple[str, str]] = {
    8: (OK, "GPU stopped processing (RESTART_APP)"),
    13: (OK, "graphics engine exception (RESTART_APP)"),
    31: (OK, "GPU memory page fault (RESTART_APP)"),
    43: (OK, "GPU stopped processing, application (IGNORE)"),
    45: (OK, "preemptive cleanup after an earlier error (IGNORE)"),
    94: (OK, "contained ECC error, only the touching application is hit (RESTART_APP)"),
    48: (DRAIN, "double-bit ECC error (RESET_GPU)"),
    62: (DRAIN, "internal micro-controller halt (RESET_GPU)"),
    63: (CORDON, "row remapping recorded, activates at the next reset (RESET_GPU when idle)"),
    64: (DRAIN, "row remapping failed (RESET_GPU)"),
    74: (DRAIN, "NVLink error (RESET_GPU)"),
    79: (DRAIN, "GPU has fallen off the bus (RESTART_BM)"),
    92: (CORDON, "high single-bit ECC error rate (RESET_GPU when idle)"),
    95: (DRAIN, "uncontained ECC error (RESET_GPU)"),
    119: (DRAIN, "GSP RPC timeout (RESET_GPU)"),
    120: (DRAIN, "GSP error (RESET_GPU)"),
    140: (DRAIN, "unrecovered ECC error (RESET_GPU)"),
}


@dataclass(frozen=True)
class NodeSignals:
    node: str
    xids: dict[str, int] = field(default_factory=dict)  # GPU -> last XID (0: none)
    new_uncorrectable_remaps: float = 0.0  # rows remapped for uncorrectable errors, last window
    remap_failure: bool = False  # a row could not be remapped
    gpus_capacity: float = 0.0  # nvidia.com/gpu (or MIG slices) the node has
    gpus_allocatable: float = 0.0  # of which the device plugin still offers


@dataclass(frozen=True)
class Verdict:
    node: str
    action: str
    reasons: tuple[str, ...] = ()

    @property
    def taint_value(self) -> str:
        """A label-safe summary (taint values are label values: 63 characters)."""
        return "-".join(r.split(":")[0] for r in self.reasons)[:63].strip("-") or "unhealthy"


def decide(s: NodeSignals) -> Verdict:
    """What to do with one node, from its signals alone."""
    action, reasons = OK, []

    def worse(a: str, why: str) -> None:
        nonlocal action
        if a == OK:
            return
        reasons.append(why)
        if _RANK[a] > _RANK[action]:
            action = a

    for gpu, xid in sorted(s.xids.items()):
        if not xid:
            continue
        a, what = XID_ACTIONS.get(int(xid), (OK, "not classified"))
        worse(a, f"xid{int(xid)}: GPU {gpu}: {what}")
    if s.remap_failure:
        worse(DRAIN, "remapfail: a memory row could not be remapped")
    if s.new_uncorrectable_remaps > 0:
        worse(CORDON, "remap: rows remapped for uncorrectable ECC errors, reset pending")
    if s.gpus_capacity > 0 and s.gpus_allocatable < s.gpus_capacity:
        worse(DRAIN, f"plugin: device plugin offers {s.gpus_allocatable:g} of {s.gpus_capacity:g} GPUs")
    return Verdict(s.node, action, tuple(reasons))


def limit(verdicts: list[Verdict], total_nodes: int, max_fraction: float,
          already: set[str] = frozenset()) -> list[Verdict]:
    """Keep at most max_fraction of the GPU nodes quarantined (those already tainted count;
    the worst verdicts go first). The rest are returned as OK with the reason they wait."""
    budget = int(total_nodes * max_fraction)
    out, used = [], len(already)
    for v in sorted(verdicts, key=lambda v: (-_RANK[v.action], v.node)):
        if v.action == OK or v.node in already:
            out.append(v)
        elif used < budget:
            out.append(v)
            used += 1
        else:
            out.append(Verdict(v.node, OK, v.reasons + (f"held: {max_fraction:g} of GPU nodes already quarantined",)))
    return out


def taints_after(taints: list[dict], v: Verdict) -> list[dict]:
    """The node's taints with ours set (unhealthy) or removed (healthy); others kept."""
    kept = [t for t in taints if t.get("key") != TAINT_KEY]
    if v.action == OK:
        return kept
    return kept + [{"key": TAINT_KEY, "value": v.taint_value, "effect": "NoSchedule"}]


# --------------------------------------------------------------------------- I/O


QUERIES = {
    "xid": 'max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS{job="dcgm-exporter"})',
    "remaps": 'sum by (node) (increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{job="dcgm-exporter"}[15m]))',
    "remap_failure": 'max by (node) (DCGM_FI_DEV_ROW_REMAP_FAILURE{job="dcgm-exporter"})',
    "capacity": 'sum by (node) (kube_node_status_capacity{resource=~"nvidia_com_gpu|nvidia_com_mig_.+"})',
    "allocatable": 'sum by (node) (kube_node_status_allocatable{resource=~"nvidia_com_gpu|nvidia_com_mig_.+"})',
}


def signals_from(results: dict[str, list[dict]]) -> list[NodeSignals]:
    """Prometheus instant-query results (data.result of each query) -> signals per node."""
    nodes: dict[str, dict] = {}

    def at(node: str) -> dict:
        return nodes.setdefault(node, {"xids": {}})

    for r in results.get("xid", []):
        at(r["metric"].get("node", ""))["xids"][r["metric"].get("gpu", "?")] = int(float(r["value"][1]))
    for key, name in (("remaps", "new_uncorrectable_remaps"), ("capacity", "gpus_capacity"),
                      ("allocatable", "gpus_allocatable")):
        for r in results.get(key, []):
            at(r["metric"].get("node", ""))[name] = float(r["value"][1])
    for r in results.get("remap_failure", []):
        at(r["metric"].get("node", ""))["remap_failure"] = float(r["value"][1]) > 0
    return [NodeSignals(node=n, **v) for n, v in sorted(nodes.items()) if n]


class Cluster:
    """The few Kubernetes API calls the controller makes, in-cluster."""

    def __init__(self):
        base = "/var/run/secrets/kubernetes.io/serviceaccount"
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        self.url = f"https://{host}:{port}"
        with open(f"{base}/token") as f:
            self.token = f.read().strip()
        self.tls = ssl.create_default_context(cafile=f"{base}/ca.crt")

    def call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.tls, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def gpu_nodes(self, selector: str) -> list[dict]:
        return self.call("GET", "/api/v1/nodes?labelSelector=" + urllib.parse.quote(selector))["items"]

    def set_taints(self, node: dict, taints: list[dict]) -> None:
        # resourceVersion makes this a compare-and-swap: a concurrent change fails the call.
        patch = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}, "spec": {"taints": taints}}
        self.call("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", patch, "application/merge-patch+json")

    def evict_serving_pods(self, node: str, namespace: str) -> None:
        q = urllib.parse.quote(f"spec.nodeName={node}")
        for pod in self.call("GET", f"/api/v1/namespaces/{namespace}/pods?fieldSelector={q}")["items"]:
            name = pod["metadata"]["name"]
            body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
            try:
                self.call("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction", body)
            except urllib.error.HTTPError as exc:  # 429: the PDB allows no more now; next round
                logging.info("eviction of %s/%s deferred: %s", namespace, name, exc.code)


def query(prometheus: str, promql: str) -> list[dict]:
    url = f"{prometheus}/api/v1/query?query={urllib.parse.quote(promql)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())["data"]["result"]


def run_once(prometheus: str, cluster: Cluster, node_selector: str, namespace: str, max_fraction: float,
             evict: bool) -> list[Verdict]:
    nodes = {n["metadata"]["name"]: n for n in cluster.gpu_nodes(node_selector)}
    signals = {s.node: s for s in signals_from({k: query(prometheus, q) for k, q in QUERIES.items()})}
    already = {name for name, n in nodes.items() if any(t.get("key") == TAINT_KEY for t in n["spec"].get("taints", []))}
    verdicts = [decide(signals.get(name, NodeSignals(name))) for name in nodes]
    verdicts = limit(verdicts, len(nodes), max_fraction, already)
    for v in verdicts:
        node = nodes[v.node]
        taints = node["spec"].get("taints", [])
        new = taints_after(taints, v)
        if new != taints:
            logging.warning("node %s: %s (%s)", v.node, v.action, "; ".join(v.reasons) or "healthy again")
            cluster.set_taints(node, new)
        if v.action == DRAIN and evict:
            cluster.evict_serving_pods(v.node, namespace)
    return verdicts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--prometheus", required=True)
    p.add_argument("--node-selector", required=True, help="label selector of the GPU nodes")
    p.add_argument("--namespace", required=True, help="namespace of the serving pods to evict")
    p.add_argument("--interval", type=int, default=60)
    p.add_argument("--max-fraction", type=float, default=0.34)
    p.add_argument("--no-evict", action="store_true", help="taint only; leave draining to VKE's remedy")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cluster = Cluster()
    while True:
        try:
            run_once(a.prometheus, cluster, a.node_selector, a.namespace, a.max_fraction, not a.no_evict)
        except Exception:  # one failed round (Prometheus or API down) must not stop the loop
            logging.exception("round failed; retrying in %s s", a.interval)
        time.sleep(a.interval)


if __name__ == "__main__":
    main()
