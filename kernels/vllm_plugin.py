"""vLLM general plugin (entry point ``vllm.general_plugins: deepseek_volc_kernels``).

``register()`` runs in every vLLM process (API server, engine core, workers) and:
- registers an out-of-tree ``GroupedTopk`` (``CustomOp.register_oot``) whose CUDA path
  runs the Triton router in ``kernels.moe_routing``;
- on CUDA, points vLLM 0.32's ``GroupedTopKRouter`` (which calls the module function
  ``grouped_topk`` rather than the ``GroupedTopk`` op) at the same kernel;
- registers the quantization config ``dsvolc_awq`` (``--quantization dsvolc_awq``) that
  runs AutoAWQ checkpoints' linear layers through ``kernels.w4a16_gemm`` on CUDA; on Hopper
  each layer's qweight is repacked once after loading for the Gluon kernel
  (``kernels.w4a16_sm90``: faster than tinygemm, gemlite's raced points and bf16 cuBLAS at
  64 of race 9's 65 points; ``DSVOLC_W4A16_SM90=0`` keeps AutoAWQ's layout and the Triton
  kernels);
- with ``DSVOLC_FP8_GEMM=1`` (off by default: it lost the FP8 race), puts
  ``kernels.fp8_gemm`` first among vLLM's block-FP8 linear kernels (DeepSeek-V3/R1 FP8
  checkpoints' dense layers; the MoE experts keep vLLM's fused-MoE path).
On any other platform every replacement defers to vLLM's own native path.

The router replacement runs only where it beat vLLM's own path (``use_triton_router``).
vLLM routes layouts with a correction bias (V3/R1) through its fused CUDA kernel; calls
with fewer than ROUTER_MIN_TOKENS tokens keep that kernel. The H200 race
(kernels/bench/results/2026-11-30_h200_race3*, DeepSeek-V3 layout, CUDA graphs) found the
Triton kernel faster at every size from 1 to 32768 tokens (2.24 vs 2.94 us at 1 token,
8.93 vs 24.02 at 8192), so the threshold is 0; ``DSVOLC_ROUTER_MIN_TOKENS`` moves it.
Layouts without a bias (V2) take vLLM's PyTorch path, which the Triton kernel beats at
every size.

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


ENV_FP8 = "DSVOLC_FP8_GEMM"
ENV_ROUTER_MIN_TOKENS = "DSVOLC_ROUTER_MIN_TOKENS"
# Smallest token count per call at which the Triton router replaces vLLM's fused CUDA
# kernel (layouts with a correction bias): the smallest count from which the Triton kernel
# won every size of the H200 race (kernels/bench/results/2026-11-30_h200_race3.json; it
# won all of 1..32768, so 0). tests/kernels/test_plugin_dispatch.py ties the two together.
ROUTER_MIN_TOKENS = 0
_OFF = ("0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in _OFF


def fp8_gemm_enabled() -> bool:
    """Opt-in: in the H200 race (2026-11-30_h200_race2) the Triton GEMM was slower than
    cuBLASLt's block-scaled FP8 GEMM at every shape with M >= 1024 (1.2-1.8x its time), and vLLM's
    own Hopper paths (DeepGEMM, CUTLASS) are at least that fast."""
    v = os.environ.get(ENV_FP8, "0").strip().lower()
    if v not in _OFF + _ON:
        raise ValueError(f"{ENV_FP8}={v!r}: expected one of {', '.join(_ON + _OFF)}")
    return v in _ON


def router_min_tokens() -> int:
    v = os.environ.get(ENV_ROUTER_MIN_TOKENS)
    if v is None or not v.strip():
        return ROUTER_MIN_TOKENS
    try:
        n = int(v)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{ENV_ROUTER_MIN_TOKENS}={v!r}: expected a token count >= 0 (0: always the Triton router)")
    return n


def use_triton_router(num_tokens: int, has_bias: bool, vllm_fused: bool) -> bool:
    """Whether one call runs the Triton router or vLLM's own path. vLLM's own path is its
    fused CUDA kernel when the layout has a correction bias and vLLM's fused kernel is on
    (``vllm_fused``); otherwise it is a PyTorch graph that the Triton kernel beats at every
    size. Against the CUDA kernel, the Triton one runs from ``router_min_tokens()`` up."""
    if not (has_bias and vllm_fused):
        return True
    return num_tokens >= router_min_tokens()


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
    if not _router_ok(gating_output, n_group, tg, topk, scoring_func) or not use_triton_router(
        gating_output.shape[0], e_score_correction_bias is not None, _vllm_fused_router(num_expert_group, topk)
    ):
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


def _vllm_fused_router(num_expert_group: int, topk: int) -> bool:
    """vLLM 0.32's condition for its fused CUDA grouped_topk (grouped_topk_router.py),
    less the bias, which the caller checks."""
    import vllm.envs as envs

    return bool(envs.VLLM_USE_FUSED_MOE_GROUPED_TOPK) and num_expert_group <= 32 and topk <= 32


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


def repack_for_sm90(qweight, qzeros, scales):
    """AutoAWQ weights repacked for the Gluon W4A16 kernel (``w4a16_sm90.PackedW4``) where it runs
    (a Hopper GPU, Gluon, a packed tile that divides N) and ``DSVOLC_W4A16_SM90`` is not "0";
    else None (the layer keeps AutoAWQ's layout and the Triton kernels)."""
    if os.environ.get("DSVOLC_W4A16_SM90", "1") == "0" or not qweight.is_cuda:
        return None
    from kernels import w4a16_sm90

    if not w4a16_sm90.HAVE_GLUON or torch.cuda.get_device_capability(qweight.device) != (9, 0):
        return None
    tile = w4a16_sm90.tile_for(qweight.shape[1] * 8, qweight.shape[0])
    if tile is None:
        return None
    return w4a16_sm90.repack(qweight, qzeros, scales, nrep=tile[0], kw=tile[1])


def _make_quant_classes():
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig, AutoAWQLinearMethod
    from vllm.platforms import current_platform

    class DsvolcAWQLinearMethod(AutoAWQLinearMethod):
        """AutoAWQ weights as loaded by vLLM (qweight/qzeros/scales), run by w4a16_gemm. On
        Hopper (``repack_for_sm90``) qweight is repacked once after loading, in place of the
        AutoAWQ words (the same bytes), for the Gluon kernel (kernels/w4a16_sm90.py, race 9)."""

        def process_weights_after_loading(self, layer):
            super().process_weights_after_loading(layer)
            packed = repack_for_sm90(layer.qweight.data, layer.qzeros.data, layer.scales.data)
            if packed is not None:
                layer.qweight = torch.nn.Parameter(packed.words, requires_grad=False)
                layer.dsvolc_w4_tile = (packed.nrep, packed.kw)

        def apply(self, layer, x, bias=None):
            from kernels.w4a16_gemm import w4a16_gemm

            tile = getattr(layer, "dsvolc_w4_tile", None)
            if tile is not None:
                from kernels.w4a16_sm90 import PackedW4

                n = layer.scales.shape[1]
                w = PackedW4(layer.qweight, layer.qzeros, layer.scales, layer.scales.shape[0] * 128, n, *tile)
                out = w4a16_gemm(x, w)
            else:
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


def _make_fp8_kernel_cls():
    from vllm.model_executor.kernels.linear.scaled_mm.BlockScaledMMLinearKernel import (
        Fp8BlockScaledMMLinearKernel,
    )
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape
    from vllm.platforms import current_platform

    class DsvolcFp8BlockScaledMMKernel(Fp8BlockScaledMMLinearKernel):
        """DeepSeek-V3/R1 block-FP8 linear layers (128 x 128 weight blocks, activations
        quantised per token and group of 128 by vLLM's QuantFP8) through kernels.fp8_gemm."""

        @classmethod
        def is_supported(cls, compute_capability=None):
            if not current_platform.is_cuda():
                return False, "the Triton FP8 GEMM runs on CUDA only"
            cc = compute_capability
            if cc is None:
                cap = current_platform.get_device_capability()
                cc = None if cap is None else cap.to_int()
            if cc is not None and cc < 89:
                return False, f"fp8 tensor cores need compute capability >= 8.9, got {cc}"
            return True, None

        @classmethod
        def can_implement(cls, config):
            ok, reason = super().can_implement(config)
            if not ok:
                return ok, reason
            if config.activation_quant_key.scale.group_shape != GroupShape(1, 128):
                return False, "needs activations quantised per token and group of 128"
            if config.weight_quant_key.scale.group_shape != GroupShape(128, 128):
                return False, "needs 128 x 128 weight blocks"
            return True, None

        def apply_block_scaled_mm(self, A, B, As, Bs):
            from kernels.fp8_gemm import fp8_gemm

            return fp8_gemm(A, As, B, Bs if Bs.dtype == torch.float32 else Bs.float(), out_dtype=self.config.out_dtype)

    return DsvolcFp8BlockScaledMMKernel


def _register_fp8_gemm() -> bool:
    from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_BLOCK_KERNELS
    from vllm.platforms import PlatformEnum

    kernels = _POSSIBLE_FP8_BLOCK_KERNELS[PlatformEnum.CUDA]
    if any(k.__name__ == "DsvolcFp8BlockScaledMMKernel" for k in kernels):
        return False
    kernels.insert(0, _make_fp8_kernel_cls())  # first choice wherever it can implement the layer
    return True


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
    fp8 = fp8_gemm_enabled()
    if fp8:
        _register_fp8_gemm()

    logger.info(
        "deepseek-volc kernels registered in pid %d (GroupedTopk from %d tokens with a bias, %s%s%s)",
        os.getpid(), router_min_tokens(), QUANT_NAME, ", FP8 block GEMM" if fp8 else "",
        ", MLA attention backends in the CUSTOM slots" if mla else "",
    )
