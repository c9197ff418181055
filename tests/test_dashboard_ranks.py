"""The dashboard breaks a replica's data-parallel engines out per rank, so an imbalance
between ranks is visible: vLLM labels each engine's series with `engine`
(vllm/v1/metrics/loggers.py, PrometheusStatLogger: labelnames ["model_name", "engine"]),
and a multi-node replica's leader exports every rank's series, which the per-pod panels
sum. The queries are evaluated by a real Prometheus on an exposition that vLLM's own
PrometheusStatLogger writes for four engines, one of them overloaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

import local_apis
from test_autoscaling import ctx_for
from test_metrics_contract import in_vllm, vllm_reference
from workloads.observability import monitoring

RANK_PANELS = {
    "Requests running per DP rank": "vllm:num_requests_running",
    "Requests waiting per DP rank": "vllm:num_requests_waiting",
    "KV cache usage per DP rank": "vllm:kv_cache_usage_perc",
    "Generated tokens/s per DP rank, and busiest / mean rank": "vllm:generation_tokens_total",
}
# (running, waiting, KV usage, generated tokens) per engine: rank 0 carries four times the others
RANKS = [(12, 5, 0.9, 400), (2, 0, 0.2, 90), (3, 0, 0.25, 100), (3, 0, 0.3, 110)]

GENERATE = """
import sys
from types import SimpleNamespace
import prometheus_client
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.v1.metrics.stats import IterationStats, SchedulerStats
c = VllmConfig()
object.__setattr__(c, "model_config", SimpleNamespace(served_model_name="deepseek", max_model_len=4096,
                                                      is_diffusion=False))
ranks = %r
logger = PrometheusStatLogger(c, engine_indexes=list(range(len(ranks))))
for i, (run, wait, kv, gen) in enumerate(ranks):
    it = IterationStats()
    it.num_generation_tokens = gen
    logger.record(scheduler_stats=SchedulerStats(num_running_reqs=run, num_waiting_reqs=wait, kv_cache_usage=kv),
                  iteration_stats=it, engine_idx=i)
sys.stdout.write(prometheus_client.generate_latest().decode())
"""


def rank_panels(model: dict) -> dict[str, dict]:
    return {p["title"]: p for p in model["panels"] if p["title"] in RANK_PANELS}


def test_the_rank_panels_group_by_engine_over_metrics_vllm_serves():
    model = monitoring.dashboard(ctx_for("prod"))
    panels = rank_panels(model)
    assert set(panels) == set(RANK_PANELS)
    ref = vllm_reference()
    for title, metric in RANK_PANELS.items():
        first = panels[title]["targets"][0]["expr"]
        assert metric in first and re.search(r"by \(pod, engine\)", first), title
        assert "{{engine}}" in panels[title]["targets"][0]["legendFormat"]
        for t in panels[title]["targets"]:
            assert all(in_vllm(n, ref) for n in monitoring.metric_names(monitoring.as_promql(t["expr"]))), t
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    # the panels sit below their row, inside the dashboard's width
    for p in panels.values():
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24


@pytest.fixture(scope="module")
def vllm_exposition() -> str:
    """The exposition vLLM's own logger writes (the engine extra's vLLM, in a child process)."""
    return subprocess.run([sys.executable, "-c", GENERATE % (RANKS,)], capture_output=True, text=True,
                          timeout=300, check=True).stdout


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, vllm_exposition):
    text = vllm_exposition
    assert 'vllm:num_requests_running{engine="3",model_name="deepseek"} 3.0' in text
    # what the PodMonitor adds to every scraped series
    text = re.sub(r"^(vllm:\w+)\{", r'\1{namespace="deepseek-serving",pod="deepseek-0",', text, flags=re.M)
    prom = local_apis.Prometheus(tmp_path_factory.mktemp("prom"), ("vllm",))
    prom.set("vllm", text)
    yield prom
    prom.close()


def query(prom, expr: str) -> list[dict]:
    url = f"{prom.url}/api/v1/query?query={urllib.parse.quote(monitoring.as_promql(expr))}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


@pytest.mark.engine  # vLLM writes the exposition; a real Prometheus (integration) evaluates it
def test_each_rank_is_its_own_series_and_the_imbalance_shows(prometheus):
    panels = rank_panels(monitoring.dashboard(ctx_for("prod")))
    for title, column in (("Requests running per DP rank", 0), ("Requests waiting per DP rank", 1),
                          ("KV cache usage per DP rank", 2)):
        got = {r["metric"]["engine"]: float(r["value"][1]) for r in query(prometheus, panels[title]["targets"][0]["expr"])}
        assert got == {str(i): float(v[column]) for i, v in enumerate(RANKS)}, title
    tokens = query(prometheus, panels["Generated tokens/s per DP rank, and busiest / mean rank"]["targets"][0]["expr"])
    assert sorted(r["metric"]["engine"] for r in tokens) == ["0", "1", "2", "3"]
    (ratio,) = query(prometheus, panels["Generated tokens/s per DP rank, and busiest / mean rank"]["targets"][1]["expr"])
    mean = sum(r[0] for r in RANKS) / len(RANKS)
    assert float(ratio["value"][1]) == pytest.approx(12 / mean)  # 2.4: rank 0 runs 2.4x the mean
    # the per-pod panel of the same figure is one number: the imbalance is invisible there
    per_pod = next(p for p in monitoring.dashboard(ctx_for("prod"))["panels"] if p["title"] == "Requests waiting and running")
    (running,) = query(prometheus, per_pod["targets"][1]["expr"])
    assert float(running["value"][1]) == sum(r[0] for r in RANKS) and "engine" not in running["metric"]
