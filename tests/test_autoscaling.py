"""The KEDA ScaledObject: schema, scale target, signals and bounds taken from settings."""

from __future__ import annotations

import copy

import pytest

from k8s_schema import validate_all
from stacks import parse, read_raw
from workloads.engine import autoscaling
from workloads.observability import monitoring
from stacks.plan import build_plan
from workloads.engine.context import build_context

STACKS = ["dev", "staging", "prod"]


def ctx_for(stack: str, **changes):
    """Context of a shipped stack with dotted-path overrides (`autoscaling__max_replicas=9`)."""
    raw = copy.deepcopy(read_raw(stack))
    for path, value in changes.items():
        doc, keys = raw, path.split("__")
        for k in keys[:-1]:
            doc = doc.setdefault(k, {})
        doc[keys[-1]] = value
    s = parse(raw, stack=stack)
    return build_context(build_plan(s), image_repository="cr.example/ns/repo")


def scaled_object(ctx) -> dict:
    (obj,) = autoscaling.render(ctx)
    assert obj["kind"] == "ScaledObject"
    return obj


@pytest.mark.parametrize("stack", STACKS)
def test_scaled_object_passes_the_keda_crd_schema(stack):
    ctx = ctx_for(stack)
    validate_all(autoscaling.render(ctx), ctx.settings.cluster.kubernetes_version)


def test_a_misspelt_field_fails_the_schema():
    obj = scaled_object(ctx_for("dev"))
    obj["spec"]["maxReplicasCount"] = obj["spec"].pop("maxReplicaCount")
    with pytest.raises(AssertionError, match="maxReplicasCount"):
        validate_all([obj])


