"""Stack settings: the pydantic model, the loader for `stacks/Pulumi.<stack>.yaml`, the
regions and zones table, and the constants infra and workloads share (`stacks.constants`).

May import: `capacity` (settings are sized and checked by the planner) and third-party
libraries. Never `infra`, `workloads`, `policies` or `dsvolc`: they all build on this.
"""

from stacks.loader import (
    SETTINGS_KEY,
    SettingsError,
    from_pulumi_config,
    load,
    parse,
    read_raw,
    read_stack,
    shipped_stacks,
    stack_file,
)
from stacks.settings import StackSettings

__all__ = [
    "SETTINGS_KEY",
    "SettingsError",
    "StackSettings",
    "from_pulumi_config",
    "load",
    "parse",
    "read_raw",
    "read_stack",
    "shipped_stacks",
    "stack_file",
]
