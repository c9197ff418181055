"""The shipped rules, alerts and queries through the real promtool (Debian `prometheus`).

* `promtool check rules` on the rule files exactly as rendered for each stack, and on
  the one-file form VMP receives;
* `promtool test rules` with the synthetic series in tests/promtool/*.yaml: every alert
  has a case that fires it and one that does not (checked below);
* every other query we ship (autoscaler triggers, canary analysis, dashboard panels)
  parses, and the autoscaler's and the analysis' compute what they claim on synthetic
  series.

The test files are templates like the rules (`${name}`, same values plus a few series
label sets below). For the unit tests each alert keeps only its `summary` annotation:
promtool compares annotations exactly, and repeating the runbook prose in the tests
would test nothing; `check rules` still parses every annotation template shipped.

promtool missing is a failure, not a skip: CI installs it (.ci/run).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from test_autoscaling import STACKS, ctx_for
from workloads.engine import autoscaling
from workloads.observability import monitoring
from workloads.observability import queries
from workloads.engine import rollout

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parent / "promtool"
TEST_FILES = sorted(TESTS_DIR.glob("*.yaml"))
MODEL = "deepseek"


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: apt-get install -y prometheus (CI's .ci/run does)"
    return path


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def humanize_duration(seconds: float) -> str:
    """Prometheus' humanizeDuration template function (template.go), for the summaries."""
    if seconds == 0:
        return "0s"
    if abs(seconds) >= 1:
        s = int(seconds)
        d, h, m, sec = s // 86400, s // 3600 % 24, s // 60 % 60, s % 60
        if d:
            return f"{d}d {h}h {m}m {sec}s"
        if h:
            return f"{h}h {m}m {sec}s"
        if m:
            return f"{m}m {sec}s"
        return f"{seconds:.4g}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(seconds) >= 1:
            break
        prefix, seconds = p, seconds * 1000
    return f"{seconds:.4g}{prefix}s"


def case_values(ctx) -> dict[str, str]:
    """The rules' template values plus the series label sets the test files use."""
    v = monitoring.template_values(ctx)
    budget = ctx.plan.slo.e2e_p99_seconds
    v.update(e2e_slow_lo=monitoring._num(2 * budget), e2e_slow_hi=monitoring._num(2 * budget + 100),
             e2e_slow_p99=humanize_duration(2 * budget + 99))
    pod = f"{ctx.release}-7d9f8-x2k4q"
    sel = monitoring.vllm_selector(ctx)
    minutes = ctx.settings.monitoring.at_max_replicas_minutes
    v.update(
        pod=pod,
        v=f'{sel},pod="{pod}",model_name="{MODEL}",engine="0"',  # a vLLM engine series
        p=f'{sel},pod="{pod}"',  # vLLM's HTTP server series (no model label)
        scrape=f'{sel},pod="{pod}",instance="10.0.0.7:8000"',  # the target's `up`
        sel=sel,
        # an Envoy proxy's series, and those of its API listener
        envoy_pod=f'{monitoring.envoy_selector()},pod="envoy-{ctx.namespace}-{ctx.release}-5f7d9-k2x8p"',
        e=f'{monitoring.envoy_selector()},pod="envoy-{ctx.namespace}-{ctx.release}-5f7d9-k2x8p",'
          f'envoy_http_conn_manager_prefix="{v["envoy_listener"]}"',
        at_max_samples=str(minutes + 30),
        at_max_pending=f"{minutes - 5}m",
        at_max_firing=f"{minutes + 10}m",
    )
    return v


