"""Prefill/decode disaggregation as a stack option (serving.disaggregation).

The shipped example (stacks/Pulumi.pd-example.yaml: R1 on prod's H20 pool shape) and
variations of it: the sides' group counts are the performance model's at the design load
(computed again here from capacity.sizing), each side renders as its own workload with its
KV role, NIXL handshake address, UCX over the pod's RDMA NICs, budget, headless Service and
autoscaler on its own signal; the route goes only to the router; the network policy admits
prefill <-> decode on the handshake ports; vLLM's own parser takes every rendered command
line; bad settings are refused naming the field.
"""

from __future__ import annotations

import json

import pytest

from capacity.perf import Layout, gpu_perf, load_hardware
from capacity.sizing import Workload, disaggregated
from k8s_schema import validate_all
from stacks import SettingsError
from stacks.plan.disaggregation import PD_ROLE_LABEL
from test_autoscaling import ctx_for
from workloads.edge import gateway, network_policy, router
from workloads.engine import disaggregation, rdma
from workloads.serving import render_all

STACK = "pd-example"


@pytest.fixture(scope="module")
def ctx():
    return ctx_for(STACK)


@pytest.fixture(scope="module")
def objs(ctx):
    return render_all(ctx, "trn:iam::2100000000:role/reader")


def _named(objs, kind, name):
    (o,) = [x for x in objs if x["kind"] == kind and x["metadata"]["name"] == name]
    return o


def test_group_counts_are_the_performance_models_at_the_design_load(ctx):
    d = ctx.plan.disaggregation
    s = ctx.settings
    hw = load_hardware()
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    for ph in d.phases():
        p = ph.engine
        lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(pool.instance_type, p.gpus_per_node))
        w = Workload(s.serving.disaggregation.input_tokens, s.serving.disaggregation.output_tokens,
                     target_rps=s.serving.disaggregation.requests_per_second,
                     ttft_slo_s=ctx.plan.slo.ttft_p99_seconds, itl_slo_s=ctx.plan.slo.max_inter_token_seconds)
        fig = disaggregated(ctx.model, gpu_perf(p.gpu, hw), p, lay, w, hw)
        assert ph.modelled_replicas == fig[f"{ph.role}_replicas"] == ph.min_replicas
        assert ph.max_replicas == 2 * ph.min_replicas  # unset: twice the floor
    assert d.ratio == "1:2"  # 10 req/s of 2,048 + 1,024 tokens on DP16 + EP16 groups
    # a heavier design load asks for more decode groups than prefill ones
    heavy = ctx_for(STACK, serving__disaggregation={**ctx.settings.serving.disaggregation.model_dump(),
                                                    "requests_per_second": 30},
                    cluster__gpu_pools__h20__max_nodes=60)
    assert heavy.plan.disaggregation.decode.min_replicas > d.decode.min_replicas


def test_settings_bounds_win_over_the_model(ctx):
    raw = {**ctx.settings.serving.disaggregation.model_dump(), "prefill": {"min_replicas": 2, "max_replicas": 3}}
    c = ctx_for(STACK, serving__disaggregation=raw, cluster__gpu_pools__h20__max_nodes=24)
    assert (c.plan.disaggregation.prefill.min_replicas, c.plan.disaggregation.prefill.max_replicas) == (2, 3)
    so = _named(disaggregation.render_autoscaling(c), "ScaledObject", f"{c.release}-prefill")
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 3)


