"""The README's catalog table is generated from the planner, not typed."""

from pathlib import Path

from workloads.planner import DOC_BEGIN, DOC_END, catalog_table_markdown

DOC = Path(__file__).resolve().parents[1] / "README.md"


def test_docs_table_matches_planner():
    text = DOC.read_text()
    generated = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip()
    assert generated == catalog_table_markdown(), (
        "README.md is stale: run `python -m workloads.planner --update-docs`")
    assert generated.count("\n| deepseek-") == 11
