"""`dsvolc`: what needs no cloud account.

  dsvolc preview STACK [--json FILE] [--verbose] [--quiet] [--against REF]   summary, engine plan, verdict
  dsvolc new NAME --from STACK [--class C]   a new environment: stacks/Pulumi.<NAME>.yaml from another stack
  dsvolc size --model M --gpu G ...     engine settings that fit a model on a GPU
  dsvolc policy-config STACK            the policy pack config the stack is judged by
  dsvolc images STACK                   what to mirror into the stack's registry, and its digests
  dsvolc manifests STACK DIR            every Kubernetes object of the stack as YAML (kubectl diff, scanners)
  dsvolc smoke URL_OR_STACK --token T   check a live endpoint: auth, a completion, a stream, reasoning, metrics
  dsvolc bench STACK --token T          load a live endpoint (vllm bench serve), measured beside the model's prediction
  dsvolc warm [--stop]                  a warm preview server: each `dsvolc preview` runs in a fork of it
"""

from __future__ import annotations

import gc

if __name__ == "__main__":  # `python -m dsvolc.cli`: a process of seconds (main() says why)
    gc.disable()

import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from dsvolc.bench import bench
from dsvolc.images import images
from dsvolc.size import EPILOG, size
from dsvolc.smoke import smoke
from stacks.loader import SettingsError
from stacks.regions import PlacementWarning

_show_warning = warnings.showwarning
_shown: set[str] = set()


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """The project's own warnings (a GPU type no source shows in the region) as one
    `warning:` line, not Python's file:line and source echo."""
    if issubclass(category, PlacementWarning):
        if str(message) not in _shown:  # once, though each deploy phase loads the stack
            _shown.add(str(message))
            print(f"warning: {message}", file=file or sys.stderr)
    else:
        _show_warning(message, category, filename, lineno, file, line)


warnings.showwarning = _one_line_warning

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
app.command("size", epilog=EPILOG)(size)
app.command("images")(images)
app.command("smoke")(smoke)
app.command("bench")(bench)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("deepseek-volc")
        except PackageNotFoundError:  # run from a checkout that was never installed
            v = "unknown (not installed: pip install -e .)"
        print(f"dsvolc {v}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the version of deepseek-volc and exit"),
) -> None:
    pass


@app.command("new")
def new(
    name: str = typer.Argument(..., help="the new stack's name: a lower-case DNS label of 1-20 characters"),
    source: str = typer.Option(..., "--from", help="the stack to copy (name or path to a Pulumi.<stack>.yaml)"),
    environment_class: Optional[str] = typer.Option(
        None, "--class", help="dev, staging or prod: the policy strength (default: the source's)"),
    domain: Optional[str] = typer.Option(None, "--domain", help="its API host (default: the source's, with the "
                                         "source's name replaced)"),
    certificate_id: Optional[str] = typer.Option(None, "--certificate-id", help="the domain's certificate (default: "
                                                 "the source's, with the source's name replaced)"),
    stacks_dir: Optional[Path] = typer.Option(None, "--stacks-dir", help="where stack files live (default: stacks/ "
                                              "of this checkout)"),
) -> None:
    """Write stacks/Pulumi.<NAME>.yaml from another stack: comments kept, its names, API host
    and certificate following NAME, environment_class set by --class. Nothing else needs
    editing: the workflows and tests read the stacks from stacks/Pulumi.*.yaml. Exit 2 (and
    nothing written): a bad name, an existing stack, or settings that would not load."""
    from dsvolc import new as new_stack

    err = Console(stderr=True, soft_wrap=True)
    try:
        made = new_stack.make(name, source, environment_class=environment_class, domain=domain,
                              certificate_id=certificate_id, stacks_dir=stacks_dir)
    except (new_stack.NewStackError, SettingsError) as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    out = Console(soft_wrap=True)
    out.print(f"wrote {made.path} (stack {made.name} from {made.source}, class {made.environment_class})",
              highlight=False, markup=False)
    for c in made.changes:
        out.print(f"  {c}", highlight=False, markup=False)
    out.print("next:", highlight=False)
    for s in new_stack.next_steps(made):
        out.print(f"  - {s}", highlight=False, markup=False)


