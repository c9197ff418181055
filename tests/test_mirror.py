"""Supply chain: everything the stack deploys comes from its own registry, by digest once
recorded; `dsvolc images` lists it and records the digests; builds are pinned by digest."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import stacks
from dsvolc import engine, preview
from dsvolc.cli import app
from stacks import parse, read_raw
from stacks.loader import SETTINGS_KEY
from stacks.plan import build_plan
from tests.stack_fixtures import filled_raw, synthetic_digest
from workloads.supply_chain import inventory
from workloads.supply_chain import mirror
from workloads.platform import controllers as platform
from workloads.supply_chain import versions

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _settings(stack: str, recorded: bool = False):
    return parse(filled_raw(stack) if recorded else read_raw(stack), stack, stack=stack)


def _refs(obj, path=""):
    """Every string under an `image` key, and every registry/repository mapping, of a tree."""
    if isinstance(obj, dict):
        if isinstance(obj.get("repository"), str):
            yield path, (f"{obj['registry']}/{obj['repository']}" if obj.get("registry") else obj["repository"])
            return
        for k, v in obj.items():
            if k == "image" and isinstance(v, str):
                yield f"{path}.{k}", v
            else:
                yield from _refs(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _refs(v, f"{path}[{i}]")


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_rendered_stack_pulls_nothing_from_outside_its_registry(stack):
    s = _settings(stack)
    host = mirror.registry_host(build_plan(s))
    rec = engine.run(stack, read_raw(stack), mode="existing")
    seen = 0
    for r in rec.resources:
        if r.type == "kubernetes:helm.sh/v3:Release":
            assert r.raw_inputs["chart"].startswith(f"oci://{host}/mirror/charts/"), r.raw_inputs["chart"]
            assert not r.raw_inputs.get("repositoryOpts", {}).get("repo"), r.name
        if r.type.startswith("kubernetes:"):
            for where, ref in _refs(r.raw_inputs):
                assert ref.startswith(f"{host}/"), f"{r.name}{where}: {ref}"
                seen += 1
    assert seen >= 15


def test_with_recorded_digests_every_chart_spells_its_digest_its_own_way():
    s = _settings("prod", recorded=True)
    rels = {r["name"]: r for r in platform.releases(build_plan(s))}
    d = lambda src: synthetic_digest(src)  # noqa: E731
    kps = rels["kube-prometheus-stack"]["values"]
    prom = kps["prometheus"]["prometheusSpec"]["image"]
    assert prom == {"registry": mirror.registry_host(build_plan(s)), "repository": "mirror/prometheus/prometheus",
                    "tag": versions.KPS_PROMETHEUS_TAG,
                    "sha": d(f"quay.io/prometheus/prometheus:{versions.KPS_PROMETHEUS_TAG}")[7:]}  # hex only
    assert kps["kube-state-metrics"]["image"]["sha"].startswith("sha256:")  # that chart wants the prefix
    assert kps["prometheus-node-exporter"]["image"]["digest"].startswith("sha256:")
    keda = rels["keda"]["values"]["image"]["keda"]
    assert keda["tag"] == f"{versions.KEDA.app_version}@{d(f'ghcr.io/kedacore/keda:{versions.KEDA.app_version}')}"
    eg = rels["envoy-gateway"]["values"]["global"]["images"]
    for key, im in (("envoyGateway", "envoy-gateway"), ("ratelimit", "envoy-ratelimit"), ("envoyProxy", "envoy-proxy")):
        assert re.fullmatch(rf"{re.escape(mirror.mirror_prefix(build_plan(s)))}/\S+:\S+@sha256:[0-9a-f]{{64}}", eg[key]["image"])
        assert eg[key]["image"] == mirror.ref(build_plan(s), im)
    # and the stack previews clean of digest findings
    r = preview.run_preview("prod", raw=filled_raw("prod"), mode="existing")
    assert [v for v in r.violations if v["policy"].startswith("images-")] == []


def test_the_gatewayapi_plugin_comes_from_the_mirror_with_its_checksum():
    s = _settings("staging", recorded=True)  # a stack whose canaries Argo Rollouts runs
    (ar,) = [r for r in platform.releases(build_plan(s)) if r["name"] == "argo-rollouts"]
    c = ar["values"]["controller"]
    (plugin,) = c["trafficRouterPlugins"]
    assert plugin["name"] == "argoproj-labs/gatewayAPI"
    assert plugin["location"] == "file:///plugin-bin/gatewayapi-plugin"
    assert plugin["sha256"] == synthetic_digest(f"gatewayapi-plugin:{versions.ARGO_GATEWAYAPI_PLUGIN}")[7:]
    (init,) = c["initContainers"]
    assert init["image"].startswith(f"{mirror.mirror_prefix(build_plan(s))}/argoproj-labs/") and "@sha256:" in init["image"]
    assert c["volumeMounts"][0]["mountPath"] == "/plugin-bin" == init["volumeMounts"][0]["mountPath"]
    assert "github.com" not in json.dumps(c)
    # unrecorded: no checksum is invented
    (ar,) = [r for r in platform.releases(build_plan(_settings("staging"))) if r["name"] == "argo-rollouts"]
    assert "sha256" not in ar["values"]["controller"]["trafficRouterPlugins"][0]


def test_shipped_lock_records_no_digest_it_could_not_resolve():
    """No digest is typed into the repository: the shipped lock holds only nulls until a
    mirror run records what it copied, and it lists every artifact of every stack."""
    doc = yaml.safe_load((ROOT / "stacks" / "mirror.lock.yaml").read_text())
    assert all(v is None for section in doc.values() for v in section.values())
    keys = {k for section in doc.values() for k in section}
    for st in ("dev", "staging", "prod"):
        assert {e.lock_key for e in inventory.entries(build_plan(_settings(st)))} <= keys, st
    assert "digest" not in read_raw("prod")["serving"]["image"]  # written by the build, not by hand


def test_prod_as_shipped_stops_at_the_unrecorded_digests(tmp_path):
    r = preview.run_preview("prod", mode="existing")
    digest = [v for v in r.mandatory if v["policy"] == "images-by-digest"]
    assert digest and {v["policy"] for v in r.mandatory} == {"images-by-digest", "identity-provider-not-placeholder",
                                                                      "edge-domain-not-placeholder"}
    assert any("dsvolc images" in v["message"] for v in digest)
    assert not [v for v in preview.run_preview("staging", mode="existing").mandatory if v["policy"] == "images-by-digest"]


# --------------------------------------------------------------------------- dsvolc images


def _stack_copy(tmp_path: Path, stack: str = "prod") -> tuple[Path, Path]:
    """A copy of a shipped stack file (comments kept) with its own copy of the lock."""
    lock = tmp_path / "mirror.lock.yaml"
    shutil.copy(ROOT / "stacks" / "mirror.lock.yaml", lock)
    text = (ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    text = text.replace("    registry:\n", "    registry:\n", 1)
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(text.replace(f"  {SETTINGS_KEY}:\n", f"  {SETTINGS_KEY}:\n    registry:\n"
                                 f"      mirror_lock: {lock}\n", 1))
    return path, lock


def test_images_lists_source_target_and_digest(tmp_path):
    out = tmp_path / "images.json"
    res = runner.invoke(app, ["images", "prod", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    s = _settings("prod")
    assert doc["mirror"] == mirror.mirror_prefix(build_plan(s))
    kinds = {a["kind"] for a in doc["artifacts"]}
    assert kinds == {"chart", "image"}  # prod runs no Argo canary, hence no plugin file
    for a in doc["artifacts"]:
        assert a["target"].startswith((mirror.mirror_prefix(build_plan(s)), f"oci://{mirror.mirror_prefix(build_plan(s))}")), a
        assert a["digest"] is None
    names = {a["name"] for a in doc["artifacts"]}
    assert {"envoy-proxy", "prometheus", "lws", "dcgm-exporter", "redis", "vllm-base"} <= names
    staging = json.loads((runner.invoke(app, ["images", "staging", "--json", str(out)]), out.read_text())[1])
    assert "gatewayapi-plugin" in {a["name"] for a in staging["artifacts"] if a["kind"] == "file"}
    assert "lws" not in {a["name"] for a in json.loads(
        (runner.invoke(app, ["images", "dev", "--json", str(out)]), out.read_text())[1])["artifacts"]}


def test_copy_script_writes_a_digest_file_for_every_artifact(tmp_path):
    res = runner.invoke(app, ["images", "prod", "--script"])
    assert res.exit_code == 0, res.output
    script = res.output
    entries = inventory.entries(build_plan(_settings("prod")))
    for e in entries:
        if e.source.startswith("built by"):
            assert "runtime/build.sh plugin prod" in script
            continue
        assert f"digests/{e.kind}-{e.name}.digest" in script, e.name
    assert script.count("skopeo copy --all --preserve-digests") == sum(
        1 for e in entries if e.kind == "image" and not e.source.startswith("built"))
    assert "set -euo pipefail" in script


def test_record_takes_digests_from_the_copy_and_refuses_a_moved_tag(tmp_path):
    path, lock = _stack_copy(tmp_path, "staging")  # staging mirrors the Argo plugin file too
    digests = tmp_path / "digests"
    digests.mkdir()
    good = "sha256:" + "a" * 64
    (digests / "image-redis.digest").write_text(good + "\n")
    (digests / "file-gatewayapi-plugin.digest").write_text("b" * 64 + "\n")
    res = runner.invoke(app, ["images", str(path), "--record", str(digests)])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(lock.read_text())
    assert doc["images"][versions.REDIS_IMAGE] == good
    assert doc["files"][f"gatewayapi-plugin:{versions.ARGO_GATEWAYAPI_PLUGIN}"] == "b" * 64
    assert sum(v is not None for section in doc.values() for v in section.values()) == 2
    # the rendered Redis now pulls by that digest
    s = stacks.load(str(path))
    assert mirror.ref(build_plan(s), "redis").endswith("@" + good)
    # an upstream tag that moved is refused, as is garbage
    (digests / "image-redis.digest").write_text("sha256:" + "c" * 64)
    res = runner.invoke(app, ["images", str(path), "--record", str(digests)])
    assert res.exit_code == 1 and "changed upstream" in res.output
    (digests / "image-redis.digest").write_text("latest")
    res = runner.invoke(app, ["images", str(path), "--record", str(digests)])
    assert res.exit_code == 1 and "image-redis.digest: expected sha256:<64 hex digits>" in " ".join(res.output.split())
    assert yaml.safe_load(lock.read_text())["images"][versions.REDIS_IMAGE] == good


def test_ref_requires_a_recorded_digest(tmp_path):
    path, lock = _stack_copy(tmp_path)
    res = runner.invoke(app, ["images", str(path), "--ref", "vllm-base"])
    assert res.exit_code == 1 and "no recorded digest" in res.output
    doc = yaml.safe_load(lock.read_text())
    doc["images"][versions.VLLM_BASE_IMAGE] = "sha256:" + "d" * 64
    lock.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["images", str(path), "--ref", "vllm-base"])
    assert res.exit_code == 0
    assert res.output.strip().endswith("/mirror/vllm/vllm-openai:v0.32.0@sha256:" + "d" * 64)


def test_the_serving_digest_comes_from_the_build_metadata(tmp_path):
    path, _ = _stack_copy(tmp_path)
    meta = tmp_path / "meta.json"
    built = "sha256:" + "e" * 64
    meta.write_text(json.dumps({"containerimage.digest": built, "image.name": "x"}))
    res = runner.invoke(app, ["images", str(path), "--record-build", str(meta), "--image", "serving"])
    assert res.exit_code == 0, res.output
    text = path.read_text()
    assert f"digest: {built}" in text and "# The tag the build pushes" in text  # comments kept
    assert stacks.load(str(path)).serving.image.digest == built
    meta.write_text(json.dumps({"containerimage.digest": "abc"}))
    res = runner.invoke(app, ["images", str(path), "--record-build", str(meta)])
    assert res.exit_code == 1 and "containerimage.digest" in res.output


def test_serving_build_is_pinned():
    dockerfile = (ROOT / "runtime" / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_IMAGE$", dockerfile, re.M), "the base must have no default tag"
    assert "FROM ${VLLM_IMAGE}" in dockerfile
    reqs = [ln for ln in (ROOT / "runtime" / "requirements.txt").read_text().splitlines()
            if ln and not ln.startswith("#")]
    assert reqs and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", r) for r in reqs)
    build = (ROOT / "runtime" / "build.sh").read_text()
    assert "--ref vllm-base" in build and "--record-build" in build and "rewrite-timestamp=true" in build
    assert "ADD --checksum=sha256:${PLUGIN_SHA256}" in (ROOT / "runtime" / "plugins.Dockerfile").read_text()
