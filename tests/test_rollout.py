"""The Argo Rollout and its AnalysisTemplate: schemas, steps and thresholds from settings."""

from __future__ import annotations

import pytest

from k8s_schema import validate_all
from test_autoscaling import ctx_for
from workloads.observability import monitoring
from workloads.engine import rollout


def objects(ctx) -> dict[str, dict]:
    return {o["kind"]: o for o in rollout.render(ctx)}


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_objects_pass_the_argo_crd_schemas(stack):
    ctx = ctx_for(stack)
    objs = rollout.render(ctx)
    assert sorted(o["kind"] for o in objs) == ["AnalysisTemplate", "Rollout"]
    validate_all(objs, ctx.settings.cluster.kubernetes_version)


def test_a_misspelt_field_fails_the_schema():
    ro = objects(ctx_for("dev"))["Rollout"]
    ro["spec"]["strategy"]["canary"]["stableSvc"] = ro["spec"]["strategy"]["canary"].pop("stableService")
    with pytest.raises(AssertionError, match="stableSvc"):
        validate_all([ro])


def test_rollout_references_the_deployment_and_the_two_services():
    ctx = ctx_for("dev")
    spec = objects(ctx)["Rollout"]["spec"]
    assert spec["workloadRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": ctx.release,
                                   "scaleDown": "progressively"}
    assert "template" not in spec  # the pod template lives only in the Deployment
    canary = spec["strategy"]["canary"]
    assert (canary["canaryService"], canary["stableService"]) == (ctx.canary_service, ctx.stable_service)
    assert canary["trafficRouting"]["plugins"] == {"argoproj-labs/gatewayAPI": {
        "httpRoutes": [{"name": ctx.release, "useHeaderRoutes": True}], "namespace": ctx.namespace}}
    # The stable shrinks as the canary grows: a rollout needs one replica of room, not two fleets.
    assert canary["dynamicStableScale"] is True


def test_steps_come_from_settings():
    ctx = ctx_for("dev", rollout__steps=[10, 25, 60, 100], rollout__pause_seconds=900)
    steps = objects(ctx)["Rollout"]["spec"]["strategy"]["canary"]["steps"]
    assert "setHeaderRoute" in steps.pop(1)  # the A/B route, once the first canary pods exist
    assert steps == [
        {"setWeight": 10}, {"pause": {"duration": "900s"}},
        {"setWeight": 25}, {"pause": {"duration": "900s"}},
        {"setWeight": 60}, {"pause": {"duration": "900s"}},
        {"setWeight": 100},
    ]


