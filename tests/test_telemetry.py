"""Traces and structured logs, as rendered: vLLM's flags (checked by vLLM 0.32's own
parser), the gateway's tracing and access log, the collector chart's values (checked by
the chart's own values schema, and against the components its image is built with), the
network path for spans, and the dashboard's request panel."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from stacks import parse, read_raw
from stacks.constants import CONSUMER_HEADER
from stacks.logschema import ACCESS_LOG_KEYS
import k8s_schema
from workloads.supply_chain import mirror
from workloads.engine import engine_args
from workloads.edge import gateway
from workloads.engine import manifests
from workloads.observability import monitoring
from workloads.edge import network_policy
from workloads.platform import controllers as platform
from workloads.observability import telemetry
from workloads.supply_chain import versions
from stacks.plan import build_plan
from workloads.engine.context import build_context

DATA = Path(__file__).resolve().parent / "data" / "otel-collector"
STACKS = ("dev", "staging", "prod")


def stack(name: str = "prod", **changes):
    """A stack's settings with `a.b.c=value` changes (dots as '__')."""
    raw = copy.deepcopy(read_raw(name))
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return parse(raw, stack=name)


def ctx_of(s):
    return build_context(build_plan(s), image_repository="r.example/ns/repo")


def args_of(s) -> list[str]:
    return engine_args.render(engine_args.from_context(ctx_of(s), "/models"))


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --------------------------------------------------------------------------- vLLM


def test_vllm_sends_spans_to_the_collector():
    s = stack("prod")
    args = args_of(s)
    assert flag(args, "--otlp-traces-endpoint") == "http://otel-collector.observability.svc.cluster.local:4317"
    assert "--collect-detailed-traces" not in args  # off unless asked for
    s = stack("prod", observability__tracing__detailed="model",
              observability__tracing__collector_namespace="telemetry")
    args = args_of(s)
    assert flag(args, "--collect-detailed-traces") == "model"
    assert flag(args, "--otlp-traces-endpoint") == "http://otel-collector.telemetry.svc.cluster.local:4317"
    assert "--otlp-traces-endpoint" not in args_of(stack("prod", observability__tracing__enabled=False))


def test_request_logging_keeps_prompts_out_by_default():
    args = args_of(stack("prod"))
    assert "--enable-log-requests" in args and flag(args, "--max-log-len") == "512"
    assert "--enable-log-outputs" not in args and "--log-level" not in args
    args = args_of(stack("dev", observability__logs__request_log__prompts=True,
                         observability__logs__request_log__max_log_len=64))
    assert "--enable-log-outputs" in args and flag(args, "--log-level") == "DEBUG"
    assert flag(args, "--max-log-len") == "64"
    args = args_of(stack("dev", observability__logs__request_log__enabled=False,
                         observability__logs__request_log__prompts=True))
    assert not {"--enable-log-requests", "--enable-log-outputs", "--log-level"} & set(args)


def test_logs_are_json_when_collected():
    assert flag(args_of(stack("prod")), "--logging-config.formatter") == "json"
    assert "--logging-config.formatter" not in args_of(stack("prod", observability__logs__enabled=False))


_PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.engine.arg_utils import AsyncEngineArgs
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(json.loads(sys.argv[1]))
lc = AsyncEngineArgs.from_cli_args(ns).create_logging_config()  # what the engine configures
print(json.dumps({"otlp": ns.otlp_traces_endpoint, "detailed": ns.collect_detailed_traces,
                  "log_requests": ns.enable_log_requests, "log_outputs": ns.enable_log_outputs,
                  "max_log_len": ns.max_log_len, "request_id_headers": ns.enable_request_id_headers,
                  "quiet": ns.disable_access_log_for_endpoints,
                  "formatter": lc.formatter if lc else None, "level": lc.log_level if lc else None}))
