"""The in-cluster gateway: Envoy Gateway in front of vLLM, with JWT auth and rate limits.

    APIG edge (TLS, A/B header, retries) -> entry Service (ENTRY_NAMESPACE, port 80)
      -> Envoy proxy pods of our Gateway (JWT, per-consumer rate limit)
      -> HTTPRoute: A/B header -> canary; otherwise stable/canary by weight
      -> vLLM pods (port 8000)

TLS terminates at the APIG edge; the hop from the edge to the proxies stays inside the
VPC, so the Gateway listens on plain HTTP port 80.

The APIG provider has no JWT, consumer or rate-limit resources (FACTS.md), which is why
they live here. With `serving.in_cluster_gateway` false nothing is rendered and the edge
splits traffic itself (`StackPlan.edge.upstreams`).
"""

from __future__ import annotations

import math
from pathlib import Path
from string import Template

from stacks.constants import CONSUMER_HEADER, ENTRY_NAMESPACE, HTTP_PORT, entry_service
from workloads.supply_chain import mirror
from workloads.observability import telemetry
from workloads.engine.context import ServingContext
from stacks.sections.gateway import KEEPALIVE_MARGIN_SECONDS, TRITON_KEEPALIVE_SECONDS
from stacks.sections.serving import has_token_budget

GATEWAY_API = "gateway.networking.k8s.io/v1"
ENVOY_GATEWAY_API = "gateway.envoyproxy.io/v1alpha1"

# Our own GatewayClass (the Envoy Gateway quickstart's is "eg"; a distinct name keeps a
# quickstart install on the same cluster from colliding with ours).
GATEWAY_CLASS = "envoy-gateway"
CONTROLLER_NAME = "gateway.envoyproxy.io/gatewayclass-controller"

LISTENER = "http"
LISTENER_PORT = 80
# Envoy Gateway binds listeners below 1024 at port + 10000 so the proxy needs no
# CAP_NET_BIND_SERVICE (envoyproxy/gateway internal/gatewayapi: wellKnownPortShift = 10000).
PROXY_CONTAINER_PORT = LISTENER_PORT + 10000

# Labels Envoy Gateway puts on the proxy Deployment/pods of a Gateway.
OWNING_GATEWAY_NAME = "gateway.envoyproxy.io/owning-gateway-name"
OWNING_GATEWAY_NAMESPACE = "gateway.envoyproxy.io/owning-gateway-namespace"

# The JWT's consumer claim is copied into CONSUMER_HEADER (stacks/constants.py); it is the
# rate-limit key. Clients cannot set it themselves: the ClientTrafficPolicy strips it
# before any filter runs.

API_PREFIX = "/v1/"
# The A/B header rule. Without Argo Rollouts it is a static rule to the canary Service.
# With Argo it is a rule Argo manages (workloads/engine/rollout.py `setHeaderRoute`): the
# gatewayAPI plugin treats any rule whose only backend is the canary Service as its own
# (it re-weights such rules, or deletes them when a rollout ends), so a static one would
# send header-routed requests to a zero-weight backend, or vanish, after the first rollout.
AB_RULE = "ab-canary"
SPLIT_RULE = "weighted"



def backstop_requests(rl) -> int:
    """Each proxy's local limit while the global one fails open: serving.rate_limits.
    backstop_requests, or 10 x the largest per-consumer limit of the same unit."""
    if rl.backstop_requests is not None:
        return rl.backstop_requests
    return 10 * max([rl.requests] + [c.requests for c in rl.consumers if c.unit == rl.unit])

def gateway_name(ctx: ServingContext) -> str:
    return ctx.release


def proxy_selector(ctx: ServingContext) -> dict[str, str]:
    """Pods of the Envoy proxies Envoy Gateway runs for our Gateway."""
    return {
        "app.kubernetes.io/name": "envoy",
        "app.kubernetes.io/component": "proxy",
        "app.kubernetes.io/managed-by": "envoy-gateway",
        OWNING_GATEWAY_NAME: gateway_name(ctx),
        OWNING_GATEWAY_NAMESPACE: ctx.namespace,
    }


