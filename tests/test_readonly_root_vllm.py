"""A real vLLM serves with the serving container's read-only root filesystem.

The dev stack's serving container is rendered, and vLLM (the CPU build, a tiny DeepSeek-V2)
runs the way the kubelet would run it, as far as this machine can: every file of the
machine read-only (tests/readonly_root.py: a private mount namespace, EROFS for root too),
a fresh tmpfs at each emptyDir the container mounts, the model bound read-only where the
node cache would be, the rendered environment. torch.compile is on (no `--enforce-eager`):
the compile cache is what vLLM writes at start.

HOME is then made unwritable too (pointed at a directory of the read-only root): the
cache variables the renderer sets (workloads/engine/manifests.py CACHE_ENV) must cover everything
vLLM writes, not $HOME by accident. The control run drops those variables: vLLM falls back
to $HOME and fails to start, which is what makes the first run a proof.

Differences from the pod: those of tests/test_serving_vllm.py (GPU-only flags dropped, the
tiny model's context, the test server's host and port), the process runs as root (in the
pod: uid 1000; a read-only mount refuses both), and what the CPU build never touches is
not exercised here: CUDA graphs, NCCL, Triton kernels and the CUDA JIT cache
(docs/serving.md, "Read-only root filesystem").
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

import readonly_root
from stacks import load
from stacks.constants import MODEL_CACHE_DIR
from vllm_harness import DEFAULT_SERVER_ARGS, VllmServer, VllmStartupError
from workloads.engine import engine_args
from workloads.engine import manifests
from stacks.plan import build_plan
from workloads.engine.context import build_context

pytestmark = pytest.mark.integration

UNWRITABLE_HOME = "/home/unwritable"  # on the read-only root: no mount there
EROFS = "Read-only file system"


def _skip_without_namespaces() -> None:
    if not readonly_root.available():
        pytest.skip("this machine refuses mount namespaces (unshare --mount, also as a mapped root), "
                    "which the read-only root is built with")


@pytest.fixture(scope="module")
def pod(tiny_deepseek_v2):
    """(model path in the container, args, env, emptyDir mount paths) of the rendered
    serving container of the dev stack, for the tiny model."""
    s = load("dev")
    ctx = build_context(build_plan(s), image_repository="r.example/ns/repo")
    model = f"{MODEL_CACHE_DIR}/{tiny_deepseek_v2.name}"
    cfg = json.loads((tiny_deepseek_v2 / "config.json").read_text())
    a = dataclasses.replace(engine_args.from_context(ctx, model), max_model_len=cfg["max_position_embeddings"])
    args = engine_args.without_flags(engine_args.render(a), engine_args.GPU_ONLY_FLAGS | {"--host", "--port"})
    container = manifests.engine_container(ctx, engine_args.render(a), serving=True)
    volumes = {v["name"]: v for v in manifests.volumes(ctx)}
    empty_dirs = [m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return model, args, env, empty_dirs


class ReadOnlyRootServer(VllmServer):
    """The harness's server, started inside a read-only root with the pod's writable paths."""

    def __init__(self, model_dir: Path, container_model: str, root: Path, tmpfs: list[str], **kw):
        super().__init__(model_dir, **kw)
        self.container_model, self.root, self.tmpfs = container_model, root, tmpfs
        self.model_dir = Path(model_dir)

    @property
    def command(self) -> list[str]:
        cmd = super().command
        cmd[cmd.index("--model") + 1] = self.container_model
        return readonly_root.command(self.root, self.tmpfs, {str(self.model_dir): self.container_model}, cmd)


def start(tiny, pod, tmp_path, name, *, env_change=None) -> ReadOnlyRootServer:
    model, args, env, tmpfs = pod
    env = dict(env)
    env.update(env_change or {})
    env = {k: v for k, v in env.items() if v is not None}
    root = tmp_path / f"root-{name}"
    root.mkdir()
    # torch.compile on: the harness's defaults without --enforce-eager
    defaults = tuple(a for a in DEFAULT_SERVER_ARGS if a != "--enforce-eager")
    return ReadOnlyRootServer(tiny, model, root, tmpfs, args=args, env=env, default_args=defaults,
                              log_path=tmp_path / f"vllm-{name}.log")


def test_the_serving_container_writes_only_to_its_emptydirs(pod):
    _, _, env, tmpfs = pod
    assert sorted(tmpfs) == sorted(["/dev/shm", manifests.HOME_DIR, manifests.TMP_DIR])
    for key, path in manifests.CACHE_ENV.items():
        assert env[key] == path, key
        assert path == manifests.CACHE_DIR or path.startswith(manifests.CACHE_DIR + "/"), (key, path)


def test_vllm_serves_with_a_read_only_root_and_home_unwritable(tiny_deepseek_v2, pod, tmp_path):
    _skip_without_namespaces()
    srv = start(tiny_deepseek_v2, pod, tmp_path, "served", env_change={"HOME": UNWRITABLE_HOME})
    args = pod[1]
    with srv:
        status, body = srv.post_json("/v1/completions", {
            "model": args[args.index("--served-model-name") + 1],
            "prompt": "the weights live in a bucket", "max_tokens": 8, "temperature": 0})
        log = srv.log_text()
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    assert "Warming up model for the compilation" in log, "torch.compile did not run: no compile cache was written"
    # nothing tried to write outside the emptyDirs (vLLM logs some failed cache writes and goes on)
    assert EROFS not in log, [ln for ln in log.splitlines() if EROFS in ln][:5]


def test_control_without_the_cache_variables_vllm_cannot_start(tiny_deepseek_v2, pod, tmp_path):
    """The same container minus CACHE_ENV: vLLM falls back to $HOME, which is read-only."""
    _skip_without_namespaces()
    change = {"HOME": UNWRITABLE_HOME, **{k: None for k in manifests.CACHE_ENV}}
    srv = start(tiny_deepseek_v2, pod, tmp_path, "control", env_change=change)
    with pytest.raises(VllmStartupError):
        srv.start()
    srv.stop()
    log = srv.log_text()
    assert EROFS in log and UNWRITABLE_HOME in log, log[-3000:]
