"""The in-cluster gateway: schema-valid objects whose values come from the settings."""

from __future__ import annotations

import math

import pytest

import stacks
from tests.k8s_schema import known_kinds, validate
from workloads.edge import gateway
from stacks.plan import build_plan
from workloads.engine.context import build_context
from stacks.constants import HTTP_PORT, ENTRY_NAMESPACE, entry_service
from stacks.sections.gateway import KEEPALIVE_MARGIN_SECONDS, TRITON_KEEPALIVE_SECONDS
from workloads.engine import manifests

ENVS = ("dev", "staging", "prod")


def _ctx(settings):
    return build_context(build_plan(settings), image_repository="r.example/x/y")


@pytest.fixture(scope="module", params=ENVS)
def ctx(request):
    return _ctx(stacks.load(request.param))


def _with(settings, **sections):
    """A copy of the settings with some sections' fields replaced (validated again)."""
    data = settings.model_dump()
    for section, fields in sections.items():
        node = data
        *path, last = section.split(".")
        for key in path:
            node = node[key]
        node[last] = {**node[last], **fields}
    return type(settings).model_validate(data)


def _one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def test_every_object_is_schema_valid(ctx):
    kinds = {obj["kind"] for obj in gateway.render(ctx)}
    assert "EnvoyProxy" in kinds and ("gateway.envoyproxy.io", "EnvoyProxy") in known_kinds()
    for obj in gateway.render(ctx):
        validate(obj, ctx.settings.cluster.kubernetes_version)


def test_route_weights_come_from_settings_and_add_to_100(ctx):
    route = _one(gateway.render(ctx), "HTTPRoute")
    split = next(r for r in route["spec"]["rules"] if r["name"] == gateway.SPLIT_RULE)
    weights = {b["name"]: b["weight"] for b in split["backendRefs"]}
    w = ctx.settings.gateway.canary_weight
    assert weights == {gateway.stable_backend(ctx): 100 - w, ctx.canary_service: w}
    assert sum(weights.values()) == 100
    assert all(b["port"] == HTTP_PORT for b in split["backendRefs"])


def _without_argo(settings):
    return _with(settings, rollout={"enabled": False})


def test_weights_follow_any_canary_weight_without_argo():
    base = _without_argo(stacks.load("dev"))
    for w in (0, 37, 100):
        ctx = _ctx(_with(base, gateway={"canary_weight": w}))
        assert gateway.route_weights(ctx) == (100 - w, w)


def test_without_argo_the_ab_header_has_a_static_rule_to_the_canary():
    ctx = _ctx(_without_argo(stacks.load("staging")))
    route = _one(gateway.render(ctx), "HTTPRoute")
    ab = route["spec"]["rules"][0]
    assert ab["name"] == gateway.AB_RULE  # first: more specific than the weighted rule
    header = ab["matches"][0]["headers"][0]
    assert header == {"type": "Exact", "name": ctx.settings.gateway.ab_header.name,
                      "value": ctx.settings.gateway.ab_header.value}
    assert [b["name"] for b in ab["backendRefs"]] == [ctx.canary_service]
    assert gateway.ignored_changes(ctx, route) == []  # nobody else edits this route


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_with_argo_no_rule_is_canary_only(stack):
    """Argo's gatewayAPI plugin takes a rule whose only backend is the canary Service for
    one of its own header routes: it re-weights it, or deletes it when a rollout ends. So
    while Argo manages the split the route holds only the weighted rule, and the A/B rule
    is Argo's managed header route (tests/test_rollout.py)."""
    ctx = _ctx(stacks.load(stack))
    assert ctx.plan.rollout.argo
    route = _one(gateway.render(ctx), "HTTPRoute")
    assert [r["name"] for r in route["spec"]["rules"]] == [gateway.SPLIT_RULE]
    for rule in route["spec"]["rules"]:
        assert {b["name"] for b in rule["backendRefs"]} != {ctx.canary_service}


