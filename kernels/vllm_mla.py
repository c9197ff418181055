"""vLLM 0.32 MLA backends on this package's Triton kernels (opt-in, see ``vllm_plugin``).

* ``DsvolcMLABackend``: vLLM's own Triton MLA backend (metadata builder, cache layout,
  CUDA-graph support, block sizes) whose decode (``forward_mqa``) runs
  ``kernels.mla_decode`` for plain one-token-per-request decode on CUDA: DeepSeek's
  512 + 64 latent rows, bf16/fp16 or fp8 e4m3 cache, power-of-two pages. Anything else
  (multi-token decode rows, decode context parallelism, batch-invariant mode, other
  dims) goes to vLLM's Triton decode unchanged.
* ``DsvolcMLAPrefillBackend``: an ``MLAPrefillBackend`` running ``kernels.prefill_attention``
  for the causal new-token pass and the unmasked context-chunk pass (with the
  log-sum-exp vLLM merges chunks with).

Both are registered into vLLM's ``CUSTOM`` slots (``register_backend`` /
``register_mla_prefill_backend``) and selected with ``--attention-backend CUSTOM`` and
``--attention-config '{"mla_prefill_backend": "CUSTOM"}'``. This module imports vLLM;
the kernels themselves do not.
"""

from __future__ import annotations

import torch

import vllm.envs as envs
from vllm.platforms import current_platform
from vllm.v1.attention.backends.mla.prefill.base import MLAPrefillBackend
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend, TritonMLAImpl

from kernels.mla_decode import KV_LORA, ROPE, mla_decode
from kernels.prefill_attention import prefill_attention, split_head_dim

ROW = KV_LORA + ROPE
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")


def decode_supported(q: torch.Tensor, kv_cache: torch.Tensor, kv_cache_dtype: str, dcp_world_size: int,
                     num_decodes: int) -> bool:
    """Whether ``kernels.mla_decode`` takes this decode call (else vLLM's Triton decode)."""
    page = kv_cache.shape[1] if kv_cache.dim() == 3 else 0
    if kv_cache_dtype in FP8_CACHE_DTYPES:
        cache_ok = kv_cache.dtype in (torch.uint8, torch.float8_e4m3fn)
    else:
        cache_ok = kv_cache.dtype == q.dtype
    from kernels.vllm_plugin import KERNEL_DEVICES

    return (
        q.device.type in KERNEL_DEVICES
        and q.dim() == 3
        and q.shape[-1] == ROW
        and q.dtype in (torch.float16, torch.bfloat16)
        and kv_cache.dim() == 3
        and kv_cache.shape[-1] == ROW
        and page > 0
        and page & (page - 1) == 0
        and cache_ok
        and dcp_world_size == 1
        and q.shape[0] == num_decodes  # one query row per request
        and not envs.VLLM_BATCH_INVARIANT  # split count depends on the batch
    )


class DsvolcMLAImpl(TritonMLAImpl):
    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        if type(q) is tuple:
            q = torch.cat(q, dim=-1)
        decode = attn_metadata.decode
        if decode is None or not decode_supported(
            q, kv_c_and_k_pe_cache, self.kv_cache_dtype, self.dcp_world_size, decode.seq_lens.shape[0]
        ):
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        fp8 = self.kv_cache_dtype in FP8_CACHE_DTYPES
        out, lse = mla_decode(
            q, kv_c_and_k_pe_cache, decode.block_table, decode.seq_lens, self.scale,
            kv_scale=float(layer._k_scale_float) if fp8 else None,
            max_seq_len=max(1, int(attn_metadata.max_seq_len)), return_lse=True,
        )
        return out, lse.to(q.dtype)


class DsvolcMLABackend(TritonMLABackend):
    """vLLM's Triton MLA backend with ``kernels.mla_decode`` as its decode kernel."""

    @staticmethod
    def get_name() -> str:
        # vLLM looks the layer's backend up by this name in AttentionBackendEnum
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[DsvolcMLAImpl]:
        return DsvolcMLAImpl


class DsvolcMLAPrefillBackend(MLAPrefillBackend):
    """MLA prefill (q/k head dim qk_nope + qk_rope, v head dim v_head_dim) on
    ``kernels.prefill_attention``."""

    @staticmethod
    def get_name() -> str:
        return "DSVOLC_TRITON_PREFILL"

    @classmethod
    def supports_compute_capability(cls, device_capability) -> bool:
        return device_capability is not None and device_capability.major >= 8

    @classmethod
    def is_available(cls) -> bool:
        return current_platform.is_cuda()

    @classmethod
    def supports_mla_dimensions(cls, mla_dimensions) -> bool:
        try:
            split_head_dim(mla_dimensions.qk_nope_head_dim + mla_dimensions.qk_rope_head_dim)
        except ValueError:
            return False
        v = mla_dimensions.v_head_dim
        return v >= 16 and v & (v - 1) == 0

    def supports_out(self) -> bool:
        return True

    def _run(self, q, k, v, cu_q, max_q, cu_k, causal, return_lse, out):
        if out is not None and (out.shape != (q.shape[0], q.shape[1], v.shape[2]) or out.dtype != q.dtype
                                or out.stride(2) != 1):
            res = prefill_attention(q, k, v, cu_q, max_q, cu_k, softmax_scale=self.scale, causal=causal,
                                    return_lse=return_lse)
            o = res[0] if return_lse else res
            out.copy_(o)
            return (out, res[1]) if return_lse else out
        return prefill_attention(q, k, v, cu_q, max_q, cu_k, softmax_scale=self.scale, causal=causal,
                                 return_lse=return_lse, out=out)

    def run_prefill_new_tokens(self, q, k, v, return_softmax_lse, out=None, output_scale=None):
        if output_scale is not None:
            raise NotImplementedError("DSVOLC_TRITON_PREFILL writes no quantized output (supports_quant_output is False)")
        md = self._prefill_metadata
        return self._run(q, k, v, md.query_start_loc, int(md.max_query_len), None, True, return_softmax_lse, out)

    def run_prefill_context_chunk(self, chunk, q, k, v, out=None):
        return self._run(q, k, v, chunk.query_start_loc, int(chunk.max_query_len), chunk.cu_seq_lens, False, True,
                         out)