@pytest.mark.parametrize("change,field", [
    ({"serving__disaggregation": {"enabled": True}}, "requests_per_second"),
    ({"gateway__canary_weight": 10}, "gateway.canary_weight"),
    ({"serving__router": {"enabled": False}}, "serving.router.enabled"),
    ({"cluster__gpu_pools__h20__max_nodes": 10}, "cluster.gpu_pools.h20.max_nodes"),
    ({"serving__disaggregation": {"enabled": True, "requests_per_second": 10, "decode": {"pool": "h100"}}},
     "serving.disaggregation.decode.pool"),
    ({"serving__disaggregation": {"enabled": True, "requests_per_second": 10,
                                  "prefill": {"min_replicas": 3, "max_replicas": 2}}}, "max_replicas"),
])
def test_bad_settings_are_refused_naming_the_field(change, field):
    with pytest.raises(SettingsError) as e:
        ctx_for(STACK, **change)
    assert field in str(e.value), str(e.value)


def test_each_side_is_its_own_group_with_its_kv_role(ctx, objs):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("LeaderWorkerSet", ctx.release) not in kinds  # no aggregated workload
    assert ("PodDisruptionBudget", ctx.release) not in kinds
    for ph in ctx.plan.disaggregation.phases():
        lws = _named(objs, "LeaderWorkerSet", f"{ctx.release}-{ph.role}")
        assert lws["spec"]["replicas"] == ph.min_replicas
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == ph.engine.nodes == 2
        for key in ("leaderTemplate", "workerTemplate"):
            t = lws["spec"]["leaderWorkerTemplate"][key]
            assert t["metadata"]["labels"][PD_ROLE_LABEL] == ph.role
            c = t["spec"]["containers"][0]
            args = c["args"]
            kv = json.loads(args[args.index("--kv-transfer-config") + 1])
            assert kv == {"kv_connector": "NixlConnector", "kv_role": {"prefill": "kv_producer",
                                                                       "decode": "kv_consumer"}[ph.role]}
            env = {e["name"]: e for e in c["env"]}
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"] == str(ctx.settings.serving.disaggregation.side_channel_port)
            # UCX over the pod's RDMA NICs: H20 nodes have 4 NICs, a pod holds all 8 GPUs
            assert ph.rdma_per_pod == 4
            assert env["UCX_NET_DEVICES"]["value"] == rdma.hca_list(4) == "mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1"
            assert env["UCX_TLS"]["value"] == disaggregation.UCX_TLS_RDMA
            assert c["resources"]["limits"][rdma.RDMA_RESOURCE] == "4"
            assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
            ports = [p["containerPort"] for p in c["ports"] if p["name"].startswith("nixl-")]
            assert ports == list(range(5600, 5600 + ph.engine.data_parallel_size))
        pdb = _named(objs, "PodDisruptionBudget", f"{ctx.release}-{ph.role}")
        assert pdb["spec"]["selector"]["matchLabels"] == disaggregation.selector(ctx, ph.role)
        svc = _named(objs, "Service", f"{ctx.release}-{ph.role}-nixl")
        assert svc["spec"]["clusterIP"] == "None"
        assert [p["port"] for p in svc["spec"]["ports"]] == list(range(5600, 5616))
    validate_all(objs, ctx.settings.cluster.kubernetes_version)


def test_a_single_node_side_is_a_deployment_with_rdma(ctx):
    """Sides that fit one node render as Deployments, still with the NICs the KV moves over."""
    raw = {**ctx.settings.serving.disaggregation.model_dump(),
           "prefill": {"parallelism": "tp_ep", "tensor_parallel_size": 8}}
    c = ctx_for(STACK, serving__disaggregation=raw)
    assert c.plan.disaggregation.prefill.nodes == 1
    dep = _named(render_all(c, "trn"), "Deployment", f"{c.release}-prefill")
    assert dep["spec"]["selector"]["matchLabels"][PD_ROLE_LABEL] == "prefill"
    t = dep["spec"]["template"]
    assert t["metadata"]["annotations"][rdma.POD_NETWORKS_ANNOTATION]
    assert t["spec"]["containers"][0]["resources"]["requests"][rdma.RDMA_RESOURCE] == "4"
    so = _named(disaggregation.render_autoscaling(c), "ScaledObject", f"{c.release}-prefill")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{c.release}-prefill"}


