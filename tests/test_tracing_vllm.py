"""A real vLLM, started with the tracing and logging flags the stack renders, sends its
`llm_request` span under the trace of the incoming W3C `traceparent` to an OTLP receiver,
and logs the request by the caller's X-Request-Id as JSON lines, without the prompt.

The receiver is a gRPC OTLP TraceService built from opentelemetry-proto and grpcio (the
wire protocol the OpenTelemetry Collector's otlp receiver speaks), on localhost. What
differs from the cluster, and nothing else:
- `--otlp-traces-endpoint` points at that receiver instead of the in-cluster collector;
- the differences of tests/test_serving_vllm.py (GPU-only flags dropped, the tiny model's
  context, the test server's host and port);
- the Kubernetes downward-API variables ($(POD_NAME), $(POD_NAMESPACE)) are expanded here
  the way the kubelet expands them, and OTEL_BSP_SCHEDULE_DELAY makes the span processor
  flush within 200 ms instead of 5 s.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from stacks import parse, read_raw
from stacks.logschema import MESSAGE_DELIMITERS, SERVING_LOG_KEYS
from workloads.engine import engine_args
from workloads.observability import telemetry
from stacks.plan import build_plan
from workloads.engine.context import build_context

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
REQUEST_ID = "edge-7d2c1f0e-3b4a-4c55-9e61-0a1b2c3d4e5f"
PROMPT = "the weights live in a bucket far away"
POD = {"POD_NAME": "deepseek-5f7d9c-abcde", "POD_NAMESPACE": "deepseek-serving"}


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every ExportTraceServiceRequest it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # noqa: N802 (the gRPC method name)
        with self.lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict, object]]:
        """(resource attributes, span) of everything received."""
        out = []
        with self.lock:
            for req in self.requests:
                for rs in req.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        out += [(resource, span) for span in ss.spans]
        return out


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest.fixture(scope="module")
def receiver():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    svc = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield svc, port
    server.stop(grace=None)


@pytest.fixture(scope="module")
def stack():
    """The dev stack with detailed traces asked for, so that setting reaches the engine too."""
    raw = copy.deepcopy(read_raw("dev"))
    raw.setdefault("observability", {}).setdefault("tracing", {})["detailed"] = "all"
    s = parse(raw, stack="dev")
    return build_context(build_plan(s), image_repository="r.example/ns/repo")


@pytest.fixture(scope="module")
def rendered(stack, tiny_deepseek_v2, receiver):
    _, port = receiver
    cfg = json.loads((tiny_deepseek_v2 / "config.json").read_text())
    a = engine_args.from_context(stack, str(tiny_deepseek_v2))
    a = dataclasses.replace(a, max_model_len=cfg["max_position_embeddings"])
    args = engine_args.without_flags(engine_args.render(a), engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})
    i = args.index("--otlp-traces-endpoint")
    assert args[i + 1] == telemetry.otlp_grpc_endpoint(build_plan(stack.settings))  # what the cluster gets
    args[i + 1] = f"http://127.0.0.1:{port}"
    return args


def _pod_env(ctx) -> dict[str, str]:
    """The serving container's tracing env, with $(VAR) expanded as the kubelet does."""
    env = dict(POD)
    for e in telemetry.engine_env(ctx):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
    return env


@pytest.fixture(scope="module")
def server(vllm_server, tiny_deepseek_v2, rendered, stack):
    env = {**_pod_env(stack), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    return vllm_server(tiny_deepseek_v2, args=rendered, env=env)


@pytest.fixture(scope="module")
def completion(server, stack):
    """One completion sent the way the gateway forwards it: with the edge's request id and
    the gateway span's traceparent (sampled)."""
    body = json.dumps({"model": stack.served_model_name, "prompt": PROMPT, "max_tokens": 8,
                       "temperature": 0}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", data=body, headers={
        "Content-Type": "application/json",
        "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01",
        "X-Request-Id": REQUEST_ID,
    })
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, dict(r.headers), json.loads(r.read())


def _llm_request_span(receiver, timeout: float = 30.0):
    svc, _ = receiver
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for resource, span in svc.spans():
            if span.name == "llm_request" and span.trace_id.hex() == TRACE_ID:
                return resource, span
        time.sleep(0.2)
    names = sorted({(s.name, s.trace_id.hex()) for _, s in svc.spans()})
    raise AssertionError(f"no llm_request span under trace {TRACE_ID} within {timeout:.0f}s; received {names}")


