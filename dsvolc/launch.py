"""The `dsvolc` console entry: a `dsvolc preview` runs in a warm server when one serves this
tree's code (dsvolc/warm.py; `dsvolc warm` starts one), else in this process. Reads only
the standard library until it knows which."""

from __future__ import annotations

import sys


def main() -> None:
    from dsvolc import warm

    code = warm.delegate(sys.argv)
    if code is not None:
        sys.exit(code)
    from dsvolc.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
