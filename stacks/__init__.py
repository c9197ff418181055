"""Stack settings and their plan.

    stacks/Pulumi.<name>.yaml --(validate)--> StackSettings --(derive once)--> StackPlan

`stacks.settings.StackSettings` is what the user wrote: the top-level fields and one
pydantic model per section (`stacks.sections`), each validating its own fields.
`stacks.plan.build_plan` checks what spans sections and derives every decision once into a
typed, frozen `StackPlan` (`stacks.plan`), which infra and workloads read. `stacks.loader`
reads a stack file into either (`load`, `load_plan`), with errors that name the field.
Beside them: the regions and zones table, the provider contract, the add-on and node-pool
tables, and the constants infra and workloads share (`stacks.constants`).

May import: `capacity` (the plan is sized and checked by the planner) and third-party
libraries. Never `infra`, `workloads`, `policies` or `dsvolc`: they all build on this.
"""

from stacks.errors import SettingsError
from stacks.loader import (
    SETTINGS_KEY,
    from_pulumi_config,
    load,
    load_plan,
    parse,
    parse_plan,
    read_raw,
    read_stack,
    run_error,
    shipped_stacks,
    stack_file,
)
from stacks.plan import StackPlan, build_plan
from stacks.settings import StackSettings

__all__ = [
    "SETTINGS_KEY",
    "SettingsError",
    "StackPlan",
    "StackSettings",
    "build_plan",
    "from_pulumi_config",
    "load",
    "load_plan",
    "parse",
    "parse_plan",
    "read_raw",
    "read_stack",
    "run_error",
    "shipped_stacks",
    "stack_file",
]
