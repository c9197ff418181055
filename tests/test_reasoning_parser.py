"""The reasoning parser the engine is started with, run through vLLM's own parser class.

R1 and its distills write their thinking between ``<think>`` and ``</think>`` (their chat
template opens it, so the output usually starts inside the thinking). The catalog names
vLLM's parser for them; these tests look that name up in vLLM's registry, build the parser
on a tokenizer that has R1's thinking tokens (tests/vllm_harness.py) and check what lands
in ``reasoning`` and what in ``content``, whole and streamed token by token.
"""

from __future__ import annotations

import pytest

from capacity.catalog import MODELS, R1_REASONING_PARSER
from stacks.plan.build import infer_model_class
from vllm_harness import make_tiny_model

# importing the real engine package takes seconds (full run only)
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def parser(tmp_path_factory):
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers import get_tokenizer

    path = make_tiny_model(tmp_path_factory.mktemp("r1tok"), "qwen2", reasoning=True)
    tok = get_tokenizer(str(path))
    cls = ReasoningParserManager.get_reasoning_parser(R1_REASONING_PARSER)
    return cls(tok), tok


@pytest.fixture(scope="module")
def request_():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])


def test_every_r1_model_and_only_those_name_the_parser():
    for name, spec in MODELS.items():
        want = R1_REASONING_PARSER if infer_model_class(name) == "reasoning" else None
        assert spec.reasoning_parser == want, name
    assert MODELS["deepseek-r1"].reasoning_parser == "deepseek_r1"
    assert MODELS["deepseek-v3"].reasoning_parser is None


@pytest.mark.engine  # vLLM's own code, imported in the test
def test_the_name_is_vllms_r1_parser():
    from vllm.reasoning import ReasoningParserManager
    from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser

    assert ReasoningParserManager.get_reasoning_parser(R1_REASONING_PARSER) is DeepSeekR1ReasoningParser


@pytest.mark.engine  # its fixture imports vLLM's own code
@pytest.mark.parametrize("text, reasoning, content", [
    ("<think>the kv cache holds keys</think>hello world", "the kv cache holds keys", "hello world"),
    # the chat template opened the thinking: the output starts inside it
    ("the kv cache holds keys</think>hello world", "the kv cache holds keys", "hello world"),
    # cut off while thinking (max_tokens): all of it is reasoning, no answer yet
    ("the kv cache holds keys", "the kv cache holds keys", None),
])
def test_whole_output_is_split(parser, request_, text, reasoning, content):
    p, _ = parser
    assert p.extract_reasoning(text, request_) == (reasoning, content)


@pytest.mark.engine  # its fixture imports vLLM's own code
@pytest.mark.parametrize("text", [
    "<think>the quick brown fox</think>hello world",
    "the quick brown fox</think>hello world",
])
def test_streamed_output_is_split_token_by_token(parser, text):
    p, tok = parser
    ids = tok.encode(text, add_special_tokens=False)
    assert p.start_token_id in ids or p.end_token_id in ids  # the markers are single tokens
    reasoning, content = "", ""
    prev_ids: list[int] = []
    prev_text = ""
    for i in range(len(ids)):
        cur_ids = ids[: i + 1]
        cur_text = tok.decode(cur_ids)
        delta = p.extract_reasoning_streaming(prev_text, cur_text, cur_text[len(prev_text):],
                                              prev_ids, cur_ids, [ids[i]])
        if delta is not None:
            reasoning += delta.reasoning or ""
            content += delta.content or ""
        prev_ids, prev_text = cur_ids, cur_text
    assert reasoning.strip() == "the quick brown fox"
    assert content.strip() == "hello world"
    assert "<think>" not in content and "</think>" not in content + reasoning
