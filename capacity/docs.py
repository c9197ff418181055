"""The planner's catalog tables in docs/planner.md, generated from `plan()` and the
catalog's checkpoints, never typed.

    python -m capacity.docs             print the table
    python -m capacity.docs --update    rewrite it between the markers in docs/planner.md
"""

from __future__ import annotations

from pathlib import Path

from capacity.catalog import GPUS, MODELS, checkpoint_format, checkpoints_of
from capacity.planner import plan

DOC_PAGE = Path(__file__).resolve().parents[1] / "docs" / "planner.md"
DOC_GPUS = ("A10", "L20", "A100-80G", "H20", "H100", "H800", "H200")
DOC_BEGIN = "<!-- BEGIN GENERATED: python -m capacity.docs --update -->"
DOC_END = "<!-- END GENERATED -->"
CKPT_BEGIN = "<!-- BEGIN GENERATED checkpoints: python -m capacity.docs --update -->"
CKPT_END = "<!-- END GENERATED checkpoints -->"


def _short_tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1000:
        return f"{n / 1e3:.0f}k"
    return str(n)


def short_layout(p) -> str:
    """TP8×PP2, TP8+EP8, DP16+EP16 (TP inside each engine when > 1: DP2×TP8+EP16)."""
    if p.parallelism == "tp_pp":
        return f"TP{p.tensor_parallel_size}" + (f"×PP{p.pipeline_parallel_size}" if p.pipeline_parallel_size > 1 else "")
    tp = f"TP{p.tensor_parallel_size}" if p.tensor_parallel_size > 1 else ""
    dp = f"DP{p.data_parallel_size}" if p.data_parallel_size > 1 else ""
    return "×".join(x for x in (dp, tp) if x) + f"+EP{p.expert_parallel_size}"


def catalog_table_markdown(gpus: tuple[str, ...] = DOC_GPUS, gpus_per_node: int = 8) -> str:
    """Markdown table: every catalog model on the common GPUs with default settings (no
    RDMA: expert parallelism stays within a node, and a layout over several nodes is marked
    "needs RDMA"). Cells: layout, nodes, tokens of KV cache in one replica (over all its
    data-parallel engines)."""
    head = "| model | " + " | ".join(gpus) + " |"
    sep = "|---|" + "---|" * len(gpus)
    rows = [head, sep]
    for name, spec in MODELS.items():
        cells = []
        for g in gpus:
            p = plan(spec, GPUS[g], gpus_per_node=gpus_per_node)
            rdma = bool(p.reasons) and all("needs RDMA" in r for r in p.reasons)
            if not p.fits and not rdma:
                sparse = any("DeepSeek Sparse Attention" in r for r in p.reasons)
                cc = ".".join(map(str, GPUS[g].compute_capability or ()))
                cells.append(f"no sparse-attention kernels (SM {cc})" if sparse else "does not fit")
                continue
            cells.append(f"{short_layout(p)}, {p.nodes} node" + ("s" if p.nodes > 1 else "")
                         + f", {_short_tokens(p.replica_kv_cache_tokens)}" + (", needs RDMA" if rdma else ""))
        rows.append(f"| {name} ({spec.native_dtype}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def checkpoints_table_markdown() -> str:
    """Markdown table: each catalog model's checkpoints (the original first), their weight
    format, the quantization_config facts the planner and vLLM read, and the source."""
    rows = ["| catalog model (serving.model) | checkpoint | weights | quantization_config | vLLM flag | source |",
            "|---|---|---|---|---|---|"]
    for name, spec in MODELS.items():
        if spec.base_model:
            continue
        for m in checkpoints_of(spec):
            q = m.quant
            facts = "-" if q is None else ", ".join(
                [f"quant_method {q.method}", f"{q.bits}-bit"]
                + ([f"group_size {q.group_size}"] if q.group_size else [])
                + (["zero point"] if q.zero_point else ["symmetric"] if q.format in ("awq", "w4a16") else [])
                + ([f"weight_block_size {list(q.weight_block_size)}"] if q.weight_block_size
                   else ["per-channel scales"] if q.format == "fp8" else []))
            flag = "none (read from config.json)" if q else "`--quantization fp8_per_tensor` with quantization: fp8"
            source = m.source.split(" ")[0] + (" (model page; config.json not read, see capacity/checkpoints.yaml)"
                                               if "config.json not read" in m.source else "")
            rows.append(f"| {m.name} | `{m.hf_id}` | {checkpoint_format(m)} | {facts} | {flag} | {source} |")
    return "\n".join(rows)


def _replace(text: str, begin: str, end: str, body: str, path: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: markers {begin!r} ... {end!r} not found")
    pre, rest = text.split(begin, 1)
    _, post = rest.split(end, 1)
    return f"{pre}{begin}\n{body}\n{end}{post}"


def _update_docs(path: str) -> bool:
    doc = Path(path)
    text = doc.read_text()
    new = _replace(text, DOC_BEGIN, DOC_END, catalog_table_markdown(), path)
    new = _replace(new, CKPT_BEGIN, CKPT_END, checkpoints_table_markdown(), path)
    changed = new != text
    doc.write_text(new)
    return changed


if __name__ == "__main__":  # python -m capacity.docs [--update [PATH]]
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "--update":
        target = sys.argv[2] if len(sys.argv) > 2 else str(DOC_PAGE)
        print(f"{target}: {'updated' if _update_docs(target) else 'already up to date'}")
    else:
        print(catalog_table_markdown() + "\n\n" + checkpoints_table_markdown())
