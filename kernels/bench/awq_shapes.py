"""The W4A16 shapes that matter: (K, N) of every linear layer the catalog's AWQ checkpoints run
through ``w4a16_gemm``, at the tensor-parallel size the planner gives them, so a race covers
exactly what a deployment multiplies (``python -m kernels.bench.awq_shapes`` lists them).

vLLM's layers, per decoder layer of a Llama / Qwen2 model: q, k and v merged into one
``QKVParallelLinear`` (N = (heads + 2 kv heads) x head_dim, heads split over TP ranks, kv heads
split while TP divides them and one kv head a rank once TP exceeds them), ``o_proj`` row-parallel
(K split), gate and up merged into one ``MergedColumnParallelLinear`` (N = 2 x intermediate,
split), ``down_proj`` row-parallel. The embedding and the LM head stay 16-bit (AutoAWQ does not
quantise them), so they are not W4A16 shapes."""

from __future__ import annotations

import argparse
from collections import defaultdict

from capacity.catalog import GPUS, MODELS, checkpoint_format
from capacity.planner import plan
from capacity.specs import GPUSpec, ModelSpec

HOPPER = (9, 0)  # where w4a16_gemm runs the Gluon kernel (kernels/w4a16_sm90.py), the race's GPU


def layer_shapes(m: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) of the four W4A16 layers of one decoder layer of ``m`` on one of ``tp`` ranks.
    A ``ValueError`` names the model and the size TP does not divide."""
    if m.kv_lora_rank is not None or m.n_routed_experts:
        raise ValueError(f"{m.name}: layer_shapes covers dense GQA models (Llama, Qwen2), not MLA or MoE")
    for what, size in (("num_attention_heads", m.num_attention_heads), ("intermediate_size", m.intermediate_size)):
        if size % tp:
            raise ValueError(f"{m.name}: tensor_parallel_size {tp} does not divide {what}={size}")
    if m.num_kv_heads % tp and tp % m.num_kv_heads:
        raise ValueError(f"{m.name}: tensor_parallel_size {tp} neither divides nor is a multiple of "
                         f"num_kv_heads={m.num_kv_heads}")
    hd, hidden = m.head_dim, m.hidden_size
    q = m.num_attention_heads // tp * hd
    kv = max(m.num_kv_heads // tp, 1) * hd
    return {"qkv": (hidden, q + 2 * kv), "o": (q, hidden), "gate_up": (hidden, 2 * m.intermediate_size // tp),
            "down": (m.intermediate_size // tp, hidden)}


def awq_models() -> dict[str, ModelSpec]:
    """The catalog's AWQ checkpoints (capacity/checkpoints.yaml)."""
    return {name: m for name, m in MODELS.items() if checkpoint_format(m) == "awq"}


def catalog_shapes(gpus: dict[str, GPUSpec] | None = None,
                   compute_capability: tuple[int, int] | None = HOPPER) -> dict[tuple[int, int], list[str]]:
    """Every (K, N) the catalog's AWQ checkpoints run on the catalog's GPUs of
    ``compute_capability`` (None: every GPU) at the layout the planner picks there (its default
    search: the smallest TP whose memory holds the model's context), each with the layers that
    use it ("model layer TPn"), in a stable order."""
    gpus = {n: g for n, g in (gpus or GPUS).items()
            if compute_capability is None or g.compute_capability == compute_capability}
    out: dict[tuple[int, int], list[str]] = defaultdict(list)
    for name, m in sorted(awq_models().items()):
        for tp in sorted({p.tensor_parallel_size for p in (plan(m, g) for g in gpus.values()) if p.fits}):
            for layer, shape in layer_shapes(m, tp).items():
                out[shape].append(f"{name} {layer} TP{tp}")
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench.awq_shapes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--all-gpus", action="store_true", help="every catalog GPU, not only Hopper")
    args = ap.parse_args(argv)
    shapes = catalog_shapes(compute_capability=None if args.all_gpus else HOPPER)
    for (k, n), uses in shapes.items():
        print(f"{k}x{n}\t{'; '.join(uses)}")
    print("--w4-shapes " + ",".join(f"{k}x{n}" for k, n in shapes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
