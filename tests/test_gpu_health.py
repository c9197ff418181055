"""GPU node health: which signals cordon or drain a node (the decision logic of
runtime/gpu_health.py), how Prometheus results become signals, how taints change, the
controller's I/O against a local Kubernetes API (with the rendered RBAC) and a real
Prometheus, and what the controller, pre-warm and warm capacity render."""

from __future__ import annotations

import copy
import logging

import pytest

from stacks.constants import MODEL_CACHE_HOST_PATH

from dsvolc import engine
from k8s_schema import validate_all
from runtime import gpu_health
from runtime.gpu_health import (
    APPLICATION,
    BOOT_ANNOTATION,
    CORDON,
    DRAIN,
    HARDWARE,
    HOLD,
    OK,
    TAINT_KEY,
    XID_ACTIONS,
    NodeSignals,
    Verdict,
    decide,
    hold_until_repaired,
    limit,
    signals_from,
    taints_after,
)
import local_apis
from test_metrics_contract import ALLOWED, dcgm_reference
from workloads.observability import monitoring
from stacks import SettingsError, parse, parse_plan, read_raw
from test_autoscaling import ctx_for
from workloads.edge import network_policy
from workloads.engine import resilience


# --------------------------------------------------------------------------- decisions

# NVIDIA Xid catalog, immediate action: RESET_GPU / RESTART_BM -> drain; a pending row
# remap or high SBE rate -> cordon; RESTART_APP / IGNORE -> nothing.
@pytest.mark.parametrize("xid,action", [
    (48, DRAIN), (62, DRAIN), (64, DRAIN), (74, DRAIN), (79, DRAIN), (95, DRAIN), (119, DRAIN), (120, DRAIN),
    (140, DRAIN), (63, CORDON), (92, CORDON), (13, OK), (31, OK), (43, OK), (45, OK), (94, OK), (8, OK),
    (999, OK), (0, OK),
])
def test_which_xids_cordon_or_drain(xid, action):
    v = decide(NodeSignals("n1", xids={"0": 0, "3": xid}))
    assert v.action == action
    if action != OK:
        assert v.reasons[0].startswith(f"xid{xid}: GPU 3")


def test_the_worst_gpu_decides_and_every_reason_is_kept():
    v = decide(NodeSignals("n1", xids={"0": 63, "1": 79, "2": 13}))
    assert v.action == DRAIN and [r.split(":")[0] for r in v.reasons] == ["xid63", "xid79"]
    assert v.taint_value == "xid63-xid79"


@pytest.mark.parametrize("signals,action,first", [
    (NodeSignals("n", remap_failure=True), DRAIN, "remapfail"),
    (NodeSignals("n", new_uncorrectable_remaps=2), CORDON, "remap"),
    (NodeSignals("n", gpus_capacity=8, gpus_allocatable=7), DRAIN, "plugin"),
    (NodeSignals("n", gpus_capacity=8, gpus_allocatable=8), OK, None),
    (NodeSignals("n", gpus_capacity=0, gpus_allocatable=0), OK, None),  # not reported: no verdict
])
def test_ecc_and_device_plugin_signals(signals, action, first):
    v = decide(signals)
    assert v.action == action
    assert (v.reasons[0].split(":")[0] if v.reasons else None) == first


def test_no_more_than_the_allowed_fraction_is_quarantined():
    verdicts = [Verdict(f"n{i}", DRAIN, ("xid79: x",)) for i in range(4)] + [Verdict("m", CORDON, ("remap: y",))]
    out = {v.node: v for v in limit(verdicts, total_nodes=9, max_fraction=0.34)}  # 3 of 9
    assert sum(v.action != OK for v in out.values()) == 3
    assert out["m"].action == OK and "held" in out["m"].reasons[-1]  # drains go first
    # nodes already tainted use the budget up, and keep their verdict
    again = {v.node: v for v in limit(verdicts, total_nodes=9, max_fraction=0.34, already={"n3", "m"})}
    assert again["n3"].action == DRAIN and again["m"].action == CORDON
    assert sum(v.action != OK for v in again.values()) == 3


def test_taints_are_set_and_cleared_leaving_others_alone():
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    bad = taints_after([gpu_taint], Verdict("n", DRAIN, ("xid79: fallen off",)))
    assert bad == [gpu_taint, {"key": TAINT_KEY, "value": "xid79", "effect": "NoSchedule"}]
    assert taints_after(bad, Verdict("n", OK)) == [gpu_taint]