def test_each_side_scales_on_its_own_signal(ctx, objs):
    a, slo = ctx.settings.autoscaling, ctx.plan.slo
    pre = _named(objs, "ScaledObject", f"{ctx.release}-prefill")["spec"]
    dec = _named(objs, "ScaledObject", f"{ctx.release}-decode")["spec"]
    assert pre["scaleTargetRef"]["kind"] == dec["scaleTargetRef"]["kind"] == "LeaderWorkerSet"
    trig = {s: {t["name"]: t for t in spec["triggers"]} for s, spec in (("prefill", pre), ("decode", dec))}
    assert set(trig["prefill"]) == {"waiting-requests", "ttft"} and set(trig["decode"]) == {"kv-cache-usage", "itl"}
    assert trig["prefill"]["waiting-requests"]["metadata"]["threshold"] == f"{a.waiting_per_replica:g}"
    assert trig["prefill"]["ttft"]["metadata"]["threshold"] == f"{slo.ttft_p99_seconds:g}"
    assert trig["decode"]["kv-cache-usage"]["metadata"]["threshold"] == f"{a.kv_cache_usage:g}"
    assert trig["decode"]["itl"]["metadata"]["threshold"] == f"{round(slo.max_inter_token_seconds, 6):g}"
    for side, ts in trig.items():
        for t in ts.values():
            assert f'deepseek_volc_pd_role="{side}"' in t["metadata"]["query"]
    assert "time_to_first_token" in trig["prefill"]["ttft"]["metadata"]["query"]
    assert "inter_token_latency" in trig["decode"]["itl"]["metadata"]["query"]
    # the series carry the side: the vLLM PodMonitor copies the pod label
    mon = _named(objs, "PodMonitor", f"{ctx.release}-vllm")
    assert PD_ROLE_LABEL in mon["spec"]["podTargetLabels"]
    assert pre["advanced"]["horizontalPodAutoscalerConfig"]["name"] != dec["advanced"]["horizontalPodAutoscalerConfig"]["name"]


def test_every_request_goes_through_the_router_in_pd_mode(ctx, objs):
    route = _named(objs, "HTTPRoute", ctx.release)
    backends = [b["name"] for r in route["spec"]["rules"] for b in r["backendRefs"]]
    assert backends == [router.service_name(ctx)]
    assert ctx.plan.router.mode == "pd" and not ctx.plan.rollout.argo
    http = _named(objs, "NetworkPolicy", f"{ctx.release}-ingress-http")["spec"]["ingress"][0]["from"]
    assert not [p for p in http if p.get("namespaceSelector", {}).get("matchLabels", {}).get(network_policy.NS_LABEL)
                == gateway.ENTRY_NAMESPACE]  # the proxies reach the router, never an engine


