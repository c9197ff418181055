"""Load a stack file into `StackSettings` (what the user wrote, validated) and its
`StackPlan` (everything derived from it), turning every mistake into one readable error.

The error names the path of the bad value (`cluster.gpu_pools.a10.max_nodes`), the value,
and what was expected. Callers (the Pulumi program, `dsvolc`) print it; nobody sees a
pydantic traceback.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

import stacks.yamlsafe as yamlsafe
from capacity.suggest import did_you_mean
from stacks.errors import SettingsError
from stacks.plan import StackPlan, build_plan
from stacks.settings import STACK_NAME, StackSettings

__all__ = ["SettingsError", "from_pulumi_config", "load", "load_plan", "parse", "parse_plan", "read_raw",
           "read_stack", "run_error", "shipped_stacks", "stack_file", "stack_name"]

PROJECT = "deepseek-volc"
SETTINGS_KEY = f"{PROJECT}:settings"
STACKS_DIR = Path(__file__).resolve().parent


def stack_file(stack: str) -> Path:
    """`dev` -> stacks/Pulumi.dev.yaml; a path is taken as it is."""
    candidate = Path(stack)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate
    return STACKS_DIR / f"Pulumi.{stack}.yaml"


def shipped_stacks() -> list[str]:
    """Names of the stack files shipped in stacks/ (Pulumi.<name>.yaml)."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml"))


def stack_name(stack: str) -> str:
    path = Path(stack)
    if path.suffix in (".yaml", ".yml"):
        name = path.stem
        return name.split(".", 1)[1] if name.startswith("Pulumi.") else name
    return stack


def read_raw(stack: str) -> dict[str, Any]:
    """The raw settings mapping of a stack file (see read_stack)."""
    return read_stack(stack)[0]


def read_stack(stack: str) -> tuple[dict[str, Any], dict[yamlsafe.Path, str]]:
    """The raw settings mapping of a stack file, and `written`: the text of every plain number
    and boolean in it as the file spells it, by path (('cluster', 'kubernetes_version') ->
    '1.30'), for `parse` to quote when it refuses the number 1.3. A key given twice is
    refused, naming both lines (YAML itself would keep the last one without a word)."""
    path = stack_file(stack)
    if not path.is_file():
        known = shipped_stacks()
        raise SettingsError(str(path), [f"no such stack file; known stacks: {', '.join(known)}"])
    try:
        parsed = yamlsafe.read(path.read_text())
    except yaml.YAMLError as exc:
        raise SettingsError(str(path), [f"not valid YAML: {exc}"]) from None
    under = ("config", SETTINGS_KEY)
    if parsed.duplicates:
        raise SettingsError(str(path), [
            d.describe(yamlsafe.dotted(d.path[2:] if d.path[:2] == under and len(d.path) > 2 else d.path))
            for d in parsed.duplicates])
    doc = parsed.data or {}
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict) or SETTINGS_KEY not in config:
        raise SettingsError(str(path), [f"config.{SETTINGS_KEY}: missing; expected the stack's settings object"])
    raw = config[SETTINGS_KEY]
    if not isinstance(raw, dict):
        raise SettingsError(str(path), [f"config.{SETTINGS_KEY}: expected a mapping, got {type(raw).__name__}"])
    return raw, {p[2:]: text for p, text in parsed.numbers.items() if p[:2] == under}


def parse(raw: dict[str, Any], source: str = "<settings>", *, stack: str,
          written: dict[yamlsafe.Path, str] | None = None) -> StackSettings:
    """Validate a raw mapping for the stack named `stack`; raises SettingsError naming every
    bad path. The stack's name is not a setting: it comes from the file (or the Pulumi
    stack) and every cloud resource name derives from it. `written`: the file's numbers as
    written (read_stack), quoted when a string setting was read as a number."""
    problems = []
    if not re.fullmatch(STACK_NAME, stack):
        problems.append(f"stack name {stack!r}: expected a lower-case DNS label of 1-20 characters "
                        "(a-z, 0-9, '-'), since every cloud resource name derives from it")
    if "stack" in raw:
        problems.append("stack: set from the stack's file name (Pulumi.<stack>.yaml), not in the settings; "
                        "remove it")
    if "environment" in raw:
        problems.append("environment: renamed to environment_class (dev, staging or prod: the policy "
                        "strength); cloud resource names now come from the stack's name")
    if problems:
        raise SettingsError(source, problems)
    try:
        return StackSettings.model_validate({"stack": stack, **raw})
    except ValidationError as exc:
        raise SettingsError(source, [_describe(err, written) for err in exc.errors()]) from None


