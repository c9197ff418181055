"""Traces and structured logs of the request path, and where they go.

    client -> APIG edge -> Envoy Gateway proxy -> vLLM
                 |               |                  |
          TLS edge topic   gateway topic     serving topic      (logs: infra/logging.py)
                          span "router ..." span "llm_request"  (traces, one trace id)
                                 \\                 /
                          OpenTelemetry Collector (OTLP gRPC :4317)
                                        |  OTLP/HTTP
                       TLS trace instance, or APMPlus (settings.observability.tracing)

One request keeps one id and one trace from the edge to the engine:

* request id: the gateway keeps an incoming `X-Request-ID` (ClientTrafficPolicy
  `headers.requestID: PreserveOrGenerate`; the Envoy Gateway default `Generate` would
  replace the edge's id) and does not rewrite it to pack its sampling decision
  (EnvoyProxy `telemetry.requestID.tracing: Sample`). vLLM takes `X-Request-Id` as its
  request id (vllm/entrypoints/serve/engine/serving.py `_base_request_id`), logs it,
  puts it on the span (`gen_ai.request.id`) and returns it (`--enable-request-id-headers`).
* trace: Envoy's OpenTelemetry tracer continues an incoming W3C `traceparent` or starts
  one for `sampling_percent` of requests, and sends `traceparent` upstream; vLLM parents
  its `llm_request` span (with `gen_ai.latency.*` and `gen_ai.usage.*`) on it.

May import: `stacks`, `workloads.engine.context`, `workloads.supply_chain.versions`.
"""

from __future__ import annotations

from typing import Any

from stacks.constants import CONSUMER_HEADER
from stacks.logschema import ACCESS_LOG_KEYS
from stacks.regions import tls_console
from stacks.plan import StackPlan
from workloads.supply_chain import versions
from workloads.supply_chain.mirror import mirrored_release
from workloads.engine.context import ServingContext

COLLECTOR = "otel-collector"  # the chart's fullnameOverride: Service, Deployment and labels
OTLP_GRPC_PORT = 4317
OTLP_HTTP_PORT = 4318
HEALTH_PORT = 13133
# Envoy Gateway's samplingFraction is numerator/denominator; 1/10000 resolves 0.01 %.
SAMPLING_DENOMINATOR = 10000

_CONSUMER_HEADER = CONSUMER_HEADER.upper()

# Envoy command operators of each access-log key (stacks/logschema.py types them for the
# TLS index). COMMON_DURATION and TRACE_ID exist since Envoy 1.31; Envoy Gateway v1.9
# runs Envoy v1.39 (envoyproxy/gateway v1.9.0 api/v1alpha1/shared_types.go
# DefaultEnvoyProxyImage). The upstream times are measured at the proxy, so they hold even
# though Envoy Gateway suppresses the x-envoy-upstream-service-time header.
ACCESS_LOG_OPERATORS: dict[str, str] = {
    "start_time": "%START_TIME%",
    "request_id": "%REQ(X-REQUEST-ID)%",
    "trace_id": "%TRACE_ID%",
    "consumer": f"%REQ({_CONSUMER_HEADER})%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
    "status": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "duration_ms": "%DURATION%",
    "upstream_ms": "%COMMON_DURATION(US_TX_BEG:US_RX_END:ms)%",
    "upstream_first_byte_ms": "%COMMON_DURATION(US_TX_BEG:US_RX_BEG:ms)%",
    "bytes_received": "%BYTES_RECEIVED%",
    "bytes_sent": "%BYTES_SENT%",
    "route": "%ROUTE_NAME%",
    "upstream_host": "%UPSTREAM_HOST%",
}


# --------------------------------------------------------------------------- endpoints


def collector_host(plan: StackPlan) -> str:
    settings = plan.settings
    return f"{COLLECTOR}.{settings.observability.tracing.collector_namespace}.svc.cluster.local"


def otlp_grpc_endpoint(plan: StackPlan) -> str:
    """Where vLLM sends spans (its exporter speaks OTLP gRPC by default, plain text inside
    the cluster: vllm/tracing/otel.py get_span_exporter)."""
    return f"http://{collector_host(plan)}:{OTLP_GRPC_PORT}"


def tracing_on(plan: StackPlan) -> bool:
    settings = plan.settings
    return settings.observability.tracing.enabled


# --------------------------------------------------------------------------- gateway


def access_log_format(ctx: ServingContext) -> dict[str, str]:
    """The gateway's JSON access log: one object per request, keys of stacks/logschema.py.
    The model is a literal: a route of this Gateway serves one model."""
    fmt = {k: ACCESS_LOG_OPERATORS[k] for k in ACCESS_LOG_KEYS if k in ACCESS_LOG_OPERATORS}
    fmt["model"] = ctx.served_model_name
    return {k: fmt[k] for k in ACCESS_LOG_KEYS}


