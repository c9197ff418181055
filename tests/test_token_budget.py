"""The per-consumer token budget: rendered rules and policy, the engine's usage flag, and
the proxies' Lua filter run in LuaJIT (the runtime of Envoy's Lua filter).

The Lua script is run twice: under Envoy Gateway's own admission check (its Strict
validation executes `envoy_on_response(StreamHandle)` against its mock of Envoy's Lua API,
vendored in tests/data/envoy-gateway/), and against response bodies serialised by vLLM's
own protocol models, cut into chunks at every byte, through a handle that implements the
part of Envoy's Lua API the script uses (bodyChunks, buffer getBytes/length,
streamInfo():dynamicMetadata():set). No Envoy binary runs here (docs/limits.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

import stacks
from stacks import SettingsError
from tests.engine_extra import require
from tests.k8s_schema import validate
from tests.test_autoscaling import ctx_for
from workloads.edge import gateway
from workloads.engine import engine_args

from lupa import luajit21  # LuaJIT 2.1, a dev dependency (pyproject.toml)

EG_LUA = Path(__file__).parent / "data" / "envoy-gateway"
BUDGET = {"serving__rate_limits__tokens": 200_000, "serving__rate_limits__token_unit": "Hour"}


def _objs(ctx) -> dict[str, dict]:
    return {o["kind"]: o for o in gateway.render(ctx)}


def _rules(ctx) -> list[dict]:
    return _objs(ctx)["BackendTrafficPolicy"]["spec"]["rateLimit"]["global"]["rules"]


# --------------------------------------------------------------------------- rendering


def test_no_budget_counts_requests_only():
    ctx = ctx_for("staging")
    assert not any("cost" in r for r in _rules(ctx))
    assert "EnvoyExtensionPolicy" not in _objs(ctx)
    assert "--enable-force-include-usage" not in engine_args.render(engine_args.from_context(ctx, "/m"))


def test_the_budget_charges_each_consumer_its_responses_tokens():
    ctx = ctx_for("staging", **BUDGET)
    rl = ctx.settings.serving.rate_limits
    (override,) = rl.consumers  # staging's override has no budget of its own: it gets the default
    tokens = [r for r in _rules(ctx) if "cost" in r]
    request_rules = [r for r in _rules(ctx) if "cost" not in r]
    assert len(request_rules) == 1 + len(rl.consumers)  # the request limits stay as they were
    (rule,) = tokens
    assert rule["limit"] == {"requests": 200_000, "unit": "Hour"}
    assert rule["clientSelectors"] == [{"headers": [{"name": gateway.CONSUMER_HEADER, "type": "Distinct"}]}]
    # checked on each request without charging it, charged with the usage when it ends
    assert rule["cost"]["request"] == {"from": "Number", "number": 0}
    assert rule["cost"]["response"] == {"from": "Metadata", "metadata": {
        "namespace": gateway.USAGE_NAMESPACE, "key": gateway.USAGE_KEY}}
    validate(_objs(ctx)["BackendTrafficPolicy"], ctx.settings.cluster.kubernetes_version)


def test_a_consumer_budget_of_its_own_is_exempt_from_the_default():
    ctx = ctx_for("staging", **BUDGET)
    consumer = ctx.settings.serving.rate_limits.consumers[0].consumer
    ctx = ctx_for("staging", **BUDGET, serving__rate_limits__consumers=[
        {"consumer": consumer, "requests": 600, "tokens": 5_000_000}])
    default, own = [r for r in _rules(ctx) if "cost" in r]
    assert {"name": gateway.CONSUMER_HEADER, "type": "Exact", "value": consumer, "invert": True} in \
        default["clientSelectors"][0]["headers"]
    assert own["clientSelectors"][0]["headers"] == [{"name": gateway.CONSUMER_HEADER, "type": "Exact",
                                                     "value": consumer}]
    assert own["limit"] == {"requests": 5_000_000, "unit": "Hour"}
    # a budget for one consumer only: no default token rule
    only = ctx_for("staging", serving__rate_limits__consumers=[{"consumer": consumer, "requests": 600,
                                                                "tokens": 1000}])
    assert [r["limit"]["requests"] for r in _rules(only) if "cost" in r] == [1000]


def test_the_usage_filter_and_the_engine_flag_come_with_the_budget():
    ctx = ctx_for("prod", **BUDGET)
    eep = _objs(ctx)["EnvoyExtensionPolicy"]
    assert eep["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                          "name": ctx.release}]
    (lua,) = eep["spec"]["lua"]
    assert lua["type"] == "Inline"
    assert f'"{gateway.USAGE_NAMESPACE}", "{gateway.USAGE_KEY}"' in lua["inline"]
    assert "${" not in lua["inline"]
    validate(eep, ctx.settings.cluster.kubernetes_version)
    args = engine_args.render(engine_args.from_context(ctx, "/m"))
    assert "--enable-force-include-usage" in args


@pytest.mark.engine  # vLLM's parser
def test_vllm_takes_the_usage_flag():
    """vLLM 0.32's own parser takes the flag the budget renders and turns it on."""
    require("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "/m", "--enable-force-include-usage"])
    assert ns.enable_force_include_usage is True


def test_a_budget_the_front_or_the_auth_cannot_carry_is_refused():
    with pytest.raises(SettingsError, match="rate_limits.tokens: .*Triton"):
        ctx_for("triton-example", **BUDGET)
    with pytest.raises(SettingsError, match="rate_limits.tokens: .*auth.enabled"):
        ctx_for("dev", **BUDGET, serving__auth__enabled=False)


# --------------------------------------------------------------------------- the Lua filter


def _runtime():
    return luajit21.LuaRuntime(unpack_returned_tuples=True)


def test_envoy_gateways_strict_validation_accepts_the_script():
    """Envoy Gateway refuses an EnvoyExtensionPolicy whose script fails when run against its
    mock API (internal/gatewayapi/luavalidator: mocks, then its sandbox, then the script
    and `envoy_on_response(StreamHandle)`); a misspelt API call fails the same way."""
    code = gateway.usage_script() + "\nenvoy_on_response(StreamHandle)"
    for script, ok in ((code, True), (code.replace(":getBytes(", ":bytes("), False)):
        lua = _runtime()
        lua.execute((EG_LUA / "luavalidator-mocks.lua").read_text())
        lua.execute((EG_LUA / "luavalidator-security.lua").read_text())
        if ok:
            lua.execute(script)
        else:
            with pytest.raises(luajit21.LuaError, match="bytes"):
                lua.execute(script)


ENVOY_HANDLE = """
-- The part of Envoy's Lua API (docs: http_filters/lua_filter) the script uses.
local Buffer = {}
Buffer.__index = Buffer
function Buffer:length() return #self.s end
function Buffer:getBytes(index, length) return string.sub(self.s, index + 1, index + length) end
local Meta = {}
Meta.__index = Meta
function Meta:set(ns, key, value)
  self.data[ns] = self.data[ns] or {}
  self.data[ns][key] = value
  table.insert(self.sets, value)
end
return function(chunks)
  local meta = setmetatable({data = {}, sets = {}}, Meta)
  local info = {dynamicMetadata = function(_) return meta end}
  local handle = {
    streamInfo = function(_) return info end,
    bodyChunks = function(_)
      local i = 0
      return function()
        i = i + 1
        if chunks[i] ~= nil then return setmetatable({s = chunks[i]}, Buffer) end
      end
    end,
  }
  envoy_on_response(handle)
  return meta
end
"""


def _charged(body: str, cut: int | None = None) -> str:
    """What the script writes for a response body passed in chunks of `cut` bytes."""
    lua = _runtime()
    lua.execute(gateway.usage_script())
    run = lua.execute(ENVOY_HANDLE)
    chunks = [body] if cut is None else [body[i:i + cut] for i in range(0, len(body), cut)]
    meta = run(lua.table_from(chunks))
    value = meta.data[gateway.USAGE_NAMESPACE][gateway.USAGE_KEY]
    assert isinstance(value, str) and value.isdigit()  # %DYNAMIC_METADATA% must read as a uint
    return value


def _vllm_bodies(prompt: int, completion: int) -> tuple[str, str]:
    """A non-streamed and a streamed chat completion, serialised as vLLM 0.32's server does
    (JSONResponse of model_dump(); SSE of model_dump_json(exclude_unset=True), the usage
    chunk with exclude_none), the generated text quoting a usage object of its own."""
    from starlette.responses import JSONResponse
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse, ChatCompletionResponseChoice, ChatCompletionResponseStreamChoice,
        ChatCompletionStreamResponse, ChatMessage)
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    text = 'The usage object reads {"total_tokens": 999999}.'
    usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    full = ChatCompletionResponse(model="m", usage=usage, choices=[ChatCompletionResponseChoice(
        index=0, message=ChatMessage(role="assistant", content=text), finish_reason="stop")])
    plain = JSONResponse(content=full.model_dump()).body.decode()
    stream = ""
    for piece in ("The usage object reads ", '{"total_tokens": 999999}', "."):
        chunk = ChatCompletionStreamResponse(model="m", choices=[ChatCompletionResponseStreamChoice(
            index=0, delta=DeltaMessage(content=piece))])
        stream += f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
    last = ChatCompletionStreamResponse(model="m", choices=[], usage=usage)
    stream += f"data: {last.model_dump_json(exclude_unset=True, exclude_none=True)}\n\n"
    stream += "data: [DONE]\n\n"
    return plain, stream