def test_prefill_and_decode_reach_each_others_handshake_ports(ctx, objs):
    pol = _named(objs, "NetworkPolicy", f"{ctx.release}-kv-transfer")["spec"]
    exprs = pol["podSelector"]["matchExpressions"]
    assert exprs == [{"key": PD_ROLE_LABEL, "operator": "In", "values": ["prefill", "decode"]}]
    assert pol["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 5600, "endPort": 5615}]
    assert pol["egress"][0]["ports"] == pol["ingress"][0]["ports"]
    # all ports only within a side's own groups (NCCL, torch.distributed), never across sides
    names = {o["metadata"]["name"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert f"{ctx.release}-group" not in names
    for side in ("prefill", "decode"):
        g = _named(objs, "NetworkPolicy", f"{ctx.release}-group-{side}")["spec"]
        assert g["podSelector"]["matchLabels"][PD_ROLE_LABEL] == side
        assert g["ingress"] == [{"from": [{"podSelector": g["podSelector"]}]}]


@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.integration
def test_vllms_parser_takes_both_sides_command_lines(ctx, objs, tmp_path):
    from test_vllm_args import LWS_ENV, final_argv
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    import stat

    stub = tmp_path / "python3"
    stub.write_text("#!/bin/sh\nprintf '%s\\0' \"$@\"\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    for ph in ctx.plan.disaggregation.phases():
        t = _named(objs, "LeaderWorkerSet", f"{ctx.release}-{ph.role}")["spec"]["leaderWorkerTemplate"]
        for key, idx in (("leaderTemplate", "0"), ("workerTemplate", "1")):
            argv = final_argv(t[key]["spec"]["containers"][0], {**LWS_ENV, "LWS_WORKER_INDEX": idx}, tmp_path)
            # one all-to-all flag per side, the phase's (a second one, appended, used to override it)
            assert sum(a.startswith("--all2all-backend") for a in argv) == 1
            args = parser.parse_args(argv)
            validate_parsed_serve_args(args)
            ea = AsyncEngineArgs.from_cli_args(args)
            assert ea.kv_transfer_config.kv_connector == "NixlConnector"
            assert ea.kv_transfer_config.kv_role == ph.kv_role
            # the expert all-to-all of the phase: high throughput for prefill, low latency for decode
            assert ea.all2all_backend == {"prefill": "deepep_high_throughput", "decode": "deepep_low_latency"}[ph.role]
            assert ea.data_parallel_size == ph.engine.data_parallel_size


def test_an_aggregated_single_node_plan_with_rdma_sides_still_gets_the_rdma_plugin_and_scrapes_leaders():
    """The sides decide where KV moves: wide-EP sides over RDMA while the aggregated layout
    (unused) fits one node; the RDMA device plugin is installed for the sides' NICs, and the
    vLLM PodMonitor skips the sides' headless workers."""
    base = ctx_for(STACK).settings.serving.disaggregation.model_dump()
    side = {"parallelism": "dp_ep", "tensor_parallel_size": 1}
    raw = {**base, "prefill": side, "decode": side}
    c = ctx_for(STACK, serving__engine={"parallelism": "tp_ep", "tensor_parallel_size": 8, "max_model_len": 16384,
                                        "kv_cache_dtype": "fp8"},
                serving__disaggregation=raw)
    assert c.plan.serving.rdma_per_pod == 0 and not c.multi_node
    assert all(ph.multi_node and ph.rdma_per_pod == 4 for ph in c.plan.disaggregation.phases())
    assert "rdma-device-plugin" in {a.name for a in c.plan.addons}
    mon = _named(render_all(c, "trn"), "PodMonitor", f"{c.release}-vllm")
    assert mon["spec"]["selector"]["matchExpressions"] == [
        {"key": "deepseek-volc/role", "operator": "NotIn", "values": ["worker"]}]


def test_the_policy_pack_passes_the_example_and_judges_each_side():
    """The real policy pack over the filled example as deployed: nothing mandatory (advisory:
    no alert receivers, the serving image by tag until built); under a two-replica floor it names the prefill side,
    whose ScaledObject allows one group, and not the decode side (two)."""
    from dsvolc import policy_runner, preview
    from tests.stack_fixtures import filled_raw

    result = preview.run_preview(STACK, raw=filled_raw(STACK), mode="existing")
    assert {v["policy"] for v in result.violations} == {"alerts-delivered", "images-by-digest"}
    assert {v["enforcement_level"] for v in result.violations} == {"advisory"}
    by_digest = " ".join(v["message"] for v in result.violations if v["policy"] == "images-by-digest")
    assert "deepseek-router" not in by_digest  # the mirrored router image goes by its recorded digest
    config = policy_runner.load_policy_config("dev")
    config["serving-min-replicas"] = {"enforcementLevel": "mandatory", "minReplicas": 2}
    fired = [v for v in policy_runner.analyze(result.recording, config) if v["policy"] == "serving-min-replicas"]
    assert len(fired) == 1 and "deepseek-prefill" in fired[0]["message"], fired
