"""The performance model against published serving figures (capacity/calibration.yaml).

``calibration_rows()`` predicts every figure with the committed efficiency factors and
returns its ratio; tests/test_perf_calibration.py and docs/planner.md use it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from capacity.catalog import get_model
from capacity.perf import Hardware, Layout, PerfDataError, decode_itl, estimate, gpu_perf, load_hardware, prefill_step

CALIBRATION_FILE = Path(__file__).with_name("calibration.yaml")
METRICS = ("decode_tokens_per_s_per_gpu", "prefill_tokens_per_s_per_gpu", "itl_ms", "throughput_gain")
_REQUIRED = ("id", "source", "read", "published", "metric", "value", "model", "gpu", "layout", "assumed")
_BY_METRIC = {
    "decode_tokens_per_s_per_gpu": ("batch_per_gpu", "context"),
    "prefill_tokens_per_s_per_gpu": ("tokens_per_gpu", "seq"),
    "itl_ms": ("concurrency", "input_tokens", "output_tokens"),
    "throughput_gain": ("concurrency", "input_tokens", "output_tokens"),
}
_OPTIONAL = ("kv_cache_dtype", "cache_hit", "quantization", "batch_per_gpu", "context", "tokens_per_gpu", "seq",
             "concurrency", "input_tokens", "output_tokens")


@dataclass(frozen=True)
class Figure:
    id: str
    source: str
    read: str
    published: str
    metric: str
    value: float
    model: str
    gpu: str
    layout: Layout
    assumed: list[str]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    id: str
    source: str
    configuration: str
    metric: str
    published: float
    predicted: float
    ratio: float
    assumed: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_figures(path: str | Path | None = None) -> tuple[float, list[Figure], list[dict[str, str]]]:
    """(tolerance, figures, not-comparable entries), validated."""
    p = Path(path) if path else CALIBRATION_FILE
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PerfDataError(f"{p.name}: cannot read: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("figures"), list):
        raise PerfDataError(f"{p.name}: figures: expected a list")
    tol = doc.get("tolerance")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
        raise PerfDataError(f"{p.name}: tolerance: expected a fraction in (0, 1), got {tol!r}")
    out, seen = [], set()
    for i, f in enumerate(doc["figures"]):
        where = f"{p.name}: figures[{i}]"
        if not isinstance(f, dict):
            raise PerfDataError(f"{where}: expected a mapping")
        missing = [k for k in _REQUIRED if k not in f]
        if missing:
            raise PerfDataError(f"{where}: missing {', '.join(missing)}")
        if f["id"] in seen:
            raise PerfDataError(f"{where}.id: {f['id']!r} appears twice")
        seen.add(f["id"])
        if f["metric"] not in METRICS:
            raise PerfDataError(f"{where}.metric: expected one of {', '.join(METRICS)}, got {f['metric']!r}")
        need = [k for k in _BY_METRIC[f["metric"]] if k not in f]
        if need and f["metric"] == "decode_tokens_per_s_per_gpu":
            need = [k for k in _BY_METRIC["itl_ms"] if k not in f] and need
        if need:
            raise PerfDataError(f"{where}: metric {f['metric']} needs {', '.join(need)}")
        unknown = [k for k in f if k not in (*_REQUIRED, *_OPTIONAL)]
        if unknown:
            raise PerfDataError(f"{where}: unknown field(s) {', '.join(unknown)}")
        if not str(f["source"]).startswith("https://"):
            raise PerfDataError(f"{where}.source: expected an https URL")
        if not isinstance(f["value"], (int, float)) or f["value"] <= 0:
            raise PerfDataError(f"{where}.value: expected a number > 0")
        if not isinstance(f["layout"], dict):
            raise PerfDataError(f"{where}.layout: expected a mapping")
        try:
            lay = Layout(**f["layout"])
        except TypeError as exc:
            raise PerfDataError(f"{where}.layout: {exc}") from None
        params = {k: f[k] for k in _OPTIONAL if k in f}
        out.append(Figure(f["id"], f["source"], str(f["read"]), f["published"], f["metric"], float(f["value"]),
                          f["model"], f["gpu"], lay, list(f["assumed"] or []), params))
    nc = doc.get("not_comparable") or []
    for i, e in enumerate(nc):
        if not isinstance(e, dict) or not {"id", "source", "read", "published", "why"} <= set(e):
            raise PerfDataError(f"{p.name}: not_comparable[{i}]: expected id, source, read, published and why")
    return float(tol), out, nc


def predict(f: Figure, hw: Hardware | None = None) -> float:
    """The model's value of figure ``f``'s metric in its configuration."""
    hw = hw or load_hardware()
    m, gpu, lay, q = get_model(f.model), gpu_perf(f.gpu, hw), f.layout, f.params
    kv = q.get("kv_cache_dtype", "auto")
    quant = q.get("quantization")
    if f.metric == "decode_tokens_per_s_per_gpu" and "batch_per_gpu" in q:
        conc = q["batch_per_gpu"] * lay.gpus
        itl, _ = decode_itl(m, gpu, lay, concurrency=conc, context=q["context"], quantization=quant,
                            kv_cache_dtype=kv, hw=hw)
        return conc / itl / lay.gpus
    if f.metric == "prefill_tokens_per_s_per_gpu":
        engine_tokens = q["tokens_per_gpu"] * lay.tp
        s = prefill_step(m, gpu, lay, tokens=engine_tokens, seq=q["seq"], quantization=quant, kv_cache_dtype=kv,
                         cache_hit=q.get("cache_hit", 0.0), hw=hw)
        return engine_tokens / s.t_step / lay.tp
    kw = dict(input_tokens=q["input_tokens"], output_tokens=q["output_tokens"], quantization=quant,
              kv_cache_dtype=kv, hw=hw)
    p = estimate(m, gpu, lay, concurrency=q["concurrency"], **kw)
    if f.metric == "itl_ms":
        return p.itl_s * 1e3
    if f.metric == "throughput_gain":
        return p.output_tokens_per_s_per_gpu / estimate(m, gpu, lay, concurrency=1, **kw).output_tokens_per_s_per_gpu
    return p.decode_tokens_per_s_per_gpu


def describe(f: Figure) -> str:
    lay = f.layout
    parts = [f"{f.model} on {f.gpu}"]
    if lay.ep > 1:
        parts.append(f"DP{lay.dp} + EP{lay.ep}" if lay.tp == 1 else f"TP{lay.tp} x DP{lay.dp} + EP{lay.ep}")
    else:
        parts.append(f"TP{lay.tp}" + (f" x PP{lay.pp}" if lay.pp > 1 else ""))
    q = f.params
    if "batch_per_gpu" in q:
        parts.append(f"{q['batch_per_gpu']} seq/GPU at {q['context']} tokens")
    if "tokens_per_gpu" in q:
        parts.append(f"{q['seq']}-token prompts" + (f", {q['cache_hit']:.0%} cached" if q.get("cache_hit") else ""))
    if "concurrency" in q:
        parts.append(f"concurrency {q['concurrency']}, {q['input_tokens']} in / {q['output_tokens']} out")
    return ", ".join(parts)


def calibration_rows(hw: Hardware | None = None, path: str | Path | None = None) -> list[Row]:
    hw = hw or load_hardware()
    _, figures, _ = load_figures(path)
    rows = []
    for f in figures:
        pred = predict(f, hw)
        rows.append(Row(f.id, f.source, describe(f), f.metric, f.value, pred, pred / f.value, f.assumed))
    return rows


DOC_PAGE = Path(__file__).resolve().parents[1] / "docs" / "planner.md"
DOC_BEGIN = "<!-- BEGIN GENERATED: python -m capacity.calibration --update -->"
DOC_END = "<!-- END GENERATED: calibration -->"
_UNITS = {"decode_tokens_per_s_per_gpu": "output tok/s/GPU", "prefill_tokens_per_s_per_gpu": "input tok/s/GPU",
          "itl_ms": "ITL ms", "throughput_gain": "throughput x"}


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"


def docs_markdown(hw: Hardware | None = None) -> str:
    """The calibration table, the factors and the figures not compared (docs/planner.md)."""
    hw = hw or load_hardware()
    tol, figures, nc = load_figures()
    lines = [f"Tolerance ±{tol:.0%}. Predicted with one set of factors (below) for every figure.", "",
             "| figure | source | configuration | metric | published | model | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in calibration_rows(hw):
        lines.append(f"| `{r.id}` | [source]({r.source}) | {r.configuration} | {_UNITS[r.metric]} | "
                     f"{_fmt(r.published)} | {_fmt(r.predicted)} | {r.ratio:.2f} |")
    lines += ["", "Assumptions per figure (capacity/calibration.yaml `assumed`):", ""]
    for f in figures:
        if f.assumed:
            lines.append(f"- `{f.id}`: " + "; ".join(f.assumed))
    lines += ["", "| factor | value | kind | basis |", "|---|---|---|---|"]
    for section in (hw.efficiency, hw.communication):
        for k, fac in section.items():
            lines.append(f"| `{k}` | {fac.value:g} | {fac.kind} | {fac.basis} |")
    lines += ["", "Published figures not compared:", ""]
    for e in nc:
        lines.append(f"- `{e['id']}` ([source]({e['source']})): {e['published']}. Not compared: {e['why']}.")
    return "\n".join(lines)


def _update_docs(path: str) -> bool:
    doc = Path(path)
    text = doc.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        raise SystemExit(f"{path}: markers {DOC_BEGIN!r} ... {DOC_END!r} not found")
    pre, rest = text.split(DOC_BEGIN, 1)
    _, post = rest.split(DOC_END, 1)
    new = f"{pre}{DOC_BEGIN}\n{docs_markdown()}\n{DOC_END}{post}"
    doc.write_text(new)
    return new != text


if __name__ == "__main__":  # python -m capacity.calibration [--update [PATH]]
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "--update":
        target = sys.argv[2] if len(sys.argv) > 2 else str(DOC_PAGE)
        print(f"{target}: {'updated' if _update_docs(target) else 'already up to date'}")
    else:
        print(docs_markdown())


__all__ = ["Figure", "Row", "load_figures", "predict", "calibration_rows", "describe", "CALIBRATION_FILE", "METRICS",
           "docs_markdown", "DOC_BEGIN", "DOC_END"]