def test_pulumi_leaves_argos_weights_alone():
    ctx = _ctx(stacks.load("staging"))
    route = _one(gateway.render(ctx), "HTTPRoute")
    assert gateway.ignored_changes(ctx, route) == ["spec.rules[*].backendRefs[*].weight"]
    assert gateway.ignored_changes(ctx, _one(gateway.render(ctx), "Gateway")) == []
    prod = _ctx(stacks.load("prod"))  # multi-node: no Argo, the settings own the weights
    assert gateway.ignored_changes(prod, _one(gateway.render(prod), "HTTPRoute")) == []


def test_custom_ab_header_is_used():
    ctx = _ctx(_with(_without_argo(stacks.load("dev")), **{"gateway.ab_header": {"name": "x-try-b", "value": "yes"}}))
    route = _one(gateway.render(ctx), "HTTPRoute")
    assert route["spec"]["rules"][0]["matches"][0]["headers"][0]["name"] == "x-try-b"
    assert route["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] == "yes"


def test_streams_have_no_total_timeout_only_an_idle_one(ctx):
    """A total route timeout cut every generation at 600 s, mid-stream, with no [DONE].
    No route has one; the idle budget bounds a silent request (all of a non-streamed one)."""
    idle = f"{ctx.settings.gateway.request_timeout_seconds}s"
    objs = gateway.render(ctx)
    route = _one(objs, "HTTPRoute")
    assert {r["timeouts"]["request"] for r in route["spec"]["rules"]} == {"0s"}  # Gateway API: 0s disables
    http = _one(objs, "BackendTrafficPolicy")["spec"]["timeout"]["http"]
    assert (http["requestTimeout"], http["streamIdleTimeout"]) == ("0s", idle)
    assert _one(objs, "ClientTrafficPolicy")["spec"]["timeout"]["http"]["streamIdleTimeout"] == idle
    for kind in ("HTTPRoute", "BackendTrafficPolicy", "ClientTrafficPolicy"):
        validate(_one(objs, kind))


def test_proxy_drain_follows_the_drain_budget_not_a_request_timeout():
    s = _with(stacks.load("prod"), **{"serving": {"inflight_drain_seconds": 300}, "gateway": {"request_timeout_seconds": 900}})
    objs = gateway.render(_ctx(s))
    assert _one(objs, "EnvoyProxy")["spec"]["shutdown"]["drainTimeout"] == "300s"


def test_jwt_from_settings(ctx):
    auth = ctx.settings.serving.auth
    sp = _one(gateway.render(ctx), "SecurityPolicy")
    assert sp["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": ctx.release}]
    (provider,) = sp["spec"]["jwt"]["providers"]
    assert provider["issuer"] == auth.issuer
    assert provider["audiences"] == auth.audiences
    assert provider["remoteJWKS"]["uri"] == auth.jwks_uri
    assert provider["claimToHeaders"] == [{"claim": auth.consumer_claim, "header": gateway.CONSUMER_HEADER}]


def test_consumer_header_cannot_be_forged(ctx):
    ctp = _one(gateway.render(ctx), "ClientTrafficPolicy")
    assert gateway.CONSUMER_HEADER in ctp["spec"]["headers"]["earlyRequestHeaders"]["remove"]
    assert ctp["spec"]["targetRefs"][0]["kind"] == "Gateway"


def test_disabled_auth_renders_no_security_policy_and_no_rate_limit():
    ctx = _ctx(_with(stacks.load("prod"), **{"serving.auth": {"enabled": False}}))
    objs = gateway.render(ctx)
    assert not [o for o in objs if o["kind"] == "SecurityPolicy"]
    assert "rateLimit" not in _one(objs, "BackendTrafficPolicy")["spec"]
    for obj in objs:
        if obj["kind"] != "EnvoyProxy":  # see test_envoy_proxy_schema
            validate(obj)


def test_default_limit_for_every_consumer(ctx):
    rl = ctx.settings.serving.rate_limits
    rules = _one(gateway.render(ctx), "BackendTrafficPolicy")["spec"]["rateLimit"]["global"]["rules"]
    default = rules[0]
    headers = default["clientSelectors"][0]["headers"]
    assert headers[0] == {"name": gateway.CONSUMER_HEADER, "type": "Distinct"}
    assert default["limit"] == {"requests": rl.requests, "unit": rl.unit}
    assert len(rules) == 1 + len(rl.consumers)


