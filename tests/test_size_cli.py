"""`dsvolc size` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from dsvolc.size import size
from capacity.catalog import GPUS, MODELS

app = typer.Typer()
app.command("size")(size)


@app.command("version")
def _version() -> None:  # a second command keeps `size` a named sub-command
    pass


runner = CliRunner()
KEYS = {"fits", "model", "gpu", "node", "replica", "weights_format", "kv_cache_dtype", "reasons", "notes", "why"}
FIT_KEYS = KEYS | {"memory_per_gpu", "kv_cache", "engine", "concurrency", "performance", "capacity", "cost"}


def run(*args: str):
    return runner.invoke(app, ["size", *args])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_json_answer_for_every_model_and_gpu(model):
    for gpu in GPUS:
        res = run("--model", model, "--gpu", gpu, "--json")
        assert res.exit_code in (0, 1), res.output
        data = json.loads(res.stdout)
        assert set(data) == (FIT_KEYS if data["fits"] else KEYS | {"memory_per_gpu"}), set(data)
        assert res.exit_code == (0 if data["fits"] else 1)
        # figures that cannot contradict each other
        r, node = data["replica"], data["node"]
        assert r["gpus"] == r["tensor_parallel_size"] * r["pipeline_parallel_size"] * r["data_parallel_size"]
        assert r["expert_parallel_size"] in (1, r["tensor_parallel_size"] * r["data_parallel_size"])
        assert r["nodes"] == -(-r["gpus"] // node["gpus"])
        if data["fits"]:
            e = data["engine"]
            assert (e["tensor_parallel_size"], e["pipeline_parallel_size"]) == (
                r["tensor_parallel_size"], r["pipeline_parallel_size"])
            assert data["kv_cache"]["tokens"] >= e["max_model_len"]
            perf = data["performance"]
            assert perf["source"] == "capacity/perf.py" and "calibrated" in perf["model"]
            assert 0 < perf["decode_tokens_per_s_per_gpu"] <= perf["physical_bound_tokens_per_s_per_gpu"]
            assert data["capacity"]["replicas"] >= 1 and data["cost"]["priced"] is False


def test_table_output():
    res = run("--model", "deepseek-r1-distill-llama-8b", "--gpu", "L20", "--context", "8192")
    assert res.exit_code == 0, res.output
    for word in ("weights", "reserve", "KV cache", "headroom", "tensor parallel size",
                 "KV cache capacity"):
        assert word in res.stdout


def test_not_fitting_exits_1_with_reasons():
    res = run("--model", "deepseek-v3", "--gpu", "H100", "--tp", "8", "--pp", "1", "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert not data["fits"] and any("short by" in r for r in data["reasons"])
    # a valid layout that runs out of memory shows the memory, but no engine settings
    assert "memory_per_gpu" in data and "engine" not in data and "kv_cache" not in data


def test_an_invalid_layout_prints_its_reasons_and_no_figures():
    res = run("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--tp", "3")
    assert res.exit_code == 1
    assert "does not divide num_attention_heads=28" in res.stdout
    assert "TP3 x PP1" in res.stdout
    for nonsense in ("max num seqs", "KV cache capacity", "GiB", "PP28"):
        assert nonsense not in res.stdout
    data = json.loads(run("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--tp", "3", "--json").stdout)
    assert set(data) == KEYS and data["replica"]["pipeline_parallel_size"] == 1


def _options(command):
    return [p for p in command.params if p.param_type_name == "option"]


def test_help_lists_the_catalog_and_documents_every_option():
    from dsvolc.cli import app as cli

    res = runner.invoke(cli, ["size", "--help"], terminal_width=200)
    assert res.exit_code == 0
    text = " ".join(res.stdout.split())
    for name in list(MODELS) + list(GPUS):
        assert name in text, name
    command = typer.main.get_command(cli).commands["size"]
    undocumented = [p.name for p in _options(command) if not p.help]
    assert undocumented == []


def test_short_flags_mean_the_same_on_every_command():
    from dsvolc.cli import app as cli

    shorts: dict[str, set[str]] = {}
    for name, command in typer.main.get_command(cli).commands.items():
        for param in _options(command):
            for opt in param.opts + param.secondary_opts:
                if len(opt) == 2:
                    shorts.setdefault(opt, set()).add(param.name)
    assert all(len(names) == 1 for names in shorts.values()), shorts
    assert shorts["-q"] == {"quiet"}


def test_an_uncatalogued_instance_type_says_what_to_pass():
    res = run("--model", "deepseek-r1", "--gpu", "ecs.hpcxyz.45xlarge")
    assert res.exit_code == 2
    assert "not in the instance catalog" in res.output and "--gpus-per-node" in res.output


def test_an_instance_type_with_a_different_gpu_count_is_refused():
    res = run("--model", "deepseek-r1-distill-qwen-1.5b", "--gpu", "ecs.gni2.3xlarge", "--gpus-per-node", "8")
    assert res.exit_code == 2 and "has 1 GPU(s) per node, got 8" in res.output


def test_unknown_model_exits_2_with_known_names():
    res = run("--model", "gpt-5", "--gpu", "H100")
    assert res.exit_code == 2
    assert "deepseek-r1-distill-qwen-32b" in res.output
    assert "Traceback" not in res.output


def test_unknown_gpu_exits_2_with_known_names():
    res = run("--model", "deepseek-v3", "--gpu", "B200", "--json")
    assert res.exit_code == 2
    assert "H200" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("args,closest", [
    (("--model", "deepseek-r1-distil-qwen-7b", "--gpu", "A10"), "did you mean deepseek-r1-distill-qwen-7b?"),
    (("--model", "deepseek-v3", "--gpu", "H2O"), "did you mean H20?"),
    (("--model", "deepseek-r1", "--gpu", "ecs.hpcpni3ln.45xlarg"), "did you mean ecs.hpcpni3ln.45xlarge?"),
])
def test_a_typo_exits_2_naming_the_closest_known_value(args, closest):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert closest in res.output and "Traceback" not in res.output


def test_bad_option_value_exits_2():
    res = run("--model", "deepseek-v3", "--gpu", "H200", "--kv-cache-dtype", "int2")
    assert res.exit_code == 2 and "kv_cache_dtype" in res.output


def test_instance_type_sets_gpu_and_count():
    res = run("--model", "deepseek-r1-distill-qwen-1.5b", "--gpu", "ecs.gni2.3xlarge", "--json")
    data = json.loads(res.stdout)
    assert data["gpu"] == "A10" and data["node"] == {
        "gpus": 1, "instance_type": "ecs.gni2.3xlarge", "gpu_memory_bytes": GPUS["A10"].memory_bytes}


@pytest.mark.parametrize("itype,gpu,count", [("ecs.hpcpni3ln.45xlarge", "H20", 8), ("ecs.pni2.14xlarge", "A100-80G", 4),
                                             ("ecs.ebmhpcpni2l.32xlarge", "A800", 8)])
def test_catalogued_gpu_instance_types_size_a_model(itype, gpu, count):
    res = run("--model", "deepseek-r1-distill-llama-70b", "--gpu", itype, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["gpu"] == gpu and data["node"]["gpus"] == count and data["node"]["instance_type"] == itype


def test_local_model_dir(tiny_llama):
    res = run("--model", str(tiny_llama), "--gpu", "A10", "--json")
    assert res.exit_code == 0, res.output
    # 2 (K,V) x 2 layers x 1 KV head x 64 x 4 bytes (the tiny llama is float32)
    assert json.loads(res.stdout)["kv_cache"]["bytes_per_token_per_gpu"] == 2 * 2 * 1 * 64 * 4


def test_table_prints_the_performance_estimate_with_its_model_named():
    res = run("--model", "deepseek-r1-distill-llama-8b", "--gpu", "L20", "--context", "8192")
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "model: capacity/perf.py, calibrated ±25% against 8 published figures" in text
    for word in ("TTFT", "ITL", "decode tok/s per GPU", "physical bound", "replicas"):
        assert word in text
    assert "no price" in text and "--price-per-hour" in text  # no invented price


def test_workload_flags_size_the_load_and_price_it():
    args = ("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--input-tokens", "1024",
            "--output-tokens", "256", "--target-rps", "12", "--itl-slo", "0.06", "--ttft-slo", "1.5", "--json")
    data = json.loads(run(*args).stdout)
    cap, perf = data["capacity"], data["performance"]
    assert cap["workload"] == {"input_tokens": 1024, "output_tokens": 256, "target_rps": 12.0,
                               "ttft_slo_s": 1.5, "itl_slo_s": 0.06, "concurrency": None}
    assert perf["input_tokens"] == 1024 and perf["output_tokens"] == 256
    assert cap["itl_s"] <= 0.06 and cap["ttft_s"] <= 1.5
    assert cap["replicas"] == -(-12 // cap["requests_per_s_per_replica"]) or \
        cap["replicas"] * cap["requests_per_s_per_replica"] >= 12 > (cap["replicas"] - 1) * cap["requests_per_s_per_replica"]
    assert cap["nodes"] == cap["replicas"] * data["replica"]["nodes"]
    priced = json.loads(run(*args, "--price-per-hour", "7.5", "--currency", "CNY").stdout)["cost"]
    assert priced["priced"] and priced["pricing_source"] == "--price-per-hour" and priced["currency"] == "CNY"
    assert priced["per_hour"] == 7.5 * cap["nodes"]
    fixed = json.loads(run(*args[:-1], "--concurrency", "4", "--json").stdout)
    assert fixed["performance"]["concurrency"] == 4 == fixed["capacity"]["concurrency_per_replica"]


def test_bad_workload_flags_exit_2_naming_the_flag():
    res = run("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--ttft-slo", "-1")
    assert res.exit_code == 2 and "ttft-slo" in res.output and "Traceback" not in res.output
    res = run("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--input-tokens", "0")
    assert res.exit_code == 2 and "input-tokens" in res.output


def test_compare_lists_feasible_layouts_ranked():
    res = run("--model", "deepseek-r1", "--gpu", "H20", "--context", "16384", "--target-rps", "20",
              "--itl-slo", "0.05", "--compare", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = data["rows"]
    assert len(rows) >= 3 and "calibrated" in data["model"]
    assert len({(r["instance_type"], r["layout"]) for r in rows}) == len(rows)
    gpus = [r["capacity"]["gpus"] for r in rows]
    assert gpus == sorted(gpus)  # unpriced: ranked by GPUs needed
    for r in rows:
        assert r["capacity"]["feasible"] and r["capacity"]["itl_s"] <= 0.05
    # expert parallelism across nodes appears only on instance types with RDMA
    from capacity.instances import INSTANCE_CATALOG
    for r in rows:
        if r["capacity"]["nodes"] and "EP" in r["layout"] and "2 node" in r["layout"]:
            assert r["instance_type"] and INSTANCE_CATALOG[r["instance_type"]].rdma
    table = runner.invoke(app, ["size", "--model", "deepseek-r1", "--gpu", "H20", "--context", "16384",
                                "--target-rps", "20", "--itl-slo", "0.05", "--compare"], env={"COLUMNS": "250"})
    text = " ".join(table.stdout.split())
    assert "feasible layouts" in text and "cost / M tok" in text and "Ranked by GPUs needed" in text


def test_compare_ranks_by_cost_when_priced(tmp_path):
    import yaml
    f = tmp_path / "prices.yaml"
    f.write_text(yaml.safe_dump({"currency": "CNY", "prices": {
        "ecs.hpcpni3ln.45xlarge": {"per_hour": 300.0, "source": "a quote", "read": "2026-12-01"},
        "ecs.ebmhpcpni3l.48xlarge": {"per_hour": 320.0, "source": "a quote", "read": "2026-12-01"}}}))
    res = run("--model", "deepseek-r1", "--gpu", "H20", "--context", "16384", "--target-rps", "20",
              "--itl-slo", "0.05", "--compare", "--pricing", str(f), "--json")
    rows = json.loads(res.stdout)["rows"]
    priced = [r for r in rows if r["cost"]["priced"]]
    assert priced and all(r["cost"]["pricing_source"] == str(f) for r in priced)
    costs = [r["cost"]["per_million_tokens"] for r in priced]
    assert costs == sorted(costs) and rows[:len(priced)] == priced


def test_a_malformed_pricing_file_exits_2_naming_the_entry(tmp_path):
    f = tmp_path / "prices.yaml"
    f.write_text("currency: CNY\nprices:\n  ecs.gni2.3xlarge: {per_hour: -1, source: x, read: '2026-12-01'}\n")
    res = run("--model", "deepseek-r1-distill-qwen-1.5b", "--gpu", "ecs.gni2.3xlarge", "--pricing", str(f))
    assert res.exit_code == 2 and "prices.ecs.gni2.3xlarge.per_hour" in res.output and "Traceback" not in res.output


def test_compare_with_an_unreachable_slo_says_so_and_exits_1():
    res = run("--model", "deepseek-r1-distill-qwen-7b", "--gpu", "A10", "--itl-slo", "0.0001", "--compare")
    assert res.exit_code == 1 and "no catalogued layout" in " ".join(res.stdout.split())
