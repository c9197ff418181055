"""docs/planner.md's catalog tables are generated from the planner and the catalog, not typed."""


from capacity.docs import (CKPT_BEGIN, CKPT_END, DOC_BEGIN, DOC_END, DOC_PAGE, catalog_table_markdown,
                           checkpoints_table_markdown)

DOC = DOC_PAGE


def _between(begin: str, end: str) -> str:
    return DOC.read_text().split(begin, 1)[1].split(end, 1)[0].strip()


def test_docs_table_matches_planner():
    generated = _between(DOC_BEGIN, DOC_END)
    assert generated == catalog_table_markdown(), (
        "docs/planner.md is stale: run `python -m capacity.docs --update`")
    from capacity.catalog import MODELS

    # 15 original checkpoints and the 5 quantised ones of capacity/checkpoints.yaml
    assert generated.count("\n| deepseek-") == len(MODELS) == 20


def test_docs_checkpoint_table_matches_catalog():
    generated = _between(CKPT_BEGIN, CKPT_END)
    assert generated == checkpoints_table_markdown(), (
        "docs/planner.md is stale: run `python -m capacity.docs --update`")
    assert "| deepseek-r1-distill-qwen-32b-awq | `casperhansen/deepseek-r1-distill-qwen-32b-awq` | awq |" in generated
    assert "| deepseek-r1 | `deepseek-ai/DeepSeek-R1` | fp8 | quant_method fp8, 8-bit, weight_block_size [128, 128] |" in generated
