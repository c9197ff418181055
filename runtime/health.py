"""Checks the serving pods of a multi-node replica run on themselves (probes, an init
container, a preStop hook).

    python -m runtime.health workers --expect N [--nccl-logs GLOB]
        liveness of a headless worker: N live vLLM engine processes (and, with
        --nccl-logs, NCCL on the IB transport)
    python -m runtime.health startup --url URL --nccl-logs GLOB
        a leader's start-up on an RDMA pool: /health answers 200 and NCCL uses IB
    python -m runtime.health wait-leader --host H --port P --timeout S
        a worker's init container: wait, bounded, until the leader's engine listens
    python -m runtime.health drain --url URL --min-seconds A --max-seconds B
        a worker's preStop: hold SIGTERM back only while the leader has work to drain

Engine processes. A worker pod runs no HTTP server, so it has no /health for the kubelet
to probe; what can die there is an engine process (one per local GPU rank) while the
container's main process lives on. vLLM names its processes with setproctitle
(`VLLM::Worker_PP1_TP3`, `VLLM::EngineCore_DP9`, vllm/utils/system_utils.py
`set_process_title`), which rewrites /proc/<pid>/cmdline. The check counts the live ones in
the container's PID namespace: fewer than N (dead, or zombies nobody reaped) fails the
probe, the kubelet restarts the container, and the LeaderWorkerSet recreates the group.

NCCL's transport. With NCCL_DEBUG=INFO and NCCL_DEBUG_FILE set (workloads/engine/rdma.py)
every process that starts NCCL writes its log to its own file. Lines, as NCCL formats them
(NVIDIA/nccl src/debug.cc: `<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <message>`):
  - `NET/IB : Using [0]mlx5_1:1/RoCE [1]mlx5_2:1/RoCE [RO]; OOB eth0:10.0.0.5<0>` when the
    IB verbs transport found its devices (src/transport/net_ib/init.cc),
  - `Using network IB` (or `Socket`) for each communicator (src/init.cc),
  - `NET/Socket : Using [0]eth0:10.0.0.5<0>` when the TCP transport starts
    (src/transport/net_socket.cc).
The check passes once some process shows the IB transport and no communicator uses any
other network; a communicator on sockets fails it (NCCL_NET=IB makes NCCL fail instead,
but the check does not take that on trust).

Standard library only (it runs in the serving image every probe period).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
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


# --------------------------------------------------------------------------- NCCL transport

_INFO = re.compile(r"NCCL INFO (?P<msg>.*)$")
_IB_USING = re.compile(r"^NET/IB : Using(?P<devs>.*?)\s*(?:\[RO\])?\s*; OOB (?P<oob>\S+)")
_IB_DEVICE = re.compile(r"\[(\d+)\](?P<name>[^:\s]+):(?P<port>\d+)(?::[^/\s]*)?/(?P<link>\w+)")
_NETWORK = re.compile(r"^Using network (?P<net>\S+)")
_SOCKET_USING = re.compile(r"^NET/Socket : Using")
_WARN = re.compile(r"NCCL WARN (?P<msg>.*)$")


@dataclass
class NcclLog:
    """What one process's NCCL log says about its network."""

    ib_devices: list[str] = field(default_factory=list)  # e.g. "mlx5_1:1/RoCE"
    networks: list[str] = field(default_factory=list)  # one per communicator ("IB", "Socket", a plugin)
    socket_transport: bool = False
    warnings: list[str] = field(default_factory=list)


def parse_nccl_log(text: str) -> NcclLog:
    out = NcclLog()
    for line in text.splitlines():
        warn = _WARN.search(line)
        if warn:
            out.warnings.append(warn["msg"].strip())
            continue
        info = _INFO.search(line)
        if not info:
            continue
        msg = info["msg"].strip()
        if m := _IB_USING.match(msg):
            out.ib_devices += [f"{d['name']}:{d['port']}/{d['link']}" for d in _IB_DEVICE.finditer(m["devs"])]
        elif m := _NETWORK.match(msg):
            out.networks.append(m["net"])
        elif _SOCKET_USING.match(msg):
            out.socket_transport = True
    return out


def nccl_problems(pattern: str) -> list[str]:
    """Empty when NCCL's logs under `pattern` show the IB transport and nothing else."""
    files = sorted(glob.glob(pattern))
    if not files:
        return [f"no NCCL log matches {pattern}: no communicator has started yet (or NCCL_DEBUG_FILE is not set)"]
    problems, ib = [], []
    for path in files:
        try:
            log = parse_nccl_log(Path(path).read_text(errors="replace"))
        except OSError:
            continue
        other = sorted({n for n in log.networks if n.upper() != "IB"})
        if other:
            problems.append(f"{path}: NCCL communicators use network {', '.join(other)}, not IB: the RDMA NICs "
                            "are not used (check NCCL_IB_HCA and the pod's RDMA resource)")
        if log.ib_devices:
            ib.append(path)
        elif log.warnings:
            problems.append(f"{path}: NCCL warned: {log.warnings[-1]}")
    if not ib and not problems:
        problems.append(f"none of {len(files)} NCCL log(s) shows the IB transport (`NET/IB : Using ...`) yet")
    return problems


# --------------------------------------------------------------------------- leader start-up