def sampling_fraction(percent: float) -> dict[str, int]:
    return {"numerator": round(percent * SAMPLING_DENOMINATOR / 100), "denominator": SAMPLING_DENOMINATOR}


def envoy_telemetry(ctx: ServingContext) -> dict[str, Any]:
    """EnvoyProxy spec.telemetry: tracing to the collector, the JSON access log on stdout
    (where the log collector picks it up), and request ids left as the edge sent them."""
    s = ctx.settings
    out: dict[str, Any] = {}
    if s.observability.logs.access_log:
        out["accessLog"] = {"settings": [{
            "format": {"type": "JSON", "json": access_log_format(ctx)},
            "sinks": [{"type": "File", "file": {"path": "/dev/stdout"}}],
        }]}
    if tracing_on(ctx.plan):
        t = s.observability.tracing
        out["tracing"] = {
            "samplingFraction": sampling_fraction(t.sampling_percent),
            "provider": {
                "type": "OpenTelemetry",
                "backendRefs": [{"name": COLLECTOR, "namespace": t.collector_namespace, "port": OTLP_GRPC_PORT}],
                "serviceName": f"{ctx.release}-gateway",
            },
            # Span attributes to find a trace by: the request id and who sent it.
            "tags": {"request_id": "%REQ(X-REQUEST-ID)%", "consumer": f"%REQ({_CONSUMER_HEADER})%",
                     "model": ctx.served_model_name},
        }
        # Keep X-Request-ID as received; sample on it, so that one id is sampled alike
        # by every proxy replica.
        out["requestID"] = {"tracing": "Sample"}
    return out


# --------------------------------------------------------------------------- vLLM


def engine_env(ctx: ServingContext) -> list[dict]:
    """Resource attributes of vLLM's spans: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    are read by the OpenTelemetry SDK's Resource.create, which vLLM's tracer uses. The
    sampler (read from OTEL_TRACES_SAMPLER by the SDK's TracerProvider, which vLLM creates
    without one) follows the caller's decision and samples requests that arrive without
    one at the gateway's rate, so vLLM alone (no in-cluster gateway) does not trace all."""
    if not tracing_on(ctx.plan):
        return []
    ratio = ctx.settings.observability.tracing.sampling_percent / 100
    return [
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{ratio:g}"},
        {"name": "OTEL_SERVICE_NAME", "value": f"{ctx.release}-vllm"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "OTEL_RESOURCE_ATTRIBUTES",
         "value": f"k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE),"
                  f"deployment.environment.name={ctx.settings.stack}"},
    ]


# --------------------------------------------------------------------------- collector


def _exporter(plan: StackPlan, trace_topic_id: Any) -> tuple[str, dict, list[dict]]:
    """(exporter name, exporter config, env from the credentials Secret)."""
    settings = plan.settings
    t = settings.observability.tracing
    secret = t.credentials_secret

    def env(name: str, key: str) -> dict:
        # optional: the collector starts (and the release installs) before operators
        # create the Secret; spans are refused by the backend until they do.
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}

    if t.backend == "tls":
        headers = {
            "x-tls-otel-tracetopic": trace_topic_id,
            "x-tls-otel-region": settings.region,
            "x-tls-otel-ak": "${env:TLS_ACCESS_KEY_ID}",
            "x-tls-otel-sk": "${env:TLS_SECRET_ACCESS_KEY}",
        }
        envs = [env("TLS_ACCESS_KEY_ID", "access_key_id"), env("TLS_SECRET_ACCESS_KEY", "secret_access_key")]
        name = "otlphttp/tls"
    else:
        headers = {"X-ByteAPM-AppKey": "${env:APMPLUS_APP_KEY}"}
        envs = [env("APMPLUS_APP_KEY", "app_key")]
        name = "otlphttp/apmplus"
    return name, {"endpoint": plan.trace_endpoint, "headers": headers, "compression": "gzip"}, envs