# Timeouts. A request's body says whether it streams, which no route can match on, so no
# route has a total timeout ("0s": none; Envoy's own default of 15 s would cut every
# generation): a stream runs for as long as its chunks keep coming. What bounds a request
# is the idle timeout: a non-streamed completion sends nothing until it is done, so the
# idle budget is its total; a stream's chunks come every token. The length of a stream is
# bounded by the engine's max_tokens ceiling (workloads/engine/engine_args.py).
NO_TOTAL_TIMEOUT = "0s"


def _idle_timeout(ctx: ServingContext) -> str:
    return f"{ctx.settings.gateway.request_timeout_seconds}s"


def _drain_timeout(ctx: ServingContext) -> str:
    return f"{ctx.settings.serving.inflight_drain_seconds}s"


# --------------------------------------------------------------------------- sizing
#
# Envoy's circuit breaker counts per proxy and per upstream cluster (one per route rule);
# Envoy Gateway's default is 1,024 connections, pending and parallel requests. vLLM speaks
# HTTP/1.1, so each request in flight holds one upstream connection: the connection limit
# is the in-flight limit, and the pending limit holds requests waiting for a new
# connection (every burst above the idle pool). Past both, Envoy answers 503 itself
# (`upstream_rq_pending_overflow`, alert GatewayCircuitBreakerOverflow).


def planned_concurrency(ctx: ServingContext) -> int:
    """Requests the engines run at once at the autoscaler's ceiling (the configured
    replicas without autoscaling): replicas x engines per replica (data parallel; each
    engine schedules its own max_num_seqs) x max_num_seqs."""
    a = ctx.settings.autoscaling
    replicas = a.max_replicas if a.enabled else ctx.settings.serving.replicas
    return replicas * ctx.engine.data_parallel_size * ctx.engine.max_num_seqs


def admitted_requests(ctx: ServingContext) -> int:
    """Requests the proxies admit in all: the planned concurrency x breaker headroom; what
    is above the engines' batch waits in their queue, where the autoscaler sees it."""
    return math.ceil(planned_concurrency(ctx) * ctx.settings.gateway.proxies.breaker_headroom)


def proxy_replicas(ctx: ServingContext) -> int:
    """Enough proxies to admit `admitted_requests` at `requests_per_proxy` each with one
    of them gone (the PDB lets one go at a time), and at least serving.gateway_replicas."""
    per_proxy = ctx.settings.gateway.proxies.requests_per_proxy
    return max(ctx.settings.serving.gateway_replicas, math.ceil(admitted_requests(ctx) / per_proxy) + 1)


def breaker_limit(ctx: ServingContext) -> int:
    """Each proxy's breaker: the admitted requests shared by all proxies but one, so the
    fleet admits as much while one proxy is drained, evicted or lost."""
    return math.ceil(admitted_requests(ctx) / (proxy_replicas(ctx) - 1))


def circuit_breaker(ctx: ServingContext) -> dict:
    b = breaker_limit(ctx)
    return {"maxConnections": b, "maxParallelRequests": b, "maxPendingRequests": b}


def engine_keepalive_seconds(ctx: ServingContext) -> int:
    """How long an engine keeps an idle connection: the settings' for vLLM, Triton's fixed 5 s."""
    if ctx.settings.serving.server == "triton":
        return TRITON_KEEPALIVE_SECONDS
    return ctx.settings.gateway.proxies.engine_keepalive_seconds


def upstream_idle_seconds(ctx: ServingContext) -> int:
    """How long a proxy keeps an idle connection to an engine: shorter than the engine's
    keep-alive, so the proxy closes first and never sends on a connection the engine has
    closed (Envoy Gateway's default is 1 h against vLLM's and Triton's 5 s: a request sent
    as the engine closes fails with a reset, after it left the gateway)."""
    return engine_keepalive_seconds(ctx) - KEEPALIVE_MARGIN_SECONDS


