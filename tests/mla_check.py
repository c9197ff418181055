"""What the MLA decode tests share: the comparison with the float64 reference
(kernels/reference.py), used by the Triton kernel's tests and the Gluon kernels'; and the Gluon
kernels' GPU cases (a paged ragged batch with NaN past every sequence, the case list)."""

import torch

from kernels.reference import mla_decode_reference


KV_SCALE = 0.125  # an fp8 cache's per-tensor scale
# the Gluon kernels' GPU cases beside their ragged batches: fp16, one head block, 64-token blocks
# inside larger pages, long sequences in four splits
GPU_CASES = [dict(lens=[129, 700], dtype=torch.float16), dict(lens=[200, 64, 1], heads=64),
             dict(lens=[300, 517], page=128), dict(lens=[4096] * 4, num_splits=4)]
GPU_CASE_IDS = ["fp16", "64_heads", "page_128", "long"]


def paged_case(lens, heads, dtype, page, seed, fp8=False, growth=0.0):
    """A ragged batch on the GPU: q [B, heads, 576] in ``dtype`` and a paged cache ([blocks, page,
    576], pages scattered through the pool) in ``dtype`` or, ``fp8``, e4m3 of the values over
    ``KV_SCALE``; the slots past every sequence are NaN (e4m3 keeps NaN). With ``growth`` page p of
    each sequence is scaled by 1 + growth p, so the scores' running maximum keeps rising along the
    sequence (past the lazy rescale's slack)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [max(1, -(-n // page)) for n in lens]
    nblk = sum(pages) + 3
    cache = torch.randn(nblk, page, 576, generator=gen)
    perm = torch.randperm(nblk, generator=gen)  # pages scattered through the pool
    bt = torch.zeros(len(lens), max(pages) + 2, dtype=torch.int32)
    i = 0
    for b, (n, p) in enumerate(zip(lens, pages)):
        bt[b, :p] = perm[i:i + p]
        i += p
        last = int(bt[b, p - 1])
        for k in range(p):
            cache[int(bt[b, k])] *= 1 + growth * k
        cache[last, n - (p - 1) * page if n else 0:] = float("nan")  # the slots past the sequence
    cache = (cache / KV_SCALE).to(torch.float8_e4m3fn) if fp8 else cache.to(dtype)
    q = torch.randn(len(lens), heads, 576, generator=gen).to(dtype)
    return q.cuda(), cache.cuda(), bt.cuda(), torch.tensor(lens, dtype=torch.int32).cuda()


def assert_matches_reference(o, lse, q, cache, bt, sl, lens, scale, kv_scale, tol):
    """Output within ``tol`` (relative, Frobenius) of the reference, the LSE finite exactly where
    the reference's is and within 1e-4 there, and empty sequences' outputs exactly 0."""
    assert not torch.isnan(o).any()
    ro, rl = mla_decode_reference(q.cpu(), cache.cpu(), bt.cpu(), sl.cpu(), scale, kv_scale,
                                  compute_dtype=torch.float64)
    err = ((o.cpu().double() - ro).norm() / ro.norm()).item()
    assert err < tol, err
    seen = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    assert (lse.cpu().double()[seen] - rl[seen]).abs().max() < 1e-4
    for b, n in enumerate(lens):
        if n == 0:
            assert (o[b] == 0).all()