def collector_config(plan: StackPlan, trace_topic_id: Any = None) -> dict:
    """The collector's whole configuration (the chart's alternateConfig: nothing of the
    chart's default pipelines, receivers or debug exporter is merged in)."""
    settings = plan.settings
    name, exporter, _ = _exporter(plan, trace_topic_id)
    return {
        "extensions": {"health_check": {"endpoint": f"${{env:MY_POD_IP}}:{HEALTH_PORT}"}},
        "receivers": {"otlp": {"protocols": {
            "grpc": {"endpoint": f"${{env:MY_POD_IP}}:{OTLP_GRPC_PORT}"},
            "http": {"endpoint": f"${{env:MY_POD_IP}}:{OTLP_HTTP_PORT}"},
        }}},
        "processors": {
            "memory_limiter": {"check_interval": "5s", "limit_percentage": 80, "spike_limit_percentage": 25},
            "resource": {"attributes": [
                {"key": "deployment.environment.name", "value": settings.stack, "action": "upsert"},
                {"key": "k8s.cluster.name", "value": plan.names.cluster, "action": "upsert"},
            ]},
            "batch": {},
        },
        "exporters": {name: exporter},
        "service": {
            "extensions": ["health_check"],
            "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["memory_limiter", "resource", "batch"],
                                     "exporters": [name]}},
        },
    }


def collector_values(plan: StackPlan, trace_topic_id: Any = None) -> dict:
    """Values of the official opentelemetry-collector chart (versions.OTEL_COLLECTOR)."""
    settings = plan.settings
    t = settings.observability.tracing
    _, _, envs = _exporter(plan, trace_topic_id)
    off = {"enabled": False}
    return {
        "mode": "deployment",
        "fullnameOverride": COLLECTOR,
        "replicaCount": t.collector_replicas,
        "image": {"repository": versions.OTEL_COLLECTOR_IMAGE, "tag": versions.OTEL_COLLECTOR.app_version},
        "alternateConfig": collector_config(plan, trace_topic_id),
        # Only OTLP: the chart opens Jaeger and Zipkin ports by default.
        "ports": {"jaeger-compact": off, "jaeger-thrift": off, "jaeger-grpc": off, "zipkin": off},
        "extraEnvs": envs,
        # The collector never calls the Kubernetes API (no k8sattributes processor).
        "serviceAccount": {"create": True, "automountServiceAccountToken": False},
        "podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        "podDisruptionBudget": {"enabled": t.collector_replicas > 1, "minAvailable": 1},
    }


def collector_release(plan: StackPlan, trace_topic_id: Any = None) -> dict:
    """The collector's release, from the stack's mirror like every chart (workloads/supply_chain/mirror.py)."""
    settings = plan.settings
    return mirrored_release(COLLECTOR, settings.observability.tracing.collector_namespace, versions.OTEL_COLLECTOR,
                            collector_values(plan, trace_topic_id), plan)


# --------------------------------------------------------------------------- dashboard


REQUEST_ID_VARIABLE = "request_id"


def request_panel_markdown(plan: StackPlan) -> str:
    """How to follow the request id typed into the dashboard: the searches to run in the
    log service. TLS has no documented console URL that carries a query, so the panel
    links to the region's console and gives each query to paste."""
    settings = plan.settings
    rid = f"${{{REQUEST_ID_VARIABLE}}}"
    lines = [f"**Request `{rid}`** in log project `{plan.names.log_project}` "
             f"([TLS console]({tls_console(settings.region)})):", ""]
    if settings.observability.logs.enabled:
        lines += [
            f'* edge (APIG): topic `edge`, search `#"{rid}"`',
            f'* gateway: topic `gateway`, search `request_id:"{rid}"` (status, consumer, upstream time, trace_id)',
            f'* vLLM: topic `serving`, search `message:#"{rid}"`',
        ]
    t = settings.observability.tracing
    if t.enabled:
        where = (f"trace instance `{plan.names.trace_instance}`" if t.backend == "tls" else "APMPlus")
        lines += [f"* trace: {where}, the `trace_id` of the gateway line, or span attribute "
                  f"`gen_ai.request.id` = `{rid}` (span `llm_request`)"]
    return "\n".join(lines)


def add_request_links(model: dict, plan: StackPlan) -> dict:
    """Add the request-id box, a dashboard link to the log service and the panel with the
    searches to a Grafana dashboard model (in place; returned for chaining)."""
    settings = plan.settings
    logs, tracing = settings.observability.logs.enabled, settings.observability.tracing.enabled
    if not (logs or tracing):
        return model
    model["templating"]["list"].append({
        "name": REQUEST_ID_VARIABLE, "label": "Request id", "type": "textbox", "query": "",
        "current": {"text": "", "value": ""},
    })
    model.setdefault("links", []).append({
        "title": "Logs and traces (TLS console)", "type": "link", "url": tls_console(settings.region),
        "targetBlank": True, "icon": "doc",
    })
    bottom = max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in model["panels"]), default=0)
    next_id = max((p.get("id", 0) for p in model["panels"]), default=0) + 1
    model["panels"].append({
        "id": next_id, "type": "text", "title": "Follow a request",
        "gridPos": {"x": 0, "y": bottom, "w": 24, "h": 6}, "targets": [],
        "options": {"mode": "markdown", "content": request_panel_markdown(plan)},
    })
    return model