def parse_plan(raw: dict[str, Any], source: str = "<settings>", *, stack: str,
               written: dict[yamlsafe.Path, str] | None = None) -> StackPlan:
    """`parse`, then `build_plan`: the settings' plan, or a SettingsError naming the field."""
    return build_plan(parse(raw, source, stack=stack, written=written), source)


def load(stack: str) -> StackSettings:
    """Load and validate `stacks/Pulumi.<stack>.yaml` (or a path to a stack file): what the
    user wrote. Checks across sections come with its plan (`load_plan`)."""
    raw, written = read_stack(stack)
    return parse(raw, str(stack_file(stack)), stack=stack_name(stack), written=written)


def load_plan(stack: str) -> StackPlan:
    """Load, validate and plan a stack: its `StackPlan`, which carries `.settings`."""
    raw, written = read_stack(stack)
    return parse_plan(raw, str(stack_file(stack)), stack=stack_name(stack), written=written)


def from_pulumi_config() -> StackSettings:
    """Inside the Pulumi program: read `deepseek-volc:settings` from the stack config."""
    import pulumi

    raw = pulumi.Config(PROJECT).require_object("settings")
    return parse(raw, f"stack {pulumi.get_stack()}", stack=pulumi.get_stack())


@contextmanager
def run_error() -> Iterator[None]:
    """Inside the Pulumi program: a SettingsError becomes a pulumi.RunError, which the
    engine prints without a Python traceback."""
    import pulumi

    try:
        yield
    except SettingsError as exc:
        raise pulumi.RunError(str(exc)) from None


def _describe(err: dict[str, Any], written: dict[yamlsafe.Path, str] | None = None) -> str:
    key = tuple(p for p in err["loc"] if not str(p).startswith("function-"))
    loc = [str(p) for p in key]
    path = ".".join(loc)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = did_you_mean(loc[-1], allowed, aside=True)
        hint = f"{close}; expected one of: {', '.join(allowed)}" if allowed else ""
        return f"{path}: unknown key{hint}"
    if kind == "string_type" and isinstance(value, (bool, int, float)):
        return f"{path}: {_read_as_scalar(value, (written or {}).get(key))}"
    if kind == "ip_v4_network" and isinstance(value, str) and (fixed := _without_host_bits(value)):
        return f"{path}: {value} has host bits set; did you mean {fixed}?"
    if kind == "missing":
        return f"{path}: required value is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        # model validators name their own paths relative to the model they sit on
        if ":" in msg.split(" ", 1)[0] and path:
            return f"{path}.{msg}"
        if ":" in msg.split(" ", 1)[0]:
            return msg
        return f"{path}: {msg}" if path else msg
    shown = _short(value)
    return f"{path}: {msg} (got {shown})" if path else f"{msg} (got {shown})"


def _read_as_scalar(value: bool | int | float, text: str | None) -> str:
    """A string setting YAML read as a number or boolean: say so, and how to quote it. `text`
    is the value as the file spells it, when known (and still the value given)."""
    if text is not None and yaml.safe_load(text) != value:
        text = None  # the raw mapping was changed after it was read
    what = "a boolean" if isinstance(value, bool) else "a number"
    shown = str(value).lower() if isinstance(value, bool) else str(value)
    if text is None:
        if isinstance(value, float):
            return f"{shown} was read as {what}; quote it as written (YAML reads an unquoted 1.30 as 1.3)"
        return f"{shown} was read as {what}; quote it as written"
    spelt = f" from {text}" if text != shown else ""
    return f'{shown} was read as {what}{spelt}; quote it: "{text}"'


def _without_host_bits(value: str) -> str | None:
    """'10.0.0.1/16' -> '10.0.0.0/16': the network a CIDR with host bits set lies in; None for
    anything else (not a CIDR at all, or one without host bits)."""
    try:
        ipaddress.IPv4Network(value.strip())
        return None
    except ValueError:
        pass
    try:
        return str(ipaddress.IPv4Network(value.strip(), strict=False))
    except ValueError:
        return None


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _allowed_keys(loc: list[str]) -> list[str]:
    """Field names of the model at `loc` (dict keys in the path are skipped over)."""
    model: type[BaseModel] | None = StackSettings
    for part in loc:
        if model is None:
            return []
        field = model.model_fields.get(part)
        if field is None:
            continue  # a dict key such as a pool or zone name
        model = _model_of(field.annotation)
    return sorted(model.model_fields) if model is not None else []


def _model_of(annotation: Any) -> type[BaseModel] | None:
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None
