"""Run a command the way a pod with `readOnlyRootFilesystem: true` runs it: every file of
the machine read-only, and writable only where the pod mounts an emptyDir.

    python tests/readonly_root.py --root DIR [--tmpfs PATH]... [--bind[-ro] HOST:PATH]... -- CMD...

In a private mount namespace (`unshare --mount`), DIR becomes the new root: a tmpfs that
holds a read-only bind of each top-level directory of the machine (the Python, the
virtualenv and the repository stay where they are, read-only, even under /tmp), a fresh tmpfs at each `--tmpfs` path
(the pod's emptyDirs), each `--bind-ro` source at its path (a hostPath or a read-only
volume), each `--bind` source writable (a hostPath the container writes), the machine's
/proc and /dev, and a read-only /sys. Then the tmpfs root itself is
made read-only and CMD runs chrooted into it: a write anywhere but the `--tmpfs` paths (and
/dev) fails with EROFS, for root as for any other user, as in the container.

The top-level directory of every `--tmpfs`/`--bind`/`--bind-ro` path (e.g. /var for /var/cache/x)
and /tmp and /run are not taken from the machine: they start empty, as in an image, so a
mount point can be made in them before the root turns read-only.

Needs mount namespaces: root, or an unprivileged user namespace (`unshare -r`).
`available()` says whether this machine allows them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

FRESH = ("tmp", "run")  # empty in an image; never taken from the machine
KERNEL = ("proc", "dev")  # the machine's, writable (as the container runtime mounts them); /sys read-only


def available() -> bool:
    """Whether this process may make a private mount namespace (directly or as a mapped root)."""
    for cmd in (["unshare", "--mount", "true"], ["unshare", "--user", "--map-root-user", "--mount", "true"]):
        try:
            if subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    return False


def command(root: str | os.PathLike, tmpfs: list[str], bind_ro: dict[str, str], argv: list[str],
            bind: dict[str, str] | None = None) -> list[str]:
    """The command line that runs `argv` under a read-only root at `root` (an empty
    directory): `tmpfs` paths writable and empty, `bind_ro` {host: path} read-only, `bind`
    {host: path} writable."""
    # The Python, its virtualenv and the repository stay visible where they are, also when
    # they live under a directory an image starts empty (a clone in /tmp): bound read-only.
    here = Path(__file__).resolve().parent.parent
    keep = {str(p): str(p) for p in map(Path, (sys.prefix, sys.base_prefix, here))
            if len(p.parts) > 1 and p.parts[1] in FRESH}
    bind_ro = {**keep, **bind_ro}
    direct = subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
    ns = ["unshare", "--mount", "--propagation", "private"]
    if not direct:
        ns = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    out = [*ns, sys.executable, os.path.abspath(__file__), "--root", str(root)]
    for p in tmpfs:
        out += ["--tmpfs", p]
    for host, path in bind_ro.items():
        out += ["--bind-ro", f"{host}:{path}"]
    for host, path in (bind or {}).items():
        out += ["--bind", f"{host}:{path}"]
    return out + ["--", *argv]


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _mountpoints_under(prefix: str) -> list[str]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mp = line.split()[4].replace("\\040", " ")
        if mp == prefix or mp.startswith(prefix.rstrip("/") + "/"):
            out.append(mp)
    return out


def build(root: str, tmpfs: list[str], bind_ro: dict[str, str], bind: dict[str, str]) -> None:
    """Assemble the read-only root at `root` (inside the private mount namespace)."""
    targets = [*tmpfs, *bind_ro.values(), *bind.values()]
    for p in targets:
        if not p.startswith("/") or p == "/":
            raise SystemExit(f"readonly_root: mount path must be absolute and not /, got {p!r}")
    own = {Path(p).parts[1] for p in targets} - set(KERNEL)
    _mount("-t", "tmpfs", "-o", "mode=755", "rootfs", root)
    bound = []
    for entry in sorted(os.listdir("/")):
        src, dst = f"/{entry}", f"{root}/{entry}"
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif not os.path.isdir(src):
            continue
        elif entry in FRESH or entry in own:
            os.mkdir(dst)
        else:
            os.mkdir(dst)
            _mount("--rbind", src, dst)
            if entry not in KERNEL:
                bound.append(dst)
    # read-only, every mount below each bound directory included (a bind remount changes one mount)
    for top in bound:
        for mp in _mountpoints_under(top):
            subprocess.run(["mount", "-o", "remount,bind,ro", mp], capture_output=True)
    for p in tmpfs:
        os.makedirs(root + p, exist_ok=True)
        _mount("-t", "tmpfs", "-o", "mode=1777", "emptydir", root + p)
    for host, p in [*bind_ro.items(), *bind.items()]:
        os.makedirs(root + p, exist_ok=True)
        _mount("--bind", host, root + p)
        if host in bind_ro:
            _mount("-o", "remount,bind,ro", root + p)
    _mount("-o", "remount,ro", root)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="an empty directory to assemble the root in")
    ap.add_argument("--tmpfs", action="append", default=[], help="a writable path (an emptyDir)")
    ap.add_argument("--bind-ro", action="append", default=[], help="HOST:PATH, read-only")
    ap.add_argument("--bind", action="append", default=[], help="HOST:PATH, writable")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command after --")
    def pairs(specs: list[str], flag: str) -> dict[str, str]:
        out = {}
        for spec in specs:
            host, sep, path = spec.rpartition(":")
            if not sep or not host:
                ap.error(f"{flag}: expected HOST:PATH, got {spec!r}")
            out[host] = path
        return out

    build(a.root, a.tmpfs, pairs(a.bind_ro, "--bind-ro"), pairs(a.bind, "--bind"))
    os.chroot(a.root)
    os.chdir("/")
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
