"""A warm preview server: `dsvolc warm` imports once what every preview imports, and each
`dsvolc preview` then runs in a fork of it.

A preview of prod spends about two thirds of its CPU time importing (the Pulumi SDK, the
providers' SDKs, the project's settings models and program) before it registers its first
resource (docs/preview.md). The server does that once, keeps no state from any run, and
forks a child per request: the child is a copy of a process that has only imported, so
each preview starts as a fresh process would after its imports, with the caller's working
directory, environment, arguments, stdin, stdout and stderr (passed over a Unix socket,
SCM_RIGHTS), and its exit code goes back to the caller.

- Only `dsvolc preview` goes through it (`dsvolc.launch`, the console entry: it reads no
  more than the standard library before it knows whether a server is there); without a
  server, or with `DSVOLC_WARM=0`, the command runs in its own process as before.
- A server answers only for the code it imported: its socket's name carries a fingerprint
  of the project's Python files (path, mtime, size), `__main__.py`, the interpreter and
  the installed packages' directories. After an edit or a `pip install` the caller finds
  no socket of that name and runs in its own process; the old server notices the change
  within 2 s and exits, as it does after `--idle-minutes` without a request (default 30).
- The socket lives in a directory only the user can enter (`$XDG_RUNTIME_DIR/dsvolc`, else
  `/tmp/dsvolc-<uid>`, created 0700 and refused when another user owns it).
- Before it listens, the server runs one preview in a child (output discarded) and imports
  what that child imported (the providers' subpackages the program touches) and resolves
  the annotations of the SDK classes it used (`record_type_lookups`); each later child
  reports the same, so the next fork starts with them. It then checks it holds one
  thread: a fork copies only the calling thread, so a second one (holding a lock) could
  hang a child.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("capacity", "dsvolc", "infra", "kernels", "policies", "runtime", "stacks", "workloads")
DELEGATED = ("preview",)  # commands a server runs
POLL_S = 2.0
_LEN = struct.Struct("!I")
_CODE = struct.Struct("!i")


class WarmError(Exception):
    pass


def fingerprint(root: Path = ROOT) -> str:
    """What a server's imports depend on: every project .py file (relative path, mtime,
    size), the interpreter, and the mtime of each installed-packages directory (pip changes
    it when it adds or removes a package)."""
    h = hashlib.sha1()
    h.update(f"{sys.executable}\0{sys.version}\0{root}\0".encode())
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(root / pkg):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    st = os.stat(path)
                    h.update(f"{os.path.relpath(path, root)}\0{st.st_mtime_ns}\0{st.st_size}\0".encode())
    for path in [root / "__main__.py", *{Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}]:
        try:
            st = os.stat(path)
        except OSError:
            continue
        h.update(f"{path}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "dsvolc" if base else Path(f"/tmp/dsvolc-{os.getuid()}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WarmError(f"{path}: expected a directory owned by uid {os.getuid()} with mode 0700")
    return path


def socket_path(fp: str | None = None, root: Path = ROOT) -> Path:
    tree = hashlib.sha1(str(root).encode()).hexdigest()[:8]
    path = runtime_dir() / f"preview-{tree}-{fp or fingerprint(root)}.sock"
    if len(os.fsencode(path)) > 100:  # sockaddr_un holds 108 bytes
        raise WarmError(f"{path}: a Unix socket path must be under 100 bytes; set XDG_RUNTIME_DIR to a shorter "
                        "directory")
    return path


def servers(root: Path = ROOT) -> list[Path]:
    """Sockets of this tree's servers, current or stale."""
    tree = hashlib.sha1(str(root).encode()).hexdigest()[:8]
    return sorted(runtime_dir().glob(f"preview-{tree}-*.sock"))


