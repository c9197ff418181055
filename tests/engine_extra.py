"""The engine extra (``pip install -e '.[engine]'``: vLLM, torch, transformers, Triton) is
not part of the README's quick-start environment (``pip install -e '.[dev]'``).

A test module that cannot even be imported without it calls :func:`require` first: where
the extra is missing it is skipped with the reason, except in CI, which installs the extra
(.ci/run), so that there a missing engine fails instead of skipping. Tests that need the
extra carry the ``engine`` marker (tests/conftest.py applies it), and the fast tier leaves
them out.
"""

from __future__ import annotations

import importlib
import os

import pytest

REASON = "needs the engine extra: pip install -e '.[engine]'"


def require(*modules: str) -> None:
    for name in modules:
        if os.environ.get("CI"):
            importlib.import_module(name)  # CI installs the engine: a missing one must fail
        else:
            pytest.importorskip(name, reason=REASON)
