import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402

from kernels.moe_routing import grouped_topk
from kernels.reference import grouped_topk_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# name: (experts, n_group, topk_group, topk, scoring, bias, renormalize, scale)
LAYOUTS = {
    "v3": (256, 8, 4, 8, "sigmoid", True, True, 2.5),
    "v2": (160, 8, 3, 6, "softmax", False, False, 16.0),
    "v2_lite": (64, 1, 1, 6, "softmax", False, False, 1.0),
    # odd layouts: 3 groups (padded to 4) of 24 experts, sigmoid without bias (group
    # score = max), and 12 groups of 10 with bias and no renormalisation.
    "g3x24_sigmoid_nobias": (72, 3, 2, 5, "sigmoid", False, True, 1.0),
    "g12x10_bias": (120, 12, 5, 7, "sigmoid", True, False, 1.5),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tie_free_logits(t: int, e: int, dtype, gen) -> torch.Tensor:
    """Each row is a permutation of distinct multiples of 1/16: exact in bf16 and fp16,
    so scores, biased scores and group scores cannot tie and the selection is unique."""
    perm = torch.stack([torch.randperm(e, generator=gen) for _ in range(t)]) if t else torch.empty(0, e)
    return ((perm.float() - e / 2) / 16).to(dtype).to(DEVICE)


def check(layout, t, dtype, seed=0, stride_pad=0, **kw):
    e, g, tg, k, scoring, has_bias, renorm, scale = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(seed)
    logits = tie_free_logits(t, e + stride_pad, dtype, gen)[:, :e]
    bias = (torch.rand(e, generator=gen) * 0.2).to(DEVICE) if has_bias else None
    ids, w = grouped_topk(logits, k, g, tg, scoring, bias, renorm, scale, **kw)
    rids, rw = grouped_topk_reference(logits, k, g, tg, scoring, bias, renorm, scale)
    assert ids.shape == (t, k) and ids.dtype == torch.int32
    assert w.shape == (t, k) and w.dtype == torch.float32
    # ids come in no particular order: compare per token as sets, weights in the same order
    sids, order = ids.long().sort(dim=1)
    srids, rorder = rids.long().sort(dim=1)
    assert torch.equal(sids, srids)
    # The logits are exact in every dtype and both sides compute in fp32: only exp/div
    # rounding separates them (a few ulp), so the tolerance is fp32-tight for all dtypes.
    torch.testing.assert_close(w.gather(1, order), rw.gather(1, rorder), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("t", [0, 1, 7, 33])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_router_matches_reference(layout, t, dtype):
    check(layout, t, dtype, seed=t)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_router_257_tokens(layout):
    check(layout, 257, torch.bfloat16, seed=257)


@pytest.mark.parametrize("block_t,num_warps", [(4, 4), (8, 2)])
@pytest.mark.parametrize("layout", ["v3", "v2"])
def test_router_many_tokens_per_program(layout, block_t, num_warps):
    # 33 tokens: the last program is partly past the end
    check(layout, 33, torch.float16, seed=5, block_t=block_t, num_warps=num_warps)


def test_router_strided_rows():
    # logits viewed out of a wider buffer (row stride != experts)
    check("v3", 9, torch.bfloat16, seed=9, stride_pad=13)


def test_router_sigmoid_scale_and_renorm():
    e, g, tg, k = 256, 8, 4, 8
    gen = torch.Generator().manual_seed(1)
    logits = tie_free_logits(5, e, torch.float32, gen)
    bias = (torch.rand(e, generator=gen) * 0.2).to(DEVICE)
    _, w = grouped_topk(logits, k, g, tg, "sigmoid", bias, True, 2.5)
    torch.testing.assert_close(w.sum(1), torch.full((5,), 2.5, device=DEVICE), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block_t,num_warps", [(1, 1), (4, 1)])
@pytest.mark.parametrize("layout", ["v3", "v2", "g12x10_bias"])
def test_router_previous_kernel(layout, block_t, num_warps):
    # the previous one-pass kernel, kept for the benchmark's before/after column
    check(layout, 9, torch.bfloat16, seed=3, block_t=block_t, num_warps=num_warps, method="full")


def test_router_rejects_unknown_method():
    with pytest.raises(ValueError, match="method"):
        grouped_topk(torch.zeros(2, 64, device=DEVICE), 6, method="sorted")
