"""`dsvolc`: what needs no cloud account.

  dsvolc preview STACK [--json FILE]   every resource of a stack and every policy verdict
  dsvolc size --model M --gpu G ...     engine settings that fit a model on a GPU
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from dsvolc.size import size
from stacks.loader import SettingsError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.command("size")(size)


@app.command("preview")
def preview(
    stack: str = typer.Argument(..., help="stack name (dev, staging, prod) or path to a Pulumi.<stack>.yaml"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the preview as JSON to this file"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the summary lines"),
) -> None:
    """Run the stack's program offline under Pulumi's mock engine and its policy pack.

    Exit 0: no mandatory violation; 1: a mandatory policy is violated; 2: invalid settings.
    """
    from dsvolc.preview import render, run_preview, write_json

    console = Console()
    err = Console(stderr=True)
    try:
        result = run_preview(stack)
    except SettingsError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    if quiet:
        console.print(f"stack {result.stack}: {len(result.recording.resources)} resources")
        console.print(f"policy verdict: {len(result.mandatory)} mandatory, "
                      f"{len(result.violations) - len(result.mandatory)} advisory violation(s)")
    else:
        render(result, console)
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")
    if result.mandatory:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="dsvolc")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
