"""The Gluon sm_90 prefill attention kernel (kernels/prefill_sm90.py).

Gluon has no CPU interpreter, so the numbers are checked only on a Hopper GPU (the H200 runs
are committed under kernels/bench/results/). On any machine the kernel is compiled for sm_90a
through this Triton's own ptxas and the build is checked for what it exists for: 16-bit
warpgroup MMAs, P V taking P from registers, the products' structure (one Q K^T before the key
loop, Q K^T and P V in it, one P V after, per consumer warpgroup), no spills and no
serialised wgmma."""

import json

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402
from sm90_build import HOPPER, ROOT, build, needs_hopper  # noqa: E402

from kernels import prefill_sm90 as sm90  # noqa: E402
from kernels.prefill_attention import prefill_attention  # noqa: E402
from kernels.reference import varlen_attention_reference  # noqa: E402

needs_gluon = pytest.mark.skipif(not sm90.HAVE_GLUON, reason="this Triton build has no Gluon Hopper modules")
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}  # as tests/kernels/test_prefill_attention.py


@needs_gluon
@pytest.mark.parametrize("dqk,config", [
    (128, None),
    (192, None),
    (128, dict(PINGPONG=False, PERSISTENT=1, STAGES=3)),
    (192, dict(BLOCK_N=64, STAGES=3, PERSISTENT=1)),
], ids=["d128", "mla192", "d128_persistent_s3", "mla192_n64"])
def test_the_build_keeps_p_in_registers_and_does_not_spill(dqk, config):
    info = build("prefill_sm90_build", dqk, 128, config)
    assert info["spill_bytes"] == 0 and not info["serialized"], info["ptxas_info"]
    bn = sm90.launch_config(config, dqk, 128)["BLOCK_N"]
    # per consumer: Q K^T before the loop and in it (Dqk / 16 k-steps each), P V in it and after
    # it (BLOCK_N / 16 k-steps each, A = P from registers); two consumer warpgroups
    assert info["hgmma"] == 2 * (2 * dqk // 16 + 2 * bn // 16), info
    assert info["hgmma_reg_a"] == 2 * 2 * bn // 16, info
    assert info["hmma"] == 0 and info["qgmma"] == 0, info
    assert info["shared"] >= sm90.smem_bytes(dqk, 128, bn, sm90.launch_config(config, dqk, 128)["STAGES"]) - 1024


def test_a_config_is_checked_before_launch():
    assert sm90.launch_config(None, 128, 128, 20.0) == sm90.default_config(128, 128, 20.0)
    assert sm90.launch_config(dict(STAGES=3), 128, 128)["STAGES"] == 3
    with pytest.raises(ValueError, match=r"unknown keys \['BLOCK_M'\]"):
        sm90.launch_config(dict(BLOCK_M=64), 128, 128)
    with pytest.raises(ValueError, match="BLOCK_N must be 64 or 128, got 96"):
        sm90.launch_config(dict(BLOCK_N=96), 128, 128)
    with pytest.raises(ValueError, match="STAGES 3 of BLOCK_N 128 need 2[0-9]+ bytes of shared memory with Dqk 192"):
        sm90.launch_config(dict(STAGES=3), 192, 128)  # 48 KB of Q and 3 x 80 KB of K + V
    with pytest.raises(ValueError, match="PERSISTENT must be 0 .* or 1 .* got 2"):
        sm90.launch_config(dict(PERSISTENT=2), 128, 128)
    with pytest.raises(ValueError, match="STAGES must be a positive int"):
        sm90.launch_config(dict(STAGES=0), 128, 128)
    # the Triton kernel's split of the q.k head dim, which the TMA blocks follow
    assert sm90.split_head_dim(192) == (128, 64) and sm90.split_head_dim(128) == (128, 0)
    with pytest.raises(ValueError, match="head dim 176"):
        sm90.split_head_dim(176)  # 128 + 48


def test_asking_for_it_off_hopper_is_a_clear_error():
    q = torch.zeros(4, 2, 128, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    assert not sm90.supported(q, q, q)
    if not HOPPER:
        with pytest.raises(ValueError, match="KERNEL 'sm90' needs a Hopper GPU"):
            prefill_attention(q, q, q, cu, 4, config=dict(KERNEL="sm90"))
    with pytest.raises(ValueError, match="KERNEL must be 'triton' or 'sm90', got 'cuda'"):
        prefill_attention(q, q, q, cu, 4, config=dict(KERNEL="cuda"))


def _cu(lens):
    return torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32).cuda()


def _check(lens_q, hq, hkv, dqk, dv, dtype=torch.bfloat16, lens_k=None, causal=True, config=None, seed=0,
           kv_views=False):
    gen = torch.Generator().manual_seed(seed)
    lens_k = lens_q if lens_k is None else lens_k
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, dqk, generator=gen).to(dtype).cuda()
    if kv_views:  # k and v as strided views of one [tokens, heads, dqk + dv] buffer (vLLM's MLA prefill)
        kv = torch.randn(tk, hkv, dqk + dv, generator=gen).to(dtype).cuda()
        k, v = kv[..., :dqk], kv[..., dqk:]
    else:
        k = torch.randn(tk, hkv, dqk, generator=gen).to(dtype).cuda()
        v = torch.randn(tk, hkv, dv, generator=gen).to(dtype).cuda()
    cq, ck = _cu(lens_q), _cu(lens_k)
    assert sm90.supported(q, k, v)
    out = torch.full((tq, hq, dv), float("nan"), dtype=dtype, device="cuda")  # every row must be written
    o, lse = prefill_attention(q, k, v, cq, max(lens_q), ck, causal=causal, return_lse=True, out=out,
                               config=dict(KERNEL="sm90", **(config or {})))
    ro, rl = varlen_attention_reference(q.cpu(), k.cpu(), v.cpu(), cq.cpu(), ck.cpu(), None, causal, torch.float64)
    assert not torch.isnan(o).any()
    err = ((o.cpu().double() - ro).norm() / ro.norm().clamp_min(1e-30)).item()
    assert err < TOL[dtype], err
    seen = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    assert (lse.cpu().double()[seen] - rl[seen]).abs().max().item() < 1e-4