def test_prometheus_results_become_signals():
    def sample(value, **labels):
        return {"metric": labels, "value": [0, str(value)]}
    sigs = signals_from({
        "xid": [sample(79, node="a", gpu="0"), sample(0, node="a", gpu="1"), sample(13, node="b", gpu="0")],
        "remaps": [sample(0, node="a"), sample(3, node="b")],
        "remap_failure": [sample(0, node="a")],
        "capacity": [sample(8, node="a"), sample(8, node="b")],
        "allocatable": [sample(8, node="a"), sample(8, node="b")],
    })
    by = {s.node: s for s in sigs}
    assert by["a"].xids == {"0": 79, "1": 0} and not by["a"].remap_failure
    assert [decide(s).action for s in sigs] == [DRAIN, CORDON]


def test_every_classified_xid_names_its_catalog_action():
    for xid, (action, cls, what) in XID_ACTIONS.items():
        bucket = what.rsplit("(", 1)[1]
        assert any(b in bucket for b in ("RESTART_APP", "IGNORE", "RESET_GPU", "RESTART_BM")), xid
        assert (action == OK) == any(b in bucket for b in ("RESTART_APP", "IGNORE")), xid
        assert cls in (HARDWARE, APPLICATION), xid
        if action != OK:  # whatever quarantines a node is the hardware's fault
            assert cls == HARDWARE, xid


def test_xid_classes_follow_the_catalog():
    # application faults (RESTART_APP / IGNORE of a program's own error) warn; memory,
    # NVLink, bus and GSP faults page (NVIDIA Xid catalog, see runtime/gpu_health.py)
    assert {13, 31, 43, 45, 68} <= set(gpu_health.xids_of(APPLICATION))
    assert {48, 63, 64, 74, 79, 92, 94, 95} <= set(gpu_health.xids_of(HARDWARE))
    assert not set(gpu_health.xids_of(APPLICATION)) & set(gpu_health.xids_of(HARDWARE))


@pytest.mark.parametrize("total", [1, 2])
def test_a_small_pool_still_quarantines_one_node(total):
    verdicts = [Verdict("n0", DRAIN, ("xid79: x",))] + [Verdict(f"n{i}", OK) for i in range(1, total)]
    out = limit(verdicts, total_nodes=total, max_fraction=0.34)
    assert [v.node for v in out if v.action == DRAIN] == ["n0"]
    # ... but only one: the second bad node of a two-node pool waits
    two = limit([Verdict("a", DRAIN, ("xid79: x",)), Verdict("b", DRAIN, ("xid48: y",))], 2, 0.34)
    assert sum(v.action == DRAIN for v in two) == 1


def _tainted(name: str, boot: str, recorded: str | None) -> dict:
    n = local_apis.node(name, boot)
    n["spec"]["taints"].append({"key": TAINT_KEY, "value": "xid79", "effect": "NoSchedule"})
    if recorded:
        n["metadata"]["annotations"][BOOT_ANNOTATION] = recorded
    return n


@pytest.mark.parametrize("signals, boot, action", [
    (NodeSignals("n"), "b2", HOLD),  # the exporter's series vanished: no evidence
    (NodeSignals("n", xids={"0": 13}), "b1", HOLD),  # the last XID became a harmless one, same boot
    (NodeSignals("n", xids={"0": 0}), "b1", HOLD),  # clear, but never rebooted
    (NodeSignals("n", xids={"0": 0}), "b2", OK),  # rebooted and reporting clear: repaired
])
def test_a_quarantine_holds_until_a_repair_is_seen(signals, boot, action):
    v = hold_until_repaired(decide(signals), _tainted("n", boot, "b1"), signals)
    assert v.action == action
    # a node that was never quarantined is just healthy
    assert hold_until_repaired(decide(signals), local_apis.node("n", boot), signals).action == OK


# --------------------------------------------------------------------------- controller I/O


def test_every_query_reads_a_metric_its_exporter_has():
    dcgm = dcgm_reference()
    for key, q in gpu_health.QUERIES.items():
        for name in monitoring.metric_names(q):
            assert name in dcgm or ALLOWED.get(name) == "kube-state-metrics", (key, name)


