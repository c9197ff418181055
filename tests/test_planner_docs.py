"""docs/planner.md's catalog table is generated from the planner, not typed."""


from capacity.docs import DOC_BEGIN, DOC_END, DOC_PAGE, catalog_table_markdown

DOC = DOC_PAGE


def test_docs_table_matches_planner():
    text = DOC.read_text()
    generated = text.split(DOC_BEGIN, 1)[1].split(DOC_END, 1)[0].strip()
    assert generated == catalog_table_markdown(), (
        "docs/planner.md is stale: run `python -m capacity.docs --update`")
    from capacity.catalog import MODELS

    assert generated.count("\n| deepseek-") == len(MODELS) == 15
