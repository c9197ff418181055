"""KV cache offload to CPU memory: sized from the node's RAM, rendered as vLLM 0.32's
--kv-offloading-size / --kv-offloading-backend, and held by the pod's /dev/shm and memory."""

from __future__ import annotations

import copy
import types

import pytest

from capacity import kv_offload
from capacity.instances import get_instance_type
from capacity.memory import PlanError
from capacity.specs import GiB
from stacks import load, parse, read_raw
from stacks.errors import SettingsError
from stacks.plan import build_plan
from workloads.engine import engine_args, manifests
from workloads.engine.context import build_context

H20 = "ecs.hpcpni3ln.45xlarge"


def ctx_for(stack: str, **engine):
    raw = copy.deepcopy(read_raw(stack))
    raw["serving"]["engine"].update(engine)
    s = parse(raw, stack=stack) if engine else load(stack)
    return build_context(build_plan(s), image_repository="r.example/ns/repo")


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_prod_offload_is_sized_from_the_h20_nodes_ram():
    """1,960 GiB per node, 90% for pods, one pod per node holding 8 engines: half of what the
    pod's processes leave becomes offload buffer, split over the engines."""
    ctx = ctx_for("prod")
    o = ctx.plan.serving.kv_offload
    assert get_instance_type(H20).memory_gib == 1960
    host = (16 + 16 * 8 + 2 * (16 - 1) + (2 + 2 * 8)) * GiB  # engines, workers, 15 more API servers, shm
    assert kv_offload.host_bytes(8, False, ctx.plan.serving.api_servers) == host
    want = int(0.5 * (0.9 * 1960 * GiB - host) // (8 * GiB))
    assert (o.gib_per_engine, o.engines_per_pod, o.planned) == (want, 8, True) == (98, 8, True)
    args = engine_args.render(engine_args.from_context(ctx, "/m"))
    assert flag(args, "--kv-offloading-size") == "98" and flag(args, "--kv-offloading-backend") == "native"


def test_the_pod_holds_the_buffers_in_shm_and_memory():
    ctx = ctx_for("prod")
    o = ctx.plan.serving.kv_offload
    w = next(x for x in manifests.render(ctx, "trn") if x["kind"] == "LeaderWorkerSet")
    for role in ("leaderTemplate", "workerTemplate"):
        spec = w["spec"]["leaderWorkerTemplate"][role]["spec"]
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
        res = spec["containers"][0]["resources"]
        assert shm == f"{18 + 8 * o.gib_per_engine}Gi"  # NCCL's 18 GiB + one region per engine
        base = kv_offload.host_bytes(8, False, 16) // GiB
        assert res["requests"]["memory"] == res["limits"]["memory"] == f"{base + 8 * o.gib_per_engine}Gi"
        # and the node still holds it
        assert int(res["limits"]["memory"][:-2]) <= 0.9 * 1960


@pytest.mark.engine  # vLLM's own config
def test_vllm_turns_the_size_into_the_buffer_the_shm_holds():
    """vLLM's own post-init (vllm/config/vllm.py) makes the flag an OffloadingConnector with
    cpu_bytes_to_use = size x 2^30: the region it creates in /dev/shm for one engine."""
    from vllm.config import KVTransferConfig, VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ctx = ctx_for("prod")
    args = engine_args.render(engine_args.for_rank(engine_args.from_context(ctx, "/m"), node_rank="0",
                                                   master_addr="leader"))
    parsed = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(args)
    ea = AsyncEngineArgs.from_cli_args(parsed)
    assert (ea.kv_offloading_size, ea.kv_offloading_backend) == (98, "native")
    fake = types.SimpleNamespace(cache_config=types.SimpleNamespace(
        kv_offloading_size=ea.kv_offloading_size, kv_offloading_backend=ea.kv_offloading_backend),
        kv_transfer_config=None)
    VllmConfig._post_init_kv_transfer_config(fake)
    kt = fake.kv_transfer_config
    assert isinstance(kt, KVTransferConfig) and kt.kv_connector.endswith("OffloadingConnector")
    per_engine = kt.kv_connector_extra_config["cpu_bytes_to_use"]
    assert per_engine == 98 * GiB
    assert manifests.shm_bytes(ctx) == kv_offload.shm_base_bytes(8, False) + 8 * per_engine


def test_a_size_too_big_for_the_node_is_refused_with_the_numbers():
    with pytest.raises(SettingsError) as exc:
        ctx_for("prod", kv_offload_gib=250)
    msg = str(exc.value)
    assert "- serving.engine.kv_offload_gib: 250 GiB x 8 engine(s) per pod + 192 GiB" in msg
    assert "= 2192 GiB" in msg and "1960 GiB RAM" in msg and "= 1764 GiB" in msg and "expected at most 196" in msg
    ok = ctx_for("prod", kv_offload_gib=196).plan.serving.kv_offload
    assert (ok.gib_per_engine, ok.planned) == (196, False)


def test_size_without_offload_is_refused_by_the_settings():
    raw = copy.deepcopy(read_raw("prod"))
    raw["serving"]["engine"].update(kv_offload=False, kv_offload_gib=64)
    with pytest.raises(Exception, match="kv_offload_gib: 64 GiB with kv_offload off"):
        parse(raw, stack="prod")


@pytest.mark.parametrize("stack", ["dev", "staging"])
def test_off_unless_asked(stack):
    ctx = ctx_for(stack)
    assert ctx.plan.serving.kv_offload is None
    assert "--kv-offloading-size" not in engine_args.render(engine_args.from_context(ctx, "/m"))


def test_pods_sharing_a_node_share_its_ram():
    """Four 2-GPU pods on an 8-GPU node: each gets a quarter of the node, one engine each."""
    kw = dict(enabled=True, node_ram_gib=1960, instance_type=H20, pods_per_node=4,
              pod_host_bytes=kv_offload.host_bytes(2, False), engines=1)
    o = kv_offload.plan(gib=None, **kw)
    assert o.gib_per_engine == int(0.5 * (0.9 * 1960 / 4 * GiB - 54 * GiB) // GiB) == 193
    with pytest.raises(PlanError, match=r"4 pods per node = 441 GiB\); expected at most 387"):
        kv_offload.plan(gib=400, **kw)
    with pytest.raises(PlanError, match="no memory figure in capacity/instances.py"):
        kv_offload.plan(gib=None, **{**kw, "node_ram_gib": None})
    assert kv_offload.engines_per_pod(8, 2, 8) == 1  # a pipeline stage per node: the engine's region on each
    assert kv_offload.engines_per_pod(1, 1, 8) == 8


def test_offload_with_disaggregation_is_refused():
    """vLLM would swap the P/D NixlConnector for its OffloadingConnector."""
    raw = copy.deepcopy(read_raw("pd-example"))
    raw["serving"]["engine"]["kv_offload"] = True
    with pytest.raises(SettingsError, match="serving.engine.kv_offload: prefill/decode disaggregation"):
        build_plan(parse(raw, stack="pd-example"))