def test_staging_override_is_exempt_from_the_default():
    ctx = _ctx(stacks.load("staging"))
    (override,) = ctx.settings.serving.rate_limits.consumers
    rules = gateway.rate_limit_rules(ctx)
    default_headers = rules[0]["clientSelectors"][0]["headers"]
    assert {"name": gateway.CONSUMER_HEADER, "type": "Exact", "value": override.consumer, "invert": True} in default_headers
    assert rules[1] == {
        "clientSelectors": [{"headers": [{"name": gateway.CONSUMER_HEADER, "type": "Exact", "value": override.consumer}]}],
        "limit": {"requests": override.requests, "unit": override.unit},
    }


def test_a_local_backstop_caps_each_proxy_while_the_global_limit_fails_open():
    """The global limit fails open (no single pod stops the API); each proxy's local count
    over all consumers is what holds while Redis or the rate-limit service is gone."""
    s = stacks.load("staging")
    rl = s.serving.rate_limits
    same_unit = [c.requests for c in rl.consumers if c.unit == rl.unit]
    bt = _one(gateway.render(_ctx(s)), "BackendTrafficPolicy")
    (rule,) = bt["spec"]["rateLimit"]["local"]["rules"]
    assert "clientSelectors" not in rule  # every request of the route, whoever sends it
    assert rule["limit"] == {"requests": 10 * max([rl.requests, *same_unit]), "unit": rl.unit}
    validate(bt)
    s = _with(s, **{"serving.rate_limits": {"backstop_requests": 5000}})
    bt = _one(gateway.render(_ctx(s)), "BackendTrafficPolicy")
    assert bt["spec"]["rateLimit"]["local"]["rules"][0]["limit"]["requests"] == 5000


def test_rate_limits_can_be_turned_off():
    ctx = _ctx(_with(stacks.load("staging"), **{"serving.rate_limits": {"enabled": False}}))
    assert "rateLimit" not in _one(gateway.render(ctx), "BackendTrafficPolicy")["spec"]


def test_entry_service_selects_our_proxies(ctx):
    svc = _one(gateway.render(ctx), "Service")
    assert svc["metadata"]["name"] == entry_service(ctx.release)
    assert svc["metadata"]["namespace"] == ENTRY_NAMESPACE
    sel = svc["spec"]["selector"]
    assert sel[gateway.OWNING_GATEWAY_NAME] == _one(gateway.render(ctx), "Gateway")["metadata"]["name"]
    assert sel[gateway.OWNING_GATEWAY_NAMESPACE] == ctx.namespace
    (port,) = svc["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (80, 10080)


def test_edge_targets_the_entry_service(ctx):
    (up,) = ctx.plan.edge.upstreams
    svc = _one(gateway.render(ctx), "Service")
    assert (up.namespace, up.service, up.port) == (
        svc["metadata"]["namespace"], svc["metadata"]["name"], svc["spec"]["ports"][0]["port"])


def test_gateway_listener_and_class(ctx):
    objs = gateway.render(ctx)
    gw, gc = _one(objs, "Gateway"), _one(objs, "GatewayClass")
    assert gw["spec"]["gatewayClassName"] == gc["metadata"]["name"]
    assert gc["spec"]["controllerName"] == "gateway.envoyproxy.io/gatewayclass-controller"
    assert "namespace" not in gc["metadata"]
    (listener,) = gw["spec"]["listeners"]
    assert (listener["protocol"], listener["port"]) == ("HTTP", 80)
    route = _one(objs, "HTTPRoute")
    assert route["spec"]["parentRefs"] == [{"name": gw["metadata"]["name"], "sectionName": listener["name"]}]
    proxy = _one(objs, "EnvoyProxy")
    assert gw["spec"]["infrastructure"]["parametersRef"]["name"] == proxy["metadata"]["name"]
    assert proxy["spec"]["provider"]["kubernetes"]["envoyService"]["type"] == "ClusterIP"
    assert proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]["replicas"] >= ctx.settings.serving.gateway_replicas


