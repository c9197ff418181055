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
* a quarantined node loses the taint only on positive evidence of repair: it has rebooted
  since it was quarantined (its status.nodeInfo.bootID differs from the one recorded in the
  BOOT_ANNOTATION when the taint was set) *and* dcgm-exporter reports its GPUs again with
  clear signals. Signals that merely disappear (an exporter restart, a scrape gap) or a last
  XID that changes to a harmless one hold the quarantine. A person lifts it by removing the
  taint (`kubectl taint node NODE deepseek-volc/gpu-unhealthy-`).

VKE's own node check and self-healing (the pool's remedy config) repairs what is drained.
Never more than `max_fraction` of the GPU nodes are quarantined at once (a broken exporter
must not take the fleet down), but always at least one: a pool of one or two nodes has a
bad GPU quarantined too.

XID classes follow NVIDIA's Xid catalog for Ampere and newer GPUs, column "Resolution
Bucket (Immediate Action)" (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
and the page-retirement notes (https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html):
RESTART_APP / IGNORE codes are the application's fault or already recovered, and move
nothing; codes whose immediate action is a GPU reset or a node reboot drain the node; a
row remapped (63) or a high single-bit ECC rate (92) waits for the next reset, so cordon.
Codes not listed move nothing automatically.

Each code also has a class, the one the alerts use (workloads/observability/rules render
their XID sets from XID_ACTIONS): `hardware` (the GPU, its memory, NVLink or the bus
failed; GpuXidHardware pages) or `application` (the program on the GPU faulted;
GpuXidApplication warns). 94, a contained ECC error, is hardware that moves nothing: only
the touching process is hit, and the remapped row it leaves cordons through the remap
signal.

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
# The node's boot ID when it was quarantined; a different one is the evidence of a repair.
BOOT_ANNOTATION = "deepseek-volc/gpu-unhealthy-boot-id"
OK, CORDON, DRAIN = "ok", "cordon", "drain"
HOLD = "hold"  # quarantined, signals clear, no evidence of repair yet: the taint stays
_RANK = {OK: 0, HOLD: 1, CORDON: 1, DRAIN: 2}
HARDWARE, APPLICATION = "hardware", "application"

# XID -> (action, class, what it is). Immediate action per NVIDIA's catalog in brackets.
XID_ACTIONS: dict[int, tuple[str, str, str]] = {
    8: (OK, APPLICATION, "GPU stopped processing (RESTART_APP)"),
    13: (OK, APPLICATION, "graphics engine exception (RESTART_APP)"),
    31: (OK, APPLICATION, "GPU memory page fault (RESTART_APP)"),
    43: (OK, APPLICATION, "GPU stopped processing, application (IGNORE)"),
    45: (OK, APPLICATION, "preemptive cleanup after an earlier error (IGNORE)"),
    68: (OK, APPLICATION, "video processor exception (RESTART_APP)"),
    94: (OK, HARDWARE, "contained ECC error, only the touching application is hit (RESTART_APP)"),
    48: (DRAIN, HARDWARE, "double-bit ECC error (RESET_GPU)"),
    62: (DRAIN, HARDWARE, "internal micro-controller halt (RESET_GPU)"),
    63: (CORDON, HARDWARE, "row remapping recorded, activates at the next reset (RESET_GPU when idle)"),
    64: (DRAIN, HARDWARE, "row remapping failed (RESET_GPU)"),
    74: (DRAIN, HARDWARE, "NVLink error (RESET_GPU)"),
    79: (DRAIN, HARDWARE, "GPU has fallen off the bus (RESTART_BM)"),
    92: (CORDON, HARDWARE, "high single-bit ECC error rate (RESET_GPU when idle)"),
    95: (DRAIN, HARDWARE, "uncontained ECC error (RESET_GPU)"),
    119: (DRAIN, HARDWARE, "GSP RPC timeout (RESET_GPU)"),
    120: (DRAIN, HARDWARE, "GSP error (RESET_GPU)"),
    140: (DRAIN, HARDWARE, "unrecovered ECC error (RESET_GPU)"),
}


def xids_of(cls: str) -> list[int]:
    """The XID codes of one class, ascending (what the alert rules match on)."""
    return sorted(x for x, (_, c, _) in XID_ACTIONS.items() if c == cls)


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
        a, _, what = XID_ACTIONS.get(int(xid), (OK, APPLICATION, "not classified"))
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
    """Keep at most max_fraction of the GPU nodes quarantined, and at least one node (those
    already tainted count; the worst verdicts go first). The rest are returned as OK with
    the reason they wait."""
    budget = max(1, int(total_nodes * max_fraction)) if total_nodes else 0
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