def engine_env(ctx: ServingContext) -> list[dict]:
    """The engine's side of the keep-alive ordering (vLLM reads it at start; Triton's
    frontend has no setting for it)."""
    if ctx.settings.serving.server == "triton":
        return []
    return [{"name": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "value": str(engine_keepalive_seconds(ctx))}]


def _target(kind: str, name: str) -> dict:
    return {"group": "gateway.networking.k8s.io", "kind": kind, "name": name}


# --------------------------------------------------------------------------- objects


def gateway_class(ctx: ServingContext) -> dict:
    md = ctx.metadata(GATEWAY_CLASS, "gateway")
    md.pop("namespace")  # cluster-scoped
    return {
        "apiVersion": GATEWAY_API,
        "kind": "GatewayClass",
        "metadata": md,
        "spec": {"controllerName": CONTROLLER_NAME},
    }


def proxy_spread(ctx: ServingContext) -> list[dict]:
    """Proxies over zones where the nodes allow, and never two on a node while another
    node has none: a node's loss takes one proxy. Tainted nodes (GPU nodes, cordoned ones)
    are left out of the count (nodeTaintsPolicy Honor), or their zero would make every
    second proxy on a system node unschedulable."""
    labels = {"matchLabels": proxy_selector(ctx)}
    return [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": labels, "nodeTaintsPolicy": "Honor"},
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": labels, "nodeTaintsPolicy": "Honor"},
    ]


def envoy_proxy(ctx: ServingContext) -> dict:
    """Proxy deployment shape. ClusterIP: the default Service type is LoadBalancer, which on
    VKE would buy a CLB nobody needs (the edge reaches the proxies through the entry
    Service). Drain for the stack's drain budget, as the engines do. As many proxies as
    the planned concurrency needs (`proxy_replicas`), spread over nodes and zones, a PDB
    that lets one go at a time (the breaker is sized for that), and a rolling update that
    starts a new proxy before it stops an old one."""
    return {
        "apiVersion": ENVOY_GATEWAY_API,
        "kind": "EnvoyProxy",
        "metadata": ctx.metadata(f"{ctx.release}-proxy", "gateway"),
        "spec": {
            "provider": {
                "type": "Kubernetes",
                "kubernetes": {
                    # The proxies' image from the stack's mirror (workloads/supply_chain/mirror.py): a
                    # Gateway's EnvoyProxy replaces Envoy Gateway's defaults, so it is set here.
                    "envoyDeployment": {
                        "replicas": proxy_replicas(ctx),
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                        "pod": {"topologySpreadConstraints": proxy_spread(ctx)},
                        "container": {"image": mirror.ref(ctx.plan, "envoy-proxy")},
                    },
                    "envoyPDB": {"maxUnavailable": 1},
                    "envoyService": {"type": "ClusterIP"},
                },
            },
            "shutdown": {"drainTimeout": _drain_timeout(ctx)},
            **({"telemetry": t} if (t := telemetry.envoy_telemetry(ctx)) else {}),
        },
    }


def gateway(ctx: ServingContext) -> dict:
    return {
        "apiVersion": GATEWAY_API,
        "kind": "Gateway",
        "metadata": ctx.metadata(gateway_name(ctx), "gateway"),
        "spec": {
            "gatewayClassName": GATEWAY_CLASS,
            "infrastructure": {
                "parametersRef": {"group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": f"{ctx.release}-proxy"}
            },
            "listeners": [
                {
                    "name": LISTENER,
                    "protocol": "HTTP",
                    "port": LISTENER_PORT,
                    # Only routes of the serving namespace may attach.
                    "allowedRoutes": {"namespaces": {"from": "Same"}},
                }
            ],
        },
    }


def route_weights(ctx: ServingContext) -> tuple[int, int]:
    """(stable, canary) percentages of the weighted rule at deploy time."""
    canary = ctx.settings.gateway.canary_weight
    return 100 - canary, canary


def _backend(name: str, weight: int) -> dict:
    return {"group": "", "kind": "Service", "name": name, "port": HTTP_PORT, "weight": weight}


