"""Ports for the local servers the tests start, chosen outside the kernel's ephemeral range.

``bind(("127.0.0.1", 0))`` returns a port from ``net.ipv4.ip_local_port_range`` (32768-60999 by
default): the same range the kernel draws every outgoing connection's source port from. A port
found free that way and handed to a server that binds it seconds or minutes later (after a
machine-wide server lock, say) can be taken in between by any client socket on the machine. A
fresh-clone CI run lost vLLM's NIXL handshake listener exactly so ("Address already in use",
tcp://localhost:42945, with the engine waiting on it until the harness's 600 s timeout).

So: a random port below the ephemeral range, checked bindable now, never handed out twice by
one process. Two processes (xdist workers) draw from about 12,000 ports at random.
"""

from __future__ import annotations

import random
import socket

_DEFAULT_EPHEMERAL_LOW = 32768
_SPAN = 12000
_given: set[int] = set()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and outside the ephemeral range."""
    high = ephemeral_low()
    low = max(1024, high - _SPAN)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    # a machine whose ephemeral range starts near 1024: let the kernel choose
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _given.add(port)
    return port


__all__ = ["free_port", "ephemeral_low"]
