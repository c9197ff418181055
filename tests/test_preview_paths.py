"""The preview's speed-ups change nothing it reports: for every shipped stack, `--json`'s
document (both deploy phases: resources, violations, verdicts, findings) is the same as
with pulumi_policy's servicer left to its own conversions and proxies and Python's
collector left running, the code path before them."""

from __future__ import annotations

import contextlib
import gc
import json

import pytest

from dsvolc import policy_runner, preview
from stacks.loader import shipped_stacks


def _plain_path(monkeypatch) -> None:
    monkeypatch.setattr(policy_runner.ConversionCache, "installed", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(preview, "collector_paused", contextlib.nullcontext)


@pytest.mark.parametrize("stack", shipped_stacks())
def test_json_is_the_same_as_by_the_plain_path(stack, monkeypatch):
    fast = preview.run_both(stack).as_json()
    with monkeypatch.context() as m:
        _plain_path(m)
        plain = preview.run_both(stack).as_json()
    assert json.dumps(fast, sort_keys=True) == json.dumps(plain, sort_keys=True)
    assert fast["resources"] and fast["first_apply"]["resources"]  # both phases ran


def test_the_collector_is_back_as_it_was():
    """The preview pauses the cyclic collector while it runs, and leaves it as it found it."""
    assert gc.isenabled()
    preview.run_preview("dev", policies=False)
    assert gc.isenabled()
    gc.disable()
    try:
        preview.run_preview("dev", policies=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
