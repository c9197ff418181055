"""The Triton front: settings, the model repository generated from the engine settings,
the container, probes and ports, the metrics it reads (against Triton's documented list)
and its alerts through the real promtool, and the example stack."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsvolc import preview
from stacks import SettingsError, load, parse, parse_plan, read_raw
from test_autoscaling import ctx_for
from workloads.engine import autoscaling
from workloads.engine import engine_args
from workloads.engine import manifests
from workloads.observability import monitoring
from workloads.observability import queries
from workloads.engine import triton

STACK = "triton-example"
DATA = Path(__file__).resolve().parent / "data"
PROMTOOL_CASES = Path(__file__).resolve().parent / "promtool" / "triton"


def problems(stack: str, **changes) -> list[str]:
    raw = copy.deepcopy(read_raw(stack))
    for path, value in changes.items():
        node, keys = raw, path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    with pytest.raises(SettingsError) as info:
        parse_plan(raw, stack, stack=stack)
    return info.value.problems


def deployment(ctx) -> dict:
    return next(o for o in manifests.render(ctx) if o["kind"] == "Deployment")


def container(ctx) -> dict:
    return deployment(ctx)["spec"]["template"]["spec"]["containers"][0]


def repository(ctx) -> dict:
    return next(o for o in manifests.render(ctx) if o["kind"] == "ConfigMap" and "triton" in o["metadata"]["name"])


# --------------------------------------------------------------------------- settings


def test_a_multi_node_replica_is_refused_behind_triton():
    (line,) = problems("prod", serving__server="triton")
    assert line.startswith("serving.server:") and "expected vllm" in line


def test_extra_flags_and_a_default_beyond_the_context_are_refused():
    assert problems(STACK, serving__engine__extra_args=["--enforce-eager"])[0].startswith(
        "serving.engine.extra_args:")
    (line,) = problems(STACK, serving__triton__default_max_tokens=20000)
    assert line.startswith("serving.triton.default_max_tokens:") and "16384" in line
    (line,) = problems(STACK, serving__triton__kserve_http_port=8000)
    assert line.startswith("serving.triton.kserve_http_port:")


# --------------------------------------------------------------------------- rendering


def test_model_json_holds_exactly_the_engine_arguments_vllm_would_get():
    ctx = ctx_for(STACK)
    a = engine_args.from_context(ctx, manifests.model_path(ctx))
    doc = json.loads(repository(ctx)["data"]["model.json"])
    flags = engine_args.render(a)
    # every valued flag of the vLLM command line is the same field in model.json
    for i, token in enumerate(flags):
        if token.startswith("--") and i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            field = token[2:].replace("-", "_")
            if field in triton.FRONTEND_ONLY_FIELDS:
                continue  # the frontend's, not the engine's
            want = doc[field]
            assert str(want) == flags[i + 1] or f"{want:.2f}" == flags[i + 1], field
    assert doc["max_model_len"] == ctx.engine.max_model_len == load(STACK).serving.engine.max_model_len
    assert doc["disable_log_stats"] is False
    # and the pod template says the same in vLLM's words
    md = deployment(ctx)["spec"]["template"]["metadata"]
    assert json.loads(md["annotations"]["deepseek-volc/engine-args"]) == flags


@pytest.mark.filterwarnings("ignore::stacks.regions.PlacementWarning")
def test_a_tensor_parallel_engine_gets_its_size_in_model_json():
    """The example stack runs on one GPU (TP=1, what model.json says by default, so a size
    hard-coded to 1 passed): on a pool of 2-GPU nodes (2 x A100 80 GB) with TP=2, model.json,
    the vLLM flags and the GPUs the pod asks for all say 2."""
    ctx = ctx_for(STACK, cluster__gpu_pools__a10__instance_type="ecs.pni2.7xlarge",
                  serving__engine__tensor_parallel_size=2)
    assert not ctx.multi_node and ctx.engine.tensor_parallel_size == 2
    doc = json.loads(repository(ctx)["data"]["model.json"])
    assert doc["tensor_parallel_size"] == 2 and doc["pipeline_parallel_size"] == 1
    c = container(ctx)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    args = json.loads(deployment(ctx)["spec"]["template"]["metadata"]["annotations"]["deepseek-volc/engine-args"])
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    # the backend starts one process per rank from KIND_MODEL, not one instance per GPU
    assert "kind: KIND_MODEL" in repository(ctx)["data"]["config.pbtxt"]


def test_config_pbtxt_uses_the_vllm_backend_with_its_metrics_and_health_check():
    ctx = ctx_for(STACK)
    text = repository(ctx)["data"]["config.pbtxt"]
    assert f'name: "{ctx.served_model_name}"' in text and 'backend: "vllm"' in text
    assert "kind: KIND_MODEL" in text
    assert '"REPORT_CUSTOM_METRICS" value: { string_value: "true" }' in text
    assert '"ENABLE_VLLM_HEALTH_CHECK" value: { string_value: "true" }' in text
    vol = next(v for v in deployment(ctx)["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-repository")
    assert [i["path"] for i in vol["configMap"]["items"]] == [
        f"{ctx.served_model_name}/config.pbtxt", f"{ctx.served_model_name}/1/model.json"]


def test_the_container_runs_the_openai_frontend_on_the_gateway_port_with_triton_probes():
    ctx = ctx_for(STACK, serving__triton__kserve_http_port=8085)
    c = container(ctx)
    assert c["name"] == "triton" and c["command"] == ["python3", triton.OPENAI_FRONTEND]
    args = c["args"]

    def flag(name):
        return args[args.index(name) + 1]
    assert flag("--openai-port") == "8000" and flag("--kserve-http-port") == "8085"
    assert flag("--load-model") == ctx.served_model_name and flag("--model-control-mode") == "explicit"
    assert flag("--default-max-tokens") == "4096" and flag("--tokenizer") == f"/model-cache/{ctx.model.name}"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"http": 8000, "kserve-http": 8085, "grpc": 8001}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "kserve-http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "kserve-http"}
    budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert budget >= ctx.settings.serving.startup_timeout_seconds
    # everything else is the vLLM container's: the same GPUs, drain and security
    vllm = container(ctx_for("dev"))
    for key in ("resources", "lifecycle", "securityContext", "image"):
        assert c[key] == vllm[key] or key == "image"


def test_streamed_weights_source_credentials_and_read_the_tokenizer_fetched_at_start():
    ctx = ctx_for(STACK, serving__weights_mode="stream")
    c = container(ctx)
    assert c["command"][:2] == ["/bin/sh", "-c"] and triton.OPENAI_FRONTEND in c["command"][2]
    assert c["args"][c["args"].index("--tokenizer") + 1] == f"/model-meta/{ctx.model.name}"
    assert {"name": "model-meta", "mountPath": "/model-meta", "readOnly": True} in c["volumeMounts"]
    doc = json.loads(repository(ctx)["data"]["model.json"])
    assert doc["model"].startswith("s3://") and doc["load_format"] == "runai_streamer"


def test_the_vllm_stacks_render_no_triton():
    ctx = ctx_for("dev")
    assert container(ctx)["name"] == "vllm"
    assert not [o for o in manifests.render(ctx) if o["kind"] == "ConfigMap"]


# --------------------------------------------------------------------------- metrics


def triton_reference() -> dict[str, str]:
    out = {}
    for line in (DATA / "triton-metrics.txt").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            out[parts[0]] = parts[1]
    return out


def test_the_backend_list_in_the_code_is_the_documented_one():
    ref = triton_reference()
    assert triton.VLLM_BACKEND_METRICS == {n for n in ref if n.startswith("vllm:")}
    assert triton.HISTOGRAMS == {n for n, t in ref.items() if n.startswith("vllm:") and t == "histogram"}


def test_every_metric_read_behind_triton_is_on_tritons_metrics():
    from test_metrics_contract import ALLOWED, dcgm_reference, recorded_names

    ctx = ctx_for(STACK)
    ref, dcgm, recorded = triton_reference(), dcgm_reference(), recorded_names(ctx)

    def exists(name: str) -> bool:
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and ref.get(name[: -len(suffix)]) == "histogram":
                base = name[: -len(suffix)]
        return (base in ref or name in dcgm or name in recorded
                or (name in ALLOWED and name != "http_requests_total"))

    unknown = {}
    for where, expr in queries.all_queries(ctx):
        if where.startswith("dashboard"):
            continue  # the vLLM dashboard is shared; its vLLM-only panels stay empty here
        for name in monitoring.metric_names(expr):
            if not exists(name):
                unknown.setdefault(name, []).append(where)
    assert not unknown, unknown


def test_rules_reading_what_triton_lacks_are_left_out_and_triton_rules_added():
    ctx = ctx_for(STACK)
    alerts = set(monitoring.alert_names(ctx))
    assert {"TritonRequestErrorRateHigh", "TritonQueueTimeHigh", "VllmTimeToFirstTokenP99High",
            "VllmEndToEndLatencyP99High", "GpuXidHardware"} <= alerts
    assert not alerts & {"VllmErrorRateHigh", "VllmKVCacheHigh", "VllmQueueGrowingWhileKVCacheFull"}
    assert "VllmErrorRateHigh" in monitoring.alert_names(ctx_for("dev"))
    monitor = next(o for o in monitoring.render(ctx) if o["kind"] == "PodMonitor" and o["metadata"]["name"].endswith("-vllm"))
    (relabel,) = monitor["spec"]["podMetricsEndpoints"][0]["metricRelabelings"]
    assert relabel["sourceLabels"] == ["model"] and relabel["targetLabel"] == "model_name"


def test_autoscaling_reads_tritons_queue_and_success_counters():
    trig = {t["name"]: t["metadata"]["query"] for t in autoscaling.triggers(ctx_for(STACK))}
    assert trig["waiting-requests"].startswith("sum(nv_inference_pending_request_count{")
    assert "rate(nv_inference_request_success{" in trig["request-rate"]
    # no KV-cache trigger: Triton does not re-export vLLM's KV cache usage (tests/data/triton-metrics.txt),
    # so the pending count is the saturation signal
    assert set(trig) == {"waiting-requests", "request-rate"}


def test_the_example_stack_previews_without_a_mandatory_violation():
    result = preview.run_preview(STACK, mode="existing")
    assert [v for v in result.violations if v["enforcement_level"] == "mandatory"] == []


# --------------------------------------------------------------------------- real tools


@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.integration
def test_model_json_is_accepted_by_the_real_vllm_engine_args():
    """What the backend does with model.json: AsyncEngineArgs(**model_json) (imports vLLM,
    ~40 s here, hence integration)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    for stack, changes in ((STACK, {}), (STACK, {"serving__engine__kv_cache_dtype": "fp8",
                                                 "serving__weights_mode": "stream"})):
        doc = json.loads(repository(ctx_for(stack, **changes))["data"]["model.json"])
        assert set(doc) <= {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        built = AsyncEngineArgs(**doc)
        assert built.max_model_len == doc["max_model_len"] and built.disable_log_stats is False


@pytest.mark.integration
def test_triton_alerts_through_promtool(tmp_path):
    from test_promtool import case_values, write_rules

    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install -y prometheus (CI's .ci/run does)"
    ctx = ctx_for(STACK)
    write_rules(ctx, tmp_path, summary_only=True)
    values = case_values(ctx)
    values.update(model=ctx.served_model_name,
                  t=f'{monitoring.vllm_selector(ctx)},pod="{values["pod"]}",model="{ctx.served_model_name}",'
                    f'model_name="{ctx.served_model_name}",version="1"')
    fires, quiet = set(), set()
    for f in sorted(PROMTOOL_CASES.glob("*.yaml")):
        doc = monitoring.fill(yaml.safe_load(f.read_text()), values)
        for t in doc["tests"]:
            for a in t["alert_rule_test"]:
                (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
        (tmp_path / f.name).write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
        res = subprocess.run([promtool, "test", "rules", f.name], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
    triton_alerts = {a for a in monitoring.alert_names(ctx) if a.startswith("Triton")}
    assert triton_alerts == fires == quiet
    # every query shipped for this server parses (autoscaler, canary analysis, rules)
    shipped = [{"record": f"check:query_{i}", "expr": q} for i, (_, q) in enumerate(queries.all_queries(ctx))]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": shipped}]}))
    res = subprocess.run([promtool, "check", "rules", "recording.yaml", "alerts.yaml", "queries.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