def quarantined(node: dict) -> bool:
    return any(t.get("key") == TAINT_KEY for t in node.get("spec", {}).get("taints") or [])


def boot_id(node: dict) -> str:
    return node.get("status", {}).get("nodeInfo", {}).get("bootID", "")


def hold_until_repaired(v: Verdict, node: dict, s: NodeSignals) -> Verdict:
    """A quarantined node whose signals look clear stays quarantined (HOLD) unless there is
    evidence of a repair: it rebooted since the quarantine and its GPUs report again."""
    if v.action != OK or not quarantined(node):
        return v
    recorded = (node["metadata"].get("annotations") or {}).get(BOOT_ANNOTATION)
    if not s.xids:
        return Verdict(v.node, HOLD, ("held: dcgm-exporter reports no GPU of the node, no evidence of repair",))
    if not recorded or recorded == boot_id(node):
        return Verdict(v.node, HOLD, ("held: the node has not rebooted since it was quarantined",))
    return v


def node_patch(node: dict, v: Verdict) -> dict | None:
    """The merge patch that brings the node in line with the verdict, or None.

    A quarantine records the boot ID it was set in; a lifted one drops it. resourceVersion
    makes the patch a compare-and-swap: a concurrent change fails the call."""
    taints = node.get("spec", {}).get("taints") or []
    notes = node["metadata"].get("annotations") or {}
    spec, meta = {}, {}
    if v.action in (CORDON, DRAIN):
        new = taints_after(taints, v)
        if new != taints:
            spec["taints"] = new
        if notes.get(BOOT_ANNOTATION) != boot_id(node):
            meta[BOOT_ANNOTATION] = boot_id(node)
    elif v.action == HOLD:
        if not notes.get(BOOT_ANNOTATION):  # tainted without a record: from now on
            meta[BOOT_ANNOTATION] = boot_id(node)
    else:
        new = taints_after(taints, v)
        if new != taints:
            spec["taints"] = new
        if BOOT_ANNOTATION in notes:
            meta[BOOT_ANNOTATION] = None
    if not spec and not meta:
        return None
    patch: dict = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}}
    if meta:
        patch["metadata"]["annotations"] = meta
    if spec:
        patch["spec"] = spec
    return patch


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
    """The few Kubernetes API calls the controller makes."""

    def __init__(self, url: str, token: str, tls: ssl.SSLContext | None):
        self.url, self.token, self.tls = url.rstrip("/"), token, tls

    @classmethod
    def in_cluster(cls) -> "Cluster":
        base = "/var/run/secrets/kubernetes.io/serviceaccount"
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        with open(f"{base}/token") as f:
            token = f.read().strip()
        return cls(f"https://{host}:{port}", token, ssl.create_default_context(cafile=f"{base}/ca.crt"))

    def call(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        with urllib.request.urlopen(req, context=self.tls, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def gpu_nodes(self, selector: str) -> list[dict]:
        return self.call("GET", "/api/v1/nodes?labelSelector=" + urllib.parse.quote(selector))["items"]

    def patch_node(self, name: str, patch: dict) -> None:
        self.call("PATCH", f"/api/v1/nodes/{urllib.parse.quote(name)}", patch, "application/merge-patch+json")

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
    url = f"{prometheus.rstrip('/')}/api/v1/query?query={urllib.parse.quote(promql)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())["data"]["result"]


def run_once(prometheus: str, cluster: Cluster, node_selector: str, namespace: str, max_fraction: float,
             evict: bool) -> list[Verdict]:
    nodes = {n["metadata"]["name"]: n for n in cluster.gpu_nodes(node_selector)}
    signals = {s.node: s for s in signals_from({k: query(prometheus, q) for k, q in QUERIES.items()})}
    already = {name for name, n in nodes.items() if quarantined(n)}
    verdicts = [decide(signals.get(name, NodeSignals(name))) for name in nodes]
    verdicts = limit(verdicts, len(nodes), max_fraction, already)
    verdicts = [hold_until_repaired(v, nodes[v.node], signals.get(v.node, NodeSignals(v.node))) for v in verdicts]
    for v in verdicts:
        patch = node_patch(nodes[v.node], v)
        if patch is not None:
            logging.warning("node %s: %s (%s)", v.node, v.action, "; ".join(v.reasons) or "repaired")
            cluster.patch_node(v.node, patch)
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
    cluster = Cluster.in_cluster()
    while True:
        try:
            run_once(a.prometheus, cluster, a.node_selector, a.namespace, a.max_fraction, not a.no_evict)
        except Exception:  # one failed round (Prometheus or API down) must not stop the loop
            logging.exception("round failed; retrying in %s s", a.interval)
        time.sleep(a.interval)


if __name__ == "__main__":
    main()
