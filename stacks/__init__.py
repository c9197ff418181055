"""Stack settings: the pydantic model and the loader for `stacks/Pulumi.<env>.yaml`."""

from stacks.loader import SETTINGS_KEY, SettingsError, from_pulumi_config, load, parse, read_raw, stack_file
from stacks.settings import StackSettings

__all__ = [
    "SETTINGS_KEY",
    "SettingsError",
    "StackSettings",
    "from_pulumi_config",
    "load",
    "parse",
    "read_raw",
    "stack_file",
]