def test_the_rendered_flags_are_the_settings(rendered, stack):
    t = stack.settings.observability.tracing
    assert rendered[rendered.index("--collect-detailed-traces") + 1] == t.detailed == "all"
    assert "--enable-log-requests" in rendered and "--enable-request-id-headers" in rendered
    assert rendered[rendered.index("--logging-config.formatter") + 1] == "json"
    # prompts are off by default: no output logging, no DEBUG level
    assert "--enable-log-outputs" not in rendered and "--log-level" not in rendered


def test_the_response_carries_the_callers_request_id(completion):
    status, headers, body = completion
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    assert {k.lower(): v for k, v in headers.items()}["x-request-id"] == REQUEST_ID


def test_llm_request_span_continues_the_incoming_trace(completion, receiver):
    _, span = _llm_request_span(receiver)
    assert span.trace_id.hex() == TRACE_ID
    assert span.parent_span_id.hex() == PARENT_SPAN_ID
    assert span.span_id.hex() not in ("", PARENT_SPAN_ID)


def test_llm_request_span_carries_latency_and_usage(completion, receiver):
    _, body = completion[0], completion[2]
    _, span = _llm_request_span(receiver)
    attrs = {a.key: _value(a.value) for a in span.attributes}
    ttft, e2e = attrs["gen_ai.latency.time_to_first_token"], attrs["gen_ai.latency.e2e"]
    assert 0 < ttft <= e2e
    assert attrs["gen_ai.latency.time_in_queue"] >= 0
    assert attrs["gen_ai.latency.time_in_model_prefill"] >= 0
    assert attrs["gen_ai.latency.time_in_model_decode"] >= 0
    assert attrs["gen_ai.usage.completion_tokens"] == body["usage"]["completion_tokens"] == 8
    assert attrs["gen_ai.usage.prompt_tokens"] == body["usage"]["prompt_tokens"] > 0
    assert attrs["gen_ai.request.max_tokens"] == 8
    # The caller's id is vLLM's request id: the span can be found by the id in the logs.
    assert REQUEST_ID in attrs["gen_ai.request.id"]
    # The span lasts from arrival to the end of the request.
    assert span.end_time_unix_nano - span.start_time_unix_nano >= int(ttft * 1e9) * 0.9


def test_spans_name_the_service_and_the_pod(completion, receiver, stack):
    resource, _ = _llm_request_span(receiver)
    assert resource["service.name"] == f"{stack.release}-vllm"
    assert resource["k8s.pod.name"] == POD["POD_NAME"]
    assert resource["deployment.environment.name"] == stack.settings.stack


def _json_lines(server) -> list[dict]:
    out = []
    for line in server.log_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def test_request_is_logged_by_id_as_json_without_the_prompt(completion, server):
    lines = _json_lines(server)
    received = [d for d in lines if "Received request" in d.get("message", "") and REQUEST_ID in d["message"]]
    assert received, "no JSON 'Received request <id>' line"
    # The keys the serving topic indexes are the keys vLLM writes.
    assert set(SERVING_LOG_KEYS) <= set(received[0])
    assert PROMPT not in server.log_text()


def _tokens(text: str, delimiters: str) -> list[str]:
    return [t for t in re.split("[" + re.escape(delimiters) + "]", text) if t]


def test_the_phrase_search_on_the_message_finds_the_request(completion, server):
    """vLLM writes cmpl-<id>-0: with the serving topic's delimiters the caller's id is a run
    of consecutive tokens in the message, which is what `message:#"<id>"` matches."""
    wanted = _tokens(REQUEST_ID, MESSAGE_DELIMITERS)
    hits = []
    for d in _json_lines(server):
        toks = _tokens(d.get("message", ""), MESSAGE_DELIMITERS)
        if any(toks[i:i + len(wanted)] == wanted for i in range(len(toks))):
            hits.append(d)
    assert any("Received request" in d["message"] for d in hits)


def test_probe_and_scrape_requests_stay_out_of_the_access_log(server):
    assert server.get("/health")[0] == 200
    assert server.get("/metrics")[0] == 200
    time.sleep(0.5)
    paths = [d["message"] for d in _json_lines(server) if d.get("name", "").startswith("uvicorn.access")]
    assert not [m for m in paths if "/health" in m or "/metrics" in m], paths