def test_background_analysis_starts_with_the_first_weight_on_the_canary_pods():
    ctx = ctx_for("dev")
    analysis = objects(ctx)["Rollout"]["spec"]["strategy"]["canary"]["analysis"]
    assert analysis["templates"] == [{"templateName": rollout.template_name(ctx)}]
    steps = objects(ctx)["Rollout"]["spec"]["strategy"]["canary"]["steps"]
    assert "setWeight" in steps[analysis["startingStep"] - 1]
    assert analysis["args"] == [{"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}}]
    # The template declares the argument the Rollout passes, and both queries use it.
    tmpl = objects(ctx)["AnalysisTemplate"]
    assert tmpl["metadata"]["name"] == rollout.template_name(ctx)
    assert tmpl["spec"]["args"] == [{"name": "canary-hash"}]
    for m in tmpl["spec"]["metrics"]:
        assert f'{monitoring.ROLLOUT_HASH_LABEL}="{{{{args.canary-hash}}}}"' in m["provider"]["prometheus"]["query"]


def test_abort_thresholds_come_from_settings():
    ctx = ctx_for("dev", rollout__max_error_rate=0.005, rollout__max_p99_latency_seconds=12.5,
                  rollout__failure_limit=3, rollout__analysis_interval_seconds=30,
                  monitoring__prometheus_url="http://prom.example:9090")
    metrics = {m["name"]: m for m in objects(ctx)["AnalysisTemplate"]["spec"]["metrics"]}
    assert metrics["error-rate"]["successCondition"] == "result[0] <= 0.005"
    assert metrics["p99-latency"]["successCondition"] == "result[0] <= 12.5"
    for m in metrics.values():
        assert m["failureLimit"] == 3
        assert m["interval"] == "30s"
        assert m["provider"]["prometheus"]["address"] == "http://prom.example:9090"
    assert monitoring.metric_names(metrics["error-rate"]["provider"]["prometheus"]["query"]) == {
        "http_requests_total"}
    assert monitoring.metric_names(metrics["p99-latency"]["provider"]["prometheus"]["query"]) == {
        "vllm:e2e_request_latency_seconds_bucket"}


def test_replicas_left_to_keda_when_autoscaling():
    assert "replicas" not in objects(ctx_for("dev"))["Rollout"]["spec"]
    ctx = ctx_for("dev", autoscaling__enabled=False, serving__replicas=2)
    assert objects(ctx)["Rollout"]["spec"]["replicas"] == 2


def test_progress_deadline_covers_a_model_load():
    ctx = ctx_for("dev", serving__startup_timeout_seconds=2400)
    spec = objects(ctx)["Rollout"]["spec"]
    assert spec["progressDeadlineSeconds"] > 2400 and spec["progressDeadlineAbort"] is True


def test_no_rollout_when_disabled_or_multi_node():
    assert rollout.render(ctx_for("dev", rollout__enabled=False)) == []
    prod = ctx_for("prod")
    assert prod.multi_node and prod.settings.rollout.enabled and not prod.plan.rollout.argo
    assert rollout.render(prod) == []


def test_the_route_argo_edits_exists_and_splits_between_the_two_services():
    from workloads.edge import gateway

    ctx = ctx_for("dev")
    plugin = objects(ctx)["Rollout"]["spec"]["strategy"]["canary"]["trafficRouting"]["plugins"][
        rollout.GATEWAY_API_PLUGIN]
    (ref,) = plugin["httpRoutes"]
    routes = [o for o in gateway.render(ctx) if o["kind"] == "HTTPRoute"
              and o["metadata"]["name"] == ref["name"] and o["metadata"]["namespace"] == plugin["namespace"]]
    assert len(routes) == 1
    backends = [{b["name"] for b in rule.get("backendRefs", [])} for rule in routes[0]["spec"]["rules"]]
    assert backends == [{ctx.stable_service, ctx.canary_service}]


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_ab_header_routing_is_an_argo_managed_route_that_survives_a_rollout(stack):
    """The A/B header reaches the canary through a header route Argo adds when a rollout
    starts and removes when it ends (promoted or aborted): the header then follows the
    weighted rule like any request, instead of hitting a canary backend Argo set to 0."""
    from workloads.edge import gateway

    ctx = ctx_for(stack)
    canary = objects(ctx)["Rollout"]["spec"]["strategy"]["canary"]
    ab = ctx.settings.gateway.ab_header
    assert canary["trafficRouting"]["managedRoutes"] == [{"name": gateway.AB_RULE}]
    # right after the first weight, so the canary Service has pods when the header route appears
    assert "setWeight" in canary["steps"][0]
    assert canary["steps"][1] == {"setHeaderRoute": {"name": gateway.AB_RULE, "match": [
        {"headerName": ab.name, "headerValue": {"exact": ab.value}}]}}
    assert sum("setHeaderRoute" in st for st in canary["steps"]) == 1
    assert canary["trafficRouting"]["plugins"][rollout.GATEWAY_API_PLUGIN]["httpRoutes"][0]["useHeaderRoutes"]
    # Argo's header route copies the matches of the rule holding both backends: /v1/ plus the header.
    route = next(o for o in gateway.render(ctx) if o["kind"] == "HTTPRoute")
    (split,) = route["spec"]["rules"]
    assert split["matches"] == [{"path": {"type": "PathPrefix", "value": gateway.API_PREFIX}}]
    # The request timeout reaches Argo's rule too: it is a policy on the whole route.
    btp = next(o for o in gateway.render(ctx) if o["kind"] == "BackendTrafficPolicy")
    assert btp["spec"]["targetRefs"][0]["name"] == route["metadata"]["name"]


# --------------------------------------------------------------------------- multi-node canary


def _matches(selector: dict, labels: dict) -> bool:
    """A Service's equality selector against a pod's labels (Kubernetes semantics)."""
    return all(labels.get(k) == v for k, v in selector.items())


def _group_labels(ctx) -> tuple[dict, dict]:
    """(leader, worker) pod labels of the groups this LeaderWorkerSet template starts."""
    from workloads.engine import manifests

    lws = next(o for o in manifests.render(ctx, "trn") if o["kind"] == "LeaderWorkerSet")
    t = lws["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"]["metadata"]["labels"], t["workerTemplate"]["metadata"]["labels"]


def _service_selectors(ctx) -> dict[str, dict]:
    from workloads.engine import manifests

    return {o["metadata"]["name"]: o["spec"]["selector"] for o in manifests.render(ctx, "trn") if o["kind"] == "Service"}


def test_a_staged_multi_node_release_has_a_canary_service_of_its_own():
    """prod's canary Service selected the same leaders as stable, so the A/B header and the
    canary weight reached every group alike. During a staged release (groups below the
    partition keep the template they started with) each Service selects its own groups."""
    before = ctx_for("prod")  # the groups running when the staged release begins
    staged = ctx_for("prod", rollout__partition=1, serving__image__tag="v0.33.0-dsv1")
    old_leader, old_worker = _group_labels(before)
    new_leader, new_worker = _group_labels(staged)
    sel = _service_selectors(staged)
    stable, canary = sel[staged.stable_service], sel[staged.canary_service]
    assert stable != canary
    assert _matches(stable, old_leader) and not _matches(stable, new_leader)
    assert _matches(canary, new_leader) and not _matches(canary, old_leader)
    for worker in (old_worker, new_worker):  # workers answer no HTTP
        assert not _matches(stable, worker) and not _matches(canary, worker)
    # the A/B header's static rule (no Argo on a LeaderWorkerSet) goes to the canary Service
    from workloads.edge import gateway

    route = next(o for o in gateway.render(staged) if o["kind"] == "HTTPRoute")
    ab = next(r for r in route["spec"]["rules"] if r["name"] == gateway.AB_RULE)
    assert [b["name"] for b in ab["backendRefs"]] == [staged.canary_service]


def test_without_a_partition_both_services_select_every_leader():
    """No canary exists: a plain rolling update's old and new groups both serve, through
    either Service (as Argo's Services do between rollouts)."""
    before = ctx_for("prod")
    after = ctx_for("prod", serving__image__tag="v0.33.0-dsv1")
    sel = _service_selectors(after)
    assert sel[after.stable_service] == sel[after.canary_service]
    for ctx in (before, after):
        leader, worker = _group_labels(ctx)
        assert all(_matches(s, leader) and not _matches(s, worker) for s in sel.values())


def test_argo_stacks_leave_the_narrowing_to_argo():
    ctx = ctx_for("staging")
    sel = _service_selectors(ctx)
    assert sel[ctx.stable_service] == sel[ctx.canary_service]
    assert not any(k.endswith("/track") for s in sel.values() for k in s)