"""


@pytest.mark.engine  # vLLM's parser, in a child interpreter
@pytest.mark.integration  # the real vLLM's parser, in a subprocess that imports the engine
def test_vllm_parser_reads_the_observability_flags_as_meant():
    """vLLM 0.32's own argument parser, in a fresh interpreter, on the flags the stack
    renders with everything switched on."""
    pytest.importorskip("vllm", reason="vllm is not installed (pip install -e '.[engine]')")
    s = stack("dev", observability__tracing__detailed="all", observability__logs__request_log__prompts=True)
    a = engine_args.from_context(ctx_of(s), "/models")
    argv = ["--model", "/models", *engine_args.observability_args(a)]
    out = subprocess.run([sys.executable, "-c", _PARSE, json.dumps(argv)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "otlp": telemetry.otlp_grpc_endpoint(build_plan(s)), "detailed": ["all"], "log_requests": True, "log_outputs": True,
        "max_log_len": 512, "request_id_headers": True, "quiet": "/health,/metrics", "formatter": "json",
        "level": "DEBUG",
    }


def test_serving_pods_name_themselves_in_spans():
    ctx = ctx_of(stack("prod"))
    env = {e["name"]: e for e in manifests.engine_env(ctx)}
    assert env["OTEL_SERVICE_NAME"]["value"] == "deepseek-vllm"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "k8s.pod.name=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"]["value"] == "0.01"  # prod: 1 %
    env = {e["name"]: e for e in manifests.engine_env(ctx_of(stack("dev")))}
    assert env["OTEL_TRACES_SAMPLER_ARG"]["value"] == "1"
    assert not telemetry.engine_env(ctx_of(stack("prod", observability__tracing__enabled=False)))


# --------------------------------------------------------------------------- gateway


def _envoy_proxy(s) -> dict:
    return gateway.envoy_proxy(ctx_of(s))


def test_gateway_traces_to_the_collector_at_the_configured_rate():
    tr = _envoy_proxy(stack("prod", observability__tracing__sampling_percent=2.5))["spec"]["telemetry"]["tracing"]
    assert tr["samplingFraction"] == {"numerator": 250, "denominator": 10000}
    assert tr["provider"]["type"] == "OpenTelemetry"
    assert tr["provider"]["backendRefs"] == [{"name": "otel-collector", "namespace": "observability", "port": 4317}]
    assert tr["tags"]["request_id"] == "%REQ(X-REQUEST-ID)%"
    tele = _envoy_proxy(stack("prod"))["spec"]["telemetry"]
    assert tele["requestID"] == {"tracing": "Sample"}  # the id is not rewritten to pack a sampling bit


def test_gateway_keeps_the_edges_request_id():
    ctp = gateway.client_traffic_policy(ctx_of(stack("prod")))
    assert ctp["spec"]["headers"]["requestID"] == "PreserveOrGenerate"


def test_access_log_is_one_json_object_with_the_indexed_keys():
    s = stack("prod")
    (setting,) = _envoy_proxy(s)["spec"]["telemetry"]["accessLog"]["settings"]
    fmt = setting["format"]
    assert fmt["type"] == "JSON" and setting["sinks"] == [{"type": "File", "file": {"path": "/dev/stdout"}}]
    assert list(fmt["json"]) == list(ACCESS_LOG_KEYS)  # what infra/logging.py indexes
    j = fmt["json"]
    assert j["model"] == ctx_of(s).served_model_name
    assert j["consumer"] == f"%REQ({CONSUMER_HEADER.upper()})%"
    assert j["status"] == "%RESPONSE_CODE%" and j["request_id"] == "%REQ(X-REQUEST-ID)%"
    assert j["upstream_ms"].startswith("%COMMON_DURATION(US_TX_BEG:US_RX_END")


def test_telemetry_switches_off_piece_by_piece():
    tele = _envoy_proxy(stack("prod", observability__tracing__enabled=False))["spec"]["telemetry"]
    assert set(tele) == {"accessLog"}
    tele = _envoy_proxy(stack("prod", observability__logs__access_log=False))["spec"]["telemetry"]
    assert set(tele) == {"tracing", "requestID"}
    spec = _envoy_proxy(stack("prod", observability__tracing__enabled=False, observability__logs__access_log=False))
    assert "telemetry" not in spec["spec"]


@pytest.mark.parametrize("name", STACKS)
def test_envoy_proxy_and_client_policy_pass_their_crds(name):
    ctx = ctx_of(stack(name))
    k8s_schema.validate(gateway.envoy_proxy(ctx), "1.32")
    k8s_schema.validate(gateway.client_traffic_policy(ctx), "1.32")


def test_only_the_serving_pods_may_send_spans_and_only_to_the_collector():
    ctx = ctx_of(stack("prod"))
    (pol,) = [p for p in network_policy.render(ctx) if p["metadata"]["name"].endswith("-egress-otlp")]
    (rule,) = pol["spec"]["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 4317}]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    off = ctx_of(stack("prod", observability__tracing__enabled=False))
    assert not [p for p in network_policy.render(off) if p["metadata"]["name"].endswith("-egress-otlp")]


# --------------------------------------------------------------------------- collector


def _merge(base: dict, over: dict) -> dict:
    """Helm's merge of user values over the chart's: maps merge, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def _chart_schema_errors(values: dict) -> list[str]:
    schema = json.loads((DATA / "values.schema.json").read_text())
    merged = _merge(yaml.safe_load((DATA / "values.yaml").read_text()), values)
    return [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(merged)]


@pytest.mark.parametrize("name", STACKS)
def test_collector_values_pass_the_charts_schema(name):
    assert _chart_schema_errors(telemetry.collector_values(build_plan(stack(name)), "trace-topic")) == []


def test_the_chart_schema_check_can_fail():
    values = telemetry.collector_values(build_plan(stack("prod")), "t")
    values["image"]["repo"] = "typo"
    assert _chart_schema_errors(values)


def _built_in() -> dict[str, set[str]]:
    """Component modules of the otelcol-k8s distribution the image is built from."""
    manifest = yaml.safe_load((DATA / "otelcol-k8s-manifest.yaml").read_text())
    assert manifest["dist"]["version"] == versions.OTEL_COLLECTOR.app_version
    return {kind: {m["gomod"].split()[0].rsplit("/", 1)[1] for m in manifest[kind]}
            for kind in ("extensions", "receivers", "processors", "exporters")}


