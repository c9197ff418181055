"""vLLM's command-line flags, vendored, and the check of `serving.engine.extra_args` against them.

`stacks/vllm_flags.json` is vLLM's own `vllm serve` parser written out (every option's
strings, whether it takes a value, its choices) with the vLLM version it came from, so a
preview checks extra flags without importing vLLM (the deploy machine need not have it):

    python -m stacks.vllm_flags            say whether the vendored spec matches the installed vLLM
    python -m stacks.vllm_flags --write    regenerate it from the installed vLLM

tests/test_vllm_flags.py fails when the file and the installed vLLM disagree.

The check reads arguments the way vLLM's FlexibleArgumentParser does: `--flag value` or
`--flag=value`, underscores as dashes in the flag name, `--json-flag.key value` for a
field of a JSON-valued flag. Refused: an unknown flag (with the closest known one), a
missing or extra value, a value outside the flag's choices, a flag given twice, a stray
positional value, and any flag the renderer already sets from a setting (named).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

SPEC_PATH = Path(__file__).with_name("vllm_flags.json")
PARSER = ("vllm.entrypoints.launchers.cli_args.make_arg_parser(FlexibleArgumentParser(prog='vllm serve')) "
          "(the OpenAI server's frontend arguments and AsyncEngineArgs.add_cli_args)")

# Flags workloads/engine/engine_args.py renders, by vLLM dest, with the setting each comes
# from: in extra_args they would contradict (or silently override) that setting.
# tests/test_vllm_flags.py checks every flag the renderer writes is listed.
_LAYOUT = "the engine plan's multi-node layout (serving.multi_node, serving.engine.parallelism)"
RENDERED: dict[str, str] = {
    "model": "serving.model (the weights path)",
    "served_model_name": "serving.served_model_name",
    "host": "the serving container (fixed)",
    "port": "the serving container's port (fixed)",
    "tensor_parallel_size": "serving.engine.tensor_parallel_size",
    "pipeline_parallel_size": "serving.engine.pipeline_parallel_size",
    "dtype": "serving.engine.dtype",
    "load_format": "serving.weights_mode",
    "max_model_len": "serving.engine.max_model_len",
    "max_num_seqs": "serving.engine.max_num_seqs",
    "max_num_batched_tokens": "serving.engine.max_num_batched_tokens",
    "gpu_memory_utilization": "serving.engine.gpu_memory_utilization",
    "enable_prefix_caching": "serving.engine.enable_prefix_caching",
    "enable_chunked_prefill": "serving.engine.enable_chunked_prefill",
    "quantization": "serving.engine.quantization and serving.model (the checkpoint)",
    "kv_cache_dtype": "serving.engine.kv_cache_dtype",
    "shutdown_timeout": "serving.inflight_drain_seconds",
    "override_generation_config": "serving.max_output_tokens",
    "data_parallel_size": "serving.engine.data_parallel_size",
    "enable_expert_parallel": "serving.engine.parallelism",
    "speculative_config": "serving.engine.speculative_tokens",
    "reasoning_parser": "the catalog model (capacity/catalog.py reasoning_parser)",
    "enable_force_include_usage": "serving.rate_limits.tokens (the token budget reads every response's usage)",
    "data_parallel_size_local": _LAYOUT,
    "data_parallel_rpc_port": _LAYOUT,
    "data_parallel_address": _LAYOUT,
    "data_parallel_start_rank": _LAYOUT,
    "nnodes": _LAYOUT,
    "distributed_executor_backend": _LAYOUT,
    "node_rank": _LAYOUT,
    "master_addr": _LAYOUT,
    "otlp_traces_endpoint": "observability.tracing",
    "collect_detailed_traces": "observability.tracing.detailed",
    "enable_request_id_headers": "the serving container (always on: request ids)",
    "enable_log_requests": "observability.logs.request_log.enabled",
    "max_log_len": "observability.logs.request_log.max_log_len",
    "enable_log_outputs": "observability.logs.request_log.prompts",
    "log_level": "observability.logs.request_log.prompts",
    "logging_config": "observability.logs.enabled",
    "disable_access_log_for_endpoints": "the serving container (probes and metrics kept out of the access log)",
}


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    dest: str
    nargs: Any  # argparse's: None (one value), 0 (none), "?", "*", "+" or a count
    choices: tuple[str, ...] | None

    @property
    def takes_value(self) -> bool:
        return self.nargs != 0


@dataclass(frozen=True)
class FlagSpec:
    vllm_version: str
    options: tuple[Option, ...]

    @property
    def by_flag(self) -> dict[str, Option]:
        return {f: o for o in self.options for f in o.flags}


# -- the spec ---------------------------------------------------------------------------

def build_spec() -> dict[str, Any]:
    """The spec from the installed vLLM's own parser (imports vLLM: seconds)."""
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    options = []
    for a in parser._actions:
        if not a.option_strings or a.dest == "help":
            continue
        options.append({
            "flags": sorted(a.option_strings),
            "dest": a.dest,
            "nargs": a.nargs,
            "choices": sorted(str(c) for c in a.choices) if a.choices is not None else None,
        })
    options.sort(key=lambda o: o["flags"][0])
    return {"vllm_version": vllm.__version__, "parser": PARSER,
            "generated_by": "python -m stacks.vllm_flags --write", "options": options}