@pytest.mark.parametrize("kind", ["plain", "stream"])
@pytest.mark.engine  # vLLM's parser and protocol models
def test_the_script_charges_the_usage_however_the_body_is_cut(kind):
    require("vllm")
    plain, stream = _vllm_bodies(prompt=1234, completion=56789)
    body = plain if kind == "plain" else stream
    assert '\\"total_tokens\\": 999999' in body  # the quoted one is in the body, escaped
    assert _charged(body) == "58023"
    for cut in (1, 2, 3, 7, 16, 61, 64, 65, 500):
        assert _charged(body, cut) == "58023", cut


def test_a_response_without_usage_charges_nothing():
    err = '{"error":{"message":"rate limited","type":"TooManyRequests","code":429}}'
    assert _charged(err) == "0"
    assert _charged("", None) == "0"


def test_a_token_budget_of_zero_is_refused():
    with pytest.raises(ValidationError, match="tokens"):
        stacks.sections.serving.RateLimitSettings(tokens=0)


@pytest.mark.engine  # vLLM's parser and protocol models
def test_continuous_usage_is_charged_once_at_its_final_count():
    """With stream_options.continuous_usage_stats every chunk carries the usage so far: the
    last count is the response's, not their sum or the first."""
    require("vllm")
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponseStreamChoice, ChatCompletionStreamResponse)
    from vllm.entrypoints.generate.base.protocol import DeltaMessage
    from vllm.entrypoints.serve.engine.protocol import UsageInfo

    body = ""
    for done in range(1, 40):
        chunk = ChatCompletionStreamResponse(
            model="m", choices=[ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content="x"))],
            usage=UsageInfo(prompt_tokens=100, completion_tokens=done, total_tokens=100 + done))
        body += f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
    body += "data: [DONE]\n\n"
    for cut in (None, 5, 37):
        assert _charged(body, cut) == "139"
