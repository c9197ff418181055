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
KEYS = {"fits", "tensor_parallel_size", "pipeline_parallel_size", "nodes",
        "weights_bytes_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_tokens",
        "max_model_len", "max_num_seqs", "gpu_memory_utilization", "reasons"}


def run(*args: str):
    return runner.invoke(app, ["size", *args])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_json_answer_for_every_model_and_gpu(model):
    for gpu in GPUS:
        res = run("--model", model, "--gpu", gpu, "--json")
        assert res.exit_code in (0, 1), res.output
        data = json.loads(res.stdout)
        assert KEYS <= set(data)
        assert res.exit_code == (0 if data["fits"] else 1)


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


def test_unknown_model_exits_2_with_known_names():
    res = run("--model", "gpt-5", "--gpu", "H100")
    assert res.exit_code == 2
    assert "deepseek-r1-distill-qwen-32b" in res.output
    assert "Traceback" not in res.output


def test_unknown_gpu_exits_2_with_known_names():
    res = run("--model", "deepseek-v3", "--gpu", "B200", "--json")
    assert res.exit_code == 2
    assert "H200" in res.output and "Traceback" not in res.output


def test_bad_option_value_exits_2():
    res = run("--model", "deepseek-v3", "--gpu", "H200", "--kv-cache-dtype", "int2")
    assert res.exit_code == 2 and "kv_cache_dtype" in res.output


def test_instance_type_sets_gpu_and_count():
    res = run("--model", "deepseek-r1-distill-qwen-1.5b", "--gpu", "ecs.gni2.3xlarge", "--json")
    data = json.loads(res.stdout)
    assert data["gpu"] == "A10" and data["gpus_per_node"] == 1


@pytest.mark.parametrize("itype,gpu,count", [("ecs.hpcpni3ln.45xlarge", "H20", 8), ("ecs.pni2.14xlarge", "A100-80G", 4),
                                             ("ecs.ebmhpcpni2l.32xlarge", "A800", 8)])
def test_catalogued_gpu_instance_types_size_a_model(itype, gpu, count):
    res = run("--model", "deepseek-r1-distill-llama-70b", "--gpu", itype, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["gpu"] == gpu and data["gpus_per_node"] == count


def test_local_model_dir(tiny_llama):
    res = run("--model", str(tiny_llama), "--gpu", "A10", "--json")
    assert res.exit_code == 0, res.output
    # 2 (K,V) x 2 layers x 1 KV head x 64 x 4 bytes (the tiny llama is float32)
    assert json.loads(res.stdout)["kv_bytes_per_token_per_gpu"] == 2 * 2 * 1 * 64 * 4
