"""The routing tier (workloads/edge/router.py): vLLM Router between the gateway and the engines.

What is checked: which stacks get it and why (off where Argo Rollouts runs the canary, refused
there when asked for), its least RBAC, its availability (replicas, budget, spread), the
route and the network policy that put it between the proxies and the engines, its image
from the mirror, Pod Security restricted, and that the real `vllm-router` 0.1.17 accepts the
arguments rendered for each mode (its Python parser and its Rust configuration check).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from k8s_schema import validate_all
from router_harness import router_binary
from stacks import SettingsError
from stacks.constants import ENTRY_NAMESPACE, HTTP_PORT
from stacks.pod_security import RESTRICTED, meets
from test_autoscaling import ctx_for
from vllm_harness import free_port
from workloads.edge import gateway, network_policy, router
from workloads.engine import manifests
from workloads.serving import render_all
from workloads.supply_chain import mirror


def _router_objs(ctx):
    return [o for o in render_all(ctx, "trn") if o["metadata"]["name"] == router.name(ctx)]


def _one(objs, kind):
    (o,) = [x for x in objs if x["kind"] == kind]
    return o


def test_on_for_prod_off_where_argo_runs_the_canary():
    prod, dev = ctx_for("prod"), ctx_for("dev")
    assert prod.plan.router.enabled and not prod.plan.rollout.argo
    assert prod.plan.router.mode == "dp_aware" and prod.plan.router.data_parallel_size == prod.engine.data_parallel_size
    assert dev.plan.rollout.argo and not dev.plan.router.enabled
    assert _router_objs(dev) == []
    # without Argo the dev stack gets it, cache-aware (one engine per replica)
    plain = ctx_for("dev", rollout__enabled=False)
    assert plain.plan.router.enabled and plain.plan.router.mode == "cache_aware"
    assert "--intra-node-data-parallel-size" not in router.args(plain)


def test_asking_for_the_router_under_an_argo_canary_is_refused():
    with pytest.raises(SettingsError) as e:
        ctx_for("dev", serving__router={"enabled": True})
    assert "serving.router.enabled" in str(e.value) and "rollout.enabled" in str(e.value)


def test_least_rbac_pods_of_the_serving_namespace_only():
    ctx = ctx_for("prod")
    objs = render_all(ctx, "trn")
    mine = _router_objs(ctx)
    role = _one(mine, "Role")
    assert role["metadata"]["namespace"] == ctx.namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _one(mine, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": router.name(ctx)}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": router.name(ctx), "namespace": ctx.namespace}]
    assert not [o for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding") and "router" in o["metadata"]["name"]]
    dep = _one(mine, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == router.name(ctx) and spec["automountServiceAccountToken"] is True
    args = spec["containers"][0]["args"]
    assert args[args.index("--service-discovery-namespace") + 1] == ctx.namespace  # never cluster-wide
    # the engines themselves still mount no token
    engine = next(o for o in objs if o["kind"] == "LeaderWorkerSet")
    assert engine["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["automountServiceAccountToken"] is False


def test_two_replicas_a_budget_and_spread_over_zones_and_nodes():
    ctx = ctx_for("prod", serving__router={"replicas": 3})
    mine = _router_objs(ctx)
    dep, pdb = _one(mine, "Deployment"), _one(mine, "PodDisruptionBudget")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    keys = {t["topologyKey"] for t in dep["spec"]["template"]["spec"]["topologySpreadConstraints"]}
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    with pytest.raises(SettingsError) as e:
        ctx_for("prod", serving__router={"replicas": 1})
    assert "replicas" in str(e.value)


def test_the_router_discovers_the_engines_that_answer_http():
    ctx = ctx_for("prod")
    args = router.args(ctx)
    sel = args[args.index("--selector") + 1:args.index("--policy")]
    assert dict(s.split("=", 1) for s in sel) == manifests.serving_selector(ctx)  # group leaders only
    assert args[args.index("--service-discovery-port") + 1] == str(HTTP_PORT)
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert args[args.index("--intra-node-data-parallel-size") + 1] == "16"


def test_image_from_the_mirror_scraped_and_restricted():
    ctx = ctx_for("prod")
    mine = _router_objs(ctx)
    dep = _one(mine, "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == mirror.ref(ctx.plan, "vllm-router")
    assert c["image"].startswith(f"{ctx.plan.names.registry_host}/{ctx.settings.registry.mirror_namespace}/vllm/vllm-router:")
    assert "docker.io/vllm/vllm-router:v0.1.17" in mirror.read_lock(ctx.plan).images
    # `dsvolc images` copies it for the stacks that run it, and only those
    from workloads.supply_chain import inventory

    assert "vllm-router" in {e.name for e in inventory.entries(ctx.plan)}
    assert "vllm-router" not in {e.name for e in inventory.entries(ctx_for("dev").plan)}
    assert meets(dep["spec"]["template"]["spec"], dep["spec"]["template"]["metadata"], RESTRICTED) == []
    mon = _one(mine, "PodMonitor")
    assert mon["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert {"name": "metrics", "containerPort": ctx.settings.serving.router.metrics_port, "protocol": "TCP"} in c["ports"]
    validate_all(mine, ctx.settings.cluster.kubernetes_version)


def test_the_route_sends_the_stable_share_to_the_router_and_keeps_jwt_and_limits():
    ctx = ctx_for("prod")
    objs = gateway.render(ctx)
    route = _one(objs, "HTTPRoute")
    split = next(r for r in route["spec"]["rules"] if r["name"] == gateway.SPLIT_RULE)
    assert [b["name"] for b in split["backendRefs"]] == [router.service_name(ctx), ctx.canary_service]
    assert _one(objs, "SecurityPolicy")["spec"]["targetRefs"][0]["name"] == route["metadata"]["name"]
    assert "rateLimit" in _one(objs, "BackendTrafficPolicy")["spec"]
    svc = next(o for o in _router_objs(ctx) if o["kind"] == "Service")
    assert svc["spec"]["ports"][0]["port"] == HTTP_PORT  # the route's backend port
    # without the router (dev, Argo) the engines' stable Service, as before
    dev = ctx_for("dev")
    split = next(r for r in _one(gateway.render(dev), "HTTPRoute")["spec"]["rules"] if r["name"] == gateway.SPLIT_RULE)
    assert split["backendRefs"][0]["name"] == dev.stable_service


def test_network_policy_gateway_to_router_to_engines():
    ctx = ctx_for("prod")
    pols = {p["metadata"]["name"]: p for p in network_policy.render(ctx)}
    rp = pols[f"{ctx.release}-router"]["spec"]
    assert rp["podSelector"]["matchLabels"] == ctx.selector("router")
    r = ctx.settings.serving.router
    ingress_ports = {(p["port"], peer.get("namespaceSelector", {}).get("matchLabels", {}).get(network_policy.NS_LABEL))
                     for rule in rp["ingress"] for p in rule["ports"] for peer in rule["from"]}
    assert ingress_ports == {(r.port, ENTRY_NAMESPACE), (r.metrics_port, ctx.settings.monitoring.namespace)}
    to_engines, to_api = rp["egress"]
    assert to_engines == {"to": [{"podSelector": {"matchLabels": ctx.selector("server")}}],
                          "ports": [{"protocol": "TCP", "port": HTTP_PORT}]}
    assert {b["ipBlock"]["cidr"] for b in to_api["to"]} == set(network_policy.cluster_cidrs(ctx))
    http = pols[f"{ctx.release}-ingress-http"]["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": ctx.selector("router")}} in http


def _router_accepts(args: list[str], tmp_path) -> str:
    """Start the real vllm-router with the rendered arguments on loopback ports; return its
    log once it reports ready (service discovery cannot reach an API server here and the
    router says so, after accepting the configuration)."""
    args = list(args)
    port, metrics = free_port(), free_port()
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port)), ("--prometheus-host", "127.0.0.1"),
                        ("--prometheus-port", str(metrics))):
        args[args.index(flag) + 1] = value
    log = tmp_path / "router.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["HOME"] = str(tmp_path)  # no kubeconfig
    proc = subprocess.Popen([router_binary(), *args], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(log.read_text())
        return log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.integration  # a real vllm-router process
@pytest.mark.engine  # vllm-router comes with the engine extra
@pytest.mark.parametrize("stack,changes,mode", [
    ("prod", {}, "dp_aware"),
    ("dev", {"rollout__enabled": False}, "cache_aware"),
    ("pd-example", {}, "pd"),
])
def test_the_real_router_accepts_the_rendered_arguments(stack, changes, mode, tmp_path):
    if router_binary() is None:
        pytest.fail("vllm-router not installed (pip install -e '.[engine]')")
    from vllm_router.router_args import RouterArgs

    ctx = ctx_for(stack, **changes)
    assert ctx.plan.router.mode == mode
    args = router.args(ctx)
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    ra = RouterArgs.from_cli_args(parser.parse_args(args))
    ra._validate_router_args()
    assert ra.service_discovery and ra.service_discovery_namespace == ctx.namespace
    if mode == "pd":
        assert ra.vllm_pd_disaggregation and ra.prefill_selector["deepseek-volc/pd-role"] == "prefill"
        assert ra.decode_selector["deepseek-volc/pd-role"] == "decode"
    else:
        assert ra.selector == manifests.serving_selector(ctx)
    log = _router_accepts(args, tmp_path)
    assert "Router ready" in log
    assert "Failed to start service discovery" in log  # it tried: the flags were taken
    if mode == "pd":
        assert "VllmPDRouter instance created" in log
