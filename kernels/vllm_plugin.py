"""vLLM general plugin (entry point ``vllm.general_plugins: deepseek_volc_kernels``).

``register()`` runs in every vLLM process (API server, engine core, workers) and:
- registers an out-of-tree ``GroupedTopk`` (``CustomOp.register_oot``) whose CUDA path
  runs the Triton router in ``kernels.moe_routing``;
- on CUDA, points vLLM 0.32's ``GroupedTopKRouter`` (which calls the module function
  ``grouped_topk`` rather than the ``GroupedTopk`` op) at the same kernel;
- registers the quantization config ``dsvolc_awq`` (``--quantization dsvolc_awq``) that
  runs AutoAWQ checkpoints' linear layers through ``kernels.w4a16_gemm`` on CUDA.
On any other platform every replacement defers to vLLM's own native path.

``DSVOLC_KERNELS=0`` (also ``false``/``off``/``no``) makes ``register()`` do nothing.

``DSVOLC_MLA=1`` (off by default) also registers the MLA attention backends of
``kernels.vllm_mla`` into vLLM's ``CUSTOM`` slots: decode (``--attention-backend CUSTOM``)
on ``kernels.mla_decode``, prefill (``--attention-config '{"mla_prefill_backend": "CUSTOM"}'``)
on ``kernels.prefill_attention``. Unset, vLLM's own backends are the only ones there.
"""

from __future__ import annotations

import logging
import os

import torch

# a child of vLLM's logger, so the lines land in vLLM's log with its format
logger = logging.getLogger("vllm.deepseek_volc.kernels")

ENV_SWITCH = "DSVOLC_KERNELS"
MLA_SWITCH = "DSVOLC_MLA"
MLA_DECODE_PATH = "kernels.vllm_mla.DsvolcMLABackend"
MLA_PREFILL_PATH = "kernels.vllm_mla.DsvolcMLAPrefillBackend"
QUANT_NAME = "dsvolc_awq"
# devices whose tensors go to the Triton kernels; tests add "cpu" under TRITON_INTERPRET=1
KERNEL_DEVICES = {"cuda"}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def mla_enabled() -> bool:
    """The MLA backends are opt-in: only DSVOLC_MLA=1 (or true/on/yes) registers them."""
    return os.environ.get(MLA_SWITCH, "0").strip().lower() in ("1", "true", "on", "yes")


def _register_mla() -> None:
    from vllm.v1.attention.backends.mla.prefill.registry import (
        MLAPrefillBackendEnum,
        register_mla_prefill_backend,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, MLA_DECODE_PATH)
    register_mla_prefill_backend(MLAPrefillBackendEnum.CUSTOM, MLA_PREFILL_PATH)


