"""MLA paged decode against the float64 reference: bf16/fp16 and fp8 e4m3 caches,
scattered pages, ragged lengths (0, 1, page-straddling), split-KV and head blocking
(CPU interpreter here, compiled kernels on a GPU)."""

import pytest
from engine_extra import require

require("torch", "triton")
import torch  # noqa: E402

from kernels.mla_decode import mla_decode, mla_decode_bytes, mla_decode_flops, pick_splits
from kernels.reference import mla_decode_reference
from mla_check import assert_matches_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = None if DEVICE == "cuda" else dict(BLOCK_H=16, BLOCK_N=16, num_warps=4, num_stages=1)
# p is rounded to the query dtype before p @ c_kv, the output once: see test_prefill_attention
TOL = {torch.bfloat16: 1e-2, torch.float16: 1.5e-3}
SCALE = 192**-0.5


def make(lens, heads, qdtype, kv, page, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pages = [max(1, -(-n // page)) for n in lens]
    nblk = sum(pages) + 3
    cache = torch.randn(nblk, page, 576, generator=gen)
    kv_scale = 1.0
    if kv == "fp8":
        kv_scale = 0.125
        cache = (cache / kv_scale).to(torch.float8_e4m3fn)
    else:
        cache = cache.to(qdtype)
    perm = torch.randperm(nblk, generator=gen)  # pages scattered through the pool
    bt = torch.zeros(len(lens), max(pages) + 2, dtype=torch.int32)  # wider than needed, as in vLLM
    i = 0
    for b, p in enumerate(pages):
        bt[b, :p] = perm[i:i + p]
        i += p
    q = torch.randn(len(lens), heads, 576, generator=gen).to(qdtype)
    return (q.to(DEVICE), cache.to(DEVICE), bt.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE),
            kv_scale)


def check(lens, heads, qdtype=torch.bfloat16, kv="same", page=16, num_splits=None, seed=0, config=None, uint8=False,
          scale_tensor=False):
    q, cache, bt, sl, ks = make(lens, heads, qdtype, kv, page, seed)
    out = torch.full((len(lens), heads, 512), float("nan"), dtype=qdtype, device=DEVICE)  # poison
    cfg = dict(SMALL or {}, **(config or {}))
    kvs = torch.tensor([ks]) if scale_tensor else ks
    o, lse = mla_decode(q, cache.view(torch.uint8) if uint8 else cache, bt, sl, SCALE,
                        kv_scale=kvs if kv == "fp8" else None, max_seq_len=max(lens), num_splits=num_splits,
                        out=out, return_lse=True, config=cfg or None)
    assert o.data_ptr() == out.data_ptr()
    assert_matches_reference(o, lse, q, cache, bt, sl, lens, SCALE, ks, TOL[qdtype])
    return o


@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 3, None], ids=["one_split", "three_splits", "auto"])
def test_bf16_fp16_cache(qdtype, num_splits):
    # lengths: empty, one token, exactly one page, straddling pages, longest
    check([0, 1, 16, 37, 70], 3, qdtype, "same", page=16, num_splits=num_splits, seed=1)


@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("num_splits", [1, 2], ids=["one_split", "two_splits"])
def test_fp8_cache(qdtype, num_splits):
    check([5, 90], 4, qdtype, "fp8", page=16, num_splits=num_splits, seed=2)


def test_fp8_cache_as_uint8_storage_and_tensor_scale():
    # vLLM allocates fp8 caches as uint8 and passes the scale as a tensor
    check([33, 7], 2, torch.bfloat16, "fp8", page=16, num_splits=2, seed=3, uint8=True, scale_tensor=True)


def test_block_64_pages():
    # DeepSeek's page size: 64 rows of 576
    check([64, 100, 3], 2, torch.bfloat16, "same", page=64, num_splits=2, seed=4)


def test_two_head_blocks():
    # 20 heads over blocks of 16: the second block is partly masked
    check([40], 20, torch.float16, "same", page=16, num_splits=2, seed=5)


def test_tile_larger_than_page():
    # a 32-token tile gathers rows from two 16-row pages
    check([50, 31], 2, torch.float16, "same", page=16, num_splits=1, seed=6, config=dict(BLOCK_N=32))


def test_pick_splits():
    # few programs: split long sequences until 2 waves of 132 SMs are busy, chunks of 64
    s, c = pick_splits(batch=1, head_blocks=1, max_seq_len=32768, sms=132, block_n=64)
    assert s * c >= 32768 and c % 64 == 0 and s == -(-32768 // c) and 128 <= s <= 264
    # many programs already: one split
    assert pick_splits(batch=128, head_blocks=8, max_seq_len=4096, sms=132, block_n=32) == (1, 4096)
    # never shorter than min_chunk tokens
    s, c = pick_splits(batch=1, head_blocks=1, max_seq_len=1000, sms=132, block_n=32, min_chunk=256)
    assert s == 4 and c == 256


def test_byte_and_flop_counts():
    assert mla_decode_bytes([10, 6], 4, kv_elem_bytes=1) == 16 * 576 + 2 * 4 * (576 + 512) * 2
    assert mla_decode_flops([10, 6], 4) == 2 * (576 + 512) * 4 * 16


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: a.update(q=a["q"][..., :512]), "q head dim must be 512 latent"),
        (lambda a: a.update(kv_scale=None), "kv_scale is required"),
        (lambda a: a.update(cache=a["cache"][:, :12]), "page_size"),
        (lambda a: a.update(bt=a["bt"].float()), "block_table must be int32"),
        (lambda a: a.update(q=a["q"].float()), "q dtype"),
    ],
)
def test_bad_input_is_named(mutate, match):
    q, cache, bt, sl, ks = make([5, 9], 2, torch.bfloat16, "fp8", 16)
    a = dict(q=q, cache=cache, bt=bt, kv_scale=ks)
    mutate(a)
    with pytest.raises(ValueError, match=match):
        mla_decode(a["q"], a["cache"], a["bt"], sl, SCALE, kv_scale=a["kv_scale"], max_seq_len=9)


