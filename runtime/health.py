"""Liveness of a headless vLLM worker (a node of a multi-node replica other than the leader).

    python -m runtime.health workers --expect N

A worker pod runs no HTTP server, so it has no /health for the kubelet to probe; what can
die there is an engine process (one per local GPU rank) while the container's main
process lives on. vLLM names its processes with setproctitle (`VLLM::Worker_PP1_TP3`,
`VLLM::EngineCore_DP9`, vllm/utils/system_utils.py `set_process_title`), which rewrites
/proc/<pid>/cmdline. The check counts the live ones in the container's PID namespace:
fewer than N (dead, or zombies nobody reaped) fails the probe, the kubelet restarts the
container, and the LeaderWorkerSet recreates the group.

Standard library only (it runs in the serving image every probe period).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable

PREFIX = "VLLM::"


def engine_processes(prefix: str = PREFIX, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> title of the live (not zombie, not dead) processes whose title starts with `prefix`."""
    out: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace").strip()
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        state = stat.rsplit(")", 1)[1].split()[0] if ")" in stat else "?"
        if title.startswith(prefix) and state not in ("Z", "X", "x"):
            out[int(entry.name)] = title
    return out


def check(expect: int, prefix: str = PREFIX) -> list[str]:
    alive = engine_processes(prefix)
    if len(alive) >= expect:
        return []
    names = ", ".join(sorted(alive.values())) or "none"
    return [f"{len(alive)} of {expect} vLLM engine processes alive ({names}): an engine process died"]


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.health")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workers", help="exit 1 unless N vLLM engine processes are alive")
    w.add_argument("--expect", type=int, required=True, help="engine processes of this pod (its GPU ranks)")
    w.add_argument("--prefix", default=PREFIX, help="process-title prefix (vLLM's VLLM_PROCESS_NAME_PREFIX)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    problems = check(args.expect, args.prefix)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