def test_no_in_cluster_gateway_renders_nothing():
    ctx = _ctx(_with(stacks.load("prod"), serving={"in_cluster_gateway": False}))
    assert gateway.render(ctx) == []


# --------------------------------------------------------------------------- proxy sizing
# Envoy Gateway's defaults when a field is not rendered (envoyproxy/gateway v1.9.0 CRDs:
# circuitBreaker.* default 1024; BackendTrafficPolicy connectionIdleTimeout "Default: 1 hour").
EG_DEFAULT_BREAKER = 1024
EG_DEFAULT_UPSTREAM_IDLE_S = 3600
VLLM_DEFAULT_KEEPALIVE_S = 5  # vllm/envs.py VLLM_HTTP_TIMEOUT_KEEP_ALIVE


def _planned(ctx) -> int:
    """Requests the engines run at once at the autoscaler's ceiling, from the settings and
    the engine plan: replicas x data-parallel engines x max_num_seqs (each engine)."""
    a = ctx.settings.autoscaling
    replicas = a.max_replicas if a.enabled else ctx.settings.serving.replicas
    return replicas * ctx.engine.data_parallel_size * ctx.engine.max_num_seqs


def _proxies(objs) -> int:
    return _one(objs, "EnvoyProxy")["spec"]["provider"]["kubernetes"]["envoyDeployment"]["replicas"]


def _breaker(objs) -> dict:
    spec = _one(objs, "BackendTrafficPolicy")["spec"]
    return {k: spec.get("circuitBreaker", {}).get(k, EG_DEFAULT_BREAKER)
            for k in ("maxConnections", "maxPendingRequests", "maxParallelRequests")}


def test_the_breaker_admits_the_planned_concurrency_with_one_proxy_down(ctx):
    """Envoy Gateway's default breaker (1,024 per proxy, 2 proxies) sat below prod's
    3 x 16 x 256 sequences: the overflow was a 503 for requests the engines had room for."""
    objs = gateway.render(ctx)
    n, b = _proxies(objs), _breaker(objs)
    assert n >= 2 and (n - 1) * b["maxConnections"] >= _planned(ctx)
    p = ctx.settings.gateway.proxies
    want = _planned(ctx) * p.breaker_headroom
    # vLLM speaks HTTP/1.1: one upstream connection per request in flight
    assert b["maxConnections"] == b["maxParallelRequests"] == b["maxPendingRequests"]
    assert (n - 1) * b["maxConnections"] >= want
    # and no more than needed: the breaker still sheds load past the headroom
    assert (n - 1) * (b["maxConnections"] - 1) < want
    assert b["maxConnections"] <= max(p.requests_per_proxy, math.ceil(want))
    validate(_one(objs, "BackendTrafficPolicy"))


def test_prod_needs_more_than_envoy_gateways_default():
    # prod's engines as they ran before max_num_seqs followed the workload (256 sequences each),
    # kept possible by a chat workload short enough for the KV cache to hold them
    ctx = _ctx(_with(stacks.load("prod"), **{"serving.engine": {"max_num_seqs": 256},
                                               "serving.workload": {"input_tokens": 2048, "output_tokens": 1024}}))
    assert _planned(ctx) == 3 * 16 * 256 > 2 * EG_DEFAULT_BREAKER  # the defect, in the plan's numbers
    objs = gateway.render(ctx)
    assert (_proxies(objs) - 1) * _breaker(objs)["maxConnections"] >= 2 * _planned(ctx)


def test_the_proxy_count_follows_the_plan_and_the_per_proxy_load():
    base = stacks.load("dev")
    ctx = _ctx(base)
    assert _proxies(gateway.render(ctx)) == base.serving.gateway_replicas  # 240 admitted fit two
    small = _ctx(_with(base, **{"gateway.proxies": {"requests_per_proxy": 64}}))
    want = _planned(small) * small.settings.gateway.proxies.breaker_headroom
    objs = gateway.render(small)
    assert _proxies(objs) == math.ceil(want / 64) + 1  # one spare for a drained proxy
    assert _breaker(objs)["maxConnections"] <= 64
    more = _ctx(_with(base, **{"autoscaling": {"max_replicas": 1}, "gateway.proxies": {"breaker_headroom": 4.0}}))
    assert _breaker(gateway.render(more))["maxConnections"] == 4 * 1 * more.engine.max_num_seqs


