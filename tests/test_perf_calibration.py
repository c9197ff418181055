"""The performance model against published serving figures (capacity/calibration.yaml).

Each figure must be predicted within its tolerance (+/-25%) with ONE set of efficiency
factors (capacity/hardware.yaml); the factors must be few and shared: each fitted factor
moves several figures, none belongs to one figure, and a figure cannot carry its own.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from capacity.calibration import (CALIBRATION_FILE, DOC_BEGIN, DOC_END, DOC_PAGE, calibration_rows, docs_markdown,
                                  load_figures, predict)
from capacity.catalog import GPUS, get_model
from capacity.perf import HARDWARE_FILE, Hardware, PerfDataError, load_hardware

TOLERANCE, FIGURES, NOT_COMPARABLE = load_figures()
HW = load_hardware()


@pytest.mark.parametrize("figure", FIGURES, ids=[f.id for f in FIGURES])
def test_each_published_figure_is_predicted_within_tolerance(figure):
    pred = predict(figure, HW)
    ratio = pred / figure.value
    assert 1 - TOLERANCE <= ratio <= 1 + TOLERANCE, (
        f"{figure.id}: predicted {pred:,.2f} against {figure.value:,.2f} published ({ratio:.3f}); "
        f"source {figure.source}")


def test_the_tolerance_is_the_one_the_issue_sets():
    assert TOLERANCE == 0.25


def test_at_least_six_figures_deepseek_and_dense_each_with_a_source():
    assert len(FIGURES) >= 6
    moe = [f for f in FIGURES if get_model(f.model).is_moe]
    dense = [f for f in FIGURES if not get_model(f.model).is_moe]
    assert len(moe) >= 3 and len(dense) >= 2
    assert {f.metric for f in moe} >= {"decode_tokens_per_s_per_gpu", "prefill_tokens_per_s_per_gpu"}
    for f in FIGURES:
        assert f.source.startswith("https://") and f.read and f.published
    for e in NOT_COMPARABLE:
        assert e["source"].startswith("https://") and e["why"]


def _with(hw: Hardware, name: str, value: float) -> Hardware:
    eff = dict(hw.efficiency)
    eff[name] = replace(eff[name], value=value)
    return Hardware(hw.gpus, hw.communication, eff, hw.instance_rdma)


def test_the_fitted_factors_are_few_and_each_is_shared_by_several_figures():
    fitted = [k for k, f in HW.efficiency.items() if f.kind == "fitted"]
    assert 1 <= len(fitted) <= len(FIGURES) // 2 + 1, fitted
    base = {f.id: predict(f, HW) for f in FIGURES}
    for name in fitted:
        v = HW.efficiency[name].value
        # a fraction moves by 0.1 (down when it would leave [0, 1]); a ratio by 10%
        if name == "moe_imbalance":
            nudged = _with(HW, name, v * 1.1)
        else:
            nudged = _with(HW, name, v + 0.1 if v + 0.1 <= 1.0 else v - 0.1)
        moved = [f.id for f in FIGURES if abs(predict(f, nudged) / base[f.id] - 1) > 0.01]
        assert len(moved) >= 2, f"{name} moves only {moved}: a per-figure knob"


def test_a_figure_cannot_carry_its_own_efficiency(tmp_path):
    doc = yaml.safe_load(CALIBRATION_FILE.read_text())
    doc["figures"][0]["efficiency"] = {"hbm": 0.99}
    p = tmp_path / "calibration.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PerfDataError, match="unknown field"):
        load_figures(p)


def test_the_check_fails_when_a_factor_is_wrong():
    """The calibration is not vacuous: half the HBM efficiency moves decode figures out."""
    bad = _with(HW, "hbm", HW.efficiency["hbm"].value / 2)
    out = [r.id for r in calibration_rows(bad) if not 1 - TOLERANCE <= r.ratio <= 1 + TOLERANCE]
    assert out, "halving the HBM efficiency left every figure inside the tolerance"


def test_every_catalog_gpu_has_cited_performance_figures():
    assert set(GPUS) <= set(HW.gpus)
    for g in HW.gpus.values():
        assert g.source and g.read and g.hbm_gb_s > 0 and g.bf16_tflops > 0
        assert (g.fp8_tflops > 0) == GPUS[g.name].fp8, g.name  # FP8 rate exactly where FP8 cores are
    for section in (HW.efficiency, HW.communication):
        for name, f in section.items():
            assert f.kind in ("measured", "published", "fitted", "assumed") and f.basis, name


def test_hardware_file_errors_name_the_field(tmp_path):
    doc = yaml.safe_load(HARDWARE_FILE.read_text())
    doc["efficiency"]["hbm"]["value"] = 1.5
    p = tmp_path / "hw.yaml"
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PerfDataError, match=r"efficiency\.hbm\.value"):
        load_hardware(p)
    del doc["gpus"]["H20"]["source"]
    doc["efficiency"]["hbm"]["value"] = 0.8
    p.write_text(yaml.safe_dump(doc))
    with pytest.raises(PerfDataError, match=r"gpus\.H20\.source"):
        load_hardware(p)


def test_the_docs_calibration_table_is_generated_not_typed():
    text = DOC_PAGE.read_text()
    generated = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip()
    assert generated == docs_markdown(HW), "docs/planner.md is stale: run `python -m capacity.calibration --update`"
    for r in calibration_rows(HW):
        assert f"`{r.id}`" in generated and f"| {r.ratio:.2f} |" in generated