def _dcgm(xids: dict[tuple[str, str], int]) -> str:
    lines = ["# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
    lines += [f'DCGM_FI_DEV_XID_ERRORS{{gpu="{g}",UUID="GPU-{n}-{g}",node="{n}"}} {x}' for (n, g), x in xids.items()]
    lines.append("# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter")
    lines += [f'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{gpu="{g}",node="{n}"}} 0' for (n, g) in xids]
    lines.append("# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge")
    lines += [f'DCGM_FI_DEV_ROW_REMAP_FAILURE{{gpu="{g}",node="{n}"}} 0' for (n, g) in xids]
    return "\n".join(lines) + "\n"


def _ksm(gpus: dict[str, tuple[int, int]]) -> str:
    lines = ["# TYPE kube_node_status_capacity gauge"]
    lines += [f'kube_node_status_capacity{{node="{n}",resource="nvidia_com_gpu",unit="integer"}} {c}'
              for n, (c, _) in gpus.items()]
    lines += [f'kube_node_status_capacity{{node="{n}",resource="cpu",unit="core"}} 96' for n in gpus]
    lines.append("# TYPE kube_node_status_allocatable gauge")
    lines += [f'kube_node_status_allocatable{{node="{n}",resource="nvidia_com_gpu",unit="integer"}} {a}'
              for n, (_, a) in gpus.items()]
    lines += [f'kube_node_status_allocatable{{node="{n}",resource="cpu",unit="core"}} 95' for n in gpus]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    prom = local_apis.Prometheus(tmp_path_factory.mktemp("prom"), ("dcgm-exporter", "kube-state-metrics"))
    yield prom
    prom.close()


NODES = ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e", "gpu-f")


@pytest.fixture
def world(prometheus):
    """Six GPU nodes with 8 GPUs each, two serving pods on every node, the controller's RBAC
    as prod renders it, and the signals: gpu-a's GPU 3 fell off the bus, gpu-b had an
    application fault, the device plugin took one GPU of gpu-c out of service."""
    ctx = ctx_for("prod")
    rbac = [o for o in resilience.render(ctx) if o["kind"] in ("ClusterRole", "Role")]
    label = {monitoring.GPU_MODEL_LABEL: "h20"}
    api = local_apis.KubeAPI(rbac, [local_apis.node(n, f"{n}-boot-1", label) for n in NODES]
                             + [local_apis.node("cpu-a", "x")],
                             [local_apis.pod(ctx.namespace, f"{ctx.release}-{n}-{i}", n) for n in NODES for i in (0, 1)])
    xids = {(n, str(g)): 0 for n in NODES for g in range(8)}
    xids[("gpu-a", "3")] = 79
    xids[("gpu-b", "1")] = 13
    gpus = {n: (8, 8) for n in NODES}
    gpus["gpu-c"] = (8, 7)
    prometheus.set("dcgm-exporter", _dcgm(xids))
    prometheus.set("kube-state-metrics", _ksm(gpus))
    cluster = gpu_health.Cluster(api.url, local_apis.TOKEN, None)
    h = ctx.settings.resilience.gpu_health

    def run():
        return {v.node: v for v in gpu_health.run_once(prometheus.url, cluster, monitoring.GPU_MODEL_LABEL,
                                                       ctx.namespace, h.max_unhealthy_fraction, h.evict)}

    yield {"api": api, "ctx": ctx, "run": run, "xids": xids, "gpus": gpus, "prom": prometheus}
    api.close()


def _our_taint(node: dict) -> str | None:
    return next((t["value"] for t in node["spec"]["taints"] if t["key"] == TAINT_KEY), None)


def test_a_bad_node_is_tainted_and_drained_through_the_api(world):
    api, ctx = world["api"], world["ctx"]
    assert len(NODES) * ctx.settings.resilience.gpu_health.max_unhealthy_fraction >= 2  # both fit the cap
    verdicts = world["run"]()
    assert {n: v.action for n, v in verdicts.items()} == {
        "gpu-a": DRAIN, "gpu-b": OK, "gpu-c": DRAIN, "gpu-d": OK, "gpu-e": OK, "gpu-f": OK}
    # tainted, the GPU taint kept, the boot recorded
    assert _our_taint(api.nodes["gpu-a"]) == "xid79" and _our_taint(api.nodes["gpu-c"]) == "plugin"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in api.nodes["gpu-a"]["spec"]["taints"]
    assert api.nodes["gpu-a"]["metadata"]["annotations"][BOOT_ANNOTATION] == "gpu-a-boot-1"
    for n in ("gpu-b", "gpu-d", "cpu-a"):
        assert _our_taint(api.nodes[n]) is None, n
    # the serving pods of the drained nodes were evicted through the Eviction API, no others
    r = ctx.release
    assert sorted(api.evicted) == sorted((ctx.namespace, f"{r}-{n}-{i}") for n in ("gpu-a", "gpu-c") for i in (0, 1))
    assert not [q for q in api.requests if q[2] >= 400], api.requests  # no call refused (RBAC, conflict)
    # a second round changes nothing
    before = len(api.patches)
    world["run"]()
    assert len(api.patches) == before


def test_a_quarantine_is_held_until_the_node_rebooted_and_reports_clear(world):
    api, prom, xids = world["api"], world["prom"], world["xids"]
    world["run"]()
    assert _our_taint(api.nodes["gpu-a"]) == "xid79"
    # the last XID changes to a harmless one: still quarantined
    xids[("gpu-a", "3")] = 13
    prom.set("dcgm-exporter", _dcgm(xids))
    assert world["run"]()["gpu-a"].action == HOLD and _our_taint(api.nodes["gpu-a"]) == "xid79"
    # the node's exporter is gone (restarted, unscheduled): still quarantined
    prom.set("dcgm-exporter", _dcgm({k: v for k, v in xids.items() if k[0] != "gpu-a"}))
    assert world["run"]()["gpu-a"].action == HOLD and _our_taint(api.nodes["gpu-a"]) == "xid79"
    # VKE's repair rebooted it and its GPUs report clear: the taint and the record go
    api.nodes["gpu-a"]["status"]["nodeInfo"]["bootID"] = "gpu-a-boot-2"
    xids[("gpu-a", "3")] = 0
    prom.set("dcgm-exporter", _dcgm(xids))
    assert world["run"]()["gpu-a"].action == OK
    assert _our_taint(api.nodes["gpu-a"]) is None
    assert BOOT_ANNOTATION not in api.nodes["gpu-a"]["metadata"]["annotations"]
    assert _our_taint(api.nodes["gpu-c"]) == "plugin"  # still short of a GPU


def test_the_rendered_rbac_is_what_the_api_checks(world, caplog):
    """Negative control of the local API: without the eviction verb the drain is refused."""
    api = world["api"]
    for rules in api.ns_rules.values():
        for r in rules:
            if r["resources"] == ["pods/eviction"]:
                r["verbs"] = ["post"]
    with caplog.at_level(logging.INFO):
        world["run"]()
    assert api.evicted == [] and any(code == 403 for _, path, code in api.requests if path.endswith("/eviction"))


def test_dcgm_exporter_runs_on_quarantined_nodes():
    ds = next(o for o in monitoring.render(ctx_for("dev")) if o["kind"] == "DaemonSet")
    tolerations = ds["spec"]["template"]["spec"]["tolerations"]
    taint = {"key": TAINT_KEY, "value": "xid79", "effect": "NoSchedule"}
    assert any(t["key"] == taint["key"] and t.get("effect") in (None, taint["effect"])
               and (t["operator"] == "Exists" or t.get("value") == taint["value"]) for t in tolerations)


# --------------------------------------------------------------------------- rendering


def test_prod_quarantines_prewarms_and_holds_warm_capacity():
    ctx = ctx_for("prod")
    objs = resilience.render(ctx, "trn:iam::1:role/r")
    validate_all(objs, ctx.settings.cluster.kubernetes_version)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    r = ctx.release
    assert {("Deployment", f"{r}-gpu-health"), ("ClusterRole", f"{r}-gpu-health"),
            ("DaemonSet", f"{r}-prewarm"), ("PriorityClass", f"{r}-warm-capacity"),
            ("Deployment", f"{r}-warm-capacity")} <= kinds
    warm = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("warm-capacity"))
    assert warm["spec"]["replicas"] == ctx.settings.resilience.warm_capacity.replicas == 2
    c = warm["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == str(ctx.gpus_per_pod)  # one serving pod's GPUs
    prio = next(o for o in objs if o["kind"] == "PriorityClass")
    assert prio["value"] < 0 and prio["value"] >= -10 and prio["preemptionPolicy"] == "Never"
    health = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("gpu-health"))
    args = health["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--namespace") + 1] == ctx.namespace
    assert args[args.index("--prometheus") + 1] == ctx.settings.monitoring.prometheus_url