def stable_backend(ctx: ServingContext) -> str:
    """Where the stable share goes: the routing tier when on (workloads/edge/router.py), which
    picks the engine, else the stable Service of the engines."""
    return ctx.router_service if ctx.routed else ctx.stable_service


def http_route(ctx: ServingContext) -> dict:
    ab = ctx.settings.gateway.ab_header
    stable, canary = route_weights(ctx)
    timeouts = {"request": NO_TOTAL_TIMEOUT}
    path = {"type": "PathPrefix", "value": API_PREFIX}
    rules = []
    if ctx.plan.disaggregation is not None:
        # every request needs a prefill and a decode group, which only the router pairs: no
        # canary track bypasses it (the settings refuse a canary weight)
        rules.append({"name": SPLIT_RULE, "matches": [{"path": path}],
                      "backendRefs": [_backend(ctx.router_service, 100)], "timeouts": timeouts})
        return {"apiVersion": GATEWAY_API, "kind": "HTTPRoute", "metadata": ctx.metadata(ctx.release, "gateway"),
                "spec": {"parentRefs": [{"name": gateway_name(ctx), "sectionName": LISTENER}], "rules": rules}}
    if not ctx.plan.rollout.argo:
        # Requests that opt into the B variant always reach the canary track. (With Argo,
        # Argo adds this rule for the length of a rollout: see AB_RULE.)
        rules.append({
            "name": AB_RULE,
            "matches": [{"path": path, "headers": [{"type": "Exact", "name": ab.name, "value": ab.value}]}],
            "backendRefs": [_backend(ctx.canary_service, 100)],
            "timeouts": timeouts,
        })
    rules.append({
        "name": SPLIT_RULE,
        "matches": [{"path": path}],
        # Both backends are always listed (weight 0 included) so a rollout only has to move
        # weights, never add a backend; Argo's header rule copies this rule's matches.
        "backendRefs": [_backend(stable_backend(ctx), stable), _backend(ctx.canary_service, canary)],
        "timeouts": timeouts,
    })
    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": ctx.metadata(ctx.release, "gateway"),
        "spec": {"parentRefs": [{"name": gateway_name(ctx), "sectionName": LISTENER}], "rules": rules},
    }


# Fields of the HTTPRoute that Argo Rollouts owns while it manages the canary. `pulumi up`
# leaves them as they are live (ignore_changes), so an update during a rollout does not
# reset the weights Argo is moving.
ARGO_MANAGED_ROUTE_FIELDS = ("spec.rules[*].backendRefs[*].weight",)


def ignored_changes(ctx: ServingContext, obj: dict) -> list[str]:
    """Fields of a rendered object that `pulumi up` must not reset (owned by a controller)."""
    if (ctx.plan.rollout.argo and obj["kind"] == "HTTPRoute"
            and obj["metadata"]["name"] == ctx.release):
        return list(ARGO_MANAGED_ROUTE_FIELDS)
    return []


def client_traffic_policy(ctx: ServingContext) -> dict:
    t = _idle_timeout(ctx)
    return {
        "apiVersion": ENVOY_GATEWAY_API,
        "kind": "ClientTrafficPolicy",
        "metadata": ctx.metadata(f"{ctx.release}-clients", "gateway"),
        "spec": {
            "targetRefs": [_target("Gateway", gateway_name(ctx))],
            # Removed before routing and before the JWT filter writes it, so the rate-limit
            # key can only come from a verified token.
            "headers": {
                "earlyRequestHeaders": {"remove": [CONSUMER_HEADER]},
                # Keep the edge's X-Request-ID (the default, Generate, replaces it), so one
                # id names the request in the APIG, gateway and vLLM logs.
                "requestID": "PreserveOrGenerate",
            },
            # Envoy's stream idle timeout defaults to 5 min; a non-streamed completion sends
            # no byte until it is done, so it gets the whole idle budget (see NO_TOTAL_TIMEOUT).
            "timeout": {"http": {"streamIdleTimeout": t}},
        },
    }


