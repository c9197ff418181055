"""Suggestions for a mistyped name: the known value it was most likely meant to be.

Used wherever a name is looked up in a fixed table (models, GPUs, instance types, regions,
zones, pools, settings keys), so that a typo is answered with the value it was meant to be
rather than only with the whole list. Similarity is difflib's ratio, compared without case.
A suggestion is given only when it is likely: close enough, and not one of many equally
close candidates. Close enough means one slip (a letter wrong, missing, extra, or two
swapped), one more per 12 characters, and never below `cutoff`: `a01` is a slip of `a10`,
`us-east-1` no misspelt `ap-southeast-1`. A name that starts known ones (`A100` for
`A100-40G`, `A100-80G`) names those; a known name in the wrong case names it as spelt.

May import: the standard library only (capacity's rule), so `stacks` and `dsvolc` use it too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# difflib's ratio drops by about 1/len per slip: a name of n characters may lie this many
# slips away (half a slip of slack), plus one per _LONG characters.
_SLIPS = 1.5
_LONG = 12
# Ratios within this of the best count as equally close.
_TIE = 0.02
# More equally close candidates than this and none is named.
_MAX_NAMED = 2


def closest(value: object, known: Iterable[str], *, cutoff: float = 0.6) -> list[str]:
    """The known names `value` most likely meant (best first; empty when none is likely)."""
    if not isinstance(value, str) or not value.strip():
        return []
    names = list(dict.fromkeys(known))
    by_key: dict[str, str] = {}
    for name in names:
        by_key.setdefault(name.lower(), name)
    key = value.strip().lower()
    if key in by_key:  # the name itself (nothing to suggest), or it in another case
        return [] if by_key[key] == value else [by_key[key]]
    if len(key) >= 3:
        prefixed = [name for k, name in by_key.items() if k.startswith(key)]
        if 0 < len(prefixed) <= _MAX_NAMED:
            return prefixed
    scored = sorted(
        ((difflib.SequenceMatcher(None, key, k).ratio(), name) for k, name in by_key.items()),
        key=lambda item: -item[0],
    )
    floor = max(cutoff, 1 - (_SLIPS + len(key) // _LONG) / len(key))
    scored = [(r, name) for r, name in scored if r >= floor]
    if not scored:
        return []
    best = scored[0][0]
    top = [name for r, name in scored if best - r <= _TIE]
    return top if len(top) <= _MAX_NAMED else []


def did_you_mean(value: object, known: Iterable[str], *, cutoff: float = 0.6, aside: bool = False) -> str:
    """'; did you mean X?' (or 'X or Y?') to end a refusal with, else ''. `aside`: the form
    for the middle of a sentence, ' (did you mean X?)'."""
    found = closest(value, known, cutoff=cutoff)
    if not found:
        return ""
    question = f"did you mean {' or '.join(found)}?"
    return f" ({question})" if aside else f"; {question}"
