"""Read a stack file's YAML as PyYAML's safe loader does, keeping what it would lose.

Two things YAML does silently that a stack file must not: a key given twice keeps the last
value (the first, perhaps `api_server_public: false`, is dropped without a word), and an
unquoted `1.30` becomes the number 1.3 (the text as written is gone by the time the settings
are validated). `read` composes the document once, reports every duplicate key with both
lines, and keeps the text of every number (and boolean: `yes`) as written, by its path, so a refusal can quote
the user's own `1.30`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"}
_MERGE = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class Duplicate:
    path: Path
    lines: tuple[int, ...]  # 1-based, in file order

    def describe(self, path: str) -> str:
        if len(self.lines) == 2:
            where = f"given twice, on line {self.lines[0]} and again on line {self.lines[1]}"
        else:
            shown = ", ".join(str(n) for n in self.lines[:-1])
            where = f"given {len(self.lines)} times, on lines {shown} and {self.lines[-1]}"
        return f"{path}: {where}; YAML would keep the last silently: keep one"


@dataclass
class Document:
    data: Any
    duplicates: list[Duplicate] = field(default_factory=list)
    numbers: dict[Path, str] = field(default_factory=dict)  # path -> a plain number or boolean as written


def read(text: str) -> Document:
    """The document (as yaml.safe_load gives it), its duplicate keys and its numbers as
    written. Raises yaml.YAMLError for text that is not YAML."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    doc = Document(data)
    if node is not None:
        _walk(node, (), doc, set())
    doc.duplicates.sort(key=lambda d: d.lines)
    return doc


def _walk(node: yaml.Node, path: Path, doc: Document, seen: set[int]) -> None:
    if id(node) in seen:  # an alias of a node already walked
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        if node.tag in _NUMBER_TAGS and node.style is None:
            doc.numbers[path] = node.value
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), doc, seen)
    elif isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], list[int]] = {}
        for key, value in node.value:
            if key.tag == _MERGE or not isinstance(key, yaml.ScalarNode):
                continue  # `<<: *base` and complex keys: no settings file uses them
            lines.setdefault((key.tag, key.value), []).append(key.start_mark.line + 1)
            _walk(value, (*path, key.value), doc, seen)
        for (_, name), at in lines.items():
            if len(at) > 1:
                doc.duplicates.append(Duplicate((*path, name), tuple(at)))


def dotted(path: Path) -> str:
    """('cluster', 'gpu_pools', 'a10') -> cluster.gpu_pools.a10; list items as [i]."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
