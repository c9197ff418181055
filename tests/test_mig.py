"""MIG: the profile table, slice sizing in the planner and the settings, what a MIG pool
and its serving pods render, and the example stack that serves a distill on slices."""

from __future__ import annotations

import base64
import copy

import pytest

from capacity.catalog import GPUS, get_gpu, get_model
from capacity.mig import MIG_PROFILES, mig_profile, slice_gpu
from capacity.planner import plan
from capacity.specs import MiB
from dsvolc import engine, preview
from stacks import SettingsError, load, parse, parse_plan, read_raw
from workloads.engine import manifests
from workloads.platform import controllers as platform
from stacks.plan import build_plan
from workloads.engine.context import build_context

STACK = "mig-example"


def raw_with(**changes) -> dict:
    raw = copy.deepcopy(read_raw(STACK))
    for path, value in changes.items():
        node, keys = raw, path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return raw


def problems(**changes) -> list[str]:
    with pytest.raises(SettingsError) as info:
        parse_plan(raw_with(**changes), STACK, stack=STACK)
    return info.value.problems


# --------------------------------------------------------------------------- the table


def test_a100_slices_report_the_memory_nvml_reports():
    # NVIDIA/go-nvml's A100 mock: 1g.5gb 4864 MiB, 7g.40gb 40192 MiB; 80 GB: 1g.10gb 9856.
    assert mig_profile("A100-40G", "1g.5gb").memory_mib == 4864
    assert mig_profile("A100-40G", "7g.40gb").memory_mib == 40192
    assert mig_profile("A100-80G", "1g.10gb").memory_mib == 9856
    assert not mig_profile("A100-80G", "1g.10gb").estimated


@pytest.mark.parametrize("gpu", sorted(MIG_PROFILES))
def test_every_layout_fits_its_gpu(gpu):
    board = GPUS[gpu].memory_bytes // MiB
    for p in MIG_PROFILES[gpu].values():
        # seven compute slices and eight memory slices per GPU
        assert p.per_gpu * p.compute_slices <= 7 or p.compute_slices == 7
        assert p.per_gpu * p.memory_eighths <= 8
        assert p.per_gpu * p.memory_mib <= board
        assert p.resource == f"nvidia.com/mig-{p.name}"
        # the name's size is the nominal share of the board's nominal size
        nominal = int(p.name.split(".")[1].removesuffix("gb"))
        assert abs(nominal - GPUS[gpu].nominal_gb * p.memory_eighths / 8) <= 1.5


def test_hopper_slices_are_estimated_below_their_share():
    p = mig_profile("H20", "1g.24gb")
    assert p.estimated and p.per_gpu == 4
    assert p.memory_mib < GPUS["H20"].memory_bytes // MiB * 2 / 8


def test_unknown_profiles_name_the_valid_ones():
    with pytest.raises(KeyError, match="1g.12gb, 1g.24gb"):
        mig_profile("H20", "1g.10gb")
    with pytest.raises(KeyError, match="A10 has no MIG"):
        mig_profile("A10", "1g.10gb")


def test_the_planner_sizes_a_distill_on_a_slice_and_refuses_one_too_big():
    slice_ = slice_gpu(get_gpu("H20"), mig_profile("H20", "1g.24gb"))
    assert slice_.memory_bytes == 23550 * MiB and slice_.fp8
    small = plan(get_model("deepseek-r1-distill-qwen-7b"), slice_, gpus_per_node=1,
                 tensor_parallel_size=1, pipeline_parallel_size=1, context=32768)
    assert small.fits and small.kv_cache_tokens >= 32768
    big = plan(get_model("deepseek-r1-distill-qwen-32b"), slice_, gpus_per_node=1,
               tensor_parallel_size=1, pipeline_parallel_size=1)
    assert not big.fits and "weights need" in big.reasons[0]


# --------------------------------------------------------------------------- settings


def test_the_example_stack_serves_the_distill_on_one_slice():
    s = load(STACK)
    s_plan = build_plan(s)
    mig = s_plan.pools[s.serving.gpu_pool].mig
    assert mig.name == "1g.24gb"
    p = s_plan.serving.engine
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.nodes) == (1, 1, 1)
    assert p.gpu_memory_bytes == mig.memory_bytes
    assert p.max_model_len == s.serving.engine.max_model_len