def jwks_source(ctx: ServingContext) -> dict:
    """Where the proxies get the provider's signing keys: fetched from `jwks_uri`, or read
    from a ConfigMap of the serving namespace (Envoy Gateway localJWKS, key `jwks`)."""
    auth = ctx.settings.serving.auth
    if auth.jwks_configmap is not None:
        return {"localJWKS": {"type": "ValueRef",
                              "valueRef": {"group": "", "kind": "ConfigMap", "name": auth.jwks_configmap}}}
    return {"remoteJWKS": {"uri": auth.jwks_uri}}


def security_policy(ctx: ServingContext) -> dict:
    auth = ctx.settings.serving.auth
    return {
        "apiVersion": ENVOY_GATEWAY_API,
        "kind": "SecurityPolicy",
        "metadata": ctx.metadata(f"{ctx.release}-jwt", "gateway"),
        "spec": {
            "targetRefs": [_target("HTTPRoute", ctx.release)],
            "jwt": {
                "providers": [
                    {
                        "name": "issuer",
                        "issuer": auth.issuer,
                        "audiences": list(auth.audiences),
                        **jwks_source(ctx),
                        "claimToHeaders": [{"claim": auth.consumer_claim, "header": CONSUMER_HEADER}],
                    }
                ]
            },
        },
    }


# The token budget. The proxies' Lua filter (usage.lua) writes each response's usage
# (prompt + completion tokens) as dynamic metadata under this namespace and key; the
# global rate limit charges it to the consumer when the stream is done (Envoy Gateway
# cost.response from Metadata, translated to hits_addend `%DYNAMIC_METADATA(ns:key)%` with
# apply_on_stream_done) and checks the budget, charging nothing, on each request
# (cost.request Number 0). A consumer past the budget is refused (429) from its next
# request on; the response that crossed it runs to its end. Token budgets rather than a
# cap on concurrent requests: Envoy Gateway's rate limits count hits per window and cannot
# give hits back when a request ends, so no rule of its CRDs (v1.9) caps concurrency per
# consumer, while cost from metadata is in them.
USAGE_NAMESPACE = "deepseek-volc.usage"
USAGE_KEY = "total_tokens"
USAGE_SCRIPT = Path(__file__).with_name("usage.lua")


def usage_script() -> str:
    return Template(USAGE_SCRIPT.read_text()).safe_substitute(namespace=USAGE_NAMESPACE, key=USAGE_KEY)


def token_budget(ctx: ServingContext) -> bool:
    sv = ctx.settings.serving
    return sv.auth.enabled and has_token_budget(sv.rate_limits)


TOKEN_COST = {
    "request": {"from": "Number", "number": 0},
    "response": {"from": "Metadata", "metadata": {"namespace": USAGE_NAMESPACE, "key": USAGE_KEY}},
}


def _consumer_rules(default: tuple[int, str], overrides: list[tuple[str, int, str]], cost: dict | None) -> list[dict]:
    """A default rule for every consumer without an override (Distinct: one counter each),
    and one rule per override."""
    headers = [{"name": CONSUMER_HEADER, "type": "Distinct"}]
    headers += [{"name": CONSUMER_HEADER, "type": "Exact", "value": c, "invert": True} for c, _, _ in overrides]
    extra = {"cost": cost} if cost else {}
    rules = [{"clientSelectors": [{"headers": headers}], "limit": {"requests": default[0], "unit": default[1]}, **extra}]
    for consumer, n, unit in overrides:
        rules.append({
            "clientSelectors": [{"headers": [{"name": CONSUMER_HEADER, "type": "Exact", "value": consumer}]}],
            "limit": {"requests": n, "unit": unit}, **extra,
        })
    return rules


def token_rules(ctx: ServingContext) -> list[dict]:
    """The token budget per consumer (rate_limits.tokens, or a consumer's own), in tokens
    per rate_limits.token_unit; consumers without a budget of their own and no default
    have none."""
    rl = ctx.settings.serving.rate_limits
    if not token_budget(ctx):
        return []
    overrides = [(c.consumer, c.tokens, rl.token_unit) for c in rl.consumers if c.tokens is not None]
    rules = _consumer_rules((rl.tokens or 0, rl.token_unit), overrides, TOKEN_COST)
    return rules if rl.tokens is not None else rules[1:]