def test_the_removed_transposed_kernel_is_refused_by_name():
    q, cache, bt, sl, ks = make([5], 3, torch.bfloat16, "same", 16)
    with pytest.raises(ValueError, match="config SWAP"):
        mla_decode(q, cache, bt, sl, SCALE, config=dict(SWAP=True))


def test_pick_splits_fill_rule():
    # one wave of 2 programs per SM: 64 sequences x 1 head block -> 4 splits of 1024 tokens
    assert pick_splits(64, 1, 4096, 132, 32, rule="fill", resident=2) == (4, 1024)
    # more programs than slots: no split
    assert pick_splits(300, 1, 4096, 132, 32, rule="fill", resident=2) == (1, 4096)
    with pytest.raises(ValueError, match="rule"):
        pick_splits(1, 1, 10, 132, 32, rule="even")


def test_fill_rule_end_to_end():
    check([37, 70, 5], 3, torch.bfloat16, "same", page=16, seed=10, config=dict(rule="fill", resident=1))


def test_launch_sized_for_shorter_sequences_is_still_exact():
    # a launch (e.g. a captured CUDA graph) sized for max_seq_len 20 running 70-token
    # sequences: the last split reads the rest
    q, cache, bt, sl, _ = make([70, 33], 2, torch.float16, "same", 16, seed=12)
    o = mla_decode(q, cache, bt, sl, SCALE, max_seq_len=20, num_splits=2, config=SMALL)
    ro, _ = mla_decode_reference(q.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), SCALE, compute_dtype=torch.float64)
    assert ((o.cpu().double() - ro).norm() / ro.norm()) < TOL[torch.float16]


def test_pick_splits_tokens_rule_fills_whole_rounds():
    # 64 x 4k at 16 heads, 2 programs per SM: 4 splits = 256 programs, one round of 264 slots
    assert pick_splits(64, 1, 4096, 132, 32, rule="tokens", resident=2, total_tokens=64 * 4096) == (4, 1024)
    # 128 heads (2 head blocks, 1 program per SM): 128 programs already fill a round; no split
    assert pick_splits(64, 2, 4096, 132, 64, rule="tokens", resident=1, total_tokens=64 * 4096) == (1, 4096)
    # a long single sequence still splits down to the minimum chunk
    assert pick_splits(1, 1, 8192, 132, 32, rule="tokens", resident=2, total_tokens=8192) == (32, 256)
    with pytest.raises(ValueError, match="total_tokens"):
        pick_splits(4, 1, 4096, 132, 32, rule="tokens")



def test_tokens_rule_end_to_end():
    # the host-side total picks the splits (min_chunk 16 so these short rows do split); exact either way
    q, cache, bt, sl, _ = make([300, 17, 129], 3, torch.float16, "same", 16, seed=13)
    cfg = dict(SMALL or {}, min_chunk=16)
    o = mla_decode(q, cache, bt, sl, SCALE, max_seq_len=300, total_tokens=446, config=cfg)
    ro, _ = mla_decode_reference(q.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), SCALE, compute_dtype=torch.float64)
    assert ((o.cpu().double() - ro).norm() / ro.norm()) < TOL[torch.float16]
