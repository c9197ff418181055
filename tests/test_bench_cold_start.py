"""The cold-start benchmark runs on every shipped stack, counts the bytes each node really
syncs (the whole checkpoint, as the rendered sync copies it), and says so when a stack has
something it cannot cost."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from capacity.planner import checkpoint_bytes
from stacks import load_plan

ROOT = Path(__file__).resolve().parents[1]

import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_cold_start as bench  # noqa: E402


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "cold_start.json"
    assert bench.main(["--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_shipped_stack_is_costed(results):
    shipped = sorted(p.name.split(".")[1] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
    assert len(shipped) >= 5 and "prod" in shipped
    assert sorted(results["stacks"]) == shipped
    # and the committed figures cover the same stacks
    committed = json.loads((ROOT / "benchmarks" / "results" / "cold_start.json").read_text())
    assert sorted(committed["stacks"]) == shipped


def test_each_node_syncs_the_whole_checkpoint(results):
    for stack, r in results["stacks"].items():
        plan = load_plan(stack)
        s = plan.settings
        full = checkpoint_bytes(plan.serving.model, s.serving.engine.quantization) / 1e9
        if s.serving.weights_mode == "sync":
            assert r["gb_synced_per_node"] == round(full, 1), stack
            assert r["gb_synced_per_replica"] == round(full * plan.serving.engine.nodes, 1), stack
        else:
            assert r["gb_synced_per_node"] == 0, stack
    prod = results["stacks"]["prod"]
    # prod's two nodes each copy the 673 GB checkpoint, though each loads only its share
    assert prod["nodes_per_replica"] == 2 and prod["gb_synced_per_node"] > 600
    assert prod["gb_loaded_per_node"] < prod["gb_synced_per_node"]
    plan = load_plan("prod")
    assert prod["gb_loaded_per_node"] == round(plan.serving.engine.weights_bytes_per_gpu * 8 / 1e9, 1)


def test_prods_disk_class_is_costed(results):
    # the shipped prod's ESSD_FlexPL raised KeyError before
    prod = results["stacks"]["prod"]
    assert prod["disk"] == "ESSD_FlexPL"
    sc = prod["scenarios"]
    rate = bench.INPUTS["disk_mb_s"][0]["ESSD_FlexPL"] * 1e6
    assert abs(sc["cold"]["phases_s"]["load"] - prod["gb_loaded_per_node"] * 1e9 / rate) < 1
    assert sc["prewarm, known node"]["phases_s"]["sync"] == 0 < sc["cold"]["phases_s"]["sync"]


def test_an_unknown_disk_class_is_named(monkeypatch, capsys):
    table = copy.deepcopy(bench.INPUTS["disk_mb_s"][0])
    del table["ESSD_FlexPL"]
    monkeypatch.setitem(bench.INPUTS, "disk_mb_s", (table, "test"))
    assert bench.main(["--stack", "prod", "--out", "/dev/null"]) == 1
    err = capsys.readouterr().err
    assert "prod: cluster.gpu_pools.h20.data_disk_type is 'ESSD_FlexPL'" in err and "Traceback" not in err