def write_rules(ctx, out: Path, summary_only: bool = False) -> list[str]:
    names = []
    for name, groups in monitoring.rule_groups(ctx).items():
        groups = copy.deepcopy(groups)
        if summary_only:
            for g in groups:
                for r in g["rules"]:
                    if "annotations" in r:
                        r["annotations"] = {"summary": r["annotations"]["summary"]}
        (out / f"{name}.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000))
        names.append(f"{name}.yaml")
    return names


def write_tests(ctx, out: Path) -> list[str]:
    """Fill the test files; drop cases of alerts this stack does not render."""
    shipped = set(monitoring.alert_names(ctx))
    names = []
    for f in TEST_FILES:
        doc = monitoring.fill(yaml.safe_load(f.read_text()), case_values(ctx))
        for t in doc["tests"]:
            t["alert_rule_test"] = [a for a in t.get("alert_rule_test", []) if a["alertname"] in shipped]
        doc["tests"] = [t for t in doc["tests"] if t["alert_rule_test"] or t.get("promql_expr_test")]
        if doc["tests"]:
            (out / f.name).write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
            names.append(f.name)
    return names


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_rule_files_pass_check_rules(promtool, stack, tmp_path):
    ctx = ctx_for(stack)
    # The PrometheusRule objects' groups, exactly as shipped ...
    files = []
    for obj in monitoring.render(ctx):
        if obj["kind"] == "PrometheusRule":
            p = tmp_path / f"{obj['metadata']['name']}.yaml"
            p.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, sort_keys=False))
            files.append(p.name)
    # ... and the single file for VMP.
    (tmp_path / "vmp.yaml").write_text(monitoring.rule_file_content(ctx))
    res = run(promtool, "check", "rules", *files, "vmp.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(files) == 2


@pytest.mark.parametrize("stack", STACKS)
def test_alert_unit_tests(promtool, stack, tmp_path):
    ctx = ctx_for(stack)
    write_rules(ctx, tmp_path, summary_only=True)
    tests = write_tests(ctx, tmp_path)
    # every file runs, but the routing tier's where the stack has none (workloads/edge/router.py)
    assert len(tests) == len(TEST_FILES) - (0 if ctx.plan.router.enabled else 1)
    res = run(promtool, "test", "rules", *tests, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    fires, quiet = set(), set()
    for f in TEST_FILES:
        for t in yaml.safe_load(f.read_text())["tests"]:
            for a in t.get("alert_rule_test", []):
                (fires if a.get("exp_alerts") else quiet).add(a["alertname"])
    # over the shipped stacks: the routing tier's alerts exist where it is on (prod)
    shipped = {a for stack in STACKS for a in monitoring.alert_names(ctx_for(stack))}
    assert shipped - fires == set(), "alerts without a case that fires them"
    assert shipped - quiet == set(), "alerts without a case that must not fire"
    assert (fires | quiet) - shipped == set(), "cases for alerts that do not exist"


def test_the_unit_tests_catch_a_wrong_threshold(promtool, tmp_path):
    """Negative control: with an error threshold of 50%, the 9%-5xx case must fail."""
    ctx = ctx_for("dev", monitoring__error_rate=0.5)
    write_rules(ctx, tmp_path, summary_only=True)
    write_tests(ctx, tmp_path)
    res = run(promtool, "test", "rules", "errors.yaml", cwd=tmp_path)
    assert res.returncode != 0
    assert "VllmErrorRateHigh" in res.stdout + res.stderr


@pytest.mark.parametrize("stack", STACKS)
def test_every_shipped_query_parses(promtool, stack, tmp_path):
    ctx = ctx_for(stack)
    shipped = queries.all_queries(ctx)
    rules = [{"record": f"check:query_{i}", "expr": q} for i, (_, q) in enumerate(shipped)]
    (tmp_path / "queries.yaml").write_text(yaml.safe_dump({"groups": [{"name": "q", "rules": rules}]}))
    res = run(promtool, "check", "rules", "queries.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    kinds = {where.split()[0] for where, _ in shipped}
    assert kinds == {"ScaledObject", "AnalysisTemplate", "recording", "alerts", "dashboard"} or (
        ctx.multi_node and kinds == {"ScaledObject", "recording", "alerts", "dashboard"})


def test_autoscaler_and_analysis_queries_compute_what_they_claim(promtool, tmp_path):
    ctx = ctx_for("dev")
    trig = {t["name"]: t["metadata"]["query"] for t in autoscaling.render(ctx)[0]["spec"]["triggers"]}
    tmpl = next(o for o in rollout.render(ctx) if o["kind"] == "AnalysisTemplate")
    analysis = {m["name"]: m["provider"]["prometheus"]["query"] for m in tmpl["spec"]["metrics"]}
    canary, stable = "6c5d7f9b8", "84b6c9d7f"
    ns, sel = ctx.namespace, monitoring.vllm_selector(ctx)

    def close_to(expr, value):
        return {"expr": f"abs(({expr}) - {value}) < bool 1e-9", "eval_time": "5m",
                "exp_samples": [{"labels": "{}", "value": 1}]}

    def series(name, labels, values):
        return {"series": f"{name}{{{labels}}}", "values": values}

    def pod(p, h):
        return f'{sel},pod="{ctx.release}-{h}-{p}",model_name="{MODEL}",{monitoring.ROLLOUT_HASH_LABEL}="{h}"'

    busy = {
        "interval": "1m",
        "input_series": [
            # Waiting requests: 3 + 5 on our pods; another namespace's 100 must not count.
            series("vllm:num_requests_waiting", pod("a", stable), "3x10"),
            series("vllm:num_requests_waiting", pod("b", canary), "5x10"),
            series("vllm:num_requests_waiting", 'namespace="other",job="vllm",pod="x"', "100x10"),
            # Finished requests: 60/min + 120/min = 3/s.
            series("vllm:request_success_total", pod("a", stable) + ',finished_reason="stop"', "0+60x10"),
            series("vllm:request_success_total", pod("b", canary) + ',finished_reason="length"', "0+120x10"),
            # KV cache usage of our engines at 0.9 and 0.5 (mean 0.7); another namespace's
            # full cache is not ours.
            series("vllm:kv_cache_usage_perc", pod("a", stable), "0.9x10"),
            series("vllm:kv_cache_usage_perc", pod("b", canary), "0.5x10"),
            series("vllm:kv_cache_usage_perc", 'namespace="other",job="vllm",pod="x"', "1x10"),
            # Canary: 90 ok + 10 failed per minute -> 0.1; the stable's 5xx are not the canary's.
            series("http_requests_total", pod("b", canary) + ',handler="/v1/completions",status="2xx"', "0+90x10"),
            series("http_requests_total", pod("b", canary) + ',handler="/v1/completions",status="5xx"', "0+10x10"),
            series("http_requests_total", pod("a", stable) + ',handler="/v1/completions",status="5xx"', "0+1000x10"),
            # Canary latency: every request in (1, 5] s -> P99 = 1 + 4 x 0.99 = 4.96 s.
            series("vllm:e2e_request_latency_seconds_bucket", pod("b", canary) + ',le="1"', "0x10"),
            series("vllm:e2e_request_latency_seconds_bucket", pod("b", canary) + ',le="5"', "0+10x10"),
            series("vllm:e2e_request_latency_seconds_bucket", pod("b", canary) + ',le="+Inf"', "0+10x10"),
            series("vllm:e2e_request_latency_seconds_bucket", pod("a", stable) + ',le="+Inf"', "0+10x10"),
        ],
        # promtool 2.42 compares floats exactly; compare within 1e-9 instead (1 = true).
        "promql_expr_test": [
            close_to(trig["waiting-requests"], 8),
            close_to(trig["request-rate"], 3),
            close_to(trig["kv-cache-usage"], 0.7),
            close_to(rollout.with_args(analysis["error-rate"], canary), 0.1),
            close_to(rollout.with_args(analysis["p99-latency"], canary), 4.96),
        ],
    }
    # A canary without traffic (flat counters, or no series at all) passes: 0, not NaN or nothing.
    idle = {
        "interval": "1m",
        "input_series": [
            series("http_requests_total", pod("b", canary) + ',handler="/v1/completions",status="2xx"', "7x10"),
            series("vllm:e2e_request_latency_seconds_bucket", pod("b", canary) + ',le="+Inf"', "7x10"),
        ],
        "promql_expr_test": [
            {"expr": rollout.with_args(analysis[name], h), "eval_time": "5m",
             "exp_samples": [{"labels": "{}", "value": 0}]}
            for name in ("error-rate", "p99-latency") for h in (canary, "no-such-hash")
        ],
    }
    (tmp_path / "queries_test.yaml").write_text(yaml.safe_dump({"tests": [busy, idle]}, sort_keys=False))
    res = run(promtool, "test", "rules", "queries_test.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("model_class, fires", [("chat", True), ("reasoning", False)])
def test_a_two_minute_answer_is_slow_for_chat_and_normal_for_reasoning(promtool, tmp_path, model_class, fires):
    """The same traffic, every request taking 60-120 s (P99 119.4 s), against each class's
    default end-to-end budget: 30 s for chat fires, 480 s for reasoning stays quiet."""
    ctx = ctx_for("dev", monitoring__model_class=model_class)
    write_rules(ctx, tmp_path, summary_only=True)
    sel = case_values(ctx)["v"]
    series = [{"series": f'vllm:e2e_request_latency_seconds_bucket{{{sel},le="{le}"}}', "values": v}
              for le, v in (("60", "0x30"), ("120", "0+4x30"), ("+Inf", "0+4x30"))]
    expected = [{"exp_labels": {"severity": "warning", "namespace": ctx.namespace, "model_name": MODEL},
                 "exp_annotations": {"summary": "P99 end-to-end latency of deepseek is 1m 59s (threshold "
                                                f"{monitoring._num(ctx.plan.slo.e2e_p99_seconds)}s)"}}]
    test = {"rule_files": ["recording.yaml", "alerts.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [{"eval_time": "20m", "alertname": "VllmEndToEndLatencyP99High",
                             **({"exp_alerts": expected} if fires else {})}]}]}
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    res = run(promtool, "test", "rules", "class.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_humanize_duration_matches_the_summaries_promtool_checked():
    assert humanize_duration(119.4) == "1m 59s" and humanize_duration(4.975) == "4.975s"
    assert humanize_duration(0.4975) == "497.5ms" and humanize_duration(1059) == "17m 39s"