def test_scale_target_follows_the_shape_of_the_release():
    dev = ctx_for("dev")
    assert not dev.multi_node and dev.plan.rollout.argo
    assert scaled_object(dev)["spec"]["scaleTargetRef"] == {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": dev.release}

    plain = ctx_for("dev", rollout__enabled=False)
    assert scaled_object(plain)["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": plain.release}

    prod = ctx_for("prod")
    assert prod.multi_node and prod.settings.rollout.enabled
    # Argo cannot manage a LeaderWorkerSet: KEDA scales the LWS even with rollouts on.
    assert scaled_object(prod)["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": prod.release}


def test_bounds_and_timing_come_from_settings():
    ctx = ctx_for("staging", autoscaling__min_replicas=2, autoscaling__max_replicas=5,
                  autoscaling__polling_interval_seconds=20,
                  autoscaling__scale_up_stabilization_seconds=45,
                  autoscaling__scale_down_stabilization_seconds=2400)
    spec = scaled_object(ctx)["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (2, 5, 20)
    hpa = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 45
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 2400
    # The replicas-at-max alert selects this HPA by name.
    assert hpa["name"] == monitoring.hpa_name(ctx) == f"keda-hpa-{ctx.release}"


def test_min_replicas_defaults_to_serving_replicas():
    ctx = ctx_for("prod")
    assert ctx.settings.autoscaling.min_replicas is None
    assert scaled_object(ctx)["spec"]["minReplicaCount"] == ctx.settings.serving.replicas


def test_scale_down_window_outlasts_a_model_load_in_every_stack():
    # A replica that is still loading must not be scaled away by the lull its absence
    # causes: the window has to exceed the time a pod is allowed to start.
    for stack in STACKS:
        ctx = ctx_for(stack)
        if not ctx.settings.autoscaling.enabled:
            continue
        window = scaled_object(ctx)["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"][
            "scaleDown"]["stabilizationWindowSeconds"]
        assert window >= ctx.settings.serving.startup_timeout_seconds, stack


def test_triggers_queue_depth_first_then_rate_then_kv_cache_saturation():
    ctx = ctx_for("dev", autoscaling__waiting_per_replica=3.0,
                  autoscaling__requests_per_second_per_replica=0.5,
                  autoscaling__kv_cache_usage=0.8,
                  monitoring__prometheus_url="http://prom.example:9090")
    trig = {t["name"]: t for t in scaled_object(ctx)["spec"]["triggers"]}
    assert list(trig) == ["waiting-requests", "request-rate", "kv-cache-usage"]
    for t in trig.values():
        assert t["type"] == "prometheus"
        assert t["metadata"]["serverAddress"] == "http://prom.example:9090"
        assert all(isinstance(v, str) for v in t["metadata"].values())  # KEDA reads strings

    w, r, k = trig["waiting-requests"], trig["request-rate"], trig["kv-cache-usage"]
    # Totals divided per replica by the HPA (AverageValue) ...
    assert (w["metricType"], w["metadata"]["threshold"]) == ("AverageValue", "3")
    assert monitoring.metric_names(w["metadata"]["query"]) == {"vllm:num_requests_waiting"}
    assert w["metadata"]["query"].startswith("sum(")
    assert (r["metricType"], r["metadata"]["threshold"]) == ("AverageValue", "0.5")
    assert monitoring.metric_names(r["metadata"]["query"]) == {"vllm:request_success_total"}
    # ... and the mean KV cache usage (saturation) compared as a value. GPU utilisation is
    # no scaling signal: vLLM keeps it near 100% with one request in flight.
    assert (k["metricType"], k["metadata"]["threshold"]) == ("Value", "0.8")
    assert monitoring.metric_names(k["metadata"]["query"]) == {"vllm:kv_cache_usage_perc"}
    assert k["metadata"]["query"].startswith("avg(")
    for t in trig.values():
        assert not monitoring.metric_names(t["metadata"]["query"]) & {"DCGM_FI_DEV_GPU_UTIL"}


def test_queries_select_only_this_release():
    ctx = ctx_for("dev", serving__namespace="llm-a")
    for t in scaled_object(ctx)["spec"]["triggers"]:
        assert 'namespace="llm-a"' in t["metadata"]["query"]


def test_disabled_renders_nothing():
    assert autoscaling.render(ctx_for("dev", autoscaling__enabled=False)) == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_autoscaler_cannot_ask_for_more_than_the_pool_holds(stack):
    """max_replicas plus a rollout's surge fit the GPU pool at max_nodes in every stack, so
    neither a scale-out nor a rollout while scaled out waits for nodes that cannot come."""
    ctx = ctx_for(stack)
    s = ctx.settings
    pool = s.cluster.gpu_pools[s.serving.gpu_pool]
    per_node = ctx.gpus_per_node
    top = scaled_object(ctx)["spec"]["maxReplicaCount"] + ctx.plan.rollout.surge
    if ctx.multi_node:
        assert top * ctx.engine.nodes <= pool.max_nodes
    else:
        assert top * ctx.engine.total_gpus <= pool.max_nodes * per_node


def test_a_pool_too_small_for_max_replicas_and_surge_is_refused():
    from stacks import SettingsError

    with pytest.raises(SettingsError, match=r"autoscaling.max_replicas: 4 replica\(s\) \(2 nodes each\) \+ a "
                                            r"rollout surge of 1 need room for 5 replicas, but pool h20 holds 4"):
        ctx_for("prod", autoscaling__max_replicas=4)
    # Without surge (one group replaced at a time) four groups fit the eight nodes.
    assert ctx_for("prod", autoscaling__max_replicas=4, rollout__max_surge=0)
    with pytest.raises(SettingsError, match=r"autoscaling.max_replicas: 4 .* pool a10 holds 3"):
        ctx_for("dev", autoscaling__max_replicas=4)


@pytest.mark.parametrize("stack", STACKS)
def test_a_blind_autoscaler_holds_the_fleet_instead_of_scaling_to_min(stack):
    """Without `fallback`, and with empty answers read as 0 (KEDA's ignoreNullValues default),
    a Prometheus that lost the engines' series scaled the fleet to its minimum on no data."""
    ctx = ctx_for(stack, autoscaling__fallback_after_failures=5)
    spec = scaled_object(ctx)["spec"]
    assert spec["fallback"] == {"failureThreshold": 5, "replicas": spec["minReplicaCount"],
                                "behavior": "currentReplicasIfHigher"}  # max(current, minimum)
    for t in spec["triggers"]:
        assert t["metadata"]["ignoreNullValues"] == "false", t["name"]  # empty is a failure
    validate_all([scaled_object(ctx)], ctx.settings.cluster.kubernetes_version)


def test_fallback_keeps_an_explicit_minimum():
    spec = scaled_object(ctx_for("staging", autoscaling__min_replicas=3))["spec"]
    assert spec["fallback"]["replicas"] == spec["minReplicaCount"] == 3
    assert spec["fallback"]["failureThreshold"] == 3  # the settings' default


def test_a_misspelt_fallback_field_fails_the_keda_schema():
    obj = scaled_object(ctx_for("dev"))
    obj["spec"]["fallback"]["failureTreshold"] = obj["spec"]["fallback"].pop("failureThreshold")
    with pytest.raises(AssertionError, match="failureTreshold"):
        validate_all([obj])
