"""The MLA decode tests' comparison with the float64 reference (kernels/reference.py), shared by
the Triton kernel's tests and the Gluon kernel's."""

import torch

from kernels.reference import mla_decode_reference


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
