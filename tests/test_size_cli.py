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
KEYS = {"fits", "model", "gpu", "node", "replica", "weights_format", "kv_cache_dtype", "reasons", "notes"}
FIT_KEYS = KEYS | {"memory_per_gpu", "kv_cache", "engine", "concurrency"}


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
