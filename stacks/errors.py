"""The errors a stack's settings are refused with."""

from __future__ import annotations


class SettingsError(Exception):
    """A stack's settings are invalid. `problems` holds one line per bad value."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid settings in {source}:\n" + "\n".join(f"  - {p}" for p in problems))


class Refusal(ValueError):
    """One check of the plan refused the settings; the message starts with the path of the
    field to change (`serving.engine: ...`)."""