def test_prewarm_syncs_the_same_weights_as_the_serving_pod():
    ctx = ctx_for("dev")
    (ds,) = [o for o in resilience.render(ctx) if o["kind"] == "DaemonSet"]
    init = {c["name"]: c for c in ds["spec"]["template"]["spec"]["initContainers"]}
    from workloads.engine import manifests
    serving_sync = manifests.init_containers(ctx, {"name": "VOLCENGINE_OIDC_ROLE_TRN", "value": ""})[0]
    assert init["weights-sync"]["command"] == serving_sync["command"]
    assert init["pull"]["image"] == ctx.image == ds["spec"]["template"]["spec"]["containers"][0]["image"]
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    # the node's whole cache, as the serving pods mount it (the tool creates the model's directory)
    assert vols["model-cache"]["hostPath"]["path"] == MODEL_CACHE_HOST_PATH
    dest = init["weights-sync"]["command"][init["weights-sync"]["command"].index("--dest") + 1]
    assert dest.endswith(f"/{ctx.model.name}")
    # streaming stacks have no node cache to fill: the image pull only
    st = ctx_for("staging")
    (ds,) = [o for o in resilience.render(st) if o["kind"] == "DaemonSet"]
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]] == ["pull"]
    # and the pre-warm pods may reach TOS like the serving pods
    pol = next(p for p in network_policy.render(ctx) if p["metadata"]["name"].endswith("egress-https"))
    (expr,) = pol["spec"]["podSelector"]["matchExpressions"]
    assert expr["values"] == ["server", "prewarm"]


