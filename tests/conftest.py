"""Shared fixtures: tiny random-weight models and real vLLM servers.

* ``tiny_deepseek_v2`` / ``tiny_qwen2`` / ``tiny_llama``: session-scoped model
  directories (MLA + MoE, GQA with biases, GQA with a single KV head).
* ``vllm_server``: session-scoped factory ``vllm_server(model_path, args=(), env=None)``
  returning a running :class:`tests.vllm_harness.VllmServer`. One server runs at a time
  (machine-wide, through a file lock); consecutive tests asking for the same (model,
  args, env) share it. Every server logs to its own file under ``$DSVOLC_TEST_LOGS`` (or
  the session temp dir); a test that fails while a server runs gets the server's last log
  lines in its report.

Tiers (markers registered in pyproject.toml): ``integration`` tests start real servers or
tools (vLLM, promtool, Prometheus; tests/quick_start_guard.py refuses one started by a
test without the marker); ``slow`` tests are CPU-heavy (the Triton interpreter, the policy
proof matrix); ``engine`` tests need the engine extra, which the quick-start environment
lacks (tests/engine_extra.py). The fast tier is
``-m "not integration and not slow and not engine"``. Tests that start
vLLM are skipped, with the reason printed, when vLLM is not installed (a failure in CI).
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

from server_scheduling import (  # noqa: E402,F401  - hooks: the server files' scheduling, timeouts
    order_server_files,
    pytest_runtest_logreport,
    pytest_runtest_protocol,
    pytest_terminal_summary,
    pytest_timeout_set_timer,
    pytest_xdist_make_scheduler,
    timeout_paused,
)
from quick_start_guard import (  # noqa: E402,F401  - hooks: which test is running, for the guard
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
from vllm_harness import ServerPool, make_tiny_model  # noqa: E402
from quick_start_guard import install as install_quick_start_guard  # noqa: E402

# A test that starts a tool or imports a module the quick start lacks must carry the markers
# that leave it out of the fast tier (tests/quick_start_guard.py).
install_quick_start_guard()

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
def vllm_server(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config):
    if not VLLM_AVAILABLE:
        # CI installs the engine (.ci/run); there a missing vLLM is a failure, not a skip.
        if os.environ.get("CI"):
            pytest.fail("vllm is not installed in CI (pip install -e '.[engine]')")
        pytest.skip("vllm is not installed (pip install -e '.[engine]')")
    logs = os.environ.get("DSVOLC_TEST_LOGS")
    log_dir = Path(logs) if logs else tmp_path_factory.mktemp("vllm-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    # Waiting for another process's server is not the waiting test's time.
    pool = ServerPool(log_dir, on_wait=lambda: timeout_paused(pytestconfig))
    pytestconfig.stash[_POOL] = pool
    try:
        yield pool.get
    finally:
        pool.stop_all()


_POOL = pytest.StashKey[ServerPool]()


@pytest.fixture(scope="session", autouse=True)
def _one_program_run_per_stack_and_mode():
    """The program is deterministic given (stack, settings, mode): tests that run an
    unchanged stack share one recording (a deep copy each) instead of each running the
    whole program again. Runs with transforms (the policy matrix's injections) are never
    shared. `engine.run.__wrapped__` is the unshared run, for tests about runs themselves."""
    import copy
    import json

    if importlib.util.find_spec("pulumi") is None:
        # A kernels-only machine (the GPU that races the kernels has torch and Triton, not the
        # Pulumi SDK): no program runs there, so there is nothing to share.
        yield
        return
    from dsvolc import engine

    real = engine.run
    cache: dict[tuple, engine.Recording] = {}

    def run(stack, raw_settings, transforms=None, *, mode="new"):
        if transforms:
            return real(stack, raw_settings, transforms, mode=mode)
        key = (stack, json.dumps(raw_settings, sort_keys=True, default=str), mode)
        if key not in cache:
            cache[key] = real(stack, raw_settings, mode=mode)
        return copy.deepcopy(cache[key])

    run.__wrapped__ = real  # type: ignore[attr-defined]
    engine.run = run

    # Likewise a whole preview (program and policy verdict) of an unchanged stack.
    from dsvolc import preview

    real_preview = preview.run_preview
    previews: dict[tuple, preview.PreviewResult] = {}

    def run_preview(stack, *, policies=True, transforms=None, raw=None, mode="new"):
        if transforms:
            return real_preview(stack, policies=policies, transforms=transforms, raw=raw, mode=mode)
        from stacks import loader

        settings_raw = raw if raw is not None else loader.read_raw(stack)
        key = (str(stack), json.dumps(settings_raw, sort_keys=True, default=str), policies, mode)
        if key not in previews:
            previews[key] = real_preview(stack, policies=policies, raw=raw, mode=mode)
        return copy.deepcopy(previews[key])

    preview.run_preview = run_preview
    yield
    engine.run = real
    preview.run_preview = real_preview


_KERNELS = _TESTS / "kernels"
# Fixtures that need the engine extra: the tiny models are written with torch, safetensors
# and tokenizers (vllm_harness.make_tiny_model); the servers are vLLM.
ENGINE_FIXTURES = frozenset({"tiny_models_dir", "vllm_server"})
# Fixtures that start a server the quick start lacks (.ci/run installs it); tests/quick_start_guard.py
# refuses such a process in a test without the integration marker.
INTEGRATION_FIXTURES = frozenset({"s3", "prometheus"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Which worker runs which file under -n 2 --dist loadgroup: tests/server_scheduling.py;
    # the server files in the order that lets the pool share servers (SERVER_FILE_ORDER).
    order_server_files(items)
    for item in items:
        in_kernels = _KERNELS in Path(str(item.path)).parents
        # The kernels' tests run Triton's interpreter on the CPU: correct, but slow.
        if in_kernels and "integration" not in item.keywords:
            item.add_marker(pytest.mark.slow)
        # What the quick-start environment lacks (tests/engine_extra.py): torch and Triton
        # for the kernels, torch, safetensors and tokenizers for the tiny models, vLLM.
        if in_kernels or ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
        # Real server processes behind fixtures: an S3 server (tests/test_runtime_weights.py), a
        # Prometheus (tests/test_gpu_health.py, tests/test_dashboard_ranks.py).
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "vllm_server" in getattr(item, "fixturenames", ()):
        pool = item.config.stash.get(_POOL, None)
        server = pool._server if pool is not None else None
        if server is not None:
            report.sections.append((f"vLLM server log ({server.log_path}), last lines", server.log_tail(80)))