def http_ok(url: str, timeout: float = 4.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def wait_for_port(host: str, port: int, timeout: float, interval: float = 5.0, log=print) -> bool:
    """True once `host:port` accepts a TCP connection, False after `timeout` seconds. A name
    that does not resolve yet (the leader has no IP) counts as not listening."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(interval, 5.0)):
                return True
        except OSError as exc:
            why = type(exc).__name__
            if why != last:
                log(f"leader {host}:{port} not listening yet ({why}: {exc}); waiting up to {timeout:.0f} s")
                last = why
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))


# --------------------------------------------------------------------------- worker preStop

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
PROGRESS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def leader_load(text: str) -> tuple[float, float]:
    """(requests in flight, tokens processed so far) summed over every engine (the `engine`
    label: one series per data-parallel rank), from the leader's Prometheus exposition."""
    inflight = progress = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if m["name"] in (RUNNING, WAITING):
            inflight += value
        elif m["name"] in PROGRESS:
            progress += value
    return inflight, progress


def scrape(url: str, timeout: float = 4.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except (OSError, ValueError):
        return None


def drain_wait(url: str, *, min_seconds: float, max_seconds: float, stall_seconds: float,
               interval: float = 2.0, log=print) -> str:
    """Hold a worker's SIGTERM back while its group's leader has work to drain; return why
    it stopped waiting.

    A worker's engines serve the leader's requests, so it must outlive the leader's drain;
    but most stops are of a group already broken (a pod failed and the LeaderWorkerSet
    recreates the group), where nothing is left to drain and every second waited delays
    the recovery. So it waits while the leader's metrics answer and
      - fewer than `min_seconds` have passed (the leader's preStop, while the gateway may
        still send it requests), or
      - requests are in flight and tokens keep being processed (none for `stall_seconds`:
        the engine is stuck, e.g. on a collective with a dead peer),
    never longer than `max_seconds`. An unreachable leader has nothing to drain."""
    start = time.monotonic()
    last_progress, last_change = None, start
    while True:
        now = time.monotonic()
        elapsed = now - start
        if elapsed >= max_seconds:
            return f"stopped waiting after {max_seconds:g} s (the bound)"
        text = scrape(url)
        if text is None:
            return f"leader unreachable at {url}: nothing to drain"
        inflight, progress = leader_load(text)
        if progress != last_progress:
            last_progress, last_change = progress, now
        if inflight and now - last_change >= stall_seconds:
            return f"{inflight:g} request(s) in flight but no token for {stall_seconds:g} s: the engine is stuck"
        if not inflight and elapsed >= min_seconds:
            return f"no request in flight after {elapsed:.0f} s"
        time.sleep(min(interval, max(max_seconds - elapsed, 0.0)))


# --------------------------------------------------------------------------- entry point


def _report(problems: list[str]) -> int:
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.health")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workers", help="exit 1 unless N vLLM engine processes are alive")
    w.add_argument("--expect", type=int, required=True, help="engine processes of this pod (its GPU ranks)")
    w.add_argument("--prefix", default=PREFIX, help="process-title prefix (vLLM's VLLM_PROCESS_NAME_PREFIX)")
    w.add_argument("--nccl-logs", help="glob of NCCL's log files: also require the IB transport")
    s = sub.add_parser("startup", help="exit 1 unless URL answers 200 and NCCL's logs show the IB transport")
    s.add_argument("--url", required=True)
    s.add_argument("--nccl-logs", required=True)
    wl = sub.add_parser("wait-leader", help="wait until the leader's engine accepts connections")
    wl.add_argument("--host", default=os.environ.get("LWS_LEADER_ADDRESS"),
                    help="the leader's address (default: $LWS_LEADER_ADDRESS)")
    wl.add_argument("--port", type=int, required=True)
    wl.add_argument("--timeout", type=float, required=True, help="seconds to wait at most")
    wl.add_argument("--interval", type=float, default=5.0)
    d = sub.add_parser("drain", help="wait while the leader has requests to drain (a worker's preStop)")
    d.add_argument("--url", help="the leader's /metrics (default: http://$LWS_LEADER_ADDRESS:PORT/metrics)")
    d.add_argument("--port", type=int, default=8000)
    d.add_argument("--min-seconds", type=float, required=True)
    d.add_argument("--max-seconds", type=float, required=True)
    d.add_argument("--stall-seconds", type=float, default=60.0)
    d.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.cmd == "workers":
        problems = check(args.expect, args.prefix)
        if not problems and args.nccl_logs:
            problems = nccl_problems(args.nccl_logs)
        return _report(problems)
    if args.cmd == "startup":
        if not http_ok(args.url):
            return _report([f"{args.url} does not answer 200 yet"])
        return _report(nccl_problems(args.nccl_logs))
    if args.cmd == "wait-leader":
        if not args.host:
            return _report(["wait-leader: --host (or $LWS_LEADER_ADDRESS) is required"])
        if wait_for_port(args.host, args.port, args.timeout, args.interval):
            print(f"leader {args.host}:{args.port} is listening")
            return 0
        return _report([f"leader {args.host}:{args.port} did not listen within {args.timeout:g} s: its weights "
                        "sync or start is stuck (kubectl logs <leader> -c weights-sync)"])
    url = args.url
    if url is None:
        leader = os.environ.get("LWS_LEADER_ADDRESS")
        if not leader:
            return _report(["drain: --url (or $LWS_LEADER_ADDRESS) is required"])
        url = f"http://{leader}:{args.port}/metrics"
    print(drain_wait(url, min_seconds=args.min_seconds, max_seconds=args.max_seconds,
                     stall_seconds=args.stall_seconds, interval=args.interval), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