@app.command("preview")
def preview(
    stack: str = typer.Argument(..., help="stack name (dev, staging, prod) or path to a Pulumi.<stack>.yaml"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="also write the preview as JSON to this file"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the summary lines and each mandatory "
                               "violation, one line each"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also the resource tree, the count by type, and each "
                                 "resource's finding and URN"),
    existing: bool = typer.Option(
        False, "--existing",
        help="only the stack as deployed (computed outputs known; deploy phase 2: IRSA and the serving stack)",
    ),
    new_stack: bool = typer.Option(
        False, "--new-stack",
        help="only a new stack's first `pulumi up` (computed outputs unknown; deploy phase 1: the cloud layer)",
    ),
    against: Optional[str] = typer.Option(
        None, "--against", metavar="REF",
        help="also list what a `pulumi up` of this tree does to the stack as deployed from git REF (create, "
             "update, replace, delete); a replace of a stateful resource the stack does not accept fails",
    ),
) -> None:
    """Run the stack's program offline under Pulumi's mock engine and its policy pack.

    By default twice: the stack as deployed and its first `pulumi up`. Prints the summary
    (stack, deploy phase, engine plan, verdict), then one entry per policy and fix with the
    resources it concerns. Exit 0: no mandatory violation in either; 1: a mandatory policy
    is violated; 2: invalid settings or policy config.
    """
    from pulumi import RunError

    from dsvolc.policy_runner import PolicyConfigError
    from dsvolc import lazy_annotations

    lazy_annotations.install()  # before the program imports the providers' SDKs
    from dsvolc.preview import _plan_line, phase_line, render, run_both, run_preview, verdict_line, write_json

    console = Console()
    err = Console(stderr=True, soft_wrap=True)
    if existing and new_stack:
        err.print("error: --existing and --new-stack exclude each other (neither: both phases)")
        raise typer.Exit(2)
    if quiet and verbose:
        err.print("error: --quiet and --verbose exclude each other")
        raise typer.Exit(2)
    if against is not None and new_stack:
        err.print("error: --against compares the stack as deployed; it excludes --new-stack")
        raise typer.Exit(2)
    try:
        if existing or new_stack:
            result = run_preview(stack, mode="existing" if existing else "new")
        else:
            result = run_both(stack)
    except (SettingsError, PolicyConfigError, RunError) as exc:
        # RunError: the program refused the stack (e.g. a GPU type not sold where it is placed)
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
        render(result, console, verbose=verbose)
    compared = None
    if against is not None:
        from dsvolc.against import AgainstError, compare, render_changes

        try:
            compared = compare(against, stack, result)
        except AgainstError as exc:
            err.print(f"error: {exc}", highlight=False, markup=False)
            raise typer.Exit(2) from None
        render_changes(compared, console)
    if json_out is not None:
        write_json(result, json_out, against=compared)
        console.print(f"wrote {json_out}")
    if result.all_mandatory or (compared and any(v["enforcement_level"] == "mandatory"
                                                 for v in compared["violations"])):
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
    from dsvolc import lazy_annotations

    lazy_annotations.install()
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
    from stacks.loader import load_plan

    try:
        plan = load_plan(stack)
    except SettingsError as exc:
        Console(stderr=True, soft_wrap=True).print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    print(plan.policy_config)


@app.command("warm")
def warm_server(
    stop: bool = typer.Option(False, "--stop", help="stop this tree's warm preview servers"),
    idle_minutes: float = typer.Option(30.0, "--idle-minutes", min=0.1,
                                       help="the server exits after this long without a request"),
    foreground: bool = typer.Option(False, "--foreground", help="serve in this process (log on stderr) "
                                    "until stopped, idle or the code changes"),
) -> None:
    """Start a warm preview server for this tree: it imports what a preview imports once, and
    each `dsvolc preview` then runs in a fork of it (same output and exit code, a fraction of
    the CPU time: docs/preview.md). It serves only the code it imported: after an edit of the
    project's Python files or a `pip install`, previews run in their own process again and
    the server exits; run `dsvolc warm` again."""
    import signal
    import subprocess
    import time

    from dsvolc import warm

    err = Console(stderr=True, soft_wrap=True)
    try:
        sockets = warm.servers()
        path = warm.socket_path()
    except warm.WarmError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(2) from None
    if stop:
        for sock in sockets:
            pid = warm.server_pid(sock)
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
            sock.unlink(missing_ok=True)
            sock.with_suffix(".log").unlink(missing_ok=True)
            print(f"stopped {sock}" + (f" (pid {pid})" if pid else ""))
        return
    server = [sys.executable, "-m", "dsvolc.launch", "serve", str(idle_minutes)]
    if foreground:
        os.chdir(warm.ROOT)
        os.execv(sys.executable, server)
    if path.exists() and warm.server_pid(path) is not None:
        print(f"already warm: {path} (pid {warm.server_pid(path)})")
        return
    for old in path.parent.glob("preview-*.log"):  # of servers that are gone
        if not old.with_suffix(".sock").exists():
            old.unlink(missing_ok=True)
    log = path.with_suffix(".log")
    with open(log, "w") as fh:
        proc = subprocess.Popen(server, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=fh,
                                start_new_session=True, cwd=warm.ROOT)
    deadline = time.monotonic() + 120
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            err.print(f"error: the warm server did not start (exit {proc.poll()}); its log: {log}",
                      highlight=False, markup=False)
            raise typer.Exit(1)
        time.sleep(0.1)
    print(f"warm: pid {proc.pid}, {path}; `dsvolc preview` runs in it until the code changes or "
          f"{idle_minutes:g} min without a request (`dsvolc warm --stop` stops it)")


def main() -> None:  # pragma: no cover - console entry point
    # A command runs for seconds and leaves a few MiB of cyclic garbage; the collector,
    # triggered by allocations, walked the SDK's few hundred thousand objects again and
    # again (a third of a preview's CPU time), and once more at exit (0.7 s): off for the
    # process, and what is left frozen for the interpreter's exit. (dsvolc.preview pauses
    # it too while a preview runs, for callers other than this process.)
    gc.disable()
    try:
        app(prog_name="dsvolc")
    finally:
        gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