def test_settings_switch_each_part_off():
    ctx = ctx_for("dev", resilience={"gpu_health": {"enabled": False}, "prewarm": {"enabled": False}})
    assert resilience.render(ctx) == []
    assert not [o for o in resilience.render(ctx_for("dev")) if o["kind"] == "PriorityClass"]  # 0 by default


def test_warm_capacity_beyond_the_pool_is_refused():
    raw = copy.deepcopy(read_raw("prod"))
    raw["resilience"]["warm_capacity"]["replicas"] = 5
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, "prod", stack="prod")
    (line,) = info.value.problems
    assert line.startswith("resilience.warm_capacity.replicas:") and "need 9 nodes" in line


def test_auto_repair_reaches_the_node_pool():
    rec = engine.run("prod", read_raw("prod"))
    pool = next(r.inputs for r in rec.resources if r.type.endswith("vke/nodePool:NodePool") and "-gpu-" in r.name)
    assert pool["management"] == {"enabled": True, "remedyConfig": {"enabled": True}}
    dev = engine.run("dev", read_raw("dev"))
    pool = next(r.inputs for r in dev.resources if r.type.endswith("vke/nodePool:NodePool") and "-gpu-" in r.name)
    assert "management" not in pool


def test_the_xid_alerts_are_rendered_from_the_controllers_table(monkeypatch):
    def xid_rule(ctx) -> str:
        (r,) = [r for g in monitoring.rule_groups(ctx)["recording"] for r in g["rules"]
                if r.get("record") == "node_gpu:dcgm_xid_errors:last"]
        return r["expr"]

    expr = xid_rule(ctx_for("dev"))
    hw = "|".join(str(x) for x, (_, c, _) in sorted(XID_ACTIONS.items()) if c == HARDWARE)
    app = "|".join(str(x) for x, (_, c, _) in sorted(XID_ACTIONS.items()) if c == APPLICATION)
    assert f'"class", "hardware", "xid", "{hw}"' in expr and f'"class", "application", "xid", "{app}"' in expr
    # one table: a code the controller learns is the alerts' too
    monkeypatch.setitem(XID_ACTIONS, 154, (DRAIN, HARDWARE, "GPU recovery action changed (RESET_GPU)"))
    assert "|154" in xid_rule(ctx_for("dev")).split('"hardware"')[1]