CONFIGS = [
    None,  # the default
    dict(PINGPONG=False),
    dict(PERSISTENT=1),  # programs walk several tiles: Q, stage and turn counters across tiles
    dict(STAGES=1),  # the shallowest ring: every load waits for the slot's release
    dict(BLOCK_N=64, STAGES=3, PERSISTENT=1),
    dict(HEAD_MAJOR=True, PINGPONG=False),
    dict(HEAD_MAJOR=True, PERSISTENT=1),
]


def _cid(c):
    return "default" if c is None else "_".join(f"{k.lower()}{int(v)}" for k, v in c.items())


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", CONFIGS, ids=_cid)
@pytest.mark.parametrize("lens,hq,hkv,dqk", [
    ([300, 1, 129, 128, 77], 4, 4, 128),  # odd lengths, one token, exactly one tile, a ragged tail
    ([513, 200], 8, 2, 128),  # GQA 4:1, more key blocks than stages
    ([257, 64, 3], 3, 3, 192),  # MLA 192 / 128: Q K^T as two chained products
    ([0, 50, 0], 2, 1, 128),  # empty sequences
], ids=["mha_odd", "gqa", "mla192", "empty_seqs"])
def test_causal_varlen_matches_the_reference(config, lens, hq, hkv, dqk):
    _check(lens, hq, hkv, dqk, 128, config=config, seed=sum(lens))


@needs_hopper
@pytest.mark.timeout(300)
@pytest.mark.parametrize("config", [None, dict(PERSISTENT=1)], ids=_cid)
@pytest.mark.parametrize("case", [
    dict(lens_q=[100, 37], lens_k=[400, 37]),  # a chunk after a cached prefix (Lk > Lq)
    dict(lens_q=[300], lens_k=[100]),  # Lk < Lq: the first 200 rows see no key
    dict(lens_q=[190, 45], causal=False),
    dict(lens_q=[260, 7], dtype=torch.float16),
    dict(lens_q=[150], kv_views=True),
    dict(lens_q=[1000], lens_k=[1000], dqk=192),
], ids=["chunk", "lk_lt_lq", "non_causal", "fp16", "kv_views", "mla_1k"])
def test_cases_match_the_reference(config, case):
    case = dict(case)
    dqk = case.pop("dqk", 128)
    _check(hq=4, hkv=2, dqk=dqk, dv=128, config=config, seed=7, **case)


@needs_hopper
def test_prefill_attention_takes_it_by_default_on_hopper():
    q = torch.randn(256, 2, 128, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 256], dtype=torch.int32, device="cuda")
    a = prefill_attention(q, q, q, cu, 256)
    b = prefill_attention(q, q, q, cu, 256, config=dict(KERNEL="sm90"))
    assert torch.equal(a, b)


RACE = ROOT / "kernels" / "bench" / "results" / "2026-12-03_h200_race8c_prefill_sm90.json"
# race 8c's Gluon candidates, whole (its variants were changes to that day's default, the first line)
RACE_8C = {"default": dict(PINGPONG=True, PERSISTENT=0, HEAD_MAJOR=False)}
RACE_8C.update({n: dict(RACE_8C["default"], **c) for n, c in {
    "sm90_nopp": dict(PINGPONG=False), "sm90_hm": dict(HEAD_MAJOR=True),
    "sm90_hm_nopp": dict(HEAD_MAJOR=True, PINGPONG=False),
    "sm90_p1": dict(PERSISTENT=1), "sm90_p1_nopp": dict(PERSISTENT=1, PINGPONG=False),
    "sm90_hm_p1": dict(HEAD_MAJOR=True, PERSISTENT=1)}.items()})


def test_the_default_is_the_fastest_raced_config_within_the_spread():
    """At every case of race 8c the default launch is a config the race timed, within 3% of the
    fastest Gluon config there (one config's spread between runs), and faster than the Triton
    kernel."""
    res = json.loads(RACE.read_text())
    sms = res["meta"]["sms"]
    assert len(res["attn"]) == 8
    for r in res["attn"]:
        lens = r["lens"]
        tiles = -(-max(lens) // sm90.BLOCK_M) * r["hq"] * len(lens)
        want = sm90.default_config(r["dqk"], r["dv"], tiles / sms)
        raced = {n: sm90.launch_config(c, r["dqk"], r["dv"]) for n, c in RACE_8C.items()}
        name = next((n for n, c in raced.items() if c == want), None)
        assert name is not None, (r["case"], want)
        speed = {n: r["variants"][f"{n}_bf16"]["tflops"] for n in raced}
        assert speed[name] >= 0.97 * max(speed.values()), (r["case"], name, speed)
        assert speed[name] > r["variants"]["triton_bf16"]["tflops"], (r["case"], speed[name])
