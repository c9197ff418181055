"""Shared fixtures: tiny random-weight models and real vLLM servers.

* ``tiny_deepseek_v2`` / ``tiny_qwen2`` / ``tiny_llama``: session-scoped model
  directories (MLA + MoE, GQA with biases, GQA with a single KV head).
* ``vllm_server``: session-scoped factory ``vllm_server(model_path, args=(), env=None)``
  returning a running :class:`tests.vllm_harness.VllmServer`. Each distinct
  (model, args, env) is started once per session and shared by every test asking for
  it; all are stopped when the session ends. Logs go to the session temp dir.

Tests that start vLLM are marked ``@pytest.mark.integration``; they are skipped, with
the reason printed, when vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_ROOT = _TESTS.parent
for p in (str(_ROOT), str(_TESTS)):
    if p not in sys.path:
        sys.path.insert(0, p)

from vllm_harness import ServerPool, make_tiny_model  # noqa: E402

VLLM_AVAILABLE = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_deepseek_v2(tiny_models_dir: Path) -> Path:
    return make_tiny_model(tiny_models_dir, "deepseek_v2")


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_models_dir: Path) -> Path:
    return make_tiny_model(tiny_models_dir, "qwen2")


@pytest.fixture(scope="session")
def tiny_llama(tiny_models_dir: Path) -> Path:
    return make_tiny_model(tiny_models_dir, "llama")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory):
    if not VLLM_AVAILABLE:
        # CI installs the engine (.ci/run); there a missing vLLM is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail("vllm is not installed in CI (pip install -e '.[engine]')")
        pytest.skip("vllm is not installed (pip install -e '.[engine]')")
    pool = ServerPool(tmp_path_factory.mktemp("vllm-logs"))
    try:
        yield pool.get
    finally:
        pool.stop_all()