def server_pid(sock: Path) -> int | None:
    """The pid of the process listening on `sock` (SO_PEERCRED), None when nobody is."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(sock))
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", creds)[0]
    except OSError:
        return None
    finally:
        conn.close()


# ----------------------------------------------------------------------------- the caller


def _std_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def delegate(argv: list[str]) -> int | None:
    """Run `argv` (a `dsvolc ...` command line) in a warm server; None when there is none
    for this tree's code (the caller then runs it itself)."""
    if os.environ.get("DSVOLC_WARM") == "0" or len(argv) < 2 or argv[1] not in DELEGATED:
        return None
    try:
        path = socket_path()
    except (WarmError, OSError):
        return None
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError:
        conn.close()
        return None
    with conn:
        payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
        socket.send_fds(conn, [_LEN.pack(len(payload)) + payload], _std_fds())
        head = _recv_exact(conn, _CODE.size)
        if len(head) < _CODE.size:
            return None if not head else 70
        (child,) = _CODE.unpack(head)
        try:
            tail = _recv_exact(conn, _CODE.size)
        except KeyboardInterrupt:
            os.kill(child, signal.SIGINT)
            tail = _recv_exact(conn, _CODE.size)
        if len(tail) < _CODE.size:
            print(f"dsvolc: the warm server's child {child} ended without an exit code", file=sys.stderr)
            return 70  # EX_SOFTWARE
        return _CODE.unpack(tail)[0]


# ----------------------------------------------------------------------------- the server


def _reopen_std() -> None:
    import io

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        stream = io.open(fd, "r" if fd == 0 else "w", buffering=1 if fd and os.isatty(fd) else -1,
                         encoding="utf-8", errors="strict" if fd == 0 else "backslashreplace", closefd=False)
        setattr(sys, name, stream)


def _child(conn: socket.socket, listener: socket.socket | None, req: dict, fds: list[int], run) -> None:
    """In the fork: become the caller's command, report its exit code, never return."""
    code = 70
    try:
        conn.sendall(_CODE.pack(os.getpid()))  # first: the caller forwards Ctrl-C to it
        if listener is not None:
            listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _reopen_std()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = list(req["argv"])
        before, types_before = set(sys.modules), len(_TYPES_SEEN)
        code = run(sys.argv)
        _report_modules(before, types_before)
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # noqa: BLE001 - reported to the caller, the child ends
        import traceback

        traceback.print_exception(exc)
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        try:
            conn.sendall(_CODE.pack(code))
        except OSError:
            pass
        os._exit(code)


def _modules_file(pid: int) -> Path:
    return runtime_dir() / f"modules-{pid}.txt"


_TYPES_SEEN: list[type] = []


def record_type_lookups() -> None:
    """Note each class whose annotations the SDK resolves (`pulumi._types._raw_return_hints`,
    cached per class: `typing.get_type_hints` on every property of an input, output or
    resource type, about a quarter of a warm preview's CPU when the cache is cold). A child
    reports them; the server resolves them once, and its later children find them cached."""
    from pulumi import _types

    original = _types._raw_return_hints
    if getattr(original, "_dsvolc_recording", False):
        return
    seen: set[type] = set()

    def recording(cls):
        if cls not in seen:
            seen.add(cls)
            _TYPES_SEEN.append(cls)
        return original(cls)

    recording._dsvolc_recording = True
    recording.cache_info = getattr(original, "cache_info", None)
    _types._raw_return_hints = recording


def resolve_types(entries: list[str]) -> int:
    """Fill the SDK's per-class caches for `module<TAB>qualname` entries a child reported."""
    from pulumi import _types

    done = 0
    for entry in entries:
        module, _, qualname = entry.partition("\t")
        obj = sys.modules.get(module)
        for part in qualname.split(".") if obj is not None and qualname else ():
            obj = getattr(obj, part, None)
        if isinstance(obj, type):
            try:
                _types._types_from_py_properties(obj)
                done += 1
            except Exception:  # noqa: BLE001 - the child resolves it again
                continue
    return done


def _learned(before: set[str], types_before: int) -> str:
    names = [n for n in sys.modules if n not in before]  # import order
    types = [f"{c.__module__}\t{c.__qualname__}" for c in _TYPES_SEEN[types_before:]]
    return "\n".join(names) + "\n\n" + "\n".join(types)


def _split_learned(text: str) -> tuple[list[str], list[str]]:
    names, _, types = text.partition("\n\n")
    return names.split("\n"), [t for t in types.split("\n") if t]


def _report_modules(before: set[str], types_before: int) -> None:
    """What this child imported that the server had not (in import order) and the classes
    whose annotations it resolved, for the server to do before the next fork."""
    text = _learned(before, types_before)
    if text.strip():
        try:
            _modules_file(os.getpid()).write_text(text)
        except OSError:
            pass


