"""`dsvolc bench` without an endpoint: the load generator's flags (parsed by vLLM's own
`vllm bench serve` parser), its result files (written by vLLM 0.32's bench against a real
CPU vLLM behind vllm-router: tests/data/SOURCES.md), the prediction against the
performance model, and bad input. The whole command against a live endpoint:
tests/test_bench_vllm.py."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dsvolc import bench
from dsvolc.cli import app
from vllm_harness import free_port

DATA = Path(__file__).parent / "data" / "bench"
COMPLETED = DATA / "vllm-0.32-completed.json"  # 4 prompts of 32 in / 8 out at concurrency 2
UNAUTHORIZED = DATA / "vllm-0.32-unauthorized.json"  # the same load with a wrong token
LOG = DATA / "vllm-0.32-bench.log"  # the log of that wrong-token run
REFUSED = DATA / "vllm-0.32-refused.log"  # the log of a run against a port nothing listens on


def _cfg(profile="chat", concurrency=(1, 4), num_prompts=None, **kw) -> bench.Config:
    return bench.Config("http://127.0.0.1:9", "served", "tok/path", bench.profile_for(profile, **kw),
                        tuple(concurrency), num_prompts)


def _pairs(args: list[str]) -> dict[str, str]:
    return {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}


# ---------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(bench.PROFILES))
def test_a_profile_renders_the_random_dataset_at_its_lengths(name):
    p = bench.PROFILES[name]
    args = bench.bench_args(_cfg(name), 4, "/r")
    kv = _pairs(args)
    assert (kv["--random-input-len"], kv["--random-output-len"], kv["--random-range-ratio"]) == (
        str(p.input_tokens), str(p.output_tokens), f"{p.range_ratio:g}")
    assert kv["--dataset-name"] == "random" and kv["--max-concurrency"] == "4"
    assert kv["--num-prompts"] == str(bench.PROMPTS_PER_CONCURRENCY * 4)  # InferenceMAX: 10 per unit
    assert (kv["--result-dir"], kv["--result-filename"]) == ("/r", "concurrency-4.json")
    assert "--ignore-eos" in args and "--save-result" in args


def test_the_profiles_are_inferencemax_pairs():
    assert {n: (p.input_tokens, p.output_tokens) for n, p in bench.PROFILES.items()} == {
        "chat": (1024, 1024), "reasoning": (1024, 8192), "long-context": (8192, 1024)}


def test_lengths_and_prompts_given_replace_the_profile():
    kv = _pairs(bench.bench_args(_cfg("reasoning", num_prompts=3, input_len=32, output_len=8, range_ratio=0.0),
                                 2, "/r"))
    assert (kv["--random-input-len"], kv["--random-output-len"], kv["--random-range-ratio"],
            kv["--num-prompts"]) == ("32", "8", "0", "3")


@pytest.mark.engine
@pytest.mark.parametrize("name", list(bench.PROFILES))
def test_vllms_own_parser_reads_every_flag(name):
    from engine_extra import require

    require("vllm")
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    cfg = _cfg(name)
    a = parser.parse_args(bench.bench_args(cfg, 8, "/r"))
    p = cfg.profile
    assert (a.backend, a.base_url, a.endpoint, a.dataset_name) == ("openai", cfg.url, "/v1/completions", "random")
    assert (a.model, a.served_model_name, a.tokenizer) == ("served", "served", "tok/path")
    assert (a.random_input_len, a.random_output_len) == (p.input_tokens, p.output_tokens)
    assert float(a.random_range_ratio) == p.range_ratio  # vLLM reads a plain float or a JSON dict
    assert (a.max_concurrency, a.num_prompts, a.request_rate) == (8, 80, float("inf"))
    assert a.ignore_eos and a.save_result and a.disable_tqdm and not a.save_detailed
    assert (a.percentile_metrics, a.metric_percentiles) == ("ttft,tpot,itl,e2el", "50,90,99")


def test_dry_run_prints_one_command_per_concurrency_and_never_the_token():
    r = CliRunner().invoke(app, ["bench", "dev", "--token", "secret-token-123", "--concurrency", "1,8",
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if "vllm bench serve" in ln]
    assert len(lines) == 2 and "--max-concurrency 1 " in lines[0] and "--max-concurrency 8 " in lines[1]
    assert "secret-token-123" not in r.output
    assert all(ln.startswith('OPENAI_API_KEY="$DSVOLC_TOKEN" vllm bench serve ') for ln in lines)
    from stacks import load

    s = load("dev")
    assert f"--base-url https://{s.gateway.tls.domain} " in lines[0]  # the stack's public endpoint
    assert "--tokenizer deepseek-ai/DeepSeek-R1-Distill-Qwen-7B " in lines[0]  # its model's Hugging Face id


# ---------------------------------------------------------------------------
# bad input: exit 2, the option named, no traceback
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "0", "-1", "1.5", "a", "1,,2", "4;8"])
def test_a_bad_concurrency_list_names_the_option(text):
    with pytest.raises(bench.BenchError, match="--concurrency: expected a comma-separated list"):
        bench.parse_concurrency(text)


def test_a_concurrency_list_keeps_its_order_without_repeats():
    assert bench.parse_concurrency("8, 1,8,64") == [8, 1, 64]


@pytest.mark.parametrize("args, named", [
    (["dev", "--profile", "batch"], "--profile: expected one of chat, reasoning, long-context, got 'batch'"),
    (["dev", "--concurrency", "1,two"], "--concurrency: expected a comma-separated list of positive integers"),
    (["dev", "--concurrency", "0"], "--concurrency"),
    (["dev", "--range-ratio", "1"], "--range-ratio: expected a number in [0, 1)"),
    (["dev", "--input-len", "0"], "--input-len: expected a positive integer"),
    (["--base-url", "127.0.0.1:8000"], "--base-url: expected http[s]://host[:port]"),
    ([], "expected a STACK or --base-url"),
    (["no-such-stack"], "error:"),
    # dev serves 16,384 tokens: 20,000 +20% does not fit
    (["dev", "--input-len", "20000"], "exceed stack dev's max_model_len 16,384; give a shorter --input-len"),
])
def test_bad_input_is_a_usage_error_naming_the_option(args, named):
    r = CliRunner().invoke(app, ["bench", *args, "--token", "t", "--dry-run"])
    assert r.exit_code == 2, r.output
    assert named in r.output and "Traceback" not in r.output


def test_a_stacks_endpoint_needs_a_token(monkeypatch):
    monkeypatch.delenv("DSVOLC_TOKEN", raising=False)
    r = CliRunner().invoke(app, ["bench", "dev", "--dry-run"])
    assert r.exit_code == 2 and "--token: expected the API token" in r.output
    # any other endpoint may be open
    r = CliRunner().invoke(app, ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--dry-run"])
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------

def test_a_real_result_reads_as_vllm_wrote_it():
    doc = json.loads(COMPLETED.read_text())
    m = bench.parse_result(doc)
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (4, 0, 32)
    assert m["output_throughput"] == doc["output_throughput"] and m["duration_s"] == doc["duration"]
    for metric in bench.METRICS:
        v = m[f"{metric}_ms"]
        assert v == {"mean": doc[f"mean_{metric}_ms"], "p50": doc[f"p50_{metric}_ms"],
                     "p90": doc[f"p90_{metric}_ms"], "p99": doc[f"p99_{metric}_ms"]}
        assert 0 < v["p50"] <= v["p90"] <= v["p99"]
    assert m["first_error"] is None


def test_a_run_where_every_request_failed_has_no_latencies():
    m = bench.parse_result(json.loads(UNAUTHORIZED.read_text()), "Unauthorized")
    assert (m["completed"], m["failed"]) == (0, 1)
    assert all(m[f"{x}_ms"] is None for x in bench.METRICS)  # vLLM writes 0.0: not a latency
    assert m["first_error"] == "Unauthorized"


def test_a_result_without_a_figure_names_it():
    doc = json.loads(COMPLETED.read_text())
    del doc["p90_itl_ms"]
    with pytest.raises(ValueError, match="p90_itl_ms: expected a number"):
        bench.parse_result(doc)


def test_the_first_error_of_each_run_comes_from_the_log():
    text = LOG.read_text()
    assert bench.run_errors(text) == {1: "Unauthorized"}
    # a connection refused: vLLM prints the chained traceback; the message is its last exception
    refused = bench.run_errors(REFUSED.read_text())
    assert list(refused) == [1] and refused[1].startswith(
        "aiohttp.client_exceptions.ClientConnectorError: Cannot connect to host 127.0.0.1:")
    two = f"{bench.RUN_MARK}4\nError 0: boom\nError 1: other\n{text}"
    assert bench.run_errors(two) == {4: "boom", 1: "Unauthorized"}


# ---------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------

def _reference(stack: str, c: int, i: int, o: int):
    """The performance model called directly, as `dsvolc size` does (dsvolc/size_perf.py)."""
    from capacity.perf import Layout, estimate, gpu_perf, load_hardware
    from stacks.loader import load_plan

    sp = load_plan(stack)
    p, hw = sp.serving.engine, load_hardware()
    lay = Layout.from_plan(p, rdma_gb_s=hw.rdma_gb_s_per_gpu(sp.serving_pool.hardware.instance_type,
                                                              p.gpus_per_node))
    return estimate(sp.serving.model, gpu_perf(p.gpu, hw), lay, concurrency=c, input_tokens=i, output_tokens=o,
                    quantization=p.quantization, kv_cache_dtype=p.kv_cache_dtype,
                    max_num_batched_tokens=p.max_num_batched_tokens, hw=hw)


@pytest.mark.parametrize("stack, profile, c", [("dev", "chat", 8), ("prod", "long-context", 32)])
def test_the_prediction_is_the_performance_models_for_the_stacks_plan(stack, profile, c):
    prof = bench.PROFILES[profile]
    got = bench.predict(bench.basis_for(stack, 1), prof, c)
    ref = _reference(stack, c, prof.input_tokens, prof.output_tokens)
    assert got["ttft_ms"] == pytest.approx(ref.ttft_s * 1e3)
    assert got["itl_ms"] == pytest.approx(ref.itl_s * 1e3)
    assert got["request_throughput"] == pytest.approx(ref.requests_per_s)
    assert got["output_throughput"] == pytest.approx(ref.output_tokens_per_s_per_gpu * ref.gpus)


def test_the_concurrency_spreads_over_the_replicas():
    prof = bench.PROFILES["chat"]
    got = bench.predict(bench.basis_for("dev", 2), prof, 3)  # replicas at 2 and 1
    two, one = (_reference("dev", n, prof.input_tokens, prof.output_tokens) for n in (2, 1))
    rps = two.requests_per_s + one.requests_per_s
    assert got["request_throughput"] == pytest.approx(rps)
    assert got["ttft_ms"] == pytest.approx((two.ttft_s * two.requests_per_s + one.ttft_s * one.requests_per_s)
                                           / rps * 1e3)
    assert got["concurrency_per_replica"] == 2


def test_a_concurrency_beyond_the_kv_cache_is_flagged():
    from capacity.sizing import Workload, max_concurrency
    from stacks.loader import load_plan

    prof = bench.PROFILES["chat"]
    held = max_concurrency(load_plan("dev").serving.engine, Workload(prof.input_tokens, prof.output_tokens))
    basis = bench.basis_for("dev", 1)
    assert bench.predict(basis, prof, held)["fits_kv_cache"] is True
    assert bench.predict(basis, prof, held + 1)["fits_kv_cache"] is False


def test_the_table_sets_measured_beside_predicted(tmp_path):
    shutil.copy(COMPLETED, tmp_path / "concurrency-2.json")
    cfg = _cfg("chat", concurrency=(2, 4), num_prompts=4, input_len=32, output_len=8, range_ratio=0.0)
    basis = bench.basis_for("dev", 1)
    doc = bench.document(cfg, "dev", basis, tmp_path, None)
    json.dumps(doc)  # --json prints it
    two, four = doc["runs"]
    assert four["measured"] is None and four["result_file"] is None  # no result for 4: not made up
    assert two["predicted"] == bench.predict(basis, cfg.profile, 2)
    assert two["meets_slo"] == {"ttft_p99": True, "itl_mean": True, "e2e_p99": True}  # 32/8 tokens on CPU
    out = io.StringIO()
    bench.render(doc, Console(file=out, width=200))
    text = out.getvalue()
    m = two["measured"]
    ttft = next(ln for ln in text.splitlines() if "TTFT ms" in ln)
    assert f"{m['ttft_ms']['p99']:,.1f}" in ttft and f"{two['predicted']['ttft_ms']:,.1f}" in ttft
    assert "capacity/perf.py" in text and "InferenceMAX" in text and "no result" in text


# ---------------------------------------------------------------------------
# the load generator itself, with nothing to measure
# ---------------------------------------------------------------------------

def test_nothing_listening_fails_every_request_with_the_reason(tiny_qwen2, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    r = CliRunner().invoke(app, ["bench", "--base-url", url, "--model", "m", "--tokenizer", str(tiny_qwen2),
                                 "--input-len", "16", "--output-len", "4", "--concurrency", "1", "--num-prompts",
                                 "2", "--results", str(tmp_path), "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    m = doc["runs"][0]["measured"]
    assert (m["completed"], m["failed"]) == (0, 2) and "Cannot connect" in m["first_error"]
    assert doc["prediction"] is None and doc["load_generator"]["version"]


@pytest.mark.engine
def test_a_load_generator_that_fails_names_the_run(tmp_path):
    from engine_extra import require

    require("vllm")
    r = CliRunner().invoke(app, ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--tokenizer",
                                 str(tmp_path / "no-tokenizer"), "--concurrency", "2", "--results", str(tmp_path)])
    assert r.exit_code == 1, r.output
    assert "error: vllm bench serve failed at concurrency 2 (exit 1): " in r.output
    assert str(tmp_path / "bench.log") in r.output and "Traceback" not in r.output
