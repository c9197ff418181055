"""A GPU pool whose instance type VolcEngine does not sell in one of its zones is refused at
preview, from the provider's own availability query (ecs.get_available_resources), naming
the setting and where the type is sold."""

from __future__ import annotations

import pytest

from dsvolc import engine
from infra.availability import PoolPlacement, refusals
from stacks import read_raw


def _sold_only_in(zones: set[str], status_elsewhere: str = "SoldOut"):
    from stacks.regions import REGION_ZONES

    def answer(instance_type):
        return {"availableZones": [
            {"regionId": r, "zoneId": z, "status": "Available",
             "availableResources": [{"type": "InstanceType", "supportedResources": [
                 {"value": instance_type, "status": "Available" if z in zones else status_elsewhere}]}]}
            for r, zs in REGION_ZONES.items() for z in zs]}
    return answer


@pytest.mark.parametrize("mode", ["new", "existing"])
def test_a_type_sold_out_in_a_pool_zone_stops_the_program(monkeypatch, mode):
    # prod places its H20 pool in cn-beijing-a; say only cn-beijing-e has any left
    monkeypatch.setattr(engine, "_available_answer", _sold_only_in({"cn-beijing-e"}))
    with pytest.raises(Exception) as exc:
        engine.run.__wrapped__("prod", read_raw("prod"), mode=mode)
    text = str(exc.value)
    assert "cluster.gpu_pools.h20.instance_type: ecs.hpcpni3ln.45xlarge is not available in cn-beijing-a" in text
    assert "it is available in cn-beijing-e" in text


def test_shipped_stacks_pass_when_every_zone_sells_the_type():
    rec = engine.run("dev", read_raw("dev"), mode="new")
    assert any(r.type == "volcengine:vke/nodePool:NodePool" for r in rec.resources)


def test_refusals_name_the_region_when_no_zone_sells_it():
    (msg,) = refusals([PoolPlacement("h20", "ecs.hpcpni3ln.45xlarge", ("ap-southeast-1a",))],
                      {"ecs.hpcpni3ln.45xlarge": {}}, "ap-southeast-1")
    assert "no zone of ap-southeast-1 offers it" in msg and "cluster.gpu_pools.h20.zones" in msg
    assert refusals([PoolPlacement("a10", "ecs.gni2.3xlarge", ("cn-beijing-a",))],
                    {"ecs.gni2.3xlarge": {"cn-beijing-a": "Available"}}, "cn-beijing") == []


def test_the_cli_says_so_in_one_line(monkeypatch, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from dsvolc.cli import app
    from stacks.loader import SETTINGS_KEY

    raw = read_raw("dev")
    raw["tags"] = {**raw.get("tags", {}), "case": "sold-out"}  # a run of its own, not the shared one
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": {SETTINGS_KEY: raw}}))
    monkeypatch.setattr(engine, "_available_answer", _sold_only_in(set()))
    r = CliRunner().invoke(app, ["preview", str(path), "--new-stack", "--quiet"], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert "error: cluster.gpu_pools.a10.instance_type: ecs.gni2.3xlarge is not available" in r.output
    assert "Traceback" not in r.output