@pytest.mark.parametrize("backend", ["tls", "apmplus"])
def test_every_collector_component_is_built_into_the_image(backend):
    cfg = telemetry.collector_config(build_plan(stack("prod", observability__tracing__backend=backend)), "t")
    built = _built_in()
    for kind in ("extensions", "receivers", "processors", "exporters"):
        for name in cfg[kind]:
            module = name.split("/")[0].replace("_", "") + kind[:-1]
            assert module in built[kind], (kind, name)
    # every pipeline names defined components only, and every defined one is used
    (pipe,) = cfg["service"]["pipelines"].values()
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipe[kind]) == set(cfg[kind]), kind
    assert cfg["service"]["extensions"] == list(cfg["extensions"])


def test_tls_exporter_writes_the_stacks_trace_topic():
    s = stack("prod")
    (exp,) = telemetry.collector_config(build_plan(s), "topic-123")["exporters"].values()
    assert exp["endpoint"] == "https://tls-cn-beijing.volces.com:4318"
    assert exp["headers"]["x-tls-otel-tracetopic"] == "topic-123"
    assert exp["headers"]["x-tls-otel-region"] == s.region
    assert exp["headers"]["x-tls-otel-ak"] == "${env:TLS_ACCESS_KEY_ID}"
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in telemetry.collector_values(build_plan(s), "t")["extraEnvs"]}
    assert env["TLS_ACCESS_KEY_ID"] == {"name": "otel-exporter-credentials", "key": "access_key_id", "optional": True}
    assert env["TLS_SECRET_ACCESS_KEY"]["key"] == "secret_access_key"


def test_apmplus_exporter_and_an_explicit_endpoint():
    s = stack("staging", observability__tracing__backend="apmplus", observability__tracing__credentials_secret="apm")
    (exp,) = telemetry.collector_config(build_plan(s))["exporters"].values()
    region = s.region
    assert exp["endpoint"] == f"https://apmplus-{region}.volces.com:4318"
    assert exp["headers"] == {"X-ByteAPM-AppKey": "${env:APMPLUS_APP_KEY}"}
    (env,) = telemetry.collector_values(build_plan(s))["extraEnvs"]
    assert env["valueFrom"]["secretKeyRef"]["name"] == "apm"
    s = stack("staging", observability__tracing__endpoint="https://otlp.example.com:4318")
    assert telemetry.collector_config(build_plan(s), "t")["exporters"]["otlphttp/tls"]["endpoint"] == "https://otlp.example.com:4318"


def test_collector_release_follows_the_settings():
    s = stack("prod", observability__tracing__collector_replicas=3)
    (rel,) = [r for r in platform.releases(build_plan(s), "t") if r["name"] == "otel-collector"]
    assert rel["namespace"] == "observability"
    # from the stack's mirror, like every chart (workloads/supply_chain/mirror.py)
    assert (rel["chart"], rel["version"]) == (mirror.chart_ref(build_plan(s), versions.OTEL_COLLECTOR), versions.OTEL_COLLECTOR.version)
    assert rel["repository_url"] is None
    v = rel["values"]
    assert v["replicaCount"] == 3 and v["mode"] == "deployment" and v["fullnameOverride"] == telemetry.COLLECTOR
    assert v["image"] == {"repository": f"{mirror.mirror_prefix(build_plan(s))}/otel/opentelemetry-collector-k8s", "tag": "0.158.0"}
    assert all(not v["ports"][p]["enabled"] for p in ("jaeger-compact", "jaeger-thrift", "jaeger-grpc", "zipkin"))


# --------------------------------------------------------------------------- dashboard


def test_dashboard_has_a_request_box_and_the_searches():
    s = stack("prod")
    model = monitoring.dashboard(ctx_of(s))
    var = next(v for v in model["templating"]["list"] if v["name"] == "request_id")
    assert var["type"] == "textbox"
    (panel,) = [p for p in model["panels"] if p["title"] == "Follow a request"]
    text = panel["options"]["content"]
    names = build_plan(s).names
    assert names.log_project in text and names.trace_instance in text
    assert 'request_id:"${request_id}"' in text and 'message:#"${request_id}"' in text
    assert "https://console.volcengine.com/tls/region:tls+cn-beijing/" in text
    assert model["links"][0]["url"] == "https://console.volcengine.com/tls/region:tls+cn-beijing/"
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    assert panel["gridPos"]["y"] >= max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in model["panels"] if p is not panel)


def test_dashboard_without_logs_or_traces_has_no_request_panel():
    s = stack("prod", observability__tracing__enabled=False, observability__logs__enabled=False)
    model = monitoring.dashboard(ctx_of(s))
    assert not [p for p in model["panels"] if p["title"] == "Follow a request"]
    assert "request_id" not in {v["name"] for v in model["templating"]["list"]}