def test_proxies_have_a_pdb_and_spread_over_nodes_and_zones(ctx):
    objs = gateway.render(ctx)
    k8s = _one(objs, "EnvoyProxy")["spec"]["provider"]["kubernetes"]
    assert k8s["envoyPDB"] == {"maxUnavailable": 1}  # the breaker is sized for one proxy down
    deployment = k8s["envoyDeployment"]
    assert deployment["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    spread = {c["topologyKey"]: c for c in deployment["pod"]["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert spread["kubernetes.io/hostname"]["whenUnsatisfiable"] == "DoNotSchedule"
    # the constraints count the proxies: the same labels the entry Service selects them by
    entry_selector = _one(objs, "Service")["spec"]["selector"]
    for c in spread.values():
        assert c["labelSelector"] == {"matchLabels": entry_selector}
        assert c["maxSkew"] == 1
        # tainted GPU nodes hold no proxy and must not count as empty domains
        assert c["nodeTaintsPolicy"] == "Honor"
    validate(_one(objs, "EnvoyProxy"), ctx.settings.cluster.kubernetes_version)


def test_a_misspelt_pdb_field_fails_the_envoy_proxy_schema(ctx):
    proxy = _one(gateway.render(ctx), "EnvoyProxy")
    k8s = proxy["spec"]["provider"]["kubernetes"]
    k8s["envoyPdb"] = k8s.pop("envoyPDB")
    with pytest.raises(AssertionError, match="envoyPdb"):
        validate(proxy)


def _engine_env(ctx) -> dict[str, str]:
    workload = next(o for o in manifests.render(ctx, "trn") if o["kind"] in ("Deployment", "LeaderWorkerSet"))
    spec = workload["spec"]
    tmpl = spec["leaderWorkerTemplate"]["leaderTemplate"] if workload["kind"] == "LeaderWorkerSet" else spec["template"]
    return {e["name"]: e.get("value") for e in tmpl["spec"]["containers"][0]["env"]}


def _seconds(duration: str) -> int:
    assert duration.endswith("s"), duration
    return int(duration[:-1])


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "triton-example"])
def test_engines_keep_idle_connections_longer_than_the_proxies(stack):
    """The proxies must close an idle upstream connection before the engine does, or they
    send a request on a connection the engine is closing (a reset after the request left
    the gateway). Envoy Gateway's default is 1 h, vLLM's and Triton's 5 s."""
    ctx = _ctx(stacks.load(stack))
    http = _one(gateway.render(ctx), "BackendTrafficPolicy")["spec"]["timeout"]["http"]
    proxy_idle = _seconds(http.get("connectionIdleTimeout", f"{EG_DEFAULT_UPSTREAM_IDLE_S}s"))
    if ctx.settings.serving.server == "triton":
        engine = TRITON_KEEPALIVE_SECONDS  # fixed in Triton's frontend
        assert "VLLM_HTTP_TIMEOUT_KEEP_ALIVE" not in _engine_env(ctx)
    else:
        engine = int(_engine_env(ctx).get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", VLLM_DEFAULT_KEEPALIVE_S))
        assert engine == ctx.settings.gateway.proxies.engine_keepalive_seconds
    assert proxy_idle == engine - KEEPALIVE_MARGIN_SECONDS > 0


def test_one_number_sets_both_sides_of_the_keepalive():
    ctx = _ctx(_with(stacks.load("staging"), **{"gateway.proxies": {"engine_keepalive_seconds": 120}}))
    http = _one(gateway.render(ctx), "BackendTrafficPolicy")["spec"]["timeout"]["http"]
    assert _engine_env(ctx)["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "120"
    assert http["connectionIdleTimeout"] == f"{120 - KEEPALIVE_MARGIN_SECONDS}s"


def test_a_keepalive_the_margin_would_use_up_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="engine_keepalive_seconds"):
        _with(stacks.load("dev"), **{"gateway.proxies": {"engine_keepalive_seconds": KEEPALIVE_MARGIN_SECONDS}})
