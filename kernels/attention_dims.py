"""What the prefill attention kernels (the Triton one in ``prefill_attention`` and the Gluon
Hopper one in ``prefill_sm90``) share: the log2-domain softmax constant and how a q.k head dim
splits into the tiles the products and TMA take."""

LOG2E = 1.4426950408889634


def split_head_dim(d: int) -> tuple[int, int]:
    """d = d1 + d2 with d1 the largest power of two <= d and d2 a power of two >= 16 or 0."""
    d1 = 1 << (d.bit_length() - 1)
    d2 = d - d1
    if d1 < 16 or (d2 and (d2 < 16 or d2 & (d2 - 1))):
        raise ValueError(
            f"q/k head dim {d} is not supported: it must be a power of two >= 16, or such a power "
            f"plus a smaller power of two >= 16 (e.g. 128, 192 = 128 + 64, 96 = 64 + 32)"
        )
    return d1, d2
