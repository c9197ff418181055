"""Varlen prefill attention against the float64 reference, on small odd shapes (CPU
interpreter here, compiled kernels on a GPU)."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
import torch.nn.functional as F

from kernels.prefill_attention import attention_flops, prefill_attention, split_head_dim
from kernels.reference import varlen_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = None if DEVICE == "cuda" else dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
# p is rounded to the input dtype before the p @ v product and the output is rounded
# once: a few units of the dtype's 2^-8 (bf16) / 2^-11 (fp16) relative step, summed in
# quadrature over the row; the observed errors are 3.5e-3 / 2.2e-4.
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}
LSE_TOL = 1e-4  # scores are exact products summed in fp32


def _cu(lens):
    return torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32).to(DEVICE)


def run_case(lens_q, hq, hkv, dqk, dv, dtype, lens_k=None, causal=True, seed=0, config=None, scale=None,
             kv_views=False):
    gen = torch.Generator().manual_seed(seed)
    lens_k = lens_q if lens_k is None else lens_k
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, dqk, generator=gen).to(dtype).to(DEVICE)
    if kv_views:
        # k and v as strided views into one [tokens, heads, dqk + dv] buffer (what vLLM's
        # MLA prefill passes after splitting an up-projection)
        kv = torch.randn(tk, hkv, dqk + dv, generator=gen).to(dtype).to(DEVICE)
        k, v = kv[..., :dqk], kv[..., dqk:]
    else:
        k = torch.randn(tk, hkv, dqk, generator=gen).to(dtype).to(DEVICE)
        v = torch.randn(tk, hkv, dv, generator=gen).to(dtype).to(DEVICE)
    cq, ck = _cu(lens_q), _cu(lens_k)
    cfg = dict(SMALL or {}, **(config or {}))
    out = torch.full((tq, hq, dv), float("nan"), dtype=dtype, device=DEVICE)  # every row must be written
    o, lse = prefill_attention(q, k, v, cq, max(lens_q), ck, softmax_scale=scale, causal=causal, return_lse=True,
                               out=out, config=cfg or None)
    assert o.data_ptr() == out.data_ptr() and o.shape == (tq, hq, dv) and o.dtype == dtype
    assert lse.shape == (hq, tq) and lse.dtype == torch.float32
    ro, rl = varlen_attention_reference(q.cpu(), k.cpu(), v.cpu(), cq.cpu(), ck.cpu(), scale, causal, torch.float64)
    assert not torch.isnan(o).any()
    err = ((o.cpu().double() - ro).norm() / ro.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], err
    seen = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    assert (lse.cpu().double()[seen] - rl[seen]).abs().max().item() < LSE_TOL
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "lens,hq,hkv,dqk,dv",
    [
        ([37, 5, 1], 4, 4, 32, 32),  # MHA, odd lengths, a 1-token sequence
        ([23, 40], 4, 2, 32, 32),  # GQA 2:1
        ([17, 0, 33], 3, 1, 32, 16),  # MQA, an empty sequence, Dv != Dqk
        ([29], 2, 2, 48, 32),  # split head dim 48 = 32 + 16 (MLA's 192 = 128 + 64 shape)
    ],
    ids=["mha", "gqa", "mqa_empty_seq", "mla_split_dim"],
)
def test_causal_varlen_matches_reference(lens, hq, hkv, dqk, dv, dtype):
    run_case(lens, hq, hkv, dqk, dv, dtype, seed=sum(lens))


@pytest.mark.parametrize("use_tma", [False, True], ids=["pointers", "tma"])
def test_load_paths(use_tma):
    # the same kernel with K/V through pointers and through tensor descriptors
    run_case([19, 45], 4, 2, 48, 32, torch.float16, config=dict(USE_TMA=use_tma), seed=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_mla_prefill_head_dims(dtype):
    # DeepSeek's prefill shape: q/k head dim 192 = 128 nope + 64 rope, v head dim 128,
    # k and v as views of one buffer, the model's own softmax scale
    o, _ = run_case([21, 9], 2, 2, 192, 128, dtype, kv_views=True, scale=0.1147, seed=11)
    assert o.shape[-1] == 128


def test_chunked_prefill_bottom_right_mask():
    # new tokens after a cached prefix: Lk > Lq, query i sees keys <= i + Lk - Lq
    run_case([7, 20], 2, 1, 32, 32, torch.float16, lens_k=[30, 20], seed=4)


def test_rows_with_no_visible_key():
    # Lk < Lq: the first Lq - Lk queries see nothing -> out 0, lse -inf (no NaN)
    o, lse = run_case([9], 2, 2, 32, 32, torch.float16, lens_k=[4], seed=5)
    assert (o[:5].float() == 0).all() and torch.isinf(lse[:, :5]).all()


def test_non_causal_context_chunk():
    # vLLM's context-chunk pass: new queries against a chunk of cached keys, no mask
    run_case([6, 11], 4, 4, 48, 32, torch.bfloat16, lens_k=[40, 3], causal=False, seed=6)


def test_causal_mask_is_applied():
    # the last query of a sequence sees every key, the first only itself
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(16, 1, 32, generator=gen).half().to(DEVICE)
    k = torch.randn(16, 1, 32, generator=gen).half().to(DEVICE)
    v = torch.randn(16, 1, 32, generator=gen).half().to(DEVICE)
    o = prefill_attention(q, k, v, _cu([16]), 16, config=SMALL)
    torch.testing.assert_close(o[0].float(), v[0].float(), rtol=0, atol=1e-3)
    assert not torch.allclose(o[15].float(), v[15].float(), atol=1e-2)


def test_reference_matches_torch_sdpa():
    # the reference itself, against PyTorch's fused attention on one sequence
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(13, 2, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    ro, _ = varlen_attention_reference(q, k, v, torch.tensor([0, 13]), compute_dtype=torch.float64)
    sd = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    torch.testing.assert_close(ro, sd.transpose(0, 1))


def test_flop_count():
    # brute-force count of visible (query, key) pairs under the bottom-right causal mask
    for lq, lk in [(5, 5), (3, 8), (8, 3), (1, 1), (0, 4)]:
        pairs = sum(1 for i in range(lq) for j in range(lk) if j <= i + lk - lq)
        assert attention_flops([lq], [lk], 2, 192, 128, causal=True) == 2 * 2 * (192 + 128) * pairs
    assert attention_flops([4, 6], [4, 6], 1, 8, 8, causal=False) == 2 * 16 * (16 + 36)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dqk=40), "q/k head dim 40"),
        (dict(hq=3, hkv=2), r"q heads \(3\) must be a multiple of kv heads \(2\)"),
        (dict(dv=24), "v head dim 24"),
        (dict(kdtype=torch.float32), "k dtype"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    dqk, dv, hq, hkv = kwargs.get("dqk", 32), kwargs.get("dv", 32), kwargs.get("hq", 2), kwargs.get("hkv", 2)
    q = torch.randn(4, hq, dqk).half()
    k = torch.randn(4, hkv, dqk).to(kwargs.get("kdtype", torch.float16))
    v = torch.randn(4, hkv, dv).half()
    with pytest.raises(ValueError, match=match):
        prefill_attention(q, k, v, _cu([4]).cpu(), 4)


def test_split_head_dim():
    assert split_head_dim(128) == (128, 0) and split_head_dim(192) == (128, 64) and split_head_dim(96) == (64, 32)
    with pytest.raises(ValueError, match="head dim 72"):
        split_head_dim(72)
