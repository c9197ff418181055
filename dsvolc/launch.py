"""The `dsvolc` console entry, and the warm preview server's wiring.

`dsvolc ...`: a `dsvolc preview` runs in a warm server when one serves this tree's code
(dsvolc/warm.py; `dsvolc warm` starts one), else in this process. It reads only the
standard library until it knows which.

`python -m dsvolc.launch serve [IDLE_MINUTES]`: the server itself (what `dsvolc warm`
starts): it imports what a preview imports and runs each request's command line through
the CLI in a fork.
"""

from __future__ import annotations

import sys


def run_command(argv: list[str]) -> int:
    """`argv` (`dsvolc ...`) through the CLI in this process: the code it exits with."""
    from dsvolc.cli import app

    try:
        app(args=argv[1:], prog_name="dsvolc", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def preload() -> None:
    """Import what a preview imports. Annotations are evaluated as usual here: postponed
    ones (dsvolc/lazy_annotations.py) save a cold process its import time, but every child
    would then pay for resolving them from strings."""
    import dsvolc.cli  # noqa: F401
    import dsvolc.engine  # noqa: F401
    import dsvolc.policy_runner  # noqa: F401
    import dsvolc.preview  # noqa: F401
    import dsvolc.report  # noqa: F401
    import infra  # noqa: F401
    import workloads.serving  # noqa: F401


def serve(argv: list[str]) -> int:
    from dsvolc import warm
    from stacks.loader import shipped_stacks

    idle = float(argv[0]) if argv else 30.0
    return warm.serve(run_command, preload, shipped_stacks()[0], idle,
                      ready=lambda p: print(f"ready {p}", flush=True), log=sys.stderr)


def main() -> None:
    if sys.argv[1:2] == ["serve"] and __name__ == "__main__":
        sys.exit(serve(sys.argv[2:]))
    from dsvolc import warm

    code = warm.delegate(sys.argv)
    if code is not None:
        sys.exit(code)
    from dsvolc.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