def extension_policy(ctx: ServingContext) -> dict:
    """The Lua filter that reads each response's token usage for the token budget."""
    return {
        "apiVersion": ENVOY_GATEWAY_API,
        "kind": "EnvoyExtensionPolicy",
        "metadata": ctx.metadata(f"{ctx.release}-usage", "gateway"),
        "spec": {
            "targetRefs": [_target("HTTPRoute", ctx.release)],
            "lua": [{"type": "Inline", "inline": usage_script()}],
        },
    }


def rate_limit_rules(ctx: ServingContext) -> list[dict]:
    """Global rules keyed on the consumer header.

    Global rules all apply to a request that matches several (Envoy Gateway: "a single
    request might increase the rate limit counters for multiple rules"), so the default
    rule excludes the consumers that have an override; otherwise a consumer granted more
    than the default would still be held to the default.
    """
    rl = ctx.settings.serving.rate_limits
    overrides = [(c.consumer, c.requests, c.unit) for c in rl.consumers]
    return _consumer_rules((rl.requests, rl.unit), overrides, None) + token_rules(ctx)


def backend_traffic_policy(ctx: ServingContext) -> dict:
    """Per-consumer rate limits (Global: counted across all proxy replicas in Redis, see
    workloads/platform/controllers.py; Local limits would multiply by the replica count and Envoy
    Gateway does not support Distinct keys for them), a Local backstop over all consumers
    per proxy, the upstream timeouts and keep-alive, and the circuit breaker.

    Rate limits need a verified consumer identity, so they are rendered only with auth on;
    no retries here: a generation is not idempotent, and the edge already retries the
    failures that happen before a response starts."""
    sv = ctx.settings.serving
    spec: dict = {
        "targetRefs": [_target("HTTPRoute", ctx.release)],
        "timeout": {"http": {"requestTimeout": NO_TOTAL_TIMEOUT, "streamIdleTimeout": _idle_timeout(ctx),
                             "connectionIdleTimeout": f"{upstream_idle_seconds(ctx)}s"}},
        "circuitBreaker": circuit_breaker(ctx),
    }
    if sv.auth.enabled and sv.rate_limits.enabled:
        rl = sv.rate_limits
        # The global limit fails open (workloads/platform/controllers.py); each proxy's own
        # count, over all consumers, is the ceiling while it cannot be checked.
        backstop = {"rules": [{"limit": {"requests": backstop_requests(rl), "unit": rl.unit}}]}
        spec["rateLimit"] = {"global": {"rules": rate_limit_rules(ctx)}, "local": backstop}
    return {
        "apiVersion": ENVOY_GATEWAY_API,
        "kind": "BackendTrafficPolicy",
        "metadata": ctx.metadata(f"{ctx.release}-traffic", "gateway"),
        "spec": spec,
    }


def entry(ctx: ServingContext) -> dict:
    """The stable-named Service the APIG edge targets. Envoy Gateway names its own Service
    with a hash (envoy-<ns>-<gateway>-<hash>), which the edge cannot know in advance."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": ctx.metadata(entry_service(ctx.release), "gateway", namespace=ENTRY_NAMESPACE),
        "spec": {
            "type": "ClusterIP",
            "selector": proxy_selector(ctx),
            "ports": [{"name": "http", "port": LISTENER_PORT, "targetPort": PROXY_CONTAINER_PORT, "protocol": "TCP"}],
        },
    }


def render(ctx: ServingContext) -> list[dict]:
    sv = ctx.settings.serving
    if not sv.in_cluster_gateway:
        return []
    objs = [
        gateway_class(ctx),
        envoy_proxy(ctx),
        gateway(ctx),
        http_route(ctx),
        client_traffic_policy(ctx),
        backend_traffic_policy(ctx),
        entry(ctx),
    ]
    if sv.auth.enabled:
        objs.insert(5, security_policy(ctx))
    if token_budget(ctx):
        objs.insert(-1, extension_policy(ctx))
    return objs
