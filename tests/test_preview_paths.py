"""The preview's speed-ups change nothing it reports: for every shipped stack, `--json`'s
document (both deploy phases: resources, violations, verdicts, findings) is the same as
with pulumi_policy's servicer left to its own conversions and proxies and Python's
collector left running and the SDK capturing each registration's stack trace, the code
path before them. (tests/test_lazy_annotations.py does the same for the providers' SDKs
imported with postponed annotations, which needs fresh processes.)"""

from __future__ import annotations

import contextlib
import gc
import json

import pytest

from dsvolc import engine, policy_runner, preview
from stacks.loader import shipped_stacks


def _plain_path(monkeypatch) -> None:
    monkeypatch.setattr(policy_runner.ConversionCache, "installed", lambda self: contextlib.nullcontext())
    monkeypatch.setattr(preview, "collector_paused", contextlib.nullcontext)
    monkeypatch.setattr(engine, "stack_traces_skipped", contextlib.nullcontext)  # the SDK captures them


def _facts(doc: dict) -> str:
    """The document with its lists of resources, violations and findings in a fixed order:
    the mock monitor records registrations as its worker threads finish them, so their
    order can differ from one run to the next, on either path."""
    doc = json.loads(json.dumps(doc))
    key = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
    for phase in (doc, doc["first_apply"]):
        phase["resources"].sort(key=lambda r: r["urn"])
        phase["violations"].sort(key=key)
        for f in phase["findings"]:
            f["resources"].sort(key=key)
        phase["findings"].sort(key=key)
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("stack", shipped_stacks())
def test_json_is_the_same_as_by_the_plain_path(stack, monkeypatch):
    fast = preview.run_both(stack).as_json()
    with monkeypatch.context() as m:
        _plain_path(m)
        plain = preview.run_both(stack).as_json()
    assert _facts(fast) == _facts(plain)
    assert fast["resources"] and fast["first_apply"]["resources"] and fast["violations"]  # both phases ran


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
