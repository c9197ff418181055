"""The warm preview server (dsvolc/warm.py): a preview through it prints, writes and exits
as one in its own process, errors pass through, and a server never answers for code it
did not import.

The server runs for real (`python -m dsvolc.launch serve`, a Unix socket in a temporary
XDG_RUNTIME_DIR) on a copy of the project's code, so a test can edit that copy."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dsvolc import warm
from test_preview_paths import _facts

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.xdist_group("warm")


def test_fingerprint_follows_every_project_file(tmp_path):
    for pkg in warm.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "stacks" / "__pycache__").mkdir()
    (tmp_path / "__main__.py").write_text("print(1)\n")
    base = warm.fingerprint(tmp_path)
    assert warm.fingerprint(tmp_path) == base
    (tmp_path / "stacks" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "stacks" / "notes.txt").write_text("not code")
    assert warm.fingerprint(tmp_path) == base  # bytecode and non-Python files do not count
    (tmp_path / "workloads" / "extra.py").write_text("X = 1\n")
    added = warm.fingerprint(tmp_path)
    assert added != base
    st = os.stat(tmp_path / "workloads" / "extra.py")
    os.utime(tmp_path / "workloads" / "extra.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert warm.fingerprint(tmp_path) != added
    (tmp_path / "__main__.py").write_text("print(2)\n")
    assert warm.fingerprint(tmp_path) not in (base, added)


def test_the_socket_directory_is_the_users_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert oct(os.stat(warm.runtime_dir()).st_mode & 0o777) == "0o700"
    os.chmod(tmp_path / "dsvolc", 0o755)
    with pytest.raises(warm.WarmError, match="mode 0700"):
        warm.runtime_dir()


def _tree(tmp_path: Path) -> Path:
    """The project's code (what a preview imports and reads), copied."""
    tree = tmp_path / "tree"
    keep = (*warm.PACKAGES, "resources")
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.pyc")
    for name in keep:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    for name in ("__main__.py", "Pulumi.yaml", "pyproject.toml"):
        shutil.copy2(ROOT / name, tree / name)
    return tree


def _run_dir(tmp_path: Path) -> Path:
    """A short directory for the socket (a Unix socket's path must stay under 108 bytes)."""
    link = tmp_path / "run"
    if not link.exists():
        link.symlink_to(tempfile.mkdtemp(prefix="dw", dir="/tmp"))
    return link.resolve()


def _env(tmp_path: Path, tree: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSVOLC_")}
    env.update(XDG_RUNTIME_DIR=str(_run_dir(tmp_path)), PYTHONPATH=str(tree),
               DSVOLC_CACHE_DIR=str(tmp_path / "cache"))
    env.update(extra)
    return env


@contextlib.contextmanager
def _server(base: Path):
    tree = _tree(base)
    env = _env(base, tree)
    log = open(base / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dsvolc.launch", "serve", "5"], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()  # "ready <socket>" once warm
    assert line.startswith("ready "), (base / "server.log").read_text()[-3000:]
    try:
        yield tree, env, Path(line.split(" ", 1)[1].strip()), proc, base / "server.log"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(_run_dir(base), ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the tests that leave it as it was."""
    with _server(tmp_path_factory.mktemp("warm")) as s:
        yield s


@pytest.fixture
def own_server(tmp_path):
    with _server(tmp_path) as s:
        yield s


def _dsvolc(args: list[str], tree: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dsvolc.launch", *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600)


def _served(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if ": preview " in line]


def test_a_preview_through_the_server_is_the_one_of_its_own_process(server, tmp_path):
    tree, env, sock, proc, log = server
    assert sock.parent == Path(env["XDG_RUNTIME_DIR"]) / "dsvolc" and sock.exists()
    served = len(_served(log))
    warm_run = _dsvolc(["preview", "dev", "--json", str(tmp_path / "a.json")], tree, env)
    assert len(_served(log)) == served + 1  # it ran in the server's child
    own = _dsvolc(["preview", "dev", "--json", str(tmp_path / "b.json")], tree, {**env, "DSVOLC_WARM": "0"})
    assert len(_served(log)) == served + 1  # DSVOLC_WARM=0: in its own process
    assert warm_run.returncode == own.returncode
    # (file names of one length: rich wraps the "wrote FILE" line at 80 columns)
    assert warm_run.stdout.replace("a.json", "X.json") == own.stdout.replace("b.json", "X.json")
    assert warm_run.stderr == own.stderr
    docs = [json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json")]
    assert docs[0]["resources"] and _facts(docs[0]) == _facts(docs[1])
    # a second request: a fresh fork again, same answer
    again = _dsvolc(["preview", "dev", "--quiet"], tree, env)
    assert len(_served(log)) == served + 2 and again.returncode == own.returncode
    assert again.stdout.startswith("stack dev: ")


def test_errors_and_exit_codes_pass_through(server):
    tree, env, sock, proc, log = server
    served = len(_served(log))
    bad = _dsvolc(["preview", "no-such-stack"], tree, env)
    own = _dsvolc(["preview", "no-such-stack"], tree, {**env, "DSVOLC_WARM": "0"})
    assert len(_served(log)) == served + 1
    assert bad.returncode == own.returncode == 2
    assert bad.stderr == own.stderr and "error:" in bad.stderr and "Traceback" not in bad.stderr


def test_a_server_does_not_answer_for_code_it_did_not_import(own_server):
    tree, env, sock, proc, log = own_server
    target = tree / "stacks" / "constants.py"
    target.write_text(target.read_text() + "\n# edited\n")
    run = _dsvolc(["preview", "dev", "--quiet"], tree, env)
    assert run.returncode in (0, 1) and "stack dev" in run.stdout
    assert _served(log) == []  # ran in its own process, with the edited code
    proc.wait(timeout=3 * warm.POLL_S + 10)  # the stale server noticed and left
    assert proc.returncode == 0 and not sock.exists()


def test_other_commands_and_no_server_run_in_their_own_process(tmp_path):
    tree = _tree(tmp_path)
    env = _env(tmp_path, tree)
    assert warm.delegate(["dsvolc", "size", "--help"]) is None
    run = _dsvolc(["preview", "dev", "--quiet"], tree, env)  # no server for this tree
    assert run.returncode in (0, 1) and "stack dev" in run.stdout


def test_dsvolc_warm_starts_and_stops_a_server(tmp_path):
    tree = _tree(tmp_path)
    env = _env(tmp_path, tree)
    started = subprocess.run([sys.executable, "-m", "dsvolc.cli", "warm", "--idle-minutes", "2"], cwd=tree,
                             env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    socks = sorted((_run_dir(tmp_path) / "dsvolc").glob("preview-*.sock"))
    assert len(socks) == 1 and warm.server_pid(socks[0]) is not None
    pid = warm.server_pid(socks[0])
    stopped = subprocess.run([sys.executable, "-m", "dsvolc.cli", "warm", "--stop"], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0 and f"pid {pid}" in stopped.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # gone, or a zombie nobody reaps (its parent, `dsvolc warm`, has exited)
            if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"server {pid} still running after --stop")
    assert not socks[0].exists()