def _router_ok(gating_output: torch.Tensor, n_group: int, topk_group: int, topk: int, scoring: str) -> bool:
    e = gating_output.shape[-1]
    return (
        gating_output.device.type in KERNEL_DEVICES
        and gating_output.dim() == 2
        and scoring in ("sigmoid", "softmax")
        and n_group >= 1
        and e % n_group == 0
        and 1 <= topk_group <= n_group
        and topk <= topk_group * (e // n_group)
    )


def _triton_grouped_topk(
    hidden_states: torch.Tensor,
    gating_output: torch.Tensor,
    topk: int,
    renormalize: bool,
    num_expert_group: int = 0,
    topk_group: int = 0,
    scoring_func: str = "softmax",
    routed_scaling_factor: float = 1.0,
    e_score_correction_bias: torch.Tensor | None = None,
):
    """Drop-in for vllm's ``grouped_topk``: returns (weights fp32, ids int32)."""
    from kernels.moe_routing import grouped_topk

    n_group = max(1, num_expert_group)
    tg = max(1, topk_group) if num_expert_group else 1
    if not _router_ok(gating_output, n_group, tg, topk, scoring_func):
        return _NATIVE_GROUPED_TOPK(
            hidden_states, gating_output, topk, renormalize, num_expert_group, topk_group,
            scoring_func, routed_scaling_factor, e_score_correction_bias,
        )
    ids, weights = grouped_topk(
        gating_output, topk, n_group, tg, scoring_func, e_score_correction_bias,
        renormalize, routed_scaling_factor,
    )
    return weights, ids


_NATIVE_GROUPED_TOPK = None


def _make_grouped_topk_cls():
    from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopk

    class DsvolcGroupedTopk(GroupedTopk):
        """GroupedTopk whose CUDA path is one Triton launch (kernels/moe_routing.py)."""

        def forward_cuda(self, hidden_states, gating_output, e_score_correction_bias=None):
            if self.num_fused_shared_experts:
                return self.forward_native(hidden_states, gating_output, e_score_correction_bias)
            return _triton_grouped_topk(
                hidden_states, gating_output, self.topk, self.renormalize, self.num_expert_group,
                self.topk_group, self.scoring_func, self.routed_scaling_factor, e_score_correction_bias,
            )

    return DsvolcGroupedTopk


def _make_quant_classes():
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQLinearMethod
    from vllm.platforms import current_platform

    class DsvolcAWQLinearMethod(AutoAWQLinearMethod):
        """AutoAWQ weights as loaded by vLLM (qweight/qzeros/scales), run by w4a16_gemm."""

        def apply(self, layer, x, bias=None):
            from kernels.w4a16_gemm import w4a16_gemm

            out = w4a16_gemm(x, layer.qweight, layer.qzeros, layer.scales)
            if bias is not None:
                out.add_(bias)
            return out

    class DsvolcAWQConfig(AutoAWQConfig):
        """AutoAWQ config whose CUDA linear layers use kernels.w4a16_gemm (4-bit, group 128,
        zero point); everything else (MoE experts, CPU, other group sizes) is vLLM's."""

        @classmethod
        def get_name(cls):
            return QUANT_NAME

        @classmethod
        def get_min_capability(cls) -> int:
            return 80  # bf16 tensor-core dots

        @classmethod
        def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
            # opt-in: an AWQ checkpoint served with --quantization dsvolc_awq
            if user_quant == QUANT_NAME and str(hf_quant_cfg.get("quant_method", "")).lower() == "awq":
                return QUANT_NAME
            return None

        def get_quant_method(self, layer, prefix):
            method = super().get_quant_method(layer, prefix)
            if (
                current_platform.is_cuda()
                and isinstance(layer, LinearBase)
                and type(method).__name__ in ("AutoAWQLinearMethod", "AutoAWQMarlinLinearMethod")
                and self.weight_bits == 4
                and self.group_size == 128
                and self.zero_point
            ):
                return DsvolcAWQLinearMethod(self)
            return method

    return DsvolcAWQConfig, DsvolcAWQLinearMethod


def register() -> None:
    """Entry point. Idempotent: vLLM may load general plugins more than once a process."""
    global _NATIVE_GROUPED_TOPK
    if not enabled():
        logger.info("deepseek-volc kernels disabled by %s=%s", ENV_SWITCH, os.environ.get(ENV_SWITCH))
        return

    from vllm.model_executor.custom_op import CustomOp, op_registry_oot
    from vllm.model_executor.layers.fused_moe.router import grouped_topk_router
    from vllm.model_executor.layers.quantization import (
        QUANTIZATION_METHODS,
        register_quantization_config,
    )
    from vllm.platforms import current_platform

    if "GroupedTopk" not in op_registry_oot:
        cls = _make_grouped_topk_cls()
        CustomOp.register_oot(cls, name="GroupedTopk")
        # register_oot renames the class "GroupedTopk"; keep upstream's switch name so
        # --compilation-config '{"custom_ops": ["+grouped_topk"]}' still enables it.
        cls.name = "grouped_topk"

    if QUANT_NAME not in QUANTIZATION_METHODS:
        config_cls, _ = _make_quant_classes()
        register_quantization_config(QUANT_NAME)(config_cls)

    if current_platform.is_cuda() and _NATIVE_GROUPED_TOPK is None:
        _NATIVE_GROUPED_TOPK = grouped_topk_router.grouped_topk
        grouped_topk_router.grouped_topk = _triton_grouped_topk

    mla = mla_enabled()
    if mla:
        _register_mla()
    logger.info("deepseek-volc kernels registered in pid %d (GroupedTopk, %s%s)", os.getpid(), QUANT_NAME,
                ", MLA attention backends in the CUSTOM slots" if mla else "")
