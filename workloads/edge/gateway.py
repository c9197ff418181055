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

from stacks.constants import CONSUMER_HEADER, ENTRY_NAMESPACE, HTTP_PORT, entry_service
from workloads.edge import router
from workloads.supply_chain import mirror
from workloads.observability import telemetry
from workloads.engine.context import ServingContext

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


def envoy_proxy(ctx: ServingContext) -> dict:
    """Proxy deployment shape. ClusterIP: the default Service type is LoadBalancer, which on
    VKE would buy a CLB nobody needs (the edge reaches the proxies through the entry
    Service). Drain for the stack's drain budget, as the engines do."""
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
                    "envoyDeployment": {"replicas": ctx.settings.serving.gateway_replicas,
                                        "container": {"image": mirror.ref(ctx.plan, "envoy-proxy")}},
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
    return router.service_name(ctx) if router.enabled(ctx) else ctx.stable_service


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
                      "backendRefs": [_backend(router.service_name(ctx), 100)], "timeouts": timeouts})
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


def rate_limit_rules(ctx: ServingContext) -> list[dict]:
    """Global rules keyed on the consumer header.

    Global rules all apply to a request that matches several (Envoy Gateway: "a single
    request might increase the rate limit counters for multiple rules"), so the default
    rule excludes the consumers that have an override; otherwise a consumer granted more
    than the default would still be held to the default.
    """
    rl = ctx.settings.serving.rate_limits
    overrides = list(rl.consumers)
    default_headers = [{"name": CONSUMER_HEADER, "type": "Distinct"}]
    default_headers += [
        {"name": CONSUMER_HEADER, "type": "Exact", "value": c.consumer, "invert": True} for c in overrides
    ]
    rules = [{"clientSelectors": [{"headers": default_headers}], "limit": {"requests": rl.requests, "unit": rl.unit}}]
    for c in overrides:
        rules.append({
            "clientSelectors": [{"headers": [{"name": CONSUMER_HEADER, "type": "Exact", "value": c.consumer}]}],
            "limit": {"requests": c.requests, "unit": c.unit},
        })
    return rules


def backend_traffic_policy(ctx: ServingContext) -> dict:
    """Per-consumer rate limits (Global: counted across all proxy replicas in Redis, see
    workloads/platform/controllers.py; Local limits would multiply by the replica count and Envoy
    Gateway does not support Distinct keys for them), a Local backstop over all consumers
    per proxy, and the upstream timeouts.

    Rate limits need a verified consumer identity, so they are rendered only with auth on;
    no retries here: a generation is not idempotent, and the edge already retries the
    failures that happen before a response starts."""
    sv = ctx.settings.serving
    spec: dict = {
        "targetRefs": [_target("HTTPRoute", ctx.release)],
        "timeout": {"http": {"requestTimeout": NO_TOTAL_TIMEOUT, "streamIdleTimeout": _idle_timeout(ctx)}},
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
    return objs
