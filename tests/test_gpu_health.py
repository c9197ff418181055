"""GPU node health: which signals cordon or drain a node (the decision logic of
runtime/gpu_health.py), how Prometheus results become signals, how taints change, and
what the controller, pre-warm and warm capacity render."""

from __future__ import annotations

import copy

import pytest

from stacks.constants import MODEL_CACHE_HOST_PATH

from dsvolc import engine
from k8s_schema import validate_all
from runtime.gpu_health import (
    CORDON,
    DRAIN,
    OK,
    TAINT_KEY,
    XID_ACTIONS,
    NodeSignals,
    Verdict,
    decide,
    limit,
    signals_from,
    taints_after,
)
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
    for xid, (action, what) in XID_ACTIONS.items():
        bucket = what.rsplit("(", 1)[1]
        assert any(b in bucket for b in ("RESTART_APP", "IGNORE", "RESET_GPU", "RESTART_BM")), xid
        assert (action == OK) == any(b in bucket for b in ("RESTART_APP", "IGNORE")), xid


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
