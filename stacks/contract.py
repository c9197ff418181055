"""The VolcEngine provider contract: what the provider accepts for each argument the
program sets, as data (`stacks/provider_contract.yaml`), and the checker that holds a
registered resource against it.

Pure Python: the settings draw their accepted values from here (one source of truth),
the tests check every VolcEngine resource the program registers, and docs/infrastructure.md
carries the generated table (`python -m stacks.docs --update`).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml

CONTRACT_FILE = Path(__file__).resolve().with_name("provider_contract.yaml")

# Pulumi's wire sentinel for a value the provider computes and that is not known until the
# resource exists (pulumi.runtime.rpc.UNKNOWN; a test checks they agree). Such a value is
# the provider's to produce, so the contract does not judge it.
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

TYPES = ("string", "integer", "boolean", "json", "list[string]", "list[integer]", "map[string]")


class ContractError(ValueError):
    """The contract file itself is malformed."""


@dataclass(frozen=True)
class Source:
    repository: str
    commit: str
    file: str
    line: int

    def cite(self) -> str:
        return f"{self.file}:{self.line}@{self.commit[:12]}"

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repository}/blob/{self.commit}/{self.file}#L{self.line}"


@dataclass(frozen=True)
class Block:
    """An address block a CIDR argument must lie inside, with the masks accepted there:
    `10.0.0.0/8~24` is any block inside 10.0.0.0/8 with a /8 to /24 mask."""

    net: ipaddress.IPv4Network
    shortest: int  # the shortest mask accepted (the largest block)
    longest: int  # the longest mask accepted (the smallest block)

    def __str__(self) -> str:
        if (self.shortest, self.longest) == (self.net.prefixlen, 32):
            return str(self.net)
        return f"{self.net} with masks /{self.shortest} to /{self.longest}"

    def holds(self, net: ipaddress.IPv4Network) -> bool:
        return net.subnet_of(self.net)

    def takes(self, net: ipaddress.IPv4Network) -> bool:
        return self.holds(net) and self.shortest <= net.prefixlen <= self.longest


def parse_block(item: Any, where: str) -> Block:
    """`CIDR` (any mask inside it), `CIDR~N` (masks from the block's own to /N) or
    `{block: CIDR, masks: [shortest, longest]}`."""
    try:
        if isinstance(item, dict):
            if set(item) != {"block", "masks"}:
                raise ContractError(f"{where}: expected keys block and masks, got {sorted(item)}")
            net = ipaddress.IPv4Network(item["block"])
            lo, hi = _pair(item["masks"], f"{where}.masks")  # type: ignore[misc]
        elif isinstance(item, str):
            cidr, _, longest = item.partition("~")
            net = ipaddress.IPv4Network(cidr)
            lo, hi = net.prefixlen, int(longest) if longest else 32
        else:
            raise ContractError(f"{where}: expected a CIDR, CIDR~N or {{block, masks}}, got {item!r}")
    except ValueError as exc:
        raise ContractError(f"{where}: {exc}") from None
    if lo is None or hi is None or not net.prefixlen <= lo <= hi <= 32:
        raise ContractError(f"{where}: masks must lie between /{net.prefixlen} and /32, shortest first")
    return Block(net, lo, hi)


@dataclass(frozen=True)
class Argument:
    resource: str
    path: str
    type: str
    source: Source
    one_of: tuple[Any, ...] | None = None
    range: tuple[int | None, int | None] | None = None
    items: tuple[int | None, int | None] | None = None
    pattern: str | None = None
    cidr: bool = False
    within: tuple[Block, ...] = ()
    enforced: str | None = None  # plan | api | None (type only)
    note: str = ""
    tf: str | None = None
    doc: str | None = None  # where the API's documentation states a constraint the provider does not check
    # a range that depends on another argument of the same resource: (that argument's path,
    # {its value: (min, max)}), e.g. an EIP's bandwidth by its billing type
    range_when: tuple[str, tuple[tuple[str, tuple[int | None, int | None]], ...]] | None = None

    def ranges(self) -> str:
        """The blocks (and masks) a CIDR argument accepts, in words."""
        return ", ".join(str(b) for b in self.within)

    @property
    def constrained(self) -> bool:
        return bool(self.one_of or self.range or self.items or self.pattern or self.cidr
                    or self.range_when or self.type == "json")

    def accepted(self) -> str:
        """What the provider accepts, in words."""
        parts = []
        if self.one_of is not None:
            each = "each one of" if self.type.startswith("list") else "one of"
            parts.append(f"{each} {', '.join(str(v) for v in self.one_of)}")
        if self.range is not None:
            lo, hi = self.range
            if lo is not None and hi is not None:
                parts.append(f"{lo}..{hi}")
            elif lo is not None:
                parts.append(f">= {lo}")
            elif hi is not None:
                parts.append(f"<= {hi}")
        if self.items is not None:
            lo, hi = self.items
            if lo == hi:
                parts.append(f"exactly {lo} item{'s' if lo != 1 else ''}")
            elif hi is None:
                parts.append(f"at least {lo} item{'s' if lo != 1 else ''}")
            else:
                parts.append(f"{lo}..{hi} items")
        if self.pattern is not None:
            parts.append(f"matching `{self.pattern}`")
        if self.cidr:
            parts.append("an IPv4 CIDR" + (f" within {self.ranges()}" if self.within else ""))
        if self.type == "json":
            parts.append("a JSON document")
        if self.range_when is not None:
            other, ranges = self.range_when
            parts.append("; ".join(f"{lo}..{hi} when {other} is {v}" for v, (lo, hi) in ranges))
        return "; ".join(parts) or self.type

    def dependent_problems(self, value: Any, inputs: dict[str, Any]) -> list[str]:
        """What is wrong with `value` given the other arguments of its resource (`range_when`)."""
        if self.range_when is None or value == UNKNOWN or not isinstance(value, int):
            return []
        other, ranges = self.range_when
        against = _lookup(inputs, other)
        for v, (lo, hi) in ranges:
            if against == v and ((lo is not None and value < lo) or (hi is not None and value > hi)):
                return [f"{value} is out of range with {other} {v}; expected {lo}..{hi}"]
        return []

    # -- checking -----------------------------------------------------------------

    def problems(self, value: Any) -> list[str]:
        """What is wrong with `value` for this argument (empty when it is accepted)."""
        if value == UNKNOWN:
            return []
        if self.type.startswith("map["):
            # a map's leaves are its values, one per key (`path.<key>`)
            return self._scalar_problems(value, self.type[len("map["):-1])
        if self.type.startswith("list"):
            if not isinstance(value, list):
                return [f"expected a list, got {type(value).__name__}"]
            out = []
            if self.items is not None:
                lo, hi = self.items
                if (lo is not None and len(value) < lo) or (hi is not None and len(value) > hi):
                    out.append(f"{len(value)} items; expected {self.accepted()}")
            item_type = self.type[len("list["):-1]
            for i, item in enumerate(value):
                out += [f"[{i}]: {p}" for p in self._scalar_problems(item, item_type)]
            return out
        return self._scalar_problems(value, self.type)

    def _scalar_problems(self, value: Any, type_: str) -> list[str]:
        if value == UNKNOWN:
            return []
        if not _is_type(value, type_):
            return [f"expected {'a ' + type_ if type_ != 'integer' else 'an integer'}, got {value!r}"]
        if type_ == "json":
            try:
                json.loads(value)
            except ValueError as exc:
                return [f"not a JSON document ({exc})"]
        out = []
        if self.one_of is not None and value not in self.one_of:
            out.append(f"{value!r} is not accepted; expected one of {', '.join(str(v) for v in self.one_of)}")
        if self.range is not None:
            lo, hi = self.range
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                out.append(f"{value} is out of range; expected {self.accepted()}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            out.append(f"{value!r} does not match `{self.pattern}`")
        if self.cidr:
            try:
                net = ipaddress.ip_network(value, strict=False)
            except ValueError:
                out.append(f"{value!r} is not a CIDR block")
            else:
                out += self._within_problems(value, net)
        return out

    def _within_problems(self, value: str, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[str]:
        if not self.within:
            return []
        if net.version != 4 or not any(b.holds(net) for b in self.within):
            blocks = ", ".join(str(b.net) for b in self.within)
            return [f"{value} is outside {blocks} (accepted: {self.ranges()})"]
        if any(b.takes(net) for b in self.within):
            return []
        b = next(b for b in self.within if b.holds(net))
        return [f"{value} has a /{net.prefixlen} mask; inside {b.net} the accepted masks are "
                f"/{b.shortest} to /{b.longest}"]


def _is_type(value: Any, type_: str) -> bool:
    if type_ in ("string", "json"):
        return isinstance(value, str)
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "boolean":
        return isinstance(value, bool)
    return False


@dataclass(frozen=True)
class Violation:
    resource_type: str
    resource_name: str
    path: str
    value: Any
    problem: str
    source: Source | None

    def __str__(self) -> str:
        where = f" ({self.source.cite()})" if self.source else ""
        return f"{self.resource_type} {self.resource_name}: {self.path} {self.problem}{where}"


@dataclass(frozen=True)
class Contract:
    provider: dict[str, str]
    arguments: dict[str, dict[str, Argument]] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        return self.provider["commit"]

    def covers(self, resource_type: str) -> bool:
        return resource_type in self.arguments

    def entry(self, resource_type: str, path: str) -> Argument | None:
        """The entry covering a leaf path: its own, or the map argument it is a key of
        (`containerRule.kubernetesRule.labelTag.<label>` is covered by `...labelTag`)."""
        args = self.arguments.get(resource_type, {})
        if path in args:
            return args[path]
        for prefix, arg in args.items():
            if arg.type.startswith("map[") and path.startswith(prefix + "."):
                return arg
        return None

    def argument(self, resource_type: str, path: str) -> Argument:
        try:
            return self.arguments[resource_type][path]
        except KeyError:
            raise KeyError(f"{resource_type} {path}: not in the provider contract ({CONTRACT_FILE.name})") from None

    def choices(self, resource_type: str, path: str) -> tuple[Any, ...]:
        arg = self.argument(resource_type, path)
        if arg.one_of is None:
            raise KeyError(f"{resource_type} {path}: the contract lists no accepted values")
        return arg.one_of

    def literal(self, resource_type: str, path: str) -> Any:
        """`Literal[...]` of the accepted values, for a settings field that reaches `path`."""
        return Literal[self.choices(resource_type, path)]  # type: ignore[valid-type]

    def problems(self, resource_type: str, path: str, value: Any) -> list[str]:
        return self.argument(resource_type, path).problems(value)

    def uncovered(self, resource_type: str, inputs: dict[str, Any]) -> list[str]:
        """Argument paths set in `inputs` that the contract has no entry for."""
        return sorted({path for path, _ in leaves(inputs) if self.entry(resource_type, path) is None})

    def check(self, resource_type: str, name: str, inputs: dict[str, Any]) -> list[Violation]:
        """Every argument of one registered resource that the provider would refuse, and
        every argument the contract does not cover."""
        if resource_type not in self.arguments:
            return [Violation(resource_type, name, "", None, "resource type is not in the provider contract", None)]
        out = []
        for path, value in leaves(inputs):
            arg = self.entry(resource_type, path)
            if arg is None:
                out.append(Violation(resource_type, name, path, value, "is not covered by the provider contract",
                                     None))
                continue
            out += [Violation(resource_type, name, path, value, problem, arg.source)
                    for problem in arg.problems(value) + arg.dependent_problems(value, inputs)]
        return out


def _lookup(inputs: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of plain objects, or None."""
    cur: Any = inputs
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def leaves(inputs: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every argument set: objects are walked (`a.b`), lists of objects
    become `a[]`, scalars and lists of scalars are leaves."""
    for key, value in inputs.items():
        if key.startswith("__"):
            continue  # pulumi's internal keys (e.g. __defaults)
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            yield from leaves(value, path)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                yield from leaves(item, path + "[]")
        else:
            yield path, value


# --------------------------------------------------------------------------- loading


def _pair(value: Any, where: str) -> tuple[int | None, int | None] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2):
        raise ContractError(f"{where}: expected [min, max], got {value!r}")
    return value[0], value[1]


def parse(doc: dict[str, Any]) -> Contract:
    provider = doc.get("provider") or {}
    for key in ("repository", "commit", "version"):
        if not provider.get(key):
            raise ContractError(f"provider.{key}: required")
    contract = Contract(provider=dict(provider))
    allowed = {"type", "line", "file", "one_of", "range", "items", "pattern", "cidr", "within", "enforced",
               "note", "tf", "doc", "range_when"}
    for rtype, res in (doc.get("resources") or {}).items():
        default_file = res.get("file")
        args: dict[str, Argument] = {}
        for path, e in (res.get("arguments") or {}).items():
            where = f"resources.{rtype}.arguments.{path}"
            unknown = set(e) - allowed
            if unknown:
                raise ContractError(f"{where}: unknown keys {sorted(unknown)}")
            if e.get("type") not in TYPES:
                raise ContractError(f"{where}.type: expected one of {', '.join(TYPES)}, got {e.get('type')!r}")
            file = e.get("file") or default_file
            if not file or not isinstance(e.get("line"), int):
                raise ContractError(f"{where}: every entry needs a source file and line")
            if e.get("enforced") not in (None, "plan", "api"):
                raise ContractError(f"{where}.enforced: expected plan or api")
            if "doc" in e and not (isinstance(e["doc"], str) and e["doc"].startswith("https://")):
                raise ContractError(f"{where}.doc: expected an https URL of the documentation page")
            within = tuple(parse_block(w, f"{where}.within[{i}]") for i, w in enumerate(e.get("within") or ()))
            range_when = None
            if "range_when" in e:
                rw = e["range_when"]
                if not (isinstance(rw, dict) and len(rw) == 1 and isinstance(next(iter(rw.values())), dict)):
                    raise ContractError(f"{where}.range_when: expected {{ARGUMENT: {{VALUE: [min, max]}}}}")
                ((other, by_value),) = rw.items()
                range_when = (other, tuple((v, _pair(r, f"{where}.range_when.{other}.{v}")) for v, r in by_value.items()))
            args[path] = Argument(
                resource=rtype, path=path, type=e["type"],
                source=Source(provider["repository"], provider["commit"], file, e["line"]),
                one_of=tuple(e["one_of"]) if "one_of" in e else None,
                range=_pair(e.get("range"), f"{where}.range"),
                items=_pair(e.get("items"), f"{where}.items"),
                pattern=e.get("pattern"), cidr=bool(e.get("cidr")), within=within,
                enforced=e.get("enforced"), note=e.get("note", ""), tf=e.get("tf"), doc=e.get("doc"),
                range_when=range_when,
            )
        contract.arguments[rtype] = args
    return contract


@lru_cache(maxsize=1)
def load() -> Contract:
    """The shipped contract (read with libyaml's parser where PyYAML has it: the same
    document, several times faster than the pure-Python one at every import of the settings)."""
    return parse(yaml.load(CONTRACT_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


# --------------------------------------------------------------------------- docs


def markdown_table(contract: Contract | None = None) -> str:
    """Every constrained argument, what the provider accepts, and where that is written."""
    contract = contract or load()
    p = contract.provider
    rows = [
        f"Read from `{p['repository']}` {p['version']} (`{p['commit']}`), the provider "
        f"{p['wrapped_by'].split(' (')[0]} wraps. *plan*: the provider refuses the value at "
        "`pulumi preview`; *api*: stated in the field's description, or in the API's documentation "
        "(*doc*), refused by the API.",
        "",
        "| resource | argument | accepted | enforced | source |",
        "|---|---|---|---|---|",
    ]
    for rtype, args in contract.arguments.items():
        short = rtype.split(":")[1]
        for path, a in args.items():
            if not a.constrained:
                continue
            accepted = a.accepted().replace("|", "\\|")
            doc = f", [doc]({a.doc})" if a.doc else ""
            rows.append(f"| {short} | `{path}` | {accepted} | {a.enforced or '-'} | "
                        f"[{a.source.file.rsplit('/', 1)[-1]}:{a.source.line}]({a.source.url}){doc} |")
    return "\n".join(rows)
