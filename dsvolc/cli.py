"""`dsvolc`: what needs no cloud account.

  dsvolc preview STACK [--json FILE] [--existing]   every resource of a stack, its engine plan and every policy verdict
  dsvolc size --model M --gpu G ...     engine settings that fit a model on a GPU
  dsvolc policy-config STACK            the policy pack config the stack is judged by
  dsvolc images STACK                   what to mirror into the stack's registry, and its digests
  dsvolc manifests STACK DIR            every Kubernetes object of the stack as YAML (kubectl diff, scanners)
  dsvolc smoke URL_OR_STACK --token T   check a live endpoint: auth, a completion, a stream, reasoning, metrics
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from dsvolc.images import images
from dsvolc.size import EPILOG, size
from dsvolc.smoke import smoke
from stacks.loader import SettingsError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.command("size", epilog=EPILOG)(size)
app.command("images")(images)
app.command("smoke")(smoke)


@app.command("preview")
def preview(
    stack: str = typer.Argument(..., help="stack name (dev, staging, prod) or path to a Pulumi.<stack>.yaml"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the preview as JSON to this file"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the summary lines"),
    existing: bool = typer.Option(
        False, "--existing",
        help="only the stack as deployed (computed outputs known; deploy phase 2: IRSA and the serving stack)",
    ),
    new_stack: bool = typer.Option(
        False, "--new-stack",
        help="only a new stack's first `pulumi up` (computed outputs unknown; deploy phase 1: the cloud layer)",
    ),
) -> None:
    """Run the stack's program offline under Pulumi's mock engine and its policy pack.

    By default twice: the stack as deployed (every resource, shown in full) and its first
    `pulumi up` (summarised). Exit 0: no mandatory violation in either; 1: a mandatory policy
    is violated; 2: invalid settings or policy config.
    """
    from dsvolc.policy_runner import PolicyConfigError
    from dsvolc.preview import _plan_line, phase_line, render, run_both, run_preview, verdict_line, write_json

    console = Console()
    err = Console(stderr=True, soft_wrap=True)
    if existing and new_stack:
        err.print("error: --existing and --new-stack exclude each other (neither: both phases)")
        raise typer.Exit(2)
    try:
        if existing or new_stack:
            result = run_preview(stack, mode="existing" if existing else "new")
        else:
            result = run_both(stack)
    except (SettingsError, PolicyConfigError) as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    if quiet:
        console.print(f"stack {result.stack}: class {result.environment_class}, policy config "
                      f"{result.policy_config}, {len(result.recording.resources)} resources"
                      + (" (existing stack)" if result.recording.mode == "existing" else " (new stack)"),
                      highlight=False, soft_wrap=True)
        console.print(phase_line(result), highlight=False, markup=False, soft_wrap=True)
        for p in result.plans:
            console.print(f"engine plan {p['workload']}: {_plan_line(p)}", highlight=False, soft_wrap=True)
        if result.first_apply is not None:
            f = result.first_apply
            console.print(f"first `pulumi up`: {phase_line(f)}; {len(f.recording.resources)} resources; "
                          f"{verdict_line(f)}", highlight=False, markup=False, soft_wrap=True)
        console.print(verdict_line(result), soft_wrap=True)
        for v in result.all_mandatory:  # what stands between this stack and `pulumi up`
            console.print(f"mandatory {v['policy']}: {v['message']}", highlight=False, markup=False, soft_wrap=True)
    else:
        render(result, console)
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")
    if result.all_mandatory:
        raise typer.Exit(1)


@app.command("manifests")
def manifests(
    stack: str = typer.Argument(..., help="stack name or path to a Pulumi.<stack>.yaml"),
    directory: Path = typer.Argument(..., help="where to write the files (created if missing)"),
) -> None:
    """Write every Kubernetes object the stack registers (as deployed), one YAML file each:
    DIR/<namespace or _cluster>/<kind>-<name>.yaml. Helm releases and Secrets are left out
    (docs/preview.md); values the cloud computes are the offline run's stand-ins. Exit 2:
    invalid settings."""
    from dsvolc import export

    err = Console(stderr=True, soft_wrap=True)
    if directory.exists() and not directory.is_dir():
        err.print(f"error: {directory} exists and is not a directory", highlight=False, markup=False)
        raise typer.Exit(2)
    try:
        objects = export.render(stack)
    except SettingsError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    written = export.write(objects, directory)
    Console(soft_wrap=True).print(f"wrote {len(written)} objects under {directory}", highlight=False, markup=False)


@app.command("policy-config")
def policy_config(
    stack: str = typer.Argument(..., help="stack name or path to a Pulumi.<stack>.yaml"),
) -> None:
    """Print the policy pack config a stack is judged by (for `pulumi preview --policy-pack-config`)."""
    from stacks.loader import load

    try:
        settings = load(stack)
    except SettingsError as exc:
        Console(stderr=True, soft_wrap=True).print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    print(settings.policy_config_path)


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="dsvolc")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