def import_learned(names: list[str]) -> list[str]:
    """Import `names` (modules a child imported, in its order) into this process."""
    import importlib
    import importlib.util

    imported = []
    for name in names:
        if not name or name.startswith(("__main__", "<")):
            continue
        parts = name.split(".")
        for i in range(1, len(parts)):
            # the providers' packages are lazy modules (importlib.util.LazyLoader) until an
            # attribute is read; a submodule imported under one that has not run would see
            # its package run halfway through (a `from .x import *` of a partial module)
            ancestor = sys.modules.get(".".join(parts[:i]))
            if isinstance(ancestor, importlib.util._LazyModule):
                getattr(ancestor, "__file__", None)
        if name in sys.modules:
            module = sys.modules[name]
            if isinstance(module, importlib.util._LazyModule):
                getattr(module, "__file__", None)
                imported.append(name)
            continue
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception:  # noqa: BLE001 - a module the child made on the fly; it imports it again
            continue
    return imported


def learn(stack: str, run) -> str:
    """Modules a preview of `stack` imports beyond `preload()`: run one in a child with
    its output discarded and read back the names."""
    before = set(sys.modules)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            run(["dsvolc", "preview", stack, "--quiet"])
            os.write(write, _learned(before, 0).encode())
        finally:
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


def warm_up(run, preload, stack: str) -> list[str]:
    """`preload()`, then what a child running a preview of `stack` imported and resolved."""
    import threading

    preload()
    record_type_lookups()
    names, types = _split_learned(learn(stack, run))
    imported = import_learned(names)
    resolve_types(types)
    if threading.active_count() != 1:
        raise WarmError(f"{threading.active_count()} threads after the imports ({threading.enumerate()}): "
                        "a fork would copy only one")
    return imported


def serve(run, preload, warm_stack: str, idle_minutes: float = 30.0, ready=None, log=None) -> int:
    """Warm up (`preload`, then a preview of `warm_stack` in a child), listen, fork a child
    per request that runs `run(argv) -> exit code`; return when the code changes or idle."""
    import gc

    gc.disable()
    fp = fingerprint()
    warm_up(run, preload, warm_stack)
    gc.freeze()  # what the imports made stays out of every child's collections
    path = socket_path(fp)
    if fingerprint() != fp:
        return 0  # the tree changed while warming up: serve nothing stale
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.parent / f".{os.getpid()}.sock"
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(16)
    os.replace(tmp, path)
    inode = os.stat(path).st_ino
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    if ready is not None:
        ready(path)
    last = checked = time.monotonic()
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([listener], [], [], 0.05 if children else POLL_S)
            for pid in list(children):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    children.discard(pid)
                    _learn_from(pid)
            if readable:
                conn, _ = listener.accept()
                last = time.monotonic()
                _handle(conn, listener, children, log, run)
            elif children:
                last = time.monotonic()
            if time.monotonic() - checked >= POLL_S:  # walking the tree costs ~10 ms: not every 50 ms
                checked = time.monotonic()
                if fingerprint() != fp or _inode(path) != inode:  # stale, or another server took the name
                    return 0
            if time.monotonic() - last > idle_minutes * 60:
                return 0
    finally:
        listener.close()
        try:
            if os.stat(path).st_ino == inode:  # not a newer server's socket
                path.unlink()
                path.with_suffix(".log").unlink(missing_ok=True)
        except OSError:
            pass


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _learn_from(pid: int) -> None:
    import gc
    import threading

    path = _modules_file(pid)
    try:
        text = path.read_text()
        path.unlink()
    except OSError:
        return
    names, types = _split_learned(text)
    import_learned(names)
    resolve_types(types)
    gc.freeze()
    if threading.active_count() != 1:
        raise WarmError(f"{threading.active_count()} threads after importing what a preview imported: "
                        "a fork would copy only one")


def _handle(conn: socket.socket, listener: socket.socket, children: set[int], log, run) -> None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():  # the directory is the user's; and the caller
            conn.close()
            return
        head, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        (size,) = _LEN.unpack(head[:_LEN.size])
        body = head[_LEN.size:]
        body += _recv_exact(conn, size - len(body))
        req = json.loads(body)
    except (OSError, ValueError, struct.error):
        conn.close()
        return
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        _child(conn, listener, req, fds, run)
    for fd in fds:
        os.close(fd)
    children.add(pid)
    conn.close()  # the child holds its own end
    if log is not None:
        print(f"{time.strftime('%H:%M:%S')} pid {pid}: {' '.join(req['argv'][1:])}", file=log, flush=True)