def test_a_profile_the_gpu_lacks_is_refused_with_the_valid_ones():
    (line,) = problems(**{"cluster__gpu_pools__h20-mig__mig": {"profile": "1g.10gb"}})
    assert line.startswith("cluster.gpu_pools.h20-mig.mig.profile:")
    assert "1g.12gb, 1g.24gb, 2g.24gb" in line


def test_tensor_parallel_on_a_slice_is_refused():
    (line,) = problems(serving__engine__tensor_parallel_size=2)
    assert line.startswith("serving.engine.tensor_parallel_size:") and "one slice" in line


def test_a_model_too_big_for_the_slice_is_refused_naming_the_slice():
    (line,) = problems(serving__model="deepseek-r1-distill-qwen-32b", serving__engine__max_model_len=None)
    assert line.startswith("serving.engine:") and "MIG 1g.24gb slice of H20 (23.0 GiB)" in line


def test_pool_size_counts_slices_not_nodes():
    # 32 slices per node: 40 replicas need 2 nodes, 70 need 3 (the pool allows 2).
    parse(raw_with(serving__replicas=40, autoscaling__max_replicas=40), STACK, stack=STACK)
    (line,) = problems(serving__replicas=70, autoscaling__max_replicas=70)
    assert line.startswith("cluster.gpu_pools.h20-mig.max_nodes:") and "need 3 nodes" in line


# --------------------------------------------------------------------------- rendering


def ctx():
    s = load(STACK)
    return build_context(build_plan(s), image_repository="cr.example/ns/repo")


def test_serving_pods_request_one_slice_and_no_whole_gpu():
    c = ctx()
    dep = next(o for o in manifests.render(c) if o["kind"] == "Deployment")
    res = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    for side in ("requests", "limits"):
        assert res[side]["nvidia.com/mig-1g.24gb"] == "1"
        assert "nvidia.com/gpu" not in res[side]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "1"


@pytest.fixture(scope="module")
def run():
    return engine.run(STACK, read_raw(STACK))


def test_the_pool_partitions_its_gpus_and_labels_its_nodes(run):
    pool = next(r.inputs for r in run.resources if r.type.endswith("vke/nodePool:NodePool") and "-gpu-" in r.name)
    labels = {x["key"]: x["value"] for x in pool["kubernetesConfig"]["labels"]}
    assert labels["deepseek-volc/mig-profile"] == "1g.24gb"
    assert labels["nvidia.com/mig.config"] == "all-1g.24gb"
    assert labels["nvidia.com/device-plugin.config"] == "mig-mixed"
    script = base64.b64decode(pool["nodeConfig"]["initializeScript"]).decode()
    assert "nvidia-smi -mig 1" in script
    assert "-cgi 1g.24gb,1g.24gb,1g.24gb,1g.24gb -C" in script
    assert "mkdir -p /mnt/model-cache" in script


def test_nvidia_device_plugin_runs_with_the_mixed_strategy_instead_of_the_addon(run):
    addons = {r.inputs["name"] for r in run.resources if r.type.endswith("vke/addon:Addon")}
    assert "nvidia-device-plugin" not in addons and "cluster-autoscaler" in addons
    (rel,) = [r for r in platform.releases(build_plan(load(STACK))) if r["name"] == "nvidia-device-plugin"]
    cfg = rel["values"]["config"]
    assert "migStrategy: mixed" in cfg["map"]["mig-mixed"] and cfg["default"] == "default"
    # a whole-GPU stack keeps VKE's add-on and runs no chart of its own
    dev = engine.run("dev", read_raw("dev"))
    assert "nvidia-device-plugin" in {r.inputs["name"] for r in dev.resources if r.type.endswith("vke/addon:Addon")}
    assert not [r for r in platform.releases(build_plan(load("dev"))) if r["name"] == "nvidia-device-plugin"]


def test_the_example_stack_previews_without_a_mandatory_violation():
    result = preview.run_preview(STACK)
    assert [v for v in result.violations if v["enforcement_level"] == "mandatory"] == []
