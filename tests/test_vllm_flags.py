"""`serving.engine.extra_args` is checked at preview against vLLM's own argument parser,
vendored in stacks/vllm_flags.json (stacks/vllm_flags.py)."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest

from stacks import parse, read_raw
from stacks.errors import SettingsError
from stacks.plan import build_plan
from stacks.vllm_flags import RENDERED, SPEC_PATH, extra_args_problems, load_spec
from workloads.engine import engine_args
from workloads.engine.context import build_context

ENGINE_ARGS_SOURCE = Path(engine_args.__file__)


def _plan_with(extra: list, stack: str = "dev"):
    raw = copy.deepcopy(read_raw(stack))
    raw["serving"]["engine"]["extra_args"] = extra
    return build_plan(parse(raw, stack=stack))


def test_a_typo_is_refused_at_preview_with_the_closest_flag():
    with pytest.raises(SettingsError) as exc:
        _plan_with(["--tensor-paralel-size", "2"])
    text = str(exc.value)
    assert "serving.engine.extra_args: '--tensor-paralel-size' is not a vLLM 0.32.0 argument" in text
    assert "did you mean --tensor-parallel-size?" in text
    assert "'2'" not in text  # its value is not reported as a second problem


def test_a_flag_the_renderer_sets_is_refused_naming_the_setting():
    with pytest.raises(SettingsError, match=r"serving\.engine\.extra_args: --max-model-len is set by the renderer "
                                            r"from serving\.engine\.max_model_len"):
        _plan_with(["--max-model-len", "4096"])
    # an alias and the underscore spelling are the same flag to vLLM
    assert "serving.engine.tensor_parallel_size" in extra_args_problems(["-tp", "2"])[0]
    assert "serving.engine.enable_prefix_caching" in extra_args_problems(["--no_enable_prefix_caching"])[0]


@pytest.mark.parametrize("extra, expected", [
    (["--seed"], "--seed expects a value"),
    (["--enforce-eager=yes"], "--enforce-eager takes no value"),
    (["--prefix-caching-hash-algo", "md5"], "not one of its choices; expected one of sha256"),
    (["--seed", "1", "--seed", "2"], "--seed is given twice"),
    (["7"], "'7' follows no flag"),
])
def test_malformed_extra_args_are_refused(extra, expected):
    problems = extra_args_problems(extra)
    assert len(problems) == 1 and expected in problems[0]


def test_valid_extra_args_pass_and_render_last():
    extra = ["--seed", "7", "--enforce_eager", "--compilation-config.cudagraph_mode", "PIECEWISE",
             "--prefix-caching-hash-algo=xxhash", "-O3"]
    assert extra_args_problems(extra) == []
    ctx = build_context(_plan_with(extra), image_repository="r.example/ns/repo")
    assert engine_args.render(engine_args.from_context(ctx, "/models"))[-len(extra):] == extra


def _rendered_literals() -> set[str]:
    """Every `--flag` string constant in the renderer's functions."""
    tree = ast.parse(ENGINE_ARGS_SOURCE.read_text())
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in ("render", "observability_args", "wide_ep_args"):
            out |= {n.value.split(".")[0] for n in ast.walk(fn)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("--")}
    return out


def test_every_flag_the_renderer_writes_is_known_to_vllm_and_refused_in_extra_args():
    by_flag = load_spec().by_flag
    literals = _rendered_literals()
    assert {"--tensor-parallel-size", "--reasoning-parser", "--logging-config"} <= literals
    unknown = sorted(f for f in literals if f not in by_flag)
    assert not unknown, f"the renderer writes flags vLLM does not have: {unknown}"
    unmapped = sorted(f for f in literals if by_flag[f].dest not in RENDERED)
    assert not unmapped, f"add these rendered flags to stacks.vllm_flags.RENDERED: {unmapped}"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod", "mig-example"])
def test_rendered_commands_of_the_shipped_stacks_are_all_renderer_flags(stack):
    raw = read_raw(stack)
    ctx = build_context(build_plan(parse(raw, stack=stack)), image_repository="r.example/ns/repo")
    args = engine_args.render(engine_args.from_context(ctx, "/models"))
    by_flag = load_spec().by_flag
    flags = [a.split("=")[0].split(".")[0] for a in args if a.startswith("--")]
    assert flags and all(by_flag[f].dest in RENDERED for f in flags)


# -- the vendored spec against the installed vLLM (imports vLLM: seconds) -------------------

@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.integration
def test_vendored_spec_matches_the_installed_vllm():
    from tests.engine_extra import require

    require("vllm")
    from stacks.vllm_flags import build_spec, spec_text

    assert SPEC_PATH.read_text() == spec_text(build_spec()), (
        "stacks/vllm_flags.json differs from the installed vLLM: run python -m stacks.vllm_flags --write")
    assert json.loads(SPEC_PATH.read_text())["vllm_version"] == __import__("vllm").__version__


@pytest.mark.engine  # vLLM's own code, imported in the test
@pytest.mark.integration
def test_the_check_agrees_with_vllms_own_parser():
    """Each case: our verdict (ignoring refusals of renderer-owned flags) equals whether vLLM's
    real `vllm serve` parser accepts the arguments."""
    from tests.engine_extra import require

    require("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    cases = [["--seed", "7"], ["--tensor-paralel-size", "2"], ["--enforce-eager"], ["--enforce_eager"],
             ["--seed"], ["--prefix-caching-hash-algo", "md5"], ["--prefix-caching-hash-algo", "xxhash"],
             ["--compilation-config.cudagraph_mode", "PIECEWISE"], ["-O3"], ["--no-such-flag"],
             ["--swap-space", "4"], ["--enable-sleep-mode"], ["--max-num-seqs=8"]]
    for extra in cases:
        ours = [p for p in extra_args_problems(extra, rendered={}) if "set by the renderer" not in p]
        try:
            parser.parse_args(["/models", *extra])
            accepted = True
        except SystemExit:
            accepted = False
        assert (not ours) == accepted, (extra, ours, accepted)