def spec_text(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=1, sort_keys=False) + "\n"


@lru_cache(maxsize=None)
def load_spec(path: Path = SPEC_PATH) -> FlagSpec:
    doc = json.loads(path.read_text())
    return FlagSpec(doc["vllm_version"], tuple(
        Option(tuple(o["flags"]), o["dest"], o["nargs"], tuple(o["choices"]) if o["choices"] is not None else None)
        for o in doc["options"]))


# -- the check --------------------------------------------------------------------------

_NAME = re.compile(r"(?<=--)[^.]*")  # vLLM: underscores become dashes up to the first '.'
_NUMBER = re.compile(r"^-\d")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


def extra_args_problems(args: list[Any], spec: FlagSpec | None = None,
                        rendered: dict[str, str] = RENDERED) -> list[str]:
    """What is wrong with these extra `vllm serve` arguments (empty: vLLM's parser takes them
    and none overrides a setting)."""
    spec = spec or load_spec()
    flags = spec.by_flag
    known = sorted(flags)
    out: list[str] = []
    seen: dict[str, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not isinstance(token, str):
            out.append(f"{token!r} is not a string; expected command-line flags and their values as strings")
            continue
        if not _is_flag(token):
            out.append(f"{token!r} follows no flag that takes a value; expected --flag or --flag value")
            continue
        key, inline = (token.split("=", 1) + [None])[:2] if "=" in token else (token, None)
        key = _NAME.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
        if key.startswith("-O") and not key.startswith("--") and key != "-O":
            key, inline = "--optimization-level", key[2:]
        base, _, field = key.partition(".")
        opt = flags.get(base)
        if opt is None:
            close = difflib.get_close_matches(base, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(f"{base!r} is not a vLLM {spec.vllm_version} argument{hint}; expected a flag of "
                       "`vllm serve` (stacks/vllm_flags.json)")
            if inline is None and i < len(args) and isinstance(args[i], str) and not _is_flag(args[i]):
                i += 1  # its value, most likely: one refusal, not two
            continue
        if field and not opt.takes_value:
            out.append(f"{key!r}: {base} takes no value, so it has no fields; expected {base} alone")
            continue
        values: list[str] = []
        if inline is not None:
            values = [inline]
        elif opt.takes_value:
            many = opt.nargs in ("*", "+") or (isinstance(opt.nargs, int) and opt.nargs > 1)
            while i < len(args) and isinstance(args[i], str) and not _is_flag(args[i]):
                values.append(args[i])
                i += 1
                if not many:
                    break
        if opt.takes_value and not values and opt.nargs not in ("?", "*"):
            out.append(f"{base} expects a value; expected {base} VALUE")
            continue
        if not opt.takes_value and inline is not None:
            out.append(f"{base} takes no value, got {inline!r}; expected {base} alone")
            continue
        if opt.choices is not None and not field:
            bad = [v for v in values if v not in opt.choices]
            if bad:
                out.append(f"{base} {bad[0]!r} is not one of its choices; expected one of {', '.join(opt.choices)}")
                continue
        if opt.dest in rendered:
            out.append(f"{base} is set by the renderer from {rendered[opt.dest]}; set that instead of passing "
                       f"{base} in extra_args")
            continue
        where = f"{opt.dest}.{field}" if field else opt.dest
        if where in seen:
            out.append(f"{seen[where]} is given twice; expected it once")
            continue
        seen[where] = base + (f".{field}" if field else "")
    return out


def main(argv: list[str]) -> int:
    current = spec_text(build_spec())
    if argv[:1] == ["--write"]:
        changed = not SPEC_PATH.exists() or SPEC_PATH.read_text() != current
        SPEC_PATH.write_text(current)
        print(f"{SPEC_PATH}: {'written' if changed else 'already up to date'}")
        return 0
    same = SPEC_PATH.exists() and SPEC_PATH.read_text() == current
    print(f"{SPEC_PATH}: {'matches' if same else 'differs from'} the installed vLLM "
          f"{json.loads(current)['vllm_version']}" + ("" if same else "; run python -m stacks.vllm_flags --write"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
